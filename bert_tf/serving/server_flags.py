"""TF Serving's flags (and a few of our own) as ServeArgs, and the model server they set up.

`python -m bert_tf.serve` defines its flags from ServeArgs, sizes TensorFlow's thread pools by
TF Serving's rules (`tensorflow_threads`, before TensorFlow's first op) and builds its ModelServer
from `server_settings(args)`: the ModelServerConfig the flags name, where and how it listens
(config.ServerOptions), what a request may ask and how requests batch (core.CoreOptions), and the
Prometheus page of a --monitoring_config_file. A value no server can take is a usage error naming
its flag. Nothing here reads absl flags.
"""

import dataclasses

import tensorflow as tf

from bert_tf.runtime.cli import arg
from bert_tf.runtime.io_utils import UsageError
from bert_tf.serving import batching, config, core, grpc_api, methods, monitoring, protos
from bert_tf.serving.config import DEFAULT_MAX_REQUEST_BYTES


@dataclasses.dataclass
class ServeArgs:
    """The server's flags: TF Serving's names and defaults, and a few of our own (said so)."""

    model_base_path: str = arg(
        None, "Directory holding the model's numeric version directories (TF Serving's flag)."
    )
    model_name: str = arg("default", "Name the model is served under: /v1/models/NAME.")
    model_config_file: str = arg(
        None,
        "TF Serving's ModelServerConfig text proto (model_config_list), for several models, "
        "version policies and labels; replaces --model_base_path and --model_name.",
    )
    model_config_file_poll_wait_seconds: int = arg(
        0,
        "Seconds between reads of --model_config_file, applying changes (models added, removed, "
        "re-versioned) without a restart; 0 reads it once.",
    )
    allow_version_labels_for_unavailable_models: bool = arg(
        False,
        "Let a new version label name a version that is not loaded yet (TF Serving's flag); "
        "moving an existing label still needs a loaded version.",
    )
    rest_api_port: int = arg(8501, "Port of the REST API; 0 picks a free one (printed).")
    rest_api_host: str = arg(
        "127.0.0.1",
        "Address the REST API binds (ours; TF Serving binds all interfaces). Use 0.0.0.0 only on "
        "a trusted network.",
    )
    port: int = arg(8500, "Port of the gRPC API (TF Serving's flag); 0 picks a free one (printed).")
    grpc_host: str = arg(
        "127.0.0.1",
        "Address the gRPC API binds (ours; TF Serving binds all interfaces).",
    )
    grpc_channel_arguments: str = arg(
        "",
        "Comma-separated key=value gRPC server arguments, as TF Serving's flag (e.g. "
        "grpc.max_receive_message_length=1048576). The largest message received defaults to "
        "--max_request_bytes (TF Serving's: 2**31-1 bytes); the largest sent to 2**31-1 bytes.",
    )
    grpc_max_threads: int = arg(
        0,
        "gRPC worker threads, which run received requests (the event loop receives them); "
        "0: 4 times the cores.",
    )
    rest_api_num_threads: int = arg(
        0,
        "REST worker threads, which run received requests (TF Serving's flag; the event loop "
        "receives them, however many connections wait); 0: 4 times the cores.",
    )
    file_system_poll_wait_seconds: float = arg(
        1.0, "Seconds between looks for new model versions; 0 turns polling off."
    )
    max_request_bytes: int = arg(
        DEFAULT_MAX_REQUEST_BYTES,
        "Largest request accepted (ours): a REST body after gzip (a larger one gets 413 unread), "
        "and a gRPC message unless --grpc_channel_arguments sets grpc.max_receive_message_length "
        "(a larger one gets RESOURCE_EXHAUSTED).",
    )
    rest_api_timeout_in_ms: int = arg(
        30000, "A REST request not answered within this many ms gets 504 (TF Serving's flag)."
    )
    enable_batching: bool = arg(
        False,
        "Merge concurrent requests to the same signature into one call (predict, classify, "
        "regress).",
    )
    batching_parameters_file: str = arg(
        None,
        "TF Serving's BatchingParameters text proto (max_batch_size, batch_timeout_micros, "
        "num_batch_threads, max_enqueued_batches, allowed_batch_sizes, "
        "pad_variable_length_inputs); implies --enable_batching.",
    )
    max_batch_size: int = arg(
        batching.DEFAULT_MAX_BATCH_SIZE,
        "Most rows in one call of a model (ours): a bigger request runs in chunks of this many, "
        "so its memory is bounded; batching's own max_batch_size takes its place when given.",
    )
    max_instances_per_request: int = arg(
        0, "A request with more instances than this gets INVALID_ARGUMENT (ours); 0: no limit."
    )
    max_response_elements: int = arg(
        methods.DEFAULT_MAX_RESPONSE_ELEMENTS,
        "Most output elements one reply carries (ours): a request whose answer would hold more "
        "gets RESOURCE_EXHAUSTED (HTTP 429), stopped once the rows it has run project past it. "
        "gRPC counts only the outputs of its output_filter.",
    )
    batch_timeout_micros: int = arg(
        2000, "Longest a request waits for others to batch with (without a parameters file)."
    )
    monitoring_config_file: str = arg(
        None,
        "TF Serving's MonitoringConfig text proto; with prometheus_config { enable: true } the "
        "REST port serves Prometheus text at its path (/monitoring/prometheus/metrics).",
    )
    enable_model_warmup: bool = arg(
        True,
        "Replay VERSION/assets.extra/tf_serving_warmup_requests (and call each signature once) "
        "before a version serves.",
    )
    tensorflow_session_parallelism: int = arg(
        0,
        "Threads for both of TensorFlow's pools below (TF Serving's flag); 0: TensorFlow's "
        "choice. Either of the two below replaces it.",
    )
    tensorflow_intra_op_parallelism: int = arg(
        0,
        "Threads one op may use (TF Serving's flag); 0: TensorFlow's choice (one per core). "
        "1 suits a machine of a few cores (docs/serving.md).",
    )
    tensorflow_inter_op_parallelism: int = arg(
        0, "Ops that may run side by side (TF Serving's flag); 0: TensorFlow's choice."
    )


