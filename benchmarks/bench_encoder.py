"""Encoder forward speed at BERT-base: bert_tf's encoder beside keras-hub's BertBackbone (and HF PyTorch).

Measures latency at batch 1 and throughput at batch 32 (sequence length 128), float32 and bfloat16,
with and without XLA (jit_compile). Random weights: speed does not depend on their values.
Hugging Face PyTorch BertModel runs in a separate interpreter given by --torch_python (e.g. the
reference venv /tmp/refvenv/bin/python), so torch never has to be installed beside TensorFlow;
without it that row is skipped. Prints a markdown table; ratios compare each row to keras-hub
BertBackbone under the same precision and compilation.

    .venv/bin/python benchmarks/bench_encoder.py --torch_python=/tmp/refvenv/bin/python
"""

import gc
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

from bert_tf.model import modeling  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("seq_length", 128, "Sequence length.")
flags.DEFINE_integer("latency_batch", 1, "Batch size for the latency measurement.")
flags.DEFINE_integer("throughput_batch", 32, "Batch size for the throughput measurement.")
flags.DEFINE_integer("latency_iters", 5, "Timed calls for latency (after one warm-up call).")
flags.DEFINE_integer("throughput_iters", 2, "Timed calls for throughput (after one warm-up call).")
flags.DEFINE_list("precisions", ["float32", "bfloat16"], "Precisions to measure.")
flags.DEFINE_list(
    "compile_modes", ["xla", "graph"], "tf.function with jit_compile (xla) and/or without (graph)."
)
flags.DEFINE_string("size", "base", "Named model size.")
flags.DEFINE_string(
    "torch_python",
    None,
    "A Python with torch + transformers for the HF PyTorch rows; skipped if unset.",
)

VOCAB = 30522

_TORCH_SCRIPT = r"""
import json, sys, time, torch, transformers
seq, lat_b, thr_b, lat_n, thr_n, layers, hidden, precisions = json.loads(sys.argv[1])
cfg = transformers.BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
                              num_attention_heads=hidden // 64, intermediate_size=4 * hidden)
model = transformers.BertModel(cfg).eval()
results = []
def timed(batch, iters, dtype):
    ids = torch.randint(1000, 30000, (batch, seq))
    mask = torch.ones_like(ids)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
        model(input_ids=ids, attention_mask=mask)
        start = time.perf_counter()
        for _ in range(iters):
            model(input_ids=ids, attention_mask=mask)
    return (time.perf_counter() - start) / iters
for p in precisions:
    lat = timed(lat_b, lat_n, p)
    thr = timed(thr_b, thr_n, p)
    results.append({"precision": p, "latency_ms": 1000 * lat, "throughput": thr_b / thr,
                    "threads": torch.get_num_threads(), "version": torch.__version__})
print(json.dumps(results))
"""


def make_inputs(batch, seq, keras_hub_names=False):
    """Random token ids with a full mask, under bert_tf's or keras-hub's input names."""
    rng = np.random.default_rng(0)
    ids = tf.constant(rng.integers(1000, VOCAB - 1, size=(batch, seq)), tf.int32)
    ones, zeros = tf.ones_like(ids), tf.zeros_like(ids)
    if keras_hub_names:
        return {"token_ids": ids, "segment_ids": zeros, "padding_mask": ones}
    return {"input_word_ids": ids, "input_mask": ones, "input_type_ids": zeros}


def build(kind, config):
    """bert_tf's encoder or keras-hub's BertBackbone of the same size, under the global dtype policy."""
    if kind == "bert_tf":
        return modeling.build_encoder(config)
    return keras_hub.models.BertBackbone(
        vocabulary_size=config.vocab_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        hidden_dim=config.hidden_size,
        intermediate_dim=config.intermediate_size,
        max_sequence_length=config.max_position_embeddings,
    )


def measure(fn, inputs, iters):
    """Seconds per call after one warm-up (compiling) call; the result is fetched to sync."""
    tf.nest.map_structure(lambda t: t.numpy(), fn(inputs))
    start = time.perf_counter()
    for _ in range(iters):
        out = fn(inputs)
    tf.nest.map_structure(lambda t: t.numpy(), out)
    return (time.perf_counter() - start) / iters


