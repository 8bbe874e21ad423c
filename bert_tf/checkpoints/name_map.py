"""The one name map between the original BERT variable names and this BERT's Keras variables.

Google's original TF1 checkpoints (bert_tf.checkpoints.google_checkpoint) and Hugging Face BERT
weights (bert_tf.checkpoints.huggingface) are both first put under the ORIGINAL variable names
(`bert/encoder/layer_3/attention/self/query/kernel`, ...), so one name map and one validation serve
both. The name map says, for every original name, which Keras variable (by `variable.path`, e.g.
`transformer_layer_3/self_attention_layer/query/kernel`) receives it and how its layout changes:

- attention query/key/value kernels are [H, H] in the original, [H, heads, H/heads] in Keras'
  MultiHeadAttention, and their biases [H] vs [heads, H/heads]; the attention output kernel is
  [H, H] vs [heads, H/heads, H]. These are pure reshapes (heads are contiguous column blocks).
- `cls/seq_relationship/output_weights` is stored [2, H] (the original multiplies with
  transpose_b=True); the Keras Dense kernel is [H, 2].
- Hugging Face Linear weights are [out, in]: transposed into the original's [in, out] kernels.

A checkpoint holds the pretraining heads it holds: both (Google's with `cls/`, Hugging Face's
BertForPreTraining), the MLM head only (`cls/predictions/`: Hugging Face's BertForMaskedLM), or none
(an encoder-only source such as a Hugging Face BertModel). `heads_in` tells them apart by name, the
name map covers the heads asked for, and the model directory records which ones it got
(bert_tf.model.model_dir: `ModelDir.pretraining_heads()`).

Validation runs before any weight is assigned and reports every missing, extra and mis-shaped
variable at once, so a config that does not match its checkpoint never half-loads.

The same map runs backwards, for export (bert_tf.interop.hf_export and keras_hub_export):
`original_weights` reads a model's variables under the original names, and `huggingface_name` gives
transformers' name of each, checked against `huggingface_to_original_name`. A fine-tuned model's
head is mapped too (`task_kind`), under the names Hugging Face's task classes give it.
"""

import dataclasses

import numpy as np
from absl import logging

from bert_tf.model.model_dir import ALL_HEADS, MLM_HEAD, NSP_HEAD, as_heads


class CheckpointMismatchError(ValueError):
    """The checkpoint's variables do not match the model built from the config."""

    def __init__(self, source, missing, extra, mismatched):
        self.missing, self.extra, self.mismatched = missing, extra, mismatched
        lines = [f"{source} does not match the model config; nothing was loaded:"]
        lines += [
            f"  missing from checkpoint: {name} (expected shape {list(shape)})"
            for name, shape in missing
        ]
        lines += [f"  not in the model: {name} (shape {list(shape)})" for name, shape in extra]
        lines += [
            f"  shape mismatch: {name}: checkpoint {list(have)} vs config {list(want)}"
            for name, have, want in mismatched
        ]
        super().__init__("\n".join(lines))


# How an original array becomes the Keras variable's layout: (original shape from Keras shape, convert).
_LAYOUTS = {
    "same": (lambda s: tuple(s), lambda a, s: a),
    # [H, H] -> [H, heads, head_size]
    "split_heads_kernel": (lambda s: (s[0], s[1] * s[2]), lambda a, s: a.reshape(s)),
    # [H] -> [heads, head_size]
    "split_heads_bias": (lambda s: (s[0] * s[1],), lambda a, s: a.reshape(s)),
    # [H, H] -> [heads, head_size, H]
    "merge_heads_kernel": (lambda s: (s[0] * s[1], s[2]), lambda a, s: a.reshape(s)),
    # [2, H] -> [H, 2]
    "transpose": (lambda s: (s[1], s[0]), lambda a, s: a.T),
}
# The way back, Keras layout -> original (the reverse of each convert above): (array, original shape).
_TO_ORIGINAL = {
    "same": lambda a, s: a,
    "split_heads_kernel": lambda a, s: a.reshape(s),
    "split_heads_bias": lambda a, s: a.reshape(s),
    "merge_heads_kernel": lambda a, s: a.reshape(s),
    "transpose": lambda a, s: a.T,
}


