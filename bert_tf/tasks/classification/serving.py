"""The exported classifier and regressor: text in, probabilities and labels (or a score) out.

Signatures (every input `tf.string [b]`, UTF-8):
- classifier: `serving_default` (tensorflow/serving/predict) takes `text`, or `text_a` and
  `text_b` for pair tasks, and returns `probabilities` float32 [b, labels], `label_id` int32 [b]
  and `label` string [b]. `classification` (tensorflow/serving/classify, for TF Serving's
  :classify) takes `inputs`, serialized tf.Examples with the same text features as bytes, and
  returns `classes` string [b, labels] and `scores` float32 [b, labels].
- regressor: `serving_default` returns `score` float32 [b]; `regression`
  (tensorflow/serving/regress) takes `inputs` (tf.Examples) and returns `outputs` float32 [b].

A text_b with no tokens (such as "" or "\u200b") gives `[CLS] a [SEP]`, as the original's
convert_single_example (`if tokens_b:`) and bert_tf.tasks.classification pack it.
"""

import tensorflow as tf

from bert_tf.tasks import export_graph


class ClassifierModule(export_graph.ServingModule):
    """A classifier or regressor with tokenization: `serve` (predict) and `serve_examples` (classify/regress)."""

    def __init__(self, model, packer, spec, assets):
        super().__init__(assets)
        self.model = model
        self.packer = packer
        self.is_regressor = spec.kind == "regressor"
        self.text_features = ("text_a", "text_b") if spec.is_pair else ("text",)
        self.labels = tf.constant(spec.labels or [""], tf.string)
        if spec.is_pair:
            self.serve = export_graph.serving_function(
                self._serve_pair,
                input_signature=[
                    export_graph.text_spec("text_a"),
                    export_graph.text_spec("text_b"),
                ],
            )
        else:
            self.serve = export_graph.serving_function(
                self._serve_single, input_signature=[export_graph.text_spec("text")]
            )
        self.serve_examples = export_graph.serving_function(
            self._serve_examples, input_signature=[tf.TensorSpec([None], tf.string, name="inputs")]
        )

    def _outputs(self, texts):
        """Runs the model on packed `texts`: the predict outputs."""
        outputs = self.packer.call(self.model, self.packer.pack(texts))
        if self.is_regressor:
            return {"score": outputs["score"]}
        probabilities = tf.nn.softmax(outputs["logits"], axis=-1)
        label_id = tf.argmax(probabilities, axis=-1, output_type=tf.int32)
        return {
            "probabilities": probabilities,
            "label_id": label_id,
            "label": tf.gather(self.labels, label_id),
        }

    def _serve_single(self, text):
        """text [b] -> the predictions."""
        return self._outputs([text])

    def _serve_pair(self, text_a, text_b):
        """text_a, text_b [b] -> the predictions."""
        return self._outputs([text_a, text_b])

    def _serve_examples(self, inputs):
        """Serialized tf.Examples [b] (bytes features named as the predict inputs) -> classify/regress outputs."""
        features = export_graph.parse_examples(
            inputs, {name: tf.io.FixedLenFeature([], tf.string) for name in self.text_features}
        )
        outputs = self._outputs([features[name] for name in self.text_features])
        if self.is_regressor:
            return {tf.saved_model.REGRESS_OUTPUTS: outputs["score"]}
        probabilities = outputs["probabilities"]
        classes = tf.tile(self.labels[tf.newaxis, :], [tf.shape(probabilities)[0], 1])
        return {
            tf.saved_model.CLASSIFY_OUTPUT_CLASSES: classes,
            tf.saved_model.CLASSIFY_OUTPUT_SCORES: probabilities,
        }

    def signatures(self):
        """signature key -> (tf.function with an input signature, method name)."""
        if self.is_regressor:
            extra = {"regression": (self.serve_examples, tf.saved_model.REGRESS_METHOD_NAME)}
        else:
            extra = {"classification": (self.serve_examples, tf.saved_model.CLASSIFY_METHOD_NAME)}
        return {**super().signatures(), **extra}
