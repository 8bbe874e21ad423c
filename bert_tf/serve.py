"""A local REST server that speaks TensorFlow Serving's REST API, for development and tests.

    python -m bert_tf.serve --model_base_path=export/NAME --model_name=NAME [--rest_api_port=8501]

It serves `BASE/<highest numeric version>/` (a SavedModel) under `/v1/models/NAME`, polls BASE for
newer versions and switches to one only after it has loaded completely, so requests never fail
during a switch. The endpoints, the request and reply JSON and the error codes follow TF Serving's
REST API (https://www.tensorflow.org/tfx/serving/api_rest), so a client written against this
server works unchanged against the `tensorflow/serving` image that production uses:

    GET  /v1/models/NAME[/versions/N]                 status
    GET  /v1/models/NAME[/versions/N]/metadata        signature defs
    POST /v1/models/NAME[/versions/N]:predict         {"instances": ...} or {"inputs": ...}
    POST /v1/models/NAME[/versions/N]:classify        {"examples": [...], "context"?: {...}}
    POST /v1/models/NAME[/versions/N]:regress

Errors are `{"error": "..."}` with TF Serving's HTTP codes: 400 bad request, 404 unknown model,
version or signature, 408 a body that stalls for `--rest_api_timeout_in_ms`, 413 body too large,
429 resource exhausted, 500 internal error. It never serves files, and it binds 127.0.0.1 unless
told otherwise. gRPC is not served.

Big requests: a request of more than `--max_batch_size` rows (default 32) runs through the model
in chunks of that many rows, one after the other, and the outputs are joined, so one request's
memory is bounded whatever its size (10,000 rows in one call of BERT-base take tens of GB), and
other requests are answered between its chunks. Outputs padded to the longest row of their call
(NER's entities) come out as from one call on the whole request. `--max_instances_per_request`
(0, the default, means no limit) refuses bigger requests with a 400.

Where this server's behaviour was a choice, it follows TF Serving's source
(`tensorflow_serving/util/json_tensor.cc`): a row reply is a plain list when the signature has one
output and a list of objects otherwise (the same for columnar replies); classify and regress reply
under the key "results"; outputs whose names end in `_bytes` come back as {"b64": ...}. One
difference: an unknown signature is a 404 here (TF Serving says 400), as the project's design asks.
Also as in TF Serving, :classify and :regress default to `serving_default` and refuse a signature
of another method, so clients pass "signature_name": "classification" (or "regression").

Versions: one version per model serves at a time (TF Serving's default "latest" policy); the
previous one finishes its in-flight requests. A new version directory is loaded once its files
have not changed between two polls (`--file_system_poll_wait_seconds`), so one copied in file by
file is not loaded half-written; one that fails to load is reported in the status as END with
its error and retried only when its files change. When no version directory is left under the
base path, the served version is unloaded (status END, OK; requests get 404), as TF Serving's
file-system source does; a base path that is itself missing changes nothing. Before a version
serves, each signature is called once on a dummy row, which moves the graph's instantiation
(seconds) out of the requests.
Not implemented: gRPC, /labels/, model_version_policy, and warm-up request files.
"""

import base64
import binascii
import concurrent.futures
import dataclasses
import http.server
import json
import os
import queue
import re
import signal
import threading
import time
import urllib.parse

import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the tokenizer ops exported graphs use)
from absl import flags, logging
from google.protobuf import json_format, text_format
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import saved_model_pb2

from bert_tf import cli, warmup
from bert_tf.io_utils import UsageError

PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
DEFAULT_SIGNATURE = "serving_default"
DEFAULT_MAX_REQUEST_BYTES = 32 << 20
# Rows per call of a model: a bigger request runs in chunks of this many (--max_batch_size).
DEFAULT_MAX_BATCH_SIZE = 32
# Deeper than any tensor a signature takes; JSON nested further is rejected before it is walked.
MAX_TENSOR_RANK = 32
_BYTES_SUFFIX = "_bytes"


# ----------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------


class RequestError(Exception):
    """A request the server refuses: carries the HTTP status and a message safe to show the client."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


def bad_request(message):
    """A 400 RequestError."""
    return RequestError(400, message)


def not_found(message):
    """A 404 RequestError."""
    return RequestError(404, message)


# TF Serving's mapping from a TensorFlow status code to an HTTP status (net_http's ToHTTPStatusCode).
_TF_ERROR_STATUS = {
    tf.errors.CancelledError: 499,
    tf.errors.InvalidArgumentError: 400,
    tf.errors.DeadlineExceededError: 504,
    tf.errors.NotFoundError: 404,
    tf.errors.AlreadyExistsError: 409,
    tf.errors.PermissionDeniedError: 403,
    tf.errors.ResourceExhaustedError: 429,
    tf.errors.FailedPreconditionError: 400,
    tf.errors.AbortedError: 409,
    tf.errors.OutOfRangeError: 400,
    tf.errors.UnimplementedError: 501,
    tf.errors.UnavailableError: 503,
    tf.errors.UnauthenticatedError: 401,
}


def _op_message(text):
    """The op's own message in a TensorFlow error text, without the stack traces and node lines."""
    # Graph errors embed the Python stack where each op was defined ("Detected at node X defined at
    # (most recent call last): File ..."), then the op's own message, then node and hint lines.
    # The client gets only the op's own message.
    noise = (
        "File ",
        "Detected at node",
        "Graph execution error",
        "[[",
        "[Op:",
        "Hint:",
        "Stack trace",
        "<stack traces unavailable>",
    )
    text = re.sub(r"\{\{function_node [^}]*\}\}|\[Op:[^\]]*\]", "", text)
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith(noise)]
    return lines[0] if lines else ""


def _tf_error_to_request_error(error):
    """Maps a tf.errors.OpError to TF Serving's HTTP status, with a message free of stack traces."""
    status = next((code for cls, code in _TF_ERROR_STATUS.items() if isinstance(error, cls)), 500)
    message = _op_message(str(error.message)) or type(error).__name__
    return RequestError(status, f"{type(error).__name__}: {message}"[:2000])


def _undecodable_tf_error(error):
    """A 400 for a TensorFlow error whose message TensorFlow's Python could not decode.

    Ops that reject input bytes quote them (ParseExample: "Could not parse example input, value:
    '...'"), and a message that is not UTF-8 reaches Python as this UnicodeDecodeError, with the
    error's code lost: only the request's own data gets into such a message, so it is the
    client's error. The message is shown with the bytes escaped.
    """
    raw = error.object if isinstance(error.object, bytes) else b""
    message = _op_message(raw.decode("utf-8", "backslashreplace")) or "the model rejected the input"
    return bad_request(f"{message} (TensorFlow's error message was not UTF-8)"[:2000])


def _short(value, limit=80):
    """A bounded repr of client-supplied data, for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


# ----------------------------------------------------------------------------------------------
# TF Serving's model config file (text proto), the subset this server reads
# ----------------------------------------------------------------------------------------------


class ModelConfigError(UsageError):
    """A malformed --model_config_file: names the file and line."""


_TOKEN = re.compile(
    r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
  | (?P<punct>[{}<>:;,\[\]])
""",
    re.VERBOSE,
)
_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "v": "\v",
    "?": "?",
}
# ModelConfig fields TF Serving knows that this server does not implement: accepted, then ignored.
_IGNORED_MODEL_CONFIG_FIELDS = (
    "model_version_policy",
    "version_labels",
    "logging_config",
    "model_type",
)


def _unescape(quoted, where):
    """Decodes a text-proto string literal (C escapes, octal and hex included)."""
    body, out, i = quoted[1:-1], bytearray(), 0
    while i < len(body):
        char = body[i]
        if char != "\\":
            out += char.encode("utf-8")
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in _ESCAPES:
            out += _ESCAPES[nxt].encode("utf-8")
            i += 2
        elif nxt in "01234567":
            digits = re.match(r"[0-7]{1,3}", body[i + 1 :]).group()
            out.append(int(digits, 8) & 0xFF)
            i += 1 + len(digits)
        elif nxt in "xX" and re.match(r"[0-9a-fA-F]{1,2}", body[i + 2 :]):
            digits = re.match(r"[0-9a-fA-F]{1,2}", body[i + 2 :]).group()
            out.append(int(digits, 16))
            i += 2 + len(digits)
        else:
            raise ModelConfigError(f"{where}: unknown escape \\{nxt} in string {quoted}")
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ModelConfigError(f"{where}: string {quoted} is not valid UTF-8") from e