def run_keras(kind, config, precision, compile_mode):
    """One row: latency (ms) and throughput (seq/s) for a Keras model."""
    keras.mixed_precision.set_global_policy(
        "mixed_bfloat16" if precision == "bfloat16" else "float32"
    )
    try:
        model = build(kind, config)
        # (`model` is deleted below, after its last use, to free the memory before the next row.)
        fn = tf.function(lambda x: model(x, training=False), jit_compile=compile_mode == "xla")  # noqa: F821
        hub = kind == "keras_hub"
        latency = measure(
            fn, make_inputs(FLAGS.latency_batch, FLAGS.seq_length, hub), FLAGS.latency_iters
        )
        per_batch = measure(
            fn, make_inputs(FLAGS.throughput_batch, FLAGS.seq_length, hub), FLAGS.throughput_iters
        )
    finally:
        keras.mixed_precision.set_global_policy("float32")
    del model, fn
    gc.collect()
    return {"latency_ms": 1000 * latency, "throughput": FLAGS.throughput_batch / per_batch}


def run_torch(config):
    """HF PyTorch BertModel rows, measured in FLAGS.torch_python; [] when unavailable."""
    if not FLAGS.torch_python:
        return []
    args = json.dumps(
        [
            FLAGS.seq_length,
            FLAGS.latency_batch,
            FLAGS.throughput_batch,
            FLAGS.latency_iters,
            FLAGS.throughput_iters,
            config.num_hidden_layers,
            config.hidden_size,
            FLAGS.precisions,
        ]
    )
    try:
        result = subprocess.run(
            [FLAGS.torch_python, "-c", _TORCH_SCRIPT, args],
            capture_output=True,
            text=True,
            timeout=900,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"skipping HF PyTorch: {e}", file=sys.stderr)
        return []
    if result.returncode != 0:
        print(f"skipping HF PyTorch: {result.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return []
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv):
    """Runs every configuration and prints the markdown table."""
    del argv
    config = modeling.BertConfig.from_size(FLAGS.size, VOCAB)
    rows = []
    for precision in FLAGS.precisions:
        for compile_mode in FLAGS.compile_modes:
            for kind in ("keras_hub", "bert_tf"):
                start = time.perf_counter()
                row = run_keras(kind, config, precision, compile_mode)
                row.update(model=kind, precision=precision, compile=compile_mode)
                rows.append(row)
                print(
                    f"# {kind} {precision} {compile_mode}: {row['latency_ms']:.1f} ms, "
                    f"{row['throughput']:.2f} seq/s ({time.perf_counter() - start:.0f} s)",
                    file=sys.stderr,
                )
    for row in run_torch(config):
        row.update(
            model=f"hf_pytorch (torch {row.pop('version')}, {row.pop('threads')} threads)",
            compile="eager",
        )
        rows.append(row)

    def peer(row):
        # keras-hub under the same precision and compilation (XLA for torch's eager rows).
        mode = row["compile"] if row["compile"] != "eager" else "xla"
        return next(
            (
                r
                for r in rows
                if r["model"] == "keras_hub"
                and r["precision"] == row["precision"]
                and r["compile"] == mode
            ),
            None,
        )

    print(
        f"\nEncoder forward, BERT-{FLAGS.size} (L{config.num_hidden_layers}/H{config.hidden_size}), "
        f"seq {FLAGS.seq_length}, {os.cpu_count()} CPUs, TF {tf.__version__}, keras {keras.__version__}, "
        f"keras-hub {keras_hub.__version__}\n"
    )
    print(
        f"| model | precision | compile | latency b{FLAGS.latency_batch} (ms) | throughput b{FLAGS.throughput_batch} "
        "(seq/s) | throughput vs keras-hub |"
    )
    print("|---|---|---|---:|---:|---:|")
    for row in rows:
        ref = peer(row)
        ratio = f"{row['throughput'] / ref['throughput']:.2f}x" if ref else "n/a"
        print(
            f"| {row['model']} | {row['precision']} | {row['compile']} | {row['latency_ms']:.1f} | "
            f"{row['throughput']:.2f} | {ratio} |"
        )


if __name__ == "__main__":
    app.run(main)
