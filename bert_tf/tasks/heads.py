"""What every task head shares: the output layers and the loss plug-in base.

A task's model is the encoder plus a head, built by the task's `model.py`; its loss is a
`HeadObjective` subclass (an `objective.Objective`, what training_loop.Trainer optimizes). Every loss is
averaged over the GLOBAL batch, however many replicas share it.
"""

import keras
import numpy as np
import tensorflow as tf

from bert_tf.model import modeling
from bert_tf.model.objective import Objective

EXAMPLE_INDEX = (
    "example_index"  # Added to eval/predict batches so outputs can be put back in order.
)


def head_dense(config, units, name):
    """A dense output layer initialized as the original's output_weights (bias zeros), stddev initializer_range."""
    return keras.layers.Dense(
        units,
        kernel_initializer=keras.initializers.TruncatedNormal(stddev=config.initializer_range),
        name=name,
    )


def float32_output(x, name):
    """Casts a head output to float32 (Keras' recommended end of a mixed-precision model)."""
    return keras.layers.Activation("linear", dtype="float32", name=name)(x)


class HeadObjective(Objective):
    """A task head's loss for training_loop.Trainer, and its per-example outputs for prediction.

    Subclasses give `per_position`: the loss and correctness of every scored position ([b] for
    sentence heads, [b, s] for token heads), weighted by `weights`. The loss is sum(weight * loss)
    over the global batch divided by the global sum of weights.
    """

    stat_names = ("loss", "weight", "correct")
    reports_accuracy = True
    # Prediction outputs with a position axis ([b, s, ...]) -> the value of positions that a
    # batch cut to its longest row (packing.trim_to_longest) did not compute.
    token_outputs = {}

    def __init__(self, model):
        self.model = model

    def weights(self, batch):
        """The float32 weight of every scored position: here one per example, is_real_example (or 1)."""
        if "is_real_example" in batch:
            return tf.cast(batch["is_real_example"], tf.float32)
        return tf.ones([tf.shape(batch["input_word_ids"])[0]], tf.float32)

    def per_position(self, batch, outputs):
        """(losses, correct) float32 tensors shaped like `weights(batch)`."""
        raise NotImplementedError

    def prediction_outputs(self, outputs):
        """The model outputs the host needs, per example: {name: tensor [b, ...]}."""
        raise NotImplementedError

    def call_model(self, batch, training):
        """The model's outputs on the encoder inputs of `batch`."""
        return self.model(
            {name: batch[name] for name in modeling.ENCODER_INPUTS}, training=training
        )

    def denominators(self, batch):
        """This replica's sum of weights (all-reduced by the loop)."""
        return {"weight": tf.reduce_sum(self.weights(batch))}

    def loss_and_stats(self, batch, global_denominators, training):
        """This replica's share of the global weighted mean loss, and its sums."""
        outputs = self.call_model(batch, training)
        weights = self.weights(batch)
        losses, correct = self.per_position(batch, outputs)
        loss_sum = tf.reduce_sum(weights * losses)
        loss = tf.math.divide_no_nan(loss_sum, global_denominators["weight"])
        return loss, {"weight": tf.reduce_sum(weights), "correct": tf.reduce_sum(weights * correct)}

    def metrics(self, sums, num_steps):
        """The mean loss over the steps, and the accuracy over the scored positions."""
        result = {"loss": float(sums["loss"] / max(num_steps, 1))}
        if self.reports_accuracy:
            result["accuracy"] = float(sums["correct"] / sums["weight"]) if sums["weight"] else 0.0
        return result

    def predict_step(self, batch, has_labels):
        """Per example: the prediction outputs and, with labels, the summed loss and weight."""
        outputs = self.call_model(batch, training=False)
        result = dict(self.prediction_outputs(outputs))
        if has_labels:
            weights = self.weights(batch)
            losses, _ = self.per_position(batch, outputs)
            axes = list(range(1, len(weights.shape)))
            result["example_loss"] = (
                tf.reduce_sum(weights * losses, axis=axes) if axes else weights * losses
            )
            result["example_weight"] = tf.reduce_sum(weights, axis=axes) if axes else weights
        result[EXAMPLE_INDEX] = batch[EXAMPLE_INDEX]
        return result


def mean_loss(outputs):
    """The weighted mean loss over the rows of a prediction with labels (`predict_step`'s
    example_loss and example_weight, gathered for every row)."""
    weight = float(np.sum(outputs["example_weight"]))
    return float(np.sum(outputs["example_loss"]) / weight) if weight else 0.0
