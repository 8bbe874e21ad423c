"""TF Serving's batching (bert_tf/serving/batching.py): real Batchers on real threads, then the server.

The unit tests give a Batcher its real interface, a `call(signature, {name: array})` returning
{name: array}: here a plain function of numpy arrays (y = 2x), which records its inputs. They order
requests with Events and by waiting until a request is in the queue, never by how long a sleep is.
The rules come from TF Serving (tensorflow_serving/batching/batching_session.cc, batching_util.cc,
servables/tensorflow/bundle_factory_util.cc) and TensorFlow's
core/kernels/batching_util/shared_batch_scheduler.h; each test cites the one it checks.
"""

import concurrent.futures
import contextlib
import http.client
import itertools
import json
import os
import re
import threading
import time
import types

import numpy as np
import pytest
import tensorflow as tf
from absl import flags
from helpers_serve import make_base

from bert_tf import serve
from bert_tf.runtime import cli
from bert_tf.runtime.io_utils import UsageError
from bert_tf.serving import batching, errors, protos, server_flags
from bert_tf.serving import servable as servable_module

SIGNATURE = types.SimpleNamespace(name="sig")  # A Batcher only hands its signature to `call`.
WAIT_S = 10  # Longest any step may take before the test fails (never reached when all is well).


# ----------------------------------------------------------------------------------------------
# A model for the Batcher, and helpers
# ----------------------------------------------------------------------------------------------


class Doubler:
    """`call` for a Batcher: {"y": 2x, "s": row sums of x}, recording each call's inputs.

    A call whose first value is `hold_value` sets `entered` and waits for `release`, so a test
    can keep a batch thread busy while it fills the queue. A negative value in a call is the
    model's INVALID_ARGUMENT, as a real model refuses a bad row.
    """

    def __init__(self, hold_value=None):
        self.calls = []  # The "x" of each call, in the order the calls started.
        self.hold_value = hold_value
        self.entered = threading.Event()
        self.release = threading.Event()
        self.active = 0  # Calls running now,
        self.most_active = 0  # and the most that ever ran at once.
        self._lock = threading.Lock()

    def __call__(self, signature, arrays):
        assert signature is SIGNATURE
        x = arrays["x"]
        with self._lock:
            self.calls.append(x.copy())
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        try:
            if self.hold_value is not None and x.size and x.flat[0] == self.hold_value:
                self.entered.set()
                assert self.release.wait(WAIT_S), "the test never released the held call"
            if (x < 0).any() and x.flat[0] != self.hold_value:
                raise errors.invalid_argument("x must be non-negative")
            return {"y": x * 2, "s": x.reshape(len(x), -1).sum(axis=1)}
        finally:
            with self._lock:
                self.active -= 1


def rows(n, first, width=2):
    """A request of `n` rows of `width` consecutive values starting at `first`."""
    return {"x": np.arange(first, first + n * width, dtype=np.float32).reshape(n, width)}


def expected(request):
    """What Doubler answers a request run on its own."""
    x = request["x"]
    return {"y": x * 2, "s": x.reshape(len(x), -1).sum(axis=1)}


def assert_outputs(got, want):
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@contextlib.contextmanager
def make_batcher(model, call=None, **options):
    """A Batcher calling `call` (by default `model`) with BatchingOptions(**options); closed (and
    the model released) after."""
    options = batching.BatchingOptions(**options)
    thread_name = f"test-batcher-{next(_BATCHER_NUMBERS)}"
    batcher = batching.Batcher(SIGNATURE, options, call or model, thread_name)
    try:
        yield batcher
    finally:
        model.release.set()
        batcher.close()
        for thread in batch_threads(batcher):
            thread.join(WAIT_S)


_BATCHER_NUMBERS = itertools.count()


@pytest.fixture
def pool():
    """Client threads: each submitted batcher.run is one concurrent request."""
    with concurrent.futures.ThreadPoolExecutor(8) as executor:
        yield executor


def wait_until_queued(batcher, queued_rows):
    """Waits until the batcher's queue (its deque of batches, as shared_batch_scheduler.h's Queue)
    holds `queued_rows` rows: a submitted request is then in a batch, whatever the threads' timing."""
    deadline = time.monotonic() + WAIT_S
    while True:
        with batcher._cond:
            queued = sum(batch.rows for batch in batcher._batches)
        if queued == queued_rows:
            return
        assert time.monotonic() < deadline, f"{queued} rows queued, expected {queued_rows}"
        time.sleep(0.001)


