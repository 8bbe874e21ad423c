"""One error type for every protocol: a canonical status code (TF Serving's) and a message.

TF Serving answers every failure with an absl/gRPC canonical code. gRPC sends the code itself; the
REST handler derives its HTTP status from it (`ToHTTPStatusCode` in model_servers/http_server.cc),
so both protocols share one error and disagree only in how they spell it.
"""

import re

import grpc
from tensorflow.core.protobuf import error_codes_pb2

from bert_tf.serving.http_stack import short  # noqa: F401 (the bounded repr every API's messages use)

# model_servers/http_server.cc, ToHTTPStatusCode: canonical code -> HTTP status.
HTTP_STATUS = {
    "OK": 200,
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 400,
    "ABORTED": 409,
    "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DATA_LOSS": 500,
    "UNAUTHENTICATED": 401,
}
# Longest message a client gets: TensorFlow's own can quote a whole 32 MB input.
MAX_MESSAGE_CHARS = 2000


class ServingError(Exception):
    """A request the server refuses: a canonical code name ("INVALID_ARGUMENT", ...) and a message
    safe to show the client."""

    def __init__(self, code, message):
        if code not in HTTP_STATUS or code == "OK":
            raise ValueError(f"not an error code: {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message[:MAX_MESSAGE_CHARS]

    @property
    def http_status(self):
        """The HTTP status TF Serving's REST API answers this code with."""
        return HTTP_STATUS[self.code]

    @property
    def grpc_code(self):
        """The grpc.StatusCode of this code."""
        return grpc.StatusCode[self.code]


def invalid_argument(message):
    """INVALID_ARGUMENT: the request itself is wrong (HTTP 400)."""
    return ServingError("INVALID_ARGUMENT", message)


def not_found(message):
    """NOT_FOUND: an unknown model, version or servable (HTTP 404)."""
    return ServingError("NOT_FOUND", message)


def failed_precondition(message):
    """FAILED_PRECONDITION: the request does not fit the model's state or signature (HTTP 400)."""
    return ServingError("FAILED_PRECONDITION", message)


def internal(message):
    """INTERNAL: the model broke its own contract (HTTP 500)."""
    return ServingError("INTERNAL", message)


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


def from_tf_error(error):
    """A tf.errors.OpError as a ServingError with the same canonical code and no stack traces."""
    code = error_codes_pb2.Code.Name(error.error_code)
    if code not in HTTP_STATUS or code == "OK":
        code = "UNKNOWN"
    message = _op_message(str(error.message)) or type(error).__name__
    return ServingError(code, f"{type(error).__name__}: {message}")


def from_undecodable_tf_error(error):
    """INVALID_ARGUMENT for a TensorFlow error whose message TensorFlow's Python could not decode.

    Ops that reject input bytes quote them (ParseExample: "Could not parse example input, value:
    '...'"), and a message that is not UTF-8 reaches Python as this UnicodeDecodeError, with the
    error's code lost: only the request's own data gets into such a message, so it is the
    client's error. The message is shown with the bytes escaped.
    """
    raw = error.object if isinstance(error.object, bytes) else b""
    message = _op_message(raw.decode("utf-8", "backslashreplace")) or "the model rejected the input"
    return invalid_argument(f"{message} (TensorFlow's error message was not UTF-8)")
