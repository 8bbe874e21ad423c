"""What one gRPC request may cost the server: its declared shape is checked before anything is built,
its bytes are bounded, and a request its client gave up on stops between its chunks.

Real servers on 127.0.0.1, requests through tensorflow-serving-api's stubs; every wait is bounded.
"""

import http.client
import json
import os
import socket
import threading
import time

import grpc
import pytest
import tensorflow as tf
from helpers_serve import make_base, model_server
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from bert_tf.serving import grpc_api
from bert_tf.serving import servable as servable_module

MAX_INSTANCES = 10
MAX_REQUEST_BYTES = 1 << 20


@pytest.fixture(scope="module")
def server(tmp_path_factory, exports):
    base = make_base(tmp_path_factory.mktemp("limits"), exports)
    with model_server(
        {"clf": base},
        grpc_port=0,
        warmup=False,
        max_batch_size=1,  # every row is a chunk of its own
        max_instances_per_request=MAX_INSTANCES,
        max_request_bytes=MAX_REQUEST_BYTES,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def stub(server):
    channel = grpc.insecure_channel(
        f"127.0.0.1:{server.grpc_port}",
        options=[("grpc.max_send_message_length", 64 << 20)],
    )
    yield prediction_service_pb2_grpc.PredictionServiceStub(channel)
    channel.close()


@pytest.fixture
def unlimited_stub(tmp_path, exports):
    """A stub of a server with no --max_instances_per_request."""
    with model_server({"clf": make_base(tmp_path, exports)}, grpc_port=0, warmup=False) as running:
        channel = grpc.insecure_channel(f"127.0.0.1:{running.grpc_port}")
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)
        channel.close()


