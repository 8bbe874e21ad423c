"""Pretraining throughput: bert_tf's loop vs keras-hub BertMaskedLM.fit(jit_compile=True) and HF
BertForPreTraining (PyTorch eager), same shapes, same run.

    python benchmarks/bench_pretraining.py [--size=mini] [--steps=6] [--batch=32] [--seq=128] \\
        [--torch_python=/tmp/refvenv/bin/python] [--torch_threads=2]

Prints a markdown table: examples/s, model FLOPs utilization (MFU) against a float32 matmul peak
measured here, and the ratios to keras-hub and to Hugging Face. All models are BERT with the same
L/H/heads/intermediate and vocab; ours also trains the NSP head and reads real TFRecords through
the input pipeline (written to a temp dir in the original schema), keras-hub trains MLM only on
in-memory arrays. The Hugging Face peer (benchmarks/hf_peer.py, task "pretraining") runs in
--torch_python, a separate interpreter with torch + transformers, on --torch_threads threads:
BertForPreTraining with gelu_new (the tanh GELU, as ours), torch AdamW, gradients clipped to norm
1, random in-memory batches, MLM (its head projects every position to the vocab; the loss counts
the 20 labelled ones) and NSP. Its MFU counts the FLOPs it runs, that head included. It stays
alive between windows and runs each window when asked, so its windows interleave with the others.
Without --torch_python its row is skipped.
"""

import argparse
import json
import os
import sys
import tempfile
import time

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCHMARKS))
sys.path.insert(0, BENCHMARKS)

import keras  # noqa: E402
import latency  # noqa: E402  (benchmarks/)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bert_tf.model import modeling  # noqa: E402
from bert_tf.pretraining import input_pipeline  # noqa: E402
from bert_tf.pretraining.masked_lm import PretrainingObjective  # noqa: E402
from bert_tf.training import optimization, training_loop  # noqa: E402

VOCAB_SIZE = 30522
PREDICTIONS = 20
HF_PEER = os.path.join(BENCHMARKS, "hf_peer.py")
KERAS_HUB_ROW = "keras-hub BertMaskedLM fit(jit_compile=True), MLM only"


def matmul_peak_flops(sizes=(1024, 2048), seconds=2.0):
    """Sustained float32 matmul FLOP/s here: the best of TF's own kernel (oneDNN on CPU) and XLA's,
    over a few sizes (the CPU is shared, so the best run is the closest to the machine's peak)."""
    best = 0.0
    for size in sizes:
        a = tf.random.normal([size, size])
        b = tf.random.normal([size, size])
        for jit_compile in (False, True):

            @tf.function(jit_compile=jit_compile)
            def chain(x):
                for _ in range(4):
                    x = tf.matmul(x, b) * 1e-3
                return x

            chain(a).numpy()
            calls, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                chain(a).numpy()
                calls += 1
            best = max(best, 4 * calls * 2 * size**3 / (time.perf_counter() - start))
    return best


def training_flops_per_example(config, seq, mlm_positions=PREDICTIONS):
    """3x the forward matmul FLOPs (forward + two backward matmuls) of BERT with MLM and NSP heads,
    the MLM head run on `mlm_positions` positions per example."""
    h, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    per_layer = seq * (4 * h * h + 2 * h * inter) * 2 + 2 * seq * seq * h * 2
    heads = mlm_positions * (h * h + h * config.vocab_size) * 2 + (h * h + 2 * h) * 2
    return 3 * (layers * per_layer + heads)


