"""BERT as Keras functional models: the config, the encoder and the pretraining heads (the network only).

The encoder is the original BERT (Devlin et al. 2018) built from keras-hub layers:

    word + segment + position embeddings -> LayerNorm(eps 1e-12) -> dropout
    -> L post-LN transformer layers (self-attention, residual, LayerNorm; GELU feedforward,
       residual, LayerNorm; eps 1e-12)
    -> sequence_output; pooled_output = tanh(dense(sequence_output[:, 0]))

A left_to_right config (`attention_direction`, the paper's LTR model) masks every layer's attention
so that each position sees itself and the positions before it (LeftToRightTransformerEncoder, the
same weights), and pools each row's last real token instead, since [CLS] then sees only itself.

Layer choices, checked against the installed keras-hub 0.32 / Keras 3.15 source:
- `keras_hub.layers.TransformerEncoder(normalize_first=False)` is exactly BERT's post-LN block. Its
  activation is whatever `hidden_act` names (see `get_activation`). `"gelu"` is Google's: the
  original `modeling.py` (and the TF Model Garden) compute it with the tanh approximation
  0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x^3))), so that is what a Google checkpoint was trained
  with. The exact erf form, Hugging Face's `"gelu"`, is `"gelu_exact"` here; the Hugging Face
  converter renames it. Model directories written before `config_version` 2 meant erf by `"gelu"`;
  `bert_tf.model.model_dir.ModelDir.read_config` reads them that way (see there).
  Its LayerNorm epsilon defaults to 1e-5, so we pass 1e-12.
  It has one dropout rate for both the attention probabilities and the hidden states; every released
  BERT config uses 0.1 for both, and we log a warning when a config asks for two different rates.
- `keras_hub.layers.ReversibleEmbedding` holds the word embeddings; `MaskedLMHead` calls it in reverse,
  which ties the MLM output projection to them, as the original does.
- `keras_hub.layers.PositionEmbedding` holds the learned absolute position table [max_pos, H].
- `keras_hub.layers.MaskedLMHead` is exactly the original MLM transform: gather positions, dense,
  activation, LayerNorm, tied projection, own bias. We pass the config's activation and eps 1e-12.
- The segment embedding is a plain `keras.layers.Embedding`, the pooler and NSP head plain `Dense`.

Reading and writing model directories (config, vocab, checkpoints) is bert_tf.model.model_dir's job.
The weights live in a TF2 object checkpoint. Its keys are attribute paths such as
`encoder/_operations/5/_self_attention_layer/_query_dense/_kernel`, where the number is the layer's
position in the functional graph, so the ORDER in which `build_encoder` creates layers is part of the
on-disk format: append, never reorder. Layer names (`transformer_layer_{i}`, ...) are what
`variable.path` and the checkpoint converter use; they never change either.
"""

import dataclasses
import json

import keras
import keras_hub
import tensorflow as tf
from absl import logging

from bert_tf.runtime import io_utils

# ----------------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------------

# (num_hidden_layers, hidden_size) of the named sizes Google released (the "small BERTs" and BERT).
NAMED_SIZES = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
    "large": (24, 1024),
}

# Written into every bert_config.json we write, as the oldest version that can say what it holds:
# 2: "gelu" is Google's tanh approximation and the exact erf form is "gelu_exact"; the model is
#    bidirectional. A model directory's config without the field was written before, when "gelu"
#    meant erf (model_dir.ModelDir.read_config keeps that meaning). Configs from elsewhere (Google's
#    bert_config.json, Hugging Face's config.json) never carry it and are read as version 2.
# 3: version 2 plus attention_direction. Only a left_to_right model's file is version 3: a bert_tf
#    that reads version 2 only would ignore the unknown field and run the model bidirectionally, so
#    the version makes it refuse the file. A bidirectional model's file stays version 2, unchanged.
BIDIRECTIONAL_CONFIG_VERSION = 2
CONFIG_VERSION = 3  # the newest: this bert_tf reads versions 2 to 3

# How far each token sees. "left_to_right" is the paper's LTR ablation (Table 5, "LTR & No NSP"):
# position i attends to positions <= i only, in pretraining, fine-tuning and every export.
BIDIRECTIONAL = "bidirectional"
LEFT_TO_RIGHT = "left_to_right"
ATTENTION_DIRECTIONS = (BIDIRECTIONAL, LEFT_TO_RIGHT)

