"""Named-entity tagging: the token head on sequence_output, and its loss (the original has no NER).

dropout(hidden_dropout_prob) + dense on sequence_output (or on the BiLSTM's outputs, fine-tuned or
feature-based: tasks.representations) -> logits [b, s, num_labels]; softmax
cross-entropy over the tokens whose label is not IGNORE_LABEL, averaged over the labelled tokens
(all-reduced before the forward pass, as pretraining does for masked positions).
"""

import keras
import tensorflow as tf

from bert_tf.model import modeling
from bert_tf.tasks import heads, representations
from bert_tf.tasks.ner.data import IGNORE_LABEL


def build_model(config, spec, encoder):
    """The tagger on `encoder`: outputs {"logits"} [b, s, num_labels]."""
    inputs = modeling.encoder_inputs()  # creation and call order is part of the checkpoint keys
    vectors = representations.token_vectors(spec, encoder, inputs)
    dropout = keras.layers.Dropout(config.hidden_dropout_prob, name="head_dropout")
    dense = heads.head_dense(config, spec.num_labels, "ner_head")
    outputs = {"logits": heads.float32_output(dense(dropout(vectors)), "logits")}
    return keras.Model(inputs=inputs, outputs=outputs, name=f"bert_{spec.kind}")


class TokenClassificationObjective(heads.HeadObjective):
    """Softmax cross-entropy on `logits` [b, s, labels] over the tokens whose label is not IGNORE_LABEL."""

    token_outputs = {"predicted_ids": 0}  # padding: no word maps to it

    def weights(self, batch):
        return tf.cast(tf.not_equal(batch["label_ids"], IGNORE_LABEL), tf.float32)

    def per_position(self, batch, outputs):
        labels = tf.cast(batch["label_ids"], tf.int32)
        # Ignored positions get a valid class for the op; their weight of 0 removes them.
        safe_labels = tf.where(tf.equal(labels, IGNORE_LABEL), tf.zeros_like(labels), labels)
        logits = tf.cast(outputs["logits"], tf.float32)
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(safe_labels, logits)
        correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32)
        return losses, correct

    def prediction_outputs(self, outputs):
        # The host only needs the predicted label ids: far less to copy than [b, s, labels] logits.
        return {"predicted_ids": tf.argmax(outputs["logits"], -1, output_type=tf.int32)}
