"""TF Serving's gRPC API: PredictionService (Predict, Classify, Regress, MultiInference,
GetModelMetadata) and ModelService (GetModelStatus, HandleReloadConfigRequest), on grpcio with the
protos and stubs of `tensorflow-serving-api`.

Requests become numpy arrays and serialized tf.Examples and run through the same `methods`
functions as REST requests, so the two protocols share checks, batching, chunking and error codes; a
ServingError ends the call with its canonical code, as TF Serving's ToGRPCStatus does.
"""

import asyncio
import concurrent.futures
import os
import threading
import time

import grpc
import numpy as np
import tensorflow as tf
from absl import logging
from google.protobuf import message
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from bert_tf.saved_model import warmup
from bert_tf.serving import errors, methods
from bert_tf.serving.methods import CLASSIFY_METHOD, DEFAULT_SIGNATURE

# TF Serving sets no message size limit of its own (SetMaxMessageSize(INT32_MAX) in server.cc);
# --grpc_channel_arguments may set lower ones. Here the received size defaults to the server's
# --max_request_bytes, REST's body limit, instead: a request's memory grows with its bytes (the
# proto, its numpy copy, the tensor, then the tokenizer's many per-character tensors: about 24
# times a big string's size), so a 2 GiB message could take tens of GB. gRPC itself refuses a
# bigger message, RESOURCE_EXHAUSTED, before it is read into memory.
DEFAULT_MAX_MESSAGE_BYTES = (1 << 31) - 1
# ToGRPCStatus in grpc_status_util.cc: longer messages are cut here and marked.
_MAX_STATUS_MESSAGE = 1024
SIGNATURE_DEF_FIELD = "signature_def"

# The TensorProto field TF Serving's AsProtoField writes each dtype's values to.
_VALUE_FIELDS = {
    types_pb2.DT_FLOAT: "float_val",
    types_pb2.DT_DOUBLE: "double_val",
    types_pb2.DT_INT32: "int_val",
    types_pb2.DT_INT16: "int_val",
    types_pb2.DT_INT8: "int_val",
    types_pb2.DT_UINT8: "int_val",
    types_pb2.DT_UINT16: "int_val",
    types_pb2.DT_INT64: "int64_val",
    types_pb2.DT_UINT32: "uint32_val",
    types_pb2.DT_UINT64: "uint64_val",
    types_pb2.DT_BOOL: "bool_val",
    types_pb2.DT_STRING: "string_val",
}
# The fields of the dtypes AsProtoField does not write, as TensorProto stores them.
_OTHER_VALUE_FIELDS = {
    types_pb2.DT_HALF: "half_val",
    types_pb2.DT_BFLOAT16: "half_val",
    types_pb2.DT_COMPLEX64: "scomplex_val",
    types_pb2.DT_COMPLEX128: "dcomplex_val",
}
_INT64_MAX = (1 << 63) - 1
# Elements one input tensor may declare: 2^24 (16.8 million) is 128 MB of int64s or of string
# pointers, and a thousand times the rows of any request a BERT model answers in reasonable time.
MAX_TENSOR_ELEMENTS = 1 << 24


def parse_channel_arguments(text):
    """--grpc_channel_arguments "k=v,k2=v2" as grpc server options; ints stay ints, as in TF
    Serving's server.cc."""
    options = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--grpc_channel_arguments: {item!r} is not key=value")
        try:
            options.append((key, int(value)))
        except ValueError:
            options.append((key, value))
    return options


def _abort(context, error):
    """Ends the call with the error's canonical code and its message, cut as ToGRPCStatus cuts it."""
    message = error.message
    if len(message) > _MAX_STATUS_MESSAGE:
        message = message[:_MAX_STATUS_MESSAGE] + "...TRUNCATED"
    context.abort(error.grpc_code, message)


def _value_count(proto):
    """How many values the proto's typed field holds (complex ones count pairs), or None for a
    dtype whose field is not known here."""
    field = _VALUE_FIELDS.get(proto.dtype) or _OTHER_VALUE_FIELDS.get(proto.dtype)
    if field is None:
        return None
    values = len(getattr(proto, field))
    return values // 2 if field in ("scomplex_val", "dcomplex_val") else values


