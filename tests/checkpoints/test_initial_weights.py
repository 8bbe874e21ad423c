"""The one resolver of config, vocab and initial weights (bert_tf.checkpoints.initial_weights) that every job uses."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    OLD_CLASSIFIER_SPEC,
    assert_matches_reference,
    old_model_dir,
    reference_inputs,
    tiny_config,
    write_tiny_vocab,
)
from helpers_google import GOOGLE_TINY, random_weights, write_google_dir

from bert_tf.checkpoints import initial_weights
from bert_tf.model import model_dir, modeling
from bert_tf.model.model_dir import ModelDir, ModelDirError
from bert_tf.runtime import io_utils
from bert_tf.tasks import models


def old_dir(name, tmp_path):
    """A copy of a model directory written before ModelDir (see helpers.old_model_dir)."""
    return old_model_dir(name, tmp_path)


@pytest.fixture
def warnings(monkeypatch):
    """The warnings initial_weights and model_dir log, formatted."""
    logged = []
    for module in (initial_weights, model_dir):
        monkeypatch.setattr(module.logging, "warning", lambda msg, *args: logged.append(msg % args))
    return logged


@pytest.fixture(scope="module")
def google(tmp_path_factory):
    """A directory laid out like Google's release (bert_config.json, vocab.txt, bert_model.ckpt.* with
    cls/ heads and a TF1 task head) and its weights."""
    weights = random_weights(GOOGLE_TINY)
    head = {"output_weights": np.ones((3, GOOGLE_TINY["hidden_size"]), np.float32)}
    prefix = write_google_dir(
        str(tmp_path_factory.mktemp("google") / "my_bert"), weights, extra_tensors=head
    )
    return {"prefix": prefix, "dir": os.path.dirname(prefix), "weights": weights}


# ----------------------------------------------------------------------------------------------
# A model directory as --init_checkpoint
# ----------------------------------------------------------------------------------------------


def test_a_model_directory_brings_its_config_vocab_and_weights(reference, tmp_path, warnings):
    init = old_dir("pretrained", tmp_path)
    other_config = str(tmp_path / "other_config.json")
    tiny_config(vocab_size=50, do_lower_case=False).to_json_file(other_config)
    source = initial_weights.resolve(init, bert_config_file=other_config, model_size="base")
    assert (
        source.init_is_model_dir
        and source.init_prefix.endswith("ckpt-1")
        and source.init_spec is None
    )
    assert source.config == ModelDir(init).load_config() and source.vocab_file == os.path.join(
        init, "vocab.txt"
    )
    assert [w for w in warnings if "is ignored" in w] == [
        f"--bert_config_file is ignored: {init} carries its own bert_config.json",
        f"--model_size is ignored: {init} carries its own bert_config.json",
    ]
    model, encoder = modeling.build_pretraining_model(source.config)
    assert source.load_weights(encoder, pretraining_model=model) == ["encoder", "pretraining_model"]
    x, positions = reference_inputs(reference)
    assert_matches_reference(
        model({**x, "masked_lm_positions": positions})["mlm_logits"].numpy(),
        reference["pretrained/mlm_logits"],
    )
    # The casing travels with the model: a flag that contradicts it is refused, an agreeing one accepted.
    with pytest.raises(
        io_utils.UsageError,
        match=r"--do_lower_case=False contradicts .*pretrained's bert_config.json "
        r"\(do_lower_case=True\); casing travels with the model",
    ):
        initial_weights.resolve(init, do_lower_case=False)
    assert initial_weights.resolve(init, do_lower_case=True).config.do_lower_case is True


def test_one_checkpoint_of_a_model_directory_gives_that_checkpoints_weights(tmp_path):
    config = tiny_config()
    encoder = modeling.build_encoder(config)
    directory = ModelDir(str(tmp_path / "run"))
    first = directory.write(config, write_tiny_vocab(tmp_path / "vocab.txt"), encoder)
    first_weights = [w.copy() for w in encoder.get_weights()]
    encoder.set_weights([w + 1.0 for w in first_weights])
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(encoder=encoder), directory.path, 5)
    latest = manager.save(checkpoint_number=2)  # a later step of the same run
    assert latest != first and directory.latest_checkpoint() == latest
    source = initial_weights.resolve(first)
    assert source.init_prefix == first and source.config == config
    loaded = modeling.build_encoder(config)
    assert source.load_weights(loaded) == ["encoder"]
    for got, want in zip(loaded.get_weights(), first_weights):
        np.testing.assert_array_equal(got, want)
    # A checkpoint that is not there is not taken for one.
    with pytest.raises(io_utils.UsageError, match="--init_checkpoint") as refused:
        initial_weights.resolve(str(tmp_path / "run" / "ckpt-9"))
    assert str(refused.value).endswith("holds no ckpt-9 (it holds ckpt-1, ckpt-2)")


def test_a_legacy_model_directory_keeps_its_erf_gelu(reference, tmp_path):
    init = old_dir("legacy_gelu", tmp_path)
    source = initial_weights.resolve(init)
    assert source.config.hidden_act == "gelu_exact"
    encoder = modeling.build_encoder(source.config)
    assert source.load_weights(encoder) == ["encoder"]
    x, _ = reference_inputs(reference)
    assert_matches_reference(
        encoder(x)["sequence_output"].numpy(), reference["legacy_gelu/sequence_output"]
    )


def test_a_fine_tuned_directory_gives_its_head_only_to_the_same_head(reference, tmp_path, warnings):
    init = old_dir("classifier", tmp_path)
    source = initial_weights.resolve(init)
    assert source.init_spec == OLD_CLASSIFIER_SPEC
    x, _ = reference_inputs(reference)
    model, encoder = models.build_task_model(source.config, OLD_CLASSIFIER_SPEC)
    assert source.load_weights(encoder, task_model=model, spec=OLD_CLASSIFIER_SPEC) == [
        "encoder",
        "model",
    ]
    assert_matches_reference(model(x)["logits"].numpy(), reference["classifier/logits"])
    # Other labels: a fresh head on the fine-tuned encoder.
    other = models.TaskSpec("classifier", labels=["a", "b", "c"])
    model, encoder = models.build_task_model(source.config, other)
    assert source.load_weights(encoder, task_model=model, spec=other) == ["encoder"]
    assert (
        f"{init} was fine-tuned for another head (classifier); only its encoder is used" in warnings
    )
    # Pretraining from it: fresh MLM and NSP heads.
    model, encoder = modeling.build_pretraining_model(source.config)
    assert source.load_weights(encoder, pretraining_model=model) == ["encoder"]
    assert any("has no pretraining heads" in w for w in warnings)


def test_a_checkpoint_that_does_not_fit_is_a_usage_error_naming_the_flag(tmp_path):
    init = old_dir("pretrained", tmp_path)
    source = initial_weights.resolve(init)
    bigger = modeling.BertConfig(**dict(source.config.to_dict(), num_hidden_layers=3))
    with pytest.raises(
        io_utils.UsageError,
        match=f"--init_checkpoint={init} does not fit the model config: "
        "checkpoint .*ckpt-1 does not fit bert_config.json",
    ):
        source.load_weights(modeling.build_encoder(bigger))


def test_a_directory_that_lacks_files_is_named_not_taken_for_an_original_checkpoint(tmp_path):
    init = old_dir("pretrained", tmp_path)
    os.remove(os.path.join(init, "checkpoint"))
    with pytest.raises(ModelDirError, match="missing: checkpoint"):
        initial_weights.resolve(init, bert_config_file=os.path.join(init, "bert_config.json"))
    init = old_dir("classifier", tmp_path)
    os.remove(os.path.join(init, "vocab.txt"))
    with pytest.raises(ModelDirError, match="missing: vocab.txt"):
        initial_weights.resolve(init)


# ----------------------------------------------------------------------------------------------
# An original Google checkpoint as --init_checkpoint
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("given", ["prefix", "dir"])
def test_an_original_checkpoint_by_prefix_or_directory(google, given, tmp_path):
    source = initial_weights.resolve(
        google[given],
        os.path.join(google["dir"], "bert_config.json"),
        os.path.join(google["dir"], "vocab.txt"),
    )
    assert not source.init_is_model_dir and source.init_prefix == google["prefix"]
    assert (
        source.config.do_lower_case is True and source.config.hidden_act == "gelu"
    )  # Google's gelu: tanh
    weights = google["weights"]
    # Pretraining accounts for every variable: a TF1 task head (output_weights) beside the cls/ heads is refused.
    model, encoder = modeling.build_pretraining_model(source.config)
    with pytest.raises(io_utils.UsageError, match="not in the model: output_weights"):
        source.load_weights(encoder, pretraining_model=model)
    # Without heads: bert/ only, whatever else the checkpoint holds.
    encoder = modeling.build_encoder(source.config)
    assert source.load_weights(encoder) == ["encoder"]
    np.testing.assert_array_equal(
        encoder.get_layer("token_embedding").embeddings.numpy(),
        weights["bert/embeddings/word_embeddings"],
    )


def test_an_original_checkpoint_with_heads_loads_them(tmp_path):
    weights = random_weights(GOOGLE_TINY, seed=3)
    prefix = write_google_dir(str(tmp_path / "google"), weights)
    source = initial_weights.resolve(
        prefix,
        os.path.join(tmp_path, "google", "bert_config.json"),
        os.path.join(tmp_path, "google", "vocab.txt"),
    )
    model, encoder = modeling.build_pretraining_model(source.config)
    assert source.load_weights(encoder, pretraining_model=model) == ["encoder", "pretraining_model"]
    np.testing.assert_array_equal(
        model.get_layer("nsp_head").kernel.numpy(), weights["cls/seq_relationship/output_weights"].T
    )


def test_a_missing_original_checkpoint_is_a_usage_error(google, tmp_path):
    config_file = os.path.join(google["dir"], "bert_config.json")
    with pytest.raises(
        io_utils.UsageError,
        match=r"--init_checkpoint: no checkpoint at .*nothing .*\(expected a "
        r"model directory or an original checkpoint\)",
    ):
        initial_weights.resolve(
            str(tmp_path / "nothing"), config_file, os.path.join(google["dir"], "vocab.txt")
        )


# ----------------------------------------------------------------------------------------------
# The config and vocab without an init model directory
# ----------------------------------------------------------------------------------------------


def test_a_config_must_come_from_somewhere(tmp_path, google):
    vocab = os.path.join(google["dir"], "vocab.txt")
    with pytest.raises(
        io_utils.UsageError,
        match=r"^give --bert_config_file or --model_size, or a model directory "
        r"as --init_checkpoint$",
    ):
        initial_weights.resolve(vocab_file=vocab, model_size="")
    with pytest.raises(
        io_utils.UsageError,
        match=r"^give --bert_config_file, or a model directory as "
        r"--init_checkpoint \(.*my_bert/bert_model.ckpt is not one\)$",
    ):
        initial_weights.resolve(google["prefix"], vocab_file=vocab)
    with pytest.raises(
        io_utils.UsageError, match="--bert_config_file: config file .*none.json does not exist"
    ):
        initial_weights.resolve(bert_config_file=str(tmp_path / "none.json"), vocab_file=vocab)
    with pytest.raises(io_utils.UsageError, match="--model_size needs --vocab_file"):
        initial_weights.resolve(model_size="tiny")
    source = initial_weights.resolve(vocab_file=vocab, model_size="tiny", do_lower_case=False)
    assert (source.config.hidden_size, source.config.vocab_size, source.config.do_lower_case) == (
        128,
        GOOGLE_TINY["vocab_size"],
        False,
    )
    assert source.load_weights(modeling.build_encoder(source.config)) == []


def test_the_vocab_and_sequence_length_must_fit_the_config(tmp_path, google):
    config_file = os.path.join(google["dir"], "bert_config.json")
    positions = GOOGLE_TINY["max_position_embeddings"]
    with pytest.raises(
        io_utils.UsageError, match="--vocab_file is required unless --init_checkpoint is a model"
    ):
        initial_weights.resolve(bert_config_file=config_file)
    big = tmp_path / "vocab.txt"
    big.write_text("\n".join(["[UNK]"] + [f"t{i}" for i in range(30)]) + "\n")
    with pytest.raises(
        io_utils.UsageError,
        match=r"--vocab_file: .*vocab.txt has 31 tokens but the config's "
        rf"vocab_size is {GOOGLE_TINY['vocab_size']}",
    ):
        initial_weights.resolve(bert_config_file=config_file, vocab_file=str(big))
    with pytest.raises(io_utils.UsageError, match="--vocab_file: vocabulary file not found"):
        initial_weights.resolve(bert_config_file=config_file, vocab_file=str(tmp_path / "none.txt"))
    with pytest.raises(
        io_utils.UsageError,
        match=f"--max_seq_length={positions + 1} exceeds the model's "
        f"max_position_embeddings={positions}",
    ):
        initial_weights.resolve(
            bert_config_file=config_file,
            vocab_file=os.path.join(google["dir"], "vocab.txt"),
            max_seq_length=positions + 1,
        )


def test_a_resumed_output_dir_gives_its_config_and_must_keep_it(tmp_path):
    output_dir = old_dir("pretrained", tmp_path)
    source = initial_weights.resolve(output_dir=output_dir, model_size="")
    assert source.config == ModelDir(output_dir).load_config() and source.vocab_file.startswith(
        output_dir
    )
    assert not source.init_checkpoint
    # The run's own config but for one field.
    values = ModelDir(output_dir).load_config().to_dict()
    other = tmp_path / "other.json"
    other.write_text(json.dumps(dict(values, hidden_dropout_prob=0.2)))
    with pytest.raises(
        io_utils.UsageError,
        match=r"--output_dir=.* holds a run with a different model config "
        r"\(field: \(in output_dir, requested\) = \{'hidden_dropout_prob': "
        r"\(0.1, 0.2\)\}\); use a new --output_dir",
    ):
        initial_weights.resolve(
            bert_config_file=str(other),
            vocab_file=os.path.join(output_dir, "vocab.txt"),
            output_dir=output_dir,
        )
