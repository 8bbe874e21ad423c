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

import http.server
import re
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

    def handle(self, method, path, body):
        """Answers one request under /v1/: (HTTP status, reply text)."""
        start = time.perf_counter()
        request = None
        try:
            request = parse_path(method, path)
            reply = self._dispatch(request, body)
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

    def _dispatch(self, request, body):
        """Runs a parsed request against the core."""
        options = self.core.run_options()
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


class Handler(http.server.BaseHTTPRequestHandler):
    """One HTTP/1.1 connection: reads each request, hands it to the server's RestApi (or the
    metrics page), and writes its JSON reply with a Content-Length (keep-alive)."""

    protocol_version = "HTTP/1.1"
    server_version = "bert_tf.serve"
    # TCP_NODELAY: otherwise the reply's second segment waits on the client's delayed ACK (~40 ms).
    disable_nagle_algorithm = True
    error_content_type = "application/json"

    def setup(self):
        """Applies the idle timeout, so a silent keep-alive connection does not hold a thread forever."""
        self.timeout = self.server.idle_timeout_s
        super().setup()

    def log_message(self, format, *args):  # noqa: A002 (the stdlib's parameter name)
        """Access log lines go to absl's debug log, not stderr."""
        logging.debug("%s %s", self.address_string(), format % args)

    def parse_request(self):
        """The stdlib's parsing, minus HTTP/0.9: a request line without a version is a 400."""
        if not super().parse_request():
            return False
        if self.request_version == "HTTP/0.9":  # "GET /path" alone; TF Serving refuses it too.
            self.send_error(
                400, "Bad request syntax: HTTP/0.9 is not supported; send 'METHOD PATH HTTP/1.1'"
            )
            return False
        return True

    def send_error(self, code, message=None, explain=None):
        """The stdlib's own errors (malformed request line, headers too large) as JSON too."""
        self.close_connection = True
        # Until a request line parses, the stdlib takes the client for HTTP/0.9 and would write
        # neither a status line nor headers: a bare JSON body no HTTP/1.x client can read.
        if self.request_version == "HTTP/0.9":
            self.request_version = self.protocol_version
        self._reply(code, {"error": message or http.HTTPStatus(code).phrase})

    def __getattr__(self, name):
        """do_X for every method: TF Serving answers any method, if only to say it is malformed."""
        if name.startswith("do_"):
            return self._handle
        raise AttributeError(name)

    def _handle(self):
        """Reads the body, routes the request, and writes the reply; no failure escapes."""
        try:
            status, reply, content_type = self._answer()
        except HttpError as e:
            status, reply, content_type = e.status, {"error": e.message}, None
        except Exception as e:  # The client gets a short message; the trace stays in the log.
            logging.exception("internal error on %s %s", self.command[:20], self.path[:200])
            status, reply, content_type = (
                500,
                {"error": f"Internal error: {type(e).__name__}"},
                None,
            )
        self._reply(status, reply, content_type=content_type)

    def _answer(self):
        """(status, reply, content type) of the request on this connection."""
        body = self._read_body()
        path = self.path.split("?", 1)[0].split("#", 1)[0]
        server = self.server
        if server.metrics_path is not None and path == server.metrics_path:
            return 200, server.metrics.prometheus_text(), "text/plain"  # As TF Serving sends it.
        if not _API_PATH.fullmatch(path):
            raise HttpError(404, f"Not found: {path[:200]} (the REST API is under /v1/)")
        if self.command == "OPTIONS":  # A CORS preflight, as http_server.cc answers it.
            if re.search(r"https?://", self.headers.get("Origin", "")):
                return 200, "", "application/json"
            error = errors.failed_precondition("Origin header is missing in CORS preflight")
            return error.http_status, {"error": error.message}, None
        status, reply = server.run_with_deadline(self.command, path, body)
        return status, reply, None

    def _reply(self, status, payload, headers=None, content_type=None):
        """Writes one reply: JSON (TF Serving's float text) unless a string with its own type."""
        if isinstance(payload, str):
            body = payload.encode("utf-8")
        else:
            body = json_codec.dumps(payload).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type or "application/json")
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            # The client is gone or stopped reading: nothing to tell it.
            self.close_connection = True

    def _read_body(self):
        """Reads the body after checking Content-Length against the limit (413 before reading any
        of it), and un-gzips a body sent with Content-Encoding: gzip, as TF Serving does."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise HttpError(411, "chunked request bodies are not supported; send Content-Length")
        lengths = {value.strip() for value in self.headers.get_all("Content-Length", [])}
        if not lengths:
            if self.command == "POST":
                self.close_connection = True  # Whatever follows cannot be delimited.
                raise HttpError(411, "POST needs a Content-Length header")
            return b""
        if len(lengths) > 1:
            # Two lengths mean two readings of where this request ends (request smuggling): RFC 9110
            # says to refuse. The same value repeated is one length.
            self.close_connection = True
            raise HttpError(
                400, f"conflicting Content-Length headers: {errors.short(sorted(lengths))}"
            )
        length_header = lengths.pop()
        if not (length_header.isascii() and length_header.isdigit()) or len(length_header) > 18:
            self.close_connection = True
            raise HttpError(400, f"bad Content-Length {errors.short(length_header)}")
        length = int(length_header)
        limit = self.server.max_request_bytes
        if length > limit:
            self.close_connection = True
            self._drain(min(length, 4 * limit, 64 << 20))
            raise HttpError(
                413, f"request body of {length} bytes is larger than the limit of {limit} bytes"
            )
        try:
            body = self.rfile.read(length)
        except TimeoutError as e:
            # Headers came, then the body stalled for the idle timeout.
            self.close_connection = True
            raise HttpError(
                408,
                f"the request body did not arrive within {self.timeout:g}s "
                f"of silence ({length} bytes announced)",
            ) from e
        except ConnectionError as e:  # The client went away mid-body: no one is left to answer.
            self.close_connection = True
            raise HttpError(400, "the connection closed while the body was being read") from e
        if len(body) != length:
            self.close_connection = True
            raise HttpError(400, "request body ended before Content-Length bytes")
        if "gzip" in self.headers.get("Content-Encoding", "").lower():
            body = _gunzip(body, limit)
        return body

    def _drain(self, limit):
        """Reads and drops what the client already sent (bounded), so the 413 is not lost to a TCP reset."""
        self.connection.settimeout(0.05)
        try:
            while limit > 0:
                chunk = self.rfile.read1(min(limit, 1 << 16))
                if not chunk:
                    break
                limit -= len(chunk)
        except OSError:
            pass


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


class HttpServer(http.server.ThreadingHTTPServer):
    """A thread per connection; threads are daemons so stop() never waits on an idle keep-alive
    client. Carries what the handler needs: the RestApi, limits and the metrics page."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self,
        address,
        rest_api,
        max_request_bytes,
        idle_timeout_s,
        deadline_s=None,
        metrics=None,
        metrics_path=None,
    ):
        super().__init__(address, Handler)
        self.rest_api = rest_api
        self.max_request_bytes = max_request_bytes
        self.idle_timeout_s = idle_timeout_s
        self.deadline_s = deadline_s
        self.metrics = metrics
        self.metrics_path = metrics_path

    def run_with_deadline(self, method, path, body):
        """rest_api.handle, answered with DEADLINE_EXCEEDED (504) once --rest_api_timeout_in_ms
        passes, as TF Serving's RunOptions timeout does; the model call itself runs to its end."""
        if not self.deadline_s:
            return self.rest_api.handle(method, path, body)
        outcome = {}
        done = threading.Event()

        def work():
            try:
                outcome["reply"] = self.rest_api.handle(method, path, body)
            except BaseException as e:  # Re-raised in the connection's thread below.
                outcome["error"] = e
            finally:
                done.set()

        threading.Thread(target=work, name="rest-request", daemon=True).start()
        if not done.wait(self.deadline_s):
            error = errors.ServingError("DEADLINE_EXCEEDED", "Deadline Exceeded")
            return error.http_status, {"error": error.message}
        if "error" in outcome:
            raise outcome["error"]
        return outcome["reply"]
