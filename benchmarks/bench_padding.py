"""How far an export should round a batch's length up: exact, or to a multiple of 8 or 16, paired calls.

An export cuts each batch to its longest row; XLA compiles each distinct length, so XLA exports
round it up to packing.LENGTH_BUCKET (16), but TensorFlow's graph kernels take any length. This
measures what the rounding costs a graph export: the classifier bench_inference.py builds
(`--sizes`: minilm = all-MiniLM-L6-v2's real weights; base = BERT-base's shape, random weights),
called inside one tf.function (no XLA) on real sentences packed by the export's TextPacker with
each `length_multiple`, packed ahead so that only the model's call is timed. Batches of 32 run in
length groups, as an export runs them (export_graph.call_by_length). The multiples are timed in
pairs (latency.paired_timings: they take turns on each block of sentences and each batch), and
the table gives batch-1 p50 latency and batch-32 throughput (best of --rounds), each against
the first multiple's, and how many positions the model runs over the sentences.

    .venv/bin/python benchmarks/bench_padding.py --sizes=minilm,base
"""

import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from absl import app, flags, logging  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_inference  # noqa: E402
import latency  # noqa: E402

from bert_tf.tasks import models

FLAGS = flags.FLAGS
flags.DEFINE_list("multiples", ["16", "8", "1"], "Length multiples compared; the first is 1.00x.")


def model_positions(batch, length_multiple):
    """How many positions the model runs for one packed batch, in call_by_length's groups."""
    from bert_tf.tasks.export_graph import LENGTH_GROUP_ROWS, length_groups
    from bert_tf.tasks.packing import bucketed_length, example_lengths

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
    from bert_tf.model.model_dir import ModelDir
    from bert_tf.tasks.export_graph import TextPacker, call_by_length

    multiples = [int(m) for m in FLAGS.multiples]
    sentences = bench_inference.real_sentences(FLAGS.sentences)
    batch = bench_inference.BATCH
    print(
        "| model | length multiple | positions at batch 1 | at batch 32 | batch-1 p50 ms | "
        f"vs {multiples[0]} | batch-32 sentences/s | vs {multiples[0]} |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for size in FLAGS.sizes:
        singles = [[s] for s in sentences]
        batches = [sentences[i : i + batch] for i in range(0, len(sentences), batch)]
        groups = singles + batches
        packed_by_multiple = {}
        with tempfile.TemporaryDirectory() as work:
            model_dir, config = bench_inference.task_model_dir(size, work)
            model = models.load_task_model(ModelDir(model_dir))[0]
            for m in multiples:
                # Packed ahead, so that only the model's call is timed.
                packer = TextPacker(model_dir, config, 128, length_multiple=m)
                packed_by_multiple[m] = {tuple(g): packer.pack([tf.constant(g)]) for g in groups}
        runs, positions = {}, {}
        for m in multiples:
            packed = packed_by_multiple[m]
            positions[m] = [
                sum(model_positions(packed[tuple(g)], m) for g in kind)
                for kind in (singles, batches)
            ]
            call = tf.function(
                lambda x, m=m: call_by_length(model, x, length_multiple=m)["logits"],
                input_signature=[
                    {
                        name: tf.TensorSpec([None, None], tf.int32)
                        for name in packed[tuple(groups[0])]
                    }
                ],
                autograph=False,
            )
            runs[m] = latency.timed(lambda texts, p=packed, c=call: c(p[tuple(texts)]).numpy())
        results = latency.paired_timings(runs, sentences, batch, FLAGS.rounds)
        p50_0, per_s_0 = results[multiples[0]]
        for m, (p50, per_s) in results.items():
            print(
                f"| {size} | {m} | {positions[m][0]} | {positions[m][1]} | {p50:.2f} | "
                f"{p50 / p50_0:.3f}x | {per_s:.1f} | {per_s / per_s_0:.3f}x |",
                flush=True,
            )


if __name__ == "__main__":
    app.run(main)
