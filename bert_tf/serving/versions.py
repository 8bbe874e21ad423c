"""Which versions of a model serve: loading, switching and unloading them as TF Serving does."""

import os
import threading

import tensorflow as tf
from absl import logging
from tensorflow.core.protobuf import error_codes_pb2
from tensorflow_serving.apis import get_model_status_pb2

from bert_tf.model_versions import list_versions
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


class ModelManager:
    """One model name: serves its highest loadable version and switches when a newer one appears."""

    def __init__(self, name, base_path, on_loaded=None, warmup=True):
        self.name = name
        self.warmup = warmup
        self.base_path = base_path
        self.current = None  # The Servable requests use; replaced in one assignment.
        self._on_loaded = on_loaded
        self._states = {}  # version -> (state, error_code, error_message) for status.
        self._failed = {}  # version -> fingerprint of the directory that failed to load.
        self._seen = {}  # version -> fingerprint at the previous poll (copy in progress?).
        self._lock = threading.Lock()

    def poll(self, wait_for_stable=True):
        """Loads and switches to a newer version if there is one; returns True when it switched.

        A new directory is loaded only once its files are unchanged since the previous poll, so a
        version being copied in is not loaded half-written. A version that fails to load is logged
        and skipped until its files change; the current version keeps serving meanwhile.

        As TF Serving's file-system source: when the base path holds no version directory at all,
        nothing is aspired and the served version is unloaded (status END, OK); a base path that
        is itself missing is an error that changes nothing, as a volume may be away for a moment.
        """
        with self._lock:
            versions = list_versions(self.base_path)
            if not versions:
                if not tf.io.gfile.isdir(self.base_path):
                    if self.current is not None:
                        logging.error(
                            "model %s: base path %s not found; still serving version %d",
                            self.name,
                            self.base_path,
                            self.current.version,
                        )
                    return False
                self._unload_current()
            # Forget what was seen of directories that are gone, so one copied back is loaded again.
            for version in set(self._seen) - set(versions):
                self._seen.pop(version, None)
                self._failed.pop(version, None)
            current_version = self.current.version if self.current else -1
            for version in sorted(versions, reverse=True):
                if version <= current_version:
                    if version == current_version or not self._current_dir_gone():
                        return False
                path = os.path.join(self.base_path, versions[version])
                fingerprint = _version_fingerprint(path)
                previous, self._seen[version] = self._seen.get(version), fingerprint
                if fingerprint is None or self._failed.get(version) == fingerprint:
                    continue
                if wait_for_stable and fingerprint != previous:
                    return False  # Still being written, or first seen: look again next poll.
                if self._load(version, path, fingerprint):
                    return True
            return False

    def _unload_current(self):
        """Stops serving the current version (its directory is gone and no other is there)."""
        old, self.current = self.current, None
        if old is None:
            return
        logging.warning(
            "model %s: no version directories left under %s; unloading version %d",
            self.name,
            self.base_path,
            old.version,
        )
        # In-flight requests hold their own reference to `old` and finish on it.
        self._states[old.version] = ("END", "OK", "")
        old.close()

    def _current_dir_gone(self):
        """True when the served version's directory was removed (then a lower version may take over)."""
        return self.current is not None and not tf.io.gfile.exists(self.current.path)

    def _load(self, version, path, fingerprint):
        """Loads one version fully, then swaps it in; on failure records it and keeps the old one."""
        logging.info("model %s: loading version %d from %s", self.name, version, path)
        self._states[version] = ("LOADING", "OK", "")
        try:
            servable = Servable(self.name, version, path, warmup=self.warmup)
        except Exception as e:  # Any failure to load leaves the served version in place.
            logging.error(
                "model %s: version %d at %s failed to load: %s", self.name, version, path, e
            )
            self._failed[version] = fingerprint
            first_line = (str(e).strip().splitlines() or [""])[0][:300]
            self._states[version] = ("END", "UNKNOWN", f"{type(e).__name__}: {first_line}")
            return False
        old, self.current = self.current, servable
        self._failed.pop(version, None)
        self._states[version] = ("AVAILABLE", "OK", "")
        if old is not None:
            # In-flight requests hold their own reference to `old` and finish on it.
            self._states[old.version] = ("END", "OK", "")
            old.close()
        logging.info("model %s: serving version %d", self.name, version)
        if self._on_loaded:
            self._on_loaded(self.name, version)
        return True

    def servable(self, version=None, label=None):
        """The servable for a request: the latest, or the version asked for; NOT_FOUND otherwise."""
        servable = self.current
        if version is not None and (servable is None or version != servable.version):
            raise errors.not_found(
                f"Servable not found for request: Specific({self.name}, {version})"
            )
        if servable is None:
            raise errors.not_found(f"Servable not found for request: Latest({self.name})")
        return servable

    def status(self, version=None, label=None):
        """TF Serving's GetModelStatusResponse: every version this server has seen, newest first."""
        states = dict(self._states)
        if version is not None:
            if version not in states:
                raise errors.not_found(f"Could not find version {version} of model {self.name}")
            states = {version: states[version]}
        if not states:
            raise errors.not_found(f"Could not find any versions of model {self.name}")
        response = get_model_status_pb2.GetModelStatusResponse()
        for number, (state, code, message) in sorted(states.items(), reverse=True):
            entry = response.model_version_status.add()
            entry.version = number
            entry.state = get_model_status_pb2.ModelVersionStatus.State.Value(state)
            entry.status.error_code = error_codes_pb2.Code.Value(code)
            entry.status.error_message = message
        return response