def check_tensor_proto(proto, where, max_rows=0):
    """Refuses a TensorProto before anything is built from it: INVALID_ARGUMENT, as TF Serving's
    tensor parsing (Tensor::FromProto) refuses it, or as a limit of this server.

    - TensorShape::IsValid: no negative dim, and an element count that fits in int64;
    - tensor_content must hold exactly the shape's elements; a typed field (string_val, ...) may
      hold 0 values (all defaults), 1 (repeated) or exactly the shape's count, no other number;
    - dim 0 (the rows) at most `max_rows`, --max_instances_per_request, when that is set;
    - at most MAX_TENSOR_ELEMENTS elements whatever the flags: a proto may declare many elements
      and send one value (30 bytes can declare 10^8 rows), and numpy would build them all. A
      tensor that sends all its values is bounded by the message size already; this bounds the
      repeated ones, and the work, by a size no real request of a BERT model comes near.
    """
    dims = [d.size for d in proto.tensor_shape.dim]
    prefix = f"tensor parsing error: {where}"
    if any(size < 0 for size in dims):
        raise errors.invalid_argument(f"{prefix}: negative dimension in shape {dims}")
    elements = 1
    for size in dims:
        elements *= size  # Python ints: a product past int64 is seen, not wrapped.
    if elements > _INT64_MAX:
        raise errors.invalid_argument(f"{prefix}: shape {dims} has more elements than int64 holds")
    if dims:
        methods.check_instances(dims[0], max_rows)
    if elements > MAX_TENSOR_ELEMENTS:
        raise errors.invalid_argument(
            f"{prefix}: shape {dims} has {elements} elements; this server takes at most "
            f"{MAX_TENSOR_ELEMENTS} per tensor"
        )
    if proto.tensor_content:
        if proto.dtype in (types_pb2.DT_STRING, types_pb2.DT_INVALID):
            return
        try:
            itemsize = tf.as_dtype(proto.dtype).size
        except TypeError:
            return  # an unknown dtype: tensor_to_array says so
        if len(proto.tensor_content) != elements * itemsize:
            raise errors.invalid_argument(
                f"{prefix}: tensor_content has {len(proto.tensor_content)} bytes; shape {dims} "
                f"of {_dtype_name(proto.dtype)} needs {elements * itemsize}"
            )
        return
    count = _value_count(proto)
    if count is not None and count not in (0, 1, elements):
        raise errors.invalid_argument(
            f"{prefix}: {count} values for shape {dims} of {elements} elements (must be 0, 1 "
            f"or {elements})"
        )


def tensor_to_array(proto, where, max_rows=0):
    """A TensorProto as a numpy array (object array of bytes for strings); bad ones are
    INVALID_ARGUMENT, refused by check_tensor_proto before anything is built."""
    check_tensor_proto(proto, where, max_rows)
    try:
        array = tf.make_ndarray(proto)
    except (TypeError, ValueError, IndexError) as e:
        raise errors.invalid_argument(f"tensor parsing error: {where}: {e}") from e
    return array


def array_to_tensor(array):
    """A numpy output as a TensorProto with its values in the typed field (TF Serving's default
    AsProtoField serialization)."""
    array = np.asarray(array)
    if array.dtype == object or array.dtype.kind in "SU":
        dtype = types_pb2.DT_STRING
    else:
        dtype = tf.as_dtype(array.dtype).as_datatype_enum
    proto = tensor_pb2.TensorProto(dtype=dtype)
    for size in array.shape:
        proto.tensor_shape.dim.add(size=size)
    field = _VALUE_FIELDS.get(dtype)
    if field is None:  # half, bfloat16, complex: make_tensor_proto knows their layouts.
        return tf.make_tensor_proto(array)
    values = array.ravel()
    if dtype == types_pb2.DT_STRING:
        values = [v if isinstance(v, bytes) else str(v).encode("utf-8") for v in values.tolist()]
    else:
        values = values.tolist()
    getattr(proto, field).extend(values)
    return proto


