"""The serving tests' SavedModels: strings in, GraphTokenizer, the tiny BERT, named outputs.

Built once per test run (shared by the xdist workers) and used by every serving test.
"""

import os
import queue
import shutil
import subprocess
import sys
import threading

import tensorflow as tf
from helpers import built_once, tiny_config

from bert_tf.serving import batching, core, methods, server
from bert_tf.serving.config import DEFAULT_MAX_REQUEST_BYTES

LABELS = ["negative", "positive", "neutral"]
V2_LABELS = ["NEGATIVE", "POSITIVE", "NEUTRAL"]
MAX_SEQ_LENGTH = 16
SCRATCH_WIDTH = 1 << 15
_BUILT = {}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _make_module(vocab_file):
    """A tf.Module like the export will write: strings in, GraphTokenizer, tiny BERT, named outputs."""
    import keras

    from bert_tf.model import modeling
    from bert_tf.tasks import export_graph
    from bert_tf.tokenization.graph_tokenizer import GraphTokenizer

    keras.utils.set_random_seed(7)
    config = tiny_config(vocab_file)

    class Classifier(tf.Module):
        def __init__(self):
            super().__init__()
            self.tokenizer = GraphTokenizer(vocab_file, do_lower_case=True)
            self.encoder = modeling.build_encoder(config)
            self.head = keras.layers.Dense(len(LABELS), name="head")
            self.head.build((None, config.hidden_size))
            self.labels = tf.Variable(LABELS, dtype=tf.string, trainable=False)

        def _pack(self, ids_a, ids_b=None):
            """[CLS] a [SEP] (b [SEP]), truncated to MAX_SEQ_LENGTH and padded."""
            cls = tf.fill([ids_a.nrows(), 1], self.tokenizer.special_ids["[CLS]"])
            sep = tf.fill([ids_a.nrows(), 1], self.tokenizer.special_ids["[SEP]"])
            if ids_b is None:
                ids = tf.concat([cls, ids_a[:, : MAX_SEQ_LENGTH - 2], sep], axis=1)
                types = tf.zeros_like(ids)
            else:
                half = (MAX_SEQ_LENGTH - 3) // 2
                a = tf.concat([cls, ids_a[:, :half], sep], axis=1)
                b = tf.concat([ids_b[:, :half], sep], axis=1)
                ids = tf.concat([a, b], axis=1)
                types = tf.concat([tf.zeros_like(a), tf.ones_like(b)], axis=1)
            word_ids = ids.to_tensor(shape=[None, MAX_SEQ_LENGTH])
            return {
                "input_word_ids": word_ids,
                "input_mask": tf.cast(word_ids != 0, tf.int32),
                "input_type_ids": types.to_tensor(shape=[None, MAX_SEQ_LENGTH]),
            }

        def _probabilities(self, inputs):
            pooled = self.encoder(inputs, training=False)["pooled_output"]
            return tf.nn.softmax(self.head(pooled), axis=-1)

        def _named(self, probabilities):
            label_id = tf.argmax(probabilities, axis=-1, output_type=tf.int32)
            return {
                "probabilities": probabilities,
                "label_id": label_id,
                "label": tf.gather(self.labels, label_id),
            }

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def predict(self, text):
            return self._named(self._probabilities(self._pack(self.tokenizer.tokenize(text))))

        @tf.function(
            input_signature=[
                tf.TensorSpec([None], tf.string, name="text_a"),
                tf.TensorSpec([None], tf.string, name="text_b"),
            ]
        )
        def predict_pair(self, text_a, text_b):
            packed = self._pack(self.tokenizer.tokenize(text_a), self.tokenizer.tokenize(text_b))
            return self._named(self._probabilities(packed))

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def classify(self, inputs):
            features = export_graph.parse_examples(
                inputs, {"text": tf.io.FixedLenFeature([], tf.string)}
            )
            probabilities = self._probabilities(
                self._pack(self.tokenizer.tokenize(features["text"]))
            )
            classes = tf.tile(self.labels[tf.newaxis, :], [tf.shape(inputs)[0], 1])
            return {"classes": classes, "scores": probabilities}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def regress(self, inputs):
            # A bare parse_example, as in exports written before export_graph.parse_examples: the
            # server's handling of its undecodable errors stays covered.
            features = tf.io.parse_example(inputs, {"text": tf.io.FixedLenFeature([], tf.string)})
            probabilities = self._probabilities(
                self._pack(self.tokenizer.tokenize(features["text"]))
            )
            return {"outputs": probabilities[:, 1]}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def echo_bytes(self, text):
            return {"text_bytes": text}

        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 2], tf.float32, name="x"),
                tf.TensorSpec([None], tf.int32, name="n"),
            ]
        )
        def scale(self, x, n):
            checked = tf.debugging.assert_non_negative(n, message="n must be non-negative")
            with tf.control_dependencies([checked]):
                return {"y": x * tf.cast(n, tf.float32)[:, tf.newaxis]}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def complex_out(self, x):
            return {"z": tf.complex(x, x)}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def scratch(self, text):
            # 256 KiB of working memory per row (two [rows, 32768] float32 tensors), summed away:
            # a call's memory grows with its rows as BERT's activations do, so a test can see
            # whether a big request runs in chunks. tile and sin are not folded away by Grappler.
            length = tf.cast(tf.strings.length(text), tf.float32)
            work = tf.sin(tf.tile(length[:, tf.newaxis], [1, SCRATCH_WIDTH]))
            return {"total": tf.reduce_sum(work, axis=1)}

    return Classifier()


