"""TF Serving's methods on one servable: predict, classify, regress, multi-inference and the
signature map of its metadata, on numpy arrays, with TF Serving's checks and error codes.

Each protocol decodes its request into arrays (json_codec for REST, TensorProtos for gRPC), calls
these, and encodes the result; the checks, the batching, the chunking of big requests and the
error codes are decided here once, as TF Serving's predictor, classifier and regressor do for both
of its front ends. A servable's warm-up replays its requests through them too. Which servable a
request reaches is core.py's (ServerCore).
"""

import dataclasses

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import get_model_metadata_pb2

from bert_tf.serving import batching, errors

# A signature's method_name, as TF Serving's signature_constants spell them.
PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
DEFAULT_SIGNATURE = "serving_default"
# The output names TF Serving's classify and regress APIs require (signature_constants).
CLASSES_OUTPUT = "classes"
SCORES_OUTPUT = "scores"
REGRESS_OUTPUT = "outputs"
# A reply's elements: REST writes each as a Python object first (about 100 bytes of memory), so
# this keeps a reply's memory near 0.5 GB; BERT-base's encoder_outputs at 128 tokens are 1.2M a row.
DEFAULT_MAX_RESPONSE_ELEMENTS = 1 << 22


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How a request runs: chunk size, per-request limit, batching."""

    # Rows per call of a model: a bigger request runs in chunks of this many.
    max_batch_size: int = batching.DEFAULT_MAX_BATCH_SIZE
    # More instances than this in one request is INVALID_ARGUMENT; 0: no limit.
    max_instances_per_request: int = 0
    # The most output elements one reply carries: past it, RESOURCE_EXHAUSTED (Servable.run).
    max_response_elements: int = DEFAULT_MAX_RESPONSE_ELEMENTS
    # None: every request runs on its own.
    batching_options: batching.BatchingOptions = None
    # A request's liveness: a callable that turns False once its client cancelled it, its
    # deadline passed or the server is stopping, so that a big request stops between chunks
    # (ServerCore.run_options); None: always live.
    is_active: object = None


def check_instances(count, limit):
    """INVALID_ARGUMENT when a request has more than `limit` instances (0: no limit)."""
    if limit and count > limit:
        raise errors.invalid_argument(
            f"the request has {count} instances; this server takes at most {limit} "
            "per request (--max_instances_per_request)"
        )


def predict_signature(servable, signature_name):
    """The signature a predict request names, as TF Serving's predictor checks it."""
    name = signature_name or DEFAULT_SIGNATURE
    signature = servable.signatures.get(name)
    if signature is None:
        raise errors.failed_precondition(f'Serving signature key "{name}" not found.')
    if signature.method_name not in (PREDICT_METHOD, CLASSIFY_METHOD, REGRESS_METHOD):
        raise errors.internal(
            "Expected prediction signature method_name to be one of "
            f"{{{PREDICT_METHOD}, {CLASSIFY_METHOD}, {REGRESS_METHOD}}}. "
            f"Was: {signature.method_name}"
        )
    return signature


def predict(servable, signature, inputs, options, output_filter=()):
    """Runs a predict request's {input name: array}; returns {output alias: array}.

    The inputs must be the signature's (TF Serving's VerifyRequestInputsSize), less any that the
    SignatureDef gives a default, which fills them in (GetInputValues); an `output_filter` keeps only
    the named outputs, each once.
    """
    expected = set(signature.inputs)
    if signature.defaults and set(inputs) < expected:
        missing = sorted(expected - set(inputs) - set(signature.defaults))
        if missing:
            raise errors.invalid_argument(
                f"Signature input alias: {missing[0]}(feed name: {missing[0]}) not found in request "
                "and no default value provided. Inputs expected to be in the request "
                f"{{{','.join(sorted(inputs))}}}, or default input alias set: "
                f"{{{','.join(sorted(signature.defaults))}}}"
            )
        inputs = dict(inputs, **{k: v for k, v in signature.defaults.items() if k not in inputs})
    if set(inputs) != expected:
        extra, missing = sorted(set(inputs) - expected), sorted(expected - set(inputs))
        raise errors.invalid_argument(
            f"input size does not match signature: {len(inputs)}!={len(expected)} "
            f"len({{{','.join(sorted(inputs))}}}) != len({{{','.join(sorted(expected))}}}). "
            f"Sent extra: {{{','.join(extra)}}}. Missing but required: {{{','.join(missing)}}}."
        )
    seen = []
    for alias in output_filter:
        if alias not in signature.outputs:
            raise errors.invalid_argument(
                f"output tensor alias not found in signature: {alias} Outputs expected to be in "
                f"the set {{{','.join(sorted(signature.outputs))}}}."
            )
        if alias in seen:
            raise errors.invalid_argument(f"duplicate output tensor alias: {alias}")
        seen.append(alias)
    rows = max((len(a) for a in inputs.values() if np.ndim(a)), default=1)
    check_instances(rows, options.max_instances_per_request)
    return servable.run(signature, inputs, options, kept=seen or None)


