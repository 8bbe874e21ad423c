"""The model server: one ServerCore behind TF Serving's REST API and its gRPC API, with the
version poll; `ModelServer(...).start()`, `.port`, `.grpc_port`, `.stop()`."""

import os
import threading

import tensorflow as tf
from absl import logging

from bert_tf.runtime.io_utils import UsageError
from bert_tf.saved_model.model_versions import list_versions
from bert_tf.serving import config, core, errors, grpc_api, http_api
from bert_tf.serving.config import ServerOptions


def _check_base_paths(server_config):
    """Refuses a base path that is not a directory, or that holds a SavedModel itself."""
    for name, model in config.models_of(server_config).items():
        base_path = model.base_path
        if not tf.io.gfile.isdir(base_path):
            raise UsageError(f"model base path {base_path!r} (model {name!r}) is not a directory")
        if tf.io.gfile.exists(os.path.join(base_path, "saved_model.pb")) and not list_versions(
            base_path
        ):
            raise UsageError(
                f"{base_path} holds a SavedModel directly; TF Serving's layout is "
                f"{base_path}/<version>/saved_model.pb (e.g. {base_path}/1/)"
            )
        # A training job's output (bert_config.json beside ckpt-N) has no SavedModel to serve.
        if tf.io.gfile.exists(os.path.join(base_path, "bert_config.json")) and not list_versions(
            base_path
        ):
            raise UsageError(
                f"{base_path} is a model directory, not an export: run "
                f"python -m bert_tf.export --model_dir={base_path} --export_dir=EXPORT_DIR first, "
                "then serve EXPORT_DIR"
            )