def wait_until_idle(batcher, threads):
    """Waits until `threads` of the batcher's batch threads wait for work (or for the open batch's
    timeout)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        with batcher._cond:
            idle = batcher._idle
        if idle == threads:
            return
        assert time.monotonic() < deadline, f"{idle} batch threads idle, expected {threads}"
        time.sleep(0.001)


def batch_threads(batcher):
    """The live batch threads of a Batcher (named after the name it was given)."""
    return [t for t in threading.enumerate() if t.name.startswith(f"{batcher._thread_name}-")]


def assert_concatenation(merged, parts):
    """`merged` is the `parts` one after the other, in some order; returns the rows that follow."""
    pending, position = list(parts), 0
    while pending:
        found = [
            i for i, p in enumerate(pending) if _equal(merged[position : position + len(p)], p)
        ]
        assert found, f"{merged!r} at {position} is none of {pending!r}"
        part = pending.pop(found[0])
        position += len(part)
    return part, merged[position:]


def _equal(a, b):
    return len(a) == len(b) and np.array_equal(np.asarray(a), np.asarray(b))


# ----------------------------------------------------------------------------------------------
# 1. Merging
# ----------------------------------------------------------------------------------------------


def test_concurrent_requests_are_merged_into_one_call_and_each_gets_its_own_rows(pool):
    # A batch runs once it holds max_batch_size rows, or once its first request has waited
    # batch_timeout_micros (shared_batch_scheduler.h, Queue::IsOpenBatchSchedulable): these four
    # fill it, so they run together long before the 30 s timeout.
    model = Doubler()
    requests = [rows(1, 0), rows(2, 100), rows(3, 200), rows(2, 300)]
    with make_batcher(model, max_batch_size=8, batch_timeout_micros=30_000_000) as batcher:
        futures = [pool.submit(batcher.run, request) for request in requests]
        results = [future.result(timeout=WAIT_S) for future in futures]
    assert len(model.calls) == 1 and model.calls[0].shape == (8, 2), model.calls
    # The call holds every request's rows, each request's together (in the order they came).
    _, rest = assert_concatenation(model.calls[0], [r["x"] for r in requests])
    assert len(rest) == 0
    for request, result in zip(requests, results):
        assert_outputs(result, expected(request))


def test_a_batch_that_is_not_full_runs_once_its_first_request_waited_the_timeout(pool):
    # The open batch is closed when batch_timeout_micros have passed since its first task
    # (shared_batch_scheduler.h): requests within that time are merged, none waits much longer.
    model = Doubler()
    timeout_s = 0.2
    with make_batcher(model, max_batch_size=8, batch_timeout_micros=int(timeout_s * 1e6)) as b:
        start = time.monotonic()
        first = pool.submit(b.run, rows(1, 0))
        wait_until_queued(b, 1)
        second = pool.submit(b.run, rows(2, 10))
        assert_outputs(first.result(timeout=WAIT_S), expected(rows(1, 0)))
        assert_outputs(second.result(timeout=WAIT_S), expected(rows(2, 10)))
        waited = time.monotonic() - start
    assert [len(x) for x in model.calls] == [3]
    assert timeout_s <= waited < WAIT_S


# ----------------------------------------------------------------------------------------------
# 2. allowed_batch_sizes
# ----------------------------------------------------------------------------------------------


def test_allowed_batch_sizes_pad_a_call_with_a_row_of_the_batch_and_drop_its_outputs(pool):
    # batching_session.cc (MergeInputTensors): a batch is padded up to RoundToLowestAllowedBatchSize
    # (batching_util.cc) with copies of the first row of the batch's last task; SplitOutputTensors
    # drops the padding rows' outputs. The held call keeps the only batch thread busy while the next batch fills.
    model = Doubler(hold_value=-1)
    options = dict(max_batch_size=8, allowed_batch_sizes=(2, 4, 8), num_batch_threads=1)
    with make_batcher(model, batch_timeout_micros=0, **options) as batcher:
        blocker = pool.submit(batcher.run, {"x": np.full((1, 2), -1.0, np.float32)})
        assert model.entered.wait(WAIT_S)
        first = pool.submit(batcher.run, rows(1, 10))
        wait_until_queued(batcher, 1)
        last = pool.submit(batcher.run, rows(2, 20))
        wait_until_queued(batcher, 3)
        model.release.set()
        blocked = blocker.result(timeout=WAIT_S)
        results = first.result(timeout=WAIT_S), last.result(timeout=WAIT_S)
    # One row alone is padded to 2, the next three rows to 4.
    assert [len(x) for x in model.calls] == [2, 4]
    np.testing.assert_array_equal(model.calls[0], np.full((2, 2), -1.0))
    np.testing.assert_array_equal(
        model.calls[1], np.concatenate([rows(1, 10)["x"], rows(2, 20)["x"], rows(2, 20)["x"][:1]])
    )
    # Each reply has its own rows only, none of the padding's.
    assert_outputs(blocked, expected({"x": np.full((1, 2), -1.0, np.float32)}))
    assert_outputs(results[0], expected(rows(1, 10)))
    assert_outputs(results[1], expected(rows(2, 20)))


@pytest.mark.parametrize(
    "allowed,rows_in_batch,size",
    [((2, 4, 8), 1, 2), ((2, 4, 8), 3, 4), ((2, 4, 8), 4, 4), ((2, 4, 8), 8, 8), ((), 5, 5)],
)
def test_allowed_batch_size_is_the_smallest_that_holds_the_batch(allowed, rows_in_batch, size):
    # batching_util.cc, RoundToLowestAllowedBatchSize.
    assert batching.allowed_batch_size(allowed, rows_in_batch) == size


@pytest.mark.parametrize(
    "max_batch_size,allowed,message",
    [
        # bundle_factory_util.cc (WrapSessionForBatching) and batching_session.cc.
        (
            8,
            (2, 4),
            "Last entry in allowed_batch_sizes must match max_batch_size; last entry was 4; "
            "expected 8",
        ),
        (8, (4, 2, 8), "allowed_batch_sizes entries must be monotonically increasing"),
        (8, (4, 4, 8), "allowed_batch_sizes entries must be monotonically increasing"),
        # TF's loop checks only the order; a size below 1 is refused here in the same words.
        (8, (0, 8), "allowed_batch_sizes entries must be monotonically increasing"),
        (8, (-2, 8), "allowed_batch_sizes entries must be monotonically increasing"),
    ],
    ids=["last_not_max", "decreasing", "repeated", "zero", "negative"],
)
def test_bad_allowed_batch_sizes_are_refused_with_tf_serving_s_words(
    max_batch_size, allowed, message
):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        batching.BatchingOptions(max_batch_size=max_batch_size, allowed_batch_sizes=allowed)


@pytest.mark.parametrize(
    "field,value,message",
    [
        # TensorFlow's batch schedulers (shared_batch_scheduler.h: Create, AddQueue, where
        # max_batch_size is input_batch_size_limit; basic_batch_scheduler.h).
        ("max_batch_size", 0, "max_batch_size must be positive; was 0"),
        ("batch_timeout_micros", -1, "batch_timeout_micros must be non-negative; was -1"),
        ("max_enqueued_batches", -1, "max_enqueued_batches must be non-negative; was -1"),
        ("num_batch_threads", 0, "num_batch_threads must be positive; was 0"),
    ],
)
def test_bad_batching_options_are_refused_with_tensorflow_s_words(field, value, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        batching.BatchingOptions(**{field: value})


# ----------------------------------------------------------------------------------------------
# 3. max_enqueued_batches
# ----------------------------------------------------------------------------------------------


def test_a_request_that_finds_max_enqueued_batches_waiting_is_unavailable(pool):
    # shared_batch_scheduler.h (Queue::ValidateBatchTaskQueueCapacity): a task that does not fit
    # the open batch while max_enqueued_batches batches (the open one included) wait is refused
    # with UNAVAILABLE, which TF Serving's REST API answers with 503 (http_server.cc).
    model = Doubler(hold_value=-1)
    options = dict(max_batch_size=2, max_enqueued_batches=2, num_batch_threads=1)
    with make_batcher(model, batch_timeout_micros=0, **options) as batcher:
        blocker = pool.submit(batcher.run, {"x": np.full((2, 1), -1.0, np.float32)})
        assert model.entered.wait(WAIT_S)  # Running, so no longer in the queue.
        waiting = [pool.submit(batcher.run, rows(2, 0))]
        wait_until_queued(batcher, 2)  # One batch: the open one, full.
        waiting.append(pool.submit(batcher.run, rows(2, 10)))
        wait_until_queued(batcher, 4)  # Two batches.
        with pytest.raises(errors.ServingError) as refused:
            batcher.run(rows(1, 20))
        assert refused.value.code == "UNAVAILABLE"
        assert refused.value.message.startswith(batching.QUEUE_FULL_MESSAGE)
        assert refused.value.http_status == 503
        model.release.set()
        blocker.result(timeout=WAIT_S)
        assert_outputs(waiting[0].result(timeout=WAIT_S), expected(rows(2, 0)))
        assert_outputs(waiting[1].result(timeout=WAIT_S), expected(rows(2, 10)))
        # Once the queue has drained, requests are taken again.
        assert_outputs(batcher.run(rows(1, 20)), expected(rows(1, 20)))
    assert [len(x) for x in model.calls] == [2, 2, 2, 1]


# ----------------------------------------------------------------------------------------------
# 4. pad_variable_length_inputs
# ----------------------------------------------------------------------------------------------


def test_pad_variable_length_inputs_pads_to_the_largest_with_the_first_element(pool):
    # batching_session.cc (MergeInputTensors): with pad_variable_length_inputs, each task's tensor
    # is padded at the end of every dimension past the first to the batch's largest size, with
    # its own first element (batching_util.cc, PadTensor: `pad_value(input.flat<T>()(0))`).
    # Outputs are split along dimension 0 only, so they keep the padded sizes.
    model = Doubler()
    short = {"x": np.array([[1, 2], [3, 4]], np.float32)}
    long = {"x": np.array([[5, 6, 7, 8]], np.float32)}
    options = dict(max_batch_size=3, batch_timeout_micros=30_000_000)
    with make_batcher(model, pad_variable_length_inputs=True, **options) as batcher:
        futures = [pool.submit(batcher.run, short)]
        wait_until_queued(batcher, 2)
        futures.append(pool.submit(batcher.run, long))  # Fills the batch.
        results = [future.result(timeout=WAIT_S) for future in futures]
    short_padded = {"x": np.array([[1, 2, 1, 1], [3, 4, 1, 1]], np.float32)}
    assert len(model.calls) == 1
    np.testing.assert_array_equal(model.calls[0], np.concatenate([short_padded["x"], long["x"]]))
    assert_outputs(results[0], expected(short_padded))
    assert_outputs(results[1], expected(long))


def test_without_pad_variable_length_inputs_other_shapes_run_in_separate_calls(pool):
    # batching_session.cc refuses to merge tensors whose sizes past dim 0 differ unless padding is
    # on; here such requests of one batch run as one call per shape instead.
    model = Doubler()
    short = {"x": np.array([[1, 2], [3, 4]], np.float32)}
    long = {"x": np.array([[5, 6, 7, 8]], np.float32)}
    with make_batcher(model, max_batch_size=3, batch_timeout_micros=30_000_000) as batcher:
        futures = [pool.submit(batcher.run, short)]
        wait_until_queued(batcher, 2)
        futures.append(pool.submit(batcher.run, long))  # Fills the batch.
        results = [future.result(timeout=WAIT_S) for future in futures]
    assert [x.shape for x in model.calls] == [(2, 2), (1, 4)]
    assert_outputs(results[0], expected(short))
    assert_outputs(results[1], expected(long))


# ----------------------------------------------------------------------------------------------
# 5. num_batch_threads
# ----------------------------------------------------------------------------------------------


def test_one_batch_thread_runs_batches_one_at_a_time(pool):
    # shared_batch_scheduler.h: batches run on num_batch_threads threads; with one, a closed batch
    # waits for the running one to finish.
    model = Doubler(hold_value=-1)
    options = dict(max_batch_size=1, num_batch_threads=1)
    with make_batcher(model, batch_timeout_micros=0, **options) as batcher:
        first = pool.submit(batcher.run, {"x": np.full((1, 2), -1.0, np.float32)})
        assert model.entered.wait(WAIT_S)
        second = pool.submit(batcher.run, rows(1, 0))
        wait_until_queued(batcher, 1)
        time.sleep(0.05)  # Time a second thread would have needed to start the waiting batch.
        assert len(model.calls) == 1 and len(batch_threads(batcher)) == 1
        model.release.set()
        first.result(timeout=WAIT_S)
        assert_outputs(second.result(timeout=WAIT_S), expected(rows(1, 0)))
    assert len(model.calls) == 2 and model.most_active == 1


def calls_that_meet(model, parties=2):
    """A call of `model` that returns only once `parties` calls run at the same time."""
    all_running = threading.Barrier(parties, timeout=WAIT_S)

    def call(signature, arrays):
        outputs = model(signature, arrays)
        all_running.wait()
        return outputs

    return call


def test_a_ready_batch_gets_a_second_thread_while_the_first_one_runs(pool):
    # shared_batch_scheduler.h starts all num_batch_threads threads with the scheduler, so a batch
    # that is ready while one thread runs another starts at once on a second thread. Here the one
    # thread waits for the open batch's timeout when a request closes that batch and fills a
    # second one: both batches are ready, and each must get a thread.
    model = Doubler()
    call = calls_that_meet(model)
    options = dict(max_batch_size=2, num_batch_threads=2)
    with make_batcher(model, call, batch_timeout_micros=30_000_000, **options) as batcher:
        first = pool.submit(batcher.run, rows(1, 0))
        wait_until_queued(batcher, 1)
        wait_until_idle(batcher, 1)  # Its one thread waits for the open batch's timeout.
        second = pool.submit(batcher.run, rows(2, 10))  # Does not fit: a second batch, full.
        assert_outputs(first.result(timeout=WAIT_S), expected(rows(1, 0)))
        assert_outputs(second.result(timeout=WAIT_S), expected(rows(2, 10)))
    assert [len(x) for x in model.calls] == [1, 2]


def test_two_batch_threads_run_two_batches_at_once(pool):
    model = Doubler()
    call = calls_that_meet(model)
    options = dict(max_batch_size=1, num_batch_threads=2)
    with make_batcher(model, call, batch_timeout_micros=0, **options) as batcher:
        futures = [pool.submit(batcher.run, rows(1, first)) for first in (0, 10)]
        assert_outputs(futures[0].result(timeout=WAIT_S), expected(rows(1, 0)))
        assert_outputs(futures[1].result(timeout=WAIT_S), expected(rows(1, 10)))
        assert len(batch_threads(batcher)) == 2
    assert len(model.calls) == 2


# ----------------------------------------------------------------------------------------------
# 6. A failing merged call
# ----------------------------------------------------------------------------------------------


def test_a_failing_merged_call_runs_each_request_alone_so_a_bad_one_fails_only_itself(pool):
    model = Doubler()
    good, bad, other = rows(1, 0), {"x": np.array([[-5, 1]], np.float32)}, rows(1, 10)
    with make_batcher(model, max_batch_size=3, batch_timeout_micros=30_000_000) as batcher:
        futures = [pool.submit(batcher.run, good)]
        wait_until_queued(batcher, 1)
        futures.append(pool.submit(batcher.run, bad))
        wait_until_queued(batcher, 2)
        futures.append(pool.submit(batcher.run, other))  # Fills the batch.
        assert_outputs(futures[0].result(timeout=WAIT_S), expected(good))
        with pytest.raises(errors.ServingError, match="x must be non-negative") as refused:
            futures[1].result(timeout=WAIT_S)
        assert_outputs(futures[2].result(timeout=WAIT_S), expected(other))
    assert refused.value.code == "INVALID_ARGUMENT"
    # The merged call, then each request on its own.
    assert [len(x) for x in model.calls] == [3, 1, 1, 1]
    np.testing.assert_array_equal(model.calls[2], bad["x"])


# ----------------------------------------------------------------------------------------------
# 7. BatchingParameters
# ----------------------------------------------------------------------------------------------


def test_unset_batching_parameters_take_tf_serving_s_defaults():
    # bundle_factory_util.h (GetQueueOptions, CreateBatchScheduler) copies a field only when it is
    # set; otherwise shared_batch_scheduler.h's defaults hold: input_batch_size_limit = 1000,
    # batch_timeout_micros = 0, max_enqueued_batches = 10, num_batch_threads =
    # port::MaxParallelism() (the cores this process may use).
    options = batching.options_from_batching_parameters(protos.BatchingParameters())
    assert options == batching.BatchingOptions(
        max_batch_size=1000,
        batch_timeout_micros=0,
        num_batch_threads=len(os.sched_getaffinity(0)),
        max_enqueued_batches=10,
        allowed_batch_sizes=(),
        pad_variable_length_inputs=False,
    )


def test_set_batching_parameters_carry_over():
    params = protos.BatchingParameters(allowed_batch_sizes=[4, 16], pad_variable_length_inputs=True)
    params.max_batch_size.value = 16
    params.batch_timeout_micros.value = 5000
    params.max_enqueued_batches.value = 3
    params.num_batch_threads.value = 2
    assert batching.options_from_batching_parameters(params) == batching.BatchingOptions(
        max_batch_size=16,
        batch_timeout_micros=5000,
        num_batch_threads=2,
        max_enqueued_batches=3,
        allowed_batch_sizes=(4, 16),
        pad_variable_length_inputs=True,
    )
    # An unset max_batch_size is TF Serving's 1000, which the last allowed size must then match
    # (bundle_factory_util.cc uses QueueOptions().input_batch_size_limit).
    with pytest.raises(ValueError, match="last entry was 16; expected 1000"):
        batching.options_from_batching_parameters(
            protos.BatchingParameters(allowed_batch_sizes=[4, 16])
        )


def test_a_batching_parameters_file_becomes_options(tmp_path):
    # The example of TF Serving's serving_config.md ("Batching Configuration").
    path = tmp_path / "batching.config"
    path.write_text(
        "max_batch_size { value: 128 }\n"
        "batch_timeout_micros { value: 0 }\n"
        "max_enqueued_batches { value: 1000000 }\n"
        "num_batch_threads { value: 8 }\n"
        "allowed_batch_sizes: 32\n"
        "allowed_batch_sizes: 128\n"
    )
    params = protos.parse_text_file(
        str(path), protos.BatchingParameters, "batching_parameters_file"
    )
    assert batching.options_from_batching_parameters(params) == batching.BatchingOptions(
        max_batch_size=128,
        batch_timeout_micros=0,
        num_batch_threads=8,
        max_enqueued_batches=1000000,
        allowed_batch_sizes=(32, 128),
    )


# ----------------------------------------------------------------------------------------------
# 8. Through the server
# ----------------------------------------------------------------------------------------------


def serve_args(*argv):
    """ServeArgs from command-line flags, as `python -m bert_tf.serve` reads them."""
    flag_values = flags.FlagValues()
    cli.define_flags(server_flags.ServeArgs, flag_values=flag_values)
    flag_values(["serve", *argv])
    return cli.args_from_flags(server_flags.ServeArgs, flag_values)


def post(port, path, body):
    """POSTs a JSON body; returns (status, parsed reply)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", path, body=json.dumps(body))
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def record_calls(monkeypatch):
    """Records (signature name, texts of its tf.Examples) of every model call the server makes."""
    calls, real = [], servable_module.call_signature

    def recording(signature, arrays):
        texts = [
            tf.train.Example.FromString(s).features.feature["text"].bytes_list.value[0].decode()
            for s in next(iter(arrays.values()))
        ]
        calls.append((signature.name, texts))
        return real(signature, arrays)

    monkeypatch.setattr(servable_module, "call_signature", recording)
    return calls


