"""python -m bert_tf.run_pretraining end to end: learning, resume after SIGKILL, multi-worker, bad input, TPU setup."""

import collections
import dataclasses
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    NO_DROPOUT,
    ROOT,
    child_pythonpath,
    run_module_cli,
    tiny_config,
    tiny_inputs,
    write_tiny_model_dir,
    write_tiny_vocab,
)
from helpers_google import GOOGLE_TINY, random_weights, write_google_dir
from helpers_records import (
    write_numbered_records,
    write_tiny_pretraining_data,
)

from bert_tf import run_classifier
from bert_tf.checkpoints import saves
from bert_tf.model import modeling
from bert_tf.model.model_dir import ModelDir, ModelDirError, describe_heads
from bert_tf.pretraining import input_pipeline, left_to_right_lm
from bert_tf.pretraining import job as pretraining_job
from bert_tf.pretraining_data import job
from bert_tf.runtime import distribution, io_utils
from bert_tf.runtime.local_cluster import free_ports
from bert_tf.saved_model import export
from bert_tf.training import training_loop

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

SEQ, PRED = 32, 5
ENV = dict(
    os.environ,
    PYTHONPATH=child_pythonpath(__file__),
    TF_CPP_MIN_LOG_LEVEL="2",
)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Real-text records, the vocab and the tiny model's bert_config.json (helpers.TINY_CONFIG)."""
    return write_tiny_pretraining_data(tmp_path_factory.mktemp("data"), SEQ, PRED)


def args_for(data, output_dir, **overrides):
    """PretrainingArgs for the tiny model on the real-text records."""
    values = dict(
        input_file=data["input_file"],
        output_dir=str(output_dir),
        vocab_file=data["vocab_file"],
        bert_config_file=data["bert_config_file"],
        train_batch_size=16,
        eval_batch_size=16,
        max_seq_length=SEQ,
        max_predictions_per_seq=PRED,
        num_train_steps=200,
        num_warmup_steps=20,
        steps_per_loop=50,
        save_checkpoints_steps=100,
        learning_rate=2e-3,
        max_eval_steps=20,
    )
    values.update(overrides)
    return pretraining_job.PretrainingArgs(**values)


def cli_flags(data, output_dir, **overrides):
    """The same settings as command-line flags."""
    args = args_for(data, output_dir, **overrides)
    flags = []
    for name, value in vars(args).items():
        if isinstance(value, bool):
            flags.append(f"--{name}" if value else f"--no{name}")
        elif value is not None and value != "":
            flags.append(f"--{name}={value}")
    return flags


