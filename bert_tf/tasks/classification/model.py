"""Sentence classification and regression: heads on pooled_output, and their losses.

- classifier: dropout(hidden_dropout_prob) + dense on pooled_output (or, with task.json's head
  "bilstm", on the BiLSTM's summary: tasks.representations) -> logits [b, num_labels]
  (run_classifier.py's output_weights/output_bias, truncated normal stddev initializer_range), with
  softmax cross-entropy averaged over the real examples (run_classifier.py's loss);
- regressor: the same with one unit, squeezed -> score [b], with squared error (the original has
  no regression task).
The original hard-codes the head's dropout (0.1) and initializer stddev (0.02); these read the
config's hidden_dropout_prob and initializer_range, which are those values in every released config.
"""

import keras
import tensorflow as tf

from bert_tf.model import modeling
from bert_tf.tasks import heads, representations


def build_model(config, spec, encoder):
    """The classifier or regressor on `encoder`: outputs {"logits"} or {"score"}."""
    # Checkpoint keys (model/_operations/N/...) follow the order in which layers are created and
    # called: append, never reorder.
    inputs = modeling.encoder_inputs()
    vector = representations.sequence_vector(spec, encoder, inputs)
    units = spec.num_labels if spec.kind == "classifier" else 1
    dropout = keras.layers.Dropout(config.hidden_dropout_prob, name="head_dropout")
    dense = heads.head_dense(
        config, units, "classifier_head" if spec.kind == "classifier" else "regressor_head"
    )
    logits = dense(dropout(vector))
    if spec.kind == "classifier":
        outputs = {"logits": heads.float32_output(logits, "logits")}
    else:
        score = keras.layers.Reshape((), name="squeeze_score")(logits)
        outputs = {"score": heads.float32_output(score, "score")}
    return keras.Model(inputs=inputs, outputs=outputs, name=f"bert_{spec.kind}")


class ClassificationObjective(heads.HeadObjective):
    """Softmax cross-entropy on `logits` [b, labels] against `label_ids` [b]."""

    def per_position(self, batch, outputs):
        labels = tf.cast(batch["label_ids"], tf.int32)
        logits = tf.cast(outputs["logits"], tf.float32)
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32)
        return losses, correct

    def prediction_outputs(self, outputs):
        return {"logits": outputs["logits"]}


class RegressionObjective(heads.HeadObjective):
    """Squared error of `score` [b] against the float `label_ids` [b]."""

    reports_accuracy = False

    def per_position(self, batch, outputs):
        error = tf.cast(outputs["score"], tf.float32) - tf.cast(batch["label_ids"], tf.float32)
        return tf.square(error), tf.zeros_like(error)

    def prediction_outputs(self, outputs):
        return {"score": outputs["score"]}
