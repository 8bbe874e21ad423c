"""TF Serving's REST API over HTTP/1.1: paths, JSON bodies and status codes as its
http_rest_api_handler.cc, http_rest_api_util.cc and http_server.cc have them.

    GET  /v1/models/NAME[/versions/N | /labels/L]             status
    GET  /v1/models/NAME[/versions/N | /labels/L]/metadata    signature defs
    POST /v1/models/NAME[/versions/N | /labels/L]:predict     {"instances": ...} or {"inputs": ...}
    POST /v1/models/NAME[/versions/N | /labels/L]:classify    {"examples": [...], "context"?: {...}}
    POST /v1/models/NAME[/versions/N | /labels/L]:regress
    GET  /monitoring/prometheus/metrics                        with --monitoring_config_file

A request's failure is a ServingError whose canonical code gives the HTTP status, as in TF Serving.
What only HTTP can get wrong (a body too large, stalled or unframed) gets the HTTP status that says
so (413, 408, 411), since TF Serving's own HTTP library also refuses those before its handler.
"""

import asyncio
import concurrent.futures
import email.utils
import fcntl
import http
import http.client
import io
import os
import re
import resource
import socket
import struct
import termios
import threading
import time
import urllib.parse
import zlib

from absl import logging
from google.protobuf import json_format

from bert_tf.serving import errors, json_codec, methods

# http_rest_api_util.cc: what the REST handler takes, the POST and the GET paths. (?i): TF Serving
# matches them case-insensitively.
_API_PATH = re.compile(r"/v1/.*", re.IGNORECASE | re.DOTALL)
_POST_PATH = re.compile(
    r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:(classify|regress|predict)",
    re.IGNORECASE,
)
_GET_PATH = re.compile(
    r"/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?",
    re.IGNORECASE,
)
_INT64_MAX = (1 << 63) - 1
# http.server's limits on a request's head: the bytes of one line, and the header lines.
_MAX_LINE = 65536
_MAX_HEADERS = 100
# Connections the kernel holds for the loop to accept, and the most it accepts at one wake-up.
_BACKLOG = 1024
SERVER_NAME = "bert_tf.serve"
# TF Serving's "api" label of its request metrics for a REST request is the verb (empty for GET).
_GET_API = ""


class HttpError(Exception):
    """A request refused at the HTTP layer, before it reaches TF Serving's handler."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


class _Request:
    """One parsed REST request: the model spec and what to do."""

    def __init__(self, method, name, version, label, verb, metadata):
        self.method, self.name, self.version, self.label = method, name, version, label
        self.verb, self.metadata = verb, metadata
        self.signature_name = ""  # From the body, once it is read: a label of the metrics.


def _decode_arg(text, what):
    """%-decodes a path segment as curl_easy_unescape does for TF Serving (model name, label)."""
    try:
        return urllib.parse.unquote(text, errors="strict")
    except UnicodeDecodeError as e:
        raise errors.invalid_argument(f"Failed to decode {what}:{errors.short(text)}") from e


def parse_path(method, path):
    """A _Request from METHOD and the path (without query), or INVALID_ARGUMENT as TF Serving."""
    malformed = errors.invalid_argument(f"Malformed request: {method} {path[:1000]}")
    pattern = {"POST": _POST_PATH, "GET": _GET_PATH}.get(method)
    match = pattern.fullmatch(path) if pattern else None
    if match is None:
        raise malformed
    name = _decode_arg(match.group(1) or "", "model name")
    version = match.group(2)
    if version is not None:
        if int(version) > _INT64_MAX:
            raise errors.invalid_argument(f"Failed to convert version: {version} to numeric.")
        version = int(version)
    label = match.group(3)
    if label is not None:
        label = _decode_arg(label, "model version label")
    if method == "POST":
        verb = match.group(4)
        if verb not in ("classify", "regress", "predict"):  # Matched case-insensitively only.
            raise malformed
        return _Request(method, name, version, label, verb, False)
    if not name:
        raise errors.invalid_argument("Missing model name in request.")
    return _Request(method, name, version, label, None, bool(match.group(4)))


def _message_json(message, preserve_names):
    """A proto as TF Serving's ToJsonString prints it: every field shown, int64 as strings."""
    return json_format.MessageToDict(
        message,
        preserving_proto_field_name=preserve_names,
        always_print_fields_with_no_presence=True,
    )


