"""The model directory: the one contract between pretraining, fine-tuning, feature extraction and export.

A model directory is enough on its own to rebuild the model:

    bert_config.json   the BertConfig (with do_lower_case, config_version, and a left-to-right
                       model's attention_direction)
    vocab.txt
    task.json          a fine-tuned model's TaskSpec (read and written by bert_tf.tasks.models); none
                       for a pretrained encoder
    checkpoint         tf.train.CheckpointManager's state file, naming the newest ckpt-N
    ckpt-N.index, ckpt-N.data-*   a TF2 object checkpoint

The checkpoint's root objects are `encoder` (always), `pretraining_model` (the MLM/NSP heads, from
pretraining or a converted checkpoint that had them), `model` (a fine-tuned task model wrapping the
same encoder), and, in a directory a training job wrote, `optimizer` and `step`.

Which pretraining heads a directory has is read from its checkpoint alone: `ModelDir.pretraining_heads()`
returns a subset of {"mlm", "nsp"} (MLM_HEAD, NSP_HEAD). A head is there when the checkpoint holds its
weights; no flag in bert_config.json or elsewhere says so, so no existing file changes meaning:
- both heads: `pretraining_model` is the whole model of modeling.build_pretraining_model, as a
  pretraining run or a converted checkpoint with both heads (Google's, Hugging Face's
  BertForPreTraining) always wrote it;
- the MLM head only (e.g. converted from a Hugging Face BertForMaskedLM, which has no NSP head):
  `pretraining_model` holds the MLM head's weights under the very keys the whole model gives them,
  and no NSP weights at all (`pretraining_checkpoint_object`). A random NSP head is never written.
  A run_pretraining --nsp=false checkpoint (and an --objective=ltr one, whose tied LM head is the
  MLM head's layer) saves the whole model built without its NSP head: the MLM head sits at the
  same key, and no variables at the NSP head's;
- no heads (an encoder-only source such as a Hugging Face BertModel): no `pretraining_model`.
Restoring a pretraining model restores the heads the checkpoint has; a head it lacks keeps its fresh
initialization, with a warning naming it, and `load_pretraining_model(require=...)` refuses a
directory that lacks a head the caller needs (fill-mask needs "mlm", next-sentence "nsp").

    model_dir = ModelDir("build/pretrain")
    encoder = model_dir.load_encoder()          # or bert_tf.model.model_dir.load_encoder(path)

This module knows files and checkpoints only; a fine-tuned model is rebuilt where tasks live
(`bert_tf.tasks.models.load_task_model(ModelDir("models/mrpc"))`).

Loading never depends on how the directory was written: the file names and the checkpoint keys are
those bert_tf has always used (the keys follow the order in which bert_tf.model.modeling creates layers).
"""

import contextlib
import os
import re

import tensorflow as tf
from absl import logging
from tensorflow.core.protobuf import trackable_object_graph_pb2

from bert_tf.model import modeling
from bert_tf.runtime import io_utils

CONFIG_FILE = "bert_config.json"
VOCAB_FILE = "vocab.txt"
TASK_FILE = "task.json"
CHECKPOINT_STATE_FILE = "checkpoint"  # Written by tf.train.CheckpointManager beside ckpt-N.*.
CHECKPOINT_NAME = "ckpt"
MODEL_DIR_FILES = (CONFIG_FILE, VOCAB_FILE, CHECKPOINT_STATE_FILE)
# Where a training job's checkpoint keeps its `step` root object (a tf.Variable).
STEP_KEY = "step/.ATTRIBUTES/VARIABLE_VALUE"


class ModelDirError(io_utils.UsageError):
    """A model directory that is missing files or whose checkpoint does not fit its config."""


class DamagedCheckpointError(io_utils.UsageError):
    """A checkpoint whose files are cut short or damaged; the message names them."""


# What TensorFlow's checkpoint reader raises for a .data file cut short ("Read less bytes than
# requested") or whose bytes do not match the index's checksums.
_DAMAGE_ERRORS = (IndexError, tf.errors.DataLossError, tf.errors.OutOfRangeError)


