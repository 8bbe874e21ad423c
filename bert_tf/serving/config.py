"""TF Serving's model server config: `--model_config_file` (a ModelServerConfig text proto) or
`--model_base_path` with `--model_name`, as `model_server_config_pb2` messages; and ServerOptions,
where and how the server listens.

The file is parsed with protobuf's own text format against the proto of `tensorflow-serving-api`,
so a file TF Serving accepts is read the same way here, and a typo is an error naming its line.
"""

import dataclasses

import tensorflow as tf
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from bert_tf.runtime.io_utils import UsageError


class ModelConfigError(UsageError):
    """A malformed --model_config_file: names the file and line."""


def parse_model_config(text, source="model_config_file"):
    """A ModelServerConfig from TF Serving's text format, checked as this server serves it."""
    config = model_server_config_pb2.ModelServerConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        raise ModelConfigError(f"{source}:{e}") from e
    check_model_config(config, source)
    return config


def check_model_config(config, source="model_config_file"):
    """Refuses what this server cannot serve: custom configs, other platforms, bad names, twins."""
    if config.WhichOneof("config") != "model_config_list":
        raise ModelConfigError(
            f"{source}: expected model_config_list {{ config {{ ... }} }} "
            "(custom_model_config is not supported)"
        )
    names = set()
    for model in config.model_config_list.config:
        if not model.name or "/" in model.name or ":" in model.name:
            raise ModelConfigError(
                f"{source}: model name {model.name!r} must be non-empty and contain no '/' or ':'"
            )
        if not model.base_path:
            raise ModelConfigError(f"{source}: model {model.name!r} has no base_path")
        if model.model_platform not in ("", "tensorflow"):
            raise ModelConfigError(
                f"{source}: model {model.name!r}: model_platform {model.model_platform!r} is not "
                'supported; only "tensorflow"'
            )
        if model.name in names:
            # Holds server_core.cc's words, which the reload API answers with.
            raise ModelConfigError(
                f"{source}: Illegal to list model {model.name} multiple times in config list "
                "(configured twice)"
            )
        names.add(model.name)
        policy = model.model_version_policy
        if policy.WhichOneof("policy_choice") == "latest" and policy.latest.num_versions < 0:
            raise ModelConfigError(f"{source}: model {model.name!r}: num_versions must be >= 0")
    return config


def read_model_config_file(path, flag="--model_config_file"):
    """The ModelServerConfig in `path`; an unreadable or malformed file is a usage error."""
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            text = f.read()
    except (tf.errors.OpError, UnicodeDecodeError) as e:
        raise UsageError(f"{flag}={path}: cannot read it: {e}") from e
    return parse_model_config(text, path)


def config_of(models, source="--model_name"):
    """The ModelServerConfig of {name: base_path} (what TF Serving builds from --model_name and
    --model_base_path for one model)."""
    config = model_server_config_pb2.ModelServerConfig()
    config.model_config_list.SetInParent()
    for name, base_path in models.items():
        model = config.model_config_list.config.add()
        model.name, model.base_path, model.model_platform = name, base_path, "tensorflow"
    return check_model_config(config, source)


def models_of(config):
    """{name: ModelConfig} of a ModelServerConfig, in file order."""
    return {model.name: model for model in config.model_config_list.config}


DEFAULT_MAX_REQUEST_BYTES = 32 << 20


@dataclasses.dataclass(frozen=True)
class ServerOptions:
    """Where and how the server listens; what TF Serving's flags of the same names set."""

    host: str = "127.0.0.1"
    rest_api_port: int = 8501
    # gRPC: None serves no gRPC API (a library user's choice; the CLI always serves it).
    grpc_host: str = "127.0.0.1"
    grpc_port: int = None
    # --grpc_channel_arguments as (key, value) pairs; --grpc_max_threads (0: 4 x cores).
    grpc_channel_arguments: tuple = ()
    grpc_max_threads: int = 0
    file_system_poll_wait_seconds: float = 1.0
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    # A REST request must arrive whole (head and body) within this long of the connection's
    # last reply (or its start); an idle keep-alive connection is closed after it.
    idle_timeout_s: float = 60.0
    # --rest_api_num_threads: the workers that run REST requests (0: 4 x cores).
    rest_api_num_threads: int = 0
    # --rest_api_timeout_in_ms: a REST request not answered by then gets 504; None: no deadline.
    rest_api_deadline_s: float = None
    # --model_config_file and --model_config_file_poll_wait_seconds: re-read the file this often
    # and apply it when it changed (models added, removed, re-versioned); 0 or None: never.
    model_config_file: str = None
    model_config_file_poll_wait_seconds: float = 0