def _tokenize_text_proto(text, source):
    """Splits text-proto into (kind, value, line) tokens; anything unrecognised is an error."""
    tokens, pos, line = [], 0, 1
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match:
            raise ModelConfigError(f"{source}:{line}: unexpected character {text[pos]!r}")
        kind, value = match.lastgroup, match.group()
        if kind == "string":
            tokens.append(("string", _unescape(value, f"{source}:{line}"), line))
        elif kind != "space":
            tokens.append((kind, value, line))
        line += value.count("\n")
        pos = match.end()
    return tokens


def _parse_text_proto_message(tokens, pos, source, closer):
    """Parses fields until `closer` (or the end when closer is None): returns ([(name, value, line)], pos).

    A value is a list of fields for a message, else (token kind, text) for a scalar.
    """
    fields = []
    while True:
        if pos == len(tokens):
            if closer is None:
                return fields, pos
            raise ModelConfigError(f"{source}: unexpected end of file, expected {closer!r}")
        kind, value, line = tokens[pos]
        if kind == "punct" and value == closer:
            return fields, pos + 1
        if kind != "ident":
            raise ModelConfigError(f"{source}:{line}: expected a field name, got {value!r}")
        name, pos = value, pos + 1
        has_colon = pos < len(tokens) and tokens[pos][:2] == ("punct", ":")
        pos += has_colon
        if pos == len(tokens):
            raise ModelConfigError(f"{source}:{line}: field {name!r} has no value")
        kind, value, line = tokens[pos]
        if kind == "punct" and value in "{<":
            sub_fields, pos = _parse_text_proto_message(
                tokens, pos + 1, source, "}" if value == "{" else ">"
            )
            fields.append((name, sub_fields, line))
        elif not has_colon:
            raise ModelConfigError(f"{source}:{line}: expected ':' or '{{' after field {name!r}")
        elif kind == "string":
            # Adjacent string literals concatenate, as in C and text proto.
            parts = []
            while pos < len(tokens) and tokens[pos][0] == "string":
                parts.append(tokens[pos][1])
                pos += 1
            fields.append((name, ("string", "".join(parts)), line))
        elif kind in ("ident", "number"):
            fields.append((name, (kind, value), line))
            pos += 1
        else:
            raise ModelConfigError(f"{source}:{line}: field {name!r} has no value (got {value!r})")
        # An optional separator after a field.
        if pos < len(tokens) and tokens[pos][0] == "punct" and tokens[pos][1] in ",;":
            pos += 1


def parse_model_config(text, source="model_config_file"):
    """Parses TF Serving's model_config_list text proto into {name: base_path}, in file order.

    Reads name, base_path and model_platform ("tensorflow"); TF Serving's other ModelConfig fields
    are accepted with a warning and ignored; anything else is an error naming the line.
    """
    fields, _ = _parse_text_proto_message(_tokenize_text_proto(text, source), 0, source, None)
    models = {}
    if not fields:
        raise ModelConfigError(
            f"{source}: empty config; expected model_config_list {{ config {{ ... }} }}"
        )
    for name, value, line in fields:
        if name != "model_config_list" or not isinstance(value, list):
            raise ModelConfigError(
                f"{source}:{line}: expected 'model_config_list {{ ... }}', got field {name!r} "
                "(custom_model_config is not supported)"
            )
        for config_name, config, config_line in value:
            if config_name != "config" or not isinstance(config, list):
                raise ModelConfigError(
                    f"{source}:{config_line}: expected 'config {{ ... }}' inside model_config_list, "
                    f"got field {config_name!r}"
                )
            model = {}
            for key, field_value, key_line in config:
                if key in _IGNORED_MODEL_CONFIG_FIELDS:
                    logging.warning(
                        "%s:%d: %s is not supported by bert_tf.serve; ignored",
                        source,
                        key_line,
                        key,
                    )
                    continue
                if key not in ("name", "base_path", "model_platform"):
                    raise ModelConfigError(
                        f"{source}:{key_line}: unknown ModelConfig field {key!r}"
                    )
                if (
                    not isinstance(field_value, tuple)
                    or field_value[0] != "string"
                    or not field_value[1]
                ):
                    raise ModelConfigError(
                        f"{source}:{key_line}: {key} must be a non-empty quoted string"
                    )
                if key in model:
                    raise ModelConfigError(f"{source}:{key_line}: {key} given twice")
                model[key] = field_value[1]
            for required in ("name", "base_path"):
                if required not in model:
                    raise ModelConfigError(f"{source}:{config_line}: config has no {required}")
            if model.get("model_platform", "tensorflow") != "tensorflow":
                raise ModelConfigError(
                    f"{source}:{config_line}: model_platform {model['model_platform']!r} is not "
                    'supported; only "tensorflow"'
                )
            if model["name"] in models:
                raise ModelConfigError(
                    f"{source}:{config_line}: model {model['name']!r} configured twice"
                )
            models[model["name"]] = model["base_path"]
    if not models:
        raise ModelConfigError(f"{source}: model_config_list has no config")
    return models


# ----------------------------------------------------------------------------------------------
# Loaded models
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Signature:
    """One signature of a loaded SavedModel: its function, method and tensor specs."""

    name: str
    method_name: str
    function: object
    inputs: dict  # input name -> tf.TensorSpec
    outputs: dict  # output name -> tf.TensorSpec
    # A loaded function's first call instantiates and optimizes its graph (seconds). Concurrent
    # first calls would each do that work, so the first call runs alone under this lock.
    first_call_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    called: bool = False


