"""Classification's side of a fine-tuning run: GLUE or TSV/CSV splits in, metrics and submissions out.

run_classifier maps its flags onto a ClassificationJob, which bert_tf.training.finetuning.run
drives: `prepare` reads every split the run needs, settles the labels and returns the model's
TaskSpec with the training features; `evaluate_and_predict` scores the eval splits (MNLI's matched
and mismatched apart) and writes the submission files and <split>_results.tsv.
"""

import os

import numpy as np
import tensorflow as tf

from bert_tf.runtime import io_utils
from bert_tf.tasks import data_files, heads, models, packing
from bert_tf.tasks.classification import data as classification


def read_splits(task, splits, data_dir="", tfds="", tfds_data_dir="", skip_bad_rows=False):
    """{split: SplitData} read from `data_dir` or, with `tfds`, TensorFlow Datasets; a missing split
    file is a UsageError naming it."""
    result = {}
    for split in splits:
        if tfds:
            result[split] = classification.read_tfds_split(
                task, split, data_dir=tfds_data_dir or None
            )
        else:
            result[split] = classification.read_split(
                task, data_dir, split, skip_bad_rows=skip_bad_rows
            )
        data = result[split]
        skipped = f", {data.skipped_rows} bad rows skipped" if data.skipped_rows else ""
        print(f"{split}: {len(data.examples)} examples from {data.path}{skipped}", flush=True)
        data_files.require_examples(data.examples, data.path, split)
    return result


def resolve_labels(task, train, source, output_dir):
    """The label list: the task's own, the training data's, or (without training) the fine-tuned model's."""
    if task.is_regression:
        return None
    if task.labels is not None:
        return list(task.labels)
    if train is not None:
        return classification.label_list(task, train.examples)
    return models.finetuned_labels(
        "classifier",
        source,
        output_dir,
        unknown="the labels are unknown without --do_train: give --labels, or an --init_checkpoint "
        "or --output_dir fine-tuned for this task",
    )


def predictions_of(outputs, labels):
    """Label ids (argmax of the logits) or regression scores."""
    return outputs["score"] if labels is None else np.argmax(outputs["logits"], axis=-1)


def write_probabilities(path, logits):
    """<split>_results.tsv in test_results.tsv's layout: tab-separated class probabilities (6 decimals, not str())."""
    probabilities = tf.nn.softmax(tf.constant(logits, tf.float32), axis=-1).numpy()
    io_utils.atomic_write_text(
        path, "".join("\t".join(f"{p:.6f}" for p in row) + "\n" for row in probabilities)
    )


class ClassificationJob:
    """A classification task (a classification.Task) fine-tuned on its splits from `data_dir` or
    `tfds` (see read_splits); `head_fields` are the TaskSpec's head, lstm_units (and features)."""

    eval_title = "Eval results"
    # The score the paper's Table 1 gives per task, in this order of preference: MCC (CoLA), F1
    # (MRPC, QQP), Spearman (STS-B), else accuracy.
    SELECTION_METRICS = ("mcc", "f1", "spearman", "accuracy")

    def __init__(
        self,
        task,
        max_seq_length,
        head_fields,
        data_dir="",
        tfds="",
        tfds_data_dir="",
        skip_bad_rows=False,
    ):
        self.task = task
        self.max_seq_length = max_seq_length
        self.head_fields = dict(head_fields)
        self.data_source = dict(
            data_dir=data_dir, tfds=tfds, tfds_data_dir=tfds_data_dir, skip_bad_rows=skip_bad_rows
        )

    def prepare(self, config, source):
        """Reads the splits `config` needs and settles the labels; returns (TaskSpec, TrainData or None)."""
        task = self.task
        self.config = config
        self.tokenizer = source.tokenizer()
        self.eval_splits = list(task.eval_splits) if config.do_eval else []
        self.test_splits = list(task.test_splits) if config.do_predict else []
        # Every split is read (and every dev label checked) before training, so a missing file or
        # a bad row fails in seconds rather than after hours of training.
        wanted = data_files.run_splits(
            config.do_train, config.do_eval, config.do_predict, task.eval_splits, task.test_splits
        )
        self.splits = read_splits(task, wanted, **self.data_source)
        train = self.splits.get("train")
        self.labels = resolve_labels(task, train, source, config.output_dir)
        for split in self.eval_splits:
            classification.check_labels(self.splits[split], self.labels)
        spec = models.TaskSpec(
            kind="regressor" if self.labels is None else "classifier",
            labels=self.labels or [],
            max_seq_length=self.max_seq_length,
            is_pair=task.is_pair,
            task_name=task.name,
            **self.head_fields,
        )
        if not config.do_train:
            return spec, None
        return spec, packing.TrainData(self.features_of("train"), len(train.examples))

    def selection_key(self):
        """The eval result that ranks restarts (--num_restarts): the task's score on its first
        dev set; a usage error without --do_eval."""
        metric = next(m for m in self.SELECTION_METRICS if m in self.task.metric_names)
        split = self.eval_splits[0] if self.eval_splits else "dev"
        return data_files.dev_score(
            f"{classification.eval_prefix(split)}_{metric}", bool(self.eval_splits)
        )

    def features_of(self, split):
        return classification.convert_examples(
            self.splits[split].examples, self.tokenizer, self.max_seq_length, self.labels
        )

    def evaluate_and_predict(self, tuner, final=True):
        """The eval splits' metrics (prefixed eval_, or eval_matched_ ...); with `final`, the test
        splits' submissions and class probabilities, written by the chief."""
        eval_results, submission_files = {}, []
        for split in self.eval_splits:
            features = self.features_of(split)
            outputs = tuner.predict(features, self.config.eval_batch_size, has_labels=True)
            metrics = classification.compute_metrics(
                self.task, features["label_ids"], predictions_of(outputs, self.labels)
            )
            metrics["loss"] = heads.mean_loss(outputs)
            prefix = classification.eval_prefix(split)
            eval_results.update({f"{prefix}_{name}": value for name, value in metrics.items()})
            eval_results[f"{prefix}_examples"] = len(self.splits[split].examples)
        for split in self.test_splits if final else ():
            outputs = tuner.predict(self.features_of(split), self.config.predict_batch_size)
            if tuner.is_chief:
                submission_files.append(self.write_submission(split, outputs))
        if self.config.do_predict:
            print("predictions written to " + ", ".join(submission_files), flush=True)
        return eval_results, submission_files

    def write_submission(self, split, outputs):
        """The split's submission file and, for a classifier, <split>_results.tsv; returns the first's path."""
        output_dir = self.config.output_dir
        path = classification.write_submission(
            output_dir,
            self.task,
            split,
            self.splits[split].examples,
            predictions_of(outputs, self.labels),
            self.labels,
        )
        if self.labels is not None:
            write_probabilities(os.path.join(output_dir, f"{split}_results.tsv"), outputs["logits"])
        return path