class RestApi:
    """TF Serving's REST handler over a ServerCore: (method, path, body) -> (status, JSON text)."""

    def __init__(self, server_core, metrics=None):
        self.core = server_core
        self.metrics = metrics

    def handle(self, method, path, body, is_active=None):
        """Answers one request under /v1/: (HTTP status, reply text). A big request stops at its
        next chunk once `is_active()` turns False (its deadline passed, or its client left)."""
        start = time.perf_counter()
        request = None
        try:
            request = parse_path(method, path)
            reply = self._dispatch(request, body, is_active)
            code, status = "OK", 200
        except errors.ServingError as e:
            code, status, reply = e.code, e.http_status, {"error": e.message}
        except RecursionError:
            code, status, reply = "INVALID_ARGUMENT", 400, {"error": "request nests too deeply"}
        if self.metrics is not None:
            self.metrics.record_request(
                request.name if request else "",
                (request.verb or _GET_API) if request else _GET_API,
                "REST",
                code,
                time.perf_counter() - start,
                self.core.signature_label(request.name, request.signature_name) if request else "",
            )
        return status, reply

    def _dispatch(self, request, body, is_active):
        """Runs a parsed request against the core."""
        options = self.core.run_options(is_active)
        if request.method == "GET":
            if not request.metadata:
                status = self.core.model_status(request.name, request.version, request.label)
                return _message_json(status, False)
            servable = self.core.servable(request.name, request.version, request.label)
            spec = {"name": request.name, "signature_name": "", "version": str(servable.version)}
            signature_defs = _message_json(methods.signature_def_map(servable), True)
            return {"model_spec": spec, "metadata": {"signature_def": signature_defs}}
        payload = json_codec.parse_json_body(body)
        signature_name = payload.get("signature_name", "")
        if not isinstance(signature_name, str):
            raise errors.invalid_argument(
                f"'signature_name' must be a string, got {errors.short(signature_name)}"
            )
        request.signature_name = signature_name
        servable = self.core.servable(request.name, request.version, request.label)
        if request.verb == "classify":
            serialized = json_codec.examples_from_request(payload)
            classes, scores = methods.classify(servable, signature_name, serialized, options)
            return json_codec.classify_response(classes, scores)
        if request.verb == "regress":
            serialized = json_codec.examples_from_request(payload)
            return json_codec.regress_response(
                methods.regress(servable, signature_name, serialized, options)
            )
        # GetInfoMap in http_rest_api_handler.cc: the signature is looked up before the body is.
        name = signature_name or methods.DEFAULT_SIGNATURE
        if name not in servable.signatures:
            raise errors.invalid_argument(
                f'Serving signature name: "{name}" not found in signature def'
            )
        signature = methods.predict_signature(servable, name)
        arrays, format_ = json_codec.predict_inputs(payload, signature)
        outputs = methods.predict(servable, signature, arrays, options)
        return json_codec.predict_response(outputs, format_)


class _Head:
    """A request's line and headers, as read off its connection."""

    def __init__(self, command, target, version, headers):
        self.command, self.target, self.version, self.headers = command, target, version, headers