class ModelServer:
    """TF Serving's REST (and, with a grpc_port, gRPC) API over a ModelServerConfig, in this
    process.

    `on_loaded(name, version)` is called whenever a model starts serving a version (the CLI prints
    its "serving ..." line from it).
    """

    def __init__(
        self,
        models,
        options=ServerOptions(),
        core_options=core.CoreOptions(),
        on_loaded=None,
        metrics=None,
        metrics_path=None,
    ):
        if isinstance(models, dict):  # {name: base_path}, the short form for tests and apps.
            if not models:
                raise UsageError("no models to serve")
            server_config = config.config_of(models, "models")
        else:
            server_config = models
        if core_options.max_batch_size < 1:
            raise UsageError(
                f"max_batch_size must be at least 1, got {core_options.max_batch_size}"
            )
        if core_options.max_instances_per_request < 0:
            raise UsageError(
                "max_instances_per_request must be 0 (no limit) or more, got "
                f"{core_options.max_instances_per_request}"
            )
        if core_options.max_response_elements < 1:
            raise UsageError(
                "max_response_elements must be at least 1, got "
                f"{core_options.max_response_elements}"
            )
        _check_base_paths(server_config)
        self.options = options
        self.metrics = metrics
        self.metrics_path = metrics_path
        self.core = core.ServerCore(server_config, core_options, on_loaded)
        self._httpd = None
        self._grpc = None
        self._threads = []
        self._stopping = threading.Event()
        self._config_file_error = None  # The last error of the config-file poll, logged once.

    @property
    def managers(self):
        """{model name: ModelManager} of the served models."""
        return self.core.managers

    @property
    def port(self):
        """The bound REST port (the real one when 0 was asked for)."""
        return self._httpd.server_address[1]

    @property
    def url(self):
        """http://host:port of the running REST API."""
        return f"http://{self.options.host}:{self.port}"

    @property
    def open_rest_connections(self):
        """How many REST client connections are open now."""
        return self._httpd.open_connections

    @property
    def grpc_port(self):
        """The bound gRPC port, or None when gRPC is not served."""
        return self._grpc.port if self._grpc is not None else None

    def start(self):
        """Loads every model's versions, binds the ports, and starts serving and polling."""
        self.core.poll(wait_for_stable=False)
        for manager in self.core.managers.values():
            if manager.current is None:
                logging.warning(
                    "model %s: no loadable version under %s yet; polling every %ss",
                    manager.name,
                    manager.base_path,
                    self.options.file_system_poll_wait_seconds,
                )
        self._httpd = http_api.HttpServer(
            (self.options.host, self.options.rest_api_port),
            http_api.RestApi(self.core, self.metrics),
            max_request_bytes=self.options.max_request_bytes,
            idle_timeout_s=self.options.idle_timeout_s,
            deadline_s=self.options.rest_api_deadline_s,
            metrics=self.metrics,
            metrics_path=self.metrics_path,
            num_threads=self.options.rest_api_num_threads,
        )
        self._threads = []
        poll = self.options.file_system_poll_wait_seconds
        if poll and poll > 0:
            self._threads.append(
                threading.Thread(target=self._poll_loop, name="version-poll", daemon=True)
            )
        config_poll = self.options.model_config_file_poll_wait_seconds
        if self.options.model_config_file and config_poll and config_poll > 0:
            # Started after the first config is loaded, as server.cc starts its poll thread after
            # ServerCore::Create, so a reload never races the initial load.
            self._threads.append(
                threading.Thread(target=self._config_poll_loop, name="config-poll", daemon=True)
            )
        for thread in self._threads:
            thread.start()
        logging.debug("REST API at %s", self.url)
        if self.options.grpc_port is not None:
            self._grpc = grpc_api.GrpcServer(
                self.core,
                f"{self.options.grpc_host}:{self.options.grpc_port}",
                channel_arguments=self.options.grpc_channel_arguments,
                max_threads=self.options.grpc_max_threads,
                metrics=self.metrics,
                # gRPC takes an int32: a REST body limit past 2 GiB stops at gRPC's own maximum.
                max_receive_bytes=min(self.options.max_request_bytes, 2**31 - 1),
            ).start()
            logging.debug("gRPC API at %s:%d", self.options.grpc_host, self.grpc_port)
        return self

    def _poll_loop(self):
        """Looks for new versions every file_system_poll_wait_seconds until stop()."""
        while not self._stopping.wait(self.options.file_system_poll_wait_seconds):
            for manager in list(self.core.managers.values()):
                try:
                    manager.poll()
                except Exception:  # A bad directory must not stop polling for the other models.
                    logging.exception("model %s: version poll failed", manager.name)

    def _config_poll_loop(self):
        """Re-reads --model_config_file every model_config_file_poll_wait_seconds until stop()."""
        while not self._stopping.wait(self.options.model_config_file_poll_wait_seconds):
            try:
                self.reload_config_file()
            except Exception:  # The poll must go on whatever one reload did.
                logging.exception("model config file poll failed")

    def reload_config_file(self):
        """Reads --model_config_file once and applies it if it differs from the served config.

        As server.cc's PollFilesystemAndReloadConfig: a file that cannot be read or parsed, or a
        config ServerCore refuses, is logged as an error and the served config stays. A refused
        config is tried again at each poll (a label may name a version that becomes available).
        """
        path = self.options.model_config_file
        try:
            new_config = config.read_model_config_file(path)
            if new_config == self.core.config:
                self._config_file_error = None
                return
            self.core.reload_config(new_config)
            self._config_file_error = None
            logging.info("applied the model config in %s", path)
        except UsageError as e:
            self._log_config_file_error(f"Failed to read ModelServerConfig file: {e}")
        except errors.ServingError as e:
            self._log_config_file_error(
                f"{path}: PollFilesystemAndReloadConfig failed to ReloadConfig: {e.message}"
            )

    def _log_config_file_error(self, message):
        """Logs a config-file poll error once, not at every poll while the file stays so."""
        if message != self._config_file_error:
            self._config_file_error = message
            logging.error("%s", message)

    def stop(self):
        """Stops accepting, stops polling, and releases the ports; requests running in chunks stop
        at their next chunk, so that a stop never waits for a big request's end."""
        self._stopping.set()
        self.core.stopping.set()
        if self._httpd is not None:
            self._httpd.stop()
        if self._grpc is not None:
            self._grpc.stop()
        for thread in self._threads:
            thread.join(timeout=30)
        self.core.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()
