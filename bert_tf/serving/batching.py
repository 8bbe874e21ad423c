"""Merging concurrent requests to one signature into one call: TF Serving's batching
(--enable_batching, --batching_parameters_file).

A Batcher is one signature's queue, as TF Serving's BatchingSession gives each signature a queue of
a SharedBatchScheduler (tensorflow/core/kernels/batching_util/shared_batch_scheduler.h): requests
join the open batch until it holds max_batch_size rows or its first request has waited
batch_timeout_micros; batch threads take closed batches in order; a request that finds
max_enqueued_batches batches waiting is UNAVAILABLE. A merged call is padded up to the next of
allowed_batch_sizes (the padding rows' outputs dropped), and with pad_variable_length_inputs inputs
whose sizes past the batch dimension differ are padded to the largest and merged
(batching_session.cc, batching_util.cc).

Ours, not TF Serving's: a batch's requests run as one call per group of equal shapes and text
length classes (see _length_class), so one long request does not make short ones pay for its
length; a merged call that fails runs each request alone, so one bad request does not fail the
others; each signature's queue has its own batch threads (TF Serving shares one pool among all
queues), started as concurrency needs them.
"""

import collections
import concurrent.futures
import dataclasses
import os
import threading
import time

import numpy as np
from absl import logging

from bert_tf.serving import errors

# Rows per call of a model: a bigger request runs in chunks of this many (--max_batch_size).
DEFAULT_MAX_BATCH_SIZE = 32

# What a BatchingParameters field left unset means: SharedBatchScheduler's QueueOptions defaults.
TF_SERVING_MAX_BATCH_SIZE = 1000
TF_SERVING_BATCH_TIMEOUT_MICROS = 0
TF_SERVING_MAX_ENQUEUED_BATCHES = 10

# shared_batch_scheduler.h's words for a full queue (UNAVAILABLE, HTTP 503).
QUEUE_FULL_MESSAGE = "The batch scheduling queue to which this task was submitted is full"


def default_num_batch_threads():
    """TF Serving's default number of batch threads: the cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # Not on Linux.
        return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class BatchingOptions:
    """How requests are merged: TF Serving's BatchingParameters, the fields that apply here."""

    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    batch_timeout_micros: int = 2000
    num_batch_threads: int = dataclasses.field(default_factory=default_num_batch_threads)
    max_enqueued_batches: int = TF_SERVING_MAX_ENQUEUED_BATCHES
    # Sizes a merged call is padded up to; the last must equal max_batch_size. Empty: no padding.
    allowed_batch_sizes: tuple = ()
    pad_variable_length_inputs: bool = False

    def __post_init__(self):
        object.__setattr__(self, "allowed_batch_sizes", tuple(self.allowed_batch_sizes))
        # TensorFlow's own checks and words (SharedBatchScheduler::Create and AddQueue).
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be positive; was {self.max_batch_size}")
        if self.batch_timeout_micros < 0:
            raise ValueError(
                f"batch_timeout_micros must be non-negative; was {self.batch_timeout_micros}"
            )
        if self.max_enqueued_batches < 0:
            raise ValueError(
                f"max_enqueued_batches must be non-negative; was {self.max_enqueued_batches}"
            )
        if self.num_batch_threads < 1:
            raise ValueError(f"num_batch_threads must be positive; was {self.num_batch_threads}")
        sizes = self.allowed_batch_sizes
        if sizes:
            # TF Serving checks the order only with large batch splitting (its TODO says it should
            # always); unordered sizes would pad a small batch to a big size, so it is checked here.
            if any(size < 1 for size in sizes) or any(a >= b for a, b in zip(sizes, sizes[1:])):
                raise ValueError("allowed_batch_sizes entries must be monotonically increasing")
            if sizes[-1] != self.max_batch_size:
                raise ValueError(
                    "Last entry in allowed_batch_sizes must match max_batch_size; last entry was "
                    f"{sizes[-1]}; expected {self.max_batch_size}"
                )


def options_from_batching_parameters(params):
    """BatchingOptions from a BatchingParameters message (protos.py); an unset field keeps TF
    Serving's default. Raises ValueError for values TF Serving refuses."""

    def value(field, default):
        return getattr(params, field).value if params.HasField(field) else default

    if value("enable_large_batch_splitting", False) or params.HasField("max_execution_batch_size"):
        # A request bigger than max_batch_size always runs in chunks of it here, one after the
        # other, which is what splitting gives; chunks are not split further to fill a batch.
        logging.info(
            "batching parameters: enable_large_batch_splitting and max_execution_batch_size are "
            "implied (requests run in chunks of max_batch_size rows)"
        )
    return BatchingOptions(
        max_batch_size=value("max_batch_size", TF_SERVING_MAX_BATCH_SIZE),
        batch_timeout_micros=value("batch_timeout_micros", TF_SERVING_BATCH_TIMEOUT_MICROS),
        num_batch_threads=value("num_batch_threads", default_num_batch_threads()),
        max_enqueued_batches=value("max_enqueued_batches", TF_SERVING_MAX_ENQUEUED_BATCHES),
        allowed_batch_sizes=tuple(params.allowed_batch_sizes),
        pad_variable_length_inputs=params.pad_variable_length_inputs,
    )


