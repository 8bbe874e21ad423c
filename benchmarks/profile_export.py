"""Where our export's batch-1 time goes: TensorFlow's profiler on bench_inference's export, per op.

    .venv/bin/python benchmarks/profile_export.py [--size=minilm|base] [--kind=classifier] \\
        [--calls=100]

Builds bench_inference's model directory of the kind and size and exports it as bench_inference
does (max_seq_length 128), calls its serving_default on one real sentence, then profiles
`--calls` more calls with `tf.profiler.experimental` and prints the time a call, and each op type's
self time a call summed over the threads (TensorBoard's framework_op_stats, made from the trace
by TensorFlow's own converter), largest first; IDLE is the threads' idle time. The counterpart of
profile_onnxruntime.py: same sentence, same model shapes.
"""

import collections
import glob
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
import tensorflow_text  # noqa: E402, F401  (registers the tokenizer's ops)
from absl import app, flags, logging  # noqa: E402

# TensorBoard's profile plugin converts traces with this; TensorFlow has no public door to it.
from tensorflow.python.profiler.internal import _pywrap_profiler_plugin  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_inference  # noqa: E402
import task_requests  # noqa: E402
from profile_onnxruntime import SENTENCE, WARMUP_CALLS  # noqa: E402

flags.DEFINE_enum("size", "minilm", ["minilm", "base"], "Model size, as bench_inference's.")
flags.DEFINE_enum("kind", "classifier", list(task_requests.KINDS), "Export kind.")
flags.DEFINE_integer("calls", 100, "Calls timed and profiled.")
FLAGS = flags.FLAGS
SEQ_LENGTH = 128


def op_self_times(xspace):
    """({op type: self-time microseconds summed over the trace}, {op type: occurrences})."""
    data, ok = _pywrap_profiler_plugin.xspace_to_tools_data([xspace], "framework_op_stats", {})
    if not ok:
        raise RuntimeError(f"TensorFlow could not convert {xspace}")
    table = json.loads(data)[0]
    columns = [column["id"] for column in table["cols"]]
    times, counts = collections.Counter(), collections.Counter()
    for row in table["rows"]:
        cells = dict(zip(columns, [cell.get("v") if cell else None for cell in row["c"]]))
        times[cells["type"]] += cells["total_self_time"]
        counts[cells["type"]] += cells["occurrences"]
    return times, counts


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # the export's INFO lines would bury the table
    with tempfile.TemporaryDirectory() as work:
        model_dir, _ = bench_inference.task_model_dir(FLAGS.size, work, FLAGS.kind)
        serving = bench_inference.export_signature(model_dir, SEQ_LENGTH, work, "serving_default")
        inputs = {
            name: tf.constant(value)
            for name, value in task_requests.request(FLAGS.kind, [SENTENCE]).items()
        }
        for _ in range(WARMUP_CALLS):
            serving(**inputs)
        start = time.perf_counter()
        for _ in range(FLAGS.calls):
            serving(**inputs)
        call_ms = (time.perf_counter() - start) / FLAGS.calls * 1e3
        logdir = os.path.join(work, "profile")
        tf.profiler.experimental.start(logdir)
        for _ in range(FLAGS.calls):
            serving(**inputs)
        tf.profiler.experimental.stop()
        (xspace,) = glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))
        times, counts = op_self_times(xspace)
    print(
        f"{FLAGS.size} {FLAGS.kind} export, one sentence, TensorFlow's threads: {call_ms:.2f} ms a "
        f"call; self time summed over threads {sum(times.values()) / FLAGS.calls / 1e3:.2f} ms"
    )
    for op, microseconds in times.most_common():
        print(f"  {op}: {microseconds / FLAGS.calls / 1e3:.3f} ms ({counts[op]:.0f} in the trace)")


if __name__ == "__main__":
    app.run(main)
