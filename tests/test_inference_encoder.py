"""InferenceEncoder computes the Keras encoder's network: every output, every task head, both precisions."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import TINY_CONFIG, tiny_config, tiny_inputs

from bert_tf import export, modeling
from bert_tf.inference_encoder import InferenceEncoder, with_inference_encoder
from bert_tf.tasks import models, registry

# Uneven shapes: 3 heads of 8, an intermediate size that is not a multiple of the hidden size.
CONFIG = tiny_config(hidden_size=24, num_attention_heads=3, intermediate_size=40)


def specs():
    """One TaskSpec of every task kind."""
    for kind in registry.KINDS:
        labels = ["O", "B-X", "I-X"] if registry.get(kind).labelled else []
        yield models.TaskSpec(kind, labels=labels)


def in_graph(model, inputs):
    """`model`'s outputs on `inputs`, traced as an export traces it."""
    return tf.function(lambda x: model(x, training=False))(inputs)


def as_float32(outputs):
    """A model's outputs dict with every tensor (and list of tensors) as float32 NumPy."""
    return tf.nest.map_structure(lambda x: np.asarray(tf.cast(x, tf.float32)), outputs)


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_exact", "relu"])
def test_every_encoder_output_matches_the_keras_encoder(hidden_act):
    tf.keras.utils.set_random_seed(1)
    config = tiny_config(hidden_size=24, num_attention_heads=3, hidden_act=hidden_act)
    encoder = modeling.build_encoder(config)
    fast = with_inference_encoder(encoder, encoder, config)
    # Padded rows, both segments, and a length that is not a multiple of anything.
    inputs = tiny_inputs(batch=3, seq=11, seed=2)
    want = as_float32(in_graph(encoder, inputs))
    got = as_float32(in_graph(fast, inputs))
    assert sorted(got) == sorted(want)
    np.testing.assert_allclose(got["sequence_output"], want["sequence_output"], atol=1e-5)
    np.testing.assert_allclose(got["pooled_output"], want["pooled_output"], atol=1e-5)
    assert len(got["encoder_outputs"]) == config.num_hidden_layers
    for layer, (g, w) in enumerate(zip(got["encoder_outputs"], want["encoder_outputs"])):
        np.testing.assert_allclose(g, w, atol=1e-5, err_msg=f"layer {layer}")
    # The layers' outputs differ from each other: each is its own layer's, not the last one's.
    assert np.abs(got["encoder_outputs"][0] - got["encoder_outputs"][-1]).max() > 1e-3


@pytest.mark.parametrize("spec", list(specs()), ids=lambda spec: spec.kind)
def test_every_task_model_gives_the_keras_models_outputs(spec):
    tf.keras.utils.set_random_seed(3)
    model, encoder = models.build_task_model(CONFIG, spec)
    fast = with_inference_encoder(model, encoder, CONFIG)
    inputs = tiny_inputs(batch=4, seq=9, seed=4)
    if spec.kind == "multiple_choice":  # [b, choices, s]
        inputs = {name: value.reshape(2, 2, 9) for name, value in inputs.items()}
    want, got = in_graph(model, inputs), in_graph(fast, inputs)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
        np.testing.assert_allclose(got[name], want[name], atol=1e-5, err_msg=name)
    # The clone holds the head's weights and the inference encoder's, not the Keras encoder's.
    assert not {id(v) for v in encoder.weights} & {id(v) for v in fast.weights}
    head = [v for v in model.weights if id(v) not in {id(w) for w in encoder.weights}]
    assert {id(v) for v in head} <= {id(v) for v in fast.weights}


def test_bfloat16_keeps_the_compute_dtype_and_stays_close():
    tf.keras.utils.set_random_seed(5)
    spec = models.TaskSpec("classifier", labels=["a", "b"])
    with export.dtype_policy("mixed_bfloat16"):
        model, encoder = models.build_task_model(CONFIG, spec)
        fast = with_inference_encoder(model, encoder, CONFIG)
        fast_encoder = with_inference_encoder(encoder, encoder, CONFIG)
    inputs = tiny_inputs(batch=3, seq=8, seed=6)
    encoded = in_graph(fast_encoder, inputs)
    assert encoded["sequence_output"].dtype == tf.bfloat16
    assert all(v.dtype == "float32" for v in fast.weights)  # variables stay float32
    want, got = in_graph(model, inputs)["logits"], in_graph(fast, inputs)["logits"]
    assert got.dtype == tf.float32
    # bfloat16 keeps 8 bits of mantissa: both round, each its own way.
    np.testing.assert_allclose(got, want, atol=0.05)
    reference = in_graph(encoder, inputs)["sequence_output"]
    np.testing.assert_allclose(
        as_float32(encoded["sequence_output"]), as_float32(reference), atol=0.1
    )


def test_the_projection_weights_are_copied_in_one_query_key_value_matrix():
    tf.keras.utils.set_random_seed(7)
    encoder = modeling.build_encoder(TINY_CONFIG)
    fast = InferenceEncoder(encoder, TINY_CONFIG)
    weights = {v.path: v for v in encoder.weights}
    hidden = TINY_CONFIG.hidden_size
    qkv = fast.transformer_layers[1]["qkv_kernel"].numpy()
    assert qkv.shape == (hidden, 3 * hidden)
    key = weights["transformer_layer_1/self_attention_layer/key/kernel"].numpy()
    np.testing.assert_array_equal(qkv[:, hidden : 2 * hidden], key.reshape(hidden, hidden))
    assert not any(v.trainable for v in fast.weights)
    # Copies: changing the Keras encoder afterwards does not change the inference encoder.
    weights["transformer_layer_1/self_attention_layer/key/kernel"].assign(key + 1.0)
    np.testing.assert_array_equal(fast.transformer_layers[1]["qkv_kernel"].numpy(), qkv)


def test_an_empty_batch_gives_empty_outputs():
    encoder = modeling.build_encoder(TINY_CONFIG)
    fast = with_inference_encoder(encoder, encoder, TINY_CONFIG)
    empty = {name: np.zeros([0, 5], np.int32) for name in modeling.ENCODER_INPUTS}
    outputs = in_graph(fast, empty)
    assert outputs["sequence_output"].shape == (0, 5, TINY_CONFIG.hidden_size)
    assert outputs["pooled_output"].shape == (0, TINY_CONFIG.hidden_size)
    assert keras.mixed_precision.global_policy().name == "float32"
