"""SQuAD: the span head on sequence_output, and the original run_squad loss.

dense(2) on sequence_output (or on the BiLSTM's outputs with task.json's head "bilstm":
tasks.representations), split -> start_logits, end_logits [b, s] (run_squad.py's
cls/squad/output_weights, with no dropout before it, as there); the loss is the mean of the start
and end position cross-entropies.
"""

import keras
import numpy as np
import tensorflow as tf

from bert_tf.model import modeling
from bert_tf.tasks import heads, representations


def build_model(config, spec, encoder):
    """The span model on `encoder`: outputs {"start_logits", "end_logits"} [b, s]."""
    inputs = modeling.encoder_inputs()  # creation and call order is part of the checkpoint keys
    vectors = representations.token_vectors(spec, encoder, inputs)
    dense = heads.head_dense(config, 2, "squad_head")
    logits = dense(vectors)
    outputs = {
        "start_logits": heads.float32_output(logits[:, :, 0], "start_logits"),
        "end_logits": heads.float32_output(logits[:, :, 1], "end_logits"),
    }
    return keras.Model(inputs=inputs, outputs=outputs, name=f"bert_{spec.kind}")


class SpanObjective(heads.HeadObjective):
    """The original run_squad loss: the mean of the start and end position cross-entropies."""

    # A position past a trimmed batch's end holds no token: it can never start or end an answer.
    token_outputs = {"start_logits": -np.inf, "end_logits": -np.inf}

    def per_position(self, batch, outputs):
        losses, correct = [], []
        for side in ("start", "end"):
            positions = tf.cast(batch[f"{side}_positions"], tf.int32)
            logits = tf.cast(outputs[f"{side}_logits"], tf.float32)
            losses.append(tf.nn.sparse_softmax_cross_entropy_with_logits(positions, logits))
            correct.append(
                tf.cast(
                    tf.equal(tf.argmax(logits, -1, output_type=tf.int32), positions), tf.float32
                )
            )
        # accuracy: the fraction of start and end positions found (each counts half).
        return (losses[0] + losses[1]) / 2.0, (correct[0] + correct[1]) / 2.0

    def prediction_outputs(self, outputs):
        return {"start_logits": outputs["start_logits"], "end_logits": outputs["end_logits"]}
