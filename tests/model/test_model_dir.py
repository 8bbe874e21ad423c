"""The model directory (bert_tf.model.model_dir): what it holds, what it lacks, writing, restoring, and
directories written before ModelDir existed."""

import dataclasses
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    OLD_CLASSIFIER_SPEC,
    TINY_CONFIG,
    TINY_POSITIONS,
    assert_matches_reference,
    old_model_dir,
    reference_inputs,
    round_trip,
    tiny_config,
    tiny_inputs,
    write_tiny_vocab,
)

from bert_tf.model import model_dir, modeling
from bert_tf.model.model_dir import ModelDir, ModelDirError
from bert_tf.runtime import io_utils
from bert_tf.tasks import models

CLASSIFIER = OLD_CLASSIFIER_SPEC


def randomize(model, seed=0):
    """Weights large enough that the two GELU forms give visibly different outputs (init's are too small)."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        v.assign(rng.normal(0, 0.5, size=v.shape).astype(np.float32))


def rewrite_config(path, **changes):
    """Edits PATH/bert_config.json by hand; a value of None drops the field."""
    path = os.path.join(path, "bert_config.json")
    values = json.load(open(path))
    values.update(changes)
    values = {k: v for k, v in values.items() if v is not None}
    with open(path, "w") as f:
        json.dump(values, f)
    return path


def record_warnings(monkeypatch):
    """The warnings bert_tf.model.model_dir logs from now on, formatted."""
    warnings = []
    monkeypatch.setattr(
        model_dir.logging, "warning", lambda msg, *args: warnings.append(msg % args)
    )
    return warnings


# ----------------------------------------------------------------------------------------------
# Writing and restoring
# ----------------------------------------------------------------------------------------------


def test_round_trip_of_a_pretrained_model_dir(tmp_path):
    model, encoder = modeling.build_pretraining_model(TINY_CONFIG)
    assert not ModelDir(tmp_path / "model").exists()
    # The config, and the encoder's and the heads' outputs, come back the same.
    directory, prefix = round_trip(
        tmp_path / "model", TINY_CONFIG, write_tiny_vocab(tmp_path / "vocab.txt"), encoder, model
    )
    assert sorted(os.listdir(directory.path)) == [
        "bert_config.json",
        "checkpoint",
        "ckpt-1.data-00000-of-00001",
        "ckpt-1.index",
        "vocab.txt",
    ]
    assert directory.exists() and prefix == directory.latest_checkpoint() == directory.check()
    assert directory.checkpoint_objects() - {"save_counter"} == {"encoder", "pretraining_model"}
    assert directory.latest_step() == 0  # no training step in a written (not trained) directory
    assert models.read_task_spec(directory) is None
    assert directory.load_config() == TINY_CONFIG
    # The documented entry point, with a plain path.
    x = tiny_inputs()
    got = model_dir.load_encoder(str(tmp_path / "model"))(x)
    np.testing.assert_array_equal(
        got["sequence_output"].numpy(), encoder(x)["sequence_output"].numpy()
    )


def test_round_trip_of_a_fine_tuned_model_dir(tmp_path):
    model, encoder = models.build_task_model(TINY_CONFIG, CLASSIFIER)
    randomize(model)
    # The config, the spec, and the classifier's and its encoder's outputs come back the same.
    directory, _ = round_trip(
        tmp_path / "finetuned",
        TINY_CONFIG,
        write_tiny_vocab(tmp_path / "vocab.txt"),
        encoder,
        spec=CLASSIFIER,
        model=model,
    )
    assert "task.json" in os.listdir(directory.path)
    assert models.read_task_spec(directory) == CLASSIFIER
    assert directory.checkpoint_objects() - {"save_counter"} == {"encoder", "model"}
    # A task spec and a task model go together.
    with pytest.raises(ValueError, match="both the task spec and the task model"):
        directory.write(TINY_CONFIG, directory.vocab_file, encoder, spec=CLASSIFIER)


def test_a_failed_write_leaves_no_directory_that_loads(tmp_path):
    """The checkpoint is written last: a vocab refused after the config was written leaves no checkpoint."""
    too_big = write_tiny_vocab(tmp_path / "vocab.txt", TINY_CONFIG.vocab_size + 1)
    directory = ModelDir(tmp_path / "model")
    size = TINY_CONFIG.vocab_size
    with pytest.raises(ValueError, match=f"{size + 1} tokens but vocab_size is {size}"):
        directory.write(TINY_CONFIG, too_big, modeling.build_encoder(TINY_CONFIG))
    assert os.listdir(directory.path) == ["bert_config.json"]
    assert not directory.exists()
    with pytest.raises(ModelDirError, match="missing: vocab.txt, checkpoint"):
        directory.check()


def test_training_loop_checkpoint_is_a_model_dir(tmp_path):
    # What run_pretraining writes: encoder, pretraining_model, optimizer and step in one checkpoint.
    model, encoder = modeling.build_pretraining_model(TINY_CONFIG)
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    step = tf.Variable(7, dtype=tf.int64)
    path = tmp_path / "run"
    path.mkdir()
    TINY_CONFIG.to_json_file(str(path / "bert_config.json"))
    write_tiny_vocab(path / "vocab.txt")
    ckpt = tf.train.Checkpoint(
        encoder=encoder, pretraining_model=model, optimizer=optimizer, step=step
    )
    manager = tf.train.CheckpointManager(ckpt, str(path), max_to_keep=2, checkpoint_name="ckpt")
    manager.save(checkpoint_number=7)
    hidden = TINY_CONFIG.hidden_size
    encoder.get_layer("pooled_dense").bias.assign(np.full((hidden,), 0.5, np.float32))
    step.assign(9)
    manager.save(checkpoint_number=9)
    directory = ModelDir(path)
    assert directory.latest_checkpoint().endswith("ckpt-9") and directory.latest_step() == 9
    assert directory.checkpoint_objects() - {"save_counter"} == {
        "encoder",
        "pretraining_model",
        "optimizer",
        "step",
    }
    loaded = directory.load_encoder()
    np.testing.assert_array_equal(
        loaded.get_layer("pooled_dense").bias.numpy(), np.full((hidden,), 0.5)
    )


def test_encoder_only_dir_gives_fresh_heads(tmp_path, monkeypatch):
    warnings = record_warnings(monkeypatch)
    encoder = modeling.build_encoder(TINY_CONFIG)
    directory, _ = round_trip(
        tmp_path / "model", TINY_CONFIG, write_tiny_vocab(tmp_path / "vocab.txt"), encoder
    )
    model, loaded = directory.load_pretraining_model()
    np.testing.assert_array_equal(
        loaded(tiny_inputs())["pooled_output"].numpy(),
        encoder(tiny_inputs())["pooled_output"].numpy(),
    )
    assert model.get_layer("nsp_head").kernel.shape == (TINY_CONFIG.hidden_size, 2)
    assert len(warnings) == 1 and "has no pretraining heads" in warnings[0]


# ----------------------------------------------------------------------------------------------
# Checking completeness
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def complete_dir(tmp_path):
    """A complete pretrained model directory (encoder only)."""
    directory = ModelDir(tmp_path / "model")
    directory.write(
        TINY_CONFIG, write_tiny_vocab(tmp_path / "vocab.txt"), modeling.build_encoder(TINY_CONFIG)
    )
    return directory


@pytest.mark.parametrize(
    "removed,named",
    [
        (["bert_config.json"], "missing: bert_config.json "),
        (["vocab.txt"], "missing: vocab.txt "),
        (["checkpoint"], "missing: checkpoint "),
        (
            ["ckpt-1.index"],
            "missing: the checkpoint named in .*checkpoint \\(ckpt-N.index / ckpt-N.data-\\*\\)",
        ),
        (["ckpt-1.data-00000-of-00001"], "missing: the checkpoint named in"),
        (["vocab.txt", "ckpt-1.index"], "missing: vocab.txt, the checkpoint named in"),
    ],
)
def test_each_missing_file_is_named(complete_dir, removed, named):
    for name in removed:
        os.remove(os.path.join(complete_dir.path, name))
    for load in (
        complete_dir.check,
        complete_dir.load_config,
        complete_dir.load_encoder,
        complete_dir.load_pretraining_model,
    ):
        with pytest.raises(ModelDirError, match=named) as error:
            load()
        assert (
            "(a model directory holds bert_config.json, vocab.txt, checkpoint and ckpt-N.*)"
            in str(error.value)
        )
    assert issubclass(ModelDirError, io_utils.UsageError)  # the CLIs exit 2 on it


def test_an_empty_or_absent_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelDirError, match="missing: bert_config.json, vocab.txt, checkpoint"):
        ModelDir(tmp_path / "empty").load_config()
    for path in (tmp_path / "nowhere", ""):
        assert not ModelDir(path).exists()
        assert ModelDir(path).latest_checkpoint() is None if path == "" else True
        assert ModelDir(path).latest_step() == 0 and models.read_task_spec(ModelDir(path)) is None
        with pytest.raises(ModelDirError, match="does not exist"):
            ModelDir(path).load_encoder()


def test_checkpoint_of_another_size_is_refused(complete_dir):
    path = complete_dir.path
    tiny_config(num_hidden_layers=3).to_json_file(os.path.join(path, "bert_config.json"))
    with pytest.raises(
        ModelDirError,
        match=r"does not fit bert_config.json.*18 weights of encoder are not in it.*(transformer_layer_2|pooled_dense)",
    ):
        complete_dir.load_encoder()
    tiny_config(intermediate_size=12).to_json_file(os.path.join(path, "bert_config.json"))
    hidden, intermediate = TINY_CONFIG.hidden_size, TINY_CONFIG.intermediate_size
    with pytest.raises(
        ModelDirError, match=rf"shape \({hidden}, {intermediate}\).*shape \({hidden}, 12\)"
    ):
        complete_dir.load_encoder()


# ----------------------------------------------------------------------------------------------
# The config: "gelu" before and after config_version 2
# ----------------------------------------------------------------------------------------------


def test_legacy_model_dir_keeps_its_erf_gelu_and_warns_once(tmp_path, monkeypatch):
    warnings = record_warnings(monkeypatch)
    exact = dataclasses.replace(TINY_CONFIG, hidden_act="gelu_exact")
    model, encoder = modeling.build_pretraining_model(exact)
    randomize(model)
    directory = ModelDir(tmp_path / "model")
    directory.write(exact, write_tiny_vocab(tmp_path / "vocab.txt"), encoder, model)
    x = tiny_inputs()
    positions = TINY_POSITIONS
    want = model({**x, "masked_lm_positions": positions})
    # What bert_tf wrote before config_version: "gelu", which then meant erf.
    path = rewrite_config(directory.path, hidden_act="gelu", config_version=None)

    config = directory.load_config()
    assert (config.hidden_act, config.config_version) == ("gelu_exact", 2)
    assert (
        directory.read_config() == config
    )  # read_config is the same reader, without the completeness check
    got_model, got_encoder = directory.load_pretraining_model()
    got = got_model({**x, "masked_lm_positions": positions})
    for name in ("mlm_logits", "nsp_logits"):
        np.testing.assert_array_equal(got[name].numpy(), want[name].numpy())
    np.testing.assert_array_equal(
        directory.load_encoder()(x)["sequence_output"].numpy(),
        encoder(x)["sequence_output"].numpy(),
    )
    # Once for the file, however often it is read; it names the file and the migration.
    assert len(warnings) == 1
    assert path in warnings[0]
    assert '"hidden_act": "gelu_exact"' in warnings[0] and '"config_version": 2' in warnings[0]

    # Migrated by hand as the warning says: the same outputs, no warning.
    migrated, _ = round_trip(
        tmp_path / "migrated", config, write_tiny_vocab(tmp_path / "vocab.txt"), encoder
    )
    assert json.load(open(migrated.config_file))["hidden_act"] == "gelu_exact"
    assert len(warnings) == 1


def test_current_model_dir_gelu_is_the_tanh_form(tmp_path, monkeypatch):
    warnings = record_warnings(monkeypatch)
    encoder = modeling.build_encoder(TINY_CONFIG)
    randomize(encoder)
    directory, _ = round_trip(
        tmp_path / "model", TINY_CONFIG, write_tiny_vocab(tmp_path / "vocab.txt"), encoder
    )
    assert json.load(open(directory.config_file))["hidden_act"] == "gelu"
    x = tiny_inputs()
    got = directory.load_encoder()(x)["sequence_output"].numpy()
    erf_encoder = modeling.build_encoder(dataclasses.replace(TINY_CONFIG, hidden_act="gelu_exact"))
    erf_encoder.set_weights(encoder.get_weights())
    assert np.abs(got - erf_encoder(x)["sequence_output"].numpy()).max() > 1e-4
    # A relu model directory from before config_version reads as it always did, without a warning.
    rewrite_config(directory.path, hidden_act="relu", config_version=None)
    assert directory.load_config() == dataclasses.replace(TINY_CONFIG, hidden_act="relu")
    assert warnings == []


def test_a_left_to_right_model_dir_says_so_and_loads_left_to_right(tmp_path):
    config = dataclasses.replace(TINY_CONFIG, attention_direction=modeling.LEFT_TO_RIGHT)
    encoder = modeling.build_encoder(config)
    randomize(encoder)
    directory, _ = round_trip(
        tmp_path / "model", config, write_tiny_vocab(tmp_path / "vocab.txt"), encoder
    )
    values = json.load(open(directory.config_file))
    assert (values["attention_direction"], values["config_version"]) == ("left_to_right", 3)
    # The encoder it rebuilds is left to right: a later token leaves the first ones alone.
    x = tiny_inputs()
    changed = {name: value.copy() for name, value in x.items()}
    changed["input_word_ids"][:, 4] = np.where(x["input_word_ids"][:, 4] == 6, 7, 6)
    loaded = directory.load_encoder()
    np.testing.assert_allclose(
        loaded(x)["sequence_output"][:, :4], loaded(changed)["sequence_output"][:, :4], atol=1e-6
    )


# ----------------------------------------------------------------------------------------------
# Directories written before ModelDir (tests/fixtures/make_old_model_dirs.py)
# ----------------------------------------------------------------------------------------------


def old_dir(name, tmp_path):
    """A fresh copy of an old model directory (so the legacy warning is seen once per test)."""
    return ModelDir(old_model_dir(name, tmp_path))


@pytest.mark.parametrize("name", ["pretrained", "pretraining_run"])
def test_old_pretraining_model_dirs_load_with_identical_outputs(name, reference, tmp_path):
    directory = old_dir(name, tmp_path)
    x, positions = reference_inputs(reference)
    assert directory.load_config().config_version == modeling.BIDIRECTIONAL_CONFIG_VERSION
    assert directory.latest_step() == (7 if name == "pretraining_run" else 0)
    model, encoder = directory.load_pretraining_model()
    out = model({**x, "masked_lm_positions": positions})
    for output in ("mlm_logits", "nsp_logits"):
        assert_matches_reference(out[output].numpy(), reference[f"{name}/{output}"])
    assert_matches_reference(
        directory.load_encoder()(x)["sequence_output"].numpy(), reference[f"{name}/sequence_output"]
    )
    if name == "pretrained":
        assert_matches_reference(
            encoder(x)["pooled_output"].numpy(), reference["pretrained/pooled_output"]
        )


def test_an_old_fine_tuned_model_dir_loads_with_identical_outputs(reference, tmp_path):
    directory = old_dir("classifier", tmp_path)
    x, _ = reference_inputs(reference)
    model, _, config, spec = models.load_task_model(directory)
    assert spec == CLASSIFIER and config.hidden_size == 8
    assert_matches_reference(model(x)["logits"].numpy(), reference["classifier/logits"])


def test_an_old_legacy_gelu_model_dir_loads_as_erf_with_a_warning(reference, tmp_path, monkeypatch):
    warnings = record_warnings(monkeypatch)
    directory = old_dir("legacy_gelu", tmp_path)
    x, _ = reference_inputs(reference)
    assert directory.load_config().hidden_act == "gelu_exact"
    assert_matches_reference(
        directory.load_encoder()(x)["sequence_output"].numpy(),
        reference["legacy_gelu/sequence_output"],
    )
    assert len(warnings) == 1 and directory.config_file in warnings[0]
    # The tolerance of assert_matches_reference still tells the two GELU forms apart.
    tanh_config = dataclasses.replace(directory.load_config(), hidden_act="gelu")
    tanh_encoder = modeling.build_encoder(tanh_config)
    tanh_encoder.set_weights(directory.load_encoder().get_weights())
    with pytest.raises(AssertionError):
        assert_matches_reference(
            tanh_encoder(x)["sequence_output"].numpy(), reference["legacy_gelu/sequence_output"]
        )