@contextlib.contextmanager
def reading_checkpoint(prefix):
    """The block reads checkpoint `prefix` (ours or Google's): damage is a DamagedCheckpointError
    naming its data files, not TensorFlow's bare IndexError."""
    try:
        yield
    except _DAMAGE_ERRORS as e:
        shards = sorted(tf.io.gfile.glob(prefix + ".data-*")) or [prefix + ".data-*"]
        reason = e.message if isinstance(e, tf.errors.OpError) else str(e)
        raise DamagedCheckpointError(
            f"checkpoint {prefix}: {', '.join(shards)} is cut short or damaged ({reason})"
        ) from None


# The legacy config files already warned about, so that a job reading one model directory several
# times warns once.
_warned_legacy_configs = set()


def checkpoint_step(prefix):
    """The training step saved in the checkpoint `prefix`; 0 when it has none (e.g. a converted one)."""
    with reading_checkpoint(prefix):
        reader = tf.train.load_checkpoint(prefix)
        return int(reader.get_tensor(STEP_KEY)) if reader.has_tensor(STEP_KEY) else 0


def checkpoint_root_children(prefix):
    """The names of the root objects of a TF2 object checkpoint (e.g. encoder, pretraining_model).

    Read from the object graph, not from variable names: a variable is stored under its SHORTEST
    path, which in a training checkpoint goes through `optimizer/` rather than `encoder/`.
    """
    return {child.local_name for child in _object_graph(prefix).nodes[0].children}


def is_object_checkpoint(prefix):
    """Whether `prefix` is a TF2 object checkpoint (ours), not a TF1 name-based one (Google's)."""
    with reading_checkpoint(prefix):
        return tf.train.load_checkpoint(prefix).has_tensor("_CHECKPOINTABLE_OBJECT_GRAPH")


# ----------------------------------------------------------------------------------------------
# The pretraining heads
# ----------------------------------------------------------------------------------------------

MLM_HEAD, NSP_HEAD = "mlm", "nsp"
# Each head's layer in modeling.build_pretraining_model.
HEAD_LAYERS = {MLM_HEAD: "mlm_head", NSP_HEAD: "nsp_head"}
ALL_HEADS = frozenset(HEAD_LAYERS)
_HEAD_DESCRIPTIONS = {MLM_HEAD: "MLM (masked-LM) head", NSP_HEAD: "NSP (next-sentence) head"}
# Where a checkpoint keeps each head: the child names from the `pretraining_model` root object to the
# head's layer. keras.Model keeps its layers in `_operations`, in the order build_pretraining_model
# creates them (three encoder inputs, the encoder, masked_lm_positions, mlm_head, nsp_head, ...).
# Like every checkpoint key this is on-disk format; _check_head_paths checks that a model has it.
_HEAD_PATHS = {MLM_HEAD: ("_operations", "5"), NSP_HEAD: ("_operations", "6")}


def as_heads(heads):
    """`heads` (head names) as a frozenset; a name not in ALL_HEADS is a ValueError."""
    heads = frozenset(heads)
    unknown = heads - ALL_HEADS
    if unknown:
        raise ValueError(
            f"unknown pretraining head(s) {sorted(unknown)}; known: {sorted(ALL_HEADS)}"
        )
    return heads


def describe_heads(heads):
    """`heads` in words, for logs: e.g. "the MLM (masked-LM) head only", "no pretraining heads"."""
    heads = as_heads(heads)
    if not heads:
        return "no pretraining heads"
    if heads == ALL_HEADS:
        return "the MLM and NSP pretraining heads"
    return f"the {' and '.join(_HEAD_DESCRIPTIONS[h] for h in sorted(heads))} only"


def model_pretraining_heads(pretraining_model):
    """The heads `pretraining_model` has layers for: both, or the MLM head alone of a model
    built without its NSP head (modeling.build_pretraining_model(with_nsp_head=False))."""
    names = {layer.name for layer in pretraining_model.layers}
    return frozenset(head for head, layer in HEAD_LAYERS.items() if layer in names)


def _check_head_paths(pretraining_model):
    """Raises unless `pretraining_model` keeps each head's layer it has at its _HEAD_PATHS path."""
    for head in model_pretraining_heads(pretraining_model):
        path = _HEAD_PATHS[head]
        node = pretraining_model
        for name in path:
            node = tf.train.TrackableView.children(node).get(name)
            if node is None:
                break
        if node is not pretraining_model.get_layer(HEAD_LAYERS[head]):
            raise RuntimeError(
                f"bert_tf bug: the pretraining model does not keep its {HEAD_LAYERS[head]} at "
                f"{'/'.join(path)}, where checkpoints keep it (did build_pretraining_model or Keras change?)"
            )


