"""What REST and gRPC share: the served models by name (ServerCore), and the options requests run
with.

A protocol asks the ServerCore for the servable a model spec names, then runs its request on it
with methods.py (predict, classify, regress, multi-inference, metadata).
"""

import dataclasses
import threading

from absl import logging
from tensorflow_serving.config import model_server_config_pb2

from bert_tf.serving import config, errors, methods
from bert_tf.serving.versions import (
    ModelManager,
    servable_not_found,
    status_not_found,
    unrecognized_label,
    version_label_map,
)


@dataclasses.dataclass(frozen=True)
class CoreOptions(methods.RunOptions):
    """How requests run (methods.RunOptions: chunk size, per-request limit, batching), and how
    versions load: warm-up, version labels."""

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
        # Set when the server stops: a request running in chunks stops at its next chunk.
        self.stopping = threading.Event()
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

    def run_options(self, is_active=None):
        """The options a request runs with: it stays live while `is_active()` (its client still
        waits; None: always) and the server is not stopping."""

        def live():
            return not self.stopping.is_set() and (is_active is None or is_active())

        return dataclasses.replace(self.options, is_active=live)

    def close(self):
        """Stops every served version's batchers."""
        for manager in list(self.managers.values()) + list(self._removed.values()):
            manager.close()
