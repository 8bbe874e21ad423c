"""HTTP/1.1 on an asyncio event loop: the one stack that bert_tf.serve's REST API and the playground
share.

A connection costs the loop a few KB, never a thread, so thousands of slow or idle clients hold no
one up; the work a request asks for runs in a pool of worker threads, where the excess waits its
turn. Each request (its head and body) must arrive whole within one deadline, or it gets a 408 and
its connection is closed. Bodies need a Content-Length (no chunked uploads), and a body over the
limit gets a 413 before any of it is read. A client that goes away costs a debug log line at most.

A server is a subclass of HttpServer that says what a request gets (`answer`).
"""

import asyncio
import concurrent.futures
import email.utils
import fcntl
import http
import http.client
import io
import json
import os
import resource
import socket
import struct
import termios
import threading

from absl import logging

# http.server's limits on a request's head: the bytes of one line, and the header lines.
MAX_LINE = 65536
MAX_HEADERS = 100
# Connections the kernel holds for the loop to accept (asyncio's own default is 100).
BACKLOG = 1024


class HttpError(Exception):
    """A request refused with an HTTP status and a message (the reply's {"error": message})."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


def short(value, limit=80):
    """A bounded repr of client-supplied data, for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


class RequestHead:
    """A request's line and headers, as read off its connection."""

    def __init__(self, command, target, version, headers):
        self.command, self.target, self.version, self.headers = command, target, version, headers

    @property
    def path(self):
        """The target without its query and fragment."""
        return self.target.split("?", 1)[0].split("#", 1)[0]


