"""The Keras BERT: config, shapes, mixed precision (the model directory is tests/test_model_dir.py)."""

import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import TINY_CONFIG, tiny_inputs

from bert_tf import modeling


@pytest.mark.parametrize(
    "name,layers,hidden",
    [
        ("tiny", 2, 128),
        ("mini", 4, 256),
        ("small", 4, 512),
        ("medium", 8, 512),
        ("base", 12, 768),
        ("large", 24, 1024),
    ],
)
def test_named_sizes(name, layers, hidden):
    c = modeling.BertConfig.from_size(name, vocab_size=30522)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) == (
        layers,
        hidden,
        hidden // 64,
        4 * hidden,
    )
    assert modeling.BertConfig.from_size(name, 100, num_hidden_layers=1).num_hidden_layers == 1


def test_config_json_round_trip_and_errors(tmp_path):
    path = str(tmp_path / "bert_config.json")
    TINY_CONFIG.to_json_file(path)
    assert modeling.BertConfig.from_json_file(path) == TINY_CONFIG
    assert json.load(open(path))["do_lower_case"] is True
    # Google's multilingual config carries extra pooler_* fields: ignored.
    values = dict(TINY_CONFIG.to_dict(), pooler_type="first_token_transform", directionality="bidi")
    (tmp_path / "extra.json").write_text(json.dumps(values))
    assert modeling.BertConfig.from_json_file(str(tmp_path / "extra.json")) == TINY_CONFIG
    values = TINY_CONFIG.to_dict()
    del values["vocab_size"]
    (tmp_path / "missing.json").write_text(json.dumps(values))
    with pytest.raises(ValueError, match="missing.json: missing field.*vocab_size"):
        modeling.BertConfig.from_json_file(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="multiple of num_attention_heads"):
        modeling.BertConfig(vocab_size=10, hidden_size=10, num_attention_heads=3)
    with pytest.raises(ValueError, match="hidden_act"):
        modeling.BertConfig(vocab_size=10, hidden_act="gelu_fancy")
    # Every config we write says which version of the names it uses; a newer one is refused.
    assert json.load(open(path))["config_version"] == modeling.CONFIG_VERSION == 2
    (tmp_path / "newer.json").write_text(json.dumps(dict(TINY_CONFIG.to_dict(), config_version=3)))
    with pytest.raises(ValueError, match="newer.json: BertConfig.config_version must be 2"):
        modeling.BertConfig.from_json_file(str(tmp_path / "newer.json"))


def test_encoder_outputs_and_layer_names():
    encoder = modeling.build_encoder(TINY_CONFIG)
    assert set(encoder.input) == set(modeling.ENCODER_INPUTS)
    out = encoder(tiny_inputs())
    assert out["sequence_output"].shape == (2, 7, TINY_CONFIG.hidden_size)
    assert out["pooled_output"].shape == (2, TINY_CONFIG.hidden_size)
    assert len(out["encoder_outputs"]) == 2
    np.testing.assert_array_equal(
        out["encoder_outputs"][-1].numpy(), out["sequence_output"].numpy()
    )
    names = {layer.name for layer in encoder.layers}
    assert {
        "token_embedding",
        "position_embedding",
        "segment_embedding",
        "embeddings_layer_norm",
        "transformer_layer_0",
        "transformer_layer_1",
        "pooled_dense",
    } <= names
    assert encoder.get_layer("embeddings_layer_norm").epsilon == 1e-12
    assert encoder.get_layer("transformer_layer_0").layer_norm_epsilon == 1e-12


def test_padding_does_not_change_real_tokens():
    encoder = modeling.build_encoder(TINY_CONFIG)
    x = tiny_inputs()
    other = {k: v.copy() for k, v in x.items()}
    other["input_word_ids"][-1, -2:] = 5  # different ids at the padded positions
    a, b = encoder(x), encoder(other)
    np.testing.assert_allclose(
        a["sequence_output"][-1, :-2], b["sequence_output"][-1, :-2], atol=1e-6
    )
    np.testing.assert_allclose(a["pooled_output"], b["pooled_output"], atol=1e-6)


def test_gelu_is_googles_tanh_form_and_gelu_exact_is_erf():
    x = np.linspace(-6, 6, 241)
    # google-research/bert modeling.py `gelu`: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))).
    tanh_form = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    erf_form = 0.5 * x * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x]))
    x32 = x.astype(np.float32)
    for name in ("gelu", "GELU", "gelu_new", "gelu_pytorch_tanh", "gelu_approximate"):
        np.testing.assert_allclose(
            modeling.get_activation(name)(x32), tanh_form, atol=1e-6, err_msg=name
        )
    np.testing.assert_allclose(modeling.get_activation("gelu_exact")(x32), erf_form, atol=1e-6)
    # The two forms differ by far more than the tolerance above, so each check tells them apart.
    assert np.abs(tanh_form - erf_form).max() > 1e-4
    assert modeling.BertConfig(vocab_size=10).hidden_act == "gelu"
    assert modeling.BertConfig.from_size("tiny", 10).hidden_act == "gelu"


def test_pretraining_model_shapes_and_tied_embeddings():
    model, encoder = modeling.build_pretraining_model(TINY_CONFIG)
    out = model(
        {**tiny_inputs(), "masked_lm_positions": np.array([[1, 2, 3], [0, 4, 4]], np.int32)}
    )
    assert out["mlm_logits"].shape == (2, 3, TINY_CONFIG.vocab_size)
    assert out["nsp_logits"].shape == (2, 2)
    # The MLM projection is the word embedding matrix itself: no separate [H, V] kernel.
    paths = [v.path for v in model.weights]
    assert [p for p in paths if p.startswith("mlm_head/")] == [
        "mlm_head/output_bias",
        "mlm_head/intermediate_dense/kernel",
        "mlm_head/intermediate_dense/bias",
        "mlm_head/intermediate_layer_norm/gamma",
        "mlm_head/intermediate_layer_norm/beta",
    ]
    assert paths.count("token_embedding/embeddings") == 1


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_logits_are_float32(policy):
    keras.mixed_precision.set_global_policy(policy)
    try:
        model, encoder = modeling.build_pretraining_model(TINY_CONFIG)
        out = model({**tiny_inputs(), "masked_lm_positions": np.array([[1, 2], [0, 4]], np.int32)})
        assert out["mlm_logits"].dtype == tf.float32 and out["nsp_logits"].dtype == tf.float32
        assert (
            encoder(tiny_inputs())["sequence_output"].dtype
            == keras.mixed_precision.global_policy().compute_dtype
        )
        assert all(v.dtype == "float32" for v in model.weights)
    finally:
        keras.mixed_precision.set_global_policy("float32")
