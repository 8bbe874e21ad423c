"""One table of requests, sent over REST and over gRPC (through tensorflow-serving-api's own stubs)
to one server: the two protocols must give the same answers, and the same canonical error codes,
with REST's HTTP status derived from the code as TF Serving's http_server.cc derives it.

Where TF Serving's two front ends differ, the table says so and why (an unknown predict signature
is INVALID_ARGUMENT over REST, which looks it up first, and FAILED_PRECONDITION over gRPC).
"""

import dataclasses
import http.client
import json
import random
import re
import signal
import socket
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import json_format
from helpers import run_module_cli
from helpers_serve import make_base, model_server, serve_cli
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from bert_tf.runtime.io_utils import UsageError
from bert_tf.serving import client, core, errors, grpc_api
from bert_tf.serving import server as server_module

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

TEXTS = ["the film was delightful", "an awful, boring evening", "ok"]


@pytest.fixture(scope="module")
def server(tmp_path_factory, exports):
    base = make_base(tmp_path_factory.mktemp("protocols"), exports)
    with model_server({"clf": base}, grpc_port=0, warmup=False) as running:
        yield running


@pytest.fixture(scope="module")
def stubs(server):
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    yield (
        prediction_service_pb2_grpc.PredictionServiceStub(channel),
        model_service_pb2_grpc.ModelServiceStub(channel),
    )
    channel.close()


# ----------------------------------------------------------------------------------------------
# Clients
# ----------------------------------------------------------------------------------------------


def rest(port, method, path, body=None):
    """(status, parsed JSON reply) of one REST request."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        data = None if body is None else json.dumps(body).encode("utf-8")
        connection.request(method, path, body=data)
        reply = connection.getresponse()
        return reply.status, json.loads(reply.read().decode("utf-8"))
    finally:
        connection.close()


def call_grpc(stubs, method, request):
    """("OK", response) or (code name, details) of one gRPC call."""
    stub = stubs[1] if method == "GetModelStatus" else stubs[0]
    try:
        return "OK", getattr(stub, method)(request, timeout=60)
    except grpc.RpcError as e:
        return e.code().name, e.details()


def predict_request(name="clf", inputs=None, signature="", version=None):
    """A PredictRequest; `inputs` maps names to TensorProtos (default: TEXTS as "text")."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = version
    if inputs is None:
        inputs = {"text": tf.make_tensor_proto(TEXTS)}
    for key, proto in inputs.items():
        request.inputs[key].CopyFrom(proto)
    return request


def _examples_request(request_class, signature, texts=TEXTS, name="clf"):
    request = request_class()
    request.model_spec.name = name
    request.model_spec.signature_name = signature
    for text in texts:
        example = request.input.example_list.examples.add()
        example.features.feature["text"].bytes_list.value.append(text.encode("utf-8"))
    return request


def classify_request(signature="classification", **kwargs):
    """A ClassificationRequest of TEXTS as tf.Examples."""
    return _examples_request(classification_pb2.ClassificationRequest, signature, **kwargs)


def regress_request(signature="regression", **kwargs):
    """A RegressionRequest of TEXTS as tf.Examples."""
    return _examples_request(regression_pb2.RegressionRequest, signature, **kwargs)


def status_request(name="clf", version=None):
    """A GetModelStatusRequest."""
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = name
    if version is not None:
        request.model_spec.version.value = version
    return request


def metadata_request(name="clf"):
    """A GetModelMetadataRequest for the signature defs."""
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = name
    return request


def examples_json(texts=TEXTS):
    return [{"text": text} for text in texts]


# ----------------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    id: str
    rest: tuple  # (method, path, body)
    grpc: tuple  # (method, request)
    code: str  # the canonical code both must give
    rest_code: str = None  # TF Serving's REST code where it differs from gRPC's
    # False where REST refuses the JSON before a tensor exists, so its words are the JSON's.
    same_message: bool = True
    # TF Serving's own text for the error, where the test pins it (from its source, cited).
    message: str = None