def can_merge(signature):
    """Whether requests to a signature can be concatenated along dim 0 and the outputs split back.

    Not when an output has a size other than the batch that is unknown while every input's is
    known (NER's entities per row, say): that size comes from the data, so a merged call would pad
    each request's rows to the largest in the merged batch and a reply would depend on the other
    requests. Unknown input sizes are fine: only requests with equal ones are merged (unless
    pad_variable_length_inputs asks for TF Serving's padding).
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
# The same for the sizes past the batch dimension of inputs padded by pad_variable_length_inputs.
_SHORTEST_SIZE_CLASS = 8


def _size_class(size, shortest):
    """0 for sizes below `shortest`, then one class per factor of two."""
    return (size // shortest).bit_length()


def _length_class(arrays, padded):
    """A request's length class: of its longest string (in bytes), and with `padded` of each
    input's sizes past the batch dimension.

    A merged call costs as much per row as its longest row (a string model pads to its longest
    text, padded inputs are padded to the largest), so merging one long request with short ones
    would make every short row pay for the long one. Only requests within about a factor of two of
    each other are merged (bytes stand in for tokens, which the server cannot count).
    """
    longest = 0
    for array in arrays.values():
        if array.dtype == object and array.size:
            longest = max(longest, max(len(x) for x in array.reshape(-1)))
    text_class = _size_class(longest, _SHORTEST_LENGTH_CLASS_BYTES)
    if not padded:
        return text_class
    sizes = tuple(
        tuple(_size_class(size, _SHORTEST_SIZE_CLASS) for size in array.shape[1:])
        for _, array in sorted(arrays.items())
    )
    return text_class, sizes


def allowed_batch_size(allowed_batch_sizes, rows):
    """The smallest allowed size that holds `rows` (batching_util.cc's
    RoundToLowestAllowedBatchSize); `rows` itself when none is given or none is big enough."""
    for size in allowed_batch_sizes:
        if size >= rows:
            return size
    return rows


def pad_inner(array, inner_shape):
    """`array` padded at the end of each dimension past the first up to `inner_shape`, with its
    first element, as TF Serving's pad_variable_length_inputs pads (batching_util.cc)."""
    if array.shape[1:] == tuple(inner_shape):
        return array
    if array.size == 0:
        raise errors.invalid_argument("Got empty tensor in batch of non-empty tensors.")
    padded = np.full((array.shape[0], *inner_shape), array.flat[0], dtype=array.dtype)
    padded[tuple(slice(0, size) for size in array.shape)] = array
    return padded


@dataclasses.dataclass
class _Task:
    """One queued request: its arrays, rows, and the future its handler waits on."""

    arrays: dict
    rows: int
    future: concurrent.futures.Future


@dataclasses.dataclass
class _Batch:
    """Queued tasks that run together; `start` is when the first one joined."""

    tasks: list = dataclasses.field(default_factory=list)
    rows: int = 0
    start: float = 0.0