class _Connection:
    """One HTTP/1.1 connection on the server's event loop: reads each request (its head and body
    within one deadline), runs it in the server's worker pool, and writes its JSON reply with a
    Content-Length (keep-alive). A bad request gets a JSON error; a client that went away, a
    closed connection, and the request it left stops at its next chunk."""

    def __init__(self, server, reader, writer):
        self.server, self.reader, self.writer = server, reader, writer
        self.close = False
        self.command = ""
        self.seen_bytes = False  # of the request being read: a silent idle line closes quietly
        self.read_ahead = b""  # a pipelined request's first byte, read while the one before ran
        self.hung_up = False  # the stream ended while a request ran: its reply has no reader

    async def serve(self):
        timeout = self.server.idle_timeout_s
        while not self.close:
            self.seen_bytes, self.command = False, ""
            try:
                # One deadline for the whole request, not per read: a client that sends a byte
                # now and then must not hold its connection (and its memory) forever.
                async with asyncio.timeout(timeout):
                    head = await self._read_head()
                    if head is None:
                        return  # closed between requests
                    body = await self._read_body(head)
            except TimeoutError:
                if self.seen_bytes:
                    self.close = True
                    await self._reply(
                        408, {"error": f"the request did not arrive whole within {timeout:g}s"}
                    )
                return
            except HttpError as e:
                self.close = True
                await self._reply(e.status, {"error": e.message})
                return
            except (OSError, asyncio.IncompleteReadError):
                return  # the client went away
            try:
                status, reply, content_type = await self._answer(head, body)
            except HttpError as e:
                status, reply, content_type = e.status, {"error": e.message}, None
            except Exception as e:  # The client gets a short message; the trace stays in the log.
                logging.exception("internal error on %s %s", head.command[:20], head.target[:200])
                status, reply = 500, {"error": f"Internal error: {type(e).__name__}"}
                content_type = None
            if self.hung_up:
                return
            await self._reply(status, reply, content_type)

    async def _readline(self, too_long_status):
        """One line of the head (with its line end); b"" at the end of the stream."""
        # Its first byte alone first: a request that started and then stalls gets a 408.
        first, self.read_ahead = self.read_ahead or await self.reader.read(1), b""
        if not first:
            return b""
        self.seen_bytes = True
        if first == b"\n":
            return first
        try:
            return first + await self.reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as e:
            return first + e.partial
        except asyncio.LimitOverrunError as e:
            raise HttpError(too_long_status, "Line too long") from e

    async def _read_head(self):
        """The request line and headers; None when the client closed before sending any."""
        line = await self._readline(414)
        if line in (b"\r\n", b"\n"):  # RFC 9112 2.2: an empty line before a request is ignored
            line = await self._readline(414)
        if not line:
            return None
        words = line.decode("iso-8859-1").rstrip("\r\n").split()
        version = "HTTP/1.1"
        if len(words) >= 3:
            version = words[-1]
            number = _parse_version(version)
            if number >= (2, 0):
                raise HttpError(505, f"Invalid HTTP version ({version})")
            self.close = number < (1, 1)
        if len(words) == 2:  # "GET /path" alone is HTTP/0.9; TF Serving refuses it too.
            raise HttpError(
                400, "Bad request syntax: HTTP/0.9 is not supported; send 'METHOD PATH HTTP/1.1'"
            )
        if len(words) != 3:
            raise HttpError(400, f"Bad request syntax ({errors.short(line)})")
        self.command = words[0]
        lines = []
        while True:
            header = await self._readline(431)
            if header in (b"\r\n", b"\n", b""):
                break
            lines.append(header)
            if len(lines) > _MAX_HEADERS:
                raise HttpError(431, "Too many headers")
        try:
            headers = http.client.parse_headers(io.BytesIO(b"".join(lines) + b"\r\n"))
        except http.client.HTTPException as e:  # a header line over http.client's own limit
            raise HttpError(431, "Line too long") from e
        connection = headers.get("Connection", "").lower()
        if connection == "close":
            self.close = True
        elif connection == "keep-alive":
            self.close = False
        return _Head(words[0], words[1], version, headers)

    async def _read_body(self, head):
        """Reads the body after checking Content-Length against the limit (413 before reading any
        of it); a gzip body is uncompressed by the worker that runs the request."""
        headers = head.headers
        if "chunked" in headers.get("Transfer-Encoding", "").lower():
            raise HttpError(411, "chunked request bodies are not supported; send Content-Length")
        lengths = {value.strip() for value in headers.get_all("Content-Length", [])}
        if not lengths:
            if head.command == "POST":  # Whatever follows cannot be delimited.
                raise HttpError(411, "POST needs a Content-Length header")
            return b""
        if len(lengths) > 1:
            # Two lengths mean two readings of where this request ends (request smuggling): RFC 9110
            # says to refuse. The same value repeated is one length.
            raise HttpError(
                400, f"conflicting Content-Length headers: {errors.short(sorted(lengths))}"
            )
        length_header = lengths.pop()
        if not (length_header.isascii() and length_header.isdigit()) or len(length_header) > 18:
            raise HttpError(400, f"bad Content-Length {errors.short(length_header)}")
        length = int(length_header)
        limit = self.server.max_request_bytes
        if length > limit:
            await self._drain(min(length, 4 * limit, 64 << 20))
            raise HttpError(
                413, f"request body of {length} bytes is larger than the limit of {limit} bytes"
            )
        if length and head.version == "HTTP/1.1":
            if headers.get("Expect", "").lower() == "100-continue":  # curl's, for big bodies
                self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        try:
            return await self.reader.readexactly(length)
        except asyncio.IncompleteReadError as e:
            raise HttpError(400, "request body ended before Content-Length bytes") from e

    async def _drain(self, limit):
        """Reads and drops what the client already sent (bounded), so the 413 is not lost to a TCP reset."""
        try:
            while limit > 0:
                chunk = await asyncio.wait_for(self.reader.read(min(limit, 1 << 16)), 0.05)
                if not chunk:
                    break
                limit -= len(chunk)
        except (TimeoutError, OSError):
            pass

    async def _answer(self, head, body):
        """(status, reply, content type) of one request."""
        path = head.target.split("?", 1)[0].split("#", 1)[0]
        server = self.server
        if server.metrics_path is not None and path == server.metrics_path:
            text = await server.in_worker(server.metrics.prometheus_text)
            return 200, text, "text/plain"  # As TF Serving sends it.
        if not _API_PATH.fullmatch(path):
            raise HttpError(404, f"Not found: {path[:200]} (the REST API is under /v1/)")
        if head.command == "OPTIONS":  # A CORS preflight, as http_server.cc answers it.
            if re.search(r"https?://", head.headers.get("Origin", "")):
                return 200, "", "application/json"
            error = errors.failed_precondition("Origin header is missing in CORS preflight")
            return error.http_status, {"error": error.message}, None
        gzipped = "gzip" in head.headers.get("Content-Encoding", "").lower()
        live = threading.Event()
        live.set()
        watch = asyncio.ensure_future(self._watch_for_hangup(live))
        try:
            status, reply = await server.run_request(head.command, path, body, gzipped, live)
        finally:
            watch.cancel()  # a pending read(1) takes nothing from the stream when cancelled
            await asyncio.wait([watch])
        return status, reply, None

    async def _watch_for_hangup(self, live):
        """Reads ahead while a request runs. At the end of the stream the client is taken as gone,
        as nginx takes it (TCP cannot tell a half-close from a hang-up without writing): the
        request stops at its next chunk and no reply is written. A pipelined request's first
        byte is kept for its read."""
        try:
            byte = await self.reader.read(1)
        except Exception:  # a broken connection, whatever the transport calls it
            byte = b""
        if byte:
            self.read_ahead = byte
        else:
            self.hung_up = True
            live.clear()

    async def _reply(self, status, payload, content_type=None):
        """Writes one reply: JSON (TF Serving's float text) unless a string with its own type, or
        bytes a worker already wrote (a big reply is never serialized on the loop)."""
        if isinstance(payload, bytes):
            body = payload
        elif isinstance(payload, str):
            body = payload.encode("utf-8")
        else:
            body = json_codec.dumps(payload).encode("utf-8")
        try:
            phrase = http.HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        lines = [
            f"HTTP/1.1 {status} {phrase}",
            f"Server: {SERVER_NAME}",
            f"Date: {email.utils.formatdate(usegmt=True)}",
            f"Content-Type: {content_type or 'application/json'}",
            f"Content-Length: {len(body)}",
        ]
        if self.close:
            lines.append("Connection: close")
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if self.command != "HEAD":
            data += body
        logging.debug("%s %s %d", self.writer.get_extra_info("peername"), self.command, status)
        try:
            self.writer.write(data)
            await _drain_while_read(self.writer, self.server.idle_timeout_s)
        except (OSError, TimeoutError):
            self.close = True  # The client is gone or stopped reading: nothing to tell it.