class Connection:
    """One HTTP/1.1 connection on the server's event loop: reads each request (its head and body
    within one deadline), has the server answer it, and writes the reply with a Content-Length
    (keep-alive). A bad request gets a JSON error; a client that went away closes the connection
    quietly."""

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
            if not self.read_ahead:
                self.read_ahead = await self._first_byte(timeout)
                if not self.read_ahead:
                    return  # closed by the client, or idle past the timeout: closed quietly
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
                    await self.reply(
                        408, {"error": f"the request did not arrive whole within {timeout:g}s"}
                    )
                return
            except HttpError as e:
                self.close = True
                await self.reply(e.status, {"error": e.message})
                return
            except (OSError, asyncio.IncompleteReadError):
                logging.debug("%s went away mid-request", self.peer)
                return
            try:
                status, reply, content_type = await self.server.answer(self, head, body)
            except HttpError as e:
                status, reply, content_type = e.status, {"error": e.message}, None
            except Exception as e:  # The client gets a short message; the trace stays in the log.
                logging.exception("internal error on %s %s", head.command[:20], head.target[:200])
                status, reply = 500, {"error": f"Internal error: {type(e).__name__}"}
                content_type = None
            if self.hung_up:
                return
            await self.reply(status, reply, content_type)

    async def _first_byte(self, timeout):
        """The next request's first byte; b"" when the client closed, or None when nothing came
        within `timeout` seconds.

        The read is waited for, not cancelled at a deadline: when a busy server turns to this
        connection only after the timeout, a byte that came in time reaches the loop in the same
        turn as the timer, and a cancelled read would drop it, closing without a reply the
        connection of a client that had sent its request."""
        read = asyncio.ensure_future(self.reader.read(1))
        try:
            await asyncio.wait({read}, timeout=timeout)
            if not read.done():
                await asyncio.sleep(0)  # one more turn: a read woken in the timer's turn completes
        finally:  # also when the server stops meanwhile
            if not read.done():
                read.cancel()
        if not read.done():  # its cancellation is pending: nothing came
            return None
        try:
            return read.result()
        except OSError:
            logging.debug("%s went away between requests", self.peer)
            return b""

    @property
    def peer(self):
        """The client's address, for log lines."""
        return self.writer.get_extra_info("peername")

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
            raise HttpError(400, f"Bad request syntax ({short(line)})")
        self.command = words[0]
        lines = []
        while True:
            header = await self._readline(431)
            if header in (b"\r\n", b"\n", b""):
                break
            lines.append(header)
            if len(lines) > MAX_HEADERS:
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
        return RequestHead(words[0], words[1], version, headers)

    async def _read_body(self, head):
        """Reads the body after checking Content-Length against the limit (413 before reading any
        of it)."""
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
            raise HttpError(400, f"conflicting Content-Length headers: {short(sorted(lengths))}")
        length_header = lengths.pop()
        if not (length_header.isascii() and length_header.isdigit()) or len(length_header) > 18:
            raise HttpError(400, f"bad Content-Length {short(length_header)}")
        length = int(length_header)
        limit = self.server.max_request_bytes
        if length > limit:
            await self.discard_input(min(length, 4 * limit, 64 << 20))
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

    async def discard_input(self, limit):
        """Reads and drops what the client already sent (bounded), so that a refusal is not lost to
        a TCP reset."""
        try:
            while limit > 0:
                chunk = await asyncio.wait_for(self.reader.read(min(limit, 1 << 16)), 0.05)
                if not chunk:
                    break
                limit -= len(chunk)
        except (TimeoutError, OSError):
            pass

    async def run_while_connected(self, function, timeout=None):
        """function(keep_going) in a worker, reading ahead meanwhile; a TimeoutError once `timeout`
        seconds pass. `keep_going`, an Event, is cleared when the deadline passes or the client
        hangs up, so that long work can stop at its next chunk. At the end of the stream the client
        is taken as gone, as nginx takes it (TCP cannot tell a half-close from a hang-up without
        writing), and no reply is written. A pipelined request's first byte is kept for its read."""
        keep_going = threading.Event()
        keep_going.set()
        watch = asyncio.ensure_future(self._watch_for_hangup(keep_going))
        work = asyncio.ensure_future(self.server.in_worker(function, keep_going))
        try:
            return await asyncio.wait_for(asyncio.shield(work), timeout)
        except TimeoutError:
            keep_going.clear()
            work.add_done_callback(_retrieve)  # its outcome has no one left to go to
            raise
        finally:
            watch.cancel()  # a pending read(1) takes nothing from the stream when cancelled
            await asyncio.wait([watch])

    async def _watch_for_hangup(self, live):
        try:
            byte = await self.reader.read(1)
        except Exception:  # a broken connection, whatever the transport calls it
            byte = b""
        if byte:
            self.read_ahead = byte
        else:
            self.hung_up = True
            live.clear()

    async def reply(self, status, payload, content_type=None):
        """Writes one reply: JSON (the server's `dumps`) unless a string with its own type, or
        bytes a worker already wrote (a big reply is never serialized on the loop)."""
        server = self.server
        if isinstance(payload, bytes):
            body = payload
        elif isinstance(payload, str):
            body = payload.encode("utf-8")
        else:
            body = server.dumps(payload).encode("utf-8")
        try:
            phrase = http.HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        lines = [
            f"HTTP/1.1 {status} {phrase}",
            f"Server: {server.server_name}",
            f"Date: {email.utils.formatdate(usegmt=True)}",
            f"Content-Type: {content_type or server.json_content_type}",
            f"Content-Length: {len(body)}",
        ]
        lines.extend(f"{name}: {value}" for name, value in server.reply_headers)
        if self.close:
            lines.append("Connection: close")
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if self.command != "HEAD":
            data += body
        logging.debug("%s %s %d", self.peer, self.command, status)
        try:
            self.writer.write(data)
            await drain_while_read(self.writer, server.idle_timeout_s)
        except (OSError, TimeoutError):
            self.close = True  # The client is gone or stopped reading: nothing to tell it.


