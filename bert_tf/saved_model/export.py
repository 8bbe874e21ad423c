"""SavedModels with tokenization baked in: strings in, answers out, for TF Serving and tf.saved_model.load.

    python -m bert_tf.export --model_dir=DIR --export_dir=export/NAME [--version=N] [--max_seq_length=N]
        [--pad_to_max_seq_length] [--precision=float32|bfloat16] [--jit_compile]

writes EXPORT_DIR/N/ in TF Serving's layout (saved_model.pb, variables/, assets/vocab.txt). N
defaults to one more than the highest numeric version already there. The version is written into
a hidden temporary directory beside it (`.N.tmp-*`, which TF Serving and bert_tf.serve ignore: its
name is not a number) and renamed to N only when complete, so no server ever sees half a version.

What is exported follows MODEL_DIR/task.json (bert_tf.tasks.models): a fine-tuned model gets its
task's serving module (bert_tf/tasks/<task>/serving.py, named in bert_tf.tasks.registry, whose
docstring lists its signatures), which takes `tf.string [batch]` (UTF-8) and returns named tensors.
A pretrained model directory (no task.json) follows the TF Hub text convention, two SavedModels in
one version, so they always match:
- EXPORT_DIR/N/ is the encoder. `__call__` maps a dict of input_word_ids, input_mask and
  input_type_ids (int32 [b, s]) to sequence_output [b, s, h], pooled_output [b, h], default
  (= pooled_output), encoder_outputs (a list of [b, s, h], one per layer) and embedding_output
  [b, s, h] (what the first layer reads). Its
  `serving_default` signature takes the three inputs by name and returns the same, with
  encoder_outputs stacked batch-first, [b, layers, s, h] (TF Serving's row format needs every
  output batch-first).
- EXPORT_DIR/N/preprocess/ is the preprocessor. `__call__` and `serving_default` map `text` to the
  three inputs, padded to the batch's longest row (at most --max_seq_length, default 128, at most
  max_position_embeddings; exactly it with --pad_to_max_seq_length); `tokenize(text)` gives the
  ids as a RaggedTensor int32 [b, (tokens)]; `bert_pack_inputs(segments, seq_length)` packs a list
  of one or two such tensors (a row whose second segment is empty is packed as a single sentence).
Both have `vocab_file` (the asset) and `do_lower_case` (a bool tf.Variable).

Every call pads its batch to its own longest packed input (rounded up to LENGTH_BUCKET, 16, with
`--jit_compile`, so that XLA compiles few shapes), at most max_seq_length, which stays the
truncation limit (`--pad_to_max_seq_length`: always max_seq_length, static shapes); a classifier,
regressor, NER or multiple choice batch of more than 16 rows runs in groups of rows of similar
length, each padded to its own longest row (export_graph.call_by_length); outputs
equal the padded graph's up to float rounding. `--precision=bfloat16` computes
in bfloat16, outputs keep their dtypes. `--jit_compile` XLA-compiles the model part (TF Serving
then needs --xla_cpu_compilation_enabled=true).

Every export carries assets/vocab.txt and assets/bert_config.json (with do_lower_case), task
exports assets/task.json, and every version assets.extra/tf_serving_warmup_requests (bert_tf.saved_model.warmup).
Inputs are tokenized by GraphTokenizer (FullTokenizer's ids) and packed
as in training: `[CLS] a [SEP] (b [SEP])`, truncated by the original rule to max_seq_length (the
model directory's, or --max_seq_length), so an empty string and a megabyte-long one both work.
The graphs use only TensorFlow core and tensorflow_text ops.
"""

import contextlib
import os
import re
import socket
import time
import uuid

import keras
import tensorflow as tf
from absl import logging

from bert_tf.model import modeling
from bert_tf.model.model_dir import MLM_HEAD, ModelDir
from bert_tf.pretraining import masked_lm
from bert_tf.runtime import io_utils
from bert_tf.saved_model import masked_lm_serving, warmup
from bert_tf.saved_model.inference_encoder import InferenceEncoder, with_inference_encoder
from bert_tf.saved_model.model_versions import list_versions
from bert_tf.tasks import export_graph, models, registry, representations
from bert_tf.tasks.packing import length_multiple, pack_inputs
from bert_tf.tokenization.tokenizer_rules import VocabError, load_vocab

