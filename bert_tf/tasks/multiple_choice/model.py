"""Multiple choice: one score per (context, ending) pair, a softmax over the choices.

As in the BERT paper (SWAG): every choice goes through the encoder as its own sequence, one dense
unit on its pooled output (after dropout, as the classifier head; or on the BiLSTM's summary with
task.json's head "bilstm") gives its score, and the scores
of a question's choices are its logits [b, choices]. The loss is softmax cross-entropy over the
choices, the classifier's (its registry entry names `ClassificationObjective`); any number of
choices works.
"""

import keras

from bert_tf.model import modeling
from bert_tf.tasks import heads, representations


class FoldChoices(keras.layers.Layer):
    """[b, choices, s] -> [b * choices, s]: every choice through the encoder as one sequence."""

    def call(self, x):
        return keras.ops.reshape(x, (-1, keras.ops.shape(x)[-1]))


class UnfoldChoices(keras.layers.Layer):
    """Scores [b * choices, 1] and an input [b, choices, s] -> logits [b, choices]."""

    def call(self, scores, like):
        return keras.ops.reshape(scores, keras.ops.shape(like)[:2])


def build_model(config, spec, encoder):
    """The multiple choice model on `encoder`: inputs [b, choices, s], outputs {"logits"} [b, choices]."""
    inputs = {
        name: keras.Input(shape=(None, None), dtype="int32", name=name)
        for name in modeling.ENCODER_INPUTS
    }
    fold = FoldChoices(name="fold_choices")
    folded = {name: fold(value) for name, value in inputs.items()}
    vector = representations.sequence_vector(spec, encoder, folded)
    dropout = keras.layers.Dropout(config.hidden_dropout_prob, name="head_dropout")
    dense = heads.head_dense(config, 1, "choice_head")
    scores = dense(dropout(vector))
    logits = UnfoldChoices(name="unfold_choices")(scores, inputs["input_word_ids"])
    return keras.Model(
        inputs=inputs,
        outputs={"logits": heads.float32_output(logits, "logits")},
        name=f"bert_{spec.kind}",
    )
