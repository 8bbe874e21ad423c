"""Merging concurrent requests to one signature into one call (--enable_batching)."""

import concurrent.futures
import dataclasses
import queue
import threading
import time

import numpy as np

from bert_tf.serving import errors

# Rows per call of a model: a bigger request runs in chunks of this many (--max_batch_size).
DEFAULT_MAX_BATCH_SIZE = 32


@dataclasses.dataclass(frozen=True)
class BatchingOptions:
    """How requests are merged: TF Serving's BatchingParameters, the subset that applies here."""

    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    batch_timeout_micros: int = 2000


def can_merge(signature):
    """Whether requests to a signature can be concatenated along dim 0 and the outputs split back.

    Not when an output has a size other than the batch that is unknown while every input's is
    known (NER's entities per row, say): that size comes from the data, so a merged call would pad
    each request's rows to the largest in the merged batch and a reply would depend on the other
    requests. Unknown input sizes are fine: only requests with equal ones are merged.
    """
    specs = list(signature.inputs.values()) + list(signature.outputs.values())
    if not signature.inputs or not all(
        s.shape.rank is not None and s.shape.rank >= 1 and s.shape[0] is None for s in specs
    ):
        return False

    def inner_sizes_known(spec):
        return None not in spec.shape.as_list()[1:]

    return all(inner_sizes_known(s) for s in signature.outputs.values()) or not all(
        inner_sizes_known(s) for s in signature.inputs.values()
    )


# Texts up to this many bytes are one length class; above it each class spans a factor of two.
_SHORTEST_LENGTH_CLASS_BYTES = 32


def _length_class(arrays):
    """A request's text length class: the bit length of its longest string (in bytes) / 32.

    A string model pads a merged call to its longest text, so merging one long request with short
    ones would make every short row pay for the long one's length. Only requests whose longest
    texts are within about a factor of two of each other are merged (bytes stand in for tokens,
    which the server cannot count). Requests without strings are one class: their shapes, part of
    the batching key already, say their lengths.
    """
    longest = 0
    for array in arrays.values():
        if array.dtype == object and array.size:
            longest = max(longest, max(len(x) for x in array.reshape(-1)))
    return (longest // _SHORTEST_LENGTH_CLASS_BYTES).bit_length()


class Batcher:
    """Merges concurrent requests to one signature into one call: waits up to `timeout_s` for more."""

    def __init__(self, signature, options, call, thread_name):
        self.signature = signature
        self.max_batch_size = options.max_batch_size
        self.timeout_s = options.batch_timeout_micros / 1e6
        self._call = call
        self._queue = queue.Queue()
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=thread_name, daemon=True)
        self._thread.start()

    def run(self, arrays):
        """Queues one request and waits for its outputs; after close() it runs on its own."""
        rows = {len(a) for a in arrays.values()}
        with self._lock:
            if self._closed or len(rows) != 1:
                future = None
            else:
                future = concurrent.futures.Future()
                self._queue.put((arrays, rows.pop(), future))
        if future is None:
            return self._call(self.signature, arrays)
        return future.result()

    def close(self):
        """Finishes what is queued, then stops the worker thread."""
        with self._lock:
            self._closed = True
            self._queue.put(None)

    def _loop(self):
        """Collects a batch (first request, then whatever arrives within the timeout) and runs it."""
        carry = None  # A request that would have made the last batch too big: it starts the next.
        while True:
            first, carry = (carry, None) if carry is not None else (self._queue.get(), None)
            if first is None:
                return
            batch, size, stop = [first], first[1], False
            deadline = time.monotonic() + self.timeout_s
            while size < self.max_batch_size:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                if size + item[1] > self.max_batch_size:
                    carry = item
                    break
                batch.append(item)
                size += item[1]
            self._run_batch(batch)
            if stop:
                while True:  # Serve anything queued before close() took the lock.
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        return
                    if item is not None:
                        self._run_batch([item])

    def _run_batch(self, batch):
        """Runs requests with equal trailing shapes and text lengths of one class together, and
        hands each its rows."""
        groups = {}
        for item in batch:
            key = tuple((name, a.shape[1:]) for name, a in sorted(item[0].items()))
            groups.setdefault((key, _length_class(item[0])), []).append(item)
        for items in groups.values():
            if len(items) == 1:
                self._run_alone(items[0])
                continue
            try:
                merged = {
                    name: np.concatenate([item[0][name] for item in items]) for name in items[0][0]
                }
                outputs = self._call(self.signature, merged)
                total = sum(item[1] for item in items)
                if any(np.ndim(v) == 0 or np.shape(v)[0] != total for v in outputs.values()):
                    raise errors.internal("batched outputs lost the batch dimension")
                start = 0
                for arrays, rows, future in items:
                    future.set_result(
                        {name: v[start : start + rows] for name, v in outputs.items()}
                    )
                    start += rows
            except Exception:  # One bad request must not fail the others: run each on its own.
                for item in items:
                    if not item[2].done():
                        self._run_alone(item)

    def _run_alone(self, item):
        """Runs one queued request by itself and resolves its future with the outputs or the error."""
        arrays, _, future = item
        try:
            future.set_result(self._call(self.signature, arrays))
        except Exception as e:  # The request's own error goes back to its handler thread.
            future.set_exception(e)
