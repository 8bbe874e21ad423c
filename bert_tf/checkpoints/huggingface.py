"""Hugging Face BERT weights under the original names: config.json, weight names, activations, weight files.

transformers' names map to the original BERT names (`huggingface_to_original_name`) and back
(`huggingface_name`), one map checked both ways; `read_huggingface_weights` reads
model.safetensors or pytorch_model.bin under the original names, so the one name map
(bert_tf.checkpoints.name_map) and its validation serve Google's and Hugging Face's checkpoints alike.
"""

import dataclasses
import os
import re

import numpy as np
import tensorflow as tf

from bert_tf.checkpoints.pytorch_bin import read_pytorch_bin
from bert_tf.model import modeling

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