def assert_merged_and_padded(call_texts, requests):
    """One call holding every request's texts, each request's together, then padding copies of the
    first text of the last request up to an allowed size (batching_session.cc)."""
    assert len(call_texts) == 4, call_texts  # 3 rows, padded to allowed size 4.
    last, padding = assert_concatenation(call_texts, requests)
    assert list(padding) == [last[0]], call_texts


def test_classify_and_regress_through_the_server_are_merged_and_padded(
    tmp_path, exports, monkeypatch
):
    batching_file = tmp_path / "batching.config"
    batching_file.write_text(
        "max_batch_size { value: 8 }\n"
        "batch_timeout_micros { value: 300000 }\n"
        "allowed_batch_sizes: 4\n"
        "allowed_batch_sizes: 8\n"
    )
    args = serve_args(
        f"--model_base_path={make_base(tmp_path, exports)}",
        "--model_name=clf",
        f"--batching_parameters_file={batching_file}",
        "--rest_api_port=0",
        "--port=0",
        "--file_system_poll_wait_seconds=0",
        "--noenable_model_warmup",
    )
    # Texts of about one length (tf.Examples of under 32 bytes, one length class of batching.py):
    # requests of far apart lengths would not be merged.
    classify = [["a fine film"], ["dull and slow", "quite good"]]
    regress = [["not bad"], ["loved it"], ["too long"]]
    requests = [("classify", "classification", texts) for texts in classify] + [
        ("regress", "regression", texts) for texts in regress
    ]

    def send(request, barrier=None):
        if barrier is not None:
            barrier.wait(WAIT_S)
        verb, signature_name, texts = request
        body = {"signature_name": signature_name, "examples": [{"text": t} for t in texts]}
        return post(server.port, f"/v1/models/clf:{verb}", body)

    calls = record_calls(monkeypatch)
    with serve.build_server(args) as server:
        # All at once: each signature's requests come within its batch_timeout_micros.
        start = threading.Barrier(len(requests))
        with concurrent.futures.ThreadPoolExecutor(len(requests)) as clients:
            futures = [clients.submit(send, request, start) for request in requests]
            together = [future.result(timeout=60) for future in futures]
        merged_calls = list(calls)
        alone = [send(request) for request in requests]
        alone_calls = calls[len(merged_calls) :]
    by_signature = {
        name: [texts for n, texts in merged_calls if n == name]
        for name in ("classification", "regression")
    }
    assert len(by_signature["classification"]) == 1, merged_calls
    assert len(by_signature["regression"]) == 1, merged_calls
    assert_merged_and_padded(by_signature["classification"][0], classify)
    assert_merged_and_padded(by_signature["regression"][0], regress)
    # Sent alone, each request is padded too: 1 or 2 rows run as 4.
    assert [len(texts) for _, texts in alone_calls] == [4] * len(requests)
    for (verb, _, texts), (status, reply), (alone_status, alone_reply) in zip(
        requests, together, alone
    ):
        assert status == alone_status == 200, (reply, alone_reply)
        assert len(reply["results"]) == len(texts)  # No padding row's result.
        if verb == "classify":
            assert [[c for c, _ in row] for row in reply["results"]] == [
                [c for c, _ in row] for row in alone_reply["results"]
            ]
            np.testing.assert_allclose(
                [[s for _, s in row] for row in reply["results"]],
                [[s for _, s in row] for row in alone_reply["results"]],
                rtol=0,
                atol=1e-6,
            )
        else:
            np.testing.assert_allclose(reply["results"], alone_reply["results"], rtol=0, atol=1e-6)


def test_a_bad_batching_parameters_file_is_a_usage_error_naming_file_and_line(tmp_path):
    base = tmp_path / "models"
    base.mkdir()
    path = tmp_path / "batching.config"
    path.write_text("max_batch_size { value: 8 }\nbatch_timeout_microseconds { value: 1 }\n")
    args = serve_args(f"--model_base_path={base}", f"--batching_parameters_file={path}")
    with pytest.raises(UsageError) as error:
        serve.build_server(args)
    assert str(error.value).startswith(f"--batching_parameters_file={path}: line 2, column 1:")
    assert 'no field named "batch_timeout_microseconds"' in str(error.value)
    # Values TF Serving refuses are usage errors too, in its words.
    path.write_text("max_batch_size { value: 8 }\nallowed_batch_sizes: 4\n")
    with pytest.raises(UsageError) as error:
        serve.build_server(args)
    assert str(error.value) == (
        f"--batching_parameters_file={path}: Last entry in allowed_batch_sizes must match "
        "max_batch_size; last entry was 4; expected 8"
    )
