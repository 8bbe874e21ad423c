"""Two workers of run_pretraining on 127.0.0.1 that lose one: killed, frozen, or given SIGTERM.

Each test starts real processes with TF_CONFIG (helpers_cluster) and bounds every wait, so a hang
fails the test instead of the suite.
"""

import glob
import os
import re
import signal
import sys
import time

import pytest
import tensorflow as tf
from helpers import ROOT, child_pythonpath
from helpers_records import write_tiny_pretraining_data

from bert_tf.model import model_dir
from bert_tf.runtime import local_cluster
from bert_tf.training import loop_flags

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

SEQ, PRED = 32, 5
PROGRESS = r"^step (\d+)/"
ENV = dict(os.environ, PYTHONPATH=child_pythonpath(__file__), TF_CPP_MIN_LOG_LEVEL="2")


def start_cluster(flags, env=None):
    """Two workers of run_pretraining with `flags` (and `env` added to the tests' environment)."""
    command = [sys.executable, "-m", "bert_tf.run_pretraining", *flags]
    return local_cluster.Cluster(command, env=dict(ENV, **(env or {})), cwd=ROOT)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Real-text records, their vocab and the tiny model's bert_config.json."""
    return write_tiny_pretraining_data(tmp_path_factory.mktemp("data"), SEQ, PRED)


def cluster_flags(data, output_dir, **overrides):
    """The flags of a tiny multi-worker pretraining run; `overrides` add or replace flags."""
    values = dict(
        data,
        output_dir=output_dir,
        strategy="multi_worker_mirrored",
        train_batch_size=16,
        max_seq_length=SEQ,
        max_predictions_per_seq=PRED,
        num_train_steps=100,
        num_warmup_steps=10,
        steps_per_loop=2,
        save_checkpoints_steps=1000,
        learning_rate=1e-3,
        do_train=True,
    )
    values.update(overrides)
    return [f"--{name}={value}" for name, value in values.items()]


def error_lines(task):
    return [line for line in task.lines if line.startswith("error:")]


def assert_checkpoints_complete(output_dir):
    """Every checkpoint the state file lists reads back whole, and no save was left half-done."""
    state = tf.train.get_checkpoint_state(output_dir)
    for path in state.all_model_checkpoint_paths:
        assert len(tf.train.load_checkpoint(path).get_variable_to_shape_map()) > 30, path
    assert not glob.glob(os.path.join(output_dir, "*_temp*"))


def restart(flags, output_dir, resume_step, final_step):
    """Restarts every worker with the same flags: they resume at `resume_step` and end at `final_step`."""
    again = start_cluster(flags)
    try:
        assert again.wait(300) == [0, 0], again[0].output[-3000:]
    finally:
        again.kill()
    assert f"resumed from {output_dir}/ckpt-{resume_step} at step {resume_step}" in again[0].output
    assert model_dir.checkpoint_step(tf.train.latest_checkpoint(output_dir)) == final_step


def test_a_killed_worker_stops_the_other_naming_it_and_all_restarted_resume(data, tmp_path):
    output_dir = str(tmp_path / "out")
    timeout = 10
    flags = cluster_flags(data, output_dir, save_checkpoints_steps=4, lost_worker_timeout=timeout)
    cluster = start_cluster(flags)
    try:
        cluster[0].wait_for_line(r"^step (1[2-9]|[2-9]\d)/100", timeout=240)
        cluster[1].process.kill()
        killed = time.monotonic()
        assert cluster[0].wait(120) == 1
        waited = cluster[0].exited_at - killed
    finally:
        cluster.kill()
    (error,) = error_lines(cluster[0])
    match = re.fullmatch(
        r"error: lost /job:worker/task:1 \(it died, or was silent for --lost_worker_timeout\): "
        r"stopped at step \d+; restart every worker with the same command to resume from "
        rf"{re.escape(output_dir)}/ckpt-(\d+)",
        error,
    )
    assert match, error
    # Killed inside an all-reduce, the peer's connection resets at once; between two, the
    # heartbeats it no longer sends tell within the timeout.
    assert waited < timeout + 20
    resume_step = int(match[1])
    assert resume_step >= 8 and resume_step % 4 == 0
    assert_checkpoints_complete(output_dir)
    assert tf.train.latest_checkpoint(output_dir).endswith(f"ckpt-{resume_step}")
    restart(flags, output_dir, resume_step, 100)


def test_a_frozen_leader_is_lost_after_the_timeout_and_the_other_exits_naming_it(data, tmp_path):
    output_dir = str(tmp_path / "out")
    timeout = 5
    cluster = start_cluster(
        cluster_flags(data, output_dir, num_train_steps=100000, lost_worker_timeout=timeout),
    )
    try:
        cluster[0].wait_for_line(PROGRESS, timeout=240)
        # A stopped process keeps its sockets open, as a machine cut off from the network does:
        # only the missing heartbeats tell the other worker.
        cluster[0].process.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        assert cluster[1].wait(120) == 1
        waited = cluster[1].exited_at - stopped
    finally:
        cluster.kill()
    (error,) = error_lines(cluster[1])
    assert error.startswith("error: lost /job:worker/task:0 (it died, or was silent"), error
    assert error.endswith("resume from the start (no checkpoint was saved)")
    assert waited < timeout + 20
    assert loop_flags.LoopArgs().lost_worker_timeout <= 120


def test_sigterm_to_one_worker_saves_the_step_both_reached_and_exits_0(data, tmp_path):
    output_dir = str(tmp_path / "out")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    flags = cluster_flags(data, output_dir)
    cluster = start_cluster(flags, env={"TMPDIR": str(scratch)})
    try:
        cluster[0].wait_for_line(PROGRESS, timeout=240)
        cluster[1].process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert cluster.wait(120) == [0, 0], cluster[0].output[-3000:]
        waited = max(task.exited_at for task in cluster.tasks) - signalled
    finally:
        cluster.kill()
    assert waited < 60
    said = [
        [line for line in task.lines if line.startswith("preempted:")] for task in cluster.tasks
    ]
    step = int(re.search(r"stopped at step (\d+)/100", said[0][0])[1])
    assert 2 <= step < 100
    for lines in said:
        assert lines == [
            f"preempted: SIGTERM: saved {output_dir}/ckpt-{step} and stopped at step {step}/100; "
            "run the same command again (on every worker) to resume from it"
        ]
    # The step reached is saved, whatever the save cadence: the restart loses none.
    assert tf.train.latest_checkpoint(output_dir).endswith(f"ckpt-{step}")
    assert_checkpoints_complete(output_dir)
    assert os.listdir(scratch) == []  # worker 1's scratch checkpoints are gone
    restart(flags, output_dir, step, 100)
