"""A local model server that speaks TensorFlow Serving's REST and gRPC APIs, for exported models.

    python -m bert_tf.serve --model_base_path=export/NAME --model_name=NAME \
        [--rest_api_port=8501] [--port=8500]

It serves `BASE/<version>/` SavedModels under TF Serving's flags, paths, protos and error codes, so
a client written against it works unchanged against the `tensorflow/serving` image. The server
lives in `bert_tf/serving/` (see its modules), its flags and the options they set in
`bert_tf/serving/server_flags.py`; this file runs it and prints where it serves. Unlike
TF Serving, which binds every interface, it binds 127.0.0.1 unless `--rest_api_host` and
`--grpc_host` say otherwise.
"""

from bert_tf.runtime import job_process  # noqa: F401  (first: it sets the process up before TensorFlow loads)

# isort: split

import signal
import threading

from absl import logging

from bert_tf.runtime import cli
from bert_tf.runtime.io_utils import UsageError
from bert_tf.serving import server, server_flags


def build_server(args, on_loaded=None):
    """A ModelServer (not started) from the flags' arguments (a server_flags.ServeArgs)."""
    return server.ModelServer(**server_flags.server_settings(args), on_loaded=on_loaded)


def run(args):
    """Serves until SIGINT or SIGTERM."""
    server_flags.set_tensorflow_threads(*server_flags.tensorflow_threads(args))
    urls = []  # Known once start() has bound the ports; the versions it loaded are announced after.

    def announce(name, version):
        if urls:
            print(f"serving {name} version {version} at {urls[0]}", flush=True)

    model_server = build_server(args, on_loaded=announce)
    try:
        model_server.start()
    except OSError as e:
        raise UsageError(f"cannot bind a port: {e.strerror or e}") from e
    urls.append(model_server.url)
    if model_server.grpc_port is not None:
        print(f"gRPC API at {args.grpc_host}:{model_server.grpc_port}", flush=True)
    for manager in model_server.managers.values():
        if manager.current is not None:
            announce(manager.name, manager.current.version)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    logging.info("stopping")
    model_server.stop()


if __name__ == "__main__":
    cli.define_flags(server_flags.ServeArgs)
    cli.run(cli.job_main(server_flags.ServeArgs, run, "serve"))
