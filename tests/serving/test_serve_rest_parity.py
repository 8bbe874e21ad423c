"""TF Serving's REST behaviours that clients notice, against a real server on 127.0.0.1.

Each rule names the TF Serving source it comes from (tensorflow_serving/..., read from the
tensorflow/serving repository). The servers are built from command-line flags through
bert_tf.serve.build_server, as `python -m bert_tf.serve` builds them.
"""

import ctypes
import ctypes.util
import gzip
import http.client
import json
import math
import re
import threading
import time
import tracemalloc
import zlib

import grpc
import numpy as np
import pytest
import tensorflow as tf
from absl import flags
from helpers_serve import make_base
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from bert_tf import serve
from bert_tf.runtime import cli
from bert_tf.serving import json_codec, server_flags
from bert_tf.serving import servable as servable_module

TEXTS = ["a wonderful film", "the plot was dull and slow", "", "Überraschend gut! 😀"]
MAX_REQUEST_BYTES = 1 << 20
# --rest_api_timeout_in_ms of the shared server: far longer than any call here, even a signature's
# first (cold) call while another test worker builds exports on the same 2 cores (CI saw 3 s pass).
DEADLINE_MS = 120_000
# The deadline the deadline test sets on the running server, so that it waits seconds, not minutes.
SHORT_DEADLINE_S = 3.0
METRICS_PATH = "/monitoring/prometheus/metrics"


# ----------------------------------------------------------------------------------------------
# Servers and clients
# ----------------------------------------------------------------------------------------------


def serve_args(*argv):
    """ServeArgs from command-line flags, parsed as `python -m bert_tf.serve` parses them."""
    flag_values = flags.FlagValues()  # Not the process's FLAGS.
    cli.define_flags(server_flags.ServeArgs, flag_values=flag_values)
    flag_values(["serve", *argv])
    return cli.args_from_flags(server_flags.ServeArgs, flag_values)


def base_flags(base):
    """The flags every server here shares: model clf, free ports, no polling, no warm-up."""
    return [
        f"--model_base_path={base}",
        "--model_name=clf",
        "--rest_api_port=0",
        "--port=0",
        "--file_system_poll_wait_seconds=0",
        "--noenable_model_warmup",
    ]


@pytest.fixture(scope="module")
def server(tmp_path_factory, exports):
    """One server for the module: a 1 MiB body limit, a 120 s REST deadline, no monitoring config."""
    base = make_base(tmp_path_factory.mktemp("parity"), exports)
    args = serve_args(
        *base_flags(base),
        f"--max_request_bytes={MAX_REQUEST_BYTES}",
        f"--rest_api_timeout_in_ms={DEADLINE_MS}",
    )
    with serve.build_server(args) as running:
        yield running


def exchange(port, method, path, body=b"", headers=None):
    """(status, headers, raw body bytes) of one request on a fresh connection."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def post(port, path, payload, headers=None, raw=None):
    """(status, parsed JSON reply) of a POST; `raw` sends those bytes instead of the payload."""
    body = raw if raw is not None else json.dumps(payload).encode("utf-8")
    status, reply_headers, reply = exchange(port, "POST", path, body, headers)
    assert reply_headers["Content-Type"] == "application/json", reply[:200]
    return status, json.loads(reply)


def assert_json_error(status, reply, low=400, high=499):
    """A TF Serving REST error: the status in [low, high] and the body {"error": "<message>"}."""
    assert low <= status <= high, (status, reply)
    assert set(reply) == {"error"} and isinstance(reply["error"], str) and reply["error"], reply


# ----------------------------------------------------------------------------------------------
# 1. Floats are written as TF Serving writes them
# ----------------------------------------------------------------------------------------------

# The reference is TF Serving's WriteDecimal (tensorflow_serving/util/json_tensor.cc) redone with
# the C library itself rather than Python's formatting: absl::StrCat(float) is printf's "%g" (six
# significant digits); when absl::SimpleAtof/SimpleAtod (strtof/strtod) does not read that back as
# the same value, "%.*g" with max_digits10 (9 for float, 17 for double); ".0" is appended to text
# with neither '.' nor 'e'; NaN and infinities are written NaN, Infinity and -Infinity.
_LIBC = ctypes.CDLL(ctypes.util.find_library("c"))
_LIBC.strtof.restype, _LIBC.strtof.argtypes = ctypes.c_float, [ctypes.c_char_p, ctypes.c_void_p]
_LIBC.strtod.restype, _LIBC.strtod.argtypes = ctypes.c_double, [ctypes.c_char_p, ctypes.c_void_p]


def _printf(fmt, value):
    buffer = ctypes.create_string_buffer(64)
    _LIBC.snprintf(buffer, len(buffer), fmt, ctypes.c_double(value))
    return buffer.value.decode("ascii")


def write_decimal(value, bits):
    """TF Serving's text of a float32 (bits=32) or float64, via C's printf and strtof/strtod."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "-Infinity" if value < 0 else "Infinity"
    text = _printf(b"%g", value)
    parse = _LIBC.strtof if bits == 32 else _LIBC.strtod
    if parse(text.encode("ascii"), None) != value:
        text = _printf(b"%.9g" if bits == 32 else b"%.17g", value)
    if "." not in text and "e" not in text:
        text += ".0"
    return text