CASES = [
    # Successes: the answers are compared with each other and with the model below.
    Case(
        "predict",
        ("POST", "/v1/models/clf:predict", {"instances": TEXTS}),
        ("Predict", predict_request()),
        "OK",
    ),
    Case(
        "predict_version",
        ("POST", "/v1/models/clf/versions/1:predict", {"inputs": {"text": TEXTS}}),
        ("Predict", predict_request(version=1)),
        "OK",
    ),
    Case(
        "classify",
        (
            "POST",
            "/v1/models/clf:classify",
            {"signature_name": "classification", "examples": examples_json()},
        ),
        ("Classify", classify_request()),
        "OK",
    ),
    Case(
        "regress",
        (
            "POST",
            "/v1/models/clf:regress",
            {"signature_name": "regression", "examples": examples_json()},
        ),
        ("Regress", regress_request()),
        "OK",
    ),
    Case("status", ("GET", "/v1/models/clf", None), ("GetModelStatus", status_request()), "OK"),
    Case(
        "metadata",
        ("GET", "/v1/models/clf/metadata", None),
        ("GetModelMetadata", metadata_request()),
        "OK",
    ),
    # An empty batch (columnar, as REST's row format needs at least one instance) runs.
    Case(
        "empty_batch",
        ("POST", "/v1/models/clf:predict", {"inputs": {"text": []}}),
        ("Predict", predict_request(inputs={"text": tf.make_tensor_proto([], tf.string)})),
        "OK",
    ),
    # Unknown model, version.
    Case(
        "unknown_model",
        ("POST", "/v1/models/nope:predict", {"instances": TEXTS}),
        ("Predict", predict_request(name="nope")),
        "NOT_FOUND",
        # ServableRequest::DebugString, as ServerCore::GetServableHandle reports it.
        message="Servable not found for request: Latest(nope)",
    ),
    Case(
        "unknown_model_classify",
        ("POST", "/v1/models/nope:classify", {"examples": examples_json()}),
        ("Classify", classify_request(name="nope")),
        "NOT_FOUND",
    ),
    Case(
        "unknown_model_status",
        ("GET", "/v1/models/nope", None),
        ("GetModelStatus", status_request(name="nope")),
        "NOT_FOUND",
        message="Could not find any versions of model nope",  # get_model_status_impl.cc
    ),
    Case(
        "unknown_model_metadata",
        ("GET", "/v1/models/nope/metadata", None),
        ("GetModelMetadata", metadata_request(name="nope")),
        "NOT_FOUND",
    ),
    Case(
        "unknown_version",
        ("POST", "/v1/models/clf/versions/7:predict", {"instances": TEXTS}),
        ("Predict", predict_request(version=7)),
        "NOT_FOUND",
        message="Servable not found for request: Specific(clf, 7)",
    ),
    Case(
        "unknown_version_status",
        ("GET", "/v1/models/clf/versions/7", None),
        ("GetModelStatus", status_request(version=7)),
        "NOT_FOUND",
        message="Could not find version 7 of model clf",  # get_model_status_impl.cc
    ),
    # Unknown signature: REST's handler looks it up before parsing the body (GetInfoMap,
    # INVALID_ARGUMENT); gRPC's predictor after (FAILED_PRECONDITION). Both are HTTP 400.
    Case(
        "unknown_signature",
        ("POST", "/v1/models/clf:predict", {"signature_name": "nope", "instances": TEXTS}),
        ("Predict", predict_request(signature="nope")),
        "FAILED_PRECONDITION",
        rest_code="INVALID_ARGUMENT",
    ),
    Case(
        "unknown_signature_classify",
        (
            "POST",
            "/v1/models/clf:classify",
            {"signature_name": "nope", "examples": examples_json()},
        ),
        ("Classify", classify_request(signature="nope")),
        "INVALID_ARGUMENT",
    ),
    Case(
        "classify_on_a_predict_signature",
        ("POST", "/v1/models/clf:classify", {"examples": examples_json()}),
        ("Classify", classify_request(signature="")),
        "INVALID_ARGUMENT",
    ),
    # Wrong dtype, wrong shape, wrong input names.
    Case(
        "wrong_dtype",
        ("POST", "/v1/models/clf:predict", {"instances": [1.5, 2.5]}),
        ("Predict", predict_request(inputs={"text": tf.make_tensor_proto([1.5, 2.5])})),
        "INVALID_ARGUMENT",
        same_message=False,
    ),
    Case(
        "wrong_shape",
        ("POST", "/v1/models/clf:predict", {"inputs": {"text": [["a", "b"]]}}),
        ("Predict", predict_request(inputs={"text": tf.make_tensor_proto([["a", "b"]])})),
        "INVALID_ARGUMENT",
        same_message=False,
    ),
    Case(
        "wrong_input_name",
        ("POST", "/v1/models/clf:predict", {"inputs": {"words": TEXTS}}),
        ("Predict", predict_request(inputs={"words": tf.make_tensor_proto(TEXTS)})),
        "INVALID_ARGUMENT",
        same_message=False,
    ),
    Case(
        "model_rejects_input",
        (
            "POST",
            "/v1/models/clf:predict",
            {"signature_name": "scale", "inputs": {"x": [[1.0, 2.0]], "n": [-1]}},
        ),
        (
            "Predict",
            predict_request(
                signature="scale",
                inputs={
                    "x": tf.make_tensor_proto([[1.0, 2.0]], tf.float32),
                    "n": tf.make_tensor_proto([-1], tf.int32),
                },
            ),
        ),
        "INVALID_ARGUMENT",
    ),
]