class Servable:
    """One loaded version of a model: its signatures and their TF Serving metadata."""

    def __init__(self, name, version, path, warmup=True):
        self.name = name
        self.version = version
        self.path = path
        self.loaded = tf.saved_model.load(path)
        meta_graph = _serving_meta_graph(path)
        self.signature_def_json = {
            key: _message_to_json(meta_graph.signature_def[key]) for key in meta_graph.signature_def
        }
        self.signatures = {}
        for key, function in self.loaded.signatures.items():
            inputs = function.structured_input_signature[1]
            outputs = function.structured_outputs
            if not isinstance(outputs, dict):
                outputs = {"output_0": outputs}
            method = (
                meta_graph.signature_def[key].method_name if key in meta_graph.signature_def else ""
            )
            self.signatures[key] = Signature(
                key, method or PREDICT_METHOD, function, dict(inputs), dict(outputs)
            )
        self._batchers = {}
        self._batchers_lock = threading.Lock()
        self.closed = False
        if warmup:
            self._warm_up()

    def _warm_up(self):
        """Replays the version's warm-up requests, then calls each signature they left out once on a
        one-row dummy batch, before the version serves.

        A loaded function's first call instantiates and optimizes its graph, which takes seconds;
        doing it here keeps that out of the first requests (and out of a version switch). The
        warm-up file (assets.extra/tf_serving_warmup_requests, as TF Serving reads it) covers every
        padded length the export produces; a request of it that fails fails the load, as in TF
        Serving. A dummy input the graph rejects (an empty tf.Example, say) still pays the
        instantiation, so errors of the dummy calls are ignored.
        """
        start = time.perf_counter()
        requests = warmup.read_requests(self.path)
        for signature_name, inputs in requests:
            if signature_name not in self.signatures:
                raise ValueError(
                    f"{warmup.requests_path(self.path)}: a warm-up request names signature "
                    f"{signature_name!r}, which the model does not have"
                )
            call_signature(self.signatures[signature_name], inputs)
        replayed = {signature_name for signature_name, _ in requests}
        for signature in self.signatures.values():
            if signature.name in replayed:
                continue
            dummies = {}
            for name, spec in signature.inputs.items():
                dims = spec.shape.as_list() if spec.shape.rank is not None else [None]
                shape = [1 if size is None else size for size in dims]
                if spec.dtype == tf.string:
                    dummies[name] = np.full(shape, b"", dtype=object)
                else:
                    dummies[name] = np.zeros(shape, dtype=spec.dtype.as_numpy_dtype)
            try:
                call_signature(signature, dummies)
            except Exception:  # Only the graph's instantiation matters here.
                pass
        logging.info(
            "model %s version %d: warmed up %d signatures (%d warm-up requests) in %.1fs",
            self.name,
            self.version,
            len(self.signatures),
            len(requests),
            time.perf_counter() - start,
        )

    def signature(self, name):
        """The named signature, or a 404 naming the ones there are."""
        if not isinstance(name, str):
            raise bad_request(f"'signature_name' must be a string, got {_short(name)}")
        if name not in self.signatures:
            known = ", ".join(sorted(self.signatures)) or "none"
            raise not_found(
                f"Serving signature name: {_short(name)} not found in signature def of model "
                f"{self.name} version {self.version} (signatures: {known})"
            )
        return self.signatures[name]

    def run(self, signature, tensors, batching=None, max_rows=None):
        """Runs `signature` on {input name: np.ndarray}; returns {output name: np.ndarray}.

        A request of more than `max_rows` rows runs as chunks of at most that many, one after the
        other, so its memory is bounded whatever its size (one call on 10,000 rows of BERT-base
        needs tens of GB), and other requests run between its chunks: with batching, each chunk
        queues behind the requests that came while the previous one ran.
        """
        rows = _rows(signature, tensors)
        if max_rows is None or rows is None or rows <= max_rows:
            return self._run_once(signature, tensors, batching)
        chunks = []
        try:
            for start in range(0, rows, max_rows):
                part = {name: value[start : start + max_rows] for name, value in tensors.items()}
                try:
                    outputs = self._run_once(signature, part, batching)
                except RequestError as e:  # Its row numbers count from the chunk's first row.
                    raise RequestError(
                        e.status,
                        f"{e.message} (in rows {start} to "
                        f"{start + len(next(iter(part.values()))) - 1} of the "
                        f"request, which runs {max_rows} rows at a time)",
                    ) from e
                if not _one_per_row(outputs, len(next(iter(part.values())))):
                    raise _Unchunkable(f"outputs of {signature.name!r} are not one per row")
                chunks.append((part, outputs))
            chunks = self._even_out(signature, chunks, batching)
        except _Unchunkable as e:
            logging.warning(
                "model %s version %d: %s; running %d rows in one call",
                self.name,
                self.version,
                e,
                rows,
            )
            return self._run_once(signature, tensors, batching)
        return {
            name: np.concatenate([outputs[name] for _, outputs in chunks]) for name in chunks[0][1]
        }

    def _even_out(self, signature, chunks, batching):
        """Makes every chunk's outputs as long as the longest chunk's, exactly as one call would.

        Some outputs are padded to the longest row of their call (NER's entities per text), so a
        chunk without such a row comes out shorter, padded with whatever the model pads with. Such
        a chunk runs again together with the rows that reach the longest sizes (found by
        bisection), which the model then pads as one call on the whole request would; those extra
        rows' outputs are dropped. Chunks of equal shapes are returned as they are.
        """
        names = list(chunks[0][1])
        target = {
            name: tuple(max(sizes) for sizes in zip(*(out[name].shape[1:] for _, out in chunks)))
            for name in names
        }
        short = [
            i
            for i, (_, out) in enumerate(chunks)
            if any(out[name].shape[1:] != target[name] for name in names)
        ]
        if not short:
            return chunks
        needed = {
            (name, axis)
            for name in names
            for axis, size in enumerate(target[name])
            if any(out[name].shape[1 + axis] < size for _, out in chunks)
        }
        witnesses, reached = [], set()
        for name, axis in sorted(needed):
            if (name, axis) in reached:
                continue
            part = next(
                part for part, out in chunks if out[name].shape[1 + axis] == target[name][axis]
            )
            row = self._row_reaching(signature, part, name, axis, target[name][axis], batching)
            outputs = self._run_once(signature, row, batching)
            reached |= {(n, a) for n, a in needed if outputs[n].shape[1 + a] == target[n][a]}
            if (name, axis) not in reached:
                raise _Unchunkable(
                    f"output {name!r} of {signature.name!r} depends on more than each row"
                )
            witnesses.append(row)
        extra = {name: np.concatenate([row[name] for row in witnesses]) for name in witnesses[0]}
        for i in short:
            part, _ = chunks[i]
            rows = len(next(iter(part.values())))
            outputs = self._run_once(
                signature, {n: np.concatenate([v, extra[n]]) for n, v in part.items()}, batching
            )
            outputs = {name: value[:rows] for name, value in outputs.items()}
            if any(outputs[name].shape[1:] != target[name] for name in names):
                raise _Unchunkable(f"outputs of {signature.name!r} depend on more than each row")
            chunks[i] = (part, outputs)
        return chunks

    def _row_reaching(self, signature, part, name, axis, size, batching):
        """One row of `part` whose output `name` alone is `size` long along `axis`, by bisection.

        A call's output is as long as its longest row's, so of two halves of rows that reach it,
        one does.
        """
        low, high = 0, len(next(iter(part.values())))
        while high - low > 1:
            middle = (low + high) // 2
            outputs = self._run_once(
                signature, {n: v[low:middle] for n, v in part.items()}, batching
            )
            if outputs[name].shape[1 + axis] >= size:
                high = middle
            else:
                low = middle
        return {n: v[low : low + 1] for n, v in part.items()}

    def _run_once(self, signature, tensors, batching):
        """One call of the signature: through its batcher when batching applies, else directly."""
        if batching is not None and _batchable(signature):
            with self._batchers_lock:
                batcher = self._batchers.get(signature.name)
                if batcher is None and not self.closed:
                    batcher = self._batchers[signature.name] = _Batcher(self, signature, **batching)
            if batcher is not None:
                return batcher.run(tensors)
        return call_signature(signature, tensors)

    def close(self):
        """Stops this version's batchers once their queued requests are done; later calls run unbatched."""
        with self._batchers_lock:
            self.closed = True
            batchers, self._batchers = list(self._batchers.values()), {}
        for batcher in batchers:
            batcher.close()


class _Unchunkable(Exception):
    """A signature's outputs cannot be split into rows and joined again (say why)."""


def _rows(signature, tensors):
    """The rows of a request that can run in chunks: every input and output batch-major, else None."""
    specs = list(signature.inputs.values()) + list(signature.outputs.values())
    if not signature.inputs or not all(
        s.shape.rank is not None and s.shape.rank >= 1 and s.shape[0] is None for s in specs
    ):
        return None
    rows = {len(value) for value in tensors.values() if np.ndim(value) >= 1}
    if len(rows) != 1 or any(np.ndim(value) == 0 for value in tensors.values()):
        return None
    return rows.pop()


def _one_per_row(outputs, rows):
    """Whether every output has `rows` rows (and so can be joined with other chunks' along dim 0)."""
    return all(np.ndim(value) >= 1 and np.shape(value)[0] == rows for value in outputs.values())


def call_signature(signature, arrays):
    """Calls a signature's function on numpy inputs and returns numpy outputs; maps TF errors to HTTP."""
    if not signature.called:
        with signature.first_call_lock:
            if not signature.called:
                try:
                    return _call(signature, arrays)
                finally:
                    signature.called = True
    return _call(signature, arrays)


def _call(signature, arrays):
    """call_signature without the first-call lock."""
    try:
        tensors = {
            name: tf.constant(value, dtype=signature.inputs[name].dtype)
            for name, value in arrays.items()
        }
        outputs = signature.function(**tensors)
    except tf.errors.OpError as e:
        raise _tf_error_to_request_error(e) from e
    except UnicodeDecodeError as e:  # Before ValueError, its base class.
        raise _undecodable_tf_error(e) from e
    except (ValueError, TypeError) as e:
        # The function refused the inputs' structure, dtype or shape before running.
        raise bad_request(
            f"inputs do not match signature {signature.name!r}: {str(e).splitlines()[0][:500]}"
        ) from e
    if not isinstance(outputs, dict):
        outputs = {"output_0": outputs}
    return {name: value.numpy() for name, value in outputs.items()}


def _serving_meta_graph(path):
    """The MetaGraphDef tagged "serve" in saved_model.pb (or .pbtxt): the one TF Serving loads."""
    proto = saved_model_pb2.SavedModel()
    pb_path = os.path.join(path, "saved_model.pb")
    if tf.io.gfile.exists(pb_path):
        with tf.io.gfile.GFile(pb_path, "rb") as f:
            proto.ParseFromString(f.read())
    else:
        pb_path = os.path.join(path, "saved_model.pbtxt")
        with tf.io.gfile.GFile(pb_path, "r") as f:
            text_format.Parse(f.read(), proto)
    for meta_graph in proto.meta_graphs:
        if "serve" in meta_graph.meta_info_def.tags:
            return meta_graph
    raise ValueError(f"{pb_path}: no MetaGraphDef tagged 'serve'")