_INT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)


def read_json_object(path):
    """The JSON object in `path` (local or gs://); a missing or malformed file is an error naming it."""
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"config file {path} does not exist")
    with io_utils.open_text(path) as f:
        try:
            values = json.load(f)
        except ValueError as e:  # bad JSON, or bytes that are not UTF-8
            raise ValueError(f"{path}: not valid JSON: {e}") from e
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return values


class ConfigError(io_utils.UsageError, ValueError):
    """A config field with a value the model cannot have: a usage error (exit 2) naming the field.

    Also a ValueError, so code that validates a config the way it validates other values keeps working."""


@dataclasses.dataclass
class BertConfig:
    """The original bert_config.json fields, plus do_lower_case (casing travels with the model),
    attention_direction (how far each token sees) and config_version (the file's version)."""

    vocab_size: int
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    do_lower_case: bool = True
    attention_direction: str = BIDIRECTIONAL
    # Any version this bert_tf reads; __post_init__ sets it to the version the config is written in.
    config_version: int = BIDIRECTIONAL_CONFIG_VERSION

    def __post_init__(self):
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"BertConfig.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"BertConfig.hidden_size ({self.hidden_size}) must be a multiple of "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= float(getattr(self, name)) < 1.0:
                raise ConfigError(
                    f"BertConfig.{name} must be in [0, 1), got {getattr(self, name)!r}"
                )
        try:  # fails early, naming the field, on an unknown activation
            get_activation(self.hidden_act)
        except ValueError as e:
            raise ConfigError(f"BertConfig.hidden_act: {e}") from e
        if not isinstance(self.do_lower_case, bool):
            raise ConfigError(
                f"BertConfig.do_lower_case must be true or false, got {self.do_lower_case!r}"
            )
        if self.attention_direction not in ATTENTION_DIRECTIONS:
            raise ConfigError(
                f"BertConfig.attention_direction must be one of {', '.join(ATTENTION_DIRECTIONS)}, "
                f"got {self.attention_direction!r}"
            )
        readable = range(BIDIRECTIONAL_CONFIG_VERSION, CONFIG_VERSION + 1)
        if isinstance(self.config_version, bool) or self.config_version not in readable:
            # A newer bert_tf may give a name a new meaning; guessing would change outputs silently.
            raise ConfigError(
                f"BertConfig.config_version must be {' or '.join(map(str, readable))} (the "
                f"versions this bert_tf reads), got {self.config_version!r}"
            )
        # A version-2 file naming left_to_right is read as it says: only a reader that ignores
        # the field misreads it, and this one does not. Written again, it becomes version 3.
        self.config_version = CONFIG_VERSION if self.left_to_right else BIDIRECTIONAL_CONFIG_VERSION

    @property
    def left_to_right(self):
        """Whether each position attends to itself and the positions before it only."""
        return self.attention_direction == LEFT_TO_RIGHT

    @classmethod
    def from_size(cls, name, vocab_size, **overrides):
        """The named size (tiny/mini/small/medium/base/large): heads H/64, intermediate 4H."""
        if name not in NAMED_SIZES:
            raise ValueError(f"unknown model size {name!r}; known: {', '.join(NAMED_SIZES)}")
        layers, hidden = NAMED_SIZES[name]
        fields = dict(
            vocab_size=vocab_size,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=hidden // 64,
            intermediate_size=4 * hidden,
        )
        fields.update(overrides)
        return cls(**fields)

    @classmethod
    def from_dict(cls, values, source="config"):
        """Builds a config from a dict; missing fields are an error naming them, unknown ones are ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        required = {
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        missing = sorted(required - set(values))
        if missing:
            raise ConfigError(f"{source}: missing field(s) {', '.join(missing)}")
        # Released configs carry extra keys (e.g. multilingual's "directionality", "pooler_*"):
        # they describe nothing this architecture uses.
        ignored = sorted(set(values) - known)
        if ignored:
            logging.info("%s: ignoring field(s) %s", source, ", ".join(ignored))
        try:
            return cls(**{k: v for k, v in values.items() if k in known})
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{source}: {e}") from e

    @classmethod
    def from_json_file(cls, path, **overrides):
        """Reads a bert_config.json; `overrides` (e.g. do_lower_case) replace fields from the file."""
        values = read_json_object(path)
        values.update(overrides)
        return cls.from_dict(values, source=path)

    def to_dict(self):
        """The fields as bert_config.json holds them: a bidirectional model's without
        attention_direction, so that its file is what version 2 always wrote."""
        values = dataclasses.asdict(self)
        if not self.left_to_right:
            del values["attention_direction"]
        return values

    def to_json_file(self, path):
        """Writes the config as JSON, atomically."""
        io_utils.atomic_write_json(path, self.to_dict())


# The two forward passes of one config, build_encoder's Keras encoder and the export's
# InferenceEncoder (bert_tf.saved_model.inference_encoder), must each read every BertConfig field,
# except those listed here; tests/test_pairs_in_step.py holds both passes to this and checks each
# entry's claim, so a field that one pass learns and the other does not fails a test.
# Fields that change nothing a forward pass at inference computes from given weights:
INFERENCE_INERT_FIELDS = frozenset(
    {
        "hidden_dropout_prob",  # dropout is off at inference, and InferenceEncoder is inference only
        "attention_probs_dropout_prob",  # likewise
        "initializer_range",  # draws initial weights; a forward pass is given its weights
        "do_lower_case",  # the tokenizer's casing, carried with the model; the network sees ids
        "config_version",  # the file's version; what it versions, attention_direction, is read
    }
)
# Fields that reach InferenceEncoder as the shapes of the weights it copies from the Keras encoder,
# so it needs no value of its own: the sizes of the three embedding tables.
WEIGHT_SHAPE_FIELDS = frozenset({"vocab_size", "max_position_embeddings", "type_vocab_size"})


# ----------------------------------------------------------------------------------------------
# Layers and models
# ----------------------------------------------------------------------------------------------


@keras.saving.register_keras_serializable(package="bert_tf")
def gelu_tanh(x):
    """GELU's tanh approximation 0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x^3))): Google's "gelu"."""
    # keras.ops.gelu(approximate=True) is tf.nn.gelu(approximate=True), that same formula.
    return keras.ops.gelu(x, approximate=True)


@keras.saving.register_keras_serializable(package="bert_tf")
def gelu_exact(x):
    """The exact GELU x*Phi(x) = 0.5*x*(1 + erf(x/sqrt(2))): Hugging Face's and torch's "gelu"."""
    return keras.ops.gelu(x, approximate=False)


_ACTIVATIONS = {
    # Google's modeling.py `gelu` (and the TF Model Garden's "gelu") is the tanh approximation.
    "gelu": gelu_tanh,
    "gelu_exact": gelu_exact,
    # Hugging Face's names for the tanh form, accepted so their configs need no editing.
    "gelu_new": gelu_tanh,
    "gelu_pytorch_tanh": gelu_tanh,
    "gelu_approximate": gelu_tanh,
    "linear": keras.activations.linear,
    "relu": keras.activations.relu,
    "tanh": keras.activations.tanh,
    "swish": keras.activations.silu,
    "silu": keras.activations.silu,
}


def get_activation(name):
    """The Keras activation for a bert_config.json `hidden_act` string (case-insensitive, like the original)."""
    if not isinstance(name, str) or name.lower() not in _ACTIVATIONS:
        raise ValueError(f"unsupported hidden_act {name!r}; supported: {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[name.lower()]


def _initializer(config):
    """The original's truncated normal initializer with stddev initializer_range."""
    return keras.initializers.TruncatedNormal(stddev=config.initializer_range)


