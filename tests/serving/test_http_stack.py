"""bert_tf.serving.http_stack, the HTTP layer under the REST API and the playground, when its event
loop falls behind: over real sockets on 127.0.0.1, with a server whose one view blocks its loop
as a loop starved of CPU is blocked."""

import gc
import logging
import socket
import threading
import time

import pytest
from helpers import wait_for

from bert_tf.serving import http_stack

IDLE_TIMEOUT_S = 1.5
STALL_S = 2.5  # longer than the idle timeout


class StallingServer(http_stack.HttpServer):
    """Answers /stall after blocking its own event loop for STALL_S (`stalling` is set as it
    starts), anything else at once."""

    def __init__(self, *args, **kwargs):
        self.stalling = threading.Event()
        super().__init__(*args, **kwargs)

    async def answer(self, connection, head, body):
        if head.path == "/stall":
            self.stalling.set()
            time.sleep(STALL_S)  # on the loop, on purpose: nothing else is read meanwhile
        return 200, {"path": head.path}, None


def request(path):
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()


def read_all(sock):
    sock.settimeout(30)
    chunks = []
    while chunk := sock.recv(1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.fixture
def server(caplog):
    caplog.set_level(logging.ERROR)
    httpd = StallingServer(
        ("127.0.0.1", 0), max_request_bytes=1 << 20, idle_timeout_s=IDLE_TIMEOUT_S
    )
    yield httpd
    httpd.stop()
    gc.collect()  # asyncio logs a task's unretrieved exception when the task is collected
    records = caplog.get_records("call") + caplog.get_records("teardown")
    assert not [r.getMessage() for r in records if r.levelno >= logging.ERROR]


def test_a_request_sent_in_time_is_answered_when_the_server_reads_it_late(server):
    # Accepted, and waiting for its first byte, before the loop stalls; its request is sent while
    # the loop stalls, so the loop reads it only after its idle timer has run out: both in the
    # same turn of the loop. A deadline that cancelled the read took the byte and closed the
    # connection with no reply.
    waiting = socket.create_connection(("127.0.0.1", server.port))
    assert wait_for(lambda: server.open_connections == 1)
    staller = socket.create_connection(("127.0.0.1", server.port))
    staller.sendall(request("/stall"))
    assert server.stalling.wait(IDLE_TIMEOUT_S / 2), "the loop did not stall in time"
    waiting.sendall(request("/"))
    reply = read_all(waiting)
    assert reply.startswith(b"HTTP/1.1 200"), reply
    assert reply.endswith(b'{"path": "/"}'), reply
    assert read_all(staller).startswith(b"HTTP/1.1 200")


def test_a_connection_that_sends_nothing_is_closed_quietly_after_the_idle_timeout(server):
    silent = socket.create_connection(("127.0.0.1", server.port))
    started = time.monotonic()
    assert read_all(silent) == b""  # closed, with no reply
    assert IDLE_TIMEOUT_S <= time.monotonic() - started < IDLE_TIMEOUT_S + 5
    assert wait_for(lambda: server.open_connections == 0)


def test_a_request_that_starts_and_stalls_gets_a_408(server):
    stalled = socket.create_connection(("127.0.0.1", server.port))
    stalled.sendall(b"GET / HT")
    reply = read_all(stalled)
    assert reply.startswith(b"HTTP/1.1 408"), reply
