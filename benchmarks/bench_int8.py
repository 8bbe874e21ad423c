"""Whether int8 pays on this CPU: Keras 3 `quantize("int8")` against float32, the same model, same run.

The model is the MiniLM classifier bench_inference.py builds (all-MiniLM-L6-v2's real weights,
a random head); both versions are called on packed real sentences inside one tf.function each
(the part of an export that quantization changes), at batch 1 and batch 32, alternating rounds.
Also reported: how often the int8 model's label agrees with float32's, and the largest
probability difference. `bert_tf.export` offers int8 only where it is faster (see RESULTS.md,
"Precision: int8 and bfloat16").
--rounds (bench_inference's flag, imported) sets the alternating rounds.

    .venv/bin/python benchmarks/bench_int8.py
"""

import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags, logging  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_inference  # noqa: E402

from bert_tf.tasks import models

FLAGS = flags.FLAGS
flags.DEFINE_integer("calls", 10, "Timed calls per round.")


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    from bert_tf.model.model_dir import ModelDir
    from bert_tf.tasks.export_graph import TextPacker

    sentences = bench_inference.real_sentences(256)
    with tempfile.TemporaryDirectory() as work:
        model_dir, config = bench_inference.task_model_dir("minilm", work)
        directory = ModelDir(model_dir)
        float32_model = models.load_task_model(directory)[0]
        int8_model = models.load_task_model(directory)[0]
        int8_model.quantize("int8")
        packer = TextPacker(model_dir, config, 128)
    batches = {
        "batch 1": packer.pack([tf.constant(sentences[:1])]),
        "batch 32": packer.pack([tf.constant(sentences[:32])]),
    }
    signature = [{name: tf.TensorSpec([None, None], tf.int32) for name in batches["batch 1"]}]
    calls = {
        name: tf.function(
            lambda x, m=model: m(x, training=False)["logits"], input_signature=signature
        )
        for name, model in (("float32", float32_model), ("int8", int8_model))
    }
    best = {}
    for _ in range(FLAGS.rounds):
        for name, call in calls.items():
            for label, inputs in batches.items():
                call(inputs)
                start = time.perf_counter()
                for _ in range(FLAGS.calls):
                    call(inputs)
                elapsed = (time.perf_counter() - start) / FLAGS.calls * 1e3
                best[name, label] = min(best.get((name, label), float("inf")), elapsed)
    everything = packer.pack([tf.constant(sentences)])
    probabilities = {name: tf.nn.softmax(call(everything)).numpy() for name, call in calls.items()}
    agree = np.mean(probabilities["int8"].argmax(-1) == probabilities["float32"].argmax(-1))
    print(f"load average {os.getloadavg()[0]:.1f}; {len(sentences)} real sentences\n")
    print("| call | float32 ms | int8 ms | int8 / float32 |")
    print("|---|---|---|---|")
    for label in batches:
        f32, i8 = best["float32", label], best["int8", label]
        print(f"| {label} | {f32:.2f} | {i8:.2f} | {i8 / f32:.2f}x |")
    difference = np.abs(probabilities["int8"] - probabilities["float32"]).max()
    print(f"\nlabels agreeing: {agree:.1%}; largest probability difference {difference:.4f}")


if __name__ == "__main__":
    app.run(main)