ENCODER_INPUTS = ("input_word_ids", "input_mask", "input_type_ids")
LAYER_NORM_EPSILON = 1e-12
# The word embedding layer. The original looks its table up with tf.gather on GPUs and CPUs (with a
# one-hot matmul on TPUs), so there its gradient comes as rows (see training.norm_over_rows).
WORD_EMBEDDING_LAYER = "token_embedding"


def left_to_right_mask(batch_size, length):
    """bool [batch_size, length, length]: query position i may attend to key position j <= i."""
    positions = keras.ops.arange(length)
    allowed = keras.ops.expand_dims(positions, 1) >= keras.ops.expand_dims(positions, 0)
    return keras.ops.broadcast_to(allowed[None], (batch_size, length, length))


def pooled_token_index(input_mask):
    """int32 [b]: where a left-to-right encoder's pooler reads, each row's last real token.

    [CLS] sees only itself under a left-only mask; the last real token has seen the whole input.
    A token is real where its mask is positive, and a row without one reads position 0.
    """
    real = keras.ops.sum(keras.ops.cast(input_mask > 0, "int32"), axis=1)
    return keras.ops.maximum(real - 1, 0)


@keras.saving.register_keras_serializable(package="bert_tf")
class LeftToRightTransformerEncoder(keras_hub.layers.TransformerEncoder):
    """keras-hub's TransformerEncoder in which each position attends to itself and those before it.

    The mask is made inside the layer rather than in the encoder's functional graph: an op there
    would take an index among the encoder's operations, which key the checkpoint, so both
    directions keep one checkpoint layout; and a caller of the layer alone (the playground's
    attention view) gets the mask too. Its weights and arguments are the parent's.
    """

    def call(
        self,
        inputs,
        padding_mask=None,
        attention_mask=None,
        training=None,
        return_attention_scores=False,
    ):
        shape = keras.ops.shape(inputs)
        left_only = left_to_right_mask(shape[0], shape[1])
        if attention_mask is not None:
            left_only = keras.ops.logical_and(left_only, keras.ops.cast(attention_mask, "bool"))
        return super().call(
            inputs,
            padding_mask=padding_mask,
            attention_mask=left_only,
            training=training,
            return_attention_scores=return_attention_scores,
        )