def _dtype_name(enum_value):
    """A DataType as TensorFlow's DataTypeString writes it (float, int32, string, ...)."""
    if enum_value in types_pb2.DataType.values():
        return types_pb2.DataType.Name(enum_value)[len("DT_") :].lower()
    return f"unknown dtype {enum_value}"


def _run_options(server_core, context):
    """The core's run options, with this call's liveness: False once the client cancelled or the
    deadline passed, so a request in chunks stops between them."""

    def is_active():
        remaining = context.time_remaining()
        return context.is_active() and (remaining is None or remaining > 0)

    return server_core.run_options(is_active)


def _model_spec_args(spec):
    """(name, version, label) of a ModelSpec; a missing name is INVALID_ARGUMENT as in TF Serving."""
    if not spec.name:
        raise errors.invalid_argument("ModelSpec has no name specified.")
    choice = spec.WhichOneof("version_choice")
    version = spec.version.value if choice == "version" else None
    label = spec.version_label if choice == "version_label" else None
    return spec.name, version, label


def _fill_model_spec(target, name, version, signature_name):
    """The model spec a response carries: the name, the version that answered, the signature."""
    target.name = name
    target.version.value = version
    target.signature_name = signature_name


def serialized_examples(input_proto):
    """The serialized tf.Examples of an Input proto, context features merged into each; none is an error."""
    examples = warmup.input_examples(input_proto)
    if not examples:
        raise errors.invalid_argument("Input is empty.")
    return examples


def _classification_result(result, classes, scores):
    """Fills a ClassificationResult from the classes/scores arrays (either may be None)."""
    reference = classes if classes is not None else scores
    for row in range(np.shape(reference)[0]):
        classifications = result.classifications.add()
        for column in range(np.shape(reference)[1]):
            entry = classifications.classes.add()
            if classes is not None:
                entry.label = classes[row][column].decode("utf-8", errors="replace")
            if scores is not None:
                entry.score = float(scores[row][column])


def _regression_result(result, values):
    """Fills a RegressionResult from the values array."""
    for value in values.tolist():
        result.regressions.add(value=value)


