"""Loading existing BERT weights: Google's original TF1 checkpoints and Hugging Face BERT weights.

Both sources are first put under the ORIGINAL variable names (`bert/encoder/layer_3/attention/self/
query/kernel`, ...), so one name map and one validation serve both. The name map says, for every
original name, which Keras variable (by `variable.path`, e.g.
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

The same map runs backwards, for export (bert_tf.interop.hf_export, bert_tf.interop.keras_hub_export):
`original_weights` reads a model's variables under the original names, and `huggingface_name` gives
transformers' name of each, checked against `huggingface_to_original_name`. A fine-tuned model's
head is mapped too (`task_kind`), under the names Hugging Face's task classes give it.
"""

import dataclasses
import os
import pickle
import re
import zipfile

import numpy as np
import tensorflow as tf
from absl import logging

from bert_tf.model import modeling
from bert_tf.model.model_dir import (
    ALL_HEADS,
    MLM_HEAD,
    NSP_HEAD,
    ModelDir,
    as_heads,
    describe_heads,
    reading_checkpoint,
)

# Optimizer slots and counters in checkpoints written by the original run_pretraining.py.
_IGNORED_GOOGLE_NAME = re.compile(r"(^|/)(adam_m|adam_v|global_step)$")


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


# ----------------------------------------------------------------------------------------------
# The name map
# ----------------------------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------------
# Google's original checkpoints
# ----------------------------------------------------------------------------------------------


def resolve_google_checkpoint(path):
    """The checkpoint prefix for PATH: a prefix (`.../bert_model.ckpt`) or a directory holding one."""
    if tf.io.gfile.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest:
            return latest
        indexes = tf.io.gfile.glob(os.path.join(path, "*.index"))
        if len(indexes) == 1:
            return indexes[0][: -len(".index")]
        raise FileNotFoundError(
            f"{path}: expected exactly one checkpoint (*.index), found {len(indexes)}"
        )
    if path.endswith(".index") or ".data-" in path:
        path = (
            path[: path.rfind(".index")]
            if path.endswith(".index")
            else path[: path.rfind(".data-")]
        )
    if not tf.io.gfile.exists(path + ".index"):
        raise FileNotFoundError(f"no checkpoint at {path} ({path}.index does not exist)")
    return path


def read_google_checkpoint_shapes(prefix):
    """({original name: shape} without optimizer slots and counters, read(name) -> its array).

    A checkpoint whose files are cut short or damaged is a DamagedCheckpointError naming them,
    here or when `read` comes to the damage."""
    with reading_checkpoint(prefix):
        reader = tf.train.load_checkpoint(prefix)
    shapes = {
        name: tuple(shape)
        for name, shape in reader.get_variable_to_shape_map().items()
        if not _IGNORED_GOOGLE_NAME.search(name)
    }

    def read(name):
        with reading_checkpoint(prefix):
            return reader.get_tensor(name)

    return shapes, read


# ----------------------------------------------------------------------------------------------
# Hugging Face weights
# ----------------------------------------------------------------------------------------------

_HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")

# Hugging Face's hidden_act names whose meaning differs from ours: its "gelu" (and "gelu_python") is
# the exact erf form, its "gelu_new"/"gelu_pytorch_tanh" the tanh approximation that is our "gelu".
_HF_ACTIVATIONS = {
    "gelu": "gelu_exact",
    "gelu_python": "gelu_exact",
    "gelu_new": "gelu",
    "gelu_pytorch_tanh": "gelu",
}