@keras.saving.register_keras_serializable(package="bert_tf")
class LastRealToken(keras.layers.Layer):
    """sequence [b, s, h], input_mask [b, s] -> [b, h]: each row's last real token (the pooler's
    input in a left-to-right encoder). One op in the graph, where a bidirectional encoder has its
    first-token slice, so the pooler keeps its index among the encoder's operations."""

    def call(self, sequence, input_mask):
        index = pooled_token_index(input_mask)
        return keras.ops.take_along_axis(sequence, index[:, None, None], axis=1)[:, 0]


def encoder_inputs():
    """The encoder's inputs as Keras inputs: input_word_ids, input_mask, input_type_ids, int32 [b, s]."""
    return {name: keras.Input(shape=(None,), dtype="int32", name=name) for name in ENCODER_INPUTS}


def build_encoder(config):
    """The BERT encoder as a functional keras.Model (inputs and outputs are named dicts)."""
    if config.attention_probs_dropout_prob != config.hidden_dropout_prob:
        logging.warning(
            "keras_hub TransformerEncoder has a single dropout rate: using hidden_dropout_prob=%s "
            "for the attention probabilities too (config asks for %s)",
            config.hidden_dropout_prob,
            config.attention_probs_dropout_prob,
        )
    activation = get_activation(config.hidden_act)

    # Layers, in creation order (see the module docstring: the order is part of the checkpoint format).
    word_embeddings = keras_hub.layers.ReversibleEmbedding(
        config.vocab_size,
        config.hidden_size,
        tie_weights=True,
        embeddings_initializer=_initializer(config),
        name=WORD_EMBEDDING_LAYER,
    )
    position_embeddings = keras_hub.layers.PositionEmbedding(
        sequence_length=config.max_position_embeddings,
        initializer=_initializer(config),
        name="position_embedding",
    )
    segment_embeddings = keras.layers.Embedding(
        config.type_vocab_size,
        config.hidden_size,
        embeddings_initializer=_initializer(config),
        name="segment_embedding",
    )
    embeddings_layer_norm = keras.layers.LayerNormalization(
        axis=-1, epsilon=LAYER_NORM_EPSILON, name="embeddings_layer_norm"
    )
    embeddings_dropout = keras.layers.Dropout(config.hidden_dropout_prob, name="embeddings_dropout")
    transformer_class = (
        LeftToRightTransformerEncoder
        if config.left_to_right
        else keras_hub.layers.TransformerEncoder
    )
    transformer_layers = [
        transformer_class(
            intermediate_dim=config.intermediate_size,
            num_heads=config.num_attention_heads,
            dropout=config.hidden_dropout_prob,
            activation=activation,
            layer_norm_epsilon=LAYER_NORM_EPSILON,
            kernel_initializer=_initializer(config),
            normalize_first=False,
            name=f"transformer_layer_{i}",
        )
        for i in range(config.num_hidden_layers)
    ]
    pooler = keras.layers.Dense(
        config.hidden_size,
        activation="tanh",
        kernel_initializer=_initializer(config),
        name="pooled_dense",
    )

    # The functional graph.
    inputs = encoder_inputs()
    tokens = word_embeddings(inputs["input_word_ids"])
    x = keras.layers.Add(name="embeddings_add")(
        [tokens, position_embeddings(tokens), segment_embeddings(inputs["input_type_ids"])]
    )
    x = embeddings_dropout(embeddings_layer_norm(x))
    # What the first transformer layer reads: the feature-based approach's "embeddings" layer.
    embedding_output = x
    encoder_outputs = []
    for layer in transformer_layers:
        x = layer(x, padding_mask=inputs["input_mask"])
        encoder_outputs.append(x)
    if config.left_to_right:
        pooled = pooler(LastRealToken(name="last_real_token")(x, inputs["input_mask"]))
    else:
        pooled = pooler(x[:, 0, :])
    outputs = {
        "sequence_output": x,
        "pooled_output": pooled,
        "encoder_outputs": encoder_outputs,
        "embedding_output": embedding_output,
    }
    return keras.Model(inputs=inputs, outputs=outputs, name="bert_encoder")


