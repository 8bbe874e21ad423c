"""Which versions of a model serve, and its version labels, decided as TF Serving decides them.

One ModelManager per configured model (a ModelConfig of model_server_config.proto):

- its model_version_policy picks the aspired versions among the numeric directories under its
  base path, as file_system_storage_path_source.cc does (latest {num_versions}, all, specific);
- versions load and unload in the order of availability_preserving_policy.cc: a version that is
  no longer aspired is unloaded only once an aspired version serves (or nothing is aspired), so a
  switch never leaves the model without a version;
- version_labels map to versions under server_core.cc's rules (UpdateModelVersionLabelMap), and a
  request resolves a label as ServableRequestFromModelSpec and GetModelVersionForLabel do;
- status() answers as get_model_status_impl.cc.

Requests read `_servables` and `_labels` without a lock: each is replaced by a new dict in one
assignment, never changed in place, so a request sees one version of them or the next. A request
keeps its own reference to the Servable it got, so it finishes on it even if that version is
unloaded meanwhile.
"""

import os
import threading

import tensorflow as tf
from absl import logging
from tensorflow.core.protobuf import error_codes_pb2
from tensorflow_serving.apis import get_model_status_pb2
from tensorflow_serving.config import model_server_config_pb2

from bert_tf.saved_model.model_versions import list_versions
from bert_tf.serving import errors
from bert_tf.serving.servable import Servable


def _version_fingerprint(path):
    """Names, sizes and times of every file under a version directory: it changes while a copy runs."""
    entries = []
    try:
        for root, _, files in tf.io.gfile.walk(path):
            for file_name in files:
                stat = tf.io.gfile.stat(os.path.join(root, file_name))
                entries.append(
                    (
                        os.path.relpath(os.path.join(root, file_name), path),
                        stat.length,
                        stat.mtime_nsec,
                    )
                )
    except tf.errors.OpError:
        return None
    return tuple(sorted(entries))


def aspired_versions(policy, versions):
    """The versions a ServableVersionPolicy serves among `versions` (those found on disk).

    As file_system_storage_path_source.cc: latest (also when no policy is set) serves the
    max(num_versions, 1) highest; all serves every one; specific serves those listed that exist
    (a listed version that is missing is only warned about).
    """
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return set(versions)
    if choice == "specific":
        return set(versions) & set(policy.specific.versions)
    return set(sorted(versions, reverse=True)[: max(policy.latest.num_versions, 1)])


def version_label_map(model_config, states, current_labels, allow_unavailable=False):
    """{label: version} of a ModelConfig's version_labels, or FAILED_PRECONDITION as TF Serving.

    server_core.cc (UpdateModelVersionLabelMap): a label may name only a version that is
    AVAILABLE now; with --allow_version_labels_for_unavailable_models, a label that is new, or
    that keeps its version, may name any version, but moving an existing label still needs an
    available version (so requests for the label never fail while its new version loads).
    `states` is {version: (state, code, message)}; `current_labels` the model's labels now.
    """
    labels = {}
    for label, version in sorted(model_config.version_labels.items()):
        allow_any = allow_unavailable and current_labels.get(label, version) == version
        state = states.get(version, ("",))[0]
        if not allow_any and state != "AVAILABLE":
            raise errors.failed_precondition(
                f"Request to assign label to version {version} of model {model_config.name}, "
                "which is not currently available for inference"
            )
        labels[label] = version
    return labels


def _printable(name, limit=200):
    """A model name as TF Serving prints it (unquoted), cut at `limit` characters: it may come
    from a client."""
    return name if len(name) <= limit else name[:limit] + "..."


def servable_not_found(name, version=None):
    """NOT_FOUND for a request no served version answers, in TF Serving's words (its
    ServableRequest: Latest(NAME) or Specific(NAME, VERSION))."""
    name = _printable(name)
    spec = f"Specific({name}, {version})" if version is not None else f"Latest({name})"
    return errors.not_found(f"Servable not found for request: {spec}")


def status_not_found(name, version=None):
    """NOT_FOUND for a status request, in get_model_status_impl.cc's words."""
    name = _printable(name)
    if version is not None:
        return errors.not_found(f"Could not find version {version} of model {name}")
    return errors.not_found(f"Could not find any versions of model {name}")


def unrecognized_label(label):
    """The error for a version label the model does not have (server_core.cc)."""
    return errors.invalid_argument(f"Unrecognized servable version label: {label}")


