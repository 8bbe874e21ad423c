"""How far an export should round a batch's length up: exact, or to a multiple of 8 or 16, paired calls.

An export cuts each batch to its longest row; XLA compiles each distinct length, so XLA exports
round it up to tasks.LENGTH_BUCKET (16), but TensorFlow's graph kernels take any length. This
measures what the rounding costs a graph export: the classifier bench_inference.py builds
(`--sizes`: minilm = all-MiniLM-L6-v2's real weights; base = BERT-base's shape, random weights),
called inside one tf.function (no XLA) on real sentences packed by the export's TextPacker with
each `length_multiple`. On this noisy machine rows run one after another drift apart, so the
calls are paired: for each sentence (batch 1) or batch of 32 (run in length groups, as an export
runs it: export_graph.call_by_length), every multiple runs back to back, in rotating order, and
the table reports each multiple's median time and the median of its per-pair ratio to 16's.

    .venv/bin/python benchmarks/bench_padding.py --sizes=minilm,base
"""

import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from absl import app, flags, logging  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_inference  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("multiples", ["16", "8", "1"], "Length multiples compared; the first is 1.00x.")
flags.DEFINE_integer("passes", 3, "Paired passes over the sentences.")


def paired_times(calls, inputs, passes):
    """{multiple: [seconds]}: every input through every call back to back, the order rotating."""
    names = list(calls)
    times = {name: [] for name in names}
    for name in names:  # warm-up: the first call of each length allocates
        for batch in inputs[name]:
            calls[name](batch).numpy()
    for _ in range(passes):
        for i in range(len(inputs[names[0]])):
            shift = i % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                calls[name](inputs[name][i]).numpy()
                times[name].append(time.perf_counter() - start)
    return times


def model_positions(batch, length_multiple):
    """How many positions the model runs for one packed batch, in call_by_length's groups."""
    from bert_tf.export_graph import LENGTH_GROUP_ROWS, length_groups
    from bert_tf.tasks import bucketed_length, example_lengths

    mask = batch["input_mask"]
    if mask.shape[0] <= LENGTH_GROUP_ROWS:  # one call on the packed batch
        return int(tf.size(mask))
    lengths = example_lengths(mask)
    order, starts, ends = length_groups(lengths)
    ordered = tf.gather(lengths, order)
    return sum(
        int(bucketed_length(ordered[start:end], mask.shape[-1], length_multiple)) * (end - start)
        for start, end in zip(starts.numpy(), ends.numpy())
    )


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    from bert_tf.export_graph import TextPacker, call_by_length
    from bert_tf.model_dir import ModelDir

    multiples = [int(m) for m in FLAGS.multiples]
    sentences = bench_inference.real_sentences(FLAGS.sentences)
    batch = bench_inference.BATCH
    print(
        "| model | call | length multiple | positions | median ms | paired ratio to "
        f"{multiples[0]} |\n|---|---|---|---|---|---|"
    )
    for size in FLAGS.sizes:
        with tempfile.TemporaryDirectory() as work:
            model_dir, config = bench_inference.classifier_model_dir(size, work)
            model = ModelDir(model_dir).load_task_model()[0]
            packers = {m: TextPacker(model_dir, config, 128, length_multiple=m) for m in multiples}
        for label, rows in (("batch 1", 1), (f"batch {batch}", batch)):
            groups = [sentences[i : i + rows] for i in range(0, len(sentences), rows)]
            inputs = {m: [packers[m].pack([tf.constant(g)]) for g in groups] for m in multiples}
            signature = [{name: tf.TensorSpec([None, None], tf.int32) for name in inputs[1][0]}]
            calls = {
                m: tf.function(
                    lambda x, m=m: call_by_length(model, x, length_multiple=m)["logits"],
                    input_signature=signature,
                    autograph=False,
                )
                for m in multiples
            }
            times = paired_times(calls, inputs, FLAGS.passes)
            for m in multiples:
                ratios = [t / t0 for t, t0 in zip(times[m], times[multiples[0]])]
                positions = sum(model_positions(b, m) for b in inputs[m])
                print(
                    f"| {size} | {label} | {m} | {positions} | "
                    f"{statistics.median(times[m]) * 1e3:.2f} | {statistics.median(ratios):.3f}x |",
                    flush=True,
                )


if __name__ == "__main__":
    app.run(main)