def _encoder_entries(num_layers):
    """(original name, keras variable path, layout) for every encoder variable."""
    entries = [
        ("bert/embeddings/word_embeddings", "token_embedding/embeddings", "same"),
        ("bert/embeddings/token_type_embeddings", "segment_embedding/embeddings", "same"),
        ("bert/embeddings/position_embeddings", "position_embedding/embeddings", "same"),
        ("bert/embeddings/LayerNorm/gamma", "embeddings_layer_norm/gamma", "same"),
        ("bert/embeddings/LayerNorm/beta", "embeddings_layer_norm/beta", "same"),
    ]
    for i in range(num_layers):
        src, dst = f"bert/encoder/layer_{i}", f"transformer_layer_{i}"
        for part in ("query", "key", "value"):
            entries.append(
                (
                    f"{src}/attention/self/{part}/kernel",
                    f"{dst}/self_attention_layer/{part}/kernel",
                    "split_heads_kernel",
                )
            )
            entries.append(
                (
                    f"{src}/attention/self/{part}/bias",
                    f"{dst}/self_attention_layer/{part}/bias",
                    "split_heads_bias",
                )
            )
        entries += [
            (
                f"{src}/attention/output/dense/kernel",
                f"{dst}/self_attention_layer/attention_output/kernel",
                "merge_heads_kernel",
            ),
            (
                f"{src}/attention/output/dense/bias",
                f"{dst}/self_attention_layer/attention_output/bias",
                "same",
            ),
            (
                f"{src}/attention/output/LayerNorm/gamma",
                f"{dst}/self_attention_layer_norm/gamma",
                "same",
            ),
            (
                f"{src}/attention/output/LayerNorm/beta",
                f"{dst}/self_attention_layer_norm/beta",
                "same",
            ),
            (
                f"{src}/intermediate/dense/kernel",
                f"{dst}/feedforward_intermediate_dense/kernel",
                "same",
            ),
            (
                f"{src}/intermediate/dense/bias",
                f"{dst}/feedforward_intermediate_dense/bias",
                "same",
            ),
            (f"{src}/output/dense/kernel", f"{dst}/feedforward_output_dense/kernel", "same"),
            (f"{src}/output/dense/bias", f"{dst}/feedforward_output_dense/bias", "same"),
            (f"{src}/output/LayerNorm/gamma", f"{dst}/feedforward_layer_norm/gamma", "same"),
            (f"{src}/output/LayerNorm/beta", f"{dst}/feedforward_layer_norm/beta", "same"),
        ]
    entries += [
        ("bert/pooler/dense/kernel", "pooled_dense/kernel", "same"),
        ("bert/pooler/dense/bias", "pooled_dense/bias", "same"),
    ]
    return entries


# Each head's variables; the MLM head's output projection is the word embeddings (tied).
_HEAD_ENTRIES = {
    MLM_HEAD: [
        ("cls/predictions/transform/dense/kernel", "mlm_head/intermediate_dense/kernel", "same"),
        ("cls/predictions/transform/dense/bias", "mlm_head/intermediate_dense/bias", "same"),
        (
            "cls/predictions/transform/LayerNorm/gamma",
            "mlm_head/intermediate_layer_norm/gamma",
            "same",
        ),
        (
            "cls/predictions/transform/LayerNorm/beta",
            "mlm_head/intermediate_layer_norm/beta",
            "same",
        ),
        ("cls/predictions/output_bias", "mlm_head/output_bias", "same"),
    ],
    NSP_HEAD: [
        ("cls/seq_relationship/output_weights", "nsp_head/kernel", "transpose"),
        ("cls/seq_relationship/output_bias", "nsp_head/bias", "same"),
    ],
}
# The original name scope of each head.
_HEAD_SCOPES = {MLM_HEAD: "cls/predictions/", NSP_HEAD: "cls/seq_relationship/"}


def _heads(with_heads):
    """`with_heads` (True: both heads, False/None: none, or a collection of head names) as a frozenset."""
    if with_heads is True:
        return ALL_HEADS
    return as_heads(with_heads or ())


# A fine-tuned model's head (bert_tf/tasks/<task>/model.py: one Dense layer on pooled_output or
# sequence_output) -> (its Keras layer, its scope). The original scripts released no fine-tuned
# checkpoints, so the scope is what huggingface_to_original_name reads Hugging Face's head as:
# `classifier.weight` [labels, H] is `classifier/kernel` [H, labels], the Keras Dense layout, and
# BertForQuestionAnswering's `qa_outputs.weight` [2, H] is `qa_outputs/kernel` [H, 2].
_TASK_HEADS = {
    "classifier": ("classifier_head", "classifier"),
    "regressor": ("regressor_head", "classifier"),
    "ner": ("ner_head", "classifier"),
    "multiple_choice": ("choice_head", "classifier"),
    "squad": ("squad_head", "qa_outputs"),
}
TASK_HEAD_KINDS = tuple(_TASK_HEADS)


def _task_head_entries(task_kind):
    """(name, keras variable path, layout) of the head of a task model of kind `task_kind`."""
    if task_kind not in _TASK_HEADS:
        raise ValueError(
            f"no name map for a {task_kind!r} head; known: {', '.join(TASK_HEAD_KINDS)}"
        )
    layer, scope = _TASK_HEADS[task_kind]
    return [(f"{scope}/{leaf}", f"{layer}/{leaf}", "same") for leaf in ("kernel", "bias")]


