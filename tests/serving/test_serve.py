"""bert_tf.serve over real HTTP on 127.0.0.1: real SavedModels (GraphTokenizer + tiny BERT), no mocks.

The reference for every model output is the same SavedModel called directly with
tf.saved_model.load; the reference for the JSON shapes is TF Serving's REST API documentation
and json_tensor.cc.
"""

import base64
import gc
import http.client
import json
import logging
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import psutil
import pytest
import tensorflow as tf
from helpers import run_module_cli
from helpers_serve import LABELS, V2_LABELS, make_base, model_server, split_raw_reply
from tensorflow.core.framework import types_pb2

from bert_tf import serve
from bert_tf.serving import config, errors, server_flags
from bert_tf.serving import servable as servable_module

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

TEXTS = ["a wonderful film", "the plot was dull and slow", "", "Überraschend gut! 😀"]


# ----------------------------------------------------------------------------------------------
# HTTP helpers
# ----------------------------------------------------------------------------------------------


def http_request(port, method, path, body=None, headers=None, connection=None):
    """One request; returns (status, parsed JSON body)."""
    own = connection is None
    connection = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode("utf-8")
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        raw = response.read()
        assert response.getheader("Content-Type") == "application/json", raw[:200]
        return response.status, json.loads(raw)
    finally:
        if own:
            connection.close()


def post(port, path, body, **kwargs):
    """POST a JSON body."""
    return http_request(port, "POST", path, body, **kwargs)


# ----------------------------------------------------------------------------------------------
# Fixtures
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory, exports):
    base = make_base(tmp_path_factory.mktemp("server"), exports)
    # No warm-up: each signature's first request pays its graph instantiation instead, which only
    # the tests that use it need (test_new_version_... covers warm-up).
    with model_server(
        {"clf": base}, port=0, poll_seconds=0, max_request_bytes=4 << 20, warmup=False
    ) as running:
        yield running


# ----------------------------------------------------------------------------------------------
# Status and metadata
# ----------------------------------------------------------------------------------------------


def test_status_is_tf_serving_json(server):
    expected = {
        "model_version_status": [
            {
                "version": "1",
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            }
        ]
    }
    assert http_request(server.port, "GET", "/v1/models/clf") == (200, expected)
    assert http_request(server.port, "GET", "/v1/models/clf/versions/1") == (200, expected)
    status, reply = http_request(server.port, "GET", "/v1/models/clf/versions/7")
    assert status == 404 and "7" in reply["error"]
    status, reply = http_request(server.port, "GET", "/v1/models/nope")
    assert status == 404 and "nope" in reply["error"]


def test_metadata_matches_the_savedmodel(server, direct):
    status, reply = http_request(server.port, "GET", "/v1/models/clf/metadata")
    assert status == 200
    assert reply["model_spec"] == {"name": "clf", "signature_name": "", "version": "1"}
    assert http_request(server.port, "GET", "/v1/models/clf/versions/1/metadata") == (200, reply)
    defs = reply["metadata"]["signature_def"]["signature_def"]
    assert set(direct.signatures) <= set(defs)
    default = defs["serving_default"]
    assert default["method_name"] == "tensorflow/serving/predict"
    assert default["inputs"]["text"]["dtype"] == "DT_STRING"
    assert default["inputs"]["text"]["tensor_shape"] == {
        "dim": [{"size": "-1", "name": ""}],
        "unknown_rank": False,
    }
    assert defs["classification"]["method_name"] == "tensorflow/serving/classify"
    assert defs["regression"]["method_name"] == "tensorflow/serving/regress"
    # Every signature's inputs and outputs agree with the loaded model's own specs.
    for name, function in direct.signatures.items():
        for specs, key in (
            (function.structured_input_signature[1], "inputs"),
            (function.structured_outputs, "outputs"),
        ):
            assert set(defs[name][key]) == set(specs)
            for tensor, spec in specs.items():
                info = defs[name][key][tensor]
                assert info["dtype"] == types_pb2.DataType.Name(spec.dtype.as_datatype_enum)
                dims = [int(d["size"]) for d in info["tensor_shape"].get("dim", [])]
                assert dims == [-1 if d is None else d for d in spec.shape.as_list()]
    assert defs["classification"]["outputs"]["scores"]["tensor_shape"]["dim"][1]["size"] == "3"


# ----------------------------------------------------------------------------------------------
# Predict
# ----------------------------------------------------------------------------------------------


def _direct_predict(direct, texts, signature="serving_default"):
    outputs = direct.signatures[signature](text=tf.constant(texts))
    return {name: value.numpy() for name, value in outputs.items()}


def test_predict_row_format_equals_direct_call(server, direct):
    status, reply = post(server.port, "/v1/models/clf:predict", {"instances": TEXTS})
    assert status == 200
    expected = _direct_predict(direct, TEXTS)
    assert len(reply["predictions"]) == len(TEXTS)
    for row, prediction in enumerate(reply["predictions"]):
        assert set(prediction) == {"probabilities", "label_id", "label"}
        np.testing.assert_allclose(
            prediction["probabilities"], expected["probabilities"][row], rtol=1e-6
        )
        assert prediction["label_id"] == int(expected["label_id"][row])
        assert (
            prediction["label"] == expected["label"][row].decode() == LABELS[prediction["label_id"]]
        )
    # The same rows written as objects, and through the explicit version URL.
    status, named = post(
        server.port,
        "/v1/models/clf/versions/1:predict",
        {"instances": [{"text": t} for t in TEXTS], "signature_name": "serving_default"},
    )
    assert status == 200 and named == reply


def test_predict_columnar_format(server, direct):
    status, reply = post(server.port, "/v1/models/clf:predict", {"inputs": {"text": TEXTS}})
    assert status == 200
    expected = _direct_predict(direct, TEXTS)
    outputs = reply["outputs"]
    assert set(outputs) == {"probabilities", "label_id", "label"}
    np.testing.assert_allclose(outputs["probabilities"], expected["probabilities"], rtol=1e-6)
    assert outputs["label_id"] == expected["label_id"].tolist()
    assert outputs["label"] == [b.decode() for b in expected["label"]]
    # A single-input signature also takes the bare tensor.
    assert post(server.port, "/v1/models/clf:predict", {"inputs": TEXTS}) == (200, reply)


