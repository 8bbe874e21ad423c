"""The Keras BERT: config, shapes, mixed precision (the model directory is tests/model/test_model_dir.py)."""

import dataclasses
import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    TINY_CONFIG,
    run_module_cli,
    tiny_inputs,
    write_tiny_model_dir,
    write_tiny_vocab,
)
from helpers_google import GOOGLE_TINY, NumpyBert, random_weights

from bert_tf.checkpoints import name_map
from bert_tf.model import modeling


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
    assert json.load(open(path))["config_version"] == 2
    (tmp_path / "newer.json").write_text(json.dumps(dict(TINY_CONFIG.to_dict(), config_version=4)))
    with pytest.raises(ValueError, match="newer.json: BertConfig.config_version must be 2 or 3"):
        modeling.BertConfig.from_json_file(str(tmp_path / "newer.json"))


def write_config(path, **fields):
    """A bert_config.json of TINY_CONFIG's fields with `fields` set (None: left out); its path."""
    values = {**TINY_CONFIG.to_dict(), **fields}
    path.write_text(json.dumps({k: v for k, v in values.items() if v is not None}))
    return str(path)


def test_a_bidirectional_config_file_is_unchanged_and_a_left_to_right_one_is_version_3(tmp_path):
    bidirectional = tmp_path / "bidirectional.json"
    TINY_CONFIG.to_json_file(str(bidirectional))
    written = json.loads(bidirectional.read_text())
    # What bert_tf wrote before there was a direction: no new key, still version 2.
    assert "attention_direction" not in written and written["config_version"] == 2
    assert modeling.BertConfig.from_json_file(str(bidirectional)) == TINY_CONFIG
    ltr_config = dataclasses.replace(TINY_CONFIG, attention_direction=modeling.LEFT_TO_RIGHT)
    assert ltr_config.left_to_right and ltr_config.config_version == modeling.CONFIG_VERSION == 3
    ltr = tmp_path / "ltr.json"
    ltr_config.to_json_file(str(ltr))
    written = json.loads(ltr.read_text())
    # A bert_tf that reads version 2 only refuses this file instead of running it both ways.
    assert (written["attention_direction"], written["config_version"]) == ("left_to_right", 3)
    assert modeling.BertConfig.from_json_file(str(ltr)) == ltr_config
    # Version 3 may name either direction; a version-2 file naming left_to_right is read as it
    # says, and written again as version 3.
    for version, direction in ((3, "bidirectional"), (2, "left_to_right")):
        path = write_config(
            tmp_path / f"{version}.json", config_version=version, attention_direction=direction
        )
        config = modeling.BertConfig.from_json_file(path)
        assert config.attention_direction == direction
        assert config.config_version == (3 if direction == "left_to_right" else 2)
    # Google's file has no config_version (nor direction): a bidirectional version-2 model.
    google = write_config(tmp_path / "google.json", config_version=None, do_lower_case=None)
    assert modeling.BertConfig.from_json_file(google, do_lower_case=True) == TINY_CONFIG