def huggingface_config(hf_config, do_lower_case, source="config.json"):
    """A BertConfig from a Hugging Face BERT config.json dict; unsupported settings are errors."""
    problems = []
    if hf_config.get("model_type", "bert") != "bert":
        problems.append(f"model_type is {hf_config['model_type']!r}, not 'bert'")
    if hf_config.get("position_embedding_type", "absolute") != "absolute":
        problems.append(
            f"position_embedding_type {hf_config['position_embedding_type']!r} is not 'absolute'"
        )
    if hf_config.get("is_decoder", False):
        # transformers then masks attention causally but pools [CLS]: neither direction here.
        problems.append("is_decoder is true (causal attention)")
    eps = hf_config.get("layer_norm_eps", modeling.LAYER_NORM_EPSILON)
    if not np.isclose(eps, modeling.LAYER_NORM_EPSILON, rtol=1e-3, atol=0):
        problems.append(f"layer_norm_eps is {eps}, this BERT uses {modeling.LAYER_NORM_EPSILON}")
    if problems:
        raise ValueError(f"{source}: unsupported: " + "; ".join(problems))
    fields = {f.name for f in dataclasses.fields(modeling.BertConfig)}
    values = {k: v for k, v in hf_config.items() if k in fields}
    values["do_lower_case"] = do_lower_case
    # transformers' BertConfig defaults hidden_act to "gelu" (erf) when config.json leaves it out.
    hidden_act = values.get("hidden_act", "gelu")
    if isinstance(hidden_act, str):
        hidden_act = _HF_ACTIVATIONS.get(hidden_act, hidden_act)
    values["hidden_act"] = hidden_act
    return modeling.BertConfig.from_dict(values, source=source)


def huggingface_to_original_name(name):
    """(original name, transpose) for a Hugging Face BERT weight name; original None = ignore it.

    Unknown names come back unchanged so that validation lists them as extra variables. The MLM
    decoder's weight and bias are other names of the word embeddings and of cls.predictions.bias
    (Hugging Face ties them), so they map to those; read_huggingface_weights checks that two Hugging
    Face weights under one original name are equal, which refuses an untied decoder.
    """
    if name.startswith("bert."):
        name = name[len("bert.") :]
    if name in ("embeddings.position_ids", "embeddings.token_type_ids"):
        return None, False  # constant buffers, not weights
    if name == "cls.predictions.decoder.weight":  # [vocab, hidden], the embeddings' layout
        return "bert/embeddings/word_embeddings", False
    if name == "cls.predictions.decoder.bias":
        return "cls/predictions/output_bias", False
    parts = name.split(".")
    if len(parts) < 2:
        return name, False
    *path, leaf = parts
    if path[:2] == ["encoder", "layer"] and len(path) > 2:
        path = ["encoder", f"layer_{path[2]}"] + path[3:]
    if path and path[0] in ("embeddings", "encoder", "pooler"):
        path = ["bert"] + path
    if path == ["cls", "predictions"] and leaf == "bias":
        return "cls/predictions/output_bias", False
    if path == ["cls", "seq_relationship"]:
        # Both store the [2, H] matrix: no transpose.
        return "cls/seq_relationship/" + {"weight": "output_weights", "bias": "output_bias"}.get(
            leaf, leaf
        ), False
    is_layer_norm = path[-1] == "LayerNorm"
    is_embedding = path[-1].endswith("_embeddings")
    if is_embedding and leaf == "weight":
        return "/".join(path), False
    if is_layer_norm:
        leaf = {"weight": "gamma", "bias": "beta"}.get(leaf, leaf)
        return "/".join(path + [leaf]), False
    if leaf == "weight":
        return "/".join(path + ["kernel"]), True
    return "/".join(path + [leaf]), False


_LAYER = re.compile(r"layer_\d+")  # an original name's encoder layer (layer_3)