def _message_to_json(message):
    """A proto as TF Serving prints it: proto field names, every field shown, int64 as strings."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def list_versions(base_path):
    """{version: directory name} for the numeric directories under base_path ("00123" is 123).

    Other names are ignored, as TF Serving does.
    """
    try:
        names = tf.io.gfile.listdir(base_path)
    except tf.errors.NotFoundError:
        return {}
    versions = {}
    for name in sorted(names):
        name = name.rstrip("/")
        if name.isdigit() and name.isascii() and tf.io.gfile.isdir(os.path.join(base_path, name)):
            versions.setdefault(int(name), name)
    return versions


def _version_fingerprint(path):
    """Names, sizes and times of every file under a version directory: it changes while a copy runs."""
    entries = []
    try:
        for root, _, files in tf.io.gfile.walk(path):
            for file_name in files:
                stat = tf.io.gfile.stat(os.path.join(root, file_name))
                entries.append(
                    (
                        os.path.relpath(os.path.join(root, file_name), path),
                        stat.length,
                        stat.mtime_nsec,
                    )
                )
    except tf.errors.OpError:
        return None
    return tuple(sorted(entries))


class ModelManager:
    """One model name: serves its highest loadable version and switches when a newer one appears."""

    def __init__(self, name, base_path, on_loaded=None, warmup=True):
        self.name = name
        self.warmup = warmup
        self.base_path = base_path
        self.current = None  # The Servable requests use; replaced in one assignment.
        self._on_loaded = on_loaded
        self._states = {}  # version -> (state, error_code, error_message) for status.
        self._failed = {}  # version -> fingerprint of the directory that failed to load.
        self._seen = {}  # version -> fingerprint at the previous poll (copy in progress?).
        self._lock = threading.Lock()

    def poll(self, wait_for_stable=True):
        """Loads and switches to a newer version if there is one; returns True when it switched.

        A new directory is loaded only once its files are unchanged since the previous poll, so a
        version being copied in is not loaded half-written. A version that fails to load is logged
        and skipped until its files change; the current version keeps serving meanwhile.

        As TF Serving's file-system source: when the base path holds no version directory at all,
        nothing is aspired and the served version is unloaded (status END, OK); a base path that
        is itself missing is an error that changes nothing, as a volume may be away for a moment.
        """
        with self._lock:
            versions = list_versions(self.base_path)
            if not versions:
                if not tf.io.gfile.isdir(self.base_path):
                    if self.current is not None:
                        logging.error(
                            "model %s: base path %s not found; still serving version %d",
                            self.name,
                            self.base_path,
                            self.current.version,
                        )
                    return False
                self._unload_current()
            # Forget what was seen of directories that are gone, so one copied back is loaded again.
            for version in set(self._seen) - set(versions):
                self._seen.pop(version, None)
                self._failed.pop(version, None)
            current_version = self.current.version if self.current else -1
            for version in sorted(versions, reverse=True):
                if version <= current_version:
                    if version == current_version or not self._current_dir_gone():
                        return False
                path = os.path.join(self.base_path, versions[version])
                fingerprint = _version_fingerprint(path)
                previous, self._seen[version] = self._seen.get(version), fingerprint
                if fingerprint is None or self._failed.get(version) == fingerprint:
                    continue
                if wait_for_stable and fingerprint != previous:
                    return False  # Still being written, or first seen: look again next poll.
                if self._load(version, path, fingerprint):
                    return True
            return False

    def _unload_current(self):
        """Stops serving the current version (its directory is gone and no other is there)."""
        old, self.current = self.current, None
        if old is None:
            return
        logging.warning(
            "model %s: no version directories left under %s; unloading version %d",
            self.name,
            self.base_path,
            old.version,
        )
        # In-flight requests hold their own reference to `old` and finish on it.
        self._states[old.version] = ("END", "OK", "")
        old.close()

    def _current_dir_gone(self):
        """True when the served version's directory was removed (then a lower version may take over)."""
        return self.current is not None and not tf.io.gfile.exists(self.current.path)

    def _load(self, version, path, fingerprint):
        """Loads one version fully, then swaps it in; on failure records it and keeps the old one."""
        logging.info("model %s: loading version %d from %s", self.name, version, path)
        self._states[version] = ("LOADING", "OK", "")
        try:
            servable = Servable(self.name, version, path, warmup=self.warmup)
        except Exception as e:  # Any failure to load leaves the served version in place.
            logging.error(
                "model %s: version %d at %s failed to load: %s", self.name, version, path, e
            )
            self._failed[version] = fingerprint
            first_line = (str(e).strip().splitlines() or [""])[0][:300]
            self._states[version] = ("END", "UNKNOWN", f"{type(e).__name__}: {first_line}")
            return False
        old, self.current = self.current, servable
        self._failed.pop(version, None)
        self._states[version] = ("AVAILABLE", "OK", "")
        if old is not None:
            # In-flight requests hold their own reference to `old` and finish on it.
            self._states[old.version] = ("END", "OK", "")
            old.close()
        logging.info("model %s: serving version %d", self.name, version)
        if self._on_loaded:
            self._on_loaded(self.name, version)
        return True

    def servable(self, version=None):
        """The servable for a request: the current one, or 404 when none or another version is asked for."""
        servable = self.current
        if version is not None and (servable is None or version != servable.version):
            raise not_found(f"Servable not found for request: Specific({self.name}, {version})")
        if servable is None:
            raise not_found(
                f"Servable not found for request: Latest({self.name}): no version is loaded"
            )
        return servable

    def status(self, version=None):
        """TF Serving's GetModelStatusResponse as JSON: every version this server has seen, newest first."""
        states = dict(self._states)
        if version is not None:
            if version not in states:
                raise not_found(f"Could not find version {version} of model {self.name}")
            states = {version: states[version]}
        if not states:
            raise not_found(f"Could not find any versions of model {self.name}")
        return {
            "model_version_status": [
                {
                    "version": str(v),
                    "state": state,
                    "status": {"error_code": code, "error_message": message},
                }
                for v, (state, code, message) in sorted(states.items(), reverse=True)
            ]
        }


# ----------------------------------------------------------------------------------------------
# JSON <-> tensors, following json_tensor.cc
# ----------------------------------------------------------------------------------------------


def parse_json_body(body):
    """Decodes a request body as a UTF-8 JSON object; anything else is a 400."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"request body is not valid UTF-8 (byte {e.start})") from e
    try:
        value = json.loads(text)
    except RecursionError as e:
        raise bad_request("JSON Parse error: the document nests too deeply") from e
    except ValueError as e:  # JSONDecodeError, and int() refusing a number with >4300 digits.
        raise bad_request(f"JSON Parse error: {str(e)[:200]}") from e
    if not isinstance(value, dict):
        raise bad_request(f"JSON Value: {_short(value)} Is not object")
    return value


def _is_b64_object(value):
    """True for TF Serving's binary string encoding {"b64": "..."}."""
    return isinstance(value, dict) and len(value) == 1 and "b64" in value


def _decode_b64(value, where):
    """The bytes of a {"b64": ...} object, or a 400."""
    encoded = value["b64"]
    if not isinstance(encoded, str):
        raise bad_request(f"{where}: 'b64' value must be a string, got {_short(encoded)}")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as e:
        raise bad_request(f"{where}: unable to base64 decode {_short(encoded)}") from e


def _string_leaf(value, where):
    """A JSON value for a DT_STRING element: a string (UTF-8 encoded) or {"b64": ...}."""
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as e:  # A lone surrogate written as a \uD800 escape.
            raise bad_request(f"{where}: string is not valid Unicode (lone surrogate)") from e
    if _is_b64_object(value):
        return _decode_b64(value, where)
    raise bad_request(
        f'{where}: expected a string or {{"b64": ...}} for DT_STRING, got {_short(value)}'
    )


def _leaf_converter(dtype):
    """A function checking and converting one JSON leaf to an element of `dtype`."""
    if dtype == tf.string:
        return _string_leaf
    if dtype == tf.bool:

        def to_bool(value, where):
            if not isinstance(value, bool):
                raise bad_request(
                    f"{where}: expected true or false for DT_BOOL, got {_short(value)}"
                )
            return value

        return to_bool
    if dtype.is_integer:
        low, high = dtype.min, dtype.max

        def to_int(value, where):
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad_request(
                    f"{where}: expected an integer for {_dtype_name(dtype)}, got {_short(value)}"
                )
            if not low <= value <= high:
                raise bad_request(
                    f"{where}: {_short(value)} is out of range for {_dtype_name(dtype)}"
                )
            return value

        return to_int
    if dtype.is_floating:

        def to_float(value, where):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise bad_request(
                    f"{where}: expected a number for {_dtype_name(dtype)}, got {_short(value)}"
                )
            return float(value)

        return to_float
    return None


def _dtype_name(dtype):
    """TF Serving's spelling of a dtype, e.g. DT_STRING."""
    return types_pb2.DataType.Name(dtype.as_datatype_enum)


