"""The playground's web server: the page's static files and one JSON endpoint per view, on the asyncio
HTTP stack that bert_tf.serve's REST API runs on (serving.http_stack).

    GET  /                  static/index.html
    GET  /static/NAME       the page's script, style sheet (shipped in the package: nothing external)
    GET  /api/info          what the playground runs on, and what each view is missing
    POST /api/VIEW          a JSON object in, the view's JSON out (views.Playground.handle)

Bad input is answered 400 with {"error": message}; a bad field's message starts with its name
(views.RequestFields). A body that is too large gets 413, one that is not UTF-8 or not JSON 400,
and a request that does not arrive whole within `request_timeout_s` 408, its connection closed. A
failure nobody foresaw is logged with its trace and answered 500 with a one-line message, so the
page still shows something.

A connection costs the event loop a few KB, never a thread; the views run in a small worker pool
(one at a time: views.Playground holds a lock), so the loop goes on accepting while a model runs.
A client that goes away costs a debug log line at most.

Whatever address it binds (127.0.0.1 by default; 0.0.0.0 too), it answers only requests whose
Host names a loopback address or the bound one (with the port), and whose Origin, when sent, is
such an address's own: another web site open in the same browser can neither read the replies
(DNS rebinding) nor post to the views. `allowed_origins` (--allowed_origins) lets in more, such as
http://NAME:PORT for a page opened by another machine's name: each origin, and its host name as a
Host. Programs other than browsers can send any Host they like: on a non-loopback address anyone
who reaches the port can use the playground.
"""

import ipaddress
import json
import mimetypes
import os
import urllib.parse

from absl import logging

from bert_tf.playground import views
from bert_tf.runtime import io_utils
from bert_tf.serving import http_stack
from bert_tf.serving.http_stack import HttpError

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
# A 1 MB text arrives as JSON (escapes can double it) with room to spare.
MAX_BODY_BYTES = 16 << 20
# Time for a request to arrive whole (and for an idle keep-alive connection to stay open).
REQUEST_TIMEOUT_S = 30.0
# The page's own files only: no inline script, nothing from anywhere else.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def parse_origin(text):
    """An origin as browsers send it in Origin (scheme://host[:port], lower case); a UsageError
    for anything else (a path, a query, a scheme other than http or https)."""
    origin = text.strip().lower().rstrip("/")
    parts = urllib.parse.urlsplit(origin)
    if (
        parts.scheme not in ("http", "https")
        or not parts.netloc
        or parts.path
        or parts.query
        or parts.fragment
        or "@" in parts.netloc
    ):
        raise io_utils.UsageError(
            f"--allowed_origins: {text!r} is not an origin; write scheme://host[:port], such as "
            "http://myhost:8080"
        )
    return origin


