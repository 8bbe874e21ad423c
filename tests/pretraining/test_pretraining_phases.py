"""run_pretraining's two phases (bert_tf.pretraining.phases) and gradient accumulation, end to end."""

import filecmp
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from helpers import NO_DROPOUT, run_module_cli, tiny_config
from helpers_records import write_real_text_records
from test_run_pretraining import args_for, cli_flags, read_scalars

from bert_tf.model.model_dir import ModelDir
from bert_tf.pretraining import job as pretraining_job
from bert_tf.pretraining import phases
from bert_tf.runtime import io_utils
from bert_tf.training import optimization

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

PHASE1_STEPS, PHASE2_STEPS = 20, 10
TOTAL = PHASE1_STEPS + PHASE2_STEPS
SEQ2, PRED2 = 64, 10


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Phase 1's records (length 32, 5 predictions), phase 2's (64, 10), the vocab and a config."""
    directory = tmp_path_factory.mktemp("phases")
    _, vocab_file = write_real_text_records(str(directory / "len32"), 32, 5, num_files=2)
    _, vocab_2 = write_real_text_records(str(directory / "len64"), SEQ2, PRED2, num_files=2)
    assert filecmp.cmp(vocab_file, vocab_2, shallow=False)  # the same text, the same vocab
    config_file = str(directory / "bert_config.json")
    tiny_config(vocab_file, **NO_DROPOUT).to_json_file(config_file)
    return {
        "input_file": str(directory / "len32" / "records-*.tfrecord"),
        "phase2_input_file": str(directory / "len64" / "records-*.tfrecord"),
        "vocab_file": vocab_file,
        "bert_config_file": config_file,
    }


def two_phase_args(data, output_dir, **overrides):
    """A 20 + 10 step two-phase run, a checkpoint every 5 steps, all of them kept."""
    values = dict(
        phase2_input_file=data["phase2_input_file"],
        phase2_max_seq_length=SEQ2,
        phase2_max_predictions_per_seq=PRED2,
        phase2_train_steps=PHASE2_STEPS,
        num_train_steps=PHASE1_STEPS,
        num_warmup_steps=4,
        steps_per_loop=5,
        save_checkpoints_steps=5,
        keep_checkpoint_max=10,
        train_batch_size=8,
    )
    values.update(overrides)
    return args_for(data, output_dir, **values)


def model_values(prefix):
    """{name: array} of a checkpoint's weights, optimizer slots and step (not the input positions,
    nor the count of saves, which checkpoint numbers make unused)."""
    reader = tf.train.load_checkpoint(prefix)
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if "train_iterator" not in name and not name.startswith(("_CHECKPOINTABLE", "save_counter"))
    }


def learning_rates(output_dir):
    """{step: the learning rate TensorBoard shows after that step's loop}."""
    return dict(read_scalars(os.path.join(output_dir, "train"))["learning_rate"])


@pytest.fixture(scope="module")
def straight(data, tmp_path_factory):
    """A two-phase run under the continue recipe, uninterrupted."""
    output_dir = tmp_path_factory.mktemp("straight")
    result = pretraining_job.run(two_phase_args(data, output_dir))
    return str(output_dir), result


def test_two_phases_run_on_in_one_directory_with_one_schedule(straight):
    output_dir, result = straight
    assert result.step == TOTAL
    assert tf.train.latest_checkpoint(output_dir).endswith(f"ckpt-{TOTAL}")
    # Both phases in one TensorBoard run: a loss every 5 steps, 5..30, the step running on.
    scalars = read_scalars(os.path.join(output_dir, "train"))
    assert sorted(step for step, _ in scalars["loss"]) == list(range(5, TOTAL + 1, 5))
    # The paper's schedule: warm-up over 4 steps, then one linear decay to 0 at step 30.
    rates = learning_rates(output_dir)
    for step in (PHASE1_STEPS, 25):
        assert rates[step] == pytest.approx(2e-3 * (1 - step / TOTAL), rel=1e-5)
    # The optimizer ran on (30 updates); each phase's input position has its own key.
    values = model_values(tf.train.latest_checkpoint(output_dir))
    assert int(values["optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"]) == TOTAL
    for step, iterator in ((PHASE1_STEPS, "train_iterator"), (25, "phase2_train_iterator")):
        names = tf.train.load_checkpoint(f"{output_dir}/ckpt-{step}").get_variable_to_shape_map()
        assert [name.split("/")[0] for name in names if "iterator" in name] == [iterator]
    with open(os.path.join(output_dir, phases.PHASES_FILE)) as f:
        recorded = json.load(f)
    assert recorded["phase2_max_seq_length"] == SEQ2 and recorded["num_train_steps"] == 20


def test_phase_2_reads_its_own_records(data, tmp_path):
    # Phase 2's records with lengths unlike the phase-2 flags: refused before training, naming both.
    with pytest.raises(
        io_utils.UsageError,
        match=r"--phase2_input_file: .*len64/records-\d+.tfrecord: feature 'input_ids' has length "
        r"64 but --phase2_max_seq_length=32",
    ):
        pretraining_job.run(two_phase_args(data, tmp_path / "a", phase2_max_seq_length=32))
    with pytest.raises(io_utils.UsageError, match="but --phase2_max_predictions_per_seq=5"):
        pretraining_job.run(two_phase_args(data, tmp_path / "b", phase2_max_predictions_per_seq=5))
    short = str(tmp_path / "short_config.json")
    tiny_config(data["vocab_file"], max_position_embeddings=48).to_json_file(short)
    with pytest.raises(
        io_utils.UsageError,
        match="--phase2_max_seq_length=64 exceeds the model's max_position_embeddings=48",
    ):
        pretraining_job.run(two_phase_args(data, tmp_path / "c", bert_config_file=short))


@pytest.mark.parametrize("resume_step", [PHASE1_STEPS, 25, 10])
def test_a_run_stopped_in_either_phase_resumes_there_to_the_same_weights(
    data, straight, tmp_path, resume_step
):
    # What a kill leaves: the checkpoints up to `resume_step` (a kill never harms the last one;
    # tests/pretraining/test_run_pretraining.py kills real runs). The rerun must pick the phase and records.
    output_dir, _ = straight
    stopped = str(tmp_path / "stopped")
    shutil.copytree(output_dir, stopped)
    kept = [f"{stopped}/ckpt-{step}" for step in range(5, resume_step + 1, 5)]
    tf.compat.v1.train.update_checkpoint_state(stopped, kept[-1], all_model_checkpoint_paths=kept)
    pretraining_job.run(two_phase_args(data, stopped))
    want = model_values(f"{output_dir}/ckpt-{TOTAL}")
    got = model_values(f"{stopped}/ckpt-{TOTAL}")
    assert got.keys() == want.keys() and len(want) > 60
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_the_restart_recipe_warms_phase_2_up_afresh(data, tmp_path):
    output_dir = str(tmp_path / "restart")
    pretraining_job.run(
        two_phase_args(
            data,
            output_dir,
            phase2_recipe="restart",
            phase2_learning_rate=1e-3,
            phase2_warmup_steps=8,
            optimizer="lamb",
            lr_decay_power=0.5,
            learning_rate=2e-3,
        )
    )
    rates = learning_rates(output_dir)
    # NVIDIA's LAMB recipe: phase 1 decays as the square root to 0 at its end; phase 2 climbs to
    # 1e-3 over 8 steps, then decays the same way to 0 at 30.
    assert rates[15] == pytest.approx(2e-3 * (1 - 15 / PHASE1_STEPS) ** 0.5, rel=1e-5)
    assert rates[PHASE1_STEPS] == 0.0
    assert rates[25] == pytest.approx(1e-3 * 5 / 8, rel=1e-5)
    assert rates[TOTAL] == pytest.approx(0.0, abs=1e-9)
    schedule = optimization.RestartedWarmupLinearDecay(
        2e-3, 4, optimization.ScheduleRestart(20, 1e-3, 10, 8)
    )
    assert float(schedule(15)) == pytest.approx(2e-3 * (1 - 15 / 20))
    assert float(schedule(29)) == pytest.approx(1e-3 * (1 - 9 / 10))
    restored = optimization.RestartedWarmupLinearDecay.from_config(schedule.get_config())
    assert float(restored(23)) == float(schedule(23))


def test_changed_phase_flags_are_refused_unless_overwrite(data, straight, tmp_path):
    output_dir, _ = straight
    resumed = str(tmp_path / "resumed")
    shutil.copytree(output_dir, resumed)
    # --overwrite lets a run go on with changed flags; it removes nothing, a user's file least.
    notes = os.path.join(resumed, "notes.txt")
    with open(notes, "w") as f:
        f.write("mine")
    for overrides, named in (
        (dict(phase2_train_steps=20), r"--phase2_train_steps=20 \(the run has 10\)"),
        (dict(num_train_steps=25), r"--num_train_steps=25 \(the run has 20\)"),
        (dict(phase2_input_file=""), r"--phase2_train_steps=\(none\) \(the run has 10\)"),
    ):
        if not overrides.get("phase2_input_file", True):
            overrides = dict(overrides, phase2_train_steps=0)
        with pytest.raises(io_utils.UsageError, match=f"other phase flags: .*{named}"):
            pretraining_job.run(two_phase_args(data, resumed, **overrides))
    # --overwrite goes on with the new flags: 10 more phase-2 steps.
    result = pretraining_job.run(
        two_phase_args(data, resumed, phase2_train_steps=20, overwrite=True)
    )
    assert result.step == 40
    with open(notes) as f:
        assert f.read() == "mine"


def test_a_phase_1_run_may_gain_a_phase_2(data, tmp_path):
    output_dir = str(tmp_path / "run")
    phase1 = dict(phase2_input_file="", phase2_train_steps=0)  # a plain run
    pretraining_job.run(two_phase_args(data, output_dir, num_train_steps=5, **phase1))
    # ...which may also train longer, as the original's may, before a phase 2 joins it.
    pretraining_job.run(two_phase_args(data, output_dir, num_train_steps=10, **phase1))
    result = pretraining_job.run(two_phase_args(data, output_dir, num_train_steps=10))
    assert result.step == 10 + PHASE2_STEPS
    with pytest.raises(io_utils.UsageError, match=r"--num_train_steps=15 \(the run has 10\)"):
        pretraining_job.run(two_phase_args(data, output_dir, num_train_steps=15))


def test_phase_flag_usage_errors_exit_2_naming_the_flag(data, tmp_path):
    for overrides, message in (
        (dict(phase2_input_file=""), "--phase2_train_steps needs --phase2_input_file"),
        (dict(phase2_train_steps=0), "--phase2_train_steps must be positive"),
        (
            dict(phase2_learning_rate=1e-3),
            "--phase2_learning_rate applies to --phase2_recipe=restart",
        ),
        (dict(phase2_recipe="restart", phase2_warmup_steps=-1), "--phase2_warmup_steps must not"),
        (dict(num_accumulation_steps=3), r"--num_accumulation_steps=3 does not divide the batch"),
        (
            dict(phase2_num_accumulation_steps=16),
            r"--phase2_num_accumulation_steps=16 does not divide the batch per replica, 8",
        ),
    ):
        with pytest.raises(io_utils.UsageError, match=message):
            pretraining_job.run(two_phase_args(data, tmp_path / "out", **overrides))
    cli = run_module_cli(
        "bert_tf.run_pretraining",
        *cli_flags(data, tmp_path / "cli", train_batch_size=12, num_accumulation_steps=5),
    )
    assert cli.returncode == 2, cli.stderr[-2000:]
    assert (
        "--num_accumulation_steps=5 does not divide the batch per replica, 12 "
        "(--train_batch_size=12 over 1 replica)" in cli.stderr
    )


def test_accumulated_pretraining_trains_the_weights_of_one_large_batch(data, tmp_path):
    # Phase 2 in 4 micro-batches of 2: the same run, within float32 summation order.
    whole = pretraining_job.run(two_phase_args(data, tmp_path / "whole", num_train_steps=5))
    split = pretraining_job.run(
        two_phase_args(
            data,
            tmp_path / "split",
            num_train_steps=5,
            num_accumulation_steps=2,
            phase2_num_accumulation_steps=4,
        )
    )
    assert whole.step == split.step == 5 + PHASE2_STEPS
    for got, want in zip(
        split.pretraining_model.trainable_variables, whole.pretraining_model.trainable_variables
    ):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=2e-5, err_msg=got.path)
    assert ModelDir(str(tmp_path / "split")).latest_step() == 15
