"""Latency and throughput of a text model's call, shared by the benchmarks and their peer scripts.

No TensorFlow here: the Hugging Face peer's interpreter (torch, no TensorFlow) imports it too.
"""

import statistics
import time


def timings(call, sentences, batch_size, rounds, max_batches=None):
    """(batch-1 p50 ms, batch sentences/s) of `call(list of str)`, after a warm-up pass.

    Batch 1: one call per sentence, the median. Batches of `batch_size` (the first `max_batches`
    of them when given): the best of `rounds` passes.
    """
    batches = [sentences[i : i + batch_size] for i in range(0, len(sentences), batch_size)]
    if max_batches:
        batches = batches[:max_batches]
    for text in sentences[:8]:
        call([text])
    for batch in batches[:2]:
        call(batch)
    singles = []
    for text in sentences:
        start = time.perf_counter()
        call([text])
        singles.append(time.perf_counter() - start)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for batch in batches:
            call(batch)
        best = min(best, time.perf_counter() - start)
    return statistics.median(singles) * 1e3, sum(len(b) for b in batches) / best
