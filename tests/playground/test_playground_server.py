"""The playground's server under load and abuse, over real sockets on 127.0.0.1: many clients at
once, bodies that never arrive, clients that vanish, bad fields, foreign hosts and origins.

No model and no browser: a vocabulary alone answers the data views, which is all these need.
"""

import asyncio
import gzip
import http.client
import json
import logging
import socket
import struct
import threading
import time

import pytest
from helpers import write_vocab

from bert_tf.playground import __main__ as playground_cli
from bert_tf.playground import server as playground_server
from bert_tf.playground import views
from bert_tf.pretraining_data import tfrecord

CONCURRENT_CLIENTS = 200
STALLED_CLIENTS = 20
REQUEST_TIMEOUT_S = 1.0
TEXT = "the man went to the store ."


@pytest.fixture(scope="module")
def playground(tmp_path_factory):
    vocab_file = write_vocab(str(tmp_path_factory.mktemp("vocab") / "vocab.txt"), [TEXT])
    return views.Playground(views.PlaygroundSettings(vocab_file=vocab_file))


@pytest.fixture
def serve(playground):
    """Starts playground servers (on 127.0.0.1 and a free port unless told); stops them after."""
    started = []

    def start(host="127.0.0.1", **options):
        options.setdefault("request_timeout_s", REQUEST_TIMEOUT_S)
        httpd = playground_server.PlaygroundServer(playground, host, 0, **options)
        started.append(httpd)
        return httpd

    yield start
    for httpd in started:
        httpd.stop()
        assert httpd.internal_errors == 0, "a view answered with a server error (see the log)"


def call(port, method, path, body=None, headers=None):
    """(status, JSON reply) of one request to 127.0.0.1:port, with Host naming it unless told."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
        connection.request(
            method, path, body=data, headers={"Host": f"127.0.0.1:{port}"} | (headers or {})
        )
        reply = connection.getresponse()
        return reply.status, json.loads(reply.read() or b"null")
    finally:
        connection.close()


def request_bytes(port, body):
    """A POST to the representation view as raw bytes, closing the connection after its reply."""
    return (
        f"POST /api/represent HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def abort(sock):
    """Closes with a TCP reset, as a client that crashed or was killed leaves."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def wait_until_idle(httpd, timeout=10):
    """Waits for the server to close every connection."""
    deadline = time.monotonic() + timeout
    while httpd.open_connections and time.monotonic() < deadline:
        time.sleep(0.02)
    return httpd.open_connections


# ---------------------------------------------------------------------------------------------
# Load and abuse
# ---------------------------------------------------------------------------------------------


def test_200_concurrent_requests_are_all_answered(serve):
    httpd = serve()
    data = request_bytes(httpd.port, json.dumps({"text_a": TEXT}).encode())

    async def one():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", httpd.port)
            writer.write(data)
            await writer.drain()
            reply = await reader.read()
            writer.close()
            return reply.split(b" ", 2)[1].decode() if reply else "closed without a reply"
        except (ConnectionResetError, ConnectionRefusedError, BrokenPipeError) as e:
            return type(e).__name__

    async def all_at_once():
        clients = (one() for _ in range(CONCURRENT_CLIENTS))
        return await asyncio.wait_for(asyncio.gather(*clients), 120)

    start = time.monotonic()
    outcomes = asyncio.run(all_at_once())
    took = time.monotonic() - start
    refused = [o for o in outcomes if o != "200"]
    print(
        f"{CONCURRENT_CLIENTS} concurrent requests in {took:.2f} s: {len(refused)} not answered 200"
    )
    assert not refused, sorted(set(refused))
    assert wait_until_idle(httpd) == 0