ENCODER_KIND = "encoder"
PREPROCESS_SUBDIR = "preprocess"
DEFAULT_ENCODER_SEQ_LENGTH = 128
# --precision -> the Keras dtype policy the model is rebuilt under. Variables stay float32 (the
# checkpoint's); bfloat16 computes the encoder in bfloat16, and every output stays float32.
PRECISION_POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16"}


# ----------------------------------------------------------------------------------------------
# Text in: tokenization and packing, the same as training
# ----------------------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------------------
# The serving modules, one per kind
# ----------------------------------------------------------------------------------------------


class EncoderModule(export_graph.ServingModule):
    """The encoder alone, TF Hub style: int32 inputs -> sequence_output, pooled_output,
    encoder_outputs, embedding_output, default."""

    def __init__(self, encoder, assets, packer, config, heads=None):
        super().__init__(assets)
        self.encoder = encoder
        self.config = config
        self.packer = packer  # the preprocessor's, whose lengths the warm-up requests follow
        # The pretraining heads' signatures (masked_lm_serving.HeadsModule), where the model has heads.
        self.heads = heads
        self.vocab_file = assets.vocab_file
        self.do_lower_case = assets.do_lower_case
        inputs_spec = {
            name: tf.TensorSpec([None, None], tf.int32, name=name)
            for name in modeling.ENCODER_INPUTS
        }
        self.__call__ = export_graph.serving_function(self._call, input_signature=[inputs_spec])
        self.serve = export_graph.serving_function(
            self._serve, input_signature=list(inputs_spec.values())
        )

    def _call(self, inputs):
        """The TF Hub call: a dict of the three int32 inputs -> the outputs dict (encoder_outputs a list)."""
        outputs = self.encoder(self._checked(inputs), training=False)
        # float32 whatever the compute precision (--precision=bfloat16), so callers see one dtype.
        sequence_output, pooled_output = (
            tf.cast(outputs[name], tf.float32) for name in ("sequence_output", "pooled_output")
        )
        return {
            "sequence_output": sequence_output,
            "pooled_output": pooled_output,
            "encoder_outputs": [tf.cast(x, tf.float32) for x in outputs["encoder_outputs"]],
            "embedding_output": tf.cast(outputs["embedding_output"], tf.float32),
            "default": pooled_output,
        }

    def _checked(self, inputs):
        """`inputs` once their values fit the model, else an InvalidArgumentError naming the input:
        ids in the vocabulary, type ids among the token types, 1 to max_position_embeddings
        positions (a gather past a table's end would fail with a message naming no input)."""
        config = self.config
        ids = inputs["input_word_ids"]
        positions = tf.shape(ids)[1]
        fits = (tf.shape(ids)[0] == 0) | (
            (positions >= 1) & (positions <= config.max_position_embeddings)
        )
        message = tf.strings.format(
            f"input_word_ids has {{}} positions; this encoder takes 1 to "
            f"{config.max_position_embeddings}",
            positions,
        )
        checks = [
            tf.debugging.Assert(fits, [message]),
            _assert_in_range(ids, "input_word_ids", config.vocab_size),
            _assert_in_range(inputs["input_type_ids"], "input_type_ids", config.type_vocab_size),
        ]
        with tf.control_dependencies(checks):
            return {name: tf.identity(value) for name, value in inputs.items()}

    def _serve(self, input_word_ids, input_mask, input_type_ids):
        """The signature: as __call__, with encoder_outputs stacked batch-first [b, layers, s, h]."""
        outputs = self._call(
            {
                "input_word_ids": input_word_ids,
                "input_mask": input_mask,
                "input_type_ids": input_type_ids,
            }
        )
        outputs["encoder_outputs"] = tf.stack(outputs["encoder_outputs"], axis=1)
        return outputs

    def signatures(self):
        """signature key -> (tf.function with an input signature, method name)."""
        result = super().signatures()
        if self.heads is not None:
            result.update(self.heads.signatures())
        return result


def _assert_in_range(values, name, size):
    """An assertion that every one of `values` is in [0, size), naming the input."""
    message = tf.strings.format(
        f"{name} holds values from {{}} to {{}}; it takes 0 to {size - 1}",
        [tf.reduce_min(values), tf.reduce_max(values)],
    )
    return tf.debugging.Assert(tf.reduce_all((values >= 0) & (values < size)), [message])


