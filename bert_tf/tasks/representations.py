"""What a task head's output layer reads: the encoder's outputs, or a BiLSTM over its activations.

task.json's `head`, `lstm_units` and `features` (tasks.models.TaskSpec) choose it:

- head "dense" (the paper's fine-tuning): per-token tasks (ner, squad) read `sequence_output`,
  sequence tasks (classifier, regressor, multiple choice) read `pooled_output`;
- head "bilstm" (the paper's Table 5, "+ BiLSTM"): a randomly initialised two-layer bidirectional
  LSTM (`lstm_units` per direction) runs over `sequence_output`, padding masked; per-token tasks
  read its outputs at every token, sequence tasks its summary (`bilstm`, below);
- `features` set (the paper's feature-based approach, Table 7; head "bilstm"): the encoder is
  frozen and runs in inference mode (`FrozenEncoder`), and the BiLSTM reads the activations that
  `features` names (`EncoderFeatures`) instead of `sequence_output`.

The BiLSTM always uses Keras' generic LSTM kernel, never cuDNN's: the same numbers in training and
in the export, a graph XLA can compile (--jit_compile), and a SavedModel that CPU-only TF Serving
runs (cuDNN's op has no CPU kernel).
"""

import re

import keras

from bert_tf.runtime import io_utils

HEADS = ("dense", "bilstm")
DEFAULT_LSTM_UNITS = 768  # the BERT paper's BiLSTM (Tables 5 and 7)
# --features / task.json `features` -> how many transformer layers the encoder needs for it.
FEATURES = {
    "embeddings": 0,  # the embedding layer's output (after its LayerNorm)
    "second_to_last": 2,  # the second-to-last transformer layer's output
    "last": 1,  # the last layer's output (sequence_output)
    "sum_last_four": 4,  # a learned scalar mix (ScalarMix) of the last four layers
    "concat_last_four": 4,  # the last four layers concatenated on the feature axis
    "sum_all": 1,  # a learned scalar mix of every transformer layer (the paper's "All 12 Layers")
    "sum_all_with_embeddings": 1,  # the same mix with the embedding output as a 13th member
}
# Besides FEATURES' names, `layer_K` names the K-th transformer layer's output (1 the first):
# a probe on every layer (the experiments' layers study) reads each one alone.
LAYER_PREFIX = "layer_"
FEATURES_HELP = f"{', '.join(FEATURES)}, or {LAYER_PREFIX}K (the K-th layer's output, K from 1)"
FROZEN_ENCODER = "frozen_encoder"


def layer_number(features):
    """K of a `layer_K` name, or None for any other."""
    match = re.fullmatch(rf"{LAYER_PREFIX}([1-9]\d*)", features or "")
    return int(match.group(1)) if match else None


def is_feature_choice(features):
    """Whether `features` names encoder activations: a FEATURES key or `layer_K`."""
    return features in FEATURES or layer_number(features) is not None


def layers_needed(features):
    """How many transformer layers the encoder needs for `features` (a feature choice)."""
    return FEATURES[features] if features in FEATURES else layer_number(features)


class FrozenEncoder(keras.layers.Layer):
    """The encoder, frozen: not trainable, and always in inference mode (no dropout inside it).

    Setting `trainable = False` keeps the encoder's variables away from the optimizer (so neither
    gradients nor weight decay touch them), but Keras would still run its dropout when the model is
    called with training=True: this layer calls it with training=False whatever the caller says.
    """

    def __init__(self, encoder, **kwargs):
        kwargs.setdefault("name", FROZEN_ENCODER)
        super().__init__(**kwargs)
        encoder.trainable = False
        self.encoder = encoder

    def call(self, inputs):
        return self.encoder(inputs, training=False)