_THREAD_FLAGS = (
    "tensorflow_session_parallelism",
    "tensorflow_intra_op_parallelism",
    "tensorflow_inter_op_parallelism",
)


def tensorflow_threads(args):
    """(intra-op, inter-op) threads from TF Serving's three flags, by its rules; 0: TensorFlow's choice."""
    for flag in _THREAD_FLAGS:
        if getattr(args, flag) < 0:
            raise UsageError(
                f"--{flag}={getattr(args, flag)}: must be 0 (TensorFlow's choice) or more"
            )
    session, intra, inter = (getattr(args, flag) for flag in _THREAD_FLAGS)
    if session and intra and inter:
        raise UsageError(
            "give --tensorflow_session_parallelism, or --tensorflow_intra_op_parallelism and "
            "--tensorflow_inter_op_parallelism, not all three"
        )
    if intra or inter:
        return intra, inter
    return session, session


def set_tensorflow_threads(intra_op, inter_op):
    """Sizes TensorFlow's two thread pools (0: its choice); only before its first op runs."""
    tf.config.threading.set_intra_op_parallelism_threads(intra_op)
    tf.config.threading.set_inter_op_parallelism_threads(inter_op)


def _server_config(args):
    """The ModelServerConfig the flags name."""
    if args.model_config_file and args.model_base_path:
        raise UsageError("give --model_config_file or --model_base_path, not both")
    if args.model_config_file:
        return config.read_model_config_file(args.model_config_file)
    if not args.model_base_path:
        raise UsageError("--model_base_path (or --model_config_file) is required")
    return config.config_of({args.model_name: args.model_base_path})


