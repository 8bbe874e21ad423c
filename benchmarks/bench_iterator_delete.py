"""How long deleting a finished tf.data iterator takes, with tf.data's autotuner on (TF's default)
and off (ours: `tf_data.without_autotune`), on the eval dataset of a fine-tuning job.

Each round builds `packing.features_dataset` over --rows eval rows (batches of 32 cut to their
longest row, as fine-tuning's eval and predict batches are), runs a fixed matmul workload after
every batch as a model step would, and times `del` of the exhausted iterator. Rows alternate
between the two settings.

    .venv/bin/python benchmarks/bench_iterator_delete.py [--rounds=6] [--rows=512] [--step_matmuls=20]
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bert_tf.tasks import packing  # noqa: E402


def eval_features(rows, seq_length, seed=0):
    """Padded rows of 10 to 60 tokens, as run_classifier's dev features."""
    rng = np.random.default_rng(seed)
    mask = (np.arange(seq_length)[None, :] < rng.integers(10, 60, (rows, 1))).astype(np.int32)
    return {
        "input_ids": rng.integers(1000, 30000, (rows, seq_length)).astype(np.int32) * mask,
        "input_mask": mask,
        "segment_ids": np.zeros_like(mask),
        "label_ids": np.zeros(rows, np.int32),
    }


def deletion_seconds(features, autotune, step_matmuls, work):
    """Seconds that `del` of the exhausted iterator of one eval pass takes."""
    dataset = packing.features_dataset(features, 32, length_bucket=1)
    if autotune:
        options = tf.data.Options()
        # What tf.data does unless told otherwise. A later with_options wins (tf.data logs a
        # warning that the value changed).
        options.autotune.enabled = True
        dataset = dataset.with_options(options)
    iterator = iter(dataset)
    for _ in iterator:
        for _ in range(step_matmuls):
            tf.matmul(work, work).numpy()
    start = time.perf_counter()
    del iterator
    return time.perf_counter() - start


def main():
    """Alternates the two settings for --rounds rounds and prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--rows", type=int, default=512, help="Eval rows (batches of 32).")
    parser.add_argument("--step_matmuls", type=int, default=20, help="1024^2 matmuls per batch.")
    args = parser.parse_args()
    features = eval_features(args.rows, 128)
    work = tf.random.normal([1024, 1024])
    times = {True: [], False: []}
    for _ in range(args.rounds):
        for autotune in (True, False):
            times[autotune].append(deletion_seconds(features, autotune, args.step_matmuls, work))
    print(
        f"{args.rounds} eval passes of {args.rows // 32} batches each, {args.step_matmuls} matmuls a batch"
    )
    print("| tf.data autotuner | median s | max s | every pass, s |")
    print("|---|---:|---:|---|")
    for autotune, label in ((True, "on (TF's default)"), (False, "off (bert_tf)")):
        values = times[autotune]
        listed = " ".join(f"{v:.2f}" for v in values)
        print(f"| {label} | {statistics.median(values):.3f} | {max(values):.3f} | {listed} |")


if __name__ == "__main__":
    main()