class _Service:
    """What both servicers share: the core, the metrics, and running a call with TF Serving's
    error codes."""

    def __init__(self, server_core, metrics=None):
        self.core = server_core
        self.metrics = metrics

    def _serve(self, api, request_name, context, work, signature_name=""):
        """Runs `work()` and returns its response; a ServingError aborts the call with its code.

        The request is counted under `request_name` and `signature_name` (as the client sent it).
        """
        start = time.perf_counter()
        code = "OK"
        try:
            return work()
        except errors.ServingError as e:
            code = e.code
            _abort(context, e)
        except RecursionError:
            code = "INVALID_ARGUMENT"
            _abort(context, errors.invalid_argument("request nests too deeply"))
        except Exception as e:  # noqa: BLE001  The trace goes to the log, the client gets INTERNAL.
            code = "INTERNAL"
            logging.exception("internal error in %s", api)
            _abort(context, errors.internal(f"Internal error: {type(e).__name__}"))
        finally:
            if self.metrics is not None:
                signature_label = self.core.signature_label(request_name, signature_name)
                self.metrics.record_request(
                    request_name, api, "GRPC", code, time.perf_counter() - start, signature_label
                )


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer, _Service):
    """tensorflow.serving.PredictionService over a ServerCore."""

    def Predict(self, request, context):  # noqa: N802 (the gRPC method's name)
        """Runs a signature on the request's tensors."""

        def work():
            name, version, label = _model_spec_args(request.model_spec)
            servable = self.core.servable(name, version, label)
            signature_name = request.model_spec.signature_name or DEFAULT_SIGNATURE
            signature = methods.predict_signature(servable, signature_name)
            inputs = {}
            for alias, proto in request.inputs.items():
                spec = signature.inputs.get(alias)
                if spec is None:
                    raise errors.invalid_argument(
                        f"input tensor alias not found in signature: {alias}. Inputs expected to "
                        f"be in the set {{{','.join(sorted(signature.inputs))}}}."
                    )
                if proto.dtype != spec.dtype.as_datatype_enum:
                    raise errors.invalid_argument(
                        f"Expects arg[{sorted(signature.inputs).index(alias)}] to be "
                        f"{_dtype_name(spec.dtype.as_datatype_enum)} but {_dtype_name(proto.dtype)} is "
                        "provided"
                    )
                inputs[alias] = tensor_to_array(
                    proto, alias, self.core.options.max_instances_per_request
                )
            outputs = methods.predict(
                servable,
                signature,
                inputs,
                _run_options(self.core, context),
                list(request.output_filter),
            )
            response = predict_pb2.PredictResponse()
            _fill_model_spec(response.model_spec, name, servable.version, signature_name)
            for alias, value in outputs.items():
                response.outputs[alias].CopyFrom(array_to_tensor(value))
            return response

        spec = request.model_spec
        return self._serve("Predict", spec.name, context, work, spec.signature_name)

    def Classify(self, request, context):  # noqa: N802
        """Classifies the request's tf.Examples."""

        def work():
            name, version, label = _model_spec_args(request.model_spec)
            servable = self.core.servable(name, version, label)
            signature_name = request.model_spec.signature_name or DEFAULT_SIGNATURE
            classes, scores = methods.classify(
                servable,
                signature_name,
                serialized_examples(request.input),
                _run_options(self.core, context),
            )
            response = classification_pb2.ClassificationResponse()
            _fill_model_spec(response.model_spec, name, servable.version, signature_name)
            _classification_result(response.result, classes, scores)
            return response

        spec = request.model_spec
        return self._serve("Classify", spec.name, context, work, spec.signature_name)

    def Regress(self, request, context):  # noqa: N802
        """Regresses the request's tf.Examples."""

        def work():
            name, version, label = _model_spec_args(request.model_spec)
            servable = self.core.servable(name, version, label)
            signature_name = request.model_spec.signature_name or DEFAULT_SIGNATURE
            values = methods.regress(
                servable,
                signature_name,
                serialized_examples(request.input),
                _run_options(self.core, context),
            )
            response = regression_pb2.RegressionResponse()
            _fill_model_spec(response.model_spec, name, servable.version, signature_name)
            _regression_result(response.result, values)
            return response

        spec = request.model_spec
        return self._serve("Regress", spec.name, context, work, spec.signature_name)

    def MultiInference(self, request, context):  # noqa: N802
        """Several classify and regress signatures of one model on the same tf.Examples."""

        def work():
            first = request.tasks[0].model_spec if request.tasks else None
            if first is None:
                raise errors.invalid_argument("ModelSpec has no name specified.")
            name, version, label = _model_spec_args(first)
            servable = self.core.servable(name, version, label)
            methods.check_multi_inference(servable, request.tasks)
            serialized = serialized_examples(request.input)
            results = methods.multi_inference(
                servable, request.tasks, serialized, _run_options(self.core, context)
            )
            response = inference_pb2.MultiInferenceResponse()
            for task, outcome in zip(request.tasks, results):
                result = response.results.add()
                if task.method_name == CLASSIFY_METHOD:
                    _classification_result(result.classification_result, *outcome)
                else:
                    _regression_result(result.regression_result, outcome)
                _fill_model_spec(
                    result.model_spec, name, servable.version, task.model_spec.signature_name
                )
            return response

        model_name = request.tasks[0].model_spec.name if request.tasks else ""
        return self._serve("MultiInference", model_name, context, work)

    def GetModelMetadata(self, request, context):  # noqa: N802
        """The served version's signature defs."""

        def work():
            if not request.HasField("model_spec"):
                raise errors.invalid_argument("Missing ModelSpec")
            if not request.metadata_field:
                raise errors.invalid_argument(
                    "GetModelMetadataRequest must specify at least one metadata_field"
                )
            for field in request.metadata_field:
                if field != SIGNATURE_DEF_FIELD:
                    raise errors.invalid_argument(f"Metadata field {field} is not supported")
            name, version, label = _model_spec_args(request.model_spec)
            servable = self.core.servable(name, version, label)
            response = get_model_metadata_pb2.GetModelMetadataResponse()
            response.model_spec.name = name
            response.model_spec.version.value = servable.version
            response.metadata[SIGNATURE_DEF_FIELD].Pack(methods.signature_def_map(servable))
            return response

        return self._serve("GetModelMetadata", request.model_spec.name, context, work)