class PreprocessModule(export_graph.ServingModule):
    """The TF Hub preprocessor: strings -> packed encoder inputs; `.tokenize`, `.bert_pack_inputs`."""

    def __init__(self, packer, assets):
        super().__init__(assets)
        self.packer = packer
        self.vocab_file = assets.vocab_file
        self.do_lower_case = assets.do_lower_case
        self.__call__ = export_graph.serving_function(
            self._call, input_signature=[export_graph.text_spec("text")]
        )
        self.tokenize = export_graph.serving_function(
            self._tokenize, input_signature=[export_graph.text_spec("text")]
        )
        self.bert_pack_inputs = export_graph.serving_function(self._bert_pack_inputs)
        # Traced for one and two segments, so the loaded model has both without Python code.
        segment = tf.RaggedTensorSpec(
            [None, None], tf.int32, ragged_rank=1, row_splits_dtype=tf.int64
        )
        seq_length = tf.TensorSpec([], tf.int32, name="seq_length")
        for count in (1, 2):
            self.bert_pack_inputs.get_concrete_function([segment] * count, seq_length)

    def _call(self, text):
        """text [b] -> input_word_ids, input_mask, input_type_ids int32 [b, seq_length]."""
        return self.packer.pack([text])

    def _tokenize(self, text):
        """text [b] -> WordPiece ids, a RaggedTensor int32 [b, (tokens)]."""
        ids = self.packer.tokenizer.tokenize(text)
        return ids.with_row_splits_dtype(tf.int64)

    def _bert_pack_inputs(self, segments, seq_length):
        """A list of 1 or 2 ragged id tensors [b, (tokens)] -> the three inputs int32 [b, seq_length]."""
        # tensorflow_text's trimmer and padder take the length as a tensor, so one trace serves any.
        # An empty b packs as a single sentence, as extract_features and fine-tuning pack it.
        return pack_inputs(
            list(segments), seq_length, self.packer.cls_id, self.packer.sep_id, drop_empty_b=True
        )

    def signatures(self):
        """signature key -> (tf.function with an input signature, method name)."""
        return {"serving_default": (self.__call__, tf.saved_model.PREDICT_METHOD_NAME)}


# ----------------------------------------------------------------------------------------------
# Building and saving
# ----------------------------------------------------------------------------------------------


def build_serving_modules(
    model_dir,
    max_seq_length=None,
    pad_to_max_seq_length=False,
    precision="float32",
    jit_compile=False,
):
    """The module(s) to save for MODEL_DIR: {subdirectory ("" = the version dir) -> module}, and the kind."""
    directory = ModelDir(model_dir)
    config = directory.load_config()
    try:  # A malformed vocab.txt (e.g. a duplicated line) is the user's to fix, as in every other job.
        load_vocab(directory.vocab_file)
    except VocabError as e:
        raise io_utils.UsageError(str(e)) from e
    spec = models.read_task_spec(directory)
    if max_seq_length is not None:
        seq_length = max_seq_length
    elif spec is None:
        seq_length = min(DEFAULT_ENCODER_SEQ_LENGTH, config.max_position_embeddings)
    else:
        seq_length = spec.max_seq_length
    if seq_length > config.max_position_embeddings:
        raise io_utils.UsageError(
            f"max_seq_length {seq_length} exceeds the model's max_position_embeddings "
            f"{config.max_position_embeddings}"
        )
    if seq_length < 3:
        raise io_utils.UsageError(f"max_seq_length must be at least 3, got {seq_length}")
    if precision not in PRECISION_POLICIES:
        raise io_utils.UsageError(
            f"--precision={precision} is not one of {', '.join(PRECISION_POLICIES)}"
        )
    packer = export_graph.TextPacker(
        model_dir,
        config,
        seq_length,
        dynamic_length=not pad_to_max_seq_length,
        length_multiple=length_multiple(jit_compile),
    )
    assets = export_graph.Assets(model_dir, config)
    compiled = export_graph.CompiledModel if jit_compile else lambda model: model
    with dtype_policy(PRECISION_POLICIES[precision]):
        if spec is None:
            encoder, heads = pretrained_models(
                directory, config, seq_length, pad_to_max_seq_length, limit_threads=not jit_compile
            )
            return {
                "": EncoderModule(compiled(encoder), assets, packer, config, heads),
                PREPROCESS_SUBDIR: PreprocessModule(packer, assets),
            }, ENCODER_KIND
        model, encoder, _, spec = models.load_task_model(directory)
        # A feature-based model runs its encoder inside a FrozenEncoder: that layer is replaced.
        model = with_inference_encoder(
            representations.encoder_layer(model, encoder),
            config,
            model,
            fast=InferenceEncoder(encoder, config, limit_threads=not jit_compile),
        )
    serving_module = registry.serving_module(spec.kind)
    return {"": serving_module(compiled(model), packer, spec, assets)}, spec.kind