def json_to_array(value, spec, where):
    """Converts a JSON (nested list) value to a numpy array for `spec`, or raises a 400 saying why.

    Walks the nesting level by level, without recursion, so a deep document cannot exhaust the
    stack; it must be rectangular and no deeper than the spec's rank.
    """
    convert = _leaf_converter(spec.dtype)
    if convert is None:
        raise bad_request(f"{where}: inputs of type {_dtype_name(spec.dtype)} are not supported")
    max_rank = spec.shape.rank if spec.shape.rank is not None else MAX_TENSOR_RANK
    shape, level = [], [value]
    while level and isinstance(level[0], list):
        if len(shape) == max_rank:
            raise bad_request(
                f"{where}: nested deeper than the expected rank {max_rank} (shape {spec.shape})"
            )
        length = len(level[0])
        for item in level:
            if not isinstance(item, list) or len(item) != length:
                raise bad_request(
                    f"{where}: expecting a rectangular tensor; lists at depth "
                    f"{len(shape) + 1} differ in length or type"
                )
        shape.append(length)
        level = [element for item in level for element in item]
    for element in level:
        if isinstance(element, list):
            raise bad_request(f"{where}: expecting a rectangular tensor; mixed lists and values")
    leaves = [convert(element, where) for element in level]
    if spec.dtype == tf.string:
        array = np.empty(len(leaves), dtype=object)
        array[:] = leaves
    else:
        array = np.array(leaves, dtype=spec.dtype.as_numpy_dtype)
    array = array.reshape(shape)
    if not tf.TensorShape(shape).is_compatible_with(spec.shape):
        raise bad_request(
            f"{where}: shape {list(shape)} does not match the signature's {_shape_text(spec.shape)}"
        )
    return array


def _shape_text(shape):
    """A TensorShape as [-1, 3] (TF Serving's unknown size is -1)."""
    if shape.rank is None:
        return "<unknown rank>"
    return "[" + ", ".join("-1" if d is None else str(d) for d in shape.as_list()) + "]"


def check_instances(count, limit):
    """A 400 when a request has more than `limit` instances (0: no limit)."""
    if limit and count > limit:
        raise bad_request(
            f"the request has {count} instances; this server takes at most {limit} "
            "per request (--max_instances_per_request)"
        )


def predict_inputs(request, signature, max_instances=0):
    """The signature's inputs as numpy arrays from a predict request; also says row or columnar.

    More than `max_instances` rows (0: any number) is a 400.
    """
    has_instances, has_inputs = "instances" in request, "inputs" in request
    if has_instances and has_inputs:
        raise bad_request("Not expecting both 'inputs' and 'instances' keys to exist")
    if not (has_instances or has_inputs):
        raise bad_request("Missing 'inputs' or 'instances' key")
    names = sorted(signature.inputs)
    if has_instances:
        format_, value = "row", request["instances"]
        if not isinstance(value, list):
            raise bad_request("Expecting 'instances' to be an list/array")
        if not value:
            raise bad_request("'instances' is an empty list/array")
        check_instances(len(value), max_instances)
        named = [isinstance(i, dict) and not _is_b64_object(i) for i in value]
        if any(named) and not all(named):
            raise bad_request(
                "'instances' mixes objects and values; use one form for every instance"
            )
        is_named = all(named)
        if is_named:
            columns = {name: [] for name in names}
            for index, instance in enumerate(value):
                if set(instance) != set(names):
                    raise bad_request(
                        f"instance {index} has keys {_short(sorted(instance))}, expecting the "
                        f"signature's inputs {names}"
                    )
                for name in names:
                    columns[name].append(instance[name])
        unnamed_error = f"Expecting object in 'instances' list: the signature has inputs {names}"
    else:
        format_, value = "columnar", request["inputs"]
        is_named = isinstance(value, dict) and not _is_b64_object(value)
        if is_named:
            if set(value) != set(names):
                missing, unknown = sorted(set(names) - set(value)), sorted(set(value) - set(names))
                raise bad_request(
                    f"'inputs' keys do not match the signature's inputs {names}: "
                    f"missing {_short(missing)}, unknown {_short(unknown)}"
                )
            columns = value
        unnamed_error = f"Expecting 'inputs' to be an object with the signature's inputs {names}"
    if not is_named:  # A bare value (or list of values) feeds a signature with one input.
        if len(names) != 1:
            raise bad_request(unnamed_error)
        columns = {names[0]: value}
    arrays = {
        name: json_to_array(columns[name], signature.inputs[name], f"input {name!r}")
        for name in names
    }
    check_instances(max((len(a) for a in arrays.values() if a.ndim), default=1), max_instances)
    return arrays, format_


def _floats_to_json(flat, dtype):
    """Python floats for JSON; float32 and narrower print with 9 significant digits, enough to round-trip."""
    if dtype == np.float64:
        return flat
    return [float("%.9g" % value) for value in flat]


def array_to_json(array, name):
    """A numpy output as nested JSON lists; strings decode as UTF-8 unless the name ends in _bytes."""
    array = np.asarray(array)
    if array.dtype == object or array.dtype.kind in "SU":
        if name.endswith(_BYTES_SUFFIX):
            flat = [{"b64": base64.b64encode(v).decode("ascii")} for v in array.ravel().tolist()]
        else:
            flat = [
                v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)
                for v in array.ravel().tolist()
            ]
    elif array.dtype.kind == "f" or array.dtype == tf.bfloat16.as_numpy_dtype:
        wide = array if array.dtype == np.float64 else array.astype(np.float32)
        flat = _floats_to_json(wide.ravel().tolist(), wide.dtype)
    elif array.dtype.kind in "iub":
        flat = array.ravel().tolist()
    else:
        raise RequestError(500, f"output {name!r} has dtype {array.dtype}, which JSON cannot carry")
    return _nest(flat, array.shape)


def _nest(flat, shape):
    """Rebuilds nested lists of `shape` from a flat list, without recursion."""
    if not shape:
        return flat[0]
    if 0 in shape:
        return np.zeros(shape, dtype=np.int8).tolist()  # Empty lists of the right nesting.
    for size in reversed(shape[1:]):
        flat = [flat[i : i + size] for i in range(0, len(flat), size)]
    return flat


def predict_response(outputs, format_):
    """TF Serving's predict reply: {"predictions": ...} for row requests, {"outputs": ...} for columnar."""
    names = sorted(outputs)
    if format_ == "columnar":
        if len(names) == 1:
            return {"outputs": array_to_json(outputs[names[0]], names[0])}
        return {"outputs": {name: array_to_json(outputs[name], name) for name in names}}
    batch = None
    for name in names:
        shape = np.shape(outputs[name])
        if not shape:
            raise bad_request(
                f"Tensor name: {name} has no shape information; use the 'inputs' (columnar) format"
            )
        if shape[0] < 1:
            raise bad_request(f"Tensor name: {name} has invalid batch size: {shape[0]}")
        if batch is not None and shape[0] != batch:
            raise bad_request(
                f"Tensor name: {name} has inconsistent batch size: {shape[0]} expecting: {batch}"
            )
        batch = shape[0]
    columns = {name: array_to_json(outputs[name], name) for name in names}
    if len(names) == 1:
        return {"predictions": columns[names[0]]}
    return {"predictions": [{name: columns[name][row] for name in names} for row in range(batch)]}


def _feature_from_json(value, name):
    """A tf.train.Feature from a JSON value or list: strings -> bytes, ints/bools -> int64, floats -> float."""
    values = value if isinstance(value, list) else [value]
    kind, items, where = None, [], f"Feature: {name}"
    for element in values:
        if isinstance(element, bool):
            element_kind, item = "int64", int(element)
        elif isinstance(element, int):
            if not -(1 << 63) <= element < (1 << 63):
                raise bad_request(f"{where} has element {_short(element)} out of int64 range")
            element_kind, item = "int64", element
        elif isinstance(element, float):
            element_kind, item = "float", element
        elif isinstance(element, str) or _is_b64_object(element):
            element_kind, item = "bytes", _string_leaf(element, where)
        else:
            raise bad_request(f"{where} has element with unexpected JSON type: {_short(element)}")
        if kind is not None and element_kind != kind:
            raise bad_request(f"Unexpected element type in feature: {name} expecting type: {kind}")
        kind = element_kind
        items.append(item)
    if kind == "bytes":
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=items))
    if kind == "int64":
        return tf.train.Feature(int64_list=tf.train.Int64List(value=items))
    if kind == "float":
        return tf.train.Feature(float_list=tf.train.FloatList(value=items))
    return tf.train.Feature()


