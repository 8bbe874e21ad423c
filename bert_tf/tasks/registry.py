"""The fine-tuning tasks: one entry per task kind, read by model building, fine-tuning and export.

A task lives in its own folder, `bert_tf/tasks/<task>/`: `data.py` (files -> examples -> features,
and its record schema), `model.py` (the head on the encoder, and its loss), evaluation code, and
`serving.py` (the exported graph, strings in, with its signatures' documentation). Adding one
means that folder, a `run_<task>.py` CLI, and one entry below.

An entry's training part (model, loss, record schema) is imported here; its serving part is only
named, so fine-tuning never loads the serving stack (export_graph, the SavedModel signatures).
"""

import dataclasses
import functools
import importlib
from typing import Callable

from bert_tf.tasks.classification import data as classification_data
from bert_tf.tasks.classification import model as classification_model
from bert_tf.tasks.multiple_choice import data as multiple_choice_data
from bert_tf.tasks.multiple_choice import model as multiple_choice_model
from bert_tf.tasks.ner import data as ner_data
from bert_tf.tasks.ner import model as ner_model
from bert_tf.tasks.squad import data as squad_data
from bert_tf.tasks.squad import model as squad_model


@dataclasses.dataclass(frozen=True)
class TaskKind:
    """What the shared code asks of one kind of task (task.json's `kind`)."""

    name: str
    # (config, TaskSpec, encoder) -> keras.Model whose outputs are a dict of named tensors.
    build_model: Callable
    # The loss and per-example prediction outputs: a tasks.heads.HeadObjective subclass, given the model.
    objective: type
    # input shape ([s], or [choices, s]) -> the tf.io.parse_example spec of its training records.
    feature_spec: Callable
    # "module:Class" of its serving module, (model, TextPacker, TaskSpec, Assets) -> tf.Module.
    # Named, not imported: training never loads the serving stack; bert_tf.export imports it.
    serving: str
    # Whether task.json lists the labels (at least 2) the head predicts; else it lists none.
    labelled: bool
    # Further rules for a TaskSpec of this kind: returns an error message, or None.
    check_spec: Callable = None


def _check_squad_spec(spec):
    """A SQuAD spec must leave room for the context after the question."""
    if spec.max_seq_length < spec.max_query_length + 4:
        return (
            f"max_seq_length ({spec.max_seq_length}) leaves no room for the context after "
            f"max_query_length ({spec.max_query_length}) + [CLS] and two [SEP]"
        )
    return None


KINDS = {
    kind.name: kind
    for kind in (
        TaskKind(
            "classifier",
            classification_model.build_model,
            classification_model.ClassificationObjective,
            classification_data.feature_spec,
            "bert_tf.tasks.classification.serving:ClassifierModule",
            labelled=True,
        ),
        TaskKind(
            "regressor",
            classification_model.build_model,
            classification_model.RegressionObjective,
            functools.partial(classification_data.feature_spec, is_regression=True),
            "bert_tf.tasks.classification.serving:ClassifierModule",
            labelled=False,
        ),
        TaskKind(
            "squad",
            squad_model.build_model,
            squad_model.SpanObjective,
            functools.partial(squad_data.feature_spec, has_labels=True),
            "bert_tf.tasks.squad.serving:SquadModule",
            labelled=False,
            check_spec=_check_squad_spec,
        ),
        TaskKind(
            "ner",
            ner_model.build_model,
            ner_model.TokenClassificationObjective,
            ner_data.feature_spec,
            "bert_tf.tasks.ner.serving:NerModule",
            labelled=True,
        ),
        TaskKind(
            "multiple_choice",
            multiple_choice_model.build_model,
            # Softmax cross-entropy of logits [b, choices] against label_ids [b].
            classification_model.ClassificationObjective,
            multiple_choice_data.feature_spec,
            "bert_tf.tasks.multiple_choice.serving:MultipleChoiceModule",
            labelled=False,
        ),
    )
}


def get(name):
    """The TaskKind called `name`; an unknown one is a KeyError naming the known kinds."""
    if name not in KINDS:
        raise KeyError(f"unknown task kind {name!r}; known: {', '.join(KINDS)}")
    return KINDS[name]


def serving_module(name):
    """The serving tf.Module class of task kind `name` (imports its serving module)."""
    module_name, class_name = get(name).serving.split(":")
    return getattr(importlib.import_module(module_name), class_name)
