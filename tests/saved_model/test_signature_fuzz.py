"""The signature fuzzer (tests/signature_fuzz.py) on every export kind: called directly in a child
process, as an app calls a SavedModel, and through bert_tf.serve's REST and gRPC APIs.

The property: no call ends the process, every bad call gets a clear error (INVALID_ARGUMENT over
the protocols), every good one an answer of one row per input row that equals each row's answer
alone (directly) and the other protocol's answer (served). Each run is seeded, makes a fixed number
of calls, and names its seed and the call of every failure; BERT_TF_FUZZ_SEED picks another seed.
"""

import base64
import http.client
import json
import os
import re
import subprocess
import sys

import grpc
import numpy as np
import pytest
import signature_fuzz
import tensorflow as tf
from helpers_exports import CONFIG, shared_exports
from helpers_serve import ROOT, serve_cli
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

SEED = int(os.environ.get("BERT_TF_FUZZ_SEED", "20261206"))
# Rounds of calls of every export (signature_fuzz.CALLS_PER_ROUND each, then SERVED_CALLS_PER_ROUND
# over both APIs): fixed counts, so that a seed names the same calls on a fast machine or a busy one.
DIRECT_ROUNDS = 4
SERVED_ROUNDS = 4
SERVED_CALLS_PER_ROUND = 4
CHILD_TIMEOUT = 600


@pytest.fixture(scope="module")
def every_export(tmp_path_factory, real_vocab):
    return shared_exports(tmp_path_factory, real_vocab)