class ModelService(model_service_pb2_grpc.ModelServiceServicer, _Service):
    """tensorflow.serving.ModelService over a ServerCore."""

    def GetModelStatus(self, request, context):  # noqa: N802
        """Every known version of a model and its state."""

        def work():
            if not request.HasField("model_spec"):
                raise errors.invalid_argument("Missing ModelSpec")
            name, version, label = _model_spec_args(request.model_spec)
            return self.core.model_status(name, version, label)

        return self._serve("GetModelStatus", request.model_spec.name, context, work)

    def HandleReloadConfigRequest(self, request, context):  # noqa: N802
        """Applies a new ModelServerConfig: models added, removed and re-versioned in place.

        As model_service_impl.cc: the outcome is both the response's status and the call's code.
        """
        response = model_management_pb2.ReloadConfigResponse()
        try:
            if request.config.WhichOneof("config") != "model_config_list":
                raise errors.invalid_argument(
                    "ServerModelConfig type not supported by HandleReloadConfigRequest. Only "
                    "ModelConfigList is currently supported"
                )
            self.core.reload_config(request.config)
        except Exception as e:  # noqa: BLE001  The reply carries the status, as TF Serving's.
            error = e
            if not isinstance(e, errors.ServingError):
                logging.exception("ReloadConfig failed")
                error = errors.internal(f"ReloadConfig failed: {type(e).__name__}: {e}")
            logging.error("ReloadConfig failed: %s", error.message)
            response.status.error_code = error.grpc_code.value[0]
            response.status.error_message = error.message
            context.set_code(error.grpc_code)
            context.set_details(error.message[:_MAX_STATUS_MESSAGE])
        return response


_PREDICTION_METHODS = {
    "Predict": predict_pb2.PredictRequest,
    "Classify": classification_pb2.ClassificationRequest,
    "Regress": regression_pb2.RegressionRequest,
    "MultiInference": inference_pb2.MultiInferenceRequest,
    "GetModelMetadata": get_model_metadata_pb2.GetModelMetadataRequest,
}
_MODEL_METHODS = {
    "GetModelStatus": get_model_status_pb2.GetModelStatusRequest,
    "HandleReloadConfigRequest": model_management_pb2.ReloadConfigRequest,
}


class _Aborted(Exception):
    """A call ended with a status (what grpc's sync context.abort does), raised off the event loop."""

    def __init__(self, code, details):
        super().__init__(details)
        self.code, self.details = code, details


class _CallContext:
    """What the servicers ask of their call, answered in a worker thread: the time left, whether
    the client still waits, and the status. The asyncio server's own context belongs to its
    event loop, so the loop sends what this collected (`_serve_in_thread`)."""

    def __init__(self, time_remaining):
        self._deadline = None if time_remaining is None else time.monotonic() + time_remaining
        self.cancelled = threading.Event()
        self.code = self.details = None

    def time_remaining(self):
        return None if self._deadline is None else self._deadline - time.monotonic()

    def is_active(self):
        return not self.cancelled.is_set()

    def abort(self, code, details):
        raise _Aborted(code, details)

    def set_code(self, code):
        self.code = code

    def set_details(self, details):
        self.details = details


async def _serve_in_thread(call, raw, context, executor):
    """Runs the synchronous `call(raw, call_context)` in `executor` and sends its outcome.

    The request bytes arrive on the event loop before any thread is taken, so a client that
    opens a call and never sends its message holds no worker. A call the client cancels marks
    its context, so work in chunks stops between them.
    """
    call_context = _CallContext(context.time_remaining())
    loop = asyncio.get_running_loop()
    try:
        response = await loop.run_in_executor(executor, call, raw, call_context)
    except _Aborted as aborted:
        await context.abort(aborted.code, aborted.details)
    except asyncio.CancelledError:
        call_context.cancelled.set()
        raise
    if call_context.code is not None:
        context.set_code(call_context.code)
        context.set_details(call_context.details)
    return response