def examples_from_request(request, max_instances=0):
    """Serialized tf.Examples from a classify/regress request, each with the context features merged in.

    More than `max_instances` examples (0: any number) is a 400.
    """
    context = request.get("context", {})
    if not isinstance(context, dict):
        raise bad_request(f"Example must be JSON object but got JSON {_short(context)}")
    context_features = {name: _feature_from_json(value, name) for name, value in context.items()}
    if "examples" not in request:
        raise bad_request("key 'examples' is expected and was not found")
    examples = request["examples"]
    if not isinstance(examples, list):
        raise bad_request("Expecting 'examples' value to be an list/array")
    if not examples:
        raise bad_request("'examples' value is an empty array")
    check_instances(len(examples), max_instances)
    serialized = []
    for index, example in enumerate(examples):
        if not isinstance(example, dict):
            raise bad_request(f"Example {index} must be JSON object but got JSON {_short(example)}")
        both = sorted(set(example) & set(context_features))
        if both:
            raise bad_request(
                f"Example {index}: feature(s) {_short(both)} also appear in 'context'"
            )
        features = dict(context_features)
        features.update({name: _feature_from_json(value, name) for name, value in example.items()})
        serialized.append(
            tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()
        )
    return serialized


def _run_examples(servable, request, method, what, max_batch_size=None, max_instances=0):
    """Runs a classify or regress request on its signature (checked for method and input).

    Returns the signature, its outputs and the number of examples. It runs in chunks of at most
    `max_batch_size` examples; more than `max_instances` (0: any number) is a 400.
    """
    signature = servable.signature(request.get("signature_name", DEFAULT_SIGNATURE))
    if signature.method_name != method:
        raise bad_request(
            f"Expected {what} signature method_name to be {method}. Was: {signature.method_name} "
            f'(signature {signature.name!r}; pass the right "signature_name")'
        )
    if len(signature.inputs) != 1 or next(iter(signature.inputs.values())).dtype != tf.string:
        raise RequestError(
            500,
            f"signature {signature.name!r} must take one DT_STRING input of serialized tf.Examples",
        )
    serialized = examples_from_request(request, max_instances)
    input_name = next(iter(signature.inputs))
    outputs = servable.run(
        signature, {input_name: np.array(serialized, dtype=object)}, max_rows=max_batch_size
    )
    return signature, outputs, len(serialized)


def classify(servable, request, max_batch_size=None, max_instances=0):
    """Runs a classify request: {"results": [[[label, score], ...], ...]}."""
    signature, outputs, batch = _run_examples(
        servable, request, CLASSIFY_METHOD, "classification", max_batch_size, max_instances
    )
    classes, scores = outputs.get("classes"), outputs.get("scores")
    if classes is None and scores is None:
        raise RequestError(
            500, f"signature {signature.name!r} returns neither 'classes' nor 'scores'"
        )
    for name, value in (("classes", classes), ("scores", scores)):
        if value is not None and (np.ndim(value) != 2 or np.shape(value)[0] != batch):
            raise RequestError(
                500,
                f"Expected output Tensor shape {name}: [batch_size num_classes] "
                f"but got {list(np.shape(value))}",
            )
    num_classes = np.shape(classes if classes is not None else scores)[1]
    results = []
    for row in range(batch):
        labels = (
            [c.decode("utf-8", errors="replace") for c in classes[row].tolist()]
            if classes is not None
            else [""] * num_classes
        )
        values = (
            _floats_to_json(scores[row].astype(np.float32).tolist(), np.float32)
            if scores is not None
            else [0.0] * num_classes
        )
        results.append([[label, score] for label, score in zip(labels, values)])
    return {"results": results}


def regress(servable, request, max_batch_size=None, max_instances=0):
    """Runs a regress request: {"results": [v, ...]}."""
    signature, outputs, batch = _run_examples(
        servable, request, REGRESS_METHOD, "regression", max_batch_size, max_instances
    )
    if "outputs" not in outputs:
        raise RequestError(500, f"signature {signature.name!r} has no 'outputs' output")
    values = np.asarray(outputs["outputs"])
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.ndim != 1 or values.shape[0] != batch:
        raise RequestError(
            500, f"Expected output Tensor shape outputs: [batch_size] but got {list(values.shape)}"
        )
    return {"results": _floats_to_json(values.astype(np.float32).tolist(), np.float32)}


# ----------------------------------------------------------------------------------------------
# Batching concurrent predict requests (--enable_batching)
# ----------------------------------------------------------------------------------------------


def _batchable(signature):
    """Whether requests to a signature can be concatenated along dim 0 and the outputs split back.

    Not when an output has a size other than the batch that is unknown while every input's is
    known (NER's entities per row, say): that size comes from the data, so a merged call would pad
    each request's rows to the largest in the merged batch and a reply would depend on the other
    requests. Unknown input sizes are fine: only requests with equal ones are merged.
    """
    specs = list(signature.inputs.values()) + list(signature.outputs.values())
    if not signature.inputs or not all(
        s.shape.rank is not None and s.shape.rank >= 1 and s.shape[0] is None for s in specs
    ):
        return False

    def inner_sizes_known(spec):
        return None not in spec.shape.as_list()[1:]

    return all(inner_sizes_known(s) for s in signature.outputs.values()) or not all(
        inner_sizes_known(s) for s in signature.inputs.values()
    )


# Texts up to this many bytes are one length class; above it each class spans a factor of two.
_SHORTEST_LENGTH_CLASS_BYTES = 32


def _length_class(arrays):
    """A request's text length class: the bit length of its longest string (in bytes) / 32.

    A string model pads a merged call to its longest text, so merging one long request with short
    ones would make every short row pay for the long one's length. Only requests whose longest
    texts are within about a factor of two of each other are merged (bytes stand in for tokens,
    which the server cannot count). Requests without strings are one class: their shapes, part of
    the batching key already, say their lengths.
    """
    longest = 0
    for array in arrays.values():
        if array.dtype == object and array.size:
            longest = max(longest, max(len(x) for x in array.reshape(-1)))
    return (longest // _SHORTEST_LENGTH_CLASS_BYTES).bit_length()


class _Batcher:
    """Merges concurrent requests to one signature into one call: waits up to `timeout_s` for more."""

    def __init__(self, servable, signature, max_batch_size=32, timeout_s=0.002):
        self.signature = signature
        self.max_batch_size = max_batch_size
        self.timeout_s = timeout_s
        self._queue = queue.Queue()
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._loop,
            name=f"batcher-{servable.name}-{servable.version}-{signature.name}",
            daemon=True,
        )
        self._thread.start()

    def run(self, arrays):
        """Queues one request and waits for its outputs; after close() it runs on its own."""
        rows = {len(a) for a in arrays.values()}
        with self._lock:
            if self._closed or len(rows) != 1:
                future = None
            else:
                future = concurrent.futures.Future()
                self._queue.put((arrays, rows.pop(), future))
        if future is None:
            return call_signature(self.signature, arrays)
        return future.result()

    def close(self):
        """Finishes what is queued, then stops the worker thread."""
        with self._lock:
            self._closed = True
            self._queue.put(None)

    def _loop(self):
        """Collects a batch (first request, then whatever arrives within the timeout) and runs it."""
        carry = None  # A request that would have made the last batch too big: it starts the next.
        while True:
            first, carry = (carry, None) if carry is not None else (self._queue.get(), None)
            if first is None:
                return
            batch, size, stop = [first], first[1], False
            deadline = time.monotonic() + self.timeout_s
            while size < self.max_batch_size:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                if size + item[1] > self.max_batch_size:
                    carry = item
                    break
                batch.append(item)
                size += item[1]
            self._run_batch(batch)
            if stop:
                while True:  # Serve anything queued before close() took the lock.
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        return
                    if item is not None:
                        self._run_batch([item])

    def _run_batch(self, batch):
        """Runs requests with equal trailing shapes and text lengths of one class together, and
        hands each its rows."""
        groups = {}
        for item in batch:
            key = tuple((name, a.shape[1:]) for name, a in sorted(item[0].items()))
            groups.setdefault((key, _length_class(item[0])), []).append(item)
        for items in groups.values():
            if len(items) == 1:
                self._run_alone(items[0])
                continue
            try:
                merged = {
                    name: np.concatenate([item[0][name] for item in items]) for name in items[0][0]
                }
                outputs = call_signature(self.signature, merged)
                total = sum(item[1] for item in items)
                if any(np.ndim(v) == 0 or np.shape(v)[0] != total for v in outputs.values()):
                    raise RequestError(500, "batched outputs lost the batch dimension")
                start = 0
                for arrays, rows, future in items:
                    future.set_result(
                        {name: v[start : start + rows] for name, v in outputs.items()}
                    )
                    start += rows
            except Exception:  # One bad request must not fail the others: run each on its own.
                for item in items:
                    if not item[2].done():
                        self._run_alone(item)

    def _run_alone(self, item):
        """Runs one queued request by itself and resolves its future with the outputs or the error."""
        arrays, _, future = item
        try:
            future.set_result(call_signature(self.signature, arrays))
        except Exception as e:  # The request's own error goes back to its handler thread.
            future.set_exception(e)