def _signatures(module):
    """Every signature the server is tested on."""
    return {
        "serving_default": module.predict.get_concrete_function(),
        "pair": module.predict_pair.get_concrete_function(),
        "classification": module.classify.get_concrete_function(),
        "regression": module.regress.get_concrete_function(),
        "echo": module.echo_bytes.get_concrete_function(),
        "scale": module.scale.get_concrete_function(),
        "complex": module.complex_out.get_concrete_function(),
        "scratch": module.scratch.get_concrete_function(),
    }


def _save(module, path, signatures):
    """Saves a SavedModel, then marks the classify/regress signatures' methods."""
    from bert_tf.saved_model import export

    tf.saved_model.save(module, path, signatures=signatures)
    # tf.saved_model.save writes every signature as "predict"; the exporter's fix-up sets the rest.
    export.set_method_names(
        path, {"classification": methods.CLASSIFY_METHOD, "regression": methods.REGRESS_METHOD}
    )


def build_test_exports(tmp_path_factory, vocab_file):
    """{"v1": dir, "v2": dir}: two versions of the test model (v2 has upper-case label names).

    Tests only read them. The first worker of a run builds them (helpers.built_once): building
    takes about 35 s of CI's 2 cores.
    """
    if not _BUILT:

        def build(root):
            module = _make_module(vocab_file)
            _save(module, str(root / "v1"), _signatures(module))
            # Version 2: the same graphs with other label names (re-saving is fast).
            loaded = tf.saved_model.load(str(root / "v1"))
            loaded.labels.assign(V2_LABELS)
            _save(loaded, str(root / "v2"), dict(loaded.signatures))

        root = built_once(tmp_path_factory, "serve_models", build)
        _BUILT.update(v1=str(root / "v1"), v2=str(root / "v2"))
    return dict(_BUILT)


def make_base(tmp_path, exports, versions=(1,)):
    """A TF Serving model base path with the given versions of v1 (plus a non-numeric decoy dir)."""
    base = tmp_path / "clf"
    base.mkdir()
    (base / "not_a_version").mkdir()
    for version in versions:
        shutil.copytree(exports["v1"], base / str(version))
    return str(base)


def model_server(
    models,
    port=0,
    poll_seconds=0,
    grpc_port=None,
    warmup=True,
    on_loaded=None,
    enable_batching=False,
    max_batch_size=batching.DEFAULT_MAX_BATCH_SIZE,
    batch_timeout_micros=2000,
    max_instances_per_request=0,
    max_response_elements=methods.DEFAULT_MAX_RESPONSE_ELEMENTS,
    max_request_bytes=DEFAULT_MAX_REQUEST_BYTES,
    idle_timeout_s=60.0,
    deadline_s=None,
    metrics=None,
    metrics_path=None,
):
    """A ModelServer on 127.0.0.1 (free ports by default) from the tests' keyword arguments."""
    options = server.ServerOptions(
        rest_api_port=port,
        grpc_port=grpc_port,
        file_system_poll_wait_seconds=poll_seconds,
        max_request_bytes=max_request_bytes,
        idle_timeout_s=idle_timeout_s,
        rest_api_deadline_s=deadline_s,
    )
    core_options = core.CoreOptions(
        max_batch_size=max_batch_size,
        max_instances_per_request=max_instances_per_request,
        max_response_elements=max_response_elements,
        batching_options=batching.BatchingOptions(max_batch_size, batch_timeout_micros)
        if enable_batching
        else None,
        warmup=warmup,
    )
    return server.ModelServer(models, options, core_options, on_loaded, metrics, metrics_path)


def split_raw_reply(raw):
    """(status line, {lower-case header: value}, body) of one raw HTTP reply."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.split(b"\r\n")
    headers = {}
    for line in lines:
        key, _, value = line.partition(b":")
        headers[key.strip().lower().decode()] = value.strip().decode()
    return status_line, headers, body


def serve_cli(args, tmp_path):
    """Starts `python -m bert_tf.serve ARGS`; returns (process, stdout lines queue, stderr path)."""
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "w") as stderr_file:  # A file: a chatty child never blocks on a pipe.
        process = subprocess.Popen(
            [sys.executable, "-m", "bert_tf.serve", *args],
            stdout=subprocess.PIPE,
            stderr=stderr_file,
            text=True,
            env=dict(os.environ, PYTHONPATH=ROOT),
            cwd=ROOT,
        )
    lines = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put(line) for line in process.stdout], daemon=True
    ).start()
    return process, lines, stderr_path