def _check_ports(args):
    """Usage errors for flag values no server can take."""
    for flag in ("rest_api_port", "port"):
        if not 0 <= getattr(args, flag) <= 65535:
            raise UsageError(f"--{flag}={getattr(args, flag)} is not a port number")
    if args.max_request_bytes <= 0:
        raise UsageError("--max_request_bytes must be positive")
    if args.rest_api_timeout_in_ms < 0:
        raise UsageError("--rest_api_timeout_in_ms must be 0 (no deadline) or more")
    for flag in ("grpc_max_threads", "rest_api_num_threads"):
        if getattr(args, flag) < 0:
            raise UsageError(f"--{flag} must be 0 (4 times the cores) or more")


def _channel_arguments(text):
    """--grpc_channel_arguments as grpc server options; a malformed one is a usage error."""
    try:
        return grpc_api.parse_channel_arguments(text)
    except ValueError as e:
        raise UsageError(str(e)) from e


def _batching_options(args):
    """(BatchingOptions or None, rows per model call) from the batching flags.

    A --batching_parameters_file implies batching (TF Serving also wants --enable_batching); its
    unset fields keep TF Serving's defaults, and its max_batch_size, when set, is also the chunk
    size of big requests in place of --max_batch_size.
    """
    path = args.batching_parameters_file
    if not path:
        if not args.enable_batching:
            return None, args.max_batch_size
        options = batching.BatchingOptions(
            max_batch_size=args.max_batch_size, batch_timeout_micros=args.batch_timeout_micros
        )
        return options, args.max_batch_size
    params = protos.parse_text_file(path, protos.BatchingParameters, "batching_parameters_file")
    try:
        options = batching.options_from_batching_parameters(params)
    except ValueError as e:
        raise UsageError(f"--batching_parameters_file={path}: {e}") from e
    if params.HasField("max_batch_size"):
        return options, options.max_batch_size
    return options, args.max_batch_size


def _metrics(args):
    """(monitoring.Metrics, Prometheus path), or (None, None) unless --monitoring_config_file
    enables the Prometheus page."""
    if not args.monitoring_config_file:
        return None, None
    monitoring_config = protos.parse_text_file(
        args.monitoring_config_file, protos.MonitoringConfig, "monitoring_config_file"
    )
    path = monitoring.prometheus_path(monitoring_config)
    return (monitoring.Metrics(), path) if path else (None, None)


def server_settings(args):
    """The ModelServer's arguments from the flags' (all but on_loaded): the ModelServerConfig, its
    ServerOptions and CoreOptions, and the Prometheus page's metrics and path."""
    _check_ports(args)
    tensorflow_threads(args)  # checked here; set by the CLI, before TensorFlow's first op
    models = _server_config(args)
    batching_options, max_batch_size = _batching_options(args)
    metrics, metrics_path = _metrics(args)
    core_options = core.CoreOptions(
        max_batch_size=max_batch_size,
        max_instances_per_request=args.max_instances_per_request,
        max_response_elements=args.max_response_elements,
        batching_options=batching_options,
        warmup=args.enable_model_warmup,
        allow_version_labels_for_unavailable_models=args.allow_version_labels_for_unavailable_models,
    )
    options = config.ServerOptions(
        host=args.rest_api_host,
        rest_api_port=args.rest_api_port,
        grpc_host=args.grpc_host,
        grpc_port=args.port,
        grpc_channel_arguments=tuple(_channel_arguments(args.grpc_channel_arguments)),
        grpc_max_threads=args.grpc_max_threads,
        rest_api_num_threads=args.rest_api_num_threads,
        file_system_poll_wait_seconds=args.file_system_poll_wait_seconds,
        max_request_bytes=args.max_request_bytes,
        rest_api_deadline_s=args.rest_api_timeout_in_ms / 1000.0 or None,
        model_config_file=args.model_config_file,
        model_config_file_poll_wait_seconds=args.model_config_file_poll_wait_seconds,
    )
    return dict(
        models=models,
        options=options,
        core_options=core_options,
        metrics=metrics,
        metrics_path=metrics_path,
    )