def huggingface_name(original, prefix="bert."):
    """(Hugging Face name, transpose) of an original name: huggingface_to_original_name backwards.

    `prefix` is "bert." for transformers' BertFor* classes, "" for a bare BertModel. Each name is
    checked against huggingface_to_original_name, which also decides the transpose, so the two
    directions are one map and cannot drift apart: a name that does not come back is a bug.
    """
    if original == "cls/predictions/output_bias":
        name = "cls.predictions.bias"
    elif original.startswith("cls/seq_relationship/"):
        leaf = original.rsplit("/", 1)[1]
        name = "cls.seq_relationship." + {"output_weights": "weight", "output_bias": "bias"}.get(
            leaf, leaf
        )
    else:
        path, scope = original.split("/"), ""
        if path[0] == "bert":
            path, scope = path[1:], prefix
        if path[-1].endswith("_embeddings"):
            path = path + ["weight"]
        else:
            leaf = {"gamma": "weight", "beta": "bias", "kernel": "weight"}.get(path[-1], path[-1])
            path = path[:-1] + [leaf]
        # encoder/layer_3 -> encoder.layer.3
        path = [p for part in path for p in (part.split("_") if _LAYER.fullmatch(part) else [part])]
        name = scope + ".".join(path)
    back, transpose = huggingface_to_original_name(name)
    if back != original:
        raise RuntimeError(f"name map bug: {original} -> {name} -> {back}")
    return name, transpose


def huggingface_activation(hidden_act):
    """Hugging Face's hidden_act for the function our `hidden_act` names (huggingface_config's map
    backwards): our "gelu", the tanh approximation, is its "gelu_new"; our "gelu_exact", the erf form,
    is its "gelu"; relu, tanh, linear, swish and silu keep their names."""
    activation = modeling.get_activation(hidden_act)
    hf_name = {modeling.gelu_tanh: "gelu_new", modeling.gelu_exact: "gelu"}.get(
        activation, hidden_act.lower()
    )
    if modeling.get_activation(_HF_ACTIVATIONS.get(hf_name, hf_name)) is not activation:
        raise RuntimeError(f"activation map bug: {hidden_act!r} -> {hf_name!r}")
    return hf_name


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


class _TorchStorage:
    """A storage class named in a pytorch_model.bin pickle: carries the numpy dtype only."""

    def __init__(self, dtype):
        self.dtype = dtype


_TORCH_STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


def _rebuild_tensor(storage, offset, size, stride, *unused):
    """torch._utils._rebuild_tensor_v2 for numpy: a strided view of the storage, copied."""
    itemsize = storage.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=tuple(size), strides=tuple(s * itemsize for s in stride)
    )
    return np.array(view)


def read_pytorch_bin(path):
    """Reads a torch.save zip archive of tensors into numpy arrays without importing torch.

    The archive holds `<root>/data.pkl` (a pickle whose tensors reference storages by key) and
    `<root>/data/<key>` (raw little-endian storage bytes). The unpickler below resolves only the
    handful of globals a state dict needs and refuses everything else, so no code is executed.
    """
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"{path}: not a zip-format torch checkpoint (legacy torch<1.6 files are "
            "not supported without torch; re-save it or use model.safetensors)"
        )
    with zipfile.ZipFile(path) as archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise ValueError(f"{path}: expected one data.pkl, found {pickles}")
        root = pickles[0][: -len("data.pkl")]

        class Unpickler(pickle.Unpickler):
            def find_class(self, module, name):
                if module == "collections" and name == "OrderedDict":
                    import collections

                    return collections.OrderedDict
                if module == "torch._utils" and name == "_rebuild_tensor_v2":
                    return _rebuild_tensor
                if module == "torch" and name in _TORCH_STORAGE_DTYPES:
                    return _TorchStorage(np.dtype(_TORCH_STORAGE_DTYPES[name]))
                if module == "torch" and name == "BFloat16Storage":
                    raise ValueError(f"{path}: bfloat16 tensors are not supported without torch")
                raise pickle.UnpicklingError(f"{path}: refusing to load {module}.{name}")

            def persistent_load(self, pid):
                kind, storage_type, key, _location, _numel = pid
                if kind != "storage":
                    raise pickle.UnpicklingError(f"{path}: unknown persistent id {kind!r}")
                data = archive.read(f"{root}data/{key}")
                return np.frombuffer(data, dtype=storage_type.dtype.newbyteorder("<"))

        with archive.open(pickles[0]) as f:
            state = Unpickler(f).load()
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a state dict, got {type(state).__name__}")
    return {name: value for name, value in state.items() if isinstance(value, np.ndarray)}


