"""python -m bert_tf.run_pretraining end to end: learning, resume after SIGKILL, multi-worker, bad input, TPU setup."""

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
from helpers import tiny_config
from helpers_google import GOOGLE_TINY, random_weights, write_google_dir
from helpers_records import write_numbered_records, write_real_text_records

from bert_tf import distribution, io_utils, run_pretraining, training
from bert_tf.model_dir import ModelDir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQ, PRED = 32, 5
ENV = dict(
    os.environ,
    PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]),
    TF_CPP_MIN_LOG_LEVEL="2",
)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Real-text records, the vocab and the tiny model's bert_config.json (helpers.TINY_CONFIG)."""
    directory = tmp_path_factory.mktemp("data")
    files, vocab_file = write_real_text_records(str(directory), SEQ, PRED, num_files=2)
    config_file = str(directory / "bert_config.json")
    tiny_config(vocab_file).to_json_file(config_file)
    return {
        "input_file": os.path.join(str(directory), "records-*.tfrecord"),
        "vocab_file": vocab_file,
        "bert_config_file": config_file,
    }


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
    return run_pretraining.PretrainingArgs(**values)


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
    before = run_pretraining.run(
        args_for(data, output_dir, do_train=False, do_eval=True)
    ).eval_results
    result = run_pretraining.run(args_for(data, output_dir, do_train=True, do_eval=True))
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
    initialized = run_pretraining.run(
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
def test_a_run_killed_after_a_checkpoint_resumes_to_the_same_weights(data, tmp_path):
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
    process = subprocess.Popen(
        command + cli_flags(data, killed_dir, **flags),
        env=ENV,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 240
    while time.time() < deadline and process.poll() is None:
        if training.checkpoint_step(str(killed_dir)) >= 20:
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    process.wait()
    assert straight.wait(timeout=300) == 0
    assert process.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    killed_at = training.checkpoint_step(str(killed_dir))
    assert 20 <= killed_at < 80

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
        np.testing.assert_array_equal(again[name], straight[name], err_msg=name)


def test_a_rerun_removes_the_temp_dir_of_a_save_killed_midway_and_resumes(data, tmp_path, caplog):
    output_dir = tmp_path / "out"
    loop = dict(steps_per_loop=1, save_checkpoints_steps=2)
    run_pretraining.run(args_for(data, output_dir, num_train_steps=2, **loop))
    # What kill -9 inside the save of step 3 leaves: TF writes into <prefix>_temp/ and merges at the end.
    leftover = output_dir / "ckpt-3_temp"
    leftover.mkdir()
    (leftover / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"\0" * 64)
    # Look-alikes are not ours to remove.
    (output_dir / "notes_temp").mkdir()
    (output_dir / "ckpt-3_temp.txt").write_text("mine\n")
    with caplog.at_level("INFO", logger="absl"):  # another test may have left absl at WARNING
        result = run_pretraining.run(args_for(data, output_dir, num_train_steps=4, **loop))
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
    run_pretraining.run(args_for(data, output_dir, num_train_steps=2, **loop))
    diverging = args_for(
        data, output_dir, num_train_steps=10, learning_rate=1e6, num_warmup_steps=0, **loop
    )
    # A rerun skips ckpt-3, marked suspect, resumes from ckpt-2 and diverges again at step 4.
    for _ in range(2):
        with pytest.raises(
            training.NonFiniteLossError, match=r"at step 4 is over 100 times the mean loss"
        ) as failure:
            run_pretraining.run(diverging)
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
    run_pretraining.run(args_for(data, output_dir, num_train_steps=2, **loop))
    with pytest.raises(training.NonFiniteLossError) as failure:
        run_pretraining.run(
            args_for(
                data, output_dir, num_train_steps=10, learning_rate=1e6, num_warmup_steps=0, **loop
            )
        )
    assert "marked suspect in suspect_checkpoints.json" in str(failure.value)
    assert training.suspect_checkpoints(str(output_dir)) == ["ckpt-3"]
    # --resume_from picks a checkpoint, suspect or not; a missing one is refused naming what exists.
    with pytest.raises(
        io_utils.UsageError, match=r"--resume_from=ckpt-9: no such checkpoint .*ckpt-3"
    ):
        run_pretraining.run(
            args_for(data, output_dir, num_train_steps=3, resume_from="ckpt-9", **loop)
        )
    # At a sane learning rate the plain rerun resumes from ckpt-2 by itself and finishes.
    with caplog.at_level("INFO", logger="absl"):  # another test may have left absl at WARNING
        result = run_pretraining.run(args_for(data, output_dir, num_train_steps=4, **loop))
    assert result.step == 4
    assert f"resuming from {output_dir}/ckpt-2, the last healthy checkpoint" in caplog.text
    assert f"resumed from {output_dir}/ckpt-2 at step 2" in caplog.text
    assert training.suspect_checkpoints(str(output_dir)) == []  # ckpt-3 was saved anew
    assert not (output_dir / training.SUSPECT_FILE).exists()


def test_checkpoints_without_their_index_are_never_a_fresh_start(data, tmp_path):
    output_dir = tmp_path / "out"
    loop = dict(steps_per_loop=1, save_checkpoints_steps=1)
    run_pretraining.run(args_for(data, output_dir, num_train_steps=2, **loop))
    (output_dir / "checkpoint").unlink()
    with pytest.raises(
        io_utils.UsageError, match=r"holds checkpoints \(ckpt-1, ckpt-2\) but no valid"
    ):
        run_pretraining.run(args_for(data, output_dir, num_train_steps=3, **loop))
    result = run_pretraining.run(
        args_for(data, output_dir, num_train_steps=3, resume_from="ckpt-2", **loop)
    )
    assert result.step == 3


WORKER_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    from bert_tf import run_pretraining
    args = run_pretraining.PretrainingArgs(**json.loads(sys.argv[1]))
    result = run_pretraining.run(args)
    np.savez(sys.argv[2], *[w.numpy() for w in result.pretraining_model.weights], step=result.step,
             loss=result.train_metrics["loss"])
""")


def free_ports(count):
    """Ports nothing listens on right now."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.mark.slow
def test_two_workers_on_localhost_end_with_identical_weights(data, tmp_path):
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(2)]}
    args = vars(
        args_for(
            data,
            tmp_path / "out",
            strategy="multi_worker_mirrored",
            num_train_steps=10,
            steps_per_loop=5,
            save_checkpoints_steps=5,
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


def test_mismatched_lengths_are_a_usage_error_naming_both_values(data, tmp_path):
    with pytest.raises(
        io_utils.UsageError, match=r"'input_ids' has length 32 but --max_seq_length=128"
    ):
        run_pretraining.run(args_for(data, tmp_path, max_seq_length=128))
    with pytest.raises(io_utils.UsageError, match=r"has length 5 but --max_predictions_per_seq=20"):
        run_pretraining.run(args_for(data, tmp_path, max_predictions_per_seq=20))


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
        run_pretraining.run(args_for(data, tmp_path / "mixed", **mixed))
    cli = subprocess.run(
        [sys.executable, "-m", "bert_tf.run_pretraining"]
        + cli_flags(data, tmp_path / "cli", **mixed),
        env=ENV,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        cli.returncode == 2 and "z-seq16.tfrecord: feature 'input_ids' has length 16" in cli.stderr
    )
    # An empty first file used to be refused ("contains no records"); it is skipped with a warning.
    empty = str(tmp_path / "a-empty.tfrecord")
    with tf.io.TFRecordWriter(empty):
        pass
    result = run_pretraining.run(
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
        run_pretraining.run(args_for(data, tmp_path / "none", input_file=empty))


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
    result = run_pretraining.run(
        run_pretraining.PretrainingArgs(
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
    command = [sys.executable, "-m", "bert_tf.run_pretraining", "--do_train"]
    command += [f"--{name}={value}" for name, value in values.items()]
    refused = subprocess.run(
        command, env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert (
        f"--do_lower_case=true contradicts --init_checkpoint={prefix}: cased_L-12_H-768_A-12 is Google's "
        "cased model" in refused.stderr
    )
    with pytest.raises(io_utils.UsageError, match="--do_lower_case=true contradicts"):
        run_pretraining.run(run_pretraining.PretrainingArgs(**values, do_lower_case=True))
    assert not ModelDir(values["output_dir"]).exists()
    # The flag now reaches the config of an original checkpoint (it used to be for --model_size only).
    result = run_pretraining.run(run_pretraining.PretrainingArgs(**values, do_lower_case=False))
    assert result.step == 1
    assert ModelDir(values["output_dir"]).load_config().do_lower_case is False


def test_cli_usage_errors_exit_2_naming_the_problem(data, tmp_path):
    command = [sys.executable, "-m", "bert_tf.run_pretraining"]
    missing = subprocess.run(
        command + cli_flags(data, tmp_path, input_file=str(tmp_path / "nothing-*.tfrecord")),
        env=ENV,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
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
            run_pretraining.run(args_for(data, tmp_path, **overrides))


def test_step_counts_are_checked_naming_their_flag(data, tmp_path):
    # --max_eval_steps=0 used to run and then blame --eval_batch_size ("no full batch").
    for overrides, message in [
        (dict(do_train=False, do_eval=True, max_eval_steps=0), "--max_eval_steps must be positive"),
        (dict(num_train_steps=0), "--num_train_steps must be positive"),
        (dict(num_warmup_steps=-1), "--num_warmup_steps must not be negative"),
    ]:
        with pytest.raises(io_utils.UsageError, match=message):
            run_pretraining.run(args_for(data, tmp_path / "out", **overrides))


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
