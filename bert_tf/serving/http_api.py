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
The connections themselves are http_stack's, which the playground shares.
"""

import re
import time
import urllib.parse
import zlib

from google.protobuf import json_format

from bert_tf.serving import errors, http_stack, json_codec, methods
from bert_tf.serving.http_stack import HttpError

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
SERVER_NAME = "bert_tf.serve"
# TF Serving's "api" label of its request metrics for a REST request is the verb (empty for GET).
_GET_API = ""


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


class HttpServer(http_stack.HttpServer):
    """The REST API on the shared asyncio HTTP stack (http_stack): the requests under /v1/ run in
    a pool of `num_threads` workers, with a deadline when `deadline_s` is given."""

    server_name = SERVER_NAME

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
        self.deadline_s = deadline_s
        self.metrics = metrics
        self.metrics_path = metrics_path
        super().__init__(
            address,
            max_request_bytes,
            idle_timeout_s,
            num_threads=num_threads,
            max_connections=max_connections,
            worker_name="rest",
        )

    def dumps(self, payload):
        """TF Serving's JSON: its float text."""
        return json_codec.dumps(payload)

    async def answer(self, connection, head, body):
        """(status, reply, content type) of one request."""
        path = head.path
        if self.metrics_path is not None and path == self.metrics_path:
            text = await self.in_worker(self.metrics.prometheus_text)
            return 200, text, "text/plain"  # As TF Serving sends it.
        if not _API_PATH.fullmatch(path):
            raise HttpError(404, f"Not found: {path[:200]} (the REST API is under /v1/)")
        if head.command == "OPTIONS":  # A CORS preflight, as http_server.cc answers it.
            if re.search(r"https?://", head.headers.get("Origin", "")):
                return 200, "", "application/json"
            error = errors.failed_precondition("Origin header is missing in CORS preflight")
            return error.http_status, {"error": error.message}, None
        gzipped = "gzip" in head.headers.get("Content-Encoding", "").lower()
        status, reply = await self.run_request(connection, head.command, path, body, gzipped)
        return status, reply, None

    async def run_request(self, connection, method, path, body, gzipped):
        """(status, reply) of rest_api.handle in a worker, which stops at its next chunk once its
        client hangs up. With a deadline (--rest_api_timeout_in_ms), DEADLINE_EXCEEDED (504) once
        it passes (and the request stops at its next chunk), as TF Serving's RunOptions timeout
        does."""

        def work(keep_going):
            if not keep_going.is_set():  # its deadline passed (or its client left) while it queued
                return deadline_exceeded()
            data = _gunzip(body, self.max_request_bytes) if gzipped else body
            status, reply = self.rest_api.handle(method, path, data, is_active=keep_going.is_set)
            return status, json_codec.dumps(reply).encode("utf-8")

        def deadline_exceeded():
            error = errors.ServingError("DEADLINE_EXCEEDED", "Deadline Exceeded")
            return error.http_status, {"error": error.message}

        try:
            return await connection.run_while_connected(work, self.deadline_s or None)
        except TimeoutError:
            return deadline_exceeded()