def pretrained_models(directory, config, seq_length, pad_to_max_seq_length, limit_threads=True):
    """(the inference encoder, the fill_mask / next_sentence signatures or None) of a pretrained
    model directory; one InferenceEncoder serves both, so its weights are saved once.
    `limit_threads`: InferenceEncoder's (False for an XLA-compiled export, whose fill_mask and
    next_sentence signatures share the encoder, uncompiled)."""
    heads = directory.pretraining_heads()
    if config.left_to_right and MLM_HEAD in heads:
        # Its tied LM head was trained to predict the next token: a fill_mask would mislead.
        logging.warning(
            "%s is a left-to-right language model: its LM head predicts the next token, so the "
            "export has no fill_mask signature",
            directory.path,
        )
        heads = heads - {MLM_HEAD}
    elif not heads:
        logging.warning(
            "%s has no pretraining heads: the export has the encoder, and no fill-mask or "
            "next-sentence signatures",
            directory.path,
        )
    if not heads:
        encoder = directory.load_encoder()
        fast = InferenceEncoder(encoder, config, limit_threads=limit_threads)
        return with_inference_encoder(encoder, config, fast=fast), None
    if MLM_HEAD in heads and "[MASK]" not in load_vocab(directory.vocab_file):
        raise io_utils.UsageError(f"{directory.vocab_file} has no [MASK] token for fill-mask")
    model, encoder = directory.load_pretraining_model(require=heads)
    fast = InferenceEncoder(encoder, config, limit_threads=limit_threads)
    packer = export_graph.TextPacker(
        directory.path,
        config,
        seq_length,
        dynamic_length=not pad_to_max_seq_length,
        special_tokens=masked_lm.TEXT_SPECIAL_TOKENS,
    )
    heads_module = masked_lm_serving.HeadsModule(
        with_inference_encoder(encoder, config, model, fast=fast),
        heads,
        packer,
        directory.vocab_file,
        config.vocab_size,
    )
    return with_inference_encoder(encoder, config, fast=fast), heads_module


@contextlib.contextmanager
def dtype_policy(name):
    """Keras' global dtype policy set to `name` while models are built inside, then restored."""
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def save_module(module, path):
    """Saves `module` with its signatures as a SavedModel at `path`, with the right method names.

    TF2's tf.saved_model.save writes every signature as tensorflow/serving/predict; TF Serving's
    :classify and :regress refuse anything but their own method names, so those are set in the
    written saved_model.pb afterwards (and its fingerprint.pb recomputed to match).
    """
    # The functions are traced inside save: a trace made outside it is not reused there (the
    # save context is part of the trace cache key), so tracing first would trace twice.
    signatures = module.signatures()
    module.serving_variables = tf_variables_of(module)
    tf.saved_model.save(module, path, signatures={key: fn for key, (fn, _) in signatures.items()})
    methods = {
        key: method
        for key, (_, method) in signatures.items()
        if method != tf.saved_model.PREDICT_METHOD_NAME
    }
    if methods:
        set_method_names(path, methods)