# ----------------------------------------------------------------------------------------------
# HTTP
# ----------------------------------------------------------------------------------------------


_MODEL_PATH = re.compile(
    r"/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>[^/:]+))?"
    r"(?:(?P<metadata>/metadata)|:(?P<verb>[^/:]+))?/?"
)


class _Handler(http.server.BaseHTTPRequestHandler):
    """Routes TF Serving's REST paths; every reply is JSON with a Content-Length (HTTP/1.1 keep-alive)."""

    protocol_version = "HTTP/1.1"
    server_version = "bert_tf.serve"
    # TCP_NODELAY: otherwise the reply's second segment waits on the client's delayed ACK (~40 ms).
    disable_nagle_algorithm = True
    error_content_type = "application/json"

    def setup(self):
        """Applies the idle timeout, so a silent keep-alive connection does not hold a thread forever."""
        self.timeout = self.server.model_server.idle_timeout_s
        super().setup()

    def log_message(self, format, *args):  # noqa: A002 (the stdlib's parameter name)
        """Access log lines go to absl's debug log, not stderr."""
        logging.debug("%s %s", self.address_string(), format % args)

    def parse_request(self):
        """The stdlib's parsing, minus HTTP/0.9: a request line without a version is a 400."""
        if not super().parse_request():
            return False
        if (
            self.request_version == "HTTP/0.9"
        ):  # "GET /path" alone; TF Serving does not take it either.
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
        """do_X for any method without a handler: a JSON 405."""
        # Any method without a do_X handler (PUT, DELETE, HEAD, or a made-up one) gets a JSON 405
        # instead of the stdlib's HTML 501.
        if name.startswith("do_"):
            return self._method_not_allowed
        raise AttributeError(name)

    def _method_not_allowed(self):
        """405 for methods TF Serving's REST API does not have."""
        self.close_connection = True  # The body (if any) was not read.
        self._reply(
            405,
            {"error": f"method {self.command[:20]} is not supported; use GET or POST"},
            {"Allow": "GET, POST"},
        )

    def do_GET(self):
        """Status and metadata."""
        self._respond(self._get)

    def do_POST(self):
        """Predict, classify and regress."""
        self._respond(self._post)

    def _respond(self, handle):
        """Runs a handler and turns every failure into TF Serving's JSON error reply."""
        try:
            status, payload = 200, handle()
        except RequestError as e:
            status, payload = e.status, {"error": e.message}
        except RecursionError:
            status, payload = 400, {"error": "request nests too deeply"}
        except Exception as e:  # The client gets a short message; the trace stays in the log.
            logging.exception("internal error on %s %s", self.command, self.path[:200])
            status, payload = 500, {"error": f"Internal error: {type(e).__name__}"}
        self._reply(status, payload)

    def _reply(self, status, payload, headers=None):
        """Writes one JSON reply."""
        body = json.dumps(payload, allow_nan=True, separators=(",", ":")).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = (
                True  # The client is gone or stopped reading: nothing to tell it.
            )

    def _route(self, method):
        """Parses the path into (manager, version, metadata?, verb); unknown paths are 404."""
        try:
            path = urllib.parse.unquote(
                self.path.split("?", 1)[0].split("#", 1)[0], errors="strict"
            )
        except UnicodeDecodeError as e:
            raise bad_request("the request path is not valid UTF-8 once %-decoded") from e
        match = _MODEL_PATH.fullmatch(path)
        if not match:
            raise not_found(f"Malformed request: {method} {_short(path, 200)}")
        name, version = match.group("name"), match.group("version")
        if version is not None:
            if not (version.isascii() and version.isdigit() and len(version) < 19):
                raise not_found(f"Malformed request: version {_short(version)} is not a number")
            version = int(version)
        manager = self.server.model_server.managers.get(name)
        if manager is None:
            raise not_found(f"Servable not found for request: Latest({_short(name, 200)})")
        return manager, version, bool(match.group("metadata")), match.group("verb")

    def _get(self):
        """GET status or metadata."""
        self._read_body(allow_empty=True)
        manager, version, metadata, verb = self._route("GET")
        if verb is not None:
            raise RequestError(405, f"use POST for :{_short(verb, 40)}")
        if not metadata:
            return manager.status(version)
        servable = manager.servable(version)
        return {
            "model_spec": {
                "name": manager.name,
                "signature_name": "",
                "version": str(servable.version),
            },
            "metadata": {"signature_def": {"signature_def": servable.signature_def_json}},
        }

    def _post(self):
        """POST :predict, :classify or :regress."""
        body = self._read_body()
        manager, version, metadata, verb = self._route("POST")
        if metadata or verb is None:
            raise RequestError(
                405, "use GET for status and metadata; POST takes :predict, :classify or :regress"
            )
        if verb not in ("predict", "classify", "regress"):
            raise not_found(f"Malformed request: unknown verb :{_short(verb, 40)}")
        request = parse_json_body(body)
        servable = manager.servable(version)
        options = self.server.model_server
        if verb == "classify":
            return classify(
                servable, request, options.max_batch_size, options.max_instances_per_request
            )
        if verb == "regress":
            return regress(
                servable, request, options.max_batch_size, options.max_instances_per_request
            )
        signature = servable.signature(request.get("signature_name", DEFAULT_SIGNATURE))
        arrays, format_ = predict_inputs(request, signature, options.max_instances_per_request)
        outputs = servable.run(signature, arrays, options.batching, options.max_batch_size)
        return predict_response(outputs, format_)

    def _read_body(self, allow_empty=False):
        """Reads the body after checking Content-Length against the limit (413 before reading any of it)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise RequestError(411, "chunked request bodies are not supported; send Content-Length")
        lengths = {value.strip() for value in self.headers.get_all("Content-Length", [])}
        if not lengths:
            if allow_empty:
                return b""
            self.close_connection = True  # Whatever follows cannot be delimited.
            raise RequestError(411, "POST needs a Content-Length header")
        if len(lengths) > 1:
            # Two lengths mean two readings of where this request ends (request smuggling): RFC 9110
            # says to refuse. The same value repeated is one length.
            self.close_connection = True
            raise bad_request(f"conflicting Content-Length headers: {_short(sorted(lengths))}")
        length_header = lengths.pop()
        if not (length_header.isascii() and length_header.isdigit()) or len(length_header) > 18:
            self.close_connection = True
            raise bad_request(f"bad Content-Length {_short(length_header)}")
        length = int(length_header)
        limit = self.server.model_server.max_request_bytes
        if length > limit:
            self.close_connection = True
            self._drain(min(length, 4 * limit, 64 << 20))
            raise RequestError(
                413, f"request body of {length} bytes is larger than the limit of {limit} bytes"
            )
        try:
            body = self.rfile.read(length)
        except TimeoutError as e:
            # Headers came, then the body stalled for the idle timeout (rest_api_timeout_in_ms).
            self.close_connection = True
            raise RequestError(
                408,
                f"the request body did not arrive within {self.timeout:g}s "
                f"of silence ({length} bytes announced)",
            ) from e
        except ConnectionError as e:  # The client went away mid-body: no one is left to answer.
            self.close_connection = True
            raise RequestError(400, "the connection closed while the body was being read") from e
        if len(body) != length:
            self.close_connection = True
            raise bad_request("request body ended before Content-Length bytes")
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


class _HTTPServer(http.server.ThreadingHTTPServer):
    """A thread per connection; threads are daemons so stop() never waits on an idle keep-alive client."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