async def _drain_while_read(writer, idle_timeout_s):
    """Waits for `writer`'s buffer to drain while the client keeps reading: a TimeoutError once
    it read nothing for `idle_timeout_s` (a slow reader of a big reply is not cut off)."""
    if not writer.transport.get_write_buffer_size():
        return  # the kernel took it all: most replies, with no system call to count them
    while True:
        left = _unsent_bytes(writer)
        try:
            async with asyncio.timeout(idle_timeout_s):
                await writer.drain()
            return
        except TimeoutError:
            if _unsent_bytes(writer) >= left:
                raise


def _unsent_bytes(writer):
    """The bytes written that the client has not taken yet: asyncio's buffer, and the kernel's
    send queue where it can be read (Linux). The kernel wakes a writer only once a third of its
    send buffer (megabytes) is free, so asyncio's buffer alone can stand still for seconds while
    a slow client reads steadily."""
    unsent = writer.transport.get_write_buffer_size()
    try:
        sock = writer.get_extra_info("socket")
        queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
        return unsent + struct.unpack("i", queued)[0]
    except (OSError, AttributeError, ValueError):
        return unsent


def _parse_version(version):
    """(major, minor) of "HTTP/x.y", as http.server reads it; a 400 for anything else."""
    bad = HttpError(400, f"Bad request version ({errors.short(version)})")
    if not version.startswith("HTTP/"):
        raise bad
    parts = version[len("HTTP/") :].split(".")
    if len(parts) != 2 or not all(p.isdigit() and len(p) <= 10 for p in parts):
        raise bad
    return int(parts[0]), int(parts[1])