def _examples_signature(servable, signature_name, method, what):
    """The classify or regress signature a request names, checked as TF Serving's classifier and
    regressor check it."""
    name = signature_name or DEFAULT_SIGNATURE
    signature = servable.signatures.get(name)
    if signature is None:
        raise errors.invalid_argument(f"No signature was found with the name: {name}")
    if signature.method_name != method:
        raise errors.invalid_argument(
            f"Expected {what} signature method_name to be {method}. Was: {signature.method_name}"
        )
    if len(signature.inputs) != 1:
        raise errors.invalid_argument("Expected one input Tensor.")
    if next(iter(signature.inputs.values())).dtype != tf.string:
        raise errors.internal(
            f"signature {name!r} must take one DT_STRING input of serialized tf.Examples"
        )
    return signature


def _run_examples(servable, signature, serialized, options):
    """The signature's outputs on serialized tf.Examples, in chunks of options.max_batch_size."""
    check_instances(len(serialized), options.max_instances_per_request)
    if not serialized:
        raise errors.invalid_argument("Input is empty.")
    input_name = next(iter(signature.inputs))
    array = np.empty(len(serialized), dtype=object)
    array[:] = serialized
    return servable.run(signature, {input_name: array}, options)


def classify(servable, signature_name, serialized, options):
    """Classifies serialized tf.Examples: (classes [n, k] bytes or None, scores [n, k] float32 or None)."""
    signature = _examples_signature(servable, signature_name, CLASSIFY_METHOD, "classification")
    if CLASSES_OUTPUT not in signature.outputs and SCORES_OUTPUT not in signature.outputs:
        raise errors.invalid_argument(
            "Expected classification signature outputs to contain at least one of "
            f'"{CLASSES_OUTPUT}" or "{SCORES_OUTPUT}".'
        )
    outputs = _run_examples(servable, signature, serialized, options)
    classes, scores = outputs.get(CLASSES_OUTPUT), outputs.get(SCORES_OUTPUT)
    batch = len(serialized)
    for name, value in ((CLASSES_OUTPUT, classes), (SCORES_OUTPUT, scores)):
        if value is not None and (np.ndim(value) != 2 or np.shape(value)[0] != batch):
            raise errors.invalid_argument(
                f"Expected Tensor shape: [batch_size num_classes] but got {list(np.shape(value))}"
            )
    if classes is not None and scores is not None and np.shape(classes) != np.shape(scores):
        raise errors.invalid_argument(
            f"Tensors class and score should match in shape: {list(np.shape(classes))} vs "
            f"{list(np.shape(scores))}"
        )
    if scores is not None:
        scores = np.asarray(scores).astype(np.float32)
    return classes, scores


def regress(servable, signature_name, serialized, options):
    """Regresses serialized tf.Examples: float32 values [n]."""
    signature = _examples_signature(servable, signature_name, REGRESS_METHOD, "regression")
    if REGRESS_OUTPUT not in signature.outputs:
        raise errors.invalid_argument(
            f'No regression outputs found in SignatureDef: expected "{REGRESS_OUTPUT}"'
        )
    values = np.asarray(_run_examples(servable, signature, serialized, options)[REGRESS_OUTPUT])
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.ndim != 1 or values.shape[0] != len(serialized):
        raise errors.invalid_argument(
            f"Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got "
            f"{list(values.shape)}"
        )
    return values.astype(np.float32)


def check_multi_inference(servable, tasks):
    """TF Serving's multi_inference.cc checks of a request's InferenceTasks, in its order: a model
    name on every task, the same one, no signature twice, each signature present, classify or
    regress only."""
    model_name = tasks[0].model_spec.name if tasks else ""
    seen = set()
    for task in tasks:
        if not task.model_spec.name:
            raise errors.invalid_argument("Found ModelSpec with an empty model name.")
        if task.model_spec.name != model_name:
            raise errors.invalid_argument(
                "All ModelSpecs in a MultiInferenceRequest must access the same model name."
            )
        signature_name = task.model_spec.signature_name or DEFAULT_SIGNATURE
        if signature_name in seen:
            raise errors.invalid_argument(f"Duplicate evaluation of signature: {signature_name}")
        seen.add(signature_name)
        if signature_name not in servable.signatures:
            raise errors.invalid_argument(
                f"Requested signature not found in model graph: {signature_name}"
            )
        if task.method_name not in (CLASSIFY_METHOD, REGRESS_METHOD):
            raise errors.ServingError(
                "UNIMPLEMENTED", f"Unsupported signature method_name: {task.method_name}"
            )


def multi_inference(servable, tasks, serialized, options):
    """Each checked InferenceTask's classify or regress signature on the same serialized
    tf.Examples: one (classes, scores) or values per task, as classify and regress return them."""
    results = []
    for task in tasks:
        signature_name = task.model_spec.signature_name or DEFAULT_SIGNATURE
        if task.method_name == CLASSIFY_METHOD:
            results.append(classify(servable, signature_name, serialized, options))
        else:
            results.append(regress(servable, signature_name, serialized, options))
    return results


def signature_def_map(servable):
    """The servable's SignatureDefMap proto, as GetModelMetadata returns it."""
    result = get_model_metadata_pb2.SignatureDefMap()
    for key, signature_def in servable.signature_defs.items():
        result.signature_def[key].CopyFrom(signature_def)
    return result