# float32 values and their text in a TF Serving reply, worked out by hand from the rules above
# (and checked against write_decimal below).
FLOAT32_TEXTS = [
    (0.1, "0.1"),  # float32 0.1 is 0.100000001490116...: "0.1" reads back as it.
    (0.3, "0.3"),
    (2.5, "2.5"),
    (1.0, "1.0"),  # Whole numbers get ".0".
    (100.0, "100.0"),
    (100000.0, "100000.0"),
    (0.0001, "0.0001"),
    (-0.0, "-0.0"),
    (1e6, "1e+06"),  # %g switches to exponent form: no ".0".
    (9e6, "9e+06"),
    (1e10, "1e+10"),
    (3e-05, "3e-05"),
    (1 / 3, "0.333333343"),  # "0.333333" is another float32: nine digits.
    (123456.7, "123456.703"),  # float32 123456.703125; "123457" is not it.
    (1234567.0, "1234567.0"),  # "1.23457e+06" is not it; "%.9g" gives a whole number: ".0".
    (16777217.0, "16777216.0"),  # Not a float32: rounds to 2**24.
    (3.4028234663852886e38, "3.40282347e+38"),  # FLT_MAX
    (1.401298464324817e-45, "1.4013e-45"),  # The smallest subnormal: six digits read back.
    (float("nan"), "NaN"),
    (float("inf"), "Infinity"),
    (float("-inf"), "-Infinity"),
]
FLOAT64_TEXTS = [
    (0.1, "0.1"),
    (1.0, "1.0"),
    (1 / 3, "0.33333333333333331"),  # max_digits10 of a double is 17.
    (1234567.0, "1234567.0"),  # Exactly a double: "%.17g" gives a whole number.
    (1e300, "1e+300"),
    (float("-inf"), "-Infinity"),
]
# A JSON number as the reply writes it, or NaN/Infinity (json_tensor.cc writes them raw).
_NUMBER = re.compile(r"-?Infinity|NaN|-?\d+(?:\.\d+)?(?:e[+-]\d+)?")