def write_records(directory, num_records, seq, rng):
    """Random records in the original schema (content does not affect speed)."""
    path = os.path.join(directory, "bench.tfrecord")

    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    with tf.io.TFRecordWriter(path) as writer:
        for _ in range(num_records):
            ids = rng.integers(5, VOCAB_SIZE, seq).tolist()
            positions = sorted(rng.choice(np.arange(1, seq), PREDICTIONS, replace=False).tolist())
            features = {
                "input_ids": ints(ids),
                "input_mask": ints([1] * seq),
                "segment_ids": ints([0] * (seq // 2) + [1] * (seq - seq // 2)),
                "masked_lm_positions": ints(positions),
                "masked_lm_ids": ints(rng.integers(5, VOCAB_SIZE, PREDICTIONS).tolist()),
                "masked_lm_weights": tf.train.Feature(
                    float_list=tf.train.FloatList(value=[1.0] * PREDICTIONS)
                ),
                "next_sentence_labels": ints([int(rng.integers(0, 2))]),
            }
            writer.write(
                tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()
            )
    return path


def prepare_ours(
    config,
    record_file,
    batch,
    seq,
    steps,
    jit_compile,
    mixed_precision,
    output_dir,
    num_accumulation_steps=1,
):
    """A compiled Trainer on the default strategy; returns a function timing one window of `steps` steps."""
    keras.mixed_precision.set_global_policy(mixed_precision)
    try:
        model, encoder = modeling.build_pretraining_model(config)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    optimizer = optimization.create_optimizer("adamw", 1e-4, 10**6, 100)
    loop = training_loop.LoopConfig(
        num_train_steps=2,
        steps_per_loop=steps,
        save_checkpoints_steps=10**9,
        jit_compile=jit_compile,
        num_accumulation_steps=num_accumulation_steps,
    )
    trainer = training_loop.Trainer(
        tf.distribute.get_strategy(),
        PretrainingObjective(model),
        optimizer,
        {"encoder": encoder, "pretraining_model": model},
        output_dir,
        loop,
        batch,
    )
    iterator = iter(
        input_pipeline.distributed_pretraining_dataset(
            tf.distribute.get_strategy(),
            [record_file],
            batch,
            seq,
            PREDICTIONS,
            is_training=True,
            seed=0,
        )
    )
    trainer.restore_or_initialize()
    trainer.save = lambda: None  # Checkpoint writing is not what this measures.
    trainer.train(iterator, log_fn=lambda line: None)  # Trace and compile.

    def window():
        trainer.config.num_train_steps += steps
        start = time.perf_counter()
        trainer.train(iterator, log_fn=lambda line: None)
        return steps * batch / (time.perf_counter() - start)

    return window


def prepare_keras_hub(config, batch, seq, steps, rng):
    """A compiled keras_hub BertMaskedLM (fit, jit_compile=True); returns a function timing one window."""
    import keras_hub

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=config.vocab_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        hidden_dim=config.hidden_size,
        intermediate_dim=config.intermediate_size,
        max_sequence_length=seq,
    )
    model = keras_hub.models.BertMaskedLM(backbone, preprocessor=None)
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[],
        jit_compile=True,
    )
    n = batch * steps
    x = {
        "token_ids": rng.integers(5, config.vocab_size, (n, seq)).astype("int32"),
        "padding_mask": np.ones((n, seq), "int32"),
        "segment_ids": np.zeros((n, seq), "int32"),
        "mask_positions": np.sort(rng.choice(np.arange(1, seq), (n, PREDICTIONS)), axis=1).astype(
            "int32"
        ),
    }
    y = rng.integers(5, config.vocab_size, (n, PREDICTIONS)).astype("int32")
    w = np.ones((n, PREDICTIONS), "float32")
    model.fit(
        {k: v[: batch * 2] for k, v in x.items()},
        y[: batch * 2],
        sample_weight=w[: batch * 2],
        batch_size=batch,
        epochs=1,
        verbose=0,
    )  # Compile.

    def window():
        start = time.perf_counter()
        model.fit(x, y, sample_weight=w, batch_size=batch, epochs=1, verbose=0)
        return n / (time.perf_counter() - start)

    return window


def prepare_hugging_face(torch_python, threads, config, batch, seq, steps):
    """(row label, a function timing one window, the peer to close) of the HF BertForPreTraining
    peer kept running in `torch_python`; None (it says why) when it does not start."""
    shape = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size,
        hidden_act="gelu_new",
        hidden_dropout_prob=config.hidden_dropout_prob,
        attention_probs_dropout_prob=config.attention_probs_dropout_prob,
        max_position_embeddings=config.max_position_embeddings,
        type_vocab_size=config.type_vocab_size,
        initializer_range=config.initializer_range,
    )
    request = dict(
        task="pretraining",
        threads=threads,
        shape=shape,
        batch=batch,
        seq_length=seq,
        predictions=PREDICTIONS,
        distinct_batches=8,
    )
    label = f"HF BertForPreTraining, PyTorch eager, {threads} threads, gelu_new, MLM+NSP"
    started = latency.start_peer(label, [torch_python, HF_PEER, json.dumps(request)])
    if not started:
        return None
    peer, versions = started
    return f"{label} ({versions})", lambda: steps * batch / peer(steps), peer


