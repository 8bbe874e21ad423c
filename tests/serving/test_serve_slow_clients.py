"""Slow REST clients cost the server a little memory each, never a thread, and never anyone else's
latency: a request must arrive whole within the idle timeout, however it drips, and thousands of
dripping connections leave an ordinary request fast. Real servers on 127.0.0.1, real sockets."""

import base64
import http.client
import json
import resource
import socket
import statistics
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from helpers_serve import make_base, model_server, split_raw_reply

from bert_tf.serving import http_api

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

DRIP_CLIENTS = 8000
DRIP_EVERY_S = 5.0
# One byte at a time of a request that never ends: its head never completes.
DRIP_REQUEST = b"POST /v1/models/clf:predict HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 4096


def predict_latency(port, connection):
    start = time.perf_counter()
    connection.request("POST", "/v1/models/clf:predict", body=json.dumps({"instances": ["a"]}))
    response = connection.getresponse()
    raw = response.read()
    assert response.status == 200, raw[:300]
    return time.perf_counter() - start


def test_a_request_that_drips_in_is_cut_at_the_idle_timeout(tmp_path, exports):
    # A byte every 0.2 s: each read succeeds, so a per-read timeout never fires.
    with model_server(
        {"clf": make_base(tmp_path, exports)}, idle_timeout_s=1.0, warmup=False
    ) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            start = time.monotonic()
            reply = b""
            for byte in DRIP_REQUEST[:60]:
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    break  # closed by the server
                sock.settimeout(0.2)
                try:
                    reply = sock.recv(65536)
                except TimeoutError:
                    continue
                break
            cut_after = time.monotonic() - start
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        assert predict_latency(server.port, connection) < 5
        connection.close()
    assert reply.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), reply[:300]
    assert b"within 1s" in reply
    assert 0.9 < cut_after < 5, cut_after


# The dripping clients, a process of their own as real clients are (and off the server's GIL):
# argv port, count, interval; prints "connected" once every connection is open, drips until its
# stdin closes, then closes them all.
DRIPPER = textwrap.dedent(
    """
    import resource, socket, sys, threading, time
    port, count, every = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    head = sys.stdin.buffer.readline()  # the request head to drip, a byte at a time
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 1024), hard))
    clients = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(count)]
    print("connected", flush=True)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    position = 0
    while not stop.is_set():
        started = time.monotonic()
        for index, sock in enumerate(clients):  # spread over the interval's first half
            try:
                sock.send(head[position : position + 1])
            except OSError:
                pass
            if index % 500 == 499:
                time.sleep(every * 500 / count / 2)
        position += 1
        stop.wait(max(0.0, every - (time.monotonic() - started)))
    for sock in clients:
        sock.close()
    """
)


@pytest.fixture
def open_files_for_the_flood():
    """Room for the server's end of every drip connection."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = DRIP_CLIENTS + 2048
    raised_hard = hard if hard == resource.RLIM_INFINITY else max(hard, needed)
    try:  # raising the hard limit needs root (CI's)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, needed), raised_hard))
    except (ValueError, OSError):
        pytest.fail(f"the open-files limit is {hard}; this test needs {needed} (ulimit -Hn)")
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, raised_hard))


def test_8000_dripping_clients_leave_an_ordinary_request_fast(
    tmp_path, exports, open_files_for_the_flood
):
    with model_server({"clf": make_base(tmp_path, exports)}, warmup=False) as server:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        predict_latency(server.port, connection)  # the model's first call traces it
        threads_before = threading.active_count()
        dripper = subprocess.Popen(
            [sys.executable, "-c", DRIPPER, str(server.port), str(DRIP_CLIENTS), str(DRIP_EVERY_S)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            dripper.stdin.write(DRIP_REQUEST + b"\n")
            dripper.stdin.flush()
            assert dripper.stdout.readline() == b"connected\n"
            deadline = time.monotonic() + 60  # the loop accepts what the backlog holds
            while server.open_rest_connections < DRIP_CLIENTS and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server.open_rest_connections >= DRIP_CLIENTS
            latencies = []
            end = time.monotonic() + 2 * DRIP_EVERY_S
            while time.monotonic() < end:
                latencies.append(predict_latency(server.port, connection))
                time.sleep(0.05)
            connection.close()
            threads_during = threading.active_count()
        finally:
            dripper.stdin.close()  # the dripper closes its connections and ends
            dripper.wait(timeout=60)
        start = time.monotonic()
        while server.open_rest_connections and time.monotonic() - start < 20:
            time.sleep(0.05)
        drained_after = time.monotonic() - start
        assert server.open_rest_connections == 0
    median = statistics.median(latencies)
    print(
        f"{DRIP_CLIENTS} drip clients: {len(latencies)} predicts, median {median * 1e3:.1f} ms, "
        f"max {max(latencies) * 1e3:.1f} ms; threads {threads_before} -> {threads_during}; "
        f"drained in {drained_after:.2f} s"
    )
    assert len(latencies) >= 20
    assert median < 0.1 and max(latencies) < 2.0, sorted(latencies)
    assert threads_during < threads_before + 50  # the REST workers, no more
    assert drained_after < 5


def test_connections_past_the_limit_get_a_503_and_the_others_go_on(tmp_path, exports):
    with model_server({"clf": make_base(tmp_path, exports)}, warmup=False) as server:
        limited = http_api.HttpServer(
            ("127.0.0.1", 0),
            http_api.RestApi(server.core),
            max_request_bytes=1 << 20,
            idle_timeout_s=30,
            max_connections=2,
        )
        try:
            port = limited.server_address[1]
            held = [http.client.HTTPConnection("127.0.0.1", port, timeout=30) for _ in range(2)]
            for connection in held:
                assert predict_latency(port, connection) < 30
            with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                sock.sendall(b"GET /v1/models/clf HTTP/1.1\r\nHost: x\r\n\r\n")
                reply = b""
                while chunk := sock.recv(65536):
                    reply += chunk
            assert reply.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), reply[:300]
            assert b"2 connections open" in reply and b"Connection: close" in reply
            for connection in held:  # the two already open are served as before
                assert predict_latency(port, connection) < 30
                connection.close()
        finally:
            limited.stop()


def test_a_slow_reader_gets_a_big_reply_whole(tmp_path, exports):
    # A 5 MB reply read at most 64 KB every 50 ms through a small receive buffer: about 10 s
    # against a 1 s idle timeout. Each read is progress, so the reply must arrive whole (the
    # kernel's send buffer hides it from asyncio's for seconds at a time: it was cut at 3.6 MB).
    rows = [f"{i:02d}" + "x" * (750_000 - 2) for i in range(5)]
    body = json.dumps({"signature_name": "echo", "instances": rows}).encode()
    head = (
        "POST /v1/models/clf:predict HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with model_server(
        {"clf": make_base(tmp_path, exports)}, idle_timeout_s=1.0, warmup=False
    ) as server:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
            sock.settimeout(30)
            sock.connect(("127.0.0.1", server.port))
            sock.sendall(head + body)
            start = time.monotonic()
            raw = b""
            while chunk := sock.recv(65536):  # until the server closes, after the reply or not
                raw += chunk
                time.sleep(0.05)
            took = time.monotonic() - start
    status_line, headers, reply = split_raw_reply(raw)
    assert status_line == b"HTTP/1.1 200 OK", raw[:300]
    assert len(reply) == int(headers["content-length"]), (len(reply), headers)
    outputs = json.loads(reply)["predictions"]
    assert [base64.b64decode(row["b64"]).decode() for row in outputs] == rows
    assert took > 5, took  # far slower than the idle timeout
