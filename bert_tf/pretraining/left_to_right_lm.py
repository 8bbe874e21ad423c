"""The left-to-right language model: the paper's "LTR & No NSP" pretraining ablation (Table 5).

run_pretraining --objective=ltr --nsp=false trains it on the very records the masked LM reads:
- the input pipeline puts the masked tokens back (masked_lm_ids at masked_lm_positions), so the
  model reads the text's own tokens (input_pipeline.pretraining_dataset(restore_masked_tokens=True));
- the config's attention_direction is left_to_right: position i attends to positions <= i only;
- position i predicts the token at i + 1 wherever i + 1 is a real token (input_mask), through the
  MLM head's layer (keras-hub's MaskedLMHead, its output projection tied to the word embeddings)
  gathered at every position but the last. The paper's LTR model is BERT with that mask, no NSP
  and the same output layer, so its encoder fine-tunes exactly as BERT's does.
The loss is the mean cross-entropy over the predicting positions of the GLOBAL batch: each replica
divides its sum by the all-reduced count, as bert_tf.pretraining.masked_lm's MLM loss does, so any number of
replicas trains as one device would. The metrics are ltr_loss, ltr_accuracy (the argmax is the
next token) and ltr_perplexity = exp(ltr_loss).
"""

import math

import tensorflow as tf

from bert_tf.model import modeling
from bert_tf.model.objective import Objective

# As the MLM loss's epsilon: a batch without a single prediction gives a loss of 0, not NaN.
LOSS_EPSILON = 1e-5


def next_token_targets(input_word_ids, input_mask):
    """(targets int32, weights float32), [b, s - 1] each: position i's target is the token at i + 1,
    weighted 1 where position i + 1 is a real token, else 0."""
    return input_word_ids[:, 1:], tf.cast(input_mask[:, 1:], tf.float32)


def predicting_positions(input_word_ids):
    """int32 [b, s - 1]: the positions that predict a next token (every one but the last)."""
    shape = tf.shape(input_word_ids)
    return tf.broadcast_to(tf.range(shape[1] - 1)[tf.newaxis], [shape[0], shape[1] - 1])


class LeftToRightObjective(Objective):
    """Next-token cross-entropy of a left-to-right pretraining model, for training_loop.Trainer.

    `model` is modeling.build_pretraining_model(config, with_nsp_head=False) for a left_to_right
    config; batches are pretraining batches whose input_word_ids hold the original tokens.
    """

    stat_names = ("loss", "ltr_loss_sum", "ltr_correct", "ltr_weight")

    def __init__(self, model):
        self.model = model

    def denominators(self, batch):
        """This replica's count of positions with a next token to predict."""
        _, weights = next_token_targets(batch["input_word_ids"], batch["input_mask"])
        return {"ltr_weight": tf.reduce_sum(weights)}

    def loss_and_stats(self, batch, global_denominators, training):
        """This replica's share of the global loss, and its sums for the metrics."""
        inputs = {name: batch[name] for name in modeling.ENCODER_INPUTS}
        inputs["masked_lm_positions"] = predicting_positions(batch["input_word_ids"])
        logits = tf.cast(self.model(inputs, training=training)["mlm_logits"], tf.float32)
        targets, weights = next_token_targets(batch["input_word_ids"], batch["input_mask"])
        xent = tf.nn.sparse_softmax_cross_entropy_with_logits(targets, logits)
        loss_sum = tf.reduce_sum(weights * xent)
        hits = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), targets), tf.float32)
        stats = dict(
            self.denominators(batch),
            ltr_loss_sum=loss_sum,
            ltr_correct=tf.reduce_sum(weights * hits),
        )
        return loss_sum / (global_denominators["ltr_weight"] + LOSS_EPSILON), stats

    def metrics(self, sums, num_steps):
        """The loss, the next-token loss, accuracy and perplexity, pooled over the steps."""
        weight = float(sums["ltr_weight"])
        ltr_loss = float(sums["ltr_loss_sum"]) / weight if weight else 0.0
        return {
            "loss": float(sums["loss"] / max(num_steps, 1)),
            "ltr_loss": ltr_loss,
            "ltr_accuracy": float(sums["ltr_correct"]) / weight if weight else 0.0,
            "ltr_perplexity": math.exp(min(ltr_loss, 700.0)),  # (exp overflows past ~709)
        }