def test_an_unknown_attention_direction_is_refused_naming_the_field(tmp_path):
    path = write_config(
        tmp_path / "bad.json", attention_direction="right_to_left", config_version=3
    )
    with pytest.raises(
        modeling.ConfigError, match="bad.json: BertConfig.attention_direction must be one of"
    ):
        modeling.BertConfig.from_json_file(path)
    # A job reading it from a model directory exits 2, naming the field.
    model_dir = write_tiny_model_dir(tmp_path / "model", write_tiny_vocab(tmp_path / "vocab.txt"))
    write_config(tmp_path / "model" / "bert_config.json", attention_direction="right_to_left")
    (tmp_path / "input.txt").write_text("w1 w2\n")
    result = run_module_cli(
        "bert_tf.extract_features",
        f"--input_file={tmp_path / 'input.txt'}",
        f"--output_file={tmp_path / 'out.jsonl'}",
        f"--init_checkpoint={model_dir}",
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "attention_direction must be one of bidirectional, left_to_right" in result.stderr
    assert "'right_to_left'" in result.stderr and "Traceback" not in result.stderr


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


# ----------------------------------------------------------------------------------------------
# Left to right (attention_direction)
# ----------------------------------------------------------------------------------------------

LTR_CONFIG = dataclasses.replace(TINY_CONFIG, attention_direction=modeling.LEFT_TO_RIGHT)


def uneven_inputs(lengths, seq=9, seed=1):
    """tiny_inputs rows of `lengths` real tokens each, padded after them."""
    x = tiny_inputs(batch=len(lengths), seq=seq, seed=seed)
    for row, length in enumerate(lengths):
        x["input_mask"][row] = np.arange(seq) < length
        x["input_word_ids"][row, length:] = 0
    return x


def other_ids(ids):
    """Token ids that differ from `ids` at every position."""
    return np.where(ids == 6, 7, 6)


def test_left_to_right_encoder_matches_numpy_bert():
    weights = random_weights(GOOGLE_TINY, with_heads=False)
    encoder = modeling.build_encoder(LTR_CONFIG)
    name_map.assign_original_weights(
        "random weights",
        {name: value.shape for name, value in weights.items()},
        weights.__getitem__,
        encoder,
        LTR_CONFIG.num_hidden_layers,
        (),
    )
    x = uneven_inputs([9, 5, 7])
    got = encoder(x, training=False)
    args = (weights, GOOGLE_TINY, x["input_word_ids"], x["input_mask"], x["input_type_ids"])
    want = NumpyBert(*args, left_to_right=True)
    np.testing.assert_allclose(got["sequence_output"], want.sequence_output, atol=1e-5)
    np.testing.assert_allclose(got["pooled_output"], want.pooled_output, atol=1e-5)
    np.testing.assert_allclose(got["embedding_output"], want.embedding_output, atol=1e-5)
    for mine, reference in zip(got["encoder_outputs"], want.layers, strict=True):
        np.testing.assert_allclose(mine, reference, atol=1e-5)
    # Far from the bidirectional network on the same weights: the comparison tells them apart.
    both_ways = NumpyBert(*args)
    assert np.abs(got["sequence_output"] - both_ways.sequence_output).max() > 1e-2
    assert np.abs(got["pooled_output"] - both_ways.pooled_output).max() > 1e-2


def test_left_to_right_outputs_at_a_position_ignore_the_tokens_after_it():
    ltr = modeling.build_encoder(LTR_CONFIG)
    bidirectional = modeling.build_encoder(TINY_CONFIG)
    bidirectional.set_weights(ltr.get_weights())
    x = uneven_inputs([9, 7])
    position = 3
    after_it = slice(position + 1, 7)  # the real tokens after `position` in both rows
    changed = {name: value.copy() for name, value in x.items()}
    changed["input_word_ids"][:, after_it] = other_ids(x["input_word_ids"][:, after_it])
    before, after = ltr(x), ltr(changed)
    for name in ("sequence_output", "embedding_output"):
        np.testing.assert_allclose(
            before[name][:, : position + 1], after[name][:, : position + 1], atol=1e-6
        )
    for layer, (a, b) in enumerate(zip(before["encoder_outputs"], after["encoder_outputs"])):
        np.testing.assert_allclose(
            a[:, : position + 1], b[:, : position + 1], atol=1e-6, err_msg=f"layer {layer}"
        )
    # The later positions do see the change; and a bidirectional encoder's earlier ones do too.
    later = (
        before["sequence_output"][:, position + 1 :] - after["sequence_output"][:, position + 1 :]
    )
    assert np.abs(later).max() > 1e-3
    earlier = (
        bidirectional(x)["sequence_output"][:, : position + 1]
        - bidirectional(changed)["sequence_output"][:, : position + 1]
    )
    assert np.abs(earlier).max() > 1e-3


def test_left_to_right_pooled_output_reads_the_last_real_token():
    encoder = modeling.build_encoder(LTR_CONFIG)
    x = uneven_inputs([9, 4, 1, 6])
    out = encoder(x)
    sequence = np.asarray(out["sequence_output"])
    pooler = encoder.get_layer("pooled_dense")
    last = x["input_mask"].sum(axis=1) - 1
    np.testing.assert_allclose(
        out["pooled_output"], pooler(sequence[np.arange(4), last]), atol=1e-6
    )
    assert np.abs(out["pooled_output"] - pooler(sequence[:, 0])).max() > 1e-3
    # The padding after it changes nothing; the last real token's id does.
    padded = {name: value.copy() for name, value in x.items()}
    padded["input_word_ids"][1, 4:] = 7
    np.testing.assert_allclose(encoder(padded)["pooled_output"], out["pooled_output"], atol=1e-6)
    last_changed = {name: value.copy() for name, value in x.items()}
    last_changed["input_word_ids"][1, 3] = other_ids(x["input_word_ids"][1, 3])
    changed = np.asarray(encoder(last_changed)["pooled_output"])
    assert np.abs(changed[1] - np.asarray(out["pooled_output"])[1]).max() > 1e-4
    # A bidirectional encoder of the same weights pools [CLS], as ever.
    bidirectional = modeling.build_encoder(TINY_CONFIG)
    bidirectional.set_weights(encoder.get_weights())
    both = bidirectional(x)
    np.testing.assert_allclose(
        both["pooled_output"], pooler(np.asarray(both["sequence_output"])[:, 0]), atol=1e-6
    )


def test_both_directions_have_one_checkpoint_layout(tmp_path):
    """The direction adds no weight and no operation to the encoder's graph: the checkpoint keys
    (attribute paths through the graph's operations) are the same, and a clone is the same model."""
    ltr = modeling.build_encoder(LTR_CONFIG)
    bidirectional = modeling.build_encoder(TINY_CONFIG)

    def checkpoint_keys(encoder, name):
        prefix = tf.train.Checkpoint(encoder=encoder).write(str(tmp_path / name))
        return [key for key, _ in tf.train.list_variables(prefix)]

    assert checkpoint_keys(ltr, "ltr") == checkpoint_keys(bidirectional, "bidirectional")
    assert [v.path for v in ltr.weights] == [v.path for v in bidirectional.weights]
    clone = keras.models.clone_model(ltr)
    clone.set_weights(ltr.get_weights())
    x = uneven_inputs([9, 5])
    for name in ("sequence_output", "pooled_output"):
        np.testing.assert_array_equal(clone(x)[name], ltr(x)[name])


def test_a_left_to_right_layer_called_alone_attends_left_only():
    """As the playground's attention view calls each layer: the mask comes with the layer."""
    layer = modeling.build_encoder(LTR_CONFIG).get_layer("transformer_layer_0")
    hidden = np.random.default_rng(0).normal(size=(1, 5, LTR_CONFIG.hidden_size))
    _, scores = layer(
        hidden.astype(np.float32),
        padding_mask=np.ones((1, 5), np.int32),
        return_attention_scores=True,
        training=False,
    )
    scores = np.asarray(scores)[0]  # [heads, query, key]
    later_keys = np.triu(np.ones((5, 5), bool), k=1)
    assert not scores[:, later_keys].any()
    np.testing.assert_allclose(scores.sum(-1), 1.0, atol=1e-6)
    assert np.all(np.diagonal(scores, axis1=1, axis2=2) > 0)
