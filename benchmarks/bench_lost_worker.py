"""Two workers of run_pretraining on this machine that lose one: how long the other takes to stop,
how many steps a preemption loses, and how far a restarted run ends from an uninterrupted one.

    make demo   # its records and vocabulary (build/demo)
    .venv/bin/python benchmarks/bench_lost_worker.py [--demo_dir=build/demo] [--num_train_steps=300]

Rows (the tiny model on the demo's seq-64 records, --steps_per_loop=10, a progress line per loop):
  - SIGTERM to worker 1 between two periodic saves: seconds until both exited, and the steps
    between the one they reached and the one saved;
  - SIGKILL of worker 1 right after a progress line (inside an all-reduce its closed connections
    are noticed at once; between two, only its missing heartbeats tell) and SIGSTOP of worker 0,
    the coordination service's leader (a machine cut off): seconds until the other exited, at the
    default --lost_worker_timeout and at 10 s;
  - the evaluation masked-LM loss after --num_train_steps: uninterrupted; stopped by SIGTERM at a
    third of the way and restarted; uninterrupted with another --seed.
"""

import argparse
import os
import re
import signal
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bert_tf.runtime import local_cluster  # noqa: E402

PROGRESS = r"^step (\d+)/"


def start(args, output_dir, **flags):
    """Two workers of a tiny pretraining run into `output_dir`; `flags` add or replace flags."""
    values = dict(
        input_file=os.path.join(args.demo_dir, "tfrecords_64", "*.tfrecord"),
        vocab_file=os.path.join(args.demo_dir, "vocab.txt"),
        do_lower_case=True,
        model_size="tiny",
        output_dir=output_dir,
        strategy="multi_worker_mirrored",
        train_batch_size=32,
        eval_batch_size=32,
        max_seq_length=64,
        max_predictions_per_seq=10,
        num_train_steps=args.num_train_steps,
        num_warmup_steps=args.num_train_steps // 10,
        steps_per_loop=10,
        save_checkpoints_steps=100,
        learning_rate=1e-3,
        do_train=True,
        do_eval=True,
        max_eval_steps=20,
    )
    values.update(flags)
    command = [sys.executable, "-m", "bert_tf.run_pretraining"]
    command += [f"--{name}={value}" for name, value in values.items()]
    return local_cluster.Cluster(command, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), cwd=ROOT)


def eval_mlm_loss(output_dir):
    with open(os.path.join(output_dir, "eval_results.txt")) as f:
        results = dict(line.strip().split(" = ") for line in f)
    return float(results["masked_lm_loss"])


def finished(cluster, timeout=1800):
    codes = cluster.wait(timeout)
    if codes != [0, 0]:
        raise RuntimeError(f"exit codes {codes}:\n{cluster[0].output[-3000:]}")


def preempted(args, work, name, at_step):
    """SIGTERM to worker 1 once worker 0 reports `at_step`: (seconds to both exits, step reached,
    step saved), then the restart to the end."""
    output_dir = os.path.join(work, name)
    cluster = start(args, output_dir)
    reached = int(cluster[0].wait_for_line(rf"^step ({at_step})/", 1800)[1])
    cluster[1].process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    finished(cluster, 300)
    seconds = max(task.exited_at for task in cluster.tasks) - signalled
    with open(os.path.join(output_dir, "checkpoint")) as f:
        saved = int(re.search(r"ckpt-(\d+)", f.read())[1])
    finished(start(args, output_dir))
    return seconds, reached, saved, eval_mlm_loss(output_dir)


def lost(args, work, name, victim, signum, timeout):
    """Seconds from `signum` to `victim` until the other worker exited (it must exit 1)."""
    cluster = start(
        args, os.path.join(work, name), num_train_steps=100000, lost_worker_timeout=timeout
    )
    try:
        cluster[0].wait_for_line(r"^step 20/", 1800)
        cluster[victim].process.send_signal(signum)
        sent = time.monotonic()
        survivor = cluster[1 - victim]
        code = survivor.wait(timeout + 300)
        if code != 1 or not any(line.startswith("error: lost") for line in survivor.lines):
            raise RuntimeError(f"exit {code}:\n{survivor.output[-3000:]}")
        return survivor.exited_at - sent
    finally:
        cluster.kill()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--demo_dir", default=os.path.join(ROOT, "build", "demo"))
    parser.add_argument("--num_train_steps", type=int, default=300)
    args = parser.parse_args()
    if not os.path.exists(os.path.join(args.demo_dir, "tfrecords_64")):
        parser.error(f"--demo_dir={args.demo_dir} holds no tfrecords_64: run `make demo` first")
    work = tempfile.mkdtemp(prefix="bench_lost_worker_")
    rows = []
    # A third of the way, between two periodic saves (every 100 steps).
    seconds, reached, saved, resumed_loss = preempted(
        args, work, "preempted", args.num_train_steps // 30 * 10 + 10
    )
    rows.append(
        (
            f"SIGTERM to worker 1 after step {reached} was reported: both saved step {saved}, exit 0",
            f"{seconds:.1f}",
            f"{max(0, reached - saved)}",
        )
    )
    for timeout in (60, 10):
        for victim, signum, what in (
            (1, signal.SIGKILL, "SIGKILL of worker 1"),
            (0, signal.SIGSTOP, "SIGSTOP of worker 0 (the leader)"),
        ):
            name = f"lost_{victim}_{timeout}"
            seconds = lost(args, work, name, victim, signum, timeout)
            rows.append((f"{what}, --lost_worker_timeout={timeout}", f"{seconds:.1f}", ""))
    print("| event | seconds until the other workers exited | steps lost |")
    print("|---|---:|---:|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    finished(start(args, os.path.join(work, "straight")))
    finished(start(args, os.path.join(work, "seed2"), seed=2))
    print(f"\nevaluation masked-LM loss after {args.num_train_steps} steps:")
    print(
        f"  uninterrupted:                      {eval_mlm_loss(os.path.join(work, 'straight')):.4f}"
    )
    print(f"  stopped at step {saved} and restarted: {resumed_loss:.4f}")
    print(f"  uninterrupted, --seed=2:            {eval_mlm_loss(os.path.join(work, 'seed2')):.4f}")


if __name__ == "__main__":
    main()
