"""Strings in, outputs out, over TF Serving's REST or gRPC API: the client side of the demo and
the benchmarks, and an example of both protocols for apps.

    python -m bert_tf.serving.client --server=127.0.0.1:8500 --model_name=NAME "a text" "another"
    python -m bert_tf.serving.client --rest --server=127.0.0.1:8501 --model_name=NAME "a text"
    python -m bert_tf.serving.client --wait_seconds=60 --model_name=NAME "a text"  # a server starting up

It works against `tensorflow/serving` as against `bert_tf.serve`: the gRPC side uses only
tensorflow-serving-api's stubs, the REST side only the standard library.
"""

from bert_tf.runtime import job_process  # noqa: F401  (first: it sets the process up before TensorFlow loads)

# isort: split

import dataclasses
import http.client
import json
import sys
import time

import grpc
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from bert_tf.runtime import cli
from bert_tf.runtime.cli import arg
from bert_tf.runtime.io_utils import UsageError
from bert_tf.serving import json_codec


class GrpcPredictClient:
    """Predict calls over one gRPC channel: {input name: values} -> {output name: np.ndarray}.

    With a server on the gRPC port 8500, as `python -m bert_tf.serve --model_name=sentiment
    --model_base_path=$PWD/export/sentiment` starts it (or TF Serving on the same export):

    Examples:
        >>> from bert_tf.serving.client import GrpcPredictClient
        >>> client = GrpcPredictClient("localhost:8500")
        >>> outputs = client.predict("sentiment", {"text": ["a delightful film", "the plot was dull"]})
        >>> sorted(outputs), outputs["probabilities"].shape
        (['label', 'label_id', 'probabilities'], (2, 2))
        >>> client.close()
    """

    def __init__(self, address, timeout_s=60.0):
        self.channel = grpc.insecure_channel(address)
        self.stub = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self.timeout_s = timeout_s

    def predict(self, model_name, inputs, signature_name="", version=None):
        """One PredictRequest; the outputs as numpy arrays."""
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model_name
        request.model_spec.signature_name = signature_name
        if version is not None:
            request.model_spec.version.value = version
        for name, values in inputs.items():
            request.inputs[name].CopyFrom(tf.make_tensor_proto(values))
        response = self.stub.Predict(request, timeout=self.timeout_s)
        return {name: tf.make_ndarray(proto) for name, proto in response.outputs.items()}

    def close(self):
        """Closes the channel."""
        self.channel.close()


class RestPredictClient:
    """Predict calls over one keep-alive HTTP connection, in TF Serving's row format.

    With the same server's REST API on port 8501:

    Examples:
        >>> from bert_tf.serving.client import RestPredictClient
        >>> client = RestPredictClient("localhost:8501")
        >>> (prediction,) = client.predict("sentiment", ["a delightful film"])
        >>> sorted(prediction), len(prediction["probabilities"])
        (['label', 'label_id', 'probabilities'], 2)
        >>> client.close()
    """

    def __init__(self, address, timeout_s=60.0):
        host, _, port = address.rpartition(":")
        self.connection = http.client.HTTPConnection(host, int(port), timeout=timeout_s)

    def predict(self, model_name, instances, signature_name=""):
        """POST :predict with {"instances": ...}; the decoded "predictions"."""
        body = {"instances": instances}
        if signature_name:
            body["signature_name"] = signature_name
        self.connection.request(
            "POST",
            f"/v1/models/{model_name}:predict",
            body=json.dumps(body),
            headers={"Content-Type": "application/json"},
        )
        reply = self.connection.getresponse()
        payload = json.loads(reply.read())
        if reply.status != 200:
            raise RuntimeError(f"HTTP {reply.status}: {payload.get('error')}")
        return payload["predictions"]

    def close(self):
        """Closes the connection."""
        self.connection.close()


# How often wait_until_available asks again while the server starts up or loads the model.
POLL_SECONDS = 0.5