def test_predict_b64_strings_and_bytes_outputs(server):
    raw = [b"\xff\xfe not utf-8 \x00", "caf\u00e9".encode(), b""]
    b64 = [{"b64": base64.b64encode(value).decode()} for value in raw]
    # Single output: the row reply is the list of values itself; `_bytes` outputs come back as b64.
    status, reply = post(
        server.port, "/v1/models/clf:predict", {"signature_name": "echo", "instances": b64}
    )
    assert status == 200
    assert reply == {"predictions": b64}
    status, reply = post(
        server.port, "/v1/models/clf:predict", {"signature_name": "echo", "inputs": b64}
    )
    assert status == 200 and reply == {"outputs": b64}
    # b64 and plain strings mean the same to the model.
    plain = post(server.port, "/v1/models/clf:predict", {"instances": ["a wonderful film"]})
    encoded = post(
        server.port,
        "/v1/models/clf:predict",
        {"instances": [{"b64": base64.b64encode(b"a wonderful film").decode()}]},
    )
    assert plain == encoded


def test_predict_pair_and_numeric_signatures(server, direct):
    pairs = [{"text_a": "is it good?", "text_b": "yes it is"}, {"text_a": "", "text_b": "no"}]
    status, reply = post(
        server.port, "/v1/models/clf:predict", {"signature_name": "pair", "instances": pairs}
    )
    assert status == 200
    expected = direct.signatures["pair"](
        text_a=tf.constant([p["text_a"] for p in pairs]),
        text_b=tf.constant([p["text_b"] for p in pairs]),
    )
    np.testing.assert_allclose(
        [p["probabilities"] for p in reply["predictions"]],
        expected["probabilities"].numpy(),
        rtol=1e-6,
    )
    status, reply = post(
        server.port,
        "/v1/models/clf:predict",
        {"signature_name": "scale", "inputs": {"x": [[1.5, -2], [0.25, 4]], "n": [2, 3]}},
    )
    assert status == 200
    assert reply == {"outputs": [[3.0, -4.0], [0.75, 12.0]]}
    status, reply = post(
        server.port,
        "/v1/models/clf:predict",
        {"signature_name": "scale", "instances": [{"x": [1, 2], "n": 1}]},
    )
    assert (status, reply) == (200, {"predictions": [[1.0, 2.0]]})


def test_empty_and_one_megabyte_strings(server, direct):
    long_text = "the quick brown fox jumps over the lazy dog " * 23000  # about 1 MB
    assert len(long_text) > 1_000_000
    status, reply = post(server.port, "/v1/models/clf:predict", {"instances": ["", long_text]})
    assert status == 200
    expected = _direct_predict(direct, ["", long_text[:2000]])  # Truncation keeps the first tokens.
    np.testing.assert_allclose(
        [p["probabilities"] for p in reply["predictions"]], expected["probabilities"], rtol=1e-5
    )


# ----------------------------------------------------------------------------------------------
# Classify and regress
# ----------------------------------------------------------------------------------------------


def test_classify_and_regress(server, direct):
    texts = TEXTS[:3]
    expected = _direct_predict(direct, texts)["probabilities"]
    request = {"signature_name": "classification", "examples": [{"text": t} for t in texts]}
    status, reply = post(server.port, "/v1/models/clf:classify", request)
    assert status == 200
    assert [[label for label, _ in row] for row in reply["results"]] == [LABELS] * len(texts)
    np.testing.assert_allclose(
        [[score for _, score in row] for row in reply["results"]], expected, rtol=1e-6
    )
    # Context features are merged into every example.
    status, with_context = post(
        server.port,
        "/v1/models/clf:classify",
        {"signature_name": "classification", "context": {"text": texts[0]}, "examples": [{}, {}]},
    )
    assert status == 200
    assert [[label for label, _ in row] for row in with_context["results"]] == [LABELS] * 2
    # Two rows of one text pad to another length than the three texts did: equal within rounding.
    np.testing.assert_allclose(
        [[score for _, score in row] for row in with_context["results"]],
        [expected[0]] * 2,
        rtol=1e-6,
    )
    status, reply = post(
        server.port,
        "/v1/models/clf:regress",
        {"signature_name": "regression", "examples": [{"text": [t]} for t in texts]},
    )
    assert status == 200
    np.testing.assert_allclose(reply["results"], expected[:, 1], rtol=1e-6)
    # The default signature is serving_default, which is a predict signature: a 400, as in TF Serving.
    status, reply = post(server.port, "/v1/models/clf:classify", {"examples": [{"text": "x"}]})
    assert status == 400 and "tensorflow/serving/classify" in reply["error"]


NOT_AN_EXAMPLE = b"\xff\xfe\x00garbage"


def test_bytes_that_are_not_a_tf_example_are_a_400(server):
    """Issue 16: TensorFlow quotes the bytes in its error, and its Python cannot decode that message."""
    garbage = {"b64": base64.b64encode(NOT_AN_EXAMPLE).decode()}
    status, reply = post(
        server.port,
        "/v1/models/clf:predict",
        {"signature_name": "classification", "instances": [garbage]},
    )
    assert status == 400, reply
    assert (
        reply["error"]
        == "InvalidArgumentError: assertion failed: [inputs[0] is not a serialized tf.Example]"
    )
    # `regression` parses with a bare tf.io.parse_example, as exports written before the check do:
    # still a 400, with TensorFlow's own message instead of a UnicodeDecodeError.
    status, reply = post(
        server.port,
        "/v1/models/clf:predict",
        {"signature_name": "regression", "inputs": [garbage, garbage]},
    )
    assert status == 400 and "Could not parse example input" in reply["error"], reply
    assert "codec" not in reply["error"]