def _is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_unspecified(host):
    """0.0.0.0 or ::, which listen on every address."""
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def _as_url_host(host):
    """A host as a URL (and a Host header) writes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


class PlaygroundServer(http_stack.HttpServer):
    """The playground on the shared asyncio HTTP stack; serves from construction until stop().
    `allowed_origins` are origins to answer besides the loopback and bound addresses' own."""

    server_name = "bert_tf.playground"
    json_content_type = "application/json; charset=utf-8"
    reply_headers = (("Cache-Control", "no-store"), *SECURITY_HEADERS.items())

    def __init__(
        self,
        playground,
        host="127.0.0.1",
        port=8080,
        allowed_origins=(),
        request_timeout_s=REQUEST_TIMEOUT_S,
        num_threads=4,
    ):
        self.playground = playground
        self.internal_errors = 0  # replies with status 500: a bug, which the tests look for
        extra_origins = {parse_origin(origin) for origin in allowed_origins if origin.strip()}
        self.allowed_hosts = self.allowed_origins = frozenset()  # none until the port is known
        super().__init__(
            (host, port),
            MAX_BODY_BYTES,
            request_timeout_s,
            num_threads=num_threads,
            thread_name="playground",
            worker_name="playground-view",
        )
        names = {"127.0.0.1", "localhost", "[::1]", _as_url_host(host.lower())}
        hosts = {f"{name}:{self.port}" for name in names} | (names if self.port == 80 else set())
        hosts |= {urllib.parse.urlsplit(origin).netloc for origin in extra_origins}
        self.allowed_origins = frozenset({f"http://{h}" for h in hosts} | extra_origins)
        self.allowed_hosts = frozenset(hosts)
        self.is_loopback = _is_loopback(host)

    @property
    def url(self):
        """The page's address (a loopback one when it listens on every address)."""
        host = self.server_address[0]
        if _is_unspecified(host):
            host = "::1" if ":" in host else "127.0.0.1"
        return f"http://{_as_url_host(host)}:{self.port}/"

    def dumps(self, payload):
        return json.dumps(payload, ensure_ascii=False, allow_nan=False)

    async def answer(self, connection, head, body):
        self._check_host_and_origin(head.headers)
        path = head.path
        if head.command in ("GET", "HEAD"):
            if path in ("/", "/index.html"):
                return await self._static("index.html")
            if path.startswith("/static/"):
                return await self._static(path[len("/static/") :])
            if path == "/api/info":
                return await self._view(connection, "info", None)
            if path == "/favicon.ico":
                return 204, b"", "image/x-icon"
            raise HttpError(404, f"not found: {path[:200]}")
        if head.command == "POST":
            view = path[len("/api/") :] if path.startswith("/api/") else None
            if view not in views.Playground.VIEWS:
                raise HttpError(404, f"no such view: {path[:200]}")
            return await self._view(connection, view, body)
        raise HttpError(405, f"the playground answers GET and POST, not {head.command[:20]}")

    def _check_host_and_origin(self, headers):
        """Refuses (403) a request for another host name, or from another origin."""
        hosts = headers.get_all("Host") or []
        host = hosts[0].strip().lower() if len(hosts) == 1 else ""
        if host not in self.allowed_hosts:
            raise HttpError(
                403,
                f"the playground answers its own page only: Host {http_stack.short(host)} is not "
                "one of its addresses (--allowed_origins adds one)",
            )
        origin = headers.get("Origin")
        if origin is not None and origin.strip().lower() not in self.allowed_origins:
            raise HttpError(
                403,
                f"the playground answers its own page only: Origin {http_stack.short(origin)} is "
                "not its own (--allowed_origins adds one)",
            )

    async def _view(self, connection, view, body):
        """A view's (status, JSON bytes), worked out in a worker: the JSON parse, the view, and
        the reply's serialization."""

        def work(keep_going):
            try:
                request = {} if body is None else views.parse_request(body)
                reply = self.playground.handle(view, request)
            except views.ViewError as e:
                error = {"error": str(e)} | ({"field": e.field} if e.field else {})
                return 400, self.dumps(error).encode("utf-8"), False
            except Exception as e:  # the page shows a line; the trace goes to the log
                logging.exception("playground view %s failed", view)
                message = f"internal error in the {view} view: {e!r}"[:500]
                return 500, self.dumps({"error": message}).encode("utf-8"), True
            return 200, self.dumps(reply).encode("utf-8"), False

        status, reply, failed = await connection.run_while_connected(work)
        self.internal_errors += failed
        return status, reply, None

    async def _static(self, name):
        path = os.path.join(STATIC_DIR, name)
        if (
            not name
            or "/" in name
            or "\\" in name
            or name.startswith(".")
            or not os.path.isfile(path)
        ):
            raise HttpError(404, f"not found: /static/{name[:200]}")
        body = await self.in_worker(_read_bytes, path)
        content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
        if content_type.startswith("text/") or content_type.endswith("javascript"):
            content_type += "; charset=utf-8"
        return 200, body, content_type


def _read_bytes(path):
    with open(path, "rb") as f:
        return f.read()