def predict(stub, proto, signature="", timeout=60):
    """("OK", response) or (code name, details) of a Predict of `proto` as the "text" input."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "clf"
    request.model_spec.signature_name = signature
    request.inputs["text"].CopyFrom(proto)
    try:
        return "OK", stub.Predict(request, timeout=timeout)
    except grpc.RpcError as e:
        return e.code().name, e.details()


def string_tensor(dims, values):
    """A DT_STRING TensorProto of the given dims and string_val, consistent or not."""
    proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING)
    for size in dims:
        proto.tensor_shape.dim.add(size=size)
    proto.string_val.extend(values)
    return proto


def test_declared_rows_are_refused_before_anything_is_built(server, stub, monkeypatch):
    built = []
    make_ndarray = tf.make_ndarray

    def spy(proto):
        built.append([d.size for d in proto.tensor_shape.dim])
        return make_ndarray(proto)

    monkeypatch.setattr(tf, "make_ndarray", spy)
    # 30 bytes that declare 10^8 rows: the limit is checked on the shape, nothing is expanded.
    start = time.monotonic()
    code, details = predict(stub, string_tensor([100_000_000], [b"a"]))
    assert code == "INVALID_ARGUMENT", details
    assert "100000000 instances" in details and "--max_instances_per_request" in details
    assert time.monotonic() - start < 10
    assert [100_000_000] not in built
    # Within the limit, one value repeated is still a valid tensor, as in TensorFlow.
    code, response = predict(stub, string_tensor([MAX_INSTANCES], [b"a good film"]))
    assert code == "OK", response
    assert response.outputs["label"].tensor_shape.dim[0].size == MAX_INSTANCES


def test_huge_shapes_are_invalid_argument_without_a_rows_limit(unlimited_stub):
    # 10^15 rows used to be an INTERNAL MemoryError; 10^8 hours of work queued.
    for rows in (10**15, 100_000_000):
        code, details = predict(unlimited_stub, string_tensor([rows], [b"a"]), timeout=30)
        assert code == "INVALID_ARGUMENT", (rows, details)
        assert f"{grpc_api.MAX_TENSOR_ELEMENTS} per tensor" in details
    # More elements than int64 holds.
    code, details = predict(unlimited_stub, string_tensor([1 << 40, 1 << 40], [b"a"]))
    assert code == "INVALID_ARGUMENT" and "int64" in details, details
    assert predict(unlimited_stub, string_tensor([2], [b"a", b"b"]))[0] == "OK"


def test_negative_and_inconsistent_tensors_are_invalid_argument(stub):
    cases = {
        "negative dim": string_tensor([-1], [b"a"]),
        "2 values for 3 elements": string_tensor([3], [b"a", b"b"]),
        "4 values for 3 elements": string_tensor([3], [b"a", b"b", b"c", b"d"]),
    }
    for what, proto in cases.items():
        code, details = predict(stub, proto)
        assert code == "INVALID_ARGUMENT", (what, code, details)
        assert details.startswith("tensor parsing error: text"), (what, details)
    # tensor_content of the wrong size, on a numeric signature ("scale": x float32 [None, 2]).
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "clf"
    request.model_spec.signature_name = "scale"
    x = tf.make_tensor_proto([[1.0, 2.0], [3.0, 4.0]], dtype=tf.float32)
    x.tensor_content = x.tensor_content[:-4]
    request.inputs["x"].CopyFrom(x)
    request.inputs["n"].CopyFrom(tf.make_tensor_proto([1, 2], dtype=tf.int32))
    with pytest.raises(grpc.RpcError) as raised:
        stub.Predict(request, timeout=60)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "tensor_content has 12 bytes" in raised.value.details()


def test_a_timed_out_request_stops_its_remaining_chunks(server, stub, monkeypatch):
    call_signature = servable_module.call_signature
    calls, lock = slow_chunks(monkeypatch)
    # MAX_INSTANCES rows, one chunk each: about 1 s of work, and the client waits 0.3 s.
    rows = [f"text {i}".encode() for i in range(MAX_INSTANCES)]
    code, _ = predict(stub, string_tensor([MAX_INSTANCES], rows), signature="echo", timeout=0.3)
    assert code == "DEADLINE_EXCEEDED"
    assert 1 <= wait_until_no_chunk_starts(calls, lock) <= 5, len(calls)
    # The server goes on answering.
    monkeypatch.setattr(servable_module, "call_signature", call_signature)
    assert predict(stub, string_tensor([1], [b"ok"]))[0] == "OK"


def test_grpc_messages_are_bounded_by_max_request_bytes(stub):
    # A text bigger than --max_request_bytes is refused by gRPC before it is read, as REST's body.
    code, details = predict(stub, string_tensor([1], [b"word " * (MAX_REQUEST_BYTES // 4)]))
    assert code == "RESOURCE_EXHAUSTED", details
    code, response = predict(stub, string_tensor([1], [b"word " * (MAX_REQUEST_BYTES // 8)]))
    assert code == "OK", response


def test_clients_that_never_send_their_message_stall_nobody(server, stub):
    # Each call opens a stream, sends its headers and never the request: three times the worker
    # pool's size (4 x cores). The server reads requests on its event loop, so they hold no worker.
    release = threading.Event()

    def never_sends():
        release.wait(60)
        yield from ()

    channels = [grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") for _ in range(3)]
    stalled = [
        channel.stream_unary("/tensorflow.serving.PredictionService/Predict").future(
            never_sends(), timeout=60
        )
        for channel in channels
        for _ in range(4 * (os.cpu_count() or 1))
    ]
    try:
        time.sleep(1.0)  # every stream is open and waiting
        latencies = []
        for _ in range(5):
            start = time.monotonic()
            code, response = predict(stub, string_tensor([1], [b"a short text"]), timeout=10)
            latencies.append(time.monotonic() - start)
            assert code == "OK", response
        assert max(latencies) < 2.0, latencies
        assert not any(call.done() for call in stalled)  # they were still stalled throughout
    finally:
        release.set()
        for call in stalled:
            call.cancel()
        for channel in channels:
            channel.close()


def slow_chunks(monkeypatch, seconds=0.1):
    """Every model call takes `seconds` more; returns the list of their start times (and its lock)."""
    calls, lock = [], threading.Lock()
    call_signature = servable_module.call_signature

    def slow(signature, arrays):
        with lock:
            calls.append(time.monotonic())
        time.sleep(seconds)
        return call_signature(signature, arrays)

    monkeypatch.setattr(servable_module, "call_signature", slow)
    return calls, lock


def test_a_stopping_server_stops_big_requests_at_their_next_chunk(tmp_path, exports, monkeypatch):
    calls, lock = slow_chunks(monkeypatch)
    running = model_server(
        {"clf": make_base(tmp_path, exports)}, grpc_port=0, warmup=False, max_batch_size=1
    ).start()
    rows = [f"text {i}" for i in range(200)]  # 200 chunks of 0.1 s each, over each protocol
    outcomes = {}

    def over_rest():
        connection = http.client.HTTPConnection("127.0.0.1", running.port, timeout=60)
        try:
            body = json.dumps({"signature_name": "echo", "instances": rows})
            connection.request("POST", "/v1/models/clf:predict", body=body)
            outcomes["rest"] = connection.getresponse().status
        except (OSError, http.client.HTTPException) as e:
            outcomes["rest"] = type(e).__name__  # the server went away mid-request
        finally:
            connection.close()

    def over_grpc():
        channel = grpc.insecure_channel(f"127.0.0.1:{running.grpc_port}")
        proto = string_tensor([len(rows)], [row.encode() for row in rows])
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        outcomes["grpc"] = predict(stub, proto, signature="echo")[0]
        channel.close()

    clients = [threading.Thread(target=over_rest), threading.Thread(target=over_grpc)]
    for client in clients:
        client.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # both requests are running their chunks
        with lock:
            if len(calls) >= 6:
                break
        time.sleep(0.05)
    start = time.monotonic()
    running.stop()
    stopped_in = time.monotonic() - start
    for client in clients:
        client.join(timeout=30)
    with lock:
        ran = len(calls)
    time.sleep(1.0)
    with lock:
        assert len(calls) == ran, "chunks went on after the server stopped"
    assert stopped_in < 5, stopped_in
    assert ran < 60, ran  # of the 400 chunks the two requests asked for
    assert outcomes["grpc"] in ("CANCELLED", "UNAVAILABLE"), outcomes


def wait_until_no_chunk_starts(calls, lock, quiet_s=0.5, limit_s=5):
    """Waits until no chunk started for `quiet_s` (or `limit_s` passed); returns how many ran."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        with lock:
            last = calls[-1] if calls else 0
        if time.monotonic() - last > quiet_s:
            break
        time.sleep(0.1)
    with lock:
        return len(calls)