def test_a_body_that_never_arrives_gets_a_408_and_holds_no_thread(serve):
    httpd = serve()
    threads_before = threading.active_count()
    head = (
        f"POST /api/represent HTTP/1.1\r\nHost: 127.0.0.1:{httpd.port}\r\n"
        "Content-Length: 100\r\n\r\n"
    ).encode()
    stalled = []
    try:
        for _ in range(STALLED_CLIENTS):
            sock = socket.create_connection(("127.0.0.1", httpd.port), timeout=30)
            sock.sendall(head + b'{"text_a"')  # 9 bytes of the 100 promised
            stalled.append(sock)
        start = time.monotonic()
        time.sleep(REQUEST_TIMEOUT_S / 2)
        threads_during = threading.active_count()
        for sock in stalled:
            reply = b""
            while chunk := sock.recv(65536):  # the server closes after its 408
                reply += chunk
            assert reply.startswith(b"HTTP/1.1 408 "), reply[:200]
            assert b"Connection: close" in reply
        took = time.monotonic() - start
    finally:
        for sock in stalled:
            sock.close()
    assert threads_during <= threads_before, (threads_before, threads_during)
    assert took < REQUEST_TIMEOUT_S + 5
    assert wait_until_idle(httpd) == 0
    assert threading.active_count() <= threads_before


def test_clients_that_go_away_write_no_traceback(serve, capfd, caplog):
    httpd = serve()
    port = httpd.port
    body = json.dumps({"text_a": TEXT}).encode()
    whole = request_bytes(port, body)
    caplog.set_level(logging.DEBUG)
    for sent, hang_up in (
        (b"POST /api/repr", abort),  # mid request line
        (whole[: len(whole) - 5], abort),  # mid body
        (whole, abort),  # before the reply
        (whole, socket.socket.close),  # closed without reading the reply
        (b"", abort),  # before a byte
    ):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        if sent:
            sock.sendall(sent)
        hang_up(sock)
    assert wait_until_idle(httpd) == 0
    time.sleep(0.2)  # whatever a worker still had to say
    assert call(port, "POST", "/api/represent", {"text_a": TEXT})[0] == 200
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err, err[-3000:]
    assert not [r for r in caplog.records if r.levelno > logging.DEBUG or r.exc_info], [
        r.getMessage() for r in caplog.records
    ]


# ---------------------------------------------------------------------------------------------
# Bad fields
# ---------------------------------------------------------------------------------------------

MANY_DIGITS = "1" * 400


@pytest.mark.parametrize(
    "view, body, field",
    [
        ("mask", f'{{"text_a": "{TEXT}", "rate": {MANY_DIGITS}}}', "rate"),
        ("mask", f'{{"text_a": "{TEXT}", "rate": 0.{MANY_DIGITS}}}', "rate"),
        ("mask", f'{{"text_a": "{TEXT}", "rate": "{MANY_DIGITS}"}}', "rate"),
        ("mask", f'{{"text_a": "{TEXT}", "rate": 1e400}}', "rate"),
        ("mask", f'{{"text_a": "{TEXT}", "rate": "{"1" * 100_000}x"}}', "rate"),
        ("mask", f'{{"text_a": "{TEXT}", "seed": "{"5" * 5000}"}}', "seed"),
        ("mask", f'{{"text_a": "{TEXT}", "seed": {"5" * 5000}}}', "seed"),
        ("mask", f'{{"text_a": "{TEXT}", "seed": -1}}', "seed"),
        ("mask", f'{{"text_a": "{TEXT}", "whole_word": "false"}}', "whole_word"),
        ("mask", f'{{"text_a": "{TEXT}", "whole_word": 1}}', "whole_word"),
        ("mask", f'{{"text_a": "{TEXT}", "masking": "ngram"}}', "masking"),
        ("mask", f'{{"text_a": "{TEXT}", "masking": "span", "whole_word": true}}', "masking"),
        ("mask", f'{{"text_a": "{TEXT}", "mask_token_prob": -0.5}}', "mask_token_prob"),
        ("mask", f'{{"text_a": "{TEXT}", "mask_token_prob": 0.95}}', "random_token_prob"),
        ("mask", '{"text_a": 5}', "text_a"),
        ("pairs", '{"label": "Maybe"}', "label"),
        ("pairs", '{"seed": 1.5}', "seed"),
        ("records", '{"path": "gs://bucket/pretrain.tfrecord"}', "path"),
        ("records", '{"path": "http://127.0.0.1:9/pretrain.tfrecord"}', "path"),
        ("records", '{"path": "/no/such/file.tfrecord"}', "path"),
        ("records", f'{{"path": "{__file__}", "start": {"9" * 30}}}', "start"),
        ("records", f'{{"path": "{__file__}", "limit": "five"}}', "limit"),
    ],
)
def test_each_bad_field_gets_a_400_that_names_it(serve, view, body, field):
    port = serve().port
    status, reply = call(port, "POST", f"/api/{view}", body.encode())
    assert status == 400, reply
    assert reply["field"] == field and reply["error"].startswith(f"{field}: "), reply
    assert len(reply["error"]) < 500