def read_scalars(log_dir):
    """{tag: [(step, value)]} from the TensorBoard event files in log_dir."""
    scalars = {}
    for path in glob.glob(os.path.join(log_dir, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append(
                    (event.step, float(tf.make_ndarray(value.tensor)))
                )
    return scalars


def test_loss_decreases_on_real_text_and_the_output_is_a_model_dir(data, tmp_path):
    output_dir = tmp_path / "run"
    before = pretraining_job.run(
        args_for(data, output_dir, do_train=False, do_eval=True)
    ).eval_results
    result = pretraining_job.run(args_for(data, output_dir, do_train=True, do_eval=True))
    after = result.eval_results
    assert result.step == 200 and after["global_step"] == 200
    # ln(1622) = 7.4 at the start; the tiny model learns frequent tokens and the [CLS] NSP signal.
    assert before["masked_lm_loss"] > 7.0
    assert after["masked_lm_loss"] < before["masked_lm_loss"] - 1.0
    assert after["masked_lm_accuracy"] > before["masked_lm_accuracy"] + 0.05
    lines = (output_dir / "eval_results.txt").read_text().splitlines()
    assert [line.split(" = ")[0] for line in lines] == [
        "global_step",
        "loss",
        "masked_lm_accuracy",
        "masked_lm_loss",
        "next_sentence_accuracy",
        "next_sentence_loss",
    ]
    train_scalars = read_scalars(str(output_dir / "train"))
    for tag in (
        "loss",
        "masked_lm_loss",
        "masked_lm_accuracy",
        "next_sentence_loss",
        "next_sentence_accuracy",
        "learning_rate",
        "steps_per_second",
        "examples_per_second",
    ):
        assert [step for step, _ in train_scalars[tag]] == [50, 100, 150, 200], tag
    assert train_scalars["learning_rate"][-1][1] == 0.0  # Linear decay ends at 0.
    assert "masked_lm_accuracy" in read_scalars(str(output_dir / "eval"))
    # The output directory is a model directory: it loads with the weights training left.
    encoder = ModelDir(str(output_dir)).load_encoder()
    for got, want in zip(encoder.weights, result.encoder.weights):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert ModelDir(str(output_dir)).checkpoint_objects() >= {
        "encoder",
        "pretraining_model",
        "optimizer",
        "step",
    }
    # ...and its pretraining heads load too (their variables are stored under optimizer/ paths).
    pretraining_model, _ = ModelDir(str(output_dir)).load_pretraining_model()
    for got, want in zip(pretraining_model.weights, result.pretraining_model.weights):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    # --init_checkpoint takes the weights (not the step) from a model directory.
    initialized = pretraining_job.run(
        args_for(
            data, tmp_path / "init", do_train=False, do_eval=True, init_checkpoint=str(output_dir)
        )
    )
    assert initialized.step == 0
    assert initialized.eval_results["masked_lm_loss"] == pytest.approx(
        after["masked_lm_loss"], rel=1e-5
    )


def checkpoint_values(prefix):
    """{name: array} of a checkpoint's model and optimizer variables."""
    reader = tf.train.load_checkpoint(prefix)
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if not name.startswith("train_iterator") and not name.startswith("_CHECKPOINTABLE")
    }


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_run_stopped_after_a_checkpoint_resumes_to_the_same_weights(data, tmp_path, signum):
    """SIGKILL loses the steps since the last save; SIGTERM (a preemption's notice) saves the step
    the loop in progress ends at and exits 0. Either way the rerun ends with the straight run's
    weights: the default strategy's input iterator is checkpointed too."""
    flags = dict(num_train_steps=80, steps_per_loop=10, save_checkpoints_steps=20, do_train=True)
    command = [sys.executable, "-m", "bert_tf.run_pretraining"]
    straight = subprocess.Popen(
        command + cli_flags(data, tmp_path / "straight", **flags),
        env=ENV,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    killed_dir = tmp_path / "killed"
    with open(tmp_path / "stopped.log", "w") as log:
        process = subprocess.Popen(
            command + cli_flags(data, killed_dir, **flags),
            env=ENV,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 240
        while time.time() < deadline and process.poll() is None:
            if ModelDir(str(killed_dir)).latest_step() >= 20:
                process.send_signal(signum)
                break
            time.sleep(0.01)
        process.wait(timeout=120)
    assert straight.wait(timeout=300) == 0
    output = (tmp_path / "stopped.log").read_text()
    killed_at = ModelDir(str(killed_dir)).latest_step()
    if signum == signal.SIGKILL:
        assert process.returncode == -signal.SIGKILL, "the run finished before it could be killed"
        assert 20 <= killed_at < 80
    else:
        assert process.returncode == 0, output[-3000:]
        # Saved where the loop in progress ended (a save of its own unless that is a periodic one;
        # a signal just after ckpt-20's save stops there).
        assert killed_at % 10 == 0 and 20 <= killed_at < 80, killed_at
        assert (
            f"preempted: SIGTERM: saved {killed_dir}/ckpt-{killed_at} and stopped at step "
            f"{killed_at}/80" in output
        )

    resumed = subprocess.run(
        command + cli_flags(data, killed_dir, **flags),
        env=ENV,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {killed_dir}/ckpt-{killed_at}" in resumed.stderr
    straight = checkpoint_values(tf.train.latest_checkpoint(str(tmp_path / "straight")))
    again = checkpoint_values(tf.train.latest_checkpoint(str(killed_dir)))
    assert tf.train.latest_checkpoint(str(killed_dir)).endswith("ckpt-80")
    assert straight.keys() == again.keys() and len(straight) > 60
    for name in straight:
        if not name.startswith("save_counter"):  # a preempted run saves once more
            np.testing.assert_array_equal(again[name], straight[name], err_msg=name)


def test_a_rerun_removes_the_temp_dir_of_a_save_killed_midway_and_resumes(data, tmp_path, caplog):
    output_dir = tmp_path / "out"
    loop = dict(steps_per_loop=1, save_checkpoints_steps=2)
    pretraining_job.run(args_for(data, output_dir, num_train_steps=2, **loop))
    # What kill -9 inside the save of step 3 leaves: TF writes into <prefix>_temp/ and merges at the end.
    leftover = output_dir / "ckpt-3_temp"
    leftover.mkdir()
    (leftover / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"\0" * 64)
    # Look-alikes are not ours to remove.
    (output_dir / "notes_temp").mkdir()
    (output_dir / "ckpt-3_temp.txt").write_text("mine\n")
    with caplog.at_level("INFO", logger="absl"):  # another test may have left absl at WARNING
        result = pretraining_job.run(args_for(data, output_dir, num_train_steps=4, **loop))
    assert result.step == 4
    assert f"resumed from {output_dir}/ckpt-2 at step 2" in caplog.text
    assert not leftover.exists()
    assert f"removed {leftover}" in caplog.text
    assert (output_dir / "notes_temp").is_dir() and (output_dir / "ckpt-3_temp.txt").exists()


def test_a_diverging_resume_saves_nothing_after_the_explosion_and_names_the_healthy_checkpoint(
    data, tmp_path
):
    # Resumed with a learning rate of 1e6 and saving every step, the run kept ckpt-4, saved after a
    # loss of 1e14, and called it "the last good checkpoint".
    output_dir = tmp_path / "out"
    loop = dict(steps_per_loop=1, save_checkpoints_steps=1)
    pretraining_job.run(args_for(data, output_dir, num_train_steps=2, **loop))
    diverging = args_for(
        data, output_dir, num_train_steps=10, learning_rate=1e6, num_warmup_steps=0, **loop
    )
    # A rerun skips ckpt-3, marked suspect, resumes from ckpt-2 and diverges again at step 4.
    for _ in range(2):
        with pytest.raises(
            training_loop.NonFiniteLossError, match=r"at step 4 is over 100 times the mean loss"
        ) as failure:
            pretraining_job.run(diverging)
        assert (
            f"the last checkpoint saved with a finite, non-exploding loss is {output_dir}/ckpt-2 (step 2)"
            in str(failure.value)
        )
        assert tf.train.latest_checkpoint(str(output_dir)).endswith("ckpt-3")

    def largest_value(prefix):
        return max(
            float(np.abs(v).max())
            for v in checkpoint_values(prefix).values()
            if v.dtype.kind == "f"
        )

    # ckpt-3 was saved after the loss of step 3 (fine), but its weights are what step 3's update made of them.
    assert (
        largest_value(str(output_dir / "ckpt-2"))
        < 100
        < 1e4
        < largest_value(str(output_dir / "ckpt-3"))
    )


def test_a_rerun_after_divergence_resumes_from_the_last_healthy_checkpoint(data, tmp_path, caplog):
    output_dir = tmp_path / "out"
    loop = dict(steps_per_loop=1, save_checkpoints_steps=1)
    pretraining_job.run(args_for(data, output_dir, num_train_steps=2, **loop))
    with pytest.raises(training_loop.NonFiniteLossError) as failure:
        pretraining_job.run(
            args_for(
                data, output_dir, num_train_steps=10, learning_rate=1e6, num_warmup_steps=0, **loop
            )
        )
    assert "marked suspect in suspect_checkpoints.json" in str(failure.value)
    assert saves.suspect_checkpoints(str(output_dir)) == ["ckpt-3"]
    # --resume_from picks a checkpoint, suspect or not; a missing one is refused naming what exists.
    with pytest.raises(
        io_utils.UsageError, match=r"--resume_from=ckpt-9: no such checkpoint .*ckpt-3"
    ):
        pretraining_job.run(
            args_for(data, output_dir, num_train_steps=3, resume_from="ckpt-9", **loop)
        )
    # At a sane learning rate the plain rerun resumes from ckpt-2 by itself and finishes.
    with caplog.at_level("INFO", logger="absl"):  # another test may have left absl at WARNING
        result = pretraining_job.run(args_for(data, output_dir, num_train_steps=4, **loop))
    assert result.step == 4
    assert f"resuming from {output_dir}/ckpt-2, the last healthy checkpoint" in caplog.text
    assert f"resumed from {output_dir}/ckpt-2 at step 2" in caplog.text
    assert saves.suspect_checkpoints(str(output_dir)) == []  # ckpt-3 was saved anew
    assert not (output_dir / saves.SUSPECT_FILE).exists()


def test_checkpoints_without_their_index_are_never_a_fresh_start(data, tmp_path):
    output_dir = tmp_path / "out"
    loop = dict(steps_per_loop=1, save_checkpoints_steps=1)
    pretraining_job.run(args_for(data, output_dir, num_train_steps=2, **loop))
    (output_dir / "checkpoint").unlink()
    with pytest.raises(
        io_utils.UsageError, match=r"holds checkpoints \(ckpt-1, ckpt-2\) but no valid"
    ):
        pretraining_job.run(args_for(data, output_dir, num_train_steps=3, **loop))
    result = pretraining_job.run(
        args_for(data, output_dir, num_train_steps=3, resume_from="ckpt-2", **loop)
    )
    assert result.step == 3


WORKER_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from bert_tf.pretraining import job as pretraining_job
    args = pretraining_job.PretrainingArgs(**json.loads(sys.argv[1]))
    result = pretraining_job.run(args)
    np.savez(sys.argv[2], *[w.numpy() for w in result.pretraining_model.weights], step=result.step,
             loss=result.train_metrics["loss"])
""")


@pytest.mark.slow
def test_two_workers_on_localhost_end_with_identical_weights(data, tmp_path):
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(2)]}
    args = vars(
        args_for(
            data,
            tmp_path / "out",
            strategy="multi_worker_mirrored",
            num_train_steps=5,
            steps_per_loop=5,
            save_checkpoints_steps=5,
            # Accumulation and a phase switch under the cluster too (phase 2 reads the same files).
            num_accumulation_steps=2,
            phase2_input_file=data["input_file"],
            phase2_max_seq_length=SEQ,
            phase2_max_predictions_per_seq=PRED,
            phase2_train_steps=5,
        )
    )
    processes = []
    for index in range(2):
        env = dict(
            ENV,
            TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
        )
        processes.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    WORKER_SCRIPT,
                    json.dumps(args),
                    str(tmp_path / f"worker{index}.npz"),
                ],
                env=env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=300)[0] for p in processes]
    for p, output in zip(processes, outputs):
        assert p.returncode == 0, output[-3000:]
    weights = [np.load(tmp_path / f"worker{i}.npz") for i in range(2)]
    assert int(weights[0]["step"]) == int(weights[1]["step"]) == 10
    names = [k for k in weights[0].files if k.startswith("arr_")]
    assert len(names) > 30
    for name in names:
        np.testing.assert_array_equal(weights[0][name], weights[1][name])
    # Only the chief (worker 0) wrote the model directory; its checkpoint holds those weights.
    assert tf.train.latest_checkpoint(str(tmp_path / "out")).endswith("ckpt-10")
    assert "step 10/10" in outputs[0] and "step 10/10" not in outputs[1]
    assert "pretraining phase 2 (to step 10" in outputs[0]


def test_mismatched_lengths_are_a_usage_error_naming_both_values(data, tmp_path):
    with pytest.raises(
        io_utils.UsageError, match=r"'input_ids' has length 32 but --max_seq_length=128"
    ):
        pretraining_job.run(args_for(data, tmp_path, max_seq_length=128))
    with pytest.raises(io_utils.UsageError, match=r"has length 5 but --max_predictions_per_seq=20"):
        pretraining_job.run(args_for(data, tmp_path, max_predictions_per_seq=20))


def test_every_input_files_lengths_are_checked_and_empty_files_skipped(data, tmp_path):
    # A seq-16 file after the seq-32 ones used to pass the check (first file only) and die in the first loop.
    other = write_numbered_records(
        str(tmp_path / "z-seq16.tfrecord"), 0, 4, max_seq_length=16, max_predictions_per_seq=PRED
    )
    mixed = dict(input_file=f"{data['input_file']},{other}")
    with pytest.raises(
        io_utils.UsageError,
        match=r"z-seq16.tfrecord: feature 'input_ids' has length 16 but --max_seq_length=32",
    ):
        pretraining_job.run(args_for(data, tmp_path / "mixed", **mixed))
    cli = run_module_cli("bert_tf.run_pretraining", *cli_flags(data, tmp_path / "cli", **mixed))
    assert (
        cli.returncode == 2 and "z-seq16.tfrecord: feature 'input_ids' has length 16" in cli.stderr
    )
    # An empty first file used to be refused ("contains no records"); it is skipped with a warning.
    empty = str(tmp_path / "a-empty.tfrecord")
    with tf.io.TFRecordWriter(empty):
        pass
    result = pretraining_job.run(
        args_for(
            data,
            tmp_path / "out",
            input_file=f"{empty},{data['input_file']}",
            num_train_steps=2,
            steps_per_loop=1,
            save_checkpoints_steps=2,
        )
    )
    assert result.step == 2
    with pytest.raises(io_utils.UsageError, match="--input_file: all 1 files contain no records"):
        pretraining_job.run(args_for(data, tmp_path / "none", input_file=empty))


def test_records_in_the_original_schema_written_here_train(tmp_path):
    files = [
        write_numbered_records(
            str(tmp_path / f"r{i}.tfrecord"),
            10 * i,
            10,
            max_seq_length=16,
            max_predictions_per_seq=3,
        )
        for i in range(2)
    ]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(40)])
        + "\n"
    )
    result = pretraining_job.run(
        pretraining_job.PretrainingArgs(
            input_file=",".join(files),
            output_dir=str(tmp_path / "out"),
            vocab_file=str(vocab),
            model_size="tiny",
            train_batch_size=4,
            max_seq_length=16,
            max_predictions_per_seq=3,
            num_train_steps=4,
            num_warmup_steps=1,
            steps_per_loop=2,
            save_checkpoints_steps=2,
        )
    )
    assert result.step == 4 and np.isfinite(result.train_metrics["loss"])
    assert ModelDir(str(tmp_path / "out")).load_config().hidden_size == 128


def test_an_original_init_checkpoint_must_match_the_casing_its_name_says(tmp_path):
    """cased_L-12_H-768_A-12 with --do_lower_case=true (given, or the default) is refused; false trains."""
    prefix = write_google_dir(str(tmp_path / "cased_L-12_H-768_A-12"), random_weights(GOOGLE_TINY))
    records = write_numbered_records(str(tmp_path / "r.tfrecord"), 10, 8)
    values = dict(
        input_file=records,
        output_dir=str(tmp_path / "out"),
        init_checkpoint=prefix,
        bert_config_file=os.path.join(os.path.dirname(prefix), "bert_config.json"),
        vocab_file=os.path.join(os.path.dirname(prefix), "vocab.txt"),
        train_batch_size=4,
        max_seq_length=8,
        max_predictions_per_seq=3,
        num_train_steps=1,
        num_warmup_steps=0,
    )
    refused = run_module_cli(
        "bert_tf.run_pretraining", "--do_train", *(f"--{k}={v}" for k, v in values.items())
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert (
        f"--do_lower_case=true contradicts --init_checkpoint={prefix}: cased_L-12_H-768_A-12 is Google's "
        "cased model" in refused.stderr
    )
    with pytest.raises(io_utils.UsageError, match="--do_lower_case=true contradicts"):
        pretraining_job.run(pretraining_job.PretrainingArgs(**values, do_lower_case=True))
    assert not ModelDir(values["output_dir"]).exists()
    # The flag now reaches the config of an original checkpoint (it used to be for --model_size only).
    result = pretraining_job.run(pretraining_job.PretrainingArgs(**values, do_lower_case=False))
    assert result.step == 1
    assert ModelDir(values["output_dir"]).load_config().do_lower_case is False


def test_cli_usage_errors_exit_2_naming_the_problem(data, tmp_path):
    missing = run_module_cli(
        "bert_tf.run_pretraining",
        *cli_flags(data, tmp_path, input_file=str(tmp_path / "nothing-*.tfrecord")),
    )
    assert missing.returncode == 2
    assert "nothing-*.tfrecord" in missing.stderr
    for overrides, message in [
        (dict(do_train=False), "--do_train and --do_eval"),
        (dict(model_size="base"), "--bert_config_file or --model_size, not both"),
        (
            dict(bert_config_file=str(tmp_path / "no_config.json")),
            "--bert_config_file: config file .*no_config.json does not exist",
        ),
        (dict(strategy="tpu", tpu="my-tpu"), "gs://"),
    ]:
        with pytest.raises(io_utils.UsageError, match=message):
            pretraining_job.run(args_for(data, tmp_path, **overrides))


def test_step_counts_are_checked_naming_their_flag(data, tmp_path):
    # --max_eval_steps=0 used to run and then blame --eval_batch_size ("no full batch").
    for overrides, message in [
        (dict(do_train=False, do_eval=True, max_eval_steps=0), "--max_eval_steps must be positive"),
        (dict(num_train_steps=0), "--num_train_steps must be positive"),
        (dict(num_warmup_steps=-1), "--num_warmup_steps must not be negative"),
    ]:
        with pytest.raises(io_utils.UsageError, match=message):
            pretraining_job.run(args_for(data, tmp_path / "out", **overrides))


def test_remote_tpu_needs_gcs_paths_and_local_tpu_does_not():
    with pytest.raises(
        io_utils.UsageError,
        match=r"--output_dir=/tmp/out is a local path.*--tpu=grpc://10.0.0.2:8470",
    ):
        distribution.check_tpu_paths(
            "grpc://10.0.0.2:8470", input_file="gs://b/x-*", output_dir="/tmp/out"
        )
    distribution.check_tpu_paths(
        "my-tpu", input_file="gs://b/a,gs://b/c", output_dir="gs://b/out", init_checkpoint=""
    )
    distribution.check_tpu_paths(
        "", input_file="/data/x", output_dir="/tmp/out"
    )  # The TPU VM's own disk.


def test_tpu_strategy_is_built_from_the_resolver_in_order():
    # No TPU exists here: the resolver and the TPU runtime calls are the one thing mocked.
    calls = []
    resolver = mock.Mock(name="resolver")
    with (
        mock.patch.object(
            tf.distribute.cluster_resolver,
            "TPUClusterResolver",
            side_effect=lambda tpu: calls.append(("resolve", tpu)) or resolver,
        ),
        mock.patch.object(
            tf.config,
            "experimental_connect_to_cluster",
            side_effect=lambda r: calls.append(("connect", r)),
        ),
        mock.patch.object(
            tf.tpu.experimental,
            "initialize_tpu_system",
            side_effect=lambda r: calls.append(("initialize", r)),
        ),
        mock.patch.object(
            tf.distribute,
            "TPUStrategy",
            side_effect=lambda r: calls.append(("strategy", r)) or "tpu-strategy",
        ),
    ):
        assert distribution.get_strategy("tpu", tpu="my-tpu") == "tpu-strategy"
        assert distribution.get_strategy("tpu", tpu="") == "tpu-strategy"
    steps = [("connect", resolver), ("initialize", resolver), ("strategy", resolver)]
    # An empty --tpu is the TPU attached to this VM, which the resolver names "local".
    assert calls == [("resolve", "my-tpu")] + steps + [("resolve", "local")] + steps
    with pytest.raises(io_utils.UsageError, match="--strategy=gpu is not one of"):
        distribution.get_strategy("gpu")


# ----------------------------------------------------------------------------------------------
# The paper's pretraining ablations (Table 5): No NSP, and LTR & No NSP
# ----------------------------------------------------------------------------------------------


def variable_shapes(prefix):
    """collections.Counter of the shapes of a checkpoint's variables. The input iterator's saved
    state is left out: its size is what the prefetch buffers held at the save, which timing sets
    (two runs of the same steps differed under load)."""
    return collections.Counter(
        tuple(shape)
        for name, shape in tf.train.list_variables(prefix)
        if not name.endswith("ITERATOR_STATE")
    )


@pytest.fixture(scope="module")
def no_nsp_run(data, tmp_path_factory):
    """A --nsp=false run (trained, evaluated) and a --nsp=true one of the same steps: their dirs."""
    root = tmp_path_factory.mktemp("no_nsp")
    runs = {}
    for name, nsp in (("no_nsp", False), ("nsp", True)):
        args = args_for(data, root / name, nsp=nsp, num_train_steps=40, steps_per_loop=20)
        result = pretraining_job.run(dataclasses.replace(args, do_eval=True))
        runs[name] = (str(root / name), result)
    return runs


def test_without_nsp_no_nsp_head_is_built_saved_or_reported(no_nsp_run):
    output_dir, result = no_nsp_run["no_nsp"]
    nsp_dir, _ = no_nsp_run["nsp"]
    assert "nsp_logits" not in result.pretraining_model.output
    assert "nsp_head" not in {layer.name for layer in result.pretraining_model.layers}
    metrics = ["global_step", "loss", "masked_lm_accuracy", "masked_lm_loss"]
    assert sorted(result.eval_results) == metrics and sorted(result.train_metrics) == metrics[1:]
    lines = open(os.path.join(output_dir, "eval_results.txt")).read().splitlines()
    assert [line.split(" = ")[0] for line in lines] == metrics
    train_tags = read_scalars(os.path.join(output_dir, "train"))
    assert "masked_lm_loss" in train_tags and not any("next_sentence" in t for t in train_tags)
    # The checkpoint's variables are those of the NSP run less the NSP head's kernel [H, 2] and
    # bias [2] (and their optimizer slots): the only [H, 2] variables, and [2] beside the RNG states.
    hidden = result.encoder.get_layer("pooled_dense").units
    without, with_nsp = ModelDir(output_dir), ModelDir(nsp_dir)
    shapes = variable_shapes(without.latest_checkpoint())
    nsp_only = variable_shapes(with_nsp.latest_checkpoint()) - shapes
    assert set(nsp_only) == {(hidden, 2), (2,)} and (hidden, 2) not in shapes
    assert not shapes - variable_shapes(with_nsp.latest_checkpoint())
    # Head discovery names the MLM head only; a caller that needs the NSP head is refused.
    assert without.pretraining_heads() == {"mlm"} and with_nsp.pretraining_heads() == {"mlm", "nsp"}
    assert describe_heads(without.pretraining_heads()) == "the MLM (masked-LM) head only"
    with pytest.raises(ModelDirError, match=r"MLM \(masked-LM\) head only.*no NSP"):
        without.load_pretraining_model(require={"nsp"})
    model, _ = without.load_pretraining_model(require={"mlm"})
    for got, want in zip(
        model.get_layer("mlm_head").weights, result.pretraining_model.get_layer("mlm_head").weights
    ):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_a_no_nsp_run_starts_from_a_model_with_both_heads_and_resumes_itself(data, no_nsp_run):
    nsp_dir, nsp_result = no_nsp_run["nsp"]
    output_dir = os.path.join(os.path.dirname(nsp_dir), "from_nsp")
    args = args_for(data, output_dir, nsp=False, init_checkpoint=nsp_dir, do_eval=True)
    initialized = pretraining_job.run(dataclasses.replace(args, do_train=False))
    # The encoder and the MLM head came from the NSP run: the same masked-LM loss.
    assert initialized.eval_results["masked_lm_loss"] == pytest.approx(
        nsp_result.eval_results["masked_lm_loss"], rel=1e-5
    )
    resumed_dir = os.path.join(os.path.dirname(nsp_dir), "resumed")
    shutil.copytree(no_nsp_run["no_nsp"][0], resumed_dir)
    resumed = pretraining_job.run(
        args_for(data, resumed_dir, nsp=False, num_train_steps=50, steps_per_loop=10)
    )
    assert no_nsp_run["no_nsp"][1].step == 40 and resumed.step == 50
    # Resuming with the other --nsp would drop the NSP head or train a fresh one from mid-run.
    for nsp, directory in ((True, resumed_dir), (False, nsp_dir)):
        with pytest.raises(io_utils.UsageError, match=f"--nsp={str(nsp).lower()} would train"):
            pretraining_job.run(args_for(data, directory, nsp=nsp, num_train_steps=60))


def test_a_no_nsp_model_fine_tunes_exports_and_refuses_next_sentence(data, no_nsp_run, tmp_path):
    model_dir, result = no_nsp_run["no_nsp"]
    # run_classifier takes its encoder from the directory.
    glue = tmp_path / "sst2"
    glue.mkdir()
    words = [w for w in open(data["vocab_file"]).read().split() if w.isalpha()][:40]
    rows = [f"{' '.join(words[i : i + 5])}\t{i % 2}" for i in range(8)]
    (glue / "dev.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    classifier = run_classifier.run(
        run_classifier.ClassifierArgs(
            task_name="sst2",
            data_dir=str(glue),
            init_checkpoint=model_dir,
            output_dir=str(tmp_path / "classifier"),
            do_eval=True,
            max_seq_length=16,
            eval_batch_size=4,
        )
    )
    assert classifier.eval_results["eval_examples"] == 8
    for got, want in zip(classifier.finetuner.encoder.weights, result.encoder.weights):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    # The export has the encoder and fill_mask, and no next_sentence signature.
    path, kind = export.export(model_dir, str(tmp_path / "export"), max_seq_length=SEQ)
    assert kind == "encoder"
    assert set(tf.saved_model.load(path).signatures) == {"serving_default", "fill_mask"}
    refused = run_module_cli(
        "bert_tf.fill_mask", f"--model_dir={model_dir}", "--next_sentence", "a b", "c d"
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "has the MLM (masked-LM) head only; next-sentence needs its NSP head" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_next_token_targets_are_the_following_tokens_where_they_are_real():
    ids = tf.constant([[2, 11, 12, 13, 3], [2, 21, 3, 0, 0]])
    mask = tf.constant([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    targets, weights = left_to_right_lm.next_token_targets(ids, mask)
    np.testing.assert_array_equal(targets, [[11, 12, 13, 3], [21, 3, 0, 0]])
    np.testing.assert_array_equal(weights, [[1, 1, 1, 1], [1, 1, 0, 0]])
    np.testing.assert_array_equal(
        left_to_right_lm.predicting_positions(ids), [[0, 1, 2, 3], [0, 1, 2, 3]]
    )


def test_the_ltr_loss_is_next_token_cross_entropy_over_real_next_tokens():
    config = tiny_config(attention_direction="left_to_right", **NO_DROPOUT)
    model, _ = modeling.build_pretraining_model(config, with_nsp_head=False)
    batch = tiny_inputs(seq=9, seed=4)
    objective = left_to_right_lm.LeftToRightObjective(model)
    tensors = {name: tf.constant(value) for name, value in batch.items()}
    denominators = objective.denominators(tensors)
    loss, stats = objective.loss_and_stats(tensors, denominators, training=False)
    # By hand: the head at every position, position i scored on the token at i + 1 where it is real.
    ids, mask = batch["input_word_ids"], batch["input_mask"]
    positions = np.tile(np.arange(ids.shape[1]), (ids.shape[0], 1)).astype(np.int32)
    logits = model(dict(batch, masked_lm_positions=positions))["mlm_logits"].numpy()
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    scored = [
        -log_p[row, i, ids[row, i + 1]]
        for row in range(ids.shape[0])
        for i in range(ids.shape[1] - 1)
        if mask[row, i + 1]
    ]
    assert float(denominators["ltr_weight"]) == len(scored) == mask[:, 1:].sum()
    np.testing.assert_allclose(float(loss), np.mean(scored), rtol=1e-4)
    np.testing.assert_allclose(float(stats["ltr_loss_sum"]), np.sum(scored), rtol=1e-4)
    # A token's prediction never sees the token it predicts, nor any later one.
    changed = dict(batch, input_word_ids=ids.copy())
    changed["input_word_ids"][:, 5] = (ids[:, 5] + 1) % config.vocab_size
    changed_logits = model(dict(changed, masked_lm_positions=positions))["mlm_logits"].numpy()
    np.testing.assert_allclose(changed_logits[:, :5], logits[:, :5], atol=1e-5)
    assert not np.allclose(changed_logits[0, 5:], logits[0, 5:], atol=1e-5)


def test_ltr_input_is_the_text_s_own_tokens_put_back_from_the_masks(tmp_path):
    # A text in which every token's id is one more than the one before it: once the masked tokens
    # are back, each segment of every record is a run of consecutive ids, as in the text.
    words = [f"w{i}" for i in range(300)]
    vocab_file = write_tiny_vocab(tmp_path / "vocab.txt", size=len(words) + 5)
    documents = [words[d * 100 : (d + 1) * 100] for d in range(3)]
    text = "\n\n".join(
        "\n".join(" ".join(doc[i : i + 5]) for i in range(0, 100, 5)) for doc in documents
    )
    (tmp_path / "text.txt").write_text(text + "\n")
    records = str(tmp_path / "records")
    job.run(
        job.PretrainingDataArgs(
            input_file=str(tmp_path / "text.txt"),
            vocab_file=vocab_file,
            output_dir=records,
            max_seq_length=24,
            max_predictions_per_seq=4,
            dupe_factor=10,
            num_workers=1,
        )
    )
    files = glob.glob(os.path.join(records, "*.tfrecord"))
    count = sum(1 for _ in tf.data.TFRecordDataset(files))
    assert count > 100

    def all_records(**options):
        dataset = input_pipeline.pretraining_dataset(files, count, 24, 4, False, **options)
        return {name: value.numpy() for name, value in next(iter(dataset)).items()}

    stored, restored = all_records(), all_records(restore_masked_tokens=True)
    masked = 0
    for row in range(count):
        ids, before = restored["input_word_ids"][row].tolist(), stored["input_word_ids"][row]
        length, b_start = stored["input_mask"][row].sum(), np.argmax(stored["input_type_ids"][row])
        for segment in (ids[1 : b_start - 1], ids[b_start : length - 1]):
            assert segment == list(range(segment[0], segment[0] + len(segment))), (row, ids)
        assert ids[0] == 2 and ids[b_start - 1] == ids[length - 1] == 3  # [CLS], [SEP]
        assert not any(ids[length:])
        # Only the masked positions changed.
        positions = stored["masked_lm_positions"][row][stored["masked_lm_weights"][row] > 0]
        assert set(np.flatnonzero(ids != before).tolist()) <= set(positions.tolist())
        masked += int((before[positions] == 4).sum())  # [MASK] is id 4
    assert masked > 100


def test_ltr_pretraining_loss_falls_and_writes_a_left_to_right_model_dir(data, tmp_path):
    config_file = str(tmp_path / "ltr_config.json")
    tiny_config(data["vocab_file"], attention_direction="left_to_right").to_json_file(config_file)
    output_dir = tmp_path / "ltr"
    values = dict(objective="ltr", nsp=False, bert_config_file=config_file, do_eval=True)
    before = pretraining_job.run(args_for(data, output_dir, do_train=False, **values))
    result = pretraining_job.run(
        args_for(data, output_dir, num_train_steps=40, steps_per_loop=20, **values)
    )
    metrics = ["global_step", "loss", "ltr_accuracy", "ltr_loss", "ltr_perplexity"]
    assert sorted(result.eval_results) == metrics
    after = result.eval_results
    assert before.eval_results["ltr_loss"] > 7.0  # ln(1622) = 7.4
    assert after["ltr_loss"] < before.eval_results["ltr_loss"] - 1.0
    assert after["ltr_perplexity"] == pytest.approx(np.exp(after["ltr_loss"]))
    lines = (output_dir / "eval_results.txt").read_text().splitlines()
    assert [line.split(" = ")[0] for line in lines] == metrics
    directory = ModelDir(str(output_dir))
    saved = json.loads((output_dir / "bert_config.json").read_text())
    assert saved["attention_direction"] == "left_to_right"
    assert directory.load_config().left_to_right and directory.pretraining_heads() == {"mlm"}


def test_ltr_with_a_model_size_writes_a_left_to_right_config(tmp_path):
    records = write_numbered_records(str(tmp_path / "r.tfrecord"), 10, 8, max_seq_length=16)
    vocab = write_tiny_vocab(tmp_path / "vocab.txt", size=40)
    values = dict(
        input_file=records,
        vocab_file=vocab,
        model_size="tiny",
        train_batch_size=4,
        max_seq_length=16,
        max_predictions_per_seq=3,
        num_train_steps=2,
        num_warmup_steps=0,
        objective="ltr",
        nsp=False,
    )
    output_dir = str(tmp_path / "out")
    pretraining_job.run(pretraining_job.PretrainingArgs(output_dir=output_dir, **values))
    assert ModelDir(output_dir).load_config().attention_direction == "left_to_right"
    # The same flags resume it; the masked LM on it is refused.
    resumed = pretraining_job.run(
        pretraining_job.PretrainingArgs(output_dir=output_dir, **dict(values, num_train_steps=3))
    )
    assert resumed.step == 3
    with pytest.raises(io_utils.UsageError, match=r"--objective=mlm trains a bidirectional model"):
        pretraining_job.run(
            pretraining_job.PretrainingArgs(
                output_dir=output_dir,
                **dict(values, objective="mlm", nsp=True, model_size="", num_train_steps=4),
            )
        )


def test_ltr_usage_errors_name_the_flags(data, no_nsp_run, tmp_path):
    ltr_config = str(tmp_path / "ltr_config.json")
    tiny_config(data["vocab_file"], attention_direction="left_to_right").to_json_file(ltr_config)
    bidirectional_dir, _ = no_nsp_run["no_nsp"]
    for overrides, message in [
        (dict(objective="ltr"), r"--objective=ltr needs --nsp=false"),
        (dict(objective="lm", nsp=False), r"--objective must be one of mlm, ltr"),
        (
            dict(objective="ltr", nsp=False),
            r"--objective=ltr trains a left-to-right model, but --bert_config_file=.* has "
            r"attention_direction=bidirectional",
        ),
        (
            dict(objective="ltr", nsp=False, init_checkpoint=bidirectional_dir),
            r"but --init_checkpoint=.* has attention_direction=bidirectional",
        ),
        (
            dict(bert_config_file=ltr_config),
            r"--objective=mlm trains a bidirectional model, but --bert_config_file=.* has "
            r"attention_direction=left_to_right: use --objective=ltr --nsp=false",
        ),
        (
            dict(objective="ltr", nsp=False, bert_config_file=ltr_config, dynamic_masking=True),
            r"--dynamic_masking is for --objective=mlm",
        ),
    ]:
        with pytest.raises(io_utils.UsageError, match=message):
            pretraining_job.run(args_for(data, tmp_path / "out", **overrides))
    assert not ModelDir(str(tmp_path / "out")).exists()
    result = run_module_cli(
        "bert_tf.run_pretraining",
        *cli_flags(data, tmp_path / "cli", objective="ltr", do_train=True),
    )
    assert result.returncode == 2 and "--objective=ltr needs --nsp=false" in result.stderr


def masked_token_frequencies(input_file, vocab_size):
    """Reference for --mlm_bias_from_records: each record read as a tf.train.Example, the ids at
    weight-1 masked positions counted, add-one smoothed."""
    counts = np.ones(vocab_size)
    for path in sorted(glob.glob(input_file)):
        for raw in tf.data.TFRecordDataset(path):
            features = tf.train.Example.FromString(raw.numpy()).features.feature
            ids = features["masked_lm_ids"].int64_list.value
            for token, weight in zip(ids, features["masked_lm_weights"].float_list.value):
                counts[token] += weight > 0
    return counts / counts.sum()


def test_new_heads_on_an_encoder_start_at_the_token_frequencies_and_step_at_their_own_rate(
    data, tmp_path
):
    # How the demo continues all-MiniLM-L6-v2's pretraining: an encoder without heads, new heads.
    init = write_tiny_model_dir(tmp_path / "encoder", data["vocab_file"])
    lr, heads_lr = 2e-3, 2e-2

    def one_step(name, warmup, heads_learning_rate, init_checkpoint=init):
        args = args_for(
            data,
            tmp_path / name,
            init_checkpoint=init_checkpoint,
            bert_config_file="",
            num_train_steps=1,
            num_warmup_steps=warmup,
            steps_per_loop=1,
            save_checkpoints_steps=1,
            learning_rate=lr,
            heads_learning_rate=heads_learning_rate,
            mlm_bias_from_records=True,
        )
        model = pretraining_job.run(args).pretraining_model
        return {v.path: v.numpy() for v in model.weights}

    # A warm-up step has rate 0: the weights are the initial ones.
    start = one_step("warmup", 1, heads_lr)
    frequencies = masked_token_frequencies(data["input_file"], len(start["mlm_head/output_bias"]))
    np.testing.assert_allclose(start["mlm_head/output_bias"], np.log(frequencies), rtol=1e-6)
    # One step at the peak rate from the same start, with and without the heads' own rate: the
    # same gradients, so the heads and the pooler move 10 times as far and the encoder as far.
    heads = {
        "mlm_head/output_bias",
        "mlm_head/intermediate_dense/kernel",
        "mlm_head/intermediate_dense/bias",
        "mlm_head/intermediate_layer_norm/gamma",
        "mlm_head/intermediate_layer_norm/beta",
        "nsp_head/kernel",
        "nsp_head/bias",
        "pooled_dense/kernel",
        "pooled_dense/bias",
    }
    assert heads < set(start)
    own_rate, one_rate = one_step("own_rate", 0, heads_lr), one_step("one_rate", 0, None)
    for path in start:
        moved, moved_at_one_rate = own_rate[path] - start[path], one_rate[path] - start[path]
        factor = heads_lr / lr if path in heads else 1.0
        assert np.abs(moved_at_one_rate).max() > 0, path
        np.testing.assert_allclose(
            moved, factor * moved_at_one_rate, rtol=1e-4, atol=1e-9, err_msg=path
        )
    # A checkpoint with its own MLM head keeps its bias.
    from_heads = one_step("from_heads", 1, None, init_checkpoint=str(tmp_path / "own_rate"))
    np.testing.assert_array_equal(
        from_heads["mlm_head/output_bias"], own_rate["mlm_head/output_bias"]
    )
    with pytest.raises(io_utils.UsageError, match="--heads_learning_rate must be positive"):
        pretraining_job.run(args_for(data, tmp_path / "bad", heads_learning_rate=0.0))
    with pytest.raises(io_utils.UsageError, match="--learning_rate, which must then be positive"):
        pretraining_job.run(
            args_for(data, tmp_path / "bad", heads_learning_rate=1e-3, learning_rate=0)
        )
    with pytest.raises(io_utils.UsageError, match="--mlm_bias_from_records is for --objective=mlm"):
        ltr = dict(objective="ltr", nsp=False, mlm_bias_from_records=True)
        pretraining_job.run(args_for(data, tmp_path / "bad", **ltr))


def test_dropout_sets_the_run_s_rate_and_the_model_dir_keeps_the_config_s(data, tmp_path):
    # The demo continues all-MiniLM-L6-v2 without dropout; fine-tuning from the model directory it
    # writes must still read the config's rates.
    def encoder_after_one_step(name, **overrides):
        args = args_for(
            data,
            tmp_path / name,
            num_train_steps=1,
            num_warmup_steps=0,
            steps_per_loop=1,
            **overrides,
        )
        return pretraining_job.run(args).encoder

    def outputs_differ_between_two_training_calls(encoder):
        inputs = tiny_inputs()
        first, second = (encoder(inputs, training=True)["sequence_output"] for _ in range(2))
        return not np.array_equal(first, second)

    assert outputs_differ_between_two_training_calls(encoder_after_one_step("default"))
    assert not outputs_differ_between_two_training_calls(
        encoder_after_one_step("without", dropout=0.0)
    )
    written = modeling.BertConfig.from_json_file(str(tmp_path / "without" / "bert_config.json"))
    configured = modeling.BertConfig.from_json_file(data["bert_config_file"])
    assert configured.hidden_dropout_prob > 0
    assert written.hidden_dropout_prob == configured.hidden_dropout_prob
    assert written.attention_probs_dropout_prob == configured.attention_probs_dropout_prob
    for rate in (-0.1, 1.0, float("nan")):
        with pytest.raises(
            io_utils.UsageError, match=rf"--dropout must be in \[0, 1\), got {rate}"
        ):
            pretraining_job.run(args_for(data, tmp_path / "bad", dropout=rate))