def test_direct_calls_of_every_signature_never_end_the_process(every_export):
    child = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "tests", "signature_fuzz.py"),
            json.dumps(every_export),
            str(SEED),
            str(DIRECT_ROUNDS),
        ],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    lines = [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
    calls = {line["call"]: line for line in lines if "call" in line}
    if child.returncode != 0:
        last = lines[-1] if lines else None
        pytest.fail(
            f"seed {SEED}: the process ended with code {child.returncode} during {last}\n"
            f"{child.stderr[-2000:]}"
        )
    failures = [(calls[line["done"]], line["failure"]) for line in lines if line.get("failure")]
    assert not failures, f"seed {SEED}: " + "\n".join(f"{f}: {c}" for c, f in failures[:10])
    summary = lines[-1]
    signatures = {(c["export"], c["signature"]) for c in calls.values()}
    print(f"seed {SEED}: {summary['calls']} calls of {len(signatures)} signatures")
    # Every signature of every export was called, and many times over.
    assert len(signatures) == sum(len(_signature_specs(p)) for p in every_export.values())
    assert summary["calls"] >= 10 * len(signatures)


def _signature_specs(path):
    """{signature: {input: (dtype name, shape list)}} read from saved_model.pb, as a server does."""
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    signature_defs = proto.meta_graphs[0].signature_def
    return {
        key: {
            name: (
                tf.dtypes.as_dtype(info.dtype).name,
                [None if d.size < 0 else d.size for d in info.tensor_shape.dim],
            )
            for name, info in signature_def.inputs.items()
        }
        for key, signature_def in signature_defs.items()
        if not key.startswith("__")
    }


def _json_value(value):
    """A numpy input as TF Serving's REST JSON: strings as text, or {"b64"} when not UTF-8."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(value).decode()}
    if value.dtype != object:
        return value.tolist()
    return [_json_value(v) for v in value] if value.ndim else _json_value(value.item())


@pytest.fixture(scope="module")
def served(every_export, tmp_path_factory):
    """bert_tf.serve in its own process, serving every export but the preprocessor (a sub-model)."""
    tmp_path = tmp_path_factory.mktemp("served_fuzz")
    versions = {name: path for name, path in every_export.items() if name != "preprocess"}
    config = tmp_path / "models.config"
    config.write_text(
        "model_config_list {\n"
        + "".join(
            f'  config {{ name: "{name}" base_path: "{os.path.dirname(path)}" }}\n'
            for name, path in versions.items()
        )
        + "}\n"
    )
    process, lines, stderr_path = serve_cli(
        [
            f"--model_config_file={config}",
            "--rest_api_port=0",
            "--port=0",
            "--enable_model_warmup=false",
        ],
        tmp_path,
    )
    rest = grpc_address = None
    ready = set()
    try:
        while rest is None or grpc_address is None or len(ready) < len(versions):
            line = lines.get(timeout=300)
            match = re.fullmatch(r"serving (\w+) version \d+ at http://(127\.0\.0\.1:\d+)\n", line)
            if match:
                ready.add(match.group(1))
                rest = match.group(2)
            match = re.fullmatch(r"gRPC API at (127\.0\.0\.1:\d+)\n", line)
            grpc_address = match.group(1) if match else grpc_address
        # Room for the largest reply the server gives (gRPC's own default takes 4 MB).
        channel = grpc.insecure_channel(
            grpc_address, options=[("grpc.max_receive_message_length", 1 << 30)]
        )
        yield process, rest, prediction_service_pb2_grpc.PredictionServiceStub(channel), versions
        channel.close()
    finally:
        process.terminate()
        process.wait(timeout=60)
        assert "Traceback" not in stderr_path.read_text()[-20000:]


def _rest(address, model, call):
    body = json.dumps(
        {
            "signature_name": call.signature,
            "inputs": {name: _json_value(value) for name, value in call.inputs.items()},
        }
    )
    connection = http.client.HTTPConnection(address, timeout=300)
    try:
        connection.request("POST", f"/v1/models/{model}:predict", body)
        reply = connection.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        connection.close()


def _grpc(stub, model, call):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = call.signature
    for name, value in call.inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    try:
        reply = stub.Predict(request, timeout=300)
    except grpc.RpcError as e:
        return e.code().name, e.details()
    return "OK", {name: tf.make_ndarray(proto) for name, proto in reply.outputs.items()}


def _as_text(value):
    """Strings as REST writes them: text, invalid UTF-8 replaced; {"b64"} (`_bytes` outputs) decoded."""
    if isinstance(value, list):
        return [_as_text(v) for v in value]
    if isinstance(value, dict):
        value = base64.b64decode(value["b64"])
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _served_failure(call, rest, grpc_reply):
    """What is wrong with the two protocols' answers to `call`, or None."""
    (status, body), (code, outputs) = rest, grpc_reply
    allowed = {
        signature_fuzz.GOOD: {(200, "OK")},
        signature_fuzz.BAD: {(400, "INVALID_ARGUMENT")},
        signature_fuzz.EITHER: {(200, "OK"), (400, "INVALID_ARGUMENT")},
    }[call.expect]
    # Any call may ask for more than a reply carries (fill_mask's top_k x [MASK]s), refused alike.
    allowed.add((429, "RESOURCE_EXHAUSTED"))
    if signature_fuzz.BOUND in str(outputs):
        allowed.add((400, "INVALID_ARGUMENT"))  # fill_mask's own bound on one call
    # JSON's [] has no dtype, and is [0] whatever rank the client meant: REST may read an empty
    # input otherwise than gRPC does.
    if any(value.size == 0 for value in call.inputs.values()):
        allowed |= {(200, code), (400, code)}
    if (status, code) not in allowed:
        return f"REST {status} {str(body)[:300]}, gRPC {code} {str(outputs)[:300]}"
    if status != 200:
        return None if "error" in body else f"a REST error without a message: {body}"
    if code != "OK":
        return None
    rows = next(len(v) for v in call.inputs.values() if v.ndim)
    for name, value in outputs.items():
        raw = body["outputs"][name] if len(outputs) > 1 else body["outputs"]
        if value.ndim and len(value) != rows:
            return f"output {name} has {len(value)} rows for {rows}"
        if value.dtype == object:
            same = value.size == 0 or _as_text(value.tolist()) == _as_text(raw)
        else:
            got = np.asarray(raw, dtype=value.dtype)
            same = value.size == 0 or np.allclose(value, got, atol=1e-5)
        if not same:
            return f"output {name}: REST and gRPC differ"
    return None


def test_calls_over_rest_and_grpc_never_end_the_server(served):
    process, rest_address, stub, versions = served
    rng = np.random.default_rng(SEED)
    failures, count = [], 0
    for _ in range(SERVED_ROUNDS):
        for name, path in versions.items():
            words = signature_fuzz.vocabulary_words(os.path.join(path, "assets", "vocab.txt"))
            calls = signature_fuzz.make_calls(
                rng,
                name,
                _signature_specs(path),
                words,
                CONFIG.vocab_size,
                SERVED_CALLS_PER_ROUND,
            )
            for call in calls:
                failure = _served_failure(
                    call, _rest(rest_address, name, call), _grpc(stub, name, call)
                )
                count += 1
                if failure:
                    failures.append(f"{call.describe()}: {failure}")
    assert process.poll() is None, f"seed {SEED}: the server ended with code {process.returncode}"
    assert not failures, f"seed {SEED}: " + "\n".join(failures[:10])
    print(f"seed {SEED}: {count} calls over REST and gRPC each")