def tf_variables_of(module):
    """The tf.Variables behind every Keras variable that `module` reaches, each once.

    A session-based loader (TF Serving's, `saved_model_cli run`) restores only variables the
    SavedModel tracks as tf.Variables; Keras 3 layers keep theirs inside Keras variables, which
    such a loader leaves uninitialized ("Could not find variable ..."). Tracked on the module as a
    list, they are restored as keras.export.ExportArchive's exports are.
    """
    found = {}
    for trackable in tf.train.TrackableView(module).descendants():
        variables = [trackable] if isinstance(trackable, keras.Variable) else []
        if isinstance(trackable, keras.layers.Layer):
            variables = trackable.variables  # also those a layer creates but does not track
        for variable in variables:
            found.setdefault(id(variable), variable.value)
    return list(found.values())


def set_method_names(path, methods):
    """Rewrites the method_name of signatures in PATH/saved_model.pb: {signature key: method name}."""
    from tensorflow.core.protobuf import saved_model_pb2  # pylint: disable=import-outside-toplevel

    pb_path = os.path.join(path, "saved_model.pb")
    proto = saved_model_pb2.SavedModel()
    with tf.io.gfile.GFile(pb_path, "rb") as f:
        proto.ParseFromString(f.read())
    for meta_graph in proto.meta_graphs:
        for key, method in methods.items():
            if key not in meta_graph.signature_def:
                raise KeyError(f"{pb_path} has no signature {key!r}")
            meta_graph.signature_def[key].method_name = method
    with tf.io.gfile.GFile(pb_path, "wb") as f:
        f.write(proto.SerializeToString(deterministic=True))
    fingerprint = os.path.join(path, "fingerprint.pb")
    if tf.io.gfile.exists(fingerprint):
        # The fingerprint hashes saved_model.pb. No public API rewrites it; the one tf.saved_model.save
        # itself calls does. Without it, drop the stale file: loaders treat it as optional.
        try:
            from tensorflow.python.saved_model import fingerprinting_utils  # pylint: disable=import-outside-toplevel

            fingerprinting_utils.write_fingerprint(path)
        except (ImportError, AttributeError):
            tf.io.gfile.remove(fingerprint)


def write_warmup_requests(version_dir, module, model_dir, jit_compile=False):
    """Writes TF Serving's warm-up file: requests to `module`'s serving_default at the
    warmup.request_lengths, then (batch 1, the same lengths) to its other predict signatures."""
    packer = module.packer
    # Exact lengths where the graph runs them (not XLA's, which pads to LENGTH_BUCKET multiples).
    lengths = warmup.request_lengths(
        packer.seq_length, packer.dynamic_length, exact_lengths=packer.length_multiple == 1
    )
    # XLA compiles every new shape. A request one row over LENGTH_GROUP_ROWS runs the groups'
    # loop with a full group and a group of 1 (export_graph.call_by_length), so both compile here.
    # The other graphs run any shape at once and skip it: it is 17x the work at every length.
    batch_sizes = (1, export_graph.LENGTH_GROUP_ROWS + 1) if jit_compile else (1,)
    vocab_file = ModelDir(model_dir).vocab_file
    records = []
    for key, (function, method) in module.signatures().items():
        if method != tf.saved_model.PREDICT_METHOD_NAME:
            continue
        input_specs = {spec.name: spec for spec in function.input_signature}
        records += warmup.predict_logs(
            key,
            input_specs,
            lengths,
            vocab_file,
            batch_sizes if key == "serving_default" else (1,),
            masked_lm.MASK_TOKEN if key == "fill_mask" else None,
        )
    # serving_default's come first, should warmup.MAX_RECORDS cut the file short.
    warmup.write_records(version_dir, records)


def numeric_versions(export_dir):
    """The integer version numbers of the versions already in EXPORT_DIR (TF Serving ignores other names)."""
    return sorted(list_versions(export_dir))


def next_version(export_dir):
    """One more than the highest numeric version in EXPORT_DIR, or 1."""
    versions = numeric_versions(export_dir)
    return versions[-1] + 1 if versions else 1


# A version is written into EXPORT_DIR/.VERSION.tmp-HOST-PID-HEX by process PID on HOST.
_TMP_NAME = re.compile(r"^\.\d+\.tmp-(?:(?P<host>[A-Za-z0-9-]+)-(?P<pid>\d+)-)?[0-9a-f]{32}$")
FOREIGN_TMP_AGE_S = 24 * 3600


def _host():
    """This machine's name as it goes into a temporary directory's name."""
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"