class ModelServer:
    """TF Serving's REST API over {name: base_path}, in this process; start(), .port, stop().

    `on_loaded(name, version)` is called whenever a model starts serving a version (the CLI prints
    its "serving ..." line from it). A request of more than `max_batch_size` rows runs in chunks of
    that many, so one request's memory is bounded; more than `max_instances_per_request` rows is
    a 400 (0: no limit). `enable_batching` merges concurrent predict requests to the same
    signature into one call of up to `max_batch_size` rows, waiting at most
    `batch_timeout_micros` for company. `warmup` calls every signature once on a dummy row
    before a version serves, so no request (and no version switch) pays for graph instantiation.
    """

    def __init__(
        self,
        models,
        host="127.0.0.1",
        port=8501,
        poll_seconds=1.0,
        max_request_bytes=DEFAULT_MAX_REQUEST_BYTES,
        enable_batching=False,
        max_batch_size=DEFAULT_MAX_BATCH_SIZE,
        batch_timeout_micros=2000,
        idle_timeout_s=60.0,
        on_loaded=None,
        warmup=True,
        max_instances_per_request=0,
    ):
        if not models:
            raise UsageError("no models to serve")
        if max_batch_size < 1:
            raise UsageError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if max_instances_per_request < 0:
            raise UsageError(
                f"max_instances_per_request must be 0 (no limit) or more, got {max_instances_per_request}"
            )
        for name, base_path in models.items():
            if not name or "/" in name or ":" in name:
                raise UsageError(f"model name {name!r} must be non-empty and contain no '/' or ':'")
            if not tf.io.gfile.isdir(base_path):
                raise UsageError(
                    f"model base path {base_path!r} (model {name!r}) is not a directory"
                )
            if tf.io.gfile.exists(os.path.join(base_path, "saved_model.pb")) and not list_versions(
                base_path
            ):
                raise UsageError(
                    f"{base_path} holds a SavedModel directly; TF Serving's layout is "
                    f"{base_path}/<version>/saved_model.pb (e.g. {base_path}/1/)"
                )
        self.host = host
        self.requested_port = port
        self.poll_seconds = poll_seconds
        self.max_request_bytes = max_request_bytes
        self.idle_timeout_s = idle_timeout_s
        self.max_batch_size = max_batch_size
        self.max_instances_per_request = max_instances_per_request
        self.batching = (
            dict(max_batch_size=max_batch_size, timeout_s=batch_timeout_micros / 1e6)
            if enable_batching
            else None
        )
        self.managers = {
            name: ModelManager(name, path, on_loaded, warmup) for name, path in models.items()
        }
        self._httpd = None
        self._threads = []
        self._stopping = threading.Event()

    @property
    def port(self):
        """The bound port (the real one when 0 was asked for)."""
        return self._httpd.server_address[1]

    @property
    def url(self):
        """http://host:port of the running server."""
        return f"http://{self.host}:{self.port}"

    def start(self):
        """Loads the highest version of every model, binds the port, and starts serving and polling."""
        for manager in self.managers.values():
            manager.poll(wait_for_stable=False)
            if manager.current is None:
                logging.warning(
                    "model %s: no loadable version under %s yet; polling every %ss",
                    manager.name,
                    manager.base_path,
                    self.poll_seconds,
                )
        self._httpd = _HTTPServer((self.host, self.requested_port), _Handler)
        self._httpd.model_server = self
        self._threads = [
            threading.Thread(
                target=self._httpd.serve_forever,
                kwargs={"poll_interval": 0.1},
                name="http",
                daemon=True,
            )
        ]
        if self.poll_seconds and self.poll_seconds > 0:
            self._threads.append(
                threading.Thread(target=self._poll_loop, name="version-poll", daemon=True)
            )
        for thread in self._threads:
            thread.start()
        logging.info("REST API at %s", self.url)
        return self

    def _poll_loop(self):
        """Looks for new versions every poll_seconds until stop()."""
        while not self._stopping.wait(self.poll_seconds):
            for manager in self.managers.values():
                try:
                    manager.poll()
                except Exception:  # A bad directory must not stop polling for the other models.
                    logging.exception("model %s: version poll failed", manager.name)

    def stop(self):
        """Stops accepting, stops polling, and releases the port."""
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        for thread in self._threads:
            thread.join(timeout=30)
        for manager in self.managers.values():
            if manager.current is not None:
                manager.current.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------

FLAGS = flags.FLAGS
if __name__ == "__main__":
    flags.DEFINE_string(
        "model_base_path",
        None,
        "Directory holding the model's numeric version directories (TF Serving's flag).",
    )
    flags.DEFINE_string("model_name", "default", "Name the model is served under: /v1/models/NAME.")
    flags.DEFINE_string(
        "model_config_file",
        None,
        "TF Serving's model_config_list text proto, for several models; replaces "
        "--model_base_path and --model_name.",
    )
    flags.DEFINE_integer(
        "rest_api_port", 8501, "Port of the REST API; 0 picks a free one (printed)."
    )
    flags.DEFINE_string(
        "rest_api_host", "127.0.0.1", "Address to bind; use 0.0.0.0 only on a trusted network."
    )
    flags.DEFINE_integer(
        "port", 8500, "TF Serving's gRPC port: accepted for compatibility, not served."
    )
    flags.DEFINE_float(
        "file_system_poll_wait_seconds",
        1.0,
        "Seconds between looks for new model versions; 0 turns polling off.",
    )
    flags.DEFINE_integer(
        "max_request_bytes",
        DEFAULT_MAX_REQUEST_BYTES,
        "Largest request body accepted; a larger one gets 413 without being read.",
    )
    flags.DEFINE_integer(
        "rest_api_timeout_in_ms", 60000, "An idle keep-alive connection is closed after this long."
    )
    flags.DEFINE_bool(
        "enable_batching",
        False,
        "Merge concurrent predict requests to the same signature into one call.",
    )
    flags.DEFINE_integer(
        "max_batch_size",
        DEFAULT_MAX_BATCH_SIZE,
        "Most rows in one call of a model: a bigger request runs in chunks of this many, "
        "so its memory is bounded, and with --enable_batching merged calls stay within it.",
    )
    flags.DEFINE_integer(
        "max_instances_per_request",
        0,
        "A request with more instances (rows, or examples) than this gets a 400; 0 means no limit.",
    )
    flags.DEFINE_integer(
        "batch_timeout_micros",
        2000,
        "Longest a request waits for others to batch with (with --enable_batching).",
    )


def _models_from_flags():
    """{name: base_path} from --model_config_file, or from --model_base_path and --model_name."""
    if FLAGS.model_config_file and FLAGS.model_base_path:
        raise UsageError("give --model_config_file or --model_base_path, not both")
    if FLAGS.model_config_file:
        try:
            with tf.io.gfile.GFile(FLAGS.model_config_file, "r") as f:
                text = f.read()
        except (tf.errors.OpError, UnicodeDecodeError) as e:
            raise UsageError(
                f"--model_config_file={FLAGS.model_config_file}: cannot read it: {e}"
            ) from e
        return parse_model_config(text, FLAGS.model_config_file)
    if not FLAGS.model_base_path:
        raise UsageError("--model_base_path (or --model_config_file) is required")
    return {FLAGS.model_name: FLAGS.model_base_path}


def main(argv):
    """Serves until SIGINT or SIGTERM."""
    if len(argv) > 1:
        raise UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not 0 <= FLAGS.rest_api_port <= 65535:
        raise UsageError(f"--rest_api_port={FLAGS.rest_api_port} is not a port number")
    if FLAGS.max_request_bytes <= 0:
        raise UsageError("--max_request_bytes must be positive")
    if FLAGS["port"].present:
        logging.warning(
            "--port=%d: gRPC is not served by bert_tf.serve; only the REST API is", FLAGS.port
        )
    models = _models_from_flags()
    url = None  # Known once start() has bound the port; the versions it loaded are announced after.

    def announce(name, version):
        if url is not None:
            print(f"serving {name} version {version} at {url}", flush=True)

    server = ModelServer(
        models,
        host=FLAGS.rest_api_host,
        port=FLAGS.rest_api_port,
        poll_seconds=FLAGS.file_system_poll_wait_seconds,
        max_request_bytes=FLAGS.max_request_bytes,
        enable_batching=FLAGS.enable_batching,
        max_batch_size=FLAGS.max_batch_size,
        batch_timeout_micros=FLAGS.batch_timeout_micros,
        idle_timeout_s=FLAGS.rest_api_timeout_in_ms / 1000.0,
        on_loaded=announce,
        max_instances_per_request=FLAGS.max_instances_per_request,
    )
    try:
        server.start()
    except OSError as e:
        raise UsageError(
            f"cannot bind {FLAGS.rest_api_host}:{FLAGS.rest_api_port}: {e.strerror or e}"
        ) from e
    url = server.url
    for manager in server.managers.values():
        if manager.current is not None:
            announce(manager.name, manager.current.version)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    logging.info("stopping")
    server.stop()


if __name__ == "__main__":
    cli.run(main)