def pretraining_checkpoint_object(pretraining_model, heads):
    """What a checkpoint's `pretraining_model` root object is when it holds `heads` of `pretraining_model`.

    Both heads: the model itself. Some: a trackable that holds only those heads' layers, each at the
    path the whole model gives it (_HEAD_PATHS), so their weights are saved and restored under the
    same keys as in a checkpoint of the whole model, and the missing head's weights are neither
    written nor expected. None: None (the checkpoint has no `pretraining_model`). A head the
    model has no layer for is a ValueError.
    """
    heads = as_heads(heads)
    if not heads:
        return None
    lacking = heads - model_pretraining_heads(pretraining_model)
    if lacking:
        raise ValueError(
            "the pretraining model has no "
            + " and no ".join(_HEAD_DESCRIPTIONS[h] for h in sorted(lacking))
        )
    _check_head_paths(pretraining_model)
    if heads == ALL_HEADS:
        return pretraining_model
    tree = {}
    for head in heads:
        *parents, leaf = _HEAD_PATHS[head]
        node = tree
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = pretraining_model.get_layer(HEAD_LAYERS[head])
    root = tf.Module()
    for name, child in tree.items():
        setattr(root, name, child)  # a dict becomes a trackable dict whose keys are child names
    return root


def _object_graph(prefix):
    """The trackable object graph of the TF2 object checkpoint `prefix`."""
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    with reading_checkpoint(prefix):
        graph.ParseFromString(
            tf.train.load_checkpoint(prefix).get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH")
        )
    return graph


def _holds_variables(graph, node_id):
    """Whether the object `node_id` of `graph`, or any object below it, is a saved variable."""
    stack, seen = [node_id], set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if any(a.name == "VARIABLE_VALUE" for a in graph.nodes[node].attributes):
            return True
        stack.extend(child.node_id for child in graph.nodes[node].children)
    return False


def checkpoint_pretraining_heads(prefix):
    """The pretraining heads whose weights checkpoint `prefix` holds: a frozenset, subset of ALL_HEADS.

    Read from the object graph, as checkpoint_root_children is (a training checkpoint keys a head's
    variables under `optimizer/`, yet its object graph still has them under `pretraining_model/`).
    """
    graph = _object_graph(prefix)

    def child(node_id, name):
        return next(
            (c.node_id for c in graph.nodes[node_id].children if c.local_name == name), None
        )

    root = child(0, "pretraining_model")
    heads = set()
    for head, path in _HEAD_PATHS.items():
        node = root
        for name in path:
            node = None if node is None else child(node, name)
        if node is not None and _holds_variables(graph, node):
            heads.add(head)
    return frozenset(heads)


def pretraining_heads_to_restore(prefix, pretraining_model, require=()):
    """(the object to restore as the checkpoint's `pretraining_model`, or None; the heads it holds).

    It holds the heads both `prefix` and `pretraining_model` have (a model built without its NSP
    head restores the MLM head of a checkpoint with both). The model's heads that `prefix` lacks
    keep their fresh initialization, with a warning naming them; a lacking head named in
    `require` is a ModelDirError instead.
    """
    heads = checkpoint_pretraining_heads(prefix)
    needed = as_heads(require) - heads
    if needed:
        raise ModelDirError(
            f"{prefix} has {describe_heads(heads)}: it has no "
            f"{' and no '.join(_HEAD_DESCRIPTIONS[h] for h in sorted(needed))}, which this needs"
        )
    model_heads = model_pretraining_heads(pretraining_model)
    missing = model_heads - heads
    if missing == ALL_HEADS:
        logging.warning(
            "%s has no pretraining heads; MLM and NSP heads are freshly initialized", prefix
        )
    elif missing:
        logging.warning(
            "%s has %s; its %s is freshly initialized and its outputs mean nothing",
            prefix,
            describe_heads(heads),
            " and ".join(_HEAD_DESCRIPTIONS[h] for h in sorted(missing)),
        )
    restored = heads & model_heads
    return pretraining_checkpoint_object(pretraining_model, restored), restored