def build_pretraining_model(config, encoder=None, with_nsp_head=True):
    """The encoder plus the MLM head and (`with_nsp_head`) the NSP head; returns (pretraining_model, encoder).

    mlm_logits [b, P, V] and nsp_logits [b, 2] are float32 under any mixed-precision policy,
    so the losses are computed in float32. Without the NSP head (the paper's "No NSP" ablation,
    and its left-to-right model) there is no nsp_logits output and no NSP weights to save; the
    MLM head keeps the place in the model, and so the checkpoint keys, it has with both heads.
    """
    if encoder is None:
        encoder = build_encoder(config)
    activation = get_activation(config.hidden_act)
    mlm_head = keras_hub.layers.MaskedLMHead(
        token_embedding=encoder.get_layer(WORD_EMBEDDING_LAYER),
        intermediate_activation=activation,
        layer_norm_epsilon=LAYER_NORM_EPSILON,
        kernel_initializer=_initializer(config),
        # keras-hub 0.32's MaskedLMHead turns autocast off and then adds its float32 bias to
        # compute-dtype logits, which fails under mixed_bfloat16/mixed_float16. A float32 head
        # avoids that; the heavy tied projection still runs in the embedding layer's policy.
        dtype="float32",
        name="mlm_head",
    )
    # Created before the graph is built, as the MLM head is: the layers' seeded initializers draw in
    # creation order, so a model with both heads gets the same weights with or without this option.
    nsp_head = (
        keras.layers.Dense(2, kernel_initializer=_initializer(config), name="nsp_head")
        if with_nsp_head
        else None
    )

    inputs = encoder_inputs()
    inputs["masked_lm_positions"] = keras.Input(
        shape=(None,), dtype="int32", name="masked_lm_positions"
    )
    encoder_outputs = encoder({name: inputs[name] for name in ENCODER_INPUTS})
    mlm_logits = mlm_head(
        encoder_outputs["sequence_output"], mask_positions=inputs["masked_lm_positions"]
    )
    # A float32 linear activation is Keras' recommended way to end a mixed-precision model.
    outputs = {
        "mlm_logits": keras.layers.Activation("linear", dtype="float32", name="mlm_logits")(
            mlm_logits
        ),
    }
    if nsp_head is not None:
        outputs["nsp_logits"] = keras.layers.Activation(
            "linear", dtype="float32", name="nsp_logits"
        )(nsp_head(encoder_outputs["pooled_output"]))
    model = keras.Model(inputs=inputs, outputs=outputs, name="bert_pretraining")
    return model, encoder
