"""The pretraining heads through conversion: Hugging Face BertForPreTraining (both heads),
BertForMaskedLM (MLM only), BertModel (none) and Google's checkpoint with heads, each checked against
the NumPy BERT of helpers_google; and how a model directory records and restores the heads it has."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import run_module_cli, tiny_inputs, write_tiny_vocab
from helpers_google import (
    GOOGLE_TINY,
    NSP_KEYS,
    NumpyBert,
    hf_state_dict,
    hf_weights,
    np_gelu,
    np_gelu_exact,
    np_log_softmax,
    random_weights,
    write_google_dir,
    write_hf_dir,
)

from bert_tf.checkpoints import conversion, huggingface, initial_weights, name_map
from bert_tf.model import model_dir, modeling
from bert_tf.model.model_dir import ModelDir, ModelDirError

BOTH = frozenset({"mlm", "nsp"})


def inputs_and_positions():
    """Two rows of 9 tokens (the second padded) and three masked positions in each."""
    x = tiny_inputs(seq=9, seed=3)
    return x, np.array([[1, 4, 7], [0, 2, 5]], np.int32)


def assert_heads_match(model, w, gelu, heads):
    """The converted model's head outputs equal NumPy BERT's (logits and log-softmax, within 1e-4)."""
    x, positions = inputs_and_positions()
    got = model({**x, "masked_lm_positions": positions})
    ref = NumpyBert(w, GOOGLE_TINY, x["input_word_ids"], x["input_mask"], x["input_type_ids"], gelu)
    if "mlm" in heads:
        mlm = ref.mlm_logits(positions)
        assert got["mlm_logits"].shape == (2, 3, GOOGLE_TINY["vocab_size"])
        np.testing.assert_allclose(got["mlm_logits"].numpy(), mlm, atol=1e-4)
        np.testing.assert_allclose(
            tf.nn.log_softmax(got["mlm_logits"]).numpy(), np_log_softmax(mlm), atol=1e-4
        )
    if "nsp" in heads:
        nsp = ref.nsp_logits()
        np.testing.assert_allclose(got["nsp_logits"].numpy(), nsp, atol=1e-4)
        np.testing.assert_allclose(
            tf.nn.log_softmax(got["nsp_logits"]).numpy(), np_log_softmax(nsp), atol=1e-4
        )
    return ref


@pytest.fixture
def warnings(monkeypatch):
    """The warnings checkpoints, model_dir and initial_weights log, formatted."""
    logged = []
    for module in (name_map, model_dir, initial_weights):
        monkeypatch.setattr(module.logging, "warning", lambda msg, *args: logged.append(msg % args))
    return logged


# ----------------------------------------------------------------------------------------------
# Conversion
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "old_layer_norm_names,tied_copies",
    [(False, True), (True, False)],
    ids=["state_dict", "save_pretrained_old_names"],
)
def test_bert_for_pretraining_keeps_both_heads(tmp_path, old_layer_norm_names, tied_copies):
    w = hf_weights("BertForPreTraining")
    state = hf_state_dict(w, GOOGLE_TINY, "BertForPreTraining", old_layer_norm_names, tied_copies)
    hf_dir = write_hf_dir(tmp_path / "hf", state, "BertForPreTraining")
    out = str(tmp_path / "model")
    conversion.convert("huggingface", hf_dir, out)
    directory = ModelDir(out)
    assert directory.pretraining_heads() == BOTH
    # Both heads are the whole pretraining model, as a pretraining run writes it.
    assert directory.checkpoint_objects() - {"save_counter"} == {"encoder", "pretraining_model"}
    model, encoder = directory.load_pretraining_model(require=BOTH)
    # Hugging Face's "gelu" is the erf form.
    ref = assert_heads_match(model, w, np_gelu_exact, BOTH)
    x, _ = inputs_and_positions()
    np.testing.assert_allclose(encoder(x)["pooled_output"].numpy(), ref.pooled_output, atol=1e-5)
    # NSP label 0 is IsNext: the head's row 0 is HF's row 0 (no reordering anywhere).
    np.testing.assert_array_equal(
        model.get_layer("nsp_head").kernel.numpy(), w["cls/seq_relationship/output_weights"].T
    )


def test_bert_for_masked_lm_keeps_the_mlm_head_and_writes_no_nsp_head(tmp_path, warnings):
    w = hf_weights("BertForMaskedLM", seed=1)
    state = hf_state_dict(w, GOOGLE_TINY, "BertForMaskedLM")
    assert not any(name.startswith(("cls.seq_relationship", "bert.pooler")) for name in state)
    # "gelu_new" is Hugging Face's name for the tanh form: Google's "gelu".
    hf_dir = write_hf_dir(tmp_path / "hf", state, "BertForMaskedLM", hidden_act="gelu_new")
    out = str(tmp_path / "model")
    prefix = conversion.convert("huggingface", hf_dir, out)
    assert any("has no pooler" in message for message in warnings)
    directory = ModelDir(out)
    assert directory.pretraining_heads() == {"mlm"}
    # No NSP weights in the checkpoint at all; the MLM head's under the whole model's keys.
    keys = [name for name, _ in tf.train.list_variables(prefix)]
    full_model_keys = ("pretraining_model/_operations/5/", "pretraining_model/_operations/6/")
    assert any(k.startswith(full_model_keys[0]) for k in keys)
    assert not any(k.startswith(full_model_keys[1]) for k in keys)

    # A caller that needs the NSP head is refused; one that needs the MLM head gets it.
    with pytest.raises(ModelDirError, match=r"MLM \(masked-LM\) head only.*no NSP"):
        directory.load_pretraining_model(require={"nsp"})
    warnings.clear()
    model, _ = directory.load_pretraining_model(require={"mlm"})
    assert_heads_match(model, w, np_gelu, {"mlm"})
    # The fresh NSP head is named, never silent.
    assert len(warnings) == 1 and "NSP (next-sentence) head is freshly initialized" in warnings[0]
    # The tanh form was kept: the erf form's logits are visibly different.
    x, positions = inputs_and_positions()
    exact = NumpyBert(
        w,
        GOOGLE_TINY,
        x["input_word_ids"],
        x["input_mask"],
        x["input_type_ids"],
        np_gelu_exact,
    ).mlm_logits(positions)
    got = model({**x, "masked_lm_positions": positions})["mlm_logits"].numpy()
    assert np.abs(got - exact).max() > 1e-3
    # The pooler HF's BertForMaskedLM lacks is the original's initialization, seeded: reproducible.
    again = str(tmp_path / "again")
    conversion.convert("huggingface", hf_dir, again)
    np.testing.assert_array_equal(
        ModelDir(again).load_encoder().get_layer("pooled_dense").kernel.numpy(),
        ModelDir(out).load_encoder().get_layer("pooled_dense").kernel.numpy(),
    )


def test_bert_model_converts_without_heads(tmp_path):
    w = hf_weights("BertModel", seed=2)
    hf_dir = write_hf_dir(tmp_path / "hf", hf_state_dict(w, GOOGLE_TINY, "BertModel"), "BertModel")
    out = str(tmp_path / "model")
    conversion.convert("huggingface", hf_dir, out)
    directory = ModelDir(out)
    assert directory.pretraining_heads() == frozenset()
    assert "pretraining_model" not in directory.checkpoint_objects()
    with pytest.raises(ModelDirError, match="no pretraining heads"):
        directory.load_pretraining_model(require={"mlm"})
    x, _ = inputs_and_positions()
    got = directory.load_encoder()(x)
    ref = NumpyBert(
        w, GOOGLE_TINY, x["input_word_ids"], x["input_mask"], x["input_type_ids"], np_gelu_exact
    )
    np.testing.assert_allclose(got["sequence_output"].numpy(), ref.sequence_output, atol=1e-5)
    np.testing.assert_allclose(got["pooled_output"].numpy(), ref.pooled_output, atol=1e-5)


def test_google_checkpoint_with_heads(tmp_path):
    w = random_weights(GOOGLE_TINY, seed=4)
    prefix = write_google_dir(str(tmp_path / "google"), w)
    out = str(tmp_path / "model")
    conversion.convert("google", prefix, out, do_lower_case=True)
    assert ModelDir(out).pretraining_heads() == BOTH
    model, _ = ModelDir(out).load_pretraining_model(require=BOTH)
    assert_heads_match(model, w, np_gelu, BOTH)


def test_google_checkpoint_with_the_mlm_head_only(tmp_path):
    w = random_weights(GOOGLE_TINY, seed=5)
    for name in NSP_KEYS:
        del w[name]
    out = str(tmp_path / "model")
    conversion.convert("google", write_google_dir(str(tmp_path / "g"), w), out, do_lower_case=True)
    assert ModelDir(out).pretraining_heads() == {"mlm"}
    model, _ = ModelDir(out).load_pretraining_model(require={"mlm"})
    assert_heads_match(model, w, np_gelu, {"mlm"})


@pytest.mark.parametrize(
    "name,change,message",
    [
        (
            "cls.predictions.decoder.weight",
            1.0,
            "decoder.weight is not tied to the word embeddings",
        ),
        ("cls.predictions.decoder.bias", 1.0, "decoder.bias is not tied to"),
    ],
)
def test_an_untied_decoder_is_refused(tmp_path, name, change, message):
    w = hf_weights("BertForPreTraining")
    state = hf_state_dict(w, GOOGLE_TINY, "BertForPreTraining")
    state[name] = state[name] + change
    hf_dir = write_hf_dir(tmp_path / "hf", state, "BertForPreTraining")
    with pytest.raises(ValueError, match=message):
        conversion.convert("huggingface", hf_dir, str(tmp_path / "model"))
    assert not os.path.exists(tmp_path / "model")


def test_the_decoder_names_go_through_the_one_name_map():
    to_original = huggingface.huggingface_to_original_name
    assert to_original("cls.predictions.decoder.weight") == (
        "bert/embeddings/word_embeddings",
        False,
    )
    assert to_original("cls.predictions.decoder.bias") == ("cls/predictions/output_bias", False)
    assert to_original("cls.predictions.transform.LayerNorm.gamma") == (
        "cls/predictions/transform/LayerNorm/gamma",
        False,
    )
    assert to_original("cls.predictions.transform.dense.weight") == (
        "cls/predictions/transform/dense/kernel",
        True,
    )
    assert name_map.heads_in(["cls/predictions/output_bias", "bert/pooler/dense/bias"]) == {"mlm"}
    assert name_map.heads_in(["cls/seq_relationship/output_bias"]) == {"nsp"}
    assert name_map.heads_in(["bert/pooler/dense/bias"]) == frozenset()


def test_cli_prints_the_heads_it_kept(tmp_path):
    w = hf_weights("BertForMaskedLM")
    hf_dir = write_hf_dir(
        tmp_path / "hf", hf_state_dict(w, GOOGLE_TINY, "BertForMaskedLM"), "BertForMaskedLM"
    )
    result = run_module_cli(
        "bert_tf.convert_checkpoint",
        "--format=huggingface",
        f"--checkpoint={hf_dir}",
        f"--output_dir={tmp_path / 'model'}",
    )
    assert result.returncode == 0, result.stderr
    assert "the encoder and the MLM (masked-LM) head only" in result.stdout


# ----------------------------------------------------------------------------------------------
# The model directory: which heads, in any checkpoint
# ----------------------------------------------------------------------------------------------


def test_written_heads_are_read_back_from_the_checkpoint(tmp_path):
    config = modeling.BertConfig.from_dict(dict(GOOGLE_TINY, do_lower_case=True))
    vocab = write_tiny_vocab(tmp_path / "vocab.txt", config.vocab_size)
    model, encoder = modeling.build_pretraining_model(config)
    for heads in (BOTH, {"mlm"}, {"nsp"}, set()):
        directory = ModelDir(tmp_path / "-".join(sorted(heads) or ["none"]))
        directory.write(config, vocab, encoder, pretraining_model=model, heads=heads)
        assert directory.pretraining_heads() == heads
    with pytest.raises(ValueError, match="unknown pretraining head"):
        ModelDir(tmp_path / "bad").write(config, vocab, encoder, model, heads={"sop"})
    # NSP only: its weights come back; the MLM head is fresh.
    nsp_only, _ = ModelDir(tmp_path / "nsp").load_pretraining_model(require={"nsp"})
    np.testing.assert_array_equal(
        nsp_only.get_layer("nsp_head").kernel.numpy(), model.get_layer("nsp_head").kernel.numpy()
    )


def test_a_training_checkpoint_has_both_heads(tmp_path):
    # A training checkpoint keys the heads' variables under optimizer/; the object graph still tells.
    config = modeling.BertConfig.from_dict(dict(GOOGLE_TINY, do_lower_case=True))
    model, encoder = modeling.build_pretraining_model(config)
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    ckpt = tf.train.Checkpoint(optimizer=optimizer, encoder=encoder, pretraining_model=model)
    prefix = ckpt.save(str(tmp_path / "ckpt"))
    assert model_dir.checkpoint_pretraining_heads(prefix) == BOTH


def test_an_mlm_only_directory_initializes_a_pretraining_run(tmp_path, warnings):
    w = hf_weights("BertForMaskedLM", seed=6)
    hf_dir = write_hf_dir(
        tmp_path / "hf", hf_state_dict(w, GOOGLE_TINY, "BertForMaskedLM"), "BertForMaskedLM"
    )
    init = str(tmp_path / "mlm_only")
    conversion.convert("huggingface", hf_dir, init)
    source = initial_weights.resolve(init)
    model, encoder = modeling.build_pretraining_model(source.config)
    fresh_nsp = model.get_layer("nsp_head").kernel.numpy()
    warnings.clear()
    assert source.load_weights(encoder, pretraining_model=model) == [
        "encoder",
        "pretraining_model",
    ]
    assert_heads_match(model, w, np_gelu_exact, {"mlm"})
    np.testing.assert_array_equal(model.get_layer("nsp_head").kernel.numpy(), fresh_nsp)
    assert any("NSP (next-sentence) head is freshly initialized" in m for m in warnings)


def test_a_model_without_its_nsp_head_takes_the_mlm_head_of_a_checkpoint_with_both(
    tmp_path, warnings
):
    # run_pretraining --nsp=false started from Google's checkpoint or a model directory with both
    # heads: the MLM head is restored, the NSP head is left out, and nothing is called fresh.
    w = random_weights(GOOGLE_TINY, seed=8)
    prefix = write_google_dir(str(tmp_path / "google"), w)
    config_file = os.path.join(os.path.dirname(prefix), "bert_config.json")
    both_dir = str(tmp_path / "both")
    conversion.convert("google", prefix, both_dir, do_lower_case=True)
    for init, flags in ((prefix, dict(bert_config_file=config_file)), (both_dir, {})):
        source = initial_weights.resolve(
            init, vocab_file=os.path.join(os.path.dirname(prefix), "vocab.txt"), **flags
        )
        model, encoder = modeling.build_pretraining_model(source.config, with_nsp_head=False)
        assert model_dir.model_pretraining_heads(model) == {"mlm"}
        warnings.clear()
        assert source.load_weights(encoder, pretraining_model=model) == [
            "encoder",
            "pretraining_model",
        ]
        assert_heads_match(model, w, np_gelu, {"mlm"})
        assert not warnings, (init, warnings)
    # Written as a pretraining run saves it (the whole model), it reads back as the MLM head only.
    saved = ModelDir(tmp_path / "no_nsp")
    saved.write_files(source.config, source.vocab_file)
    saved.save_checkpoint(encoder=encoder, pretraining_model=model)
    assert saved.pretraining_heads() == {"mlm"}
    keys = [name for name, _ in tf.train.list_variables(saved.latest_checkpoint())]
    assert not any(k.startswith("pretraining_model/_operations/6/") for k in keys)
    with pytest.raises(ModelDirError, match=r"MLM \(masked-LM\) head only.*no NSP"):
        saved.load_pretraining_model(require={"nsp"})
    model, _ = saved.load_pretraining_model(require={"mlm"})
    assert_heads_match(model, w, np_gelu, {"mlm"})
    with pytest.raises(ValueError, match=r"no NSP \(next-sentence\) head"):
        model_dir.pretraining_checkpoint_object(
            modeling.build_pretraining_model(source.config, with_nsp_head=False)[0], BOTH
        )