async def drain_while_read(writer, idle_timeout_s):
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
    bad = HttpError(400, f"Bad request version ({short(version)})")
    if not version.startswith("HTTP/"):
        raise bad
    parts = version[len("HTTP/") :].split(".")
    if len(parts) != 2 or not all(p.isdigit() and len(p) <= 10 for p in parts):
        raise bad
    return int(parts[0]), int(parts[1])


class HttpServer:
    """HTTP/1.1 on an asyncio event loop in its own thread, with a pool of `num_threads` workers.
    More than `max_connections` open at once are answered 503 and closed. A subclass sets what
    its `answer` needs before calling this constructor, which starts accepting connections."""

    server_name = "bert_tf"
    json_content_type = "application/json"
    reply_headers = ()  # (name, value) pairs sent with every reply

    def __init__(
        self,
        address,
        max_request_bytes,
        idle_timeout_s,
        num_threads=0,
        max_connections=0,
        thread_name="http",
        worker_name="worker",
    ):
        self.max_request_bytes = max_request_bytes
        self.idle_timeout_s = idle_timeout_s
        self.max_connections = max_connections or _connections_the_file_limit_allows()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=num_threads or 4 * (os.cpu_count() or 1),
            thread_name_prefix=worker_name,
        )
        self._connections = set()
        self._stopping = False
        self._stopped = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=thread_name, daemon=True
        )
        self._thread.start()
        host, port = address
        try:
            # One socket on the host's first address, as http.server binds: start_server given a
            # name would bind each address it resolves to, on different ports when port is 0.
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
            listening = socket.create_server((host, port), family=family, backlog=BACKLOG)
            self._server = asyncio.run_coroutine_threadsafe(
                asyncio.start_server(  # its backlog is what listen() gets again
                    self._on_connection, sock=listening, limit=MAX_LINE, backlog=BACKLOG
                ),
                self._loop,
            ).result()
        except BaseException:
            self._stop_loop()
            raise
        self.server_address = listening.getsockname()[:2]

    async def answer(self, connection, head, body):
        """(status, reply, content type or None for JSON) of one request; an HttpError for a
        refusal. Runs on the loop: anything slow goes to `in_worker`."""
        raise NotImplementedError

    def dumps(self, payload):
        """A reply's JSON text."""
        return json.dumps(payload)

    @property
    def port(self):
        """The port it listens on (the one the OS chose, for port 0)."""
        return self.server_address[1]

    @property
    def open_connections(self):
        """How many client connections are open now."""
        return len(self._connections)

    async def _on_connection(self, reader, writer):
        task = asyncio.current_task()
        self._connections.add(task)
        # drain() then waits until the kernel took every byte: "sent" means sent.
        writer.transport.set_write_buffer_limits(high=0)
        connection = Connection(self, reader, writer)
        try:
            if len(self._connections) > self.max_connections:
                connection.close = True
                await connection.reply(
                    503, {"error": f"the server has {self.max_connections} connections open"}
                )
                await connection.discard_input(1 << 16)  # so that closing does not reset it away
            else:
                await connection.serve()
        except asyncio.CancelledError:
            pass  # stop()
        finally:
            try:
                if not self._stopping:  # the reply's last bytes, however slowly they are read
                    await drain_while_read(writer, self.idle_timeout_s)
                writer.close()
                async with asyncio.timeout(1.0):
                    await writer.wait_closed()
            except (Exception, asyncio.CancelledError):
                writer.transport.abort()  # gone, stopped reading, or the server stops
            self._connections.discard(task)

    async def in_worker(self, function, *args):
        """function(*args) in the worker pool: the loop never does a request's work itself."""
        return await self._loop.run_in_executor(self._executor, function, *args)

    def wait(self, timeout=None):
        """Blocks until stop() (from another thread, or a signal handler); True once stopped."""
        return self._stopped.wait(timeout)

    def stop(self):
        """Stops accepting, closes every connection, and ends the loop; queued work is dropped."""
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
        self._stopped.set()


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