def _parsing_handler(service_name, servicer, methods, executor):
    """The service's methods, each parsing its own request bytes in `executor`'s threads.

    grpcio answers a request it cannot deserialize with INTERNAL; parsing here turns bytes that are
    not the method's request proto into INVALID_ARGUMENT, the client's error that they are.
    """
    handlers = {}
    for method, request_class in methods.items():

        def parse_and_call(raw, context, call=getattr(servicer, method), parse=request_class):
            try:
                request = parse.FromString(raw)
            except message.DecodeError as e:
                _abort(
                    context,
                    errors.invalid_argument(f"Failed to parse {parse.DESCRIPTOR.full_name}: {e}"),
                )
            # Serialized here, in the worker: a big reply would otherwise hold the event loop.
            return call(request, context).SerializeToString()

        async def handle(raw, context, parse_and_call=parse_and_call):
            return await _serve_in_thread(parse_and_call, raw, context, executor)

        handlers[method] = grpc.unary_unary_rpc_method_handler(handle)
    return grpc.method_handlers_generic_handler(service_name, handlers)


class GrpcServer:
    """Both services over one ServerCore on grpcio's asyncio server, in a thread of its own (the
    rest of the server is threads); start(), .port, stop().

    The event loop receives every call; the work runs in a pool of `max_threads` threads (default
    4 x cores), so the pool bounds the work, not the number of connected clients.
    """

    def __init__(
        self,
        server_core,
        address,
        channel_arguments=(),
        max_threads=0,
        metrics=None,
        max_receive_bytes=DEFAULT_MAX_MESSAGE_BYTES,
    ):
        options = list(channel_arguments)
        given = {key for key, _ in options}
        # gRPC reads the first of repeated keys: the defaults go after what the flag gave.
        for key, value in (
            ("grpc.max_receive_message_length", max_receive_bytes),
            ("grpc.max_send_message_length", DEFAULT_MAX_MESSAGE_BYTES),
            # A port another process already serves must fail to bind, not be shared.
            ("grpc.so_reuseport", 0),
        ):
            if key not in given:
                options.append((key, value))
        self._options = options
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_threads or 4 * (os.cpu_count() or 1), thread_name_prefix="grpc"
        )
        self._handlers = (
            _parsing_handler(
                "tensorflow.serving.PredictionService",
                PredictionService(server_core, metrics),
                _PREDICTION_METHODS,
                self._executor,
            ),
            _parsing_handler(
                "tensorflow.serving.ModelService",
                ModelService(server_core, metrics),
                _MODEL_METHODS,
                self._executor,
            ),
        )
        self.address = address
        self.port = None
        self._loop = None
        self._server = None
        self._thread = None

    async def _start_server(self):
        server = grpc.aio.server(options=self._options)
        server.add_generic_rpc_handlers(self._handlers)
        try:
            port = server.add_insecure_port(self.address)
        except RuntimeError as e:
            raise OSError(f"cannot bind gRPC to {self.address}: {e}") from e
        if not port:
            raise OSError(f"cannot bind gRPC to {self.address}")
        await server.start()
        return server, port

    def start(self):
        """Binds the address (port 0 picks one) and starts serving; a port in use is an OSError."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="grpc-loop", daemon=True
        )
        self._thread.start()
        try:
            self._server, self.port = asyncio.run_coroutine_threadsafe(
                self._start_server(), self._loop
            ).result()
        except BaseException:
            self._stop_loop()
            raise
        return self

    def _stop_loop(self):
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        if not thread.is_alive():
            loop.close()
        # Calls still running finish on their own; queued ones are dropped.
        self._executor.shutdown(wait=False, cancel_futures=True)

    def stop(self, grace_s=1.0):
        """Stops accepting calls and lets running ones finish for up to `grace_s` seconds."""
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._server.stop(grace_s), self._loop).result()
            self._server = None
        if self._loop is not None:
            self._stop_loop()
