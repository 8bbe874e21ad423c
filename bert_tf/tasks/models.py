"""The task spec (task.json) and task models on the BERT encoder.

A fine-tuned model directory is a model directory (bert_tf.model.model_dir: bert_config.json, vocab.txt,
ckpt-N) plus `task.json`, which says which head sits on the encoder:

    {"kind": "classifier" | "regressor" | "squad" | "ner" | "multiple_choice",
     "labels": [...],                  # classifier and ner; empty for the others
     "max_seq_length": 128,
     "is_pair": false,                 # classifier and regressor: text_a + text_b inputs
     "version_2_with_negative": false, # squad: the model may answer "no answer"
     "task_name": "sst2",
     "doc_stride": 128, "max_query_length": 64,   # squad windowing (the original's defaults)
     "head": "dense",                  # or "bilstm": a BiLSTM before the output layer
     "lstm_units": 768,                # the BiLSTM's units per direction
     "features": ""}                   # feature-based: the frozen encoder's activations it reads

A task.json without the last three (written before they existed) is a dense head on a fine-tuned
encoder; bert_tf.tasks.representations says what each choice builds.

Its checkpoint root holds `encoder` (as every model directory) and `model`, the task model that
wraps the same encoder. Fine-tuning writes `tf.train.Checkpoint(encoder=, model=, optimizer=,
step=)` into the same CheckpointManager layout; loading ignores the optimizer and step.
`read_task_spec(directory)` reads task.json and `load_task_model(directory)` rebuilds the
fine-tuned model; `bert_tf.model.model_dir.ModelDir.write` writes both.

Each kind's head is in its task folder (`bert_tf/tasks/<task>/model.py`, found through
`bert_tf.tasks.registry`). Every output is float32, also under a mixed-precision policy, so losses
and softmaxes are exact.
"""

import dataclasses
import json

import tensorflow as tf

from bert_tf.model import modeling
from bert_tf.model.model_dir import TASK_FILE, ModelDir, ModelDirError, checkpoint_root_children
from bert_tf.runtime import io_utils
from bert_tf.tasks import registry, representations


class TaskSpecError(io_utils.UsageError):
    """A task.json that is missing or has a bad field; the message names the file and field."""