def _pid_alive(pid):
    """Whether a process PID exists on this machine (a reused pid counts as alive: kept, safely)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # e.g. another user's process
    return True


def remove_stale_tmp_dirs(export_dir, now=None):
    """Removes the temporary version directories of exports killed before they finished; returns them.

    Never a live one's: see the rule below."""
    if io_utils.is_remote(export_dir) or not os.path.isdir(export_dir):
        return []
    now = time.time() if now is None else now
    removed = []
    for name in os.listdir(export_dir):
        match = _TMP_NAME.match(name)
        path = os.path.join(export_dir, name)
        if not match or not os.path.isdir(path):
            continue
        # Stale: written by a process of this host that is gone, or (another host's, or an older
        # bert_tf's name without a pid) untouched for FOREIGN_TMP_AGE_S; anything else may be live.
        if match["pid"] is not None and match["host"] == _host():
            stale = not _pid_alive(int(match["pid"]))
        else:
            stale = now - os.path.getmtime(path) > FOREIGN_TMP_AGE_S
        if stale:
            tf.io.gfile.rmtree(path)
            removed.append(path)
            logging.info("removed %s, left by an export that did not finish", path)
    return removed


def export(
    model_dir,
    export_dir,
    version=None,
    max_seq_length=None,
    pad_to_max_seq_length=False,
    precision="float32",
    jit_compile=False,
):
    """Exports MODEL_DIR as EXPORT_DIR/VERSION (default: the next version); returns (path, kind).

    The version is saved into a temporary directory beside it and renamed into place complete;
    on any failure the temporary directory is removed and no version appears. An app loads the
    export with TensorFlow alone: `tf.saved_model.load`, after importing tensorflow_text, whose ops
    the in-graph tokenizer uses.

    Examples:
        >>> from bert_tf.saved_model.export import export
        >>> export("models/sentiment", "export/sentiment")  # a fine-tuned classifier
        ('export/sentiment/1', 'classifier')
        >>> import tensorflow as tf
        >>> import tensorflow_text  # noqa: F401  (registers the tokenizer's ops)
        >>> model = tf.saved_model.load("export/sentiment/1")
        >>> outputs = model.signatures["serving_default"](text=tf.constant(["a delightful film"]))
        >>> sorted(outputs), tuple(outputs["probabilities"].shape)
        (['label', 'label_id', 'probabilities'], (1, 2))
        >>> outputs["label"].numpy()[0] in (b"negative", b"positive")
        True
    """
    if version is not None and (
        isinstance(version, bool) or not isinstance(version, int) or version < 0
    ):
        raise io_utils.UsageError(f"--version must be a non-negative integer, got {version!r}")
    if version is not None and tf.io.gfile.exists(os.path.join(export_dir, str(version))):
        raise io_utils.UsageError(
            f"{os.path.join(export_dir, str(version))} already exists; "
            "pick another --version or leave it out"
        )
    modules, kind = build_serving_modules(
        model_dir, max_seq_length, pad_to_max_seq_length, precision, jit_compile
    )
    tf.io.gfile.makedirs(export_dir)
    version = next_version(export_dir) if version is None else version
    final = os.path.join(export_dir, str(version))
    if tf.io.gfile.exists(final):  # written by someone else meanwhile
        raise io_utils.UsageError(f"{final} already exists; pick another --version or leave it out")
    # Not tempfile.mkdtemp: its directory is mode 0700, which the rename would carry over to the
    # version, unreadable to a TF Serving that runs as another user (and it takes no gs:// path).
    remove_stale_tmp_dirs(export_dir)
    tmp = os.path.join(export_dir, f".{version}.tmp-{_host()}-{os.getpid()}-{uuid.uuid4().hex}")
    tf.io.gfile.makedirs(tmp)
    try:
        for subdir, module in modules.items():
            save_module(module, os.path.join(tmp, subdir) if subdir else tmp)
        write_warmup_requests(tmp, modules[""], model_dir, jit_compile)
        tf.io.gfile.rename(tmp, final)
    except BaseException:
        try:
            tf.io.gfile.rmtree(tmp)
        except tf.errors.OpError:
            pass  # The error that got here matters more than the leftover (ignored) directory.
        raise
    logging.debug("exported %s model %s as %s", kind, model_dir, final)
    return final, kind