class EncoderFeatures(keras.layers.Layer):
    """The encoder activations that `features` (a FEATURES key) names, from the encoder's outputs.

    The two scalar mixes are ELMo's: gamma * sum_j softmax(w)_j * h_j, with the weights w (zeros:
    an equal mix at first) and the scale gamma (1) learned.
    """

    def __init__(self, features, **kwargs):
        kwargs.setdefault("name", "encoder_features")
        super().__init__(**kwargs)
        if not is_feature_choice(features):
            raise ValueError(f"features must be one of {FEATURES_HELP}, got {features!r}")
        self.features = features

    def _mixed_layers(self, encoded):
        """The layers (or their shapes) a scalar mix sums, or None for the other choices."""
        if self.features == "sum_last_four":
            return encoded["encoder_outputs"][-4:]
        if self.features == "sum_all":
            return encoded["encoder_outputs"]
        if self.features == "sum_all_with_embeddings":
            return [encoded["embedding_output"], *encoded["encoder_outputs"]]
        return None

    def build(self, encoded_shape):
        mixed = self._mixed_layers(encoded_shape)
        if mixed is not None:
            self.mix_weights = self.add_weight(
                name="mix_weights", shape=(len(mixed),), initializer="zeros"
            )
            self.gamma = self.add_weight(name="gamma", shape=(), initializer="ones")

    def call(self, encoded):
        layers = encoded["encoder_outputs"]
        if self.features == "embeddings":
            return encoded["embedding_output"]
        if self.features == "second_to_last":
            return layers[-2]
        if self.features == "last":
            return layers[-1]
        if layer_number(self.features) is not None:
            return layers[layer_number(self.features) - 1]
        if self.features == "concat_last_four":
            return keras.ops.concatenate(layers[-4:], axis=-1)
        mixed = self._mixed_layers(encoded)
        weights = keras.ops.softmax(self.mix_weights)
        return self.gamma * sum(weights[j] * layer for j, layer in enumerate(mixed))

    def compute_output_spec(self, encoded):
        like = encoded["encoder_outputs"][-1]
        width = like.shape[-1] * (4 if self.features == "concat_last_four" else 1)
        return keras.KerasTensor((*like.shape[:-1], width), dtype=self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "features": self.features}


def _bidirectional_lstm(units, return_sequences, name):
    """One bidirectional LSTM layer (forward and backward outputs concatenated: 2 * units)."""
    return keras.layers.Bidirectional(
        keras.layers.LSTM(units, return_sequences=return_sequences, use_cudnn=False), name=name
    )


def bilstm(spec, vectors, input_mask, per_token):
    """Two bidirectional LSTM layers over `vectors` [b, s, D], skipping padding (input_mask 0).

    Per token: the second layer's outputs [b, s, 2 * lstm_units]. Otherwise the sequence's summary
    [b, 2 * lstm_units]: the forward direction's output at the last real token and the backward
    direction's at the first, the two states that have each read every real token.
    """
    mask = keras.ops.not_equal(input_mask, 0)
    hidden = _bidirectional_lstm(spec.lstm_units, True, "bilstm_1")(vectors, mask=mask)
    return _bidirectional_lstm(spec.lstm_units, per_token, "bilstm_2")(hidden, mask=mask)


def _encoded_for_bilstm(spec, encoder, inputs):
    """What the BiLSTM reads: sequence_output, or the frozen encoder's chosen activations."""
    if not spec.features:
        return encoder(inputs)["sequence_output"]
    encoded = FrozenEncoder(encoder)(inputs)
    num_layers = len(encoded["encoder_outputs"])
    if num_layers < layers_needed(spec.features):
        raise io_utils.UsageError(
            f"features {spec.features} needs an encoder with at least "
            f"{layers_needed(spec.features)} layers; this one has {num_layers}"
        )
    return EncoderFeatures(spec.features)(encoded)


def token_vectors(spec, encoder, inputs):
    """The per-token vectors [b, s, D] that a token head (ner, squad) reads."""
    if spec.head == "dense":
        return encoder(inputs)["sequence_output"]
    vectors = _encoded_for_bilstm(spec, encoder, inputs)
    return bilstm(spec, vectors, inputs["input_mask"], per_token=True)


def sequence_vector(spec, encoder, inputs):
    """The vector [b, D] a sequence head (classifier, regressor, multiple choice) reads."""
    if spec.head == "dense":
        return encoder(inputs)["pooled_output"]
    vectors = _encoded_for_bilstm(spec, encoder, inputs)
    return bilstm(spec, vectors, inputs["input_mask"], per_token=False)


def encoder_layer(model, encoder):
    """The layer of task `model` that runs `encoder`: the encoder, or the FrozenEncoder around it.

    An export puts its InferenceEncoder in this layer's place.
    """
    for layer in model.layers:
        if isinstance(layer, FrozenEncoder) and layer.encoder is encoder:
            return layer
    return encoder