@dataclasses.dataclass
class TaskSpec:
    """What task.json records: the head kind, its labels and how inputs were packed."""

    kind: str
    labels: list = dataclasses.field(default_factory=list)
    max_seq_length: int = 128
    is_pair: bool = False
    version_2_with_negative: bool = False
    task_name: str = ""
    doc_stride: int = 128
    max_query_length: int = 64
    head: str = "dense"
    lstm_units: int = representations.DEFAULT_LSTM_UNITS
    # Empty: the encoder is fine-tuned. Else the feature-based approach: the frozen encoder's
    # activations (a representations.FEATURES key or layer_K) that the BiLSTM head reads.
    features: str = ""

    def __post_init__(self):
        self.labels = list(self.labels)
        if self.kind not in registry.KINDS:
            raise TaskSpecError(
                f"kind must be one of {', '.join(registry.KINDS)}, got {self.kind!r}"
            )
        kind = registry.get(self.kind)
        for name in ("max_seq_length", "doc_stride", "max_query_length", "lstm_units"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise TaskSpecError(f"{name} must be a positive integer, got {value!r}")
        for name in ("is_pair", "version_2_with_negative"):
            if not isinstance(getattr(self, name), bool):
                raise TaskSpecError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.task_name, str):
            raise TaskSpecError(f"task_name must be a string, got {self.task_name!r}")
        if not all(isinstance(label, str) and label for label in self.labels):
            raise TaskSpecError(f"labels must be non-empty strings, got {self.labels!r}")
        if len(set(self.labels)) != len(self.labels):
            raise TaskSpecError(f"labels must be distinct, got {self.labels!r}")
        if kind.labelled and len(self.labels) < 2:
            raise TaskSpecError(f"a {self.kind} needs at least 2 labels, got {self.labels!r}")
        if not kind.labelled and self.labels:
            raise TaskSpecError(f"a {self.kind} has no labels, got {self.labels!r}")
        self._check_head()
        problem = kind.check_spec(self) if kind.check_spec else None
        if problem:
            raise TaskSpecError(problem)

    def _check_head(self):
        """The head fields: a known head, and features only with the BiLSTM head."""
        if self.head not in representations.HEADS:
            raise TaskSpecError(
                f"head must be one of {', '.join(representations.HEADS)}, got {self.head!r}"
            )
        if not isinstance(self.features, str) or (
            self.features and not representations.is_feature_choice(self.features)
        ):
            raise TaskSpecError(
                f"features must be empty or one of {representations.FEATURES_HELP}, "
                f"got {self.features!r}"
            )
        if self.features and self.head != "bilstm":
            raise TaskSpecError(
                f"features (the feature-based approach) needs head bilstm, got {self.head!r}"
            )

    def _head_fields(self):
        """What decides the head's weights: kind, labels, head, BiLSTM size and features."""
        units = self.lstm_units if self.head == "bilstm" else None
        return (self.kind, list(self.labels), self.head, units, self.features)

    def same_head(self, other):
        """Whether `other` (a TaskSpec or None) describes the same head weights (see describe)."""
        return other is not None and self._head_fields() == other._head_fields()

    def describe(self):
        """The head in words, e.g. "ner with labels ['O', 'B-PER'], a bilstm head (768 units)"."""
        text = f"{self.kind} with labels {self.labels}" if self.labels else self.kind
        if self.head == "dense":
            return text
        text += f", a bilstm head ({self.lstm_units} units)"
        return f"{text} on frozen {self.features} features" if self.features else text

    @property
    def num_labels(self):
        """The number of output units of a classifier or ner head."""
        return len(self.labels)

    @classmethod
    def from_dict(cls, values, source=TASK_FILE):
        """Builds a spec from a dict; errors name `source` and the field. Unknown fields are an error."""
        if not isinstance(values, dict):
            raise TaskSpecError(f"{source}: expected a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise TaskSpecError(f"{source}: unknown field(s) {', '.join(unknown)}")
        if "kind" not in values:
            raise TaskSpecError(f"{source}: missing field kind")
        try:
            return cls(**values)
        except TaskSpecError as e:
            raise TaskSpecError(f"{source}: {e}") from None

    @classmethod
    def from_json_file(cls, path):
        """Reads a task.json."""
        if not tf.io.gfile.exists(path):
            raise TaskSpecError(
                f"{path} not found (a fine-tuned model directory has a {TASK_FILE})"
            )
        with io_utils.open_text(path) as f:  # (skips a UTF-8 byte order mark)
            try:
                values = json.load(f)
            except ValueError as e:  # bad JSON, or bytes that are not UTF-8
                raise TaskSpecError(f"{path}: not valid JSON: {e}") from None
        return cls.from_dict(values, source=path)

    def to_dict(self):
        """The fields as a plain dict. A dense head's file leaves out the head fields (so it reads
        as before, also in a bert_tf that has none), and only a BiLSTM has units."""
        values = dataclasses.asdict(self)
        if self.head == "dense" and not self.features:
            del values["head"], values["features"]
        if self.head != "bilstm":
            del values["lstm_units"]
        return values

    def to_json_file(self, path):
        """Writes the spec as JSON, atomically."""
        io_utils.atomic_write_json(path, self.to_dict())


def build_task_model(config, spec, encoder=None, head_initializer_range=None, head_dropout=None):
    """The task model for `spec` on `encoder` (built from `config` if None); returns (model, encoder).

    The head's new weights are drawn with stddev `head_initializer_range`, and what its output
    layer reads is dropped at rate `head_dropout` in training (None: the config's
    initializer_range and hidden_dropout_prob).

    The model's inputs are the encoder's (input_word_ids, input_mask, input_type_ids, int32
    [b, s], or [b, choices, s] for multiple choice); its outputs a dict: classifier {"logits"},
    regressor {"score"}, squad {"start_logits", "end_logits"}, ner {"logits"}, multiple_choice
    {"logits"} [b, choices].
    """
    if encoder is None:
        encoder = modeling.build_encoder(config)
    # The encoder is built by now: from here on the config sizes the head alone.
    if head_initializer_range is not None:
        config = dataclasses.replace(config, initializer_range=head_initializer_range)
    if head_dropout is not None:
        config = dataclasses.replace(config, hidden_dropout_prob=head_dropout)
    return registry.get(spec.kind).build_model(config, spec, encoder), encoder


def read_task_spec(directory):
    """The TaskSpec of a model directory's task.json, or None when it has none (a pretrained encoder's)."""
    if not directory.path or not tf.io.gfile.exists(directory.task_file):
        return None
    return TaskSpec.from_json_file(directory.task_file)


def finetuned_labels(kind, source, output_dir, unknown):
    """The labels of a `kind` model fine-tuned before: OUTPUT_DIR's (a rerun), else those of the
    initial model directory (`source`, an initial_weights.ModelSource); without either, a
    UsageError saying `unknown`."""
    for spec in (read_task_spec(ModelDir(output_dir)), source.init_spec):
        if spec is not None and spec.kind == kind:
            return list(spec.labels)
    raise io_utils.UsageError(unknown)


def _features_as_saved(spec, config, prefix):
    """`spec`, with `sum_all` read as `sum_all_with_embeddings` when the checkpoint's mix has a
    weight for the embeddings too: what `sum_all` meant in model directories written before it
    became the paper's mix of the transformer layers alone."""
    if spec.features != "sum_all":
        return spec
    shapes = [shape for name, shape in tf.train.list_variables(prefix) if "mix_weights" in name]
    if shapes and shapes[0] == [config.num_hidden_layers + 1]:
        return dataclasses.replace(spec, features="sum_all_with_embeddings")
    return spec


def load_task_model(directory):
    """Rebuilds a fine-tuned model from its model directory alone; returns (model, encoder, config, spec).

    Errors name the missing file (bert_config.json, vocab.txt, checkpoint, task.json), the bad
    task.json field, or the weights the checkpoint lacks.
    """
    prefix = directory.check()
    spec = read_task_spec(directory)
    if spec is None:
        raise TaskSpecError(
            f"{directory.path} has no {TASK_FILE}: it is a pretrained (encoder-only) model directory, "
            "not a fine-tuned one"
        )
    config = directory.read_config()
    spec = _features_as_saved(spec, config, prefix)
    model, encoder = build_task_model(config, spec)
    # From the object graph: a head variable may be keyed under optimizer/ in a training checkpoint.
    if "model" not in checkpoint_root_children(prefix):
        raise ModelDirError(
            f"checkpoint {prefix} has no task model (root attribute `model`): "
            f"{TASK_FILE} says {spec.kind}, but only a pretrained encoder was saved"
        )
    directory.restore(prefix, encoder=encoder, model=model)
    return model, encoder, config, spec
