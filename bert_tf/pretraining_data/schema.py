"""The pretraining record format, declared once: the original BERT's tf.train.Example features.

Google's `create_pretraining_data.py` writes, and its `run_pretraining.py` parses, one
tf.train.Example per instance with seven fixed-length features:

    input_ids, input_mask, segment_ids         int64 [max_seq_length]
    masked_lm_positions, masked_lm_ids         int64 [max_predictions_per_seq]
    masked_lm_weights                          float [max_predictions_per_seq]
    next_sentence_labels                       int64 [1]

The encoder (example_codec), the readers (bert_tf.pretraining.input_pipeline) and the data job all take the
names, types and lengths from here. The two lengths are not stored in the records: training must use
the values the data was made with. Only `feature_spec` imports TensorFlow, and only when called, so
that the worker processes that write records never load it.
"""

import dataclasses

# A feature's length is one of the two record lengths, named as the flags that set them, or a number.
SEQ_LENGTH = "max_seq_length"
PREDICTIONS_LENGTH = "max_predictions_per_seq"


@dataclasses.dataclass(frozen=True)
class Feature:
    """One feature of a record: its name, its value type and its fixed length."""

    name: str
    dtype: str  # "int64" (an Int64List) or "float32" (a FloatList)
    length: object  # SEQ_LENGTH, PREDICTIONS_LENGTH or an int

    def size(self, max_seq_length, max_predictions_per_seq):
        """How many values the feature holds in records of these lengths."""
        return {SEQ_LENGTH: max_seq_length, PREDICTIONS_LENGTH: max_predictions_per_seq}.get(
            self.length, self.length
        )


# In the order the original writes them; the encoder writes them in this order too.
FEATURES = (
    Feature("input_ids", "int64", SEQ_LENGTH),
    Feature("input_mask", "int64", SEQ_LENGTH),
    Feature("segment_ids", "int64", SEQ_LENGTH),
    Feature("masked_lm_positions", "int64", PREDICTIONS_LENGTH),
    Feature("masked_lm_ids", "int64", PREDICTIONS_LENGTH),
    Feature("masked_lm_weights", "float32", PREDICTIONS_LENGTH),
    Feature("next_sentence_labels", "int64", 1),
)
FEATURE_NAMES = tuple(feature.name for feature in FEATURES)


def feature_lengths(max_seq_length, max_predictions_per_seq):
    """{feature name: number of values} for records of these lengths."""
    return {
        feature.name: feature.size(max_seq_length, max_predictions_per_seq) for feature in FEATURES
    }


def feature_spec(max_seq_length, max_predictions_per_seq):
    """The original run_pretraining.py parsing spec for these records (imports TensorFlow)."""
    import tensorflow as tf

    return {
        feature.name: tf.io.FixedLenFeature(
            [feature.size(max_seq_length, max_predictions_per_seq)], tf.as_dtype(feature.dtype)
        )
        for feature in FEATURES
    }


def describe(max_seq_length, max_predictions_per_seq):
    """One line naming each feature with its type and length, for logs."""
    lengths = feature_lengths(max_seq_length, max_predictions_per_seq)
    return ", ".join(
        f"{feature.name} {feature.dtype}[{lengths[feature.name]}]" for feature in FEATURES
    )