def test_format_float_writes_floats_as_tf_serving(server):
    for value, text in FLOAT32_TEXTS:
        value32 = float(np.float32(value))
        assert write_decimal(value32, 32) == text, value  # The table agrees with the C reference.
        assert json_codec.format_float(np.float32(value), np.float32) == text, value
    for value, text in FLOAT64_TEXTS:
        assert write_decimal(value, 64) == text, value
        assert json_codec.format_float(value, np.float64) == text, value
    # Random float32 bit patterns (every exponent) and probabilities: the same text as the C
    # reference, and the text reads back as exactly the float32.
    rng = np.random.default_rng(20240611)
    patterns = rng.integers(0, 1 << 32, 4000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    probabilities = rng.random(1000, dtype=np.float32)
    for value in np.concatenate([patterns[np.isfinite(patterns)], probabilities]).tolist():
        text = json_codec.format_float(value, np.float32)
        assert text == write_decimal(value, 32), value
        assert _LIBC.strtof(text.encode("ascii"), None) == value, (value, text)
    for value in rng.standard_normal(500).tolist() + (rng.random(500) * 1e-300).tolist():
        assert json_codec.format_float(value, np.float64) == write_decimal(value, 64), value

    # The server's own reply text: the `scale` signature returns x * n, so n = 1 echoes each float32
    # of x. NaN and Infinity are sent as JSON literals, which TF Serving's parser takes
    # (kParseNanAndInfFlag in json_tensor.cc) and Python's json writes.
    # TensorFlow's CPU kernels flush subnormals to zero (as in TF Serving), so those are left out.
    cases = [(v, t) for v, t in FLOAT32_TEXTS if not 0 < abs(v) < np.finfo(np.float32).tiny]
    cases += [(0.1, "0.1")] * (len(cases) % 2)
    values = [float(np.float32(value)) for value, _ in cases]
    rows = [values[i : i + 2] for i in range(0, len(values), 2)]
    body = {"signature_name": "scale", "inputs": {"x": rows, "n": [1] * len(rows)}}
    status, headers, raw = exchange(
        server.port, "POST", "/v1/models/clf:predict", json.dumps(body).encode()
    )
    assert status == 200 and headers["Content-Type"] == "application/json", raw[:300]
    written = _NUMBER.findall(raw.decode("utf-8"))
    assert written == [text for _, text in cases]
    # And a client's JSON parser reads the reply back as those values.
    reply = json.loads(raw)
    assert set(reply) == {"outputs"}
    np.testing.assert_array_equal(np.array(reply["outputs"], dtype=np.float32), np.float32(rows))


def test_predict_floats_parse_back_to_the_savedmodel_s_float32(server, direct):
    status, headers, raw = exchange(
        server.port,
        "POST",
        "/v1/models/clf:predict",
        json.dumps({"inputs": {"text": TEXTS}}).encode(),
    )
    assert status == 200, raw[:300]
    texts = json.loads(raw, parse_float=str)["outputs"]["probabilities"]  # The numbers as written.
    expected = direct.signatures["serving_default"](text=tf.constant(TEXTS))["probabilities"]
    expected = expected.numpy()
    assert expected.dtype == np.float32 and np.shape(texts) == expected.shape
    # Bit for bit the SavedModel's own float32s, each in TF Serving's shortest text for it.
    np.testing.assert_array_equal(np.array(texts, dtype=np.float32), expected)
    for row_texts, row_values in zip(texts, expected.tolist()):
        for text, value in zip(row_texts, row_values):
            assert text == write_decimal(value, 32), (text, value)
            assert _LIBC.strtof(text.encode("ascii"), None) == value
    # The row format writes the same texts.
    status, rows = post(server.port, "/v1/models/clf:predict", {"instances": TEXTS})
    assert status == 200
    np.testing.assert_array_equal(
        np.array([row["probabilities"] for row in rows["predictions"]], dtype=np.float32), expected
    )


# ----------------------------------------------------------------------------------------------
# 2. gzip request bodies
# ----------------------------------------------------------------------------------------------

GZIP = {"Content-Encoding": "gzip"}


def test_gzip_body_gives_the_same_answer_as_a_plain_one(server):
    # util/net_http/server/internal/evhttp_request.cc: a body whose Content-Encoding contains "gzip"
    # is uncompressed before the REST handler reads it.
    for payload in (
        {"instances": TEXTS},
        {"signature_name": "pair", "inputs": {"text_a": TEXTS, "text_b": TEXTS[::-1]}},
    ):
        plain = post(server.port, "/v1/models/clf:predict", payload)
        assert plain[0] == 200, plain
        compressed = gzip.compress(json.dumps(payload).encode("utf-8"))
        assert post(server.port, "/v1/models/clf:predict", None, GZIP, raw=compressed) == plain


def test_corrupt_gzip_body_is_a_400_json_error(server):
    good = gzip.compress(json.dumps({"instances": TEXTS}).encode("utf-8"))
    bad_crc = good[:-8] + bytes([good[-8] ^ 0xFF]) + good[-7:]  # The CRC32 of the trailer.
    corrupt = [
        b'{"instances": ["not gzip at all"]}',  # Not gzip: "incorrect header check".
        bad_crc,
        good[: len(good) // 2],  # Truncated.
    ]
    for body in corrupt:
        # TF Serving: UncompressGzipBody fails, the handler reads an empty body, and the JSON
        # parser refuses it: 400 (INVALID_ARGUMENT) with {"error": ...}.
        status, reply = post(server.port, "/v1/models/clf:predict", None, GZIP, raw=body)
        assert_json_error(status, reply)
        assert status == 400
    assert post(server.port, "/v1/models/clf:predict", None, GZIP, raw=good)[0] == 200


def _gzip_bomb(inflated_bytes):
    """A gzip member of `inflated_bytes` of one JSON string, compressed about 1000 to 1."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [compressor.compress(b'{"instances": ["')]
    chunk = b"a" * (1 << 20)
    for _ in range(inflated_bytes >> 20):
        parts.append(compressor.compress(chunk))
    parts.append(compressor.compress(b'"]}'))
    parts.append(compressor.flush())
    return b"".join(parts)


def test_gzip_bomb_is_refused_without_inflating_it(server):
    inflated = 64 * MAX_REQUEST_BYTES
    bomb = _gzip_bomb(inflated)
    assert len(bomb) < MAX_REQUEST_BYTES // 4  # The compressed body itself is well under the limit.
    assert zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(bomb, 64)[:15] == b'{"instances": ['
    # The server runs in this process: tracemalloc sees every Python allocation its threads make,
    # zlib's output buffers included. Inflating the bomb would take 64 MiB.
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        status, reply = post(server.port, "/v1/models/clf:predict", None, GZIP, raw=bomb)
        _, peak = tracemalloc.get_traced_memory()
        peak -= before
    finally:
        if not was_tracing:
            tracemalloc.stop()
    assert_json_error(status, reply)
    assert status == 413 and str(MAX_REQUEST_BYTES) in reply["error"], reply
    assert peak < 16 * MAX_REQUEST_BYTES, f"peak {peak} bytes while refusing a gzip bomb"
    # The server goes on answering, gzipped requests too.
    assert post(server.port, "/v1/models/clf:predict", {"instances": ["still up"]})[0] == 200
    small = gzip.compress(json.dumps({"instances": ["still up"]}).encode("utf-8"))
    assert post(server.port, "/v1/models/clf:predict", None, GZIP, raw=small)[0] == 200


# ----------------------------------------------------------------------------------------------
# 3. Columnar inputs: other keys are ignored, a missing input is a 400
# ----------------------------------------------------------------------------------------------


def test_extra_columnar_keys_are_ignored_and_a_missing_input_is_a_400(server, direct):
    # util/json_tensor.cc, FillTensorMapFromInputsMap: each of the signature's inputs is looked up
    # in the "inputs" object (FindMember); other keys are never read; a missing one is
    # InvalidArgument("Missing named input: ", name, " in 'inputs' object.").
    pair = {"text_a": TEXTS, "text_b": TEXTS[::-1]}
    status, reply = post(
        server.port, "/v1/models/clf:predict", {"signature_name": "pair", "inputs": pair}
    )
    assert status == 200
    expected = direct.signatures["pair"](text_a=tf.constant(TEXTS), text_b=tf.constant(TEXTS[::-1]))
    np.testing.assert_array_equal(
        np.array(reply["outputs"]["probabilities"], dtype=np.float32),
        expected["probabilities"].numpy(),
    )
    extras = {"label": [1, 2, 3, 4], "meta": {"source": "test"}, "text": ["not an input"]}
    assert post(
        server.port,
        "/v1/models/clf:predict",
        {"signature_name": "pair", "inputs": {**pair, **extras}},
    ) == (200, reply)
    # The same for the single-input default signature.
    plain = post(server.port, "/v1/models/clf:predict", {"inputs": {"text": TEXTS}})
    assert plain[0] == 200
    with_extra = {"inputs": {"text": TEXTS, "text_a": ["x"], "n": 3}}
    assert post(server.port, "/v1/models/clf:predict", with_extra) == plain

    status, reply = post(
        server.port,
        "/v1/models/clf:predict",
        {"signature_name": "pair", "inputs": {"text_a": TEXTS, "extra": TEXTS}},
    )
    assert_json_error(status, reply)
    assert status == 400
    assert reply["error"] == "Missing named input: text_b in 'inputs' object."


# ----------------------------------------------------------------------------------------------
# 4. --rest_api_timeout_in_ms
# ----------------------------------------------------------------------------------------------


def test_a_call_slower_than_the_rest_deadline_is_a_504(server, monkeypatch):
    # model_servers/http_rest_api_handler.cc sets RunOptions.timeout_in_ms from
    # --rest_api_timeout_in_ms; a call past it is DEADLINE_EXCEEDED, which http_server.cc's
    # ToHTTPStatusCode answers with 504 (GATEWAY_TIMEOUT).
    echo = {"signature_name": "echo", "instances": ["slow"]}
    fast = {"instances": ["fast"]}
    # Warm both signatures, so that no first call's tracing counts against the short deadline.
    assert post(server.port, "/v1/models/clf:predict", echo)[0] == 200
    assert post(server.port, "/v1/models/clf:predict", fast)[0] == 200
    # The flag reached the HTTP server; the test shortens it there rather than wait 120 s.
    assert server._httpd.deadline_s == DEADLINE_MS / 1000
    monkeypatch.setattr(server._httpd, "deadline_s", SHORT_DEADLINE_S)
    real = servable_module.call_signature
    entered, release, finished = threading.Event(), threading.Event(), threading.Event()

    def held(signature, arrays):
        """The `echo` signature's call waits until the test releases it; the others run."""
        if signature.name != "echo" or release.is_set():
            return real(signature, arrays)
        entered.set()
        release.wait(60)
        try:
            return real(signature, arrays)
        finally:
            finished.set()

    monkeypatch.setattr(servable_module, "call_signature", held)
    try:
        start = time.monotonic()
        status, reply = post(server.port, "/v1/models/clf:predict", echo)
        elapsed = time.monotonic() - start
        assert_json_error(status, reply, 504, 504)
        assert entered.is_set() and not finished.is_set()  # Answered while the model call runs.
        assert SHORT_DEADLINE_S - 0.1 <= elapsed < SHORT_DEADLINE_S + 15, elapsed
        # A request on a fast path is answered (200, so within the deadline) while the slow call
        # still runs.
        status, reply = post(server.port, "/v1/models/clf:predict", fast)
        assert status == 200 and len(reply["predictions"]) == 1
    finally:
        release.set()
    assert finished.wait(60)
    # The signature that timed out answers again once its calls are fast.
    status, reply = post(server.port, "/v1/models/clf:predict", echo)
    assert (status, reply) == (200, {"predictions": [{"b64": "c2xvdw=="}]})  # b64 of "slow".


# ----------------------------------------------------------------------------------------------
# 5. Monitoring: --monitoring_config_file and the Prometheus page
# ----------------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text):
    """{metric name: {frozenset of (label, value): number}} of a Prometheus text page."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.fullmatch(line)
        assert match, line
        name, labels, value = match.groups()
        label_set = frozenset(_LABEL.findall(labels or ""))
        samples.setdefault(name, {})[label_set] = float(value)
    return samples


def labels(**values):
    return frozenset(values.items())


def test_no_monitoring_config_no_metrics_page(server):
    # model_servers/http_server.cc registers the Prometheus handler only when the MonitoringConfig
    # enables it; any other path outside /v1/ has no handler: 404.
    status, headers, raw = exchange(server.port, "GET", METRICS_PATH)
    assert status == 404 and headers["Content-Type"] == "application/json", raw[:200]
    assert_json_error(status, json.loads(raw), 404, 404)


def test_monitoring_counts_rest_and_grpc_requests(tmp_path, exports):
    # The MonitoringConfig as TF Serving's serving_config.md writes it.
    config_file = tmp_path / "monitoring.config"
    config_file.write_text(f'prometheus_config {{\n  enable: true,\n  path: "{METRICS_PATH}"\n}}\n')
    base = make_base(tmp_path, exports)
    args = serve_args(*base_flags(base), f"--monitoring_config_file={config_file}")
    assert args.monitoring_config_file == str(config_file) and args.port == 0
    with serve.build_server(args) as running:
        port = running.port
        path = "/v1/models/clf:predict"
        for _ in range(2):
            status, _ = post(port, path, {"signature_name": "serving_default", "instances": TEXTS})
            assert status == 200
        # A REST error: the pair signature without its second input.
        status, reply = post(port, path, {"signature_name": "pair", "inputs": {"text_a": ["x"]}})
        assert_json_error(status, reply)
        # A signature the model does not have is counted without its name: made-up names must
        # not grow the page.
        status, reply = post(port, path, {"signature_name": "made-up", "instances": TEXTS})
        assert_json_error(status, reply)
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "clf"
        request.model_spec.signature_name = "pair"
        request.inputs["text_a"].CopyFrom(tf.make_tensor_proto(["a good film"]))
        request.inputs["text_b"].CopyFrom(tf.make_tensor_proto(["a bad film"]))
        with grpc.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel:
            response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
                request, timeout=60
            )
        assert response.outputs["probabilities"].tensor_shape.dim[0].size == 1

        status, headers, raw = exchange(port, "GET", METRICS_PATH)
        # http_server.cc, ProcessPrometheusRequest: {"Content-Type", "text/plain"}.
        assert status == 200 and headers["Content-Type"] == "text/plain", (status, headers)
        page = raw.decode("utf-8")
        # Scraping is not a request of the API: a second scrape shows the same counts.
        assert exchange(port, "GET", METRICS_PATH)[2].decode("utf-8") == page
        other = exchange(port, "GET", METRICS_PATH + "x")
        assert other[0] == 404
    samples = parse_prometheus(page)
    assert "# TYPE :tensorflow:serving:request_count counter" in page.splitlines()
    assert "# TYPE :tensorflow:serving:request_latency histogram" in page.splitlines()
    # servables/tensorflow/util.cc: /tensorflow/serving/request_count is a Counter<2> labelled
    # model_name and status, bumped once per REST request (http_server.cc) and per gRPC Predict
    # (prediction_service_impl.cc); /tensorflow/serving/request_latency (model_name, API,
    # entrypoint) times the OK ones. '/' becomes ':' (util/prometheus_exporter.cc).
    assert samples[":tensorflow:serving:request_count"] == {
        labels(model_name="clf", status="OK"): 3,
        labels(model_name="clf", status="INVALID_ARGUMENT"): 2,
    }
    assert samples[":tensorflow:serving:request_latency_count"] == {
        labels(model_name="clf", API="predict", entrypoint="REST"): 2,
        labels(model_name="clf", API="Predict", entrypoint="GRPC"): 1,
    }
    # Ours: every request, also by the signature_name the client sent when the model has it.
    assert samples[":bert_tf:serving:request_count"] == {
        labels(
            model_name="clf",
            signature_name="serving_default",
            API="predict",
            entrypoint="REST",
            status="OK",
        ): 2,
        labels(
            model_name="clf",
            signature_name="pair",
            API="predict",
            entrypoint="REST",
            status="INVALID_ARGUMENT",
        ): 1,
        labels(
            model_name="clf",
            signature_name="",
            API="predict",
            entrypoint="REST",
            status="INVALID_ARGUMENT",
        ): 1,
        labels(
            model_name="clf", signature_name="pair", API="Predict", entrypoint="GRPC", status="OK"
        ): 1,
    }
    assert samples[":bert_tf:serving:request_latency_count"] == {
        labels(
            model_name="clf", signature_name="serving_default", API="predict", entrypoint="REST"
        ): 2,
        labels(model_name="clf", signature_name="pair", API="Predict", entrypoint="GRPC"): 1,
    }