def test_bytes_that_are_not_a_tf_example_in_a_fresh_process(exports):
    """The classification signature in an app's process: InvalidArgumentError naming the input."""
    script = textwrap.dedent("""
        import sys
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  (the tokenizer's ops)
        model = tf.saved_model.load(sys.argv[1])
        try:
            example = tf.train.Example(features=tf.train.Features(feature={"text": tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[b"fine"]))})).SerializeToString()
            model.signatures["classification"](inputs=tf.constant([example, b"\\xff\\xfe\\x00garbage"]))
        except Exception as e:
            print(type(e).__name__, str(e).replace(chr(10), " "))
    """)
    result = subprocess.run(
        [sys.executable, "-c", script, exports["v1"]],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("InvalidArgumentError "), result.stdout[:500]
    assert "inputs[1] is not a serialized tf.Example" in result.stdout, result.stdout[:500]


# ----------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------

ERROR_CASES = [
    # (method, path, body, expected status, a word the message must contain)
    ("POST", "/v1/models/clf:predict", b"{not json", 400, "JSON"),
    ("POST", "/v1/models/clf:predict", b"[1, 2]", 400, "object"),
    ("POST", "/v1/models/clf:predict", b'{"instances": ["\xff\xfe"]}', 400, "UTF-8"),
    ("POST", "/v1/models/clf:predict", {"instances": ["a"], "inputs": ["a"]}, 400, "both"),
    ("POST", "/v1/models/clf:predict", {"signature_name": "serving_default"}, 400, "instances"),
    ("POST", "/v1/models/clf:predict", {"instances": "a"}, 400, "list"),
    ("POST", "/v1/models/clf:predict", {"instances": []}, 400, "empty"),
    ("POST", "/v1/models/clf:predict", {"instances": [1, 2]}, 400, "DT_STRING"),
    ("POST", "/v1/models/clf:predict", {"instances": [["a"], ["b"]]}, 400, "rank"),
    ("POST", "/v1/models/clf:predict", {"instances": [{"txt": "a"}]}, 400, "text"),
    # The signature's input is missing; the unknown key is ignored, as json_tensor.cc ignores it.
    ("POST", "/v1/models/clf:predict", {"inputs": {"txt": ["a"]}}, 400, "Missing named input"),
    ("POST", "/v1/models/clf:predict", {"instances": [{"b64": "***"}]}, 400, "base64"),
    ("POST", "/v1/models/clf:predict", '{"instances": ["\\ud800"]}', 400, "surrogate"),
    ("POST", "/v1/models/clf:predict", {"instances": ["a"], "signature_name": 3}, 400, "string"),
    (
        "POST",
        "/v1/models/clf:predict",
        {"signature_name": "pair", "instances": ["a"]},
        400,
        "object",
    ),
    (
        "POST",
        "/v1/models/clf:predict",
        {"signature_name": "scale", "inputs": {"x": [[1, 2]], "n": [1.5]}},
        400,
        "integer",
    ),
    (
        "POST",
        "/v1/models/clf:predict",
        {"signature_name": "scale", "inputs": {"x": [[1, 2], [3]], "n": [1]}},
        400,
        "rectangular",
    ),
    (
        "POST",
        "/v1/models/clf:predict",
        {"signature_name": "scale", "inputs": {"x": [[1, 2, 3]], "n": [1]}},
        400,
        "shape",
    ),
    (
        "POST",
        "/v1/models/clf:predict",
        {"signature_name": "scale", "inputs": {"x": [[1, 2]], "n": [1 << 40]}},
        400,
        "range",
    ),
    (
        "POST",
        "/v1/models/clf:predict",
        {"signature_name": "scale", "inputs": {"x": [[1, 2]], "n": [-1]}},
        400,
        "non-negative",
    ),
    ("POST", "/v1/models/clf:predict", "[" * 10000 + "]" * 10000, 400, "deeply"),
    (
        "POST",
        "/v1/models/clf:predict",
        '{"instances": [' + "[" * 10000 + "]" * 10000 + "]}",
        400,
        "deeply",
    ),
    ("POST", "/v1/models/clf:predict", '{"instances": [' + "1" * 5000 + "]}", 400, "JSON"),
    # An unknown signature is INVALID_ARGUMENT, as TF Serving's REST handler looks it up
    # (GetInfoMap); the old server answered 404.
    ("POST", "/v1/models/clf:predict", {"signature_name": "nope", "instances": ["a"]}, 400, "nope"),
    ("POST", "/v1/models/nope:predict", {"instances": ["a"]}, 404, "nope"),
    ("POST", "/v1/models/clf/versions/9:predict", {"instances": ["a"]}, 404, "9"),
    # Malformed paths under /v1/ and other methods than GET and POST: see
    # test_malformed_requests_are_400_as_in_tf_serving.
    ("POST", "/v1/models/clf:explain", {"instances": ["a"]}, 400, "Malformed request"),
    ("GET", "/", None, 404, "/v1/"),
    ("GET", "/etc/passwd", None, 404, "/v1/"),
    ("GET", "/v1/models/clf/../../etc/passwd", None, 400, "Malformed request"),
    ("GET", "/v1/models/clf/versions/x", None, 400, "Malformed request"),
    ("GET", "/v1/models/clf:predict", None, 400, "Malformed request"),
    ("POST", "/v1/models/clf", {"instances": ["a"]}, 400, "Malformed request"),
    ("PUT", "/v1/models/clf:predict", b"{}", 400, "Malformed request"),
    ("DELETE", "/v1/models/clf", None, 400, "Malformed request"),
    ("POST", "/v1/models/clf:classify", {"signature_name": "classification"}, 400, "examples"),
    (
        "POST",
        "/v1/models/clf:classify",
        {"signature_name": "classification", "examples": {}},
        400,
        "list",
    ),
    (
        "POST",
        "/v1/models/clf:classify",
        {"signature_name": "classification", "examples": [{"text": None}]},
        400,
        "unexpected JSON type",
    ),
    (
        "POST",
        "/v1/models/clf:classify",
        {"signature_name": "classification", "examples": [{"text": [1, "a"]}]},
        400,
        "expecting type",
    ),
    (
        "POST",
        "/v1/models/clf:classify",
        {"signature_name": "classification", "context": {"text": "a"}, "examples": [{"text": "b"}]},
        400,
        "context",
    ),
    (
        "POST",
        "/v1/models/clf:classify",
        {"signature_name": "classification", "examples": [{"txt": "a"}]},
        400,
        "text",
    ),  # The graph's parse_example reports the missing feature.
    (
        "POST",
        "/v1/models/clf:regress",
        {"signature_name": "classification", "examples": [{"text": "a"}]},
        400,
        "regress",
    ),
    ("POST", "/v1/models/clf:predict", {"signature_name": "complex", "inputs": [1.0]}, 500, "JSON"),
]


@pytest.mark.parametrize(
    "method,path,body,expected,word",
    ERROR_CASES,
    ids=[f"{c[0]}-{c[3]}-{i}" for i, c in enumerate(ERROR_CASES)],
)
def test_errors_are_json_with_tf_serving_codes(server, method, path, body, expected, word):
    status, reply = http_request(server.port, method, path, body)
    assert status == expected, reply
    assert set(reply) == {"error"} and word.lower() in reply["error"].lower(), reply
    assert "Traceback" not in reply["error"] and 'File "' not in reply["error"]


def test_body_over_the_limit_is_413_before_it_is_read(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.putrequest("POST", "/v1/models/clf:predict")
    connection.putheader("Content-Length", str(1 << 30))  # Announce 1 GiB and send none of it.
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 413 and "limit" in json.loads(response.read())["error"]
    connection.close()
    # A body just over the limit that is actually sent also gets its 413.
    status, reply = post(server.port, "/v1/models/clf:predict", b" " * ((4 << 20) + 1))
    assert status == 413
    # Missing Content-Length on a POST.
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.putrequest("POST", "/v1/models/clf:predict")
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 411 and "error" in json.loads(response.read())
    connection.close()


def test_tf_error_codes_map_like_tf_serving():
    cases = [
        (tf.errors.ResourceExhaustedError(None, None, "OOM"), 429),
        (tf.errors.InvalidArgumentError(None, None, "bad"), 400),
        (tf.errors.NotFoundError(None, None, "x"), 404),
        (tf.errors.InternalError(None, None, "x"), 500),
        (tf.errors.UnavailableError(None, None, "x"), 503),
        (tf.errors.DeadlineExceededError(None, None, "x"), 504),
    ]
    for error, status in cases:
        assert errors.from_tf_error(error).http_status == status, error


def raw_exchange(port, data, timeout=30):
    """Sends raw bytes on a new connection; returns what the server sends until it closes (at most 1 MiB)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks, size = [], 0
        while size < (1 << 20):
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    "request_line,status",
    [
        (b"GARBAGE", b"400 Bad Request"),
        (b"\x00\x00\x00\x00", b"400 Bad Request"),
        (
            b"GET /v1/models/clf",
            b"400 Bad Request",
        ),  # HTTP/0.9, which TF Serving does not speak either
        (b"GET /v1/models/clf HTTP/one", b"400 Bad Request"),
        (b"GET /v1/models/clf HTTP/2.0", b"505 HTTP Version Not Supported"),
    ],
)
def test_a_bad_request_line_gets_a_status_line(server, request_line, status):
    """Regression: the stdlib answered these as HTTP/0.9, a JSON body without status line or headers."""
    raw = raw_exchange(server.port, request_line + b"\r\n\r\n")
    status_line, headers, body = split_raw_reply(raw)
    assert status_line == b"HTTP/1.1 " + status, raw[:200]
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)
    assert set(json.loads(body)) == {"error"}


@pytest.mark.parametrize("value_bytes", [65_527, 65_528, 70_000])
def test_an_over_long_header_line_gets_a_431(server, value_bytes):
    # Lines just over http.client's 65,536-byte limit once reached the header parser unchecked.
    head = b"GET /v1/models/clf HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * value_bytes
    raw = raw_exchange(server.port, head + b"\r\n\r\n")
    status_line, headers, body = split_raw_reply(raw)
    assert status_line == b"HTTP/1.1 431 Request Header Fields Too Large", raw[:200]
    assert headers["connection"] == "close" and set(json.loads(body)) == {"error"}


def test_expect_100_continue_gets_its_interim_reply_before_the_body(server):
    # curl sends big bodies this way: headers, a wait for "100 Continue", then the body.
    body = json.dumps({"instances": ["a wonderful film"]}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/models/clf:predict HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
        )
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    status_line, _, reply = split_raw_reply(raw)
    assert status_line == b"HTTP/1.1 200 OK", raw[:300]
    assert len(json.loads(reply)["predictions"]) == 1


def test_conflicting_content_lengths_are_a_400(server):
    body = b'{"instances": ["a"]}'
    head = b"POST /v1/models/clf:predict HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    raw = raw_exchange(
        server.port,
        head
        + b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(body), len(body) + 5)
        + body,
    )
    status_line, headers, reply = split_raw_reply(raw)
    assert status_line == b"HTTP/1.1 400 Bad Request", raw[:300]
    assert "Content-Length" in json.loads(reply)["error"] and headers["connection"] == "close"
    # The same length twice is one length (RFC 9110 lets a recipient accept it).
    raw = raw_exchange(
        server.port,
        head
        + b"Content-Length: %d\r\nContent-Length:  %d \r\n\r\n" % (len(body), len(body))
        + body,
    )
    status_line, _, reply = split_raw_reply(raw)
    assert status_line == b"HTTP/1.1 200 OK", raw[:300]
    assert len(json.loads(reply)["predictions"]) == 1


def test_a_stalled_body_gets_408_and_no_traceback(tmp_path, exports, caplog):
    """Complete headers, then part of the body and silence: 408 once the idle timeout passes."""
    base = make_base(tmp_path, exports)
    caplog.set_level(logging.INFO)
    with model_server(
        {"clf": base}, port=0, poll_seconds=0, idle_timeout_s=0.5, warmup=False
    ) as server:
        start = time.monotonic()
        raw = raw_exchange(
            server.port,
            b"POST /v1/models/clf:predict HTTP/1.1\r\nHost: x\r\n"
            b'Content-Length: 100\r\n\r\n{"instances": [',
            timeout=30,
        )
        waited = time.monotonic() - start
        # The server still answers on other connections.
        assert post(server.port, "/v1/models/clf:predict", {"instances": ["a"]})[0] == 200
    status_line, headers, body = split_raw_reply(raw)
    assert status_line == b"HTTP/1.1 408 Request Timeout", raw[:300]
    assert headers["connection"] == "close" and "error" in json.loads(body)
    assert 0.4 < waited < 20
    problems = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not problems, [r.getMessage() for r in problems]


# ----------------------------------------------------------------------------------------------
# Concurrency, batching, version switching
# ----------------------------------------------------------------------------------------------


def _run_clients(port, clients, requests_each, body_for):
    """Runs `clients` keep-alive clients in threads; returns the list of (status, reply) and errors."""
    results, errors = [], []

    def client(index):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            for i in range(requests_each):
                results.append(
                    (
                        index,
                        i,
                        *post(
                            port,
                            "/v1/models/clf:predict",
                            body_for(index, i),
                            connection=connection,
                        ),
                    )
                )
        except Exception as e:  # Recorded, and the test fails on it below.
            errors.append(repr(e))
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, errors


def test_32_concurrent_clients(server, direct):
    texts = [f"review number {i} was {'good' if i % 2 else 'bad'}" for i in range(32)]
    expected = _direct_predict(direct, texts)["probabilities"]
    results, errors = _run_clients(server.port, 32, 3, lambda c, i: {"instances": [texts[c]]})
    assert not errors
    assert len(results) == 96
    for client, _, status, reply in results:
        assert status == 200, reply
        np.testing.assert_allclose(
            reply["predictions"][0]["probabilities"], expected[client], rtol=1e-5
        )


def test_batching_gives_the_same_answers(tmp_path, exports, direct):
    texts = [f"sentence {i} " * (i % 5 + 1) for i in range(16)]
    expected = _direct_predict(direct, texts)["probabilities"]
    base = make_base(tmp_path, exports)
    with model_server(
        {"clf": base},
        port=0,
        poll_seconds=0,
        enable_batching=True,
        batch_timeout_micros=20000,
        max_batch_size=8,
        warmup=False,
    ) as server:
        results, errors = _run_clients(
            server.port, 16, 2, lambda c, i: {"instances": [texts[c], texts[(c + 1) % 16]]}
        )
        assert not errors
        for client, _, status, reply in results:
            assert status == 200, reply
            np.testing.assert_allclose(
                [p["probabilities"] for p in reply["predictions"]],
                expected[[client, (client + 1) % 16]],
                rtol=1e-5,
            )
        status, reply = post(server.port, "/v1/models/clf:predict", {"instances": [1]})
        assert status == 400


def test_batching_does_not_merge_a_long_request_with_short_ones(tmp_path, exports, monkeypatch):
    """Issue 12: a merged call pads every row to its longest text, so a long request waiting with
    short ones runs on its own and the short ones together."""
    calls, real = [], servable_module.call_signature

    def recording(signature, arrays):  # (rows, longest text) of each call
        texts = [t for a in arrays.values() if a.dtype == object for t in a.reshape(-1)]
        calls.append((len(texts), max(map(len, texts), default=0)))
        return real(signature, arrays)

    monkeypatch.setattr(servable_module, "call_signature", recording)
    base = make_base(tmp_path, exports)
    short = [f"short {i}" for i in range(4)]
    long = "a much longer text " * 40
    with model_server(
        {"clf": base},
        port=0,
        poll_seconds=0,
        enable_batching=True,
        batch_timeout_micros=500000,
        warmup=False,
    ) as server:
        results, errors = _run_clients(
            server.port, 5, 1, lambda c, i: {"instances": [short[c] if c < 4 else long]}
        )
    assert not errors and all(status == 200 for _, _, status, _ in results)
    assert (1, len(long)) in calls, calls  # the long one alone
    assert sum(rows for rows, _ in calls) == 5 and max(rows for rows, _ in calls) > 1, calls


class _WordSplitter(tf.Module):
    """Words of each text padded to the batch's longest row: an output size set by the data (as NER's)."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def split(self, text):
        return {"words": tf.strings.split(text).to_tensor("")}


def test_batching_does_not_pad_a_reply_to_other_requests(tmp_path):
    """A reply with --enable_batching equals the unbatched one when outputs' sizes depend on the data.

    Regression: the merged call padded every request's rows to the longest row of the merged
    batch, so a one-word request answered ["a", "", "", ...] when a longer request came at once.
    """
    module = _WordSplitter()
    tf.saved_model.save(
        module,
        str(tmp_path / "words" / "1"),
        signatures={"serving_default": module.split.get_concrete_function()},
    )
    texts = ["a", "one two three four five six"]
    with model_server(
        {"words": str(tmp_path / "words")},
        port=0,
        poll_seconds=0,
        enable_batching=True,
        batch_timeout_micros=500000,
        warmup=False,
    ) as server:
        replies = {}

        def client(text):
            replies[text] = post(server.port, "/v1/models/words:predict", {"instances": [text]})

        threads = [threading.Thread(target=client, args=(text,)) for text in texts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert replies["a"] == (200, {"predictions": [["a"]]})
    assert replies[texts[1]] == (200, {"predictions": [texts[1].split()]})


def record_model_calls(monkeypatch, seconds_per_row=0.0):
    """Wraps servable_module.call_signature; returns the list it fills with [signature, rows, start, end] per call.

    With `seconds_per_row`, calls of more than one row also sleep that long per row, so the tiny
    test model costs time per row as a real one does (the sleep holds what a real call holds).
    """
    calls = []
    real = servable_module.call_signature

    def recording(signature, arrays):
        rows = max((len(a) for a in arrays.values() if np.ndim(a)), default=0)
        call = [signature.name, rows, time.monotonic(), float("inf")]  # Listed while it runs.
        calls.append(call)
        try:
            if seconds_per_row and rows > 1:
                time.sleep(seconds_per_row * rows)
            return real(signature, arrays)
        finally:
            call[3] = time.monotonic()

    monkeypatch.setattr(servable_module, "call_signature", recording)
    return calls


def test_a_big_request_runs_in_chunks_and_memory_stays_bounded(server, direct, monkeypatch):
    """Issue 16: 10,000 instances in one request drove the server to 22.8 GB and the OOM killer.

    The `scratch` signature needs 256 KiB per row, so 3,000 rows in one call would take 750 MiB;
    in chunks of --max_batch_size (32) rows a call needs 8 MiB.
    """
    texts = [("w%d " % (i % 89)) * (1 + i % 4) for i in range(3000)]
    calls = record_model_calls(monkeypatch)
    assert (
        post(
            server.port,
            "/v1/models/clf:predict",
            {"signature_name": "scratch", "instances": texts[:2]},
        )[0]
        == 200
    )
    process = psutil.Process()
    gc.collect()
    before = process.memory_info().rss
    peak, stop = [before], threading.Event()

    def sample():
        while not stop.wait(0.002):
            peak[0] = max(peak[0], process.memory_info().rss)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        status, reply = post(
            server.port, "/v1/models/clf:predict", {"signature_name": "scratch", "instances": texts}
        )
    finally:
        stop.set()
        sampler.join()
    gc.collect()
    after = process.memory_info().rss
    mib = 1 << 20
    print(
        f"RSS before {before / mib:.0f} MiB, peak {peak[0] / mib:.0f} MiB, after {after / mib:.0f} MiB"
    )
    assert status == 200, reply
    sizes = [rows for name, rows, _, _ in calls[1:] if name == "scratch"]
    assert max(sizes) <= 32 and sum(sizes) == len(texts), sizes[:5]
    assert peak[0] - before < 300 * mib and after - before < 150 * mib
    expected = np.concatenate(
        [
            direct.signatures["scratch"](text=tf.constant(texts[i : i + 100]))["total"].numpy()
            for i in range(0, len(texts), 100)
        ]
    )
    np.testing.assert_allclose(reply["predictions"], expected, rtol=1e-6)


def test_chunks_of_outputs_padded_to_the_longest_row_are_joined_as_one_call(tmp_path, monkeypatch):
    """Outputs whose size follows the longest row of a call (NER's entities) come out as from one call."""
    module = _WordSplitter()
    tf.saved_model.save(
        module,
        str(tmp_path / "words" / "1"),
        signatures={"serving_default": module.split.get_concrete_function()},
    )
    texts = ["a", "b c", "d", "e f g h", "i", "j k", "l m n"]
    expected = tf.strings.split(tf.constant(texts)).to_tensor("").numpy().astype(str).tolist()
    calls = record_model_calls(monkeypatch)
    with model_server(
        {"words": str(tmp_path / "words")}, port=0, poll_seconds=0, max_batch_size=2, warmup=False
    ) as server:
        assert post(server.port, "/v1/models/words:predict", {"instances": texts}) == (
            200,
            {"predictions": expected},
        )
        assert post(server.port, "/v1/models/words:predict", {"inputs": texts}) == (
            200,
            {"outputs": expected},
        )
        # Every chunk as long as the longest: joined as they are.
        assert post(server.port, "/v1/models/words:predict", {"instances": ["x y"] * 5}) == (
            200,
            {"predictions": [["x", "y"]] * 5},
        )
    # Two rows a chunk, plus at most the one row that reaches the longest output when a chunk reruns.
    assert max(rows for _, rows, _, _ in calls) <= 3


def test_max_instances_per_request(tmp_path, exports):
    base = make_base(tmp_path, exports)
    with model_server(
        {"clf": base}, port=0, poll_seconds=0, max_instances_per_request=3, warmup=False
    ) as server:
        assert post(server.port, "/v1/models/clf:predict", {"instances": ["a"] * 3})[0] == 200
        for path, body in [
            ("/v1/models/clf:predict", {"instances": ["a"] * 4}),
            ("/v1/models/clf:predict", {"inputs": {"text": ["a"] * 4}}),
            (
                "/v1/models/clf:predict",
                {"signature_name": "pair", "instances": [{"text_a": "a", "text_b": "b"}] * 4},
            ),
            (
                "/v1/models/clf:classify",
                {"signature_name": "classification", "examples": [{"text": "a"}] * 4},
            ),
            (
                "/v1/models/clf:regress",
                {"signature_name": "regression", "examples": [{"text": "a"}] * 4},
            ),
        ]:
            status, reply = post(server.port, path, body)
            assert (
                status == 400
                and "max_instances_per_request" in reply["error"]
                and "4" in reply["error"]
            ), reply


@pytest.mark.parametrize("batching", [True, False], ids=["batching", "no_batching"])
def test_small_requests_are_answered_while_a_big_one_runs(tmp_path, exports, monkeypatch, batching):
    """A big request must not hold the model (or the batcher) for its whole duration."""
    calls = record_model_calls(monkeypatch, seconds_per_row=0.002)  # 800 rows: 1.6 s in the model
    base = make_base(tmp_path, exports)
    with model_server(
        {"clf": base},
        port=0,
        poll_seconds=0,
        enable_batching=batching,
        max_batch_size=16,
        batch_timeout_micros=1000,
        warmup=False,
    ) as server:
        assert post(server.port, "/v1/models/clf:predict", {"instances": ["warm up"]})[0] == 200
        big, result = [f"review number {i}" for i in range(800)], {}

        def send_big():
            result["reply"] = post(server.port, "/v1/models/clf:predict", {"instances": big})

        thread = threading.Thread(target=send_big)
        thread.start()
        deadline = time.monotonic() + 60
        while not any(rows > 1 for _, rows, _, _ in calls) and time.monotonic() < deadline:
            time.sleep(0.005)
        small = []  # (seconds it took, when it was answered)
        for _ in range(30):
            if not thread.is_alive():
                break
            start = time.monotonic()
            status, reply = post(
                server.port, "/v1/models/clf:predict", {"instances": ["a short one"]}
            )
            assert status == 200, reply
            small.append((time.monotonic() - start, time.monotonic()))
        thread.join(timeout=120)
    assert result["reply"][0] == 200 and len(result["reply"][1]["predictions"]) == len(big)
    big_end = max(end for _, rows, _, end in calls if rows > 1)
    answered_meanwhile = [seconds for seconds, when in small if when < big_end]
    print(
        f"big request in the model for {big_end - min(s for _, r, s, _ in calls if r > 1):.2f}s; "
        f"small requests meanwhile: {len(answered_meanwhile)}, latency max "
        f"{max(seconds for seconds, _ in small):.3f}s, median {sorted(s for s, _ in small)[len(small) // 2]:.3f}s"
    )
    assert len(answered_meanwhile) >= 3, small
    assert max(seconds for seconds, _ in small) < 5


@pytest.mark.slow
def test_new_version_is_picked_up_without_dropping_requests(tmp_path, exports):
    base = make_base(tmp_path, exports)
    loaded = []
    server = model_server(
        {"clf": base},
        port=0,
        poll_seconds=0.2,
        on_loaded=lambda name, version: loaded.append((name, version)),
    )
    server.start()
    try:
        assert loaded == [("clf", 1)]
        stop, replies, failures = threading.Event(), [], []

        def client():
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
            while not stop.is_set():
                try:
                    status, reply = post(
                        server.port,
                        "/v1/models/clf:predict",
                        {"instances": TEXTS},
                        connection=connection,
                    )
                    (replies if status == 200 else failures).append(reply)
                    time.sleep(0.01)  # Leave the CPU to the loading version too.
                except Exception as e:  # A dropped connection is a failure too.
                    failures.append(repr(e))
                    connection.close()
                    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
            connection.close()

        threads = [threading.Thread(target=client) for _ in range(2)]
        for thread in threads:
            thread.start()
        # A broken version 3 first: it is logged and skipped, version 1 keeps serving.
        (tmp_path / "broken").mkdir()
        (tmp_path / "broken" / "saved_model.pb").write_bytes(b"not a protobuf")
        os.rename(tmp_path / "broken", os.path.join(base, "3"))
        # Version 2 is copied in file by file (not atomically) while the clients run.
        shutil.copytree(exports["v2"], os.path.join(base, "2"))
        deadline = time.monotonic() + 60
        while ("clf", 2) not in loaded and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # Some requests on the new version.
        stop.set()
        for thread in threads:
            thread.join()
        assert loaded == [("clf", 1), ("clf", 2)]
        assert not failures, failures[:3]
        labels = [{p["label"] for p in reply["predictions"]} for reply in replies]
        assert labels[0] <= set(LABELS) and labels[-1] <= set(V2_LABELS)
        status, reply = http_request(server.port, "GET", "/v1/models/clf")
        states = {
            s["version"]: (s["state"], s["status"]["error_code"])
            for s in reply["model_version_status"]
        }
        assert states == {"3": ("END", "UNKNOWN"), "2": ("AVAILABLE", "OK"), "1": ("END", "OK")}
        assert http_request(server.port, "GET", "/v1/models/clf/versions/2")[0] == 200
        assert (
            post(server.port, "/v1/models/clf/versions/1:predict", {"instances": ["a"]})[0] == 404
        )
    finally:
        server.stop()


def _wait_for(condition, seconds):
    """Polls `condition` every 50 ms for at most `seconds`; returns its last value."""
    deadline = time.monotonic() + seconds
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def test_a_version_whose_directory_is_deleted_is_unloaded(tmp_path, exports):
    """As TF Serving: no version directories left means nothing is aspired, so the version unloads."""
    base = make_base(tmp_path, exports)
    with model_server({"clf": base}, port=0, poll_seconds=0.1, warmup=False) as server:
        assert post(server.port, "/v1/models/clf:predict", {"instances": ["a"]})[0] == 200
        # The base path itself gone (an unmounted volume, say) is an error that changes nothing.
        os.rename(base, base + ".away")
        time.sleep(0.5)
        assert (
            http_request(server.port, "GET", "/v1/models/clf")[1]["model_version_status"][0][
                "state"
            ]
            == "AVAILABLE"
        )
        assert post(server.port, "/v1/models/clf:predict", {"instances": ["a"]})[0] == 200
        os.rename(base + ".away", base)
        shutil.rmtree(os.path.join(base, "1"))

        def ended():
            reply = http_request(server.port, "GET", "/v1/models/clf")[1]
            return reply["model_version_status"][0]["state"] == "END" and reply

        assert _wait_for(ended, 20) == {
            "model_version_status": [
                {
                    "version": "1",
                    "state": "END",
                    "status": {"error_code": "OK", "error_message": ""},
                }
            ]
        }
        for path in ("/v1/models/clf:predict", "/v1/models/clf/versions/1:predict"):
            status, reply = post(server.port, path, {"instances": ["a"]})
            assert status == 404 and "clf" in reply["error"], reply
        assert http_request(server.port, "GET", "/v1/models/clf/metadata")[0] == 404
        # Copied back, it is loaded again.
        shutil.copytree(exports["v1"], os.path.join(base, "1"))
        assert _wait_for(
            lambda: post(server.port, "/v1/models/clf:predict", {"instances": ["a"]})[0] == 200, 60
        )
        assert (
            http_request(server.port, "GET", "/v1/models/clf")[1]["model_version_status"][0][
                "state"
            ]
            == "AVAILABLE"
        )


# ----------------------------------------------------------------------------------------------
# Model config file and the CLI
# ----------------------------------------------------------------------------------------------


def test_parse_model_config():
    text = """
    # Two models, as TF Serving's --model_config_file takes them.
    model_config_list {
      config { name: "clf" base_path: "/models/clf" model_platform: "tensorflow" }
      config: {
        name: 'squad', base_path: "/models/" "squad"
        model_version_policy { latest { num_versions: 1 } }
      }
    }
    """
    parsed = config.parse_model_config(text)
    models = config.models_of(parsed)
    assert {name: model.base_path for name, model in models.items()} == {
        "clf": "/models/clf",
        "squad": "/models/squad",
    }
    assert models["squad"].model_version_policy.latest.num_versions == 1
    # Protobuf's own text parser words the syntax errors, with line and column.
    bad = {
        'model_config_list { config { name: "a" } }': "no base_path",
        'model_config_list { config { name: "a" base_path: "/p" }': 'Expected "}"',
        'model_config_list { config { name: a base_path: "/p" } }': "Expected string",
        'model_config_list { config { name: "a" base_path: "/p" model_platform: "onnx" } }': "onnx",
        'model_config_list { config { name: "a" base_path: "/p" colour: "red" } }': "colour",
        "custom_model_config { }": "model_config_list",
        'model_config_list {\n config { name: "a" base_path: "/p" }\n config { name: "a" base_path: "/q" } }': "twice",
        'model_config_list { config { name: "a" base_path: "/p" ! } }': "Expected identifier",
        "": "model_config_list",
    }
    for text, message in bad.items():
        with pytest.raises(config.ModelConfigError, match=message):
            config.parse_model_config(text, "models.config")
    with pytest.raises(config.ModelConfigError, match=r"models.config:3:"):
        config.parse_model_config('model_config_list {\n config {\n  nme: "a" } }', "models.config")


def _env():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(serve.__file__)), env.get("PYTHONPATH", "")]
    )
    return env


