"""TF Serving's MonitoringConfig and BatchingParameters messages, and reading their text files.

The pip package `tensorflow-serving-api` ships the generated modules of the protos its gRPC API
needs (model_server_config_pb2, predict_pb2, ...) but not `config/monitoring_config.proto` nor
`servables/tensorflow/session_bundle_config.proto`, whose messages `--monitoring_config_file` and
`--batching_parameters_file` hold. Their descriptors are therefore written out here by hand, field
for field: same package (`tensorflow.serving`), message names, field names, numbers, types and
labels as TF Serving's .proto files, so a text file written for TF Serving parses identically. They
live in a private descriptor pool, so they cannot clash with a future `tensorflow-serving-api` that
does ship them (or with TensorFlow's own pool).
"""

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    text_format,
    wrappers_pb2,
)

from bert_tf.runtime.io_utils import UsageError

_PACKAGE = "tensorflow.serving"
# A name of our own for the hand-written file: it holds messages of two TF Serving files.
_FILE_NAME = "bert_tf/serving/tf_serving_configs.proto"

_Field = descriptor_pb2.FieldDescriptorProto


def _field(message, name, number, field_type, type_name=None, repeated=False):
    """Appends one field to a DescriptorProto (proto3: no `required`, no explicit presence)."""
    field = message.field.add(
        name=name,
        number=number,
        type=field_type,
        label=_Field.LABEL_REPEATED if repeated else _Field.LABEL_OPTIONAL,
    )
    if type_name is not None:
        # Fully qualified, with the leading dot, so the pool resolves it without scope lookups.
        field.type_name = type_name


def _file_descriptor():
    """A FileDescriptorProto of PrometheusConfig, MonitoringConfig and BatchingParameters."""
    file = descriptor_pb2.FileDescriptorProto(
        name=_FILE_NAME,
        package=_PACKAGE,
        syntax="proto3",
        dependency=[wrappers_pb2.DESCRIPTOR.name],
    )

    # tensorflow_serving/config/monitoring_config.proto
    prometheus = file.message_type.add(name="PrometheusConfig")
    _field(prometheus, "enable", 1, _Field.TYPE_BOOL)
    _field(prometheus, "path", 2, _Field.TYPE_STRING)
    monitoring = file.message_type.add(name="MonitoringConfig")
    _field(
        monitoring,
        "prometheus_config",
        1,
        _Field.TYPE_MESSAGE,
        f".{_PACKAGE}.PrometheusConfig",
    )

    # tensorflow_serving/servables/tensorflow/session_bundle_config.proto, message
    # BatchingParameters. The wrapper types are what let TF Serving tell "not set" from 0/false.
    int64_value = ".google.protobuf.Int64Value"
    batching = file.message_type.add(name="BatchingParameters")
    _field(batching, "max_batch_size", 1, _Field.TYPE_MESSAGE, int64_value)
    _field(batching, "batch_timeout_micros", 2, _Field.TYPE_MESSAGE, int64_value)
    _field(batching, "max_enqueued_batches", 3, _Field.TYPE_MESSAGE, int64_value)
    _field(batching, "num_batch_threads", 4, _Field.TYPE_MESSAGE, int64_value)
    _field(
        batching,
        "thread_pool_name",
        5,
        _Field.TYPE_MESSAGE,
        ".google.protobuf.StringValue",
    )
    _field(batching, "allowed_batch_sizes", 6, _Field.TYPE_INT64, repeated=True)
    _field(batching, "pad_variable_length_inputs", 7, _Field.TYPE_BOOL)
    _field(
        batching,
        "enable_large_batch_splitting",
        8,
        _Field.TYPE_MESSAGE,
        ".google.protobuf.BoolValue",
    )
    _field(batching, "max_execution_batch_size", 9, _Field.TYPE_MESSAGE, int64_value)
    return file


def _build_pool():
    """A private pool holding wrappers.proto (our dependency) and the hand-written file."""
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    pool.AddSerializedFile(_file_descriptor().SerializeToString())
    return pool


_POOL = _build_pool()


def _message_class(name):
    """The generated Python class of tensorflow.serving.<name> in the private pool."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PACKAGE}.{name}"))


PrometheusConfig = _message_class("PrometheusConfig")
MonitoringConfig = _message_class("MonitoringConfig")
BatchingParameters = _message_class("BatchingParameters")


def parse_text_file(path, message_class, flag_name):
    """A `message_class` parsed from the text-format file `path`; a bad file is a UsageError."""
    # TensorFlow is imported here, not at module import, so the message classes above cost nothing
    # to modules that only build or inspect them.
    import tensorflow as tf

    flag = flag_name if flag_name.startswith("--") else f"--{flag_name}"
    # TF Serving's ParseProtoTextFile reads the file through TensorFlow's Env, so gs:// and other
    # TensorFlow file systems work there; tf.io.gfile gives the same here.
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            data = f.read()
        text = data.decode("utf-8")
    except tf.errors.OpError as e:
        raise UsageError(f"{flag}={path}: cannot read it: {e.message}") from e
    except UnicodeDecodeError as e:
        raise UsageError(f"{flag}={path}: not UTF-8 text: {e}") from e
    message = message_class()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as e:
        raise UsageError(
            f"{flag}={path}:{_location(e)} invalid {message.DESCRIPTOR.full_name} text proto: "
            f"{_reason(e)}"
        ) from e
    return message


def _location(error):
    """'line N:' (with ', column M' where known) of a text_format.ParseError, or ''."""
    line, column = error.GetLine(), error.GetColumn()
    if line is None:
        return ""
    return f" line {line}, column {column}:" if column is not None else f" line {line}:"


def _reason(error):
    """A ParseError's message without the 'line:column : ' prefix protobuf puts before it."""
    reason = str(error)
    line, column = error.GetLine(), error.GetColumn()
    if line is not None:
        prefix = f"{line}:{column} : " if column is not None else f"{line} : "
        reason = reason.removeprefix(prefix)
    return reason