class Batcher:
    """One signature's batching queue and its batch threads; `run` queues a request and waits."""

    def __init__(self, signature, options, call, thread_name):
        self.signature = signature
        self.options = options
        self.timeout_s = options.batch_timeout_micros / 1e6
        self._call = call
        self._thread_name = thread_name
        self._cond = threading.Condition()
        # As shared_batch_scheduler.h's Queue: the last batch is open, the ones before it closed.
        self._batches = collections.deque([_Batch()])
        self._closed = False
        self._threads = []
        self._idle = 0  # Batch threads waiting for a batch.

    @property
    def max_batch_size(self):
        """Most rows in one batch."""
        return self.options.max_batch_size

    def run(self, arrays):
        """Queues one request and waits for its outputs; after close() it runs on its own.

        UNAVAILABLE when max_enqueued_batches batches are already waiting, as in TF Serving.
        """
        rows = {len(a) if np.ndim(a) else -1 for a in arrays.values()}
        rows = rows.pop() if len(rows) == 1 else -1
        # Requests whose inputs disagree on the batch size run alone (the model reports the
        # error), and so do empty ones and ones over max_batch_size: requests arrive in chunks of
        # at most that, so only our own re-runs of a chunk with a few more rows are bigger.
        if not 0 < rows <= self.max_batch_size:
            return self._call(self.signature, arrays)
        task = _Task(arrays, rows, concurrent.futures.Future())
        with self._cond:
            if self._closed:
                task = None
            else:
                self._enqueue(task)
        if task is None:
            return self._call(self.signature, arrays)
        return task.future.result()

    def _enqueue(self, task):
        """Adds a task to the open batch, or to a new one; holds the lock."""
        open_batch = self._batches[-1]
        if open_batch.rows + task.rows > self.max_batch_size:
            if len(self._batches) >= self.options.max_enqueued_batches:
                raise errors.ServingError("UNAVAILABLE", QUEUE_FULL_MESSAGE)
            open_batch = _Batch()
            self._batches.append(open_batch)
        if not open_batch.tasks:
            open_batch.start = time.monotonic()
        open_batch.tasks.append(task)
        open_batch.rows += task.rows
        self._wake_or_start()

    def _wake_or_start(self):
        """Has a batch thread look at the queue: an idle one (it re-reads the open batch's
        deadline), else a new one while fewer than num_batch_threads run; holds the lock."""
        if self._idle:
            self._cond.notify()
        elif len(self._threads) < self.options.num_batch_threads:
            thread = threading.Thread(
                target=self._work, name=f"{self._thread_name}-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def close(self):
        """Runs what is queued, then lets the batch threads end."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _next_batch(self):
        """The front batch if it can run now (closing the open one when it is due), else None."""
        open_batch = self._batches[-1]
        if (
            len(self._batches) == 1
            and open_batch.tasks
            and (
                self._closed
                or open_batch.rows >= self.max_batch_size
                or time.monotonic() >= open_batch.start + self.timeout_s
            )
        ):
            self._batches.append(_Batch())
        if len(self._batches) >= 2:
            return self._batches.popleft()
        return None

    def _work(self):
        """A batch thread: takes batches as they become due and runs them, until close()."""
        while True:
            with self._cond:
                batch = self._next_batch()
                while batch is None:
                    open_batch = self._batches[-1]
                    if self._closed and not open_batch.tasks:
                        return
                    wait = None
                    if open_batch.tasks:
                        wait = max(0.0, open_batch.start + self.timeout_s - time.monotonic())
                    self._idle += 1
                    self._cond.wait(wait)
                    self._idle -= 1
                    batch = self._next_batch()
                if len(self._batches) >= 2 or self._batches[-1].tasks:
                    # Another batch waits: a thread must take it, or watch its deadline, while
                    # this one runs (TF Serving's num_batch_threads threads all run from the start).
                    self._wake_or_start()
            try:
                self._run_batch(batch)
            except Exception as e:  # A bug here must not leave the batch's clients waiting.
                logging.exception(
                    "batch thread %s: a batch failed", threading.current_thread().name
                )
                for task in batch.tasks:
                    if not task.future.done():
                        task.future.set_exception(errors.internal(f"batching failed: {e}"))

    def _run_batch(self, batch):
        """Runs a batch's requests: one call per group of equal shapes and length class."""
        padded = self.options.pad_variable_length_inputs
        groups = {}
        for task in batch.tasks:
            items = sorted(task.arrays.items())
            shapes = tuple(
                (name, a.dtype.str, a.ndim if padded else a.shape[1:]) for name, a in items
            )
            groups.setdefault((shapes, _length_class(task.arrays, padded)), []).append(task)
        for tasks in groups.values():
            self._run_group(tasks)

    def _run_group(self, tasks):
        """Runs tasks as one call padded to an allowed batch size, and hands each its rows."""
        rows = sum(task.rows for task in tasks)
        size = allowed_batch_size(self.options.allowed_batch_sizes, rows)
        if len(tasks) == 1 and size == rows:
            self._run_alone(tasks[0])
            return
        try:
            outputs = self._call(self.signature, self._merge(tasks, size - rows))
            if any(np.ndim(v) == 0 or np.shape(v)[0] != size for v in outputs.values()):
                raise errors.internal("batched outputs lost the batch dimension")
            start = 0
            for task in tasks:  # The padding rows' outputs, at the end, are dropped.
                task.future.set_result(
                    {name: v[start : start + task.rows] for name, v in outputs.items()}
                )
                start += task.rows
        except Exception:  # One bad request must not fail the others: run each on its own.
            for task in tasks:
                if not task.future.done():
                    self._run_alone(task)

    def _merge(self, tasks, padding_rows):
        """The tasks' inputs concatenated along dim 0 (padded past it with
        pad_variable_length_inputs), then `padding_rows` copies of the last task's first row."""
        merged = {}
        for name in tasks[0].arrays:
            parts = [task.arrays[name] for task in tasks]
            if self.options.pad_variable_length_inputs:
                inner = tuple(max(sizes) for sizes in zip(*(part.shape[1:] for part in parts)))
                parts = [pad_inner(part, inner) for part in parts]
            if padding_rows:
                # batching_session.cc pads with a row of the batch: a valid input for the model.
                parts.append(np.repeat(parts[-1][:1], padding_rows, axis=0))
            merged[name] = np.concatenate(parts)
        return merged

    def _run_alone(self, task):
        """Runs one queued request by itself and resolves its future with the outputs or the error."""
        try:
            task.future.set_result(self._call(self.signature, task.arrays))
        except Exception as e:  # The request's own error goes back to its handler thread.
            task.future.set_exception(e)