def _probabilities(direct, texts):
    return direct.signatures["serving_default"](text=tf.constant(texts))["probabilities"].numpy()


def _check_same_answer(case, rest_reply, response, direct):
    """The success cases' replies agree with each other and with the model called directly."""
    expected = _probabilities(direct, TEXTS)
    if case.id in ("predict", "predict_version"):
        rows = rest_reply["predictions"] if case.id == "predict" else None
        rest_probabilities = (
            np.array([row["probabilities"] for row in rows])
            if rows
            else np.array(rest_reply["outputs"]["probabilities"])
        )
        grpc_probabilities = tf.make_ndarray(response.outputs["probabilities"])
        np.testing.assert_allclose(rest_probabilities, expected, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(grpc_probabilities, expected)
        assert response.model_spec.name == "clf" and response.model_spec.version.value == 1
        assert response.model_spec.signature_name == "serving_default"
    elif case.id == "classify":
        grpc_results = [
            [[c.label, c.score] for c in row.classes] for row in response.result.classifications
        ]
        assert [[label for label, _ in row] for row in rest_reply["results"]] == [
            [label for label, _ in row] for row in grpc_results
        ]
        np.testing.assert_allclose(
            [[s for _, s in row] for row in rest_reply["results"]], expected, rtol=1e-6
        )
        np.testing.assert_allclose([[s for _, s in row] for row in grpc_results], expected, 1e-6)
    elif case.id == "regress":
        grpc_values = [r.value for r in response.result.regressions]
        np.testing.assert_allclose(rest_reply["results"], expected[:, 1], rtol=1e-6)
        np.testing.assert_allclose(grpc_values, expected[:, 1], rtol=1e-6)
    elif case.id == "status":
        assert rest_reply == json_format.MessageToDict(
            response, always_print_fields_with_no_presence=True
        )
        assert rest_reply["model_version_status"][0]["state"] == "AVAILABLE"
    elif case.id == "metadata":
        signature_defs = get_model_metadata_pb2.SignatureDefMap()
        assert response.metadata["signature_def"].Unpack(signature_defs)
        grpc_json = json_format.MessageToDict(
            signature_defs,
            preserving_proto_field_name=True,
            always_print_fields_with_no_presence=True,
        )
        assert rest_reply["metadata"]["signature_def"] == grpc_json
        assert rest_reply["model_spec"]["version"] == str(response.model_spec.version.value)
    elif case.id == "empty_batch":
        assert rest_reply["outputs"]["probabilities"] == []
        assert rest_reply["outputs"]["label"] == []
        probabilities = tf.make_ndarray(response.outputs["probabilities"])
        assert probabilities.shape == (0, 3) and probabilities.dtype == np.float32
        assert response.outputs["label"].dtype == tf.string.as_datatype_enum
    else:
        raise AssertionError(f"no check for {case.id}")


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_rest_and_grpc_agree(server, stubs, direct, case):
    status, rest_reply = rest(server.port, *case.rest)
    code, grpc_reply = call_grpc(stubs, *case.grpc)
    rest_code = case.rest_code or case.code
    assert status == errors.HTTP_STATUS[rest_code], rest_reply
    assert code == case.code, grpc_reply
    if case.code == "OK":
        _check_same_answer(case, rest_reply, grpc_reply, direct)
        return
    # Errors: REST carries the message as {"error": ...}; both name the same thing.
    assert set(rest_reply) == {"error"} and rest_reply["error"]
    assert isinstance(grpc_reply, str) and grpc_reply
    if rest_code == case.code and case.same_message:
        assert rest_reply["error"] == grpc_reply
    if case.message is not None:
        assert grpc_reply == case.message


def test_grpc_bytes_output_and_numeric_signature(stubs):
    code, response = call_grpc(
        stubs,
        "Predict",
        predict_request(
            signature="scale",
            inputs={
                "x": tf.make_tensor_proto([[1.0, 2.0], [0.5, -1.0]], tf.float32),
                "n": tf.make_tensor_proto([3, 2], tf.int32),
            },
        ),
    )
    assert code == "OK"
    np.testing.assert_array_equal(tf.make_ndarray(response.outputs["y"]), [[3, 6], [1, -2]])
    # TF Serving's default serialization: values in the typed field, not tensor_content.
    assert list(response.outputs["y"].float_val) == [3.0, 6.0, 1.0, -2.0]
    raw = [b"\x00\xff binary", "caf\u00e9".encode()]
    code, response = call_grpc(
        stubs,
        "Predict",
        predict_request(signature="echo", inputs={"text": tf.make_tensor_proto(raw)}),
    )
    assert code == "OK" and list(response.outputs["text_bytes"].string_val) == raw


def test_output_filter(stubs, direct):
    request = predict_request()
    request.output_filter.append("label")
    code, response = call_grpc(stubs, "Predict", request)
    assert code == "OK" and set(response.outputs) == {"label"}
    request.output_filter.append("label")
    code, details = call_grpc(stubs, "Predict", request)
    assert code == "INVALID_ARGUMENT" and "duplicate output tensor alias" in details
    request = predict_request()
    request.output_filter.append("nope")
    code, details = call_grpc(stubs, "Predict", request)
    assert code == "INVALID_ARGUMENT" and "output tensor alias not found" in details


def test_multi_inference_equals_classify_and_regress(stubs):
    request = inference_pb2.MultiInferenceRequest()
    for signature, method in (
        ("classification", "tensorflow/serving/classify"),
        ("regression", "tensorflow/serving/regress"),
    ):
        task = request.tasks.add()
        task.model_spec.name = "clf"
        task.model_spec.signature_name = signature
        task.method_name = method
    request.input.CopyFrom(classify_request().input)
    code, response = call_grpc(stubs, "MultiInference", request)
    assert code == "OK", response
    _, classified = call_grpc(stubs, "Classify", classify_request())
    _, regressed = call_grpc(stubs, "Regress", regress_request())
    assert response.results[0].classification_result == classified.result
    assert response.results[1].regression_result == regressed.result
    assert response.results[0].model_spec.version.value == 1
    # TF Serving's checks: one model, no signature twice, classify or regress only.
    request.tasks[1].model_spec.signature_name = "classification"
    request.tasks[1].method_name = "tensorflow/serving/classify"
    code, details = call_grpc(stubs, "MultiInference", request)
    assert (code, details) == (
        "INVALID_ARGUMENT",
        "Duplicate evaluation of signature: classification",
    )
    request.tasks[1].model_spec.name = "other"
    code, details = call_grpc(stubs, "MultiInference", request)
    assert code == "INVALID_ARGUMENT" and "same model name" in details
    request.tasks[1].model_spec.name = "clf"
    request.tasks[1].model_spec.signature_name = "serving_default"
    request.tasks[1].method_name = "tensorflow/serving/predict"
    code, details = call_grpc(stubs, "MultiInference", request)
    assert code == "UNIMPLEMENTED" and "Unsupported signature method_name" in details


def test_examples_with_context(stubs, direct):
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "clf"
    request.model_spec.signature_name = "classification"
    listed = request.input.example_list_with_context
    listed.context.features.feature["text"].bytes_list.value.append(b"from the context")
    listed.examples.add()  # Takes "text" from the context.
    own = listed.examples.add()  # Its own "text" wins.
    own.features.feature["text"].bytes_list.value.append(TEXTS[0].encode())
    code, response = call_grpc(stubs, "Classify", request)
    assert code == "OK", response
    scores = [[c.score for c in row.classes] for row in response.result.classifications]
    expected = _probabilities(direct, ["from the context", TEXTS[0]])
    np.testing.assert_allclose(scores, expected, rtol=1e-6)


def test_metadata_and_status_requests_are_checked(stubs):
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = "clf"
    assert call_grpc(stubs, "GetModelMetadata", request) == (
        "INVALID_ARGUMENT",
        "GetModelMetadataRequest must specify at least one metadata_field",
    )
    request.metadata_field.append("nope")
    assert call_grpc(stubs, "GetModelMetadata", request) == (
        "INVALID_ARGUMENT",
        "Metadata field nope is not supported",
    )
    assert call_grpc(stubs, "Predict", predict_request(name="")) == (
        "INVALID_ARGUMENT",
        "ModelSpec has no name specified.",
    )


# ----------------------------------------------------------------------------------------------
# Fuzzing the gRPC side (REST's fuzzing is in test_serve_fuzz.py)
# ----------------------------------------------------------------------------------------------

_CLIENT_ERRORS = {
    "INVALID_ARGUMENT",
    "NOT_FOUND",
    "FAILED_PRECONDITION",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "RESOURCE_EXHAUSTED",
}


def _random_tensor(rng):
    """A TensorProto of a random dtype and shape, sometimes with inconsistent contents."""
    rank = rng.randrange(0, 4)
    shape = [rng.randrange(0, 4) for _ in range(rank)]
    size = int(np.prod(shape)) if shape else 1
    kind = rng.choice(["string", "float", "int", "bool", "raw", "bad_content"])
    if kind == "string":
        values = [bytes(rng.randrange(256) for _ in range(rng.randrange(6))) for _ in range(size)]
        return tf.make_tensor_proto(np.array(values, dtype=object).reshape(shape), tf.string)
    if kind == "float":
        return tf.make_tensor_proto(np.random.default_rng(rng.randrange(99)).normal(size=shape))
    if kind == "int":
        return tf.make_tensor_proto(np.full(shape, rng.randrange(-5, 5), np.int32))
    if kind == "bool":
        return tf.make_tensor_proto(np.zeros(shape, bool))
    proto = tf.make_tensor_proto(np.zeros(shape, np.float32))
    if kind == "raw":  # A dtype number no TensorFlow knows.
        proto.dtype = rng.choice([0, 99, 1000])
    else:  # tensor_content whose length does not fit the shape.
        proto.tensor_content = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
    return proto


def test_fuzzed_grpc_requests_get_client_errors_and_the_server_keeps_working(server, stubs):
    rng = random.Random(13)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    raw_predict = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
    seen = set()
    for i in range(120):
        choice = i % 4
        if choice == 0:  # Random tensors under the real or random names.
            names = rng.choice([["text"], ["x", "n"], ["text", "extra"], [""], ["\u00e9"]])
            request = predict_request(
                signature=rng.choice(["", "scale", "pair", "echo", "nope"]),
                inputs={name: _random_tensor(rng) for name in names},
            )
            code, _ = call_grpc(stubs, "Predict", request)
        elif choice == 1:  # Bytes that are not a PredictRequest at all.
            garbage = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
            try:
                raw_predict(garbage, timeout=30)
                code = "OK"
            except grpc.RpcError as e:
                code = e.code().name
        elif choice == 2:  # Examples that are not tf.Examples, or features of other types.
            request = classify_request()
            feature = request.input.example_list.examples[0].features.feature["text"]
            feature.Clear()
            rng.choice(
                [
                    lambda: feature.float_list.value.append(1.0),
                    lambda: feature.int64_list.value.extend([1, 2]),
                    lambda: request.input.example_list.Clear(),
                    lambda: None,
                ]
            )()
            code, _ = call_grpc(stubs, "Classify", request)
        else:  # Odd model specs.
            request = predict_request(
                name=rng.choice(["clf", "", "x" * 300, "clf/1", "\u00e9"]),
                version=rng.choice([None, 0, -1, 2**62]),
            )
            code, _ = call_grpc(stubs, "Predict", request)
        seen.add(code)
        assert code == "OK" or code in _CLIENT_ERRORS, (i, code)
    assert len(seen) > 2, seen
    # Still serving.
    assert call_grpc(stubs, "Predict", predict_request())[0] == "OK"
    channel.close()


def test_grpc_port_in_use_is_an_error(server, exports, tmp_path):
    base = make_base(tmp_path, exports)
    with pytest.raises(OSError):
        model_server({"clf": base}, grpc_port=server.grpc_port, warmup=False).start()


def test_concurrent_grpc_and_rest_clients(server, stubs, direct):
    expected = _probabilities(direct, TEXTS)
    failures, done = [], []

    def grpc_client():
        for _ in range(8):
            code, response = call_grpc(stubs, "Predict", predict_request())
            if code != "OK":
                failures.append(code)
                continue
            got = tf.make_ndarray(response.outputs["probabilities"])
            if not np.array_equal(got, expected):
                failures.append("grpc mismatch")
        done.append(1)

    def rest_client():
        for _ in range(8):
            status, reply = rest(
                server.port, "POST", "/v1/models/clf:predict", {"instances": TEXTS}
            )
            if status != 200:
                failures.append(status)
            elif not np.allclose([r["probabilities"] for r in reply["predictions"]], expected):
                failures.append("rest mismatch")
        done.append(1)

    threads = [threading.Thread(target=grpc_client) for _ in range(8)]
    threads += [threading.Thread(target=rest_client) for _ in range(8)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures and len(done) == 16, (failures, time.monotonic() - start)


def test_message_size_limit_from_channel_arguments(exports, tmp_path):
    base = make_base(tmp_path, exports)
    options = server_module.ServerOptions(
        rest_api_port=0,
        grpc_port=0,
        file_system_poll_wait_seconds=0,
        grpc_channel_arguments=tuple(
            grpc_api.parse_channel_arguments("grpc.max_receive_message_length=2000")
        ),
    )
    core_options = core.CoreOptions(warmup=False)
    with server_module.ModelServer({"clf": base}, options, core_options) as limited:
        channel = grpc.insecure_channel(f"127.0.0.1:{limited.grpc_port}")
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        assert call_grpc((stub, None), "Predict", predict_request())[0] == "OK"
        big = predict_request(inputs={"text": tf.make_tensor_proto(["word " * 1000])})
        assert call_grpc((stub, None), "Predict", big)[0] == "RESOURCE_EXHAUSTED"
        channel.close()


@pytest.mark.slow
def test_cli_serves_grpc_and_the_client_cli_asks_it(exports, tmp_path):
    base = make_base(tmp_path, exports)
    process, lines, stderr_path = serve_cli(
        [f"--model_base_path={base}", "--model_name=clf", "--rest_api_port=0", "--port=0"], tmp_path
    )
    try:
        address = rest_address = None
        while address is None or rest_address is None:
            line = lines.get(timeout=300)
            match = re.fullmatch(r"gRPC API at (127\.0\.0\.1:\d+)\n", line)
            address = match.group(1) if match else address
            match = re.fullmatch(r"serving clf version 1 at http://(127\.0\.0\.1:\d+)\n", line)
            rest_address = match.group(1) if match else rest_address

        def ask(*flags):
            return run_module_cli("bert_tf.serving.client", *flags)

        asked = ask(f"--server={address}", "--model_name=clf", TEXTS[0], TEXTS[1])
        assert asked.returncode == 0, asked.stderr[-2000:]
        outputs = json.loads(asked.stdout)
        assert len(outputs["label"]) == 2 and set(outputs["label"]) <= {
            "negative",
            "positive",
            "neutral",
        }
        # Over REST the same texts give the same numbers, written the same way.
        over_rest = ask(f"--server={rest_address}", "--rest", "--model_name=clf", *TEXTS[:2])
        assert over_rest.returncode == 0, over_rest.stderr[-2000:]
        rows = json.loads(over_rest.stdout)
        assert [row["label"] for row in rows] == outputs["label"]
        probabilities = re.search(r'"probabilities":(\[\[.*?\]\])', asked.stdout).group(1)
        assert (
            probabilities
            == "[" + ",".join(re.findall(r'"probabilities":(\[.*?\])', over_rest.stdout)) + "]"
        )
        unknown = ask(f"--server={address}", "--model_name=nope", "x")
        assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stderr
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    assert process.returncode == 0, stderr_path.read_text()[-2000:]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_client_that_waits_gets_its_answer_from_a_server_still_starting(exports, tmp_path):
    grpc_port, rest_port = _free_port(), _free_port()
    process, _, stderr_path = serve_cli(
        [
            f"--model_base_path={make_base(tmp_path, exports)}",
            "--model_name=clf",
            f"--port={grpc_port}",
            f"--rest_api_port={rest_port}",
        ],
        tmp_path,
    )
    try:
        # At once, while the new process imports TensorFlow: nothing listens on either port yet.
        grpc_address, rest_address = f"127.0.0.1:{grpc_port}", f"127.0.0.1:{rest_port}"
        client.wait_until_available(grpc_address, "clf", timeout_s=300)
        client.wait_until_available(rest_address, "clf", timeout_s=60, rest=True)
        assert process.poll() is None, stderr_path.read_text()[-2000:]
        grpc_client = client.GrpcPredictClient(grpc_address)
        outputs = grpc_client.predict("clf", {"text": TEXTS[:2]})
        grpc_client.close()
        assert outputs["probabilities"].shape[0] == 2
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def test_waiting_for_a_server_that_never_comes_ends_naming_model_and_address():
    address = f"127.0.0.1:{_free_port()}"
    for rest in (False, True):
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=f"the model clf was not AVAILABLE at {address}"):
            client.wait_until_available(address, "clf", timeout_s=1, rest=rest)
        assert 1 <= time.monotonic() - started < 30
    args = client.ClientArgs(wait_seconds=-1)
    with pytest.raises(UsageError, match="--wait_seconds must be 0 or more"):
        client.run(args, ["a text"])


def test_cli_bad_grpc_flags_exit_2(tmp_path):
    for flag in ("--grpc_channel_arguments=novalue", "--port=70000"):
        result = run_module_cli("bert_tf.serve", f"--model_base_path={tmp_path}", flag)
        assert result.returncode == 2, (flag, result.stderr[-1000:])
        assert result.stderr.strip().splitlines()[-1].startswith("error: "), result.stderr
