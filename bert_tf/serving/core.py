"""What REST and gRPC share: the models by name, and predict, classify, regress and metadata on
numpy arrays, with TF Serving's checks and error codes.

Each protocol decodes its request into arrays (json_codec for REST, TensorProtos for gRPC), calls
these, and encodes the result; the checks, the batching, the chunking of big requests and the
error codes are decided here once, as TF Serving's predictor, classifier and regressor do for both
of its front ends.
"""

import dataclasses
import threading

import numpy as np
import tensorflow as tf
from absl import logging
from tensorflow_serving.apis import get_model_metadata_pb2
from tensorflow_serving.config import model_server_config_pb2

from bert_tf.serving import batching, config, errors
from bert_tf.serving.servable import (
    CLASSIFY_METHOD,
    DEFAULT_SIGNATURE,
    PREDICT_METHOD,
    REGRESS_METHOD,
)
from bert_tf.serving.versions import (
    ModelManager,
    servable_not_found,
    status_not_found,
    unrecognized_label,
    version_label_map,
)

# The input and output names TF Serving's classify and regress APIs require (signature_constants).
EXAMPLES_INPUT = "inputs"
CLASSES_OUTPUT = "classes"
SCORES_OUTPUT = "scores"
REGRESS_OUTPUT = "outputs"


@dataclasses.dataclass(frozen=True)
class CoreOptions:
    """How requests run: chunk size, per-request limit, batching, warm-up."""

    # Rows per call of a model: a bigger request runs in chunks of this many.
    max_batch_size: int = batching.DEFAULT_MAX_BATCH_SIZE
    # More instances than this in one request is INVALID_ARGUMENT; 0: no limit.
    max_instances_per_request: int = 0
    # None: every request runs on its own.
    batching_options: batching.BatchingOptions = None
    warmup: bool = True
    # TF Serving's --allow_version_labels_for_unavailable_models: a new label may name a
    # version that is not loaded yet.
    allow_version_labels_for_unavailable_models: bool = False