def main():
    """Times every contender in interleaved windows and prints the markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="mini")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument(
        "--variants",
        default="plain,xla",
        help="ours: xla (jit_compile), plain (no XLA), xla_bf16, plain_bf16; each may end in "
        "_accN (gradient accumulation in N micro-batches, e.g. plain_acc4)",
    )
    parser.add_argument(
        "--windows", type=int, default=3, help="timed windows per contender; the best counts"
    )
    parser.add_argument("--skip_keras_hub", action="store_true")
    parser.add_argument(
        "--torch_python",
        default="",
        help="a Python with torch + transformers for the HF BertForPreTraining row; empty: skipped",
    )
    parser.add_argument(
        "--torch_threads", type=int, default=2, help="torch.set_num_threads of the HF row"
    )
    flags = parser.parse_args()
    rng = np.random.default_rng(0)
    config = modeling.BertConfig.from_size(
        flags.size, VOCAB_SIZE, max_position_embeddings=max(512, flags.seq)
    )
    peak = matmul_peak_flops()
    flops = training_flops_per_example(config, flags.seq)
    hf_flops = training_flops_per_example(config, flags.seq, mlm_positions=flags.seq)
    rows, hf_row, peer = [], None, None
    with tempfile.TemporaryDirectory() as tmp:
        record_file = write_records(tmp, flags.batch * 8, flags.seq, rng)
        contenders = []
        if flags.torch_python:
            hugging_face = prepare_hugging_face(
                flags.torch_python, flags.torch_threads, config, flags.batch, flags.seq, flags.steps
            )
            if hugging_face:
                hf_row, hf_window, peer = hugging_face
                contenders.append((hf_row, hf_window))
        if not flags.skip_keras_hub:
            contenders.append(
                (
                    KERAS_HUB_ROW,
                    prepare_keras_hub(config, flags.batch, flags.seq, flags.steps, rng),
                )
            )
        for variant in flags.variants.split(","):
            name = variant
            variant, _, micro_batches = variant.partition("_acc")
            jit = variant.startswith("xla")
            policy = "mixed_bfloat16" if variant.endswith("bf16") else "float32"
            accumulation = f", {micro_batches} micro-batches" if micro_batches else ""
            contenders.append(
                (
                    f"bert_tf run_pretraining loop, {'jit_compile' if jit else 'no XLA'}, {policy}, "
                    f"MLM+NSP{accumulation}",
                    prepare_ours(
                        config,
                        record_file,
                        flags.batch,
                        flags.seq,
                        flags.steps,
                        jit,
                        policy,
                        os.path.join(tmp, name),
                        int(micro_batches or 1),
                    ),
                )
            )
        # The CPU is shared with other jobs: windows are interleaved so every contender sees the same
        # background load, and each reports its best window.
        best = {label: 0.0 for label, _ in contenders}
        try:
            for _ in range(flags.windows):
                for label, window in contenders:
                    best[label] = max(best[label], window())
        finally:
            if peer:
                peer.close()
        rows = list(best.items())
    peak = max(peak, matmul_peak_flops())
    print(
        f"\n{flags.size} (L{config.num_hidden_layers}/H{config.hidden_size}), seq {flags.seq}, global batch "
        f"{flags.batch}, {PREDICTIONS} predictions, vocab {VOCAB_SIZE}; {os.cpu_count()} CPU cores; "
        f"float32 matmul peak {peak / 1e9:.0f} GFLOP/s; {flops / 1e9:.2f} GFLOP per training example\n"
    )
    print("| run | examples/s | MFU (vs fp32 matmul peak) | vs keras-hub | vs HF |")
    print("|---|---:|---:|---:|---:|")
    for label, speed in rows:
        mfu = 100 * speed * (hf_flops if label == hf_row else flops) / peak
        print(
            f"| {label} | {speed:.1f} | {mfu:.1f}% | {ratio(speed, best.get(KERAS_HUB_ROW))} | "
            f"{ratio(speed, best.get(hf_row))} |"
        )
    if hf_row:
        print(
            f"\nHF's MFU counts {hf_flops / 1e9:.2f} GFLOP per example: its MLM head runs on all "
            f"{flags.seq} positions."
        )
    elif flags.torch_python:
        print(
            f"\nHF BertForPreTraining row skipped: its peer did not start in {flags.torch_python}."
        )
    else:
        print("\nHF BertForPreTraining row skipped: pass --torch_python (torch + transformers).")


def ratio(speed, reference):
    """`speed` as a multiple of `reference` ("-" without one)."""
    return f"{speed / reference:.2f}x" if reference else "-"


if __name__ == "__main__":
    main()