def _mapped_entries(model, num_layers, with_heads, task_kind=None):
    """[(original name, keras variable, layout)] for `model`'s variables (see original_name_map)."""
    variables = {v.path: v for v in model.weights}
    heads = _heads(with_heads)
    entries = _encoder_entries(num_layers)
    if task_kind is not None:
        entries = entries + _task_head_entries(task_kind)
    left_out = set()
    for head, head_entries in _HEAD_ENTRIES.items():
        if head in heads:
            entries = entries + head_entries
        else:
            left_out |= {path for _, path, _ in head_entries}
    mapped = []
    for original, path, layout in entries:
        if path not in variables:
            raise RuntimeError(f"name map bug: model has no variable {path} (for {original})")
        mapped.append((original, variables[path], layout))
    unmapped = set(variables) - {path for _, path, _ in entries} - left_out
    if unmapped:
        raise RuntimeError(f"name map bug: no original name for {sorted(unmapped)}")
    return mapped


def original_name_map(model, num_layers, with_heads, task_kind=None):
    """{original name: (keras variable, original shape, convert fn)} for `model`'s variables.

    `model` is the encoder, or the pretraining model when `with_heads` (True for both heads, or the
    heads to map, e.g. {"mlm"}): a head left out keeps its Keras variables, unmapped. With
    `task_kind` (a task.json kind), `model` is that fine-tuned model and its head is mapped too. Every
    other Keras variable must be covered exactly once; anything else is a bug in this map, reported
    as such.
    """
    name_map = {}
    for original, variable, layout in _mapped_entries(model, num_layers, with_heads, task_kind):
        original_shape, convert = _LAYOUTS[layout]
        keras_shape = tuple(variable.shape)
        name_map[original] = (
            variable,
            original_shape(keras_shape),
            lambda a, s=keras_shape, f=convert: f(a, s),
        )
    return name_map


def original_weights(model, num_layers, with_heads, task_kind=None):
    """{original name: numpy array in the original's layout} of `model`'s variables: the name map
    read backwards (what assign_original_weights assigns, given these arrays, is `model` again,
    bit for bit; the layouts are reshapes and transposes only). Arguments as original_name_map's."""
    weights = {}
    for original, variable, layout in _mapped_entries(model, num_layers, with_heads, task_kind):
        original_shape = _LAYOUTS[layout][0](tuple(variable.shape))
        weights[original] = np.ascontiguousarray(
            _TO_ORIGINAL[layout](np.asarray(variable.numpy()), original_shape)
        )
    return weights


def assign_original_weights(source, shapes, read, model, num_layers, with_heads, task_kind=None):
    """Validates `shapes` ({original name: shape}) against `model`, then assigns every weight.

    `read(name)` returns the array for an original name; it is called only after validation
    succeeds, one variable at a time, so a large checkpoint is never held twice in memory.
    """
    name_map = original_name_map(model, num_layers, with_heads, task_kind)
    missing = [(name, want) for name, (_, want, _) in name_map.items() if name not in shapes]
    extra = [(name, shape) for name, shape in sorted(shapes.items()) if name not in name_map]
    mismatched = [
        (name, tuple(shapes[name]), want)
        for name, (_, want, _) in name_map.items()
        if name in shapes and tuple(shapes[name]) != tuple(want)
    ]
    if missing or extra or mismatched:
        raise CheckpointMismatchError(source, missing, extra, mismatched)
    for name, (variable, _, convert) in name_map.items():
        variable.assign(convert(np.asarray(read(name))).astype(variable.dtype))
    logging.info("loaded %d variables from %s", len(name_map), source)


def heads_in(names):
    """The pretraining heads a set of original names has weights of: a frozenset, subset of
    {"mlm", "nsp"} (any `cls/predictions/` variable: MLM; any `cls/seq_relationship/` one: NSP)."""
    return frozenset(
        head
        for head, scope in _HEAD_SCOPES.items()
        if any(name.startswith(scope) for name in names)
    )


def without_heads(shapes, heads):
    """`shapes` ({original name: shape}) less the variables of `heads` (their `cls/` scopes)."""
    scopes = tuple(_HEAD_SCOPES[head] for head in as_heads(heads))
    return {name: shape for name, shape in shapes.items() if not name.startswith(scopes)}


# The fields of the original bert_config.json (and so of Hugging Face's and keras-hub's BERT).
ORIGINAL_CONFIG_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
)
# With the casing and the file's version: a BertConfig field added later sets something else
# (attention_direction: Google's, Hugging Face's and keras-hub's BERT attend both ways only).
_PORTABLE_FIELDS = frozenset(ORIGINAL_CONFIG_FIELDS) | {"do_lower_case", "config_version"}


def unportable_settings(config):
    """The settings of `config` beyond the original BERT's ("name=value"; its fields that are not
    the original's, where they differ from their defaults): what no other BERT library would keep."""
    return [
        f"{field.name}={getattr(config, field.name)!r}"
        for field in dataclasses.fields(config)
        if field.name not in _PORTABLE_FIELDS
        and (field.default is dataclasses.MISSING or getattr(config, field.name) != field.default)
    ]