def absurd_record_file(path, length, compress=False):
    """A file whose first record's length field (with a valid CRC) says `length` bytes."""
    header = struct.pack("<Q", length)
    data = header + struct.pack("<I", tfrecord.masked_crc32c(header)) + b"\0" * 64
    with (gzip.open if compress else open)(path, "wb") as f:
        f.write(data)
    return str(path)


@pytest.mark.parametrize(
    "length, start, compress",
    [(1 << 40, 0, False), (1 << 63, 0, False), (1 << 63, 3, False), (1 << 40, 0, True)],
)
def test_a_record_whose_length_is_absurd_gets_a_400_naming_file_and_record(
    serve, tmp_path, length, start, compress
):
    path = absurd_record_file(tmp_path / "absurd.tfrecord", length, compress)
    status, reply = call(serve().port, "POST", "/api/records", {"path": path, "start": start})
    assert status == 400, reply
    assert path in reply["error"] and "record 0" in reply["error"], reply


# ---------------------------------------------------------------------------------------------
# Whom it answers
# ---------------------------------------------------------------------------------------------


def test_every_address_still_refuses_a_foreign_host_or_origin(serve):
    httpd = serve("0.0.0.0")
    port = httpd.port
    own = f"http://127.0.0.1:{port}"
    assert call(port, "GET", "/api/info")[0] == 200
    assert call(port, "POST", "/api/represent", {"text_a": TEXT}, {"Origin": own})[0] == 200
    assert call(port, "GET", "/api/info", headers={"Host": f"0.0.0.0:{port}"})[0] == 200
    for headers in (
        {"Host": f"evil.example:{port}"},  # DNS rebinding: a name the attacker controls
        {"Origin": "http://evil.example"},  # another site's page posting here
        {"Origin": "null"},
    ):
        status, reply = call(port, "POST", "/api/represent", {"text_a": TEXT}, headers)
        assert status == 403 and "--allowed_origins" in reply["error"], (headers, reply)


def test_allowed_origins_let_one_in_through_the_command_line(playground):
    vocab_file = playground.settings.vocab_file
    args = playground_cli.PlaygroundArgs(
        vocab_file=vocab_file,
        host="0.0.0.0",
        port=0,
        allowed_origins=["http://playground.lan:8123"],
    )
    seen = {}

    def check(httpd):
        port = httpd.port
        lan = {"Host": "playground.lan:8123", "Origin": "http://playground.lan:8123"}
        seen["lan"] = call(port, "POST", "/api/represent", {"text_a": TEXT}, lan)[0]
        other = {"Host": "playground.lan:8123", "Origin": "http://other.lan"}
        seen["other"] = call(port, "POST", "/api/represent", {"text_a": TEXT}, other)[0]
        seen["loopback"] = call(port, "GET", "/api/info")[0]
        httpd.stop()

    playground_cli.run(args, on_ready=check)
    assert seen == {"lan": 200, "other": 403, "loopback": 200}
    with pytest.raises(playground_cli.io_utils.UsageError, match="not an origin"):
        playground_cli.run(
            playground_cli.PlaygroundArgs(vocab_file=vocab_file, port=0, allowed_origins=["x/y"])
        )