def _has_all_data_shards(prefix):
    """Whether every `prefix.data-NNNNN-of-MMMMM` shard of a checkpoint is there."""
    shards = tf.io.gfile.glob(prefix + ".data-*-of-*")
    if not shards:
        return False
    total = int(shards[0].rsplit("-of-", 1)[1])
    return len(shards) == total


def _copy_vocab(vocab_file, config, destination):
    """Copies vocab_file atomically, refusing one with more tokens than config.vocab_size."""
    with tf.io.gfile.GFile(vocab_file, "r") as f:
        num_tokens = sum(1 for line in f if line.rstrip("\n"))
    if num_tokens > config.vocab_size:
        raise ValueError(
            f"{vocab_file} has {num_tokens} tokens but vocab_size is {config.vocab_size}"
        )
    if num_tokens < config.vocab_size:
        logging.warning(
            "%s has %d tokens, fewer than vocab_size %d", vocab_file, num_tokens, config.vocab_size
        )
    with io_utils.atomic_path(destination) as tmp:
        tf.io.gfile.copy(vocab_file, tmp, overwrite=True)


class ModelDir:
    """One model directory (local or gs://): its files, its checkpoints, writing and restoring models.

    Examples:
        >>> from bert_tf.model.model_dir import ModelDir
        >>> model_dir = ModelDir("models/minilm")  # the quickstart's all-MiniLM-L6-v2, converted
        >>> model_dir.check()  # the newest checkpoint; a ModelDirError names every missing file
        'models/minilm/ckpt-1'
        >>> config = model_dir.load_config()
        >>> config.hidden_size, config.num_hidden_layers, config.hidden_act, config.do_lower_case
        (384, 6, 'gelu_exact', True)
        >>> model_dir.latest_step(), sorted(model_dir.pretraining_heads())  # converted: no heads
        (0, [])
    """

    def __init__(self, path):
        self.path = os.fspath(path) if path else ""

    def __repr__(self):
        return f"ModelDir({self.path!r})"

    def _file(self, name):
        """The path of `name` in the directory."""
        return os.path.join(self.path, name)

    @property
    def config_file(self):
        """The path of bert_config.json."""
        return self._file(CONFIG_FILE)

    @property
    def vocab_file(self):
        """The path of vocab.txt."""
        return self._file(VOCAB_FILE)

    @property
    def task_file(self):
        """The path of task.json."""
        return self._file(TASK_FILE)

    # ------------------------------------------------------------------------------------------
    # What is there
    # ------------------------------------------------------------------------------------------

    def exists(self):
        """Whether the path holds a model directory: bert_config.json and a TF2 object checkpoint."""
        return bool(self.path) and (
            tf.io.gfile.isdir(self.path)
            and tf.io.gfile.exists(self.config_file)
            and self.latest_checkpoint() is not None
        )

    def latest_checkpoint(self):
        """The prefix of the newest checkpoint (path/ckpt-N), or None when there is none."""
        return tf.train.latest_checkpoint(self.path) if self.path else None

    def latest_step(self):
        """The training step saved in the newest checkpoint; 0 when there is none, or it has no step."""
        latest = self.latest_checkpoint()
        return checkpoint_step(latest) if latest else 0

    def checkpoint_objects(self, prefix=None):
        """The root objects of checkpoint `prefix` (default: the newest), e.g. {"encoder", "model"}."""
        return checkpoint_root_children(prefix or self.check())

    def pretraining_heads(self, prefix=None):
        """The pretraining heads checkpoint `prefix` (default: the newest) has weights of: a frozenset,
        subset of {"mlm", "nsp"} (MLM_HEAD, NSP_HEAD); empty for an encoder-only or fine-tuned directory."""
        return checkpoint_pretraining_heads(prefix or self.check())

    def check(self):
        """Raises ModelDirError naming every missing file; returns the newest checkpoint's prefix."""
        if not self.path or not tf.io.gfile.isdir(self.path):
            raise ModelDirError(f"model directory {self.path} does not exist")
        missing = [name for name in MODEL_DIR_FILES if not tf.io.gfile.exists(self._file(name))]
        latest = None
        if CHECKPOINT_STATE_FILE not in missing:
            latest = self.latest_checkpoint()
            # latest_checkpoint looks for the .index only; a checkpoint without its data shards
            # would otherwise fail later, in the middle of a restore, naming no file.
            if latest is not None and not _has_all_data_shards(latest):
                latest = None
            if latest is None:
                missing.append(
                    f"the checkpoint named in {self._file(CHECKPOINT_STATE_FILE)} "
                    "(ckpt-N.index / ckpt-N.data-*)"
                )
        if missing:
            raise ModelDirError(
                f"model directory {self.path} is missing: {', '.join(missing)} "
                f"(a model directory holds {', '.join(MODEL_DIR_FILES)} and ckpt-N.*)"
            )
        return latest

    # ------------------------------------------------------------------------------------------
    # The config
    # ------------------------------------------------------------------------------------------

    def read_config(self):
        """bert_config.json as a BertConfig (without checking the rest); the one reader of a model dir's config.

        A file without `config_version` was written by bert_tf before version 2, when "gelu" meant the
        exact erf form: its "gelu" is read as "gelu_exact", so the model computes what it was trained to
        compute, and a warning (once per file) says how to migrate the file. Such a file is a
        bidirectional model's (attention_direction came with version 3), so the config returned is
        version 2, and anything written from it is migrated.
        """
        path = self.config_file
        values = modeling.read_json_object(path)
        if "config_version" not in values:
            values = dict(values, config_version=modeling.BIDIRECTIONAL_CONFIG_VERSION)
            if isinstance(values.get("hidden_act"), str) and values["hidden_act"].lower() == "gelu":
                values["hidden_act"] = "gelu_exact"
                if path not in _warned_legacy_configs:
                    _warned_legacy_configs.add(path)
                    logging.warning(
                        '%s has no config_version: it was written by bert_tf before "gelu" meant Google\'s tanh '
                        'approximation, so its "gelu" is read as the exact erf form it was trained with. '
                        'To migrate the file, set "hidden_act": "gelu_exact" and "config_version": %d in it.',
                        path,
                        modeling.BIDIRECTIONAL_CONFIG_VERSION,
                    )
        return modeling.BertConfig.from_dict(values, source=path)

    def load_config(self):
        """bert_config.json as a BertConfig, after checking the directory is complete."""
        self.check()
        return self.read_config()

    # ------------------------------------------------------------------------------------------
    # Restoring
    # ------------------------------------------------------------------------------------------

    def restore(self, prefix=None, **objects):
        """Restores `objects` (root attributes) from `prefix` (default: the newest checkpoint); every
        variable of theirs must be there.

        A checkpoint written for another config fails here (the model is then discarded by the caller):
        a different shape makes restore raise, a different layer count leaves variables unmatched.
        """
        prefix = prefix or self.check()
        fits = f"checkpoint {prefix} does not fit {CONFIG_FILE} beside it"
        try:
            with reading_checkpoint(prefix):
                status = tf.train.Checkpoint(**objects).restore(prefix).expect_partial()
        except ValueError as e:
            raise ModelDirError(f"{fits}: {e}") from e
        try:
            status.assert_existing_objects_matched()
        except AssertionError as e:
            # TF's message embeds whole variable values; keep only their paths and shapes.
            unmatched = re.findall(r"path=([^,]+), shape=(\([^)]*\))", str(e))
            count = re.search(r"Found (\d+) Python objects", str(e))
            listed = ", ".join(f"{path} {shape}" for path, shape in unmatched)
            raise ModelDirError(
                f"{fits}: {count.group(1) if count else 'some'} weights of {', '.join(objects)} are not in it "
                f"(e.g. {listed or str(e)[:500]})"
            ) from None
        return prefix

    def restore_pretraining_weights(self, encoder, pretraining_model, prefix=None, require=()):
        """Restores the encoder, and the MLM/NSP heads the checkpoint has; returns those heads (a frozenset).

        A head the checkpoint lacks (both, for one converted from an encoder-only source such as a
        Hugging Face BertModel; NSP, for one from a BertForMaskedLM) keeps its fresh initialization, and
        a warning names it; a lacking head named in `require` is a ModelDirError instead.
        """
        prefix = prefix or self.check()
        heads_object, heads = pretraining_heads_to_restore(prefix, pretraining_model, require)
        if heads_object is None:
            self.restore(prefix, encoder=encoder)
        else:
            self.restore(prefix, encoder=encoder, pretraining_model=heads_object)
        return heads

    def load_encoder(self):
        """Rebuilds the encoder from the directory alone and restores its weights from the newest checkpoint."""
        prefix = self.check()
        encoder = modeling.build_encoder(self.read_config())
        self.restore(prefix, encoder=encoder)
        return encoder

    def load_pretraining_model(self, require=()):
        """Rebuilds (pretraining_model, encoder) and restores the newest checkpoint.

        `require` names the heads the caller needs ("mlm" for fill-mask, "nsp" for next-sentence): a
        directory without one is a ModelDirError. Any other head the directory lacks is freshly
        initialized, with a warning (see restore_pretraining_weights); `pretraining_heads()` says which.
        """
        prefix = self.check()
        model, encoder = modeling.build_pretraining_model(self.read_config())
        self.restore_pretraining_weights(encoder, model, prefix, require=require)
        return model, encoder

    # ------------------------------------------------------------------------------------------
    # Writing
    # ------------------------------------------------------------------------------------------

    def write_files(self, config, vocab_file, spec=None):
        """Writes bert_config.json, vocab.txt and (with `spec`, anything with `to_json_file`) task.json,
        each renamed into place."""
        tf.io.gfile.makedirs(self.path)
        config.to_json_file(self.config_file)
        if os.path.abspath(vocab_file) != os.path.abspath(self.vocab_file):
            _copy_vocab(vocab_file, config, self.vocab_file)
        if spec is not None:
            spec.to_json_file(self.task_file)

    def save_checkpoint(self, max_to_keep=3, **objects):
        """Saves `objects` (root attributes such as encoder=...) as the next ckpt-N; returns its path.

        The checkpoint counts as written only once CheckpointManager has updated the `checkpoint`
        state file, so a kill leaves no half model directory that loads.
        """
        manager = tf.train.CheckpointManager(
            tf.train.Checkpoint(**objects),
            self.path,
            max_to_keep=max_to_keep,
            checkpoint_name=CHECKPOINT_NAME,
        )
        return manager.save()

    def write(
        self,
        config,
        vocab_file,
        encoder,
        pretraining_model=None,
        spec=None,
        model=None,
        max_to_keep=3,
        heads=ALL_HEADS,
    ):
        """Writes a whole model directory: config, vocab, task.json (with `spec`), then a checkpoint of
        `encoder` (and `pretraining_model`, and the task `model`); returns the checkpoint's path.

        `heads` are the heads of `pretraining_model` whose weights are real (default both): only they
        are written (see the module docstring), so a head the source lacked is never saved as if it
        had been trained. The checkpoint is written last, so a kill never leaves a directory that
        loads half.
        """
        if (spec is None) != (model is None):
            raise ValueError(
                "a fine-tuned model directory needs both the task spec and the task model"
            )
        heads_object = None
        if pretraining_model is not None:
            heads_object = pretraining_checkpoint_object(pretraining_model, heads)
        self.write_files(config, vocab_file, spec)
        objects = {"encoder": encoder}
        if heads_object is not None:
            objects["pretraining_model"] = heads_object
        if model is not None:
            objects["model"] = model
        return self.save_checkpoint(max_to_keep, **objects)


def load_encoder(path):
    """The Keras encoder of the model directory at `path` (inputs input_word_ids/input_mask/input_type_ids).

    Examples:
        >>> import numpy as np
        >>> from bert_tf.model.model_dir import load_encoder
        >>> encoder = load_encoder("models/minilm")
        >>> ids = np.array([[101, 7592, 2088, 102]], np.int32)  # [CLS] hello world [SEP]
        >>> outputs = encoder(
        ...     {"input_word_ids": ids, "input_mask": np.ones_like(ids), "input_type_ids": 0 * ids}
        ... )
        >>> tuple(outputs["sequence_output"].shape), tuple(outputs["pooled_output"].shape)
        ((1, 4, 384), (1, 384))
        >>> len(outputs["encoder_outputs"])  # one [batch, seq, hidden] tensor per layer
        6
    """
    return ModelDir(path).load_encoder()