@pytest.mark.slow
def test_cli_serves_a_model_config_file_in_a_subprocess(tmp_path, exports):
    base = make_base(tmp_path, exports)
    config = tmp_path / "models.config"
    config.write_text(
        f'model_config_list {{\n  config {{ name: "clf" base_path: "{base}" '
        f'model_platform: "tensorflow" }}\n  config {{ name: "again" base_path: "{base}" }}\n}}\n'
    )
    stderr_path = tmp_path / "stderr.txt"
    with open(
        stderr_path, "w"
    ) as stderr_file:  # A file, so a chatty child can never block on a full pipe.
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bert_tf.serve",
                f"--model_config_file={config}",
                "--rest_api_port=0",
                "--port=0",
                "--file_system_poll_wait_seconds=0.5",
                # Set before TensorFlow's first op, or the server would fail to start.
                "--tensorflow_intra_op_parallelism=1",
                "--tensorflow_inter_op_parallelism=2",
            ],
            stdout=subprocess.PIPE,
            stderr=stderr_file,
            text=True,
            env=_env(),
        )
    lines = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put(line) for line in process.stdout], daemon=True
    ).start()
    try:
        grpc_line = lines.get(timeout=300)
        assert re.fullmatch(r"gRPC API at 127\.0\.0\.1:\d+\n", grpc_line), grpc_line
        found = []
        for _ in range(2):
            line = lines.get(timeout=300)
            found.append(
                re.fullmatch(r"serving (\w+) version (\d+) at http://127\.0\.0\.1:(\d+)\n", line)
            )
            assert found[-1], line
        assert sorted(m.group(1) for m in found) == ["again", "clf"]
        port = int(found[0].group(3))
        for name in ("clf", "again"):
            status, reply = post(port, f"/v1/models/{name}:predict", {"instances": ["hello"]})
            assert status == 200 and reply["predictions"][0]["label"] in LABELS
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    stderr = stderr_path.read_text()
    assert process.returncode == 0, stderr[-2000:]