def _grpc_available(address, model_name):
    """Whether a version of the model is AVAILABLE, by ModelService.GetModelStatus."""
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = model_name
    with grpc.insecure_channel(address) as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        try:
            response = stub.GetModelStatus(request, timeout=10)
        except grpc.RpcError:  # not listening yet (UNAVAILABLE), or not loaded yet (NOT_FOUND)
            return False
    available = get_model_status_pb2.ModelVersionStatus.AVAILABLE
    return any(status.state == available for status in response.model_version_status)


def _rest_available(address, model_name):
    """Whether a version of the model is AVAILABLE, by GET /v1/models/NAME."""
    host, _, port = address.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", f"/v1/models/{model_name}")
        reply = connection.getresponse()
        payload = json.loads(reply.read() or b"{}")
    except (OSError, ValueError):  # not listening yet, or a reply that is not JSON
        return False
    finally:
        connection.close()
    if reply.status != 200 or not isinstance(payload, dict):
        return False
    statuses = payload.get("model_version_status") or []
    return any(isinstance(s, dict) and s.get("state") == "AVAILABLE" for s in statuses)


def wait_until_available(address, model_name, timeout_s, rest=False):
    """Returns once a version of `model_name` is AVAILABLE at `address` (TF Serving's model status,
    over gRPC, or REST with `rest`); raises TimeoutError after `timeout_s` seconds.

    A server that is starting up refuses connections, then answers NOT_FOUND until the model has
    loaded and warmed up: both count as not yet.
    """
    available = _rest_available if rest else _grpc_available
    deadline = time.monotonic() + timeout_s
    while not available(address, model_name):
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"the model {model_name} was not AVAILABLE at {address} after {timeout_s:g} s"
            )
        time.sleep(POLL_SECONDS)


@dataclasses.dataclass
class ClientArgs:
    """One predict request from the command line."""

    server: str = arg("127.0.0.1:8500", "host:port of the server's gRPC API (REST with --rest).")
    model_name: str = arg("default", "The model to ask.")
    signature_name: str = arg("", "The signature; empty means serving_default.")
    input_name: str = arg("text", "The signature's string input the texts go to (gRPC).")
    rest: bool = arg(False, "Use the REST API instead of gRPC.")
    wait_seconds: float = arg(
        0.0,
        "Wait up to this many seconds for the model to be AVAILABLE (a server that is starting "
        "up, loading and warming the model) before sending; 0 sends at once.",
    )


def run(args, texts):
    """Sends the texts and prints the outputs as JSON, one line."""
    if not texts:
        raise UsageError("give the texts to send as arguments")
    if args.wait_seconds < 0:
        raise UsageError(f"--wait_seconds must be 0 or more, got {args.wait_seconds:g}")
    if args.wait_seconds:
        try:
            wait_until_available(args.server, args.model_name, args.wait_seconds, args.rest)
        except TimeoutError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(1)
    if args.rest:
        client = RestPredictClient(args.server)
        try:
            predictions = client.predict(args.model_name, texts, args.signature_name)
            print(json.dumps(predictions, separators=(",", ":")))
        finally:
            client.close()
        return
    client = GrpcPredictClient(args.server)
    try:
        outputs = client.predict(
            args.model_name, {args.input_name: texts}, signature_name=args.signature_name
        )
    except grpc.RpcError as e:
        print(f"error: {e.code().name}: {e.details()}", file=sys.stderr)
        sys.exit(1)
    finally:
        client.close()
    # The REST API's JSON text for the same outputs, floats written as TF Serving writes them.
    reply = {name: json_codec.array_to_json(value, name) for name, value in sorted(outputs.items())}
    print(json_codec.dumps(reply))


if __name__ == "__main__":
    cli.define_flags(ClientArgs)

    def main(argv):
        run(cli.args_from_flags(ClientArgs), argv[1:])

    cli.run(main)