class ServerCore:
    """The served models by name (one ModelManager each): resolves a model spec to a servable, and
    applies new ModelServerConfigs as TF Serving's ServerCore::ReloadConfig does.

    Requests read `managers` without a lock: a config change builds a new dict and publishes it in
    one assignment, so a request finds either the old set of models or the new one. A model kept
    by the change takes its new labels before its new versions load (TF Serving also updates
    labels and aspired versions separately).
    """

    def __init__(self, server_config, options=CoreOptions(), on_loaded=None):
        self.options = options
        self._on_loaded = on_loaded
        # One config change at a time (server_core.cc's config_mu_); requests never take it.
        self._lock = threading.Lock()
        self.config = model_server_config_pb2.ModelServerConfig()
        self.managers = {}
        # Models a config removed: their status stays readable, as TF Serving's state monitor
        # keeps the states of unloaded versions; a later config may add them back.
        self._removed = {}
        # The first config is checked as TF Serving checks it at startup (its version labels, for
        # one, can name no version yet); its versions load in poll(), when the server starts.
        try:
            self._apply(server_config, load=False)
        except errors.ServingError as e:
            raise config.ModelConfigError(e.message) from e

    def model_status(self, name, version=None, label=None):
        """TF Serving's GetModelStatusResponse for a model (also a removed one), or NOT_FOUND in
        get_model_status_impl.cc's words; as there, a label is not looked at."""
        manager = self.managers.get(name) or self._removed.get(name)
        if manager is None:
            raise status_not_found(name, version)
        return manager.status(version, label)

    def servable(self, name, version=None, label=None):
        """The servable a model spec names: the latest version, a version, or a label's version."""
        manager = self.managers.get(name)
        # server_core.cc resolves a label before it looks for the model.
        if label is not None and (manager is None or label not in manager.labels):
            raise unrecognized_label(label)
        if manager is None:
            raise servable_not_found(name, version)
        return manager.servable(version, label)

    def signature_label(self, name, signature_name):
        """`signature_name` when a served version of model `name` has it, else "": the metrics'
        label, so that names clients make up cannot grow the metrics without bound."""
        manager = self.managers.get(name)
        if signature_name and manager is not None and manager.has_signature(signature_name):
            return signature_name
        return ""

    def reload_config(self, server_config):
        """Applies a new ModelServerConfig: adds, removes and re-versions models in place.

        As server_core.cc's ReloadConfig: only a model_config_list may follow a model_config_list
        (else FAILED_PRECONDITION); the list is checked (INVALID_ARGUMENT) and so are the version
        labels (FAILED_PRECONDITION: a label may name only an available version, see
        versions.version_label_map); on any of these errors nothing changes. Then new models are
        loaded before the call returns, changed ones switch to their new policy (a newly aspired
        version loads before one no longer aspired unloads), and removed ones unload once the new
        config is published (requests in flight finish; later ones are NOT_FOUND). A new model
        none of whose versions could load is UNKNOWN "... did not become available", the config
        staying applied, as in TF Serving. Raises errors.ServingError; returns None.
        """
        with self._lock:
            self._apply(server_config, load=True)

    def _apply(self, new_config, load):
        """reload_config with the lock held; `load` False only for the first config."""
        old_kind, new_kind = self.config.WhichOneof("config"), new_config.WhichOneof("config")
        if not (
            old_kind is None
            or new_config == self.config
            or (old_kind == new_kind == "model_config_list")
        ):
            raise errors.failed_precondition(
                "Cannot transition to requested config. It is only legal to transition from one "
                "ModelConfigList to another."
            )
        if new_kind is None:
            logging.info("Taking no action for empty config.")
            return
        try:
            config.check_model_config(new_config, "model server config")
        except config.ModelConfigError as e:
            raise errors.invalid_argument(str(e)) from e
        models = config.models_of(new_config)
        allow = self.options.allow_version_labels_for_unavailable_models
        labels = {}
        for name, model in models.items():
            known = self.managers.get(name) or self._removed.get(name)
            if known is not None:
                labels[name] = known.check_version_labels(model)
            else:
                labels[name] = version_label_map(model, {}, {}, allow)
        # Nothing can fail from here on but the loading of versions, which TF Serving reports
        # with the config applied.
        managers, added, changed = {}, [], []
        for name, model in models.items():
            manager = self.managers.get(name)
            if manager is None:
                manager = self._removed.pop(name, None)
                if manager is None:
                    manager = ModelManager(model, self._on_loaded, self.options.warmup, allow)
                else:
                    manager.update_config(model, labels[name])
                added.append(manager)
            elif manager.config != model or manager.labels != labels[name]:
                # A new policy or base path is applied below; labels alone load nothing.
                if (manager.config.base_path, manager.config.model_version_policy) != (
                    model.base_path,
                    model.model_version_policy,
                ):
                    changed.append(manager)
                manager.update_config(model, labels[name])
            managers[name] = manager
        if load:
            for manager in added:
                logging.info("model %s: adding from %s", manager.name, manager.base_path)
                manager.poll(wait_for_stable=False)
        removed = [m for name, m in self.managers.items() if name not in managers]
        for manager in removed:
            self._removed[manager.name] = manager
        self.managers = managers
        stored = model_server_config_pb2.ModelServerConfig()
        stored.CopyFrom(new_config)
        self.config = stored
        for manager in removed:
            logging.info("model %s: removed from the config; unloading it", manager.name)
            manager.remove()
        if load:
            for manager in changed:
                manager.poll(wait_for_stable=False)
        unavailable = [m for m in added if m.current is None and m.failed_versions()]
        if load and unavailable:
            details = "".join(
                f"{{{{name: {m.name} version: {version}}} due to error: {code}: {message}}}, "
                for m in unavailable
                for version, (code, message) in sorted(m.failed_versions().items())
            )
            raise errors.ServingError(
                "UNKNOWN",
                f"{len(unavailable)} model(s) did not become available: {{{details}}}",
            )

    def poll(self, wait_for_stable=True):
        """Looks once for new versions of every model."""
        for manager in list(self.managers.values()):
            manager.poll(wait_for_stable)

    def close(self):
        """Stops every served version's batchers."""
        for manager in list(self.managers.values()) + list(self._removed.values()):
            manager.close()


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

    The inputs must be exactly the signature's (TF Serving's VerifyRequestInputsSize); an
    `output_filter` keeps only the named outputs, each once.
    """
    expected = set(signature.inputs)
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
    outputs = servable.run(signature, inputs, options.batching_options, options.max_batch_size)
    if seen:
        outputs = {alias: outputs[alias] for alias in seen}
    return outputs


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
    return servable.run(
        signature, {input_name: array}, options.batching_options, options.max_batch_size
    )


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