def read_huggingface_weights(hf_dir):
    """({original name: array}, weight file) from HF_DIR/model.safetensors or pytorch_model.bin."""
    for filename in _HF_WEIGHT_FILES:
        path = os.path.join(hf_dir, filename)
        if tf.io.gfile.exists(path):
            break
    else:
        raise FileNotFoundError(f"{hf_dir} has neither {' nor '.join(_HF_WEIGHT_FILES)}")
    if filename.endswith(".safetensors"):
        from safetensors.numpy import load_file

        hf_weights = load_file(path)
    else:
        hf_weights = read_pytorch_bin(path)
    weights, hf_names = {}, {}
    # Sorted, so the decoder's names (cls.predictions.decoder.*) come after those they are tied to.
    for hf_name in sorted(hf_weights, key=lambda n: (".decoder." in n, n)):
        original, transpose = huggingface_to_original_name(hf_name)
        if original is None:
            continue
        array = hf_weights[hf_name].T if transpose else hf_weights[hf_name]
        if original in weights:
            first = hf_names[original]
            if array.shape == weights[original].shape and np.array_equal(array, weights[original]):
                continue  # the same tensor under two names (tied)
            if hf_name.endswith("decoder.weight"):
                problem = (
                    f"{hf_name} is not tied to the word embeddings ({first}); BERT ties them "
                    "and this model's MLM head cannot hold a separate decoder"
                )
            elif hf_name.endswith("decoder.bias"):
                problem = (
                    f"{hf_name} is not tied to (differs from) {first}; the MLM head has one "
                    "output bias"
                )
            else:
                problem = (
                    f"{first} and {hf_name} both map to {original} but differ "
                    "(is the `bert.` prefix mixed?)"
                )
            raise ValueError(f"{path}: {problem}")
        weights[original], hf_names[original] = array, hf_name
    return weights, path


# Hugging Face's BertForMaskedLM (and a BertModel built with add_pooling_layer=False) has no pooler.
_POOLER_NAMES = ("bert/pooler/dense/kernel", "bert/pooler/dense/bias")


def _fresh_pooler(config, source):
    """The pooler a checkpoint without one gets: the original's initialization (truncated normal
    kernel with stddev initializer_range, zero bias), seeded, so a conversion is reproducible."""
    logging.warning(
        "%s has no pooler (bert.pooler.dense): pooled_output comes from a freshly initialized "
        "pooler, as in Hugging Face's models built from such a checkpoint; fine-tune before using it",
        source,
    )
    h = config.hidden_size
    kernel = tf.random.stateless_truncated_normal(
        [h, h], seed=[0, 0], stddev=config.initializer_range
    )
    return {_POOLER_NAMES[0]: kernel.numpy(), _POOLER_NAMES[1]: np.zeros([h], np.float32)}


# ----------------------------------------------------------------------------------------------
# Conversion into a model directory
# ----------------------------------------------------------------------------------------------

FORMATS = ("google", "huggingface")


def _lower_case_setting(values):
    """do_lower_case from a config dict (bert_config.json, tokenizer_config.json), or None if unset."""
    value = values.get("do_lower_case")
    return value if isinstance(value, bool) else None


