"""Latency and throughput of text models' calls, measured in pairs, shared by the benchmarks and their peers.

The 2-core machines these run on drift by 10% to 40% within minutes, so rows timed one after
another compare badly: paired_timings runs every row on the same input back to back, in rotating
order, so that drift falls on all rows alike. A peer in another interpreter (Hugging Face on
PyTorch) joins the pairs through serve_timed_calls, timing its own calls.

No TensorFlow here: the Hugging Face peer's interpreter (torch, no TensorFlow) imports it too.
"""

import json
import statistics
import subprocess
import sys
import time


def timed(call):
    """`call(list of str)` as a function that returns the seconds the call took."""

    def run(texts):
        start = time.perf_counter()
        call(texts)
        return time.perf_counter() - start

    return run


def serve_timed_calls(call, stdin=sys.stdin, stdout=sys.stdout):
    """The peer's side of paired_timings: for each JSON list of texts (or other request) on stdin,
    calls `call` on it and writes the seconds it took as one JSON line."""
    run = timed(call)
    for line in stdin:
        stdout.write(json.dumps(run(json.loads(line))) + "\n")
        stdout.flush()


class PeerProcess:
    """A peer interpreter running serve_timed_calls: calling it with texts returns its seconds."""

    def __init__(self, popen):
        self.process = popen

    def __call__(self, texts):
        try:
            self.process.stdin.write(json.dumps(texts) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except OSError as error:  # a broken pipe: the peer is gone
            raise RuntimeError(f"the peer exited with {self.process.wait()}") from error
        if not line:
            raise RuntimeError(f"the peer exited with {self.process.wait()}")
        return json.loads(line)

    def close(self):
        """Ends the peer (it exits when its stdin closes), killing it if it does not within 30 s."""
        try:
            self.process.stdin.close()
        except OSError:
            pass  # it exited already
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_peer(name, command):
    """(a PeerProcess, its first line) for `command`, a peer that writes one JSON line (its
    versions) and then runs serve_timed_calls; None, saying why on stderr, when it does not start."""
    try:
        process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
    except OSError as error:
        print(f"{name} skipped: {error}", file=sys.stderr)
        return None
    first = process.stdout.readline()
    if not first:
        print(f"{name} skipped: its peer exited with {process.wait()}", file=sys.stderr)
        return None
    return PeerProcess(process), json.loads(first)


# Batch-1 calls run in blocks of this many sentences per row: a row's first call after another
# row's finds the caches holding the other's weights (MiniLM's float32 weights exceed this
# machine's 32 MB L3), which a server answering a stream of requests would not see every time.
BLOCK = 8


def paired_timings(runs, sentences, batch_size, rounds, max_batches=None, block=BLOCK):
    """{name: (batch-1 p50 ms, batch sentences/s)} of `runs` {name: texts -> seconds}, in pairs.

    Batch 1: one call per sentence, the rows taking turns (in rotating order) on each block of
    `block` sentences; the median per row. Batches of `batch_size` (the first `max_batches` of
    them when given, for every row alike): the rows take turns on each batch; the best of
    `rounds` passes per row. A warm-up pass runs first: every row on every sentence and every
    batch, as a server in steady state has seen requests of every length: the first call of a
    TensorFlow graph at a new length pays about 1.5 ms more, for oneDNN's kernels of that shape
    (benchmarks/RESULTS.md, "Inference: what each export choice buys").
    """
    names = list(runs)
    batches = [sentences[i : i + batch_size] for i in range(0, len(sentences), batch_size)]
    if max_batches:
        batches = batches[:max_batches]
    blocks = [sentences[i : i + block] for i in range(0, len(sentences), block)]

    def in_turn(turn, inputs):
        """{name: [seconds of each input]}: each row on all of `inputs`, the rows in turn."""
        shift = turn % len(names)
        return {name: [runs[name](x) for x in inputs] for name in names[shift:] + names[:shift]}

    in_turn(0, [[text] for text in sentences] + batches)
    singles = {name: [] for name in names}
    for turn, texts in enumerate(blocks):
        for name, seconds in in_turn(turn, [[text] for text in texts]).items():
            singles[name] += seconds
    best = {name: float("inf") for name in names}
    for round_index in range(rounds):
        totals = {name: 0.0 for name in names}
        for turn, batch in enumerate(batches):
            for name, seconds in in_turn(turn + round_index, [batch]).items():
                totals[name] += seconds[0]
        best = {name: min(best[name], totals[name]) for name in names}
    rows = sum(len(b) for b in batches)
    return {name: (statistics.median(singles[name]) * 1e3, rows / best[name]) for name in names}
