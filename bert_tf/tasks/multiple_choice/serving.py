"""The exported multiple choice model: a context and its endings in, each ending's probability out.

`serving_default` takes `context` string [b] and `endings` string [b, n] (any n >= 2; a batch's
rows have the same n) and returns `probabilities` float32 [b, n] and `choice` int32 [b]. Choice i
is packed as in training: `[CLS] context [SEP] ending_i [SEP]`, so a SWAG question's ending_i is
`sent2 + " " + ending_i` with `context` = sent1.
"""

import tensorflow as tf

from bert_tf.tasks import export_graph


class MultipleChoiceModule(export_graph.ServingModule):
    """context [b] and endings [b, n] -> probabilities [b, n] and choice [b]."""

    def __init__(self, model, packer, spec, assets):
        super().__init__(assets)
        self.model = model
        self.packer = packer
        self.serve = export_graph.serving_function(
            self._serve,
            input_signature=[
                export_graph.text_spec("context"),
                tf.TensorSpec([None, None], tf.string, name="endings"),
            ],
        )

    def _serve(self, context, endings):
        """The probabilities of each ending, and the likeliest one."""
        shape = tf.shape(endings)
        # Every (context, ending) pair is one sequence, as in training.
        packed = self.packer.pack([tf.repeat(context, shape[1]), tf.reshape(endings, [-1])])
        # The packed length spelled out: a -1 cannot be inferred for an empty batch.
        inputs = {
            name: tf.reshape(value, [shape[0], shape[1], tf.shape(value)[1]])
            for name, value in packed.items()
        }
        logits = self.packer.call(self.model, inputs)["logits"]
        probabilities = tf.nn.softmax(logits, axis=-1)
        return {
            "probabilities": probabilities,
            "choice": tf.argmax(probabilities, axis=-1, output_type=tf.int32),
        }