def convert(
    format,
    checkpoint,
    output_dir,
    bert_config_file=None,
    vocab_file=None,
    do_lower_case=None,
    task_model=None,
):
    """Converts a Google or Hugging Face BERT checkpoint into a model directory; returns its ckpt path.

    Defaults: bert_config.json / config.json and vocab.txt beside the checkpoint. do_lower_case
    comes from the argument, else the config (or HF tokenizer_config.json); it is never guessed.
    The pretraining heads the checkpoint has (heads_in) are kept, and only those: the directory's
    `ModelDir.pretraining_heads()` says which. A Hugging Face checkpoint without a pooler (a
    BertForMaskedLM) gets a freshly initialized one, with a warning.

    `task_model(hf_config, config, source)`, for a Hugging Face source, returns (TaskSpec, task
    model, encoder) when config.json describes a fine-tuned model it can rebuild (bert_tf.interop.hf_export
    passes one that knows its own exports), else None; the directory then holds that task model and
    its task.json, and the head's weights are mapped like the rest.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; expected one of {', '.join(FORMATS)}")
    if format == "google":
        prefix = resolve_google_checkpoint(checkpoint)
        source_dir = os.path.dirname(prefix)
        bert_config_file = bert_config_file or os.path.join(source_dir, "bert_config.json")
        values = modeling.read_json_object(bert_config_file)
        if do_lower_case is None:
            do_lower_case = _lower_case_setting(values)
        if do_lower_case is None:
            raise ValueError(
                f"{bert_config_file} has no do_lower_case: pass --do_lower_case=true|false "
                "(uncased models lower-case, cased and most multilingual ones do not)"
            )
        config = modeling.BertConfig.from_dict(
            dict(values, do_lower_case=do_lower_case), source=bert_config_file
        )
        shapes, read = read_google_checkpoint_shapes(prefix)
        source = prefix
    else:
        source_dir = checkpoint
        bert_config_file = bert_config_file or os.path.join(source_dir, "config.json")
        hf_config = modeling.read_json_object(bert_config_file)
        tokenizer_config = os.path.join(source_dir, "tokenizer_config.json")
        # The casing the files say: tokenizer_config.json's (what the tokenizer applies), else
        # config.json's. A --do_lower_case that contradicts it would read text the model never saw.
        said, said_by = _lower_case_setting(hf_config), bert_config_file
        if tf.io.gfile.exists(tokenizer_config):
            in_tokenizer = _lower_case_setting(modeling.read_json_object(tokenizer_config))
            if in_tokenizer is not None:
                said, said_by = in_tokenizer, tokenizer_config
        if do_lower_case is not None and said is not None and bool(do_lower_case) != said:
            raise ValueError(
                f"--do_lower_case={str(bool(do_lower_case)).lower()} contradicts {said_by} "
                f"(do_lower_case={str(said).lower()}); leave the flag out, casing travels with the model"
            )
        if do_lower_case is None:
            do_lower_case = said
        if do_lower_case is None:
            raise ValueError(
                f"neither {bert_config_file} nor tokenizer_config.json sets do_lower_case: "
                "pass --do_lower_case=true|false"
            )
        config = huggingface_config(hf_config, do_lower_case, source=bert_config_file)
        weights, source = read_huggingface_weights(checkpoint)
        if not any(name in weights for name in _POOLER_NAMES):
            weights.update(_fresh_pooler(config, source))
        shapes = {name: array.shape for name, array in weights.items()}
        read = weights.__getitem__
    vocab_file = vocab_file or os.path.join(source_dir, "vocab.txt")
    if not tf.io.gfile.exists(vocab_file):
        raise FileNotFoundError(f"vocab file {vocab_file} does not exist (pass --vocab_file)")

    task = None
    if format == "huggingface" and task_model is not None:
        task = task_model(hf_config, config, bert_config_file)
    if task is not None:
        spec, model, encoder = task
        assign_original_weights(
            source, shapes, read, model, config.num_hidden_layers, (), task_kind=spec.kind
        )
        path = ModelDir(output_dir).write(config, vocab_file, encoder, spec=spec, model=model)
        logging.info("wrote %s: a fine-tuned %s model", path, spec.kind)
        return path

    heads = heads_in(shapes)
    if heads:
        model, encoder = modeling.build_pretraining_model(config)
    else:
        encoder = modeling.build_encoder(config)
        model = None
    assign_original_weights(source, shapes, read, model or encoder, config.num_hidden_layers, heads)
    path = ModelDir(output_dir).write(
        config, vocab_file, encoder, pretraining_model=model, heads=heads
    )
    logging.info("wrote %s: the encoder and %s", path, describe_heads(heads))
    return path