def test_a_rest_request_past_its_deadline_stops_its_remaining_chunks(
    tmp_path, exports, monkeypatch
):
    calls, lock = slow_chunks(monkeypatch)
    with model_server(
        {"clf": make_base(tmp_path, exports)}, warmup=False, max_batch_size=1, deadline_s=0.3
    ) as running:
        # 20 rows, one chunk each: about 2 s of work against --rest_api_timeout_in_ms=300.
        body = json.dumps({"signature_name": "echo", "instances": [f"t {i}" for i in range(20)]})
        connection = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
        connection.request("POST", "/v1/models/clf:predict", body=body)
        response = connection.getresponse()
        assert response.status == 504, response.read()[:300]
        connection.close()
        assert 1 <= wait_until_no_chunk_starts(calls, lock) <= 6, len(calls)


@pytest.mark.parametrize("leaving", ["close", "shutdown"])
def test_a_rest_request_whose_client_hung_up_stops_its_remaining_chunks(
    tmp_path, exports, monkeypatch, leaving
):
    calls, lock = slow_chunks(monkeypatch)
    with model_server(
        {"clf": make_base(tmp_path, exports)}, warmup=False, max_batch_size=1
    ) as running:
        # 30 rows, one chunk each: about 3 s of work, and no deadline to stop it.
        body = json.dumps({"signature_name": "echo", "instances": [f"t {i}" for i in range(30)]})
        head = (
            "POST /v1/models/clf:predict HTTP/1.1\r\nHost: x\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", running.port), timeout=30) as client:
            client.sendall(head.encode() + body.encode())
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len(calls) < 2:
                time.sleep(0.02)
            if leaving == "shutdown":
                # Only its sending side: TCP cannot tell that from a hang-up, so the same happens
                # (and nginx does the same), and the server closes the connection unanswered.
                client.shutdown(socket.SHUT_WR)
                assert client.recv(1 << 16) == b""
        assert 2 <= wait_until_no_chunk_starts(calls, lock) <= 6, len(calls)
        deadline = time.monotonic() + 5
        while running.open_rest_connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert running.open_rest_connections == 0
        # The server goes on answering, pipelined requests included (the first one's
        # watcher reads the second's first byte ahead).
        monkeypatch.undo()
        with socket.create_connection(("127.0.0.1", running.port), timeout=30) as client:
            one = json.dumps({"instances": ["a text"]})
            request = (
                "POST /v1/models/clf:predict HTTP/1.1\r\nHost: x\r\n"
                f"Content-Length: {len(one)}\r\n\r\n{one}"
            ).encode()
            client.sendall(request * 2)
            replies = b""
            while replies.count(b"HTTP/1.1 200") < 2:
                chunk = client.recv(1 << 16)
                assert chunk, replies
                replies += chunk