class ModelManager:
    """One configured model: loads the versions its policy aspires, unloads the others, resolves
    requests to a version, and reports every version's state."""

    def __init__(
        self,
        model_config,
        on_loaded=None,
        warmup=True,
        allow_version_labels_for_unavailable_models=False,
    ):
        self.name = model_config.name
        self.warmup = warmup
        self.allow_unavailable_labels = allow_version_labels_for_unavailable_models
        self._on_loaded = on_loaded
        self._servables = {}  # version -> Servable of every AVAILABLE version.
        self._labels = {}  # label -> version.
        self._states = {}  # version -> (state, error code name, message) for status.
        self._failed = {}  # version -> fingerprint of the directory that failed to load.
        self._seen = {}  # version -> fingerprint at the previous poll (copy in progress?).
        self._removed = False  # No longer in the server's config: aspires nothing.
        self._complaint = None  # The last "nothing to serve" warning, logged once.
        self._lock = threading.Lock()  # One poll, config change or removal at a time.
        self.config = model_server_config_pb2.ModelConfig()
        self.update_config(model_config)

    @property
    def base_path(self):
        """The directory whose numeric subdirectories are the versions."""
        return self.config.base_path

    @property
    def labels(self):
        """{label: version} of the model's version labels."""
        return self._labels

    @property
    def current(self):
        """The servable of the highest available version, or None."""
        servables = self._servables
        return servables[max(servables)] if servables else None

    def has_signature(self, signature_name):
        """Whether an available version has this signature (a metrics label must name a real one)."""
        return any(signature_name in s.signatures for s in list(self._servables.values()))

    def check_version_labels(self, model_config):
        """{label: version} the config's version_labels would give now, or FAILED_PRECONDITION."""
        return version_label_map(
            model_config, self._states, self._labels, self.allow_unavailable_labels
        )

    def update_config(self, model_config, labels=None):
        """Applies a new ModelConfig of this model (policy, labels, base path) without dropping
        requests: versions it aspires are loaded before those it no longer does are unloaded.

        `labels` is the label map already checked (check_version_labels); without it the config's
        labels are checked here, and a refused label changes nothing. The new policy is applied by
        the next poll (ServerCore.reload_config polls at once). A version that is loaded keeps
        serving when the base path changes and the new one holds the same version number, as in
        TF Serving, where a servable is identified by name and version.
        """
        if model_config.name != self.name:
            raise ValueError(f"config of model {model_config.name!r} given to model {self.name!r}")
        with self._lock:
            if labels is None:
                labels = self.check_version_labels(model_config)
            new_config = model_server_config_pb2.ModelConfig()
            new_config.CopyFrom(model_config)
            self.config = new_config
            self._labels = dict(labels)
            self._removed = False
            self._complaint = None

    def remove(self):
        """Stops serving the model, which left the server's config: nothing is aspired, so every
        version unloads (requests in flight finish on theirs) and its labels go."""
        with self._lock:
            self._removed = True
            self._labels = {}
            for version in sorted(self._servables):
                self._unload(version)

    def poll(self, wait_for_stable=True):
        """Looks at the base path once and loads and unloads versions; True when one was loaded.

        A new directory is loaded only once its files are unchanged since the previous poll, so a
        version being copied in is not loaded half-written. A version that fails to load is
        recorded (END with its error) and not tried again until its files change; under a latest
        policy the next lower version takes its place meanwhile.

        As TF Serving's file-system source: when the base path holds no version directory at all,
        nothing is aspired and every version is unloaded; a base path that is itself missing is an
        error that changes nothing, as a volume may be away for a moment.
        """
        with self._lock:
            return self._poll_locked(wait_for_stable)

    def _poll_locked(self, wait_for_stable):
        """poll() with the lock held."""
        if self._removed:
            return False
        base_path = self.config.base_path
        try:
            found = tf.io.gfile.isdir(base_path)
            on_disk = list_versions(base_path) if found else {}
        except tf.errors.OpError as e:  # Unreadable, or a file system TF cannot reach: as missing.
            found, detail = False, f" ({type(e).__name__}: {str(e).strip()[:200]})"
        else:
            detail = ""
        if not found:
            self._complain(
                logging.ERROR,
                f"model {self.name}: could not find base path {base_path}{detail}; versions stay "
                "as they are",
            )
            return False
        if not on_disk:
            self._complain(
                logging.WARNING,
                f"model {self.name}: no versions found under base path {base_path} (version "
                "directories are named by number, e.g. 1/)",
            )
        else:
            self._complaint = None
        # Forget what was seen of directories that are gone, so one copied back is loaded again.
        for version in set(self._seen) - set(on_disk):
            self._seen.pop(version)
        for version in set(self._failed) - set(on_disk):
            self._failed.pop(version)
        paths = {version: os.path.join(base_path, name) for version, name in on_disk.items()}
        aspired = self._aspired(paths)
        self._unload_unaspired(aspired)
        loaded = False
        for version in sorted(aspired, reverse=True):
            if version in self._servables:
                continue
            fingerprint = _version_fingerprint(paths[version])
            previous, self._seen[version] = self._seen.get(version), fingerprint
            if fingerprint is None or self._failed.get(version) == fingerprint:
                continue
            if wait_for_stable and fingerprint != previous:
                continue  # Still being written, or first seen: look again next poll.
            if self._load(version, paths[version], fingerprint):
                loaded = True
                self._unload_unaspired(aspired)
        return loaded

    def _aspired(self, paths):
        """The versions the policy serves of {version: path} on disk.

        Under a latest policy, a version that failed to load and whose files have not changed
        since is passed over (ours: TF Serving would keep aspiring it and serve nothing newer),
        so a broken newest export does not hold back the one below it.
        """
        policy = self.config.model_version_policy
        if policy.WhichOneof("policy_choice") in ("all", "specific"):
            return aspired_versions(policy, paths)
        loadable = [
            version
            for version in paths
            if version not in self._failed
            or _version_fingerprint(paths[version]) != self._failed[version]
        ]
        return aspired_versions(policy, loadable)

    def _unload_unaspired(self, aspired):
        """Unloads versions no longer aspired, lowest first, as availability_preserving_policy.cc.

        An unaspired version is unloaded when nothing is aspired, when an aspired version serves,
        or when another unaspired version serves too; so the model keeps one version serving
        until an aspired one is available.
        """
        while True:
            unaspired = sorted(set(self._servables) - aspired)
            aspired_serving = bool(set(self._servables) & aspired)
            if not unaspired or (aspired and not aspired_serving and len(unaspired) < 2):
                return
            self._unload(unaspired[0])

    def _set_state(self, version, state, code="OK", message=""):
        """Records a version's state for status (a new dict: status() reads without the lock)."""
        self._states = {**self._states, version: (state, code, message)}

    def _complain(self, level, message):
        """Logs a poll's problem once, not at every poll while it lasts."""
        if message != self._complaint:
            self._complaint = message
            logging.log(level, "%s", message)

    def _unload(self, version):
        """Stops serving one version; requests in flight hold their own reference and finish."""
        servable = self._servables[version]
        logging.info("model %s: unloading version %d", self.name, version)
        self._set_state(version, "UNLOADING")
        self._servables = {v: s for v, s in self._servables.items() if v != version}
        servable.close()
        self._set_state(version, "END")

    def _load(self, version, path, fingerprint):
        """Loads one version fully, then makes it available; on failure records its error."""
        logging.info("model %s: loading version %d from %s", self.name, version, path)
        self._set_state(version, "LOADING")
        try:
            servable = Servable(self.name, version, path, warmup=self.warmup)
        except Exception as e:  # Any failure to load leaves the served versions in place.
            logging.error(
                "model %s: version %d at %s failed to load: %s", self.name, version, path, e
            )
            self._failed[version] = fingerprint
            first_line = (str(e).strip().splitlines() or [""])[0][:300]
            self._set_state(version, "END", "UNKNOWN", f"{type(e).__name__}: {first_line}")
            return False
        self._failed.pop(version, None)
        self._servables = {**self._servables, version: servable}
        self._set_state(version, "AVAILABLE")
        logging.info("model %s: serving version %d", self.name, version)
        if self._on_loaded:
            self._on_loaded(self.name, version)
        return True

    def servable(self, version=None, label=None):
        """The servable a request names: the highest available version, a version, or a label's.

        A version that is not available is NOT_FOUND and an unknown label INVALID_ARGUMENT, in TF
        Serving's words (basic_manager.cc, server_core.cc).
        """
        servables = self._servables
        if label is not None:
            version = self._labels.get(label)
            if version is None:
                raise unrecognized_label(label)
        if version is not None:
            servable = servables.get(version)
            if servable is None:
                raise servable_not_found(self.name, version)
            return servable
        if not servables:
            raise servable_not_found(self.name)
        return servables[max(servables)]

    def status(self, version=None, label=None):
        """TF Serving's GetModelStatusResponse: every version this server has seen, newest first.

        As get_model_status_impl.cc, only a version narrows it down; a label is not looked at.
        """
        states = self._states
        if version is not None:
            if version not in states:
                raise status_not_found(self.name, version)
            states = {version: states[version]}
        if not states:
            raise status_not_found(self.name)
        response = get_model_status_pb2.GetModelStatusResponse()
        for number, (state, code, message) in sorted(states.items(), reverse=True):
            entry = response.model_version_status.add()
            entry.version = number
            entry.state = get_model_status_pb2.ModelVersionStatus.State.Value(state)
            entry.status.error_code = error_codes_pb2.Code.Value(code)
            entry.status.error_message = message
        return response

    def failed_versions(self):
        """{version: (code, message)} of versions whose last load failed."""
        states, failed = self._states, dict(self._failed)  # The poll thread may change _failed.
        return {v: states[v][1:] for v in failed if v in states}

    def close(self):
        """Stops every loaded version's batchers (the server is stopping)."""
        for servable in list(self._servables.values()):
            servable.close()