@pytest.mark.parametrize(
    "given, expected",
    [
        ({}, (0, 0)),
        ({"tensorflow_session_parallelism": 3}, (3, 3)),
        ({"tensorflow_intra_op_parallelism": 1}, (1, 0)),
        # As TF Serving: either per-pool flag replaces the session flag for both pools.
        ({"tensorflow_session_parallelism": 3, "tensorflow_inter_op_parallelism": 2}, (0, 2)),
        ({"tensorflow_intra_op_parallelism": 1, "tensorflow_inter_op_parallelism": 2}, (1, 2)),
    ],
)
def test_thread_flags_follow_tf_servings_rules(given, expected):
    assert server_flags.tensorflow_threads(server_flags.ServeArgs(**given)) == expected


def test_thread_flags_size_tensorflows_pools_in_a_fresh_process():
    script = textwrap.dedent(
        """
        import tensorflow as tf
        from bert_tf.serving import server_flags
        server_flags.set_tensorflow_threads(1, 3)
        tf.constant(1.0) + 1.0
        print(tf.config.threading.get_intra_op_parallelism_threads(),
              tf.config.threading.get_inter_op_parallelism_threads())
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=_env(), timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["1", "3"]


@pytest.mark.parametrize(
    "arguments, message",
    [
        (
            ["--tensorflow_intra_op_parallelism=-1"],
            "--tensorflow_intra_op_parallelism=-1: must be 0",
        ),
        (
            [
                "--tensorflow_session_parallelism=2",
                "--tensorflow_intra_op_parallelism=1",
                "--tensorflow_inter_op_parallelism=2",
            ],
            "not all three",
        ),
    ],
)
def test_bad_thread_flags_exit_2(tmp_path, arguments, message):
    result = run_module_cli("bert_tf.serve", f"--model_base_path={tmp_path}", *arguments)
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr


def test_cli_usage_error_exits_2(tmp_path):
    config = tmp_path / "models.config"
    config.write_text('model_config_list {\n  config { name: "clf" base_path: /no/quotes }\n}\n')
    result = run_module_cli("bert_tf.serve", f"--model_config_file={config}")
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"{config}:2:" in result.stderr


def test_a_model_directory_is_refused_naming_the_export_step(tmp_path):
    # A training job's output, given where an export belongs, would otherwise be polled forever.
    (tmp_path / "bert_config.json").write_text("{}")
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    result = run_module_cli("bert_tf.serve", f"--model_base_path={tmp_path}")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "is a model directory, not an export: run python -m bert_tf.export" in result.stderr
