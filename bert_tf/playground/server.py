"""The playground's web server: the page's static files and one JSON endpoint per view (standard library
http.server, as bert_tf.serving).

    GET  /                  static/index.html
    GET  /static/NAME       the page's script, style sheet (shipped in the package: nothing external)
    GET  /api/info          what the playground runs on, and what each view is missing
    POST /api/VIEW          a JSON object in, the view's JSON out (views.Playground.handle)

Bad input is answered 400 with {"error": message}, which the page shows; a body that is too large
413, one that is not UTF-8 or not JSON 400. A failure nobody foresaw is logged with its trace and
answered 500 with a one-line message, so the page still shows something.

It listens on 127.0.0.1 by default. On a loopback address it answers only requests whose Host
names that address (or localhost) and whose Origin, when sent, is the page's own: another web site
open in the same browser can neither read the replies (DNS rebinding) nor post to the views.
"""

import http.server
import ipaddress
import json
import mimetypes
import os
import socket
import traceback
import urllib.parse

from absl import logging

from bert_tf.playground import views

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
# A 1 MB text arrives as JSON (escapes can double it) with room to spare.
MAX_BODY_BYTES = 16 << 20
# The page's own files only: no inline script, nothing from anywhere else.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class Handler(http.server.BaseHTTPRequestHandler):
    """One connection: static files and the views' JSON."""

    protocol_version = "HTTP/1.1"
    server_version = "bert_tf.playground"

    def log_message(self, format, *args):  # noqa: A002 (the stdlib's parameter name)
        """Access log lines go to absl's debug log, not stderr."""
        logging.debug("%s %s", self.address_string(), format % args)

    def do_GET(self):  # noqa: N802 (the stdlib's name)
        if not self._allowed():
            return
        path = urllib.parse.urlsplit(self.path).path
        if path in ("/", "/index.html"):
            return self._static("index.html")
        if path.startswith("/static/"):
            return self._static(path[len("/static/") :])
        if path == "/api/info":
            return self._json(200, self.server.playground.info())
        if path == "/favicon.ico":
            return self._send(204, b"", "image/x-icon")
        return self._json(404, {"error": f"not found: {path[:200]}"})

    def do_POST(self):  # noqa: N802
        if not self._allowed():
            return
        path = urllib.parse.urlsplit(self.path).path
        view = path[len("/api/") :] if path.startswith("/api/") else None
        if view not in views.Playground.VIEWS:
            self._discard_body()
            return self._json(404, {"error": f"no such view: {path[:200]}"})
        try:
            request = self._read_json()
        except _BadRequest as e:
            return self._json(e.status, {"error": e.message})
        try:
            reply = self.server.playground.handle(view, request)
        except views.ViewError as e:
            return self._json(400, {"error": str(e)})
        except Exception as e:  # the page shows a line; the trace goes to the log
            logging.error("playground view %s failed:\n%s", view, traceback.format_exc())
            self.server.internal_errors += 1
            return self._json(500, {"error": f"internal error in the {view} view: {e!r}"[:500]})
        return self._json(200, reply)

    # -- requests ------------------------------------------------------------------------------

    def _allowed(self):
        """Refuses (403) a request for another host name, or from another origin, on loopback."""
        allowed = self.server.allowed_hosts
        if allowed is None:
            return True
        host = (self.headers.get("Host") or "").lower()
        origin = self.headers.get("Origin")
        if host in allowed and (origin is None or origin.lower() in self.server.allowed_origins):
            return True
        self._discard_body()
        self._json(403, {"error": "the playground answers its own page only (Host or Origin)"})
        return False

    def _discard_body(self):
        length = self.headers.get("Content-Length")
        if length and length.isdigit() and int(length) <= MAX_BODY_BYTES:
            self.rfile.read(int(length))
        elif length:
            self.close_connection = True

    def _read_json(self):
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True
            raise _BadRequest(411, "the request needs a Content-Length")
        if int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            raise _BadRequest(
                413, f"the request is {int(length):,} bytes; the limit is {MAX_BODY_BYTES:,}"
            )
        body = self.rfile.read(int(length))
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _BadRequest(400, f"the request is not valid UTF-8 (byte {e.start})") from None
        try:
            return json.loads(text)
        except ValueError as e:
            raise _BadRequest(400, f"the request is not JSON: {e}") from None

    # -- replies -------------------------------------------------------------------------------

    def _static(self, name):
        path = os.path.join(STATIC_DIR, name)
        if (
            not name
            or "/" in name
            or "\\" in name
            or name.startswith(".")
            or not os.path.isfile(path)
        ):
            return self._json(404, {"error": f"not found: /static/{name[:200]}"})
        with open(path, "rb") as f:
            body = f.read()
        content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
        if content_type.startswith("text/") or content_type.endswith("javascript"):
            content_type += "; charset=utf-8"
        self._send(200, body, content_type)

    def _json(self, status, payload):
        body = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8")
        self._send(status, body, "application/json; charset=utf-8")

    def _send(self, status, body, content_type):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in SECURITY_HEADERS.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


class _BadRequest(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


def _is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class PlaygroundServer(http.server.ThreadingHTTPServer):
    """A thread per connection (daemons, so a closing server never waits on a browser's
    keep-alive); carries the Playground and the host names it answers to."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, playground, host="127.0.0.1", port=8080):
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), Handler)
        self.playground = playground
        self.internal_errors = 0  # replies with status 500: a bug, which the tests look for
        self.allowed_hosts = self.allowed_origins = None
        if _is_loopback(host):
            port = self.port
            names = {"127.0.0.1", "localhost", "[::1]", f"[{host}]" if ":" in host else host}
            self.allowed_hosts = {f"{n}:{port}" for n in names} | (names if port == 80 else set())
            self.allowed_origins = {f"http://{h}" for h in self.allowed_hosts}

    @property
    def port(self):
        """The port it listens on (the one the OS chose, for port 0)."""
        return self.server_address[1]

    @property
    def url(self):
        """The page's address."""
        host = self.server_address[0]
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/"