def _gunzip(body, limit):
    """A gzip body uncompressed, at most `limit` bytes of it (a small bomb must not fill memory)."""
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = decompressor.decompress(body, limit + 1)
    except zlib.error as e:
        raise HttpError(400, f"Failed to uncompress the gzipped body: {e}") from e
    if len(data) > limit:
        raise HttpError(
            413, f"the gzipped body uncompresses to more than the limit of {limit} bytes"
        )
    if not decompressor.eof:
        raise HttpError(400, "Failed to uncompress the gzipped body: it is truncated")
    return data


class HttpServer:
    """The REST API on an asyncio event loop in its own thread ("http"). A connection costs the
    loop a few KB, never a thread, so thousands of slow or idle clients hold no one up; the
    requests themselves run in a pool of `num_threads` workers, where the excess waits its turn.
    More than `max_connections` open at once are answered 503 and closed."""

    def __init__(
        self,
        address,
        rest_api,
        max_request_bytes,
        idle_timeout_s,
        deadline_s=None,
        metrics=None,
        metrics_path=None,
        num_threads=0,
        max_connections=0,
    ):
        self.rest_api = rest_api
        self.max_request_bytes = max_request_bytes
        self.idle_timeout_s = idle_timeout_s
        self.deadline_s = deadline_s
        self.metrics = metrics
        self.metrics_path = metrics_path
        self.max_connections = max_connections or _connections_the_file_limit_allows()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=num_threads or 4 * (os.cpu_count() or 1), thread_name_prefix="rest"
        )
        self._connections = set()
        self._stopping = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="http", daemon=True)
        self._thread.start()
        host, port = address
        try:
            # One socket on the host's first address, as http.server binds: start_server given a
            # name would bind each address it resolves to, on different ports when port is 0.
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
            listening = socket.create_server((host, port), family=family)
            self._server = asyncio.run_coroutine_threadsafe(
                asyncio.start_server(  # its backlog is what listen() gets (asyncio's own is 100)
                    self._on_connection, sock=listening, limit=_MAX_LINE, backlog=_BACKLOG
                ),
                self._loop,
            ).result()
        except BaseException:
            self._stop_loop()
            raise
        self.server_address = listening.getsockname()[:2]

    @property
    def open_connections(self):
        """How many client connections are open now."""
        return len(self._connections)

    async def _on_connection(self, reader, writer):
        task = asyncio.current_task()
        self._connections.add(task)
        # drain() then waits until the kernel took every byte: "sent" means sent.
        writer.transport.set_write_buffer_limits(high=0)
        connection = _Connection(self, reader, writer)
        try:
            if len(self._connections) > self.max_connections:
                connection.close = True
                await connection._reply(
                    503, {"error": f"the server has {self.max_connections} connections open"}
                )
                await connection._drain(1 << 16)  # so that closing does not reset the reply away
            else:
                await connection.serve()
        except asyncio.CancelledError:
            pass  # stop()
        finally:
            try:
                if not self._stopping:  # the reply's last bytes, however slowly they are read
                    await _drain_while_read(writer, self.idle_timeout_s)
                writer.close()
                async with asyncio.timeout(1.0):
                    await writer.wait_closed()
            except (Exception, asyncio.CancelledError):
                writer.transport.abort()  # gone, stopped reading, or the server stops
            self._connections.discard(task)

    async def in_worker(self, function, *args):
        """function(*args) in the worker pool: the loop never runs TensorFlow or JSON work itself."""
        return await self._loop.run_in_executor(self._executor, function, *args)

    async def run_request(self, method, path, body, gzipped, live):
        """(status, reply) of rest_api.handle in a worker, which runs while the Event `live` is
        set: it stops at its next chunk once it is cleared. With a deadline
        (--rest_api_timeout_in_ms), DEADLINE_EXCEEDED (504) once it passes (clearing `live`), as
        TF Serving's RunOptions timeout does."""

        def work():
            if not live.is_set():  # its deadline passed (or its client left) while it queued
                return deadline_exceeded()
            data = _gunzip(body, self.max_request_bytes) if gzipped else body
            status, reply = self.rest_api.handle(method, path, data, is_active=live.is_set)
            return status, json_codec.dumps(reply).encode("utf-8")

        def deadline_exceeded():
            error = errors.ServingError("DEADLINE_EXCEEDED", "Deadline Exceeded")
            return error.http_status, {"error": error.message}

        future = self._loop.run_in_executor(self._executor, work)
        if not self.deadline_s:
            return await future
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.deadline_s)
        except TimeoutError:
            live.clear()
            future.add_done_callback(_retrieve)  # its outcome has no one left to go to
            return deadline_exceeded()

    def stop(self):
        """Stops accepting, closes every connection, and ends the loop; queued requests are
        dropped, and running ones stop at their next chunk (the server core's stop)."""
        if self._loop.is_closed():
            return

        async def close():
            self._stopping = True
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=30)
        finally:
            self._stop_loop()

    def _stop_loop(self):
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()
        self._executor.shutdown(wait=False, cancel_futures=True)


def _retrieve(future):
    """Reads a finished future's outcome, so that asyncio does not log it as never retrieved."""
    if not future.cancelled():
        future.exception()


def _connections_the_file_limit_allows():
    """The open-files limit, less room for the models' files, the gRPC API and the workers."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 16
    return max(64, soft - 512)
