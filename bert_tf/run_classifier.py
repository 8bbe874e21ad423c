"""python -m bert_tf.run_classifier: GLUE and your own TSV/CSV, sentence (pair) classification and regression.

    python -m bert_tf.run_classifier --task_name=mrpc --data_dir=glue/MRPC --init_checkpoint=build/pretrain \\
      --do_train --do_eval --do_predict --max_seq_length=128 --train_batch_size=32 \\
      --learning_rate=2e-5 --num_train_epochs=3 --output_dir=build/mrpc

Writes into --output_dir: eval_results.txt (`key = value`; MNLI reports matched and mismatched
separately, as eval_matched_* and eval_mismatched_*), the GLUE submission files (MRPC.tsv, ...,
or <split>_predictions.tsv for --task_name=tsv) and <split>_results.tsv with the class
probabilities, train/ and eval/ TensorBoard logs, and the fine-tuned model directory
(bert_config.json, vocab.txt, task.json, ckpt-N) that `python -m bert_tf.export` exports.
Rerunning the same command resumes training from the newest checkpoint.
"""

from bert_tf.runtime import job_process  # noqa: F401  (first: it sets the process up before TensorFlow loads)

# isort: split

import dataclasses
import os

import numpy as np
import tensorflow as tf

from bert_tf.checkpoints import saves
from bert_tf.runtime import cli, io_utils
from bert_tf.runtime.cli import arg
from bert_tf.tasks import data_files, models
from bert_tf.tasks.classification import data as classification
from bert_tf.training import finetuning
from bert_tf.training.training_flags import FinetuneArgs


@dataclasses.dataclass
class ClassifierArgs(FinetuneArgs):
    """A run_classifier run: the common fine-tuning arguments plus the task and its data."""

    task_name: str = arg("", f"The task: {', '.join(classification.TASK_NAMES)}.")
    data_dir: str = arg(
        "",
        "The input data dir: train.tsv, dev.tsv and test.tsv in the GLUE layout of the task "
        "(MNLI: dev_matched.tsv, dev_mismatched.tsv, test_matched.tsv, test_mismatched.tsv); "
        "for tsv, train/dev/test .tsv or .csv.",
    )
    tfds: str = arg("", "Read the data from TensorFlow Datasets instead: glue/<task>.")
    tfds_data_dir: str = arg("", "The TensorFlow Datasets data directory (default: tfds's own).")
    text_a_column: str = arg("", "tsv: the first text's column, a header name or a 0-based index.")
    text_b_column: str = arg("", "tsv: the second text's column for pair tasks (default: none).")
    label_column: str = arg("", "tsv: the label's column, a header name or a 0-based index.")
    labels: str = arg(
        "",
        "tsv: the comma-separated label list, in id order (default: the sorted labels of the "
        "training data).",
    )
    has_header: bool = arg(
        None,
        "tsv: whether the files start with a header row (default: when any column is "
        "given by name).",
    )
    skip_bad_rows: bool = arg(
        False, "Skip and count malformed rows instead of stopping at the first."
    )


def resolve_task(args):
    """The classification Task from --task_name (and the tsv column flags) or --tfds."""
    if args.tfds:
        task = classification.task_from_tfds_name(args.tfds)
        if args.task_name and args.task_name.lower().replace("-", "") != task.name:
            raise io_utils.UsageError(
                f"--task_name={args.task_name} contradicts --tfds={args.tfds}"
            )
        return task
    if not args.task_name:
        raise io_utils.UsageError(
            "--task_name is required (a GLUE task, or tsv for your own files)"
        )
    if not args.data_dir:
        raise io_utils.UsageError(
            "--data_dir (the GLUE file layout) or --tfds=glue/<task> is required"
        )
    return classification.get_task(
        args.task_name,
        text_a_column=args.text_a_column or None,
        text_b_column=args.text_b_column or None,
        label_column=args.label_column or None,
        labels=args.labels or None,
        has_header=args.has_header,
    )


def read_splits(args, task, splits):
    """{split: SplitData} read from --data_dir or --tfds; a missing split file is a UsageError naming it."""
    result = {}
    for split in splits:
        if args.tfds:
            result[split] = classification.read_tfds_split(
                task, split, data_dir=args.tfds_data_dir or None
            )
        else:
            result[split] = classification.read_split(
                task, args.data_dir, split, skip_bad_rows=args.skip_bad_rows
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
    labels = finetuning.finetuned_labels("classifier", source, output_dir)
    if labels is not None:
        return labels
    raise io_utils.UsageError(
        "the labels are unknown without --do_train: give --labels, or an --init_checkpoint "
        "or --output_dir fine-tuned for this task"
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


def run(args):
    """Trains, evaluates and predicts as `args` say; returns a finetuning.RunResult."""
    args.validate()
    task = resolve_task(args)
    strategy = args.make_strategy()
    source = args.model_source()
    tokenizer = source.tokenizer()

    # Every split is read (and every dev label checked) before training, so a missing file or a bad
    # row fails in seconds rather than after hours of training.
    splits = read_splits(
        args,
        task,
        (["train"] if args.do_train else [])
        + (list(task.eval_splits) if args.do_eval else [])
        + (list(task.test_splits) if args.do_predict else []),
    )
    train = splits.get("train")
    labels = resolve_labels(task, train, source, args.output_dir)
    for split in task.eval_splits if args.do_eval else ():
        classification.check_labels(splits[split], labels)
    spec = models.TaskSpec(
        kind="regressor" if labels is None else "classifier",
        labels=labels or [],
        max_seq_length=args.max_seq_length,
        is_pair=task.is_pair,
        task_name=task.name,
        **args.head_fields(),
    )

    def features_of(split):
        return classification.convert_examples(
            splits[split].examples, tokenizer, args.max_seq_length, labels
        )

    def evaluate_and_predict(tuner, final=True):
        eval_results, submission_files = {}, []
        for split in task.eval_splits if args.do_eval else ():
            features = features_of(split)
            outputs = tuner.predict(features, args.eval_batch_size, has_labels=True)
            metrics = classification.compute_metrics(
                task, features["label_ids"], predictions_of(outputs, labels)
            )
            metrics["loss"] = finetuning.mean_loss(outputs)
            prefix = classification.eval_prefix(split)
            eval_results.update({f"{prefix}_{name}": value for name, value in metrics.items()})
            eval_results[f"{prefix}_examples"] = len(splits[split].examples)
        for split in task.test_splits if args.do_predict and final else ():
            outputs = tuner.predict(features_of(split), args.predict_batch_size)
            if tuner.is_chief:
                submission_files.append(
                    classification.write_submission(
                        args.output_dir,
                        task,
                        split,
                        splits[split].examples,
                        predictions_of(outputs, labels),
                        labels,
                    )
                )
                if labels is not None:
                    write_probabilities(
                        os.path.join(args.output_dir, f"{split}_results.tsv"), outputs["logits"]
                    )
        if args.do_predict:
            print("predictions written to " + ", ".join(submission_files), flush=True)
        return eval_results, submission_files

    train_data = None
    if args.do_train:
        train_data = finetuning.TrainData(features_of("train"), len(train.examples))
    return finetuning.run(
        args.finetune_config(), strategy, source, spec, train_data, evaluate_and_predict
    )


# ----------------------------------------------------------------------------------------------
# The CLI
# ----------------------------------------------------------------------------------------------

if __name__ == "__main__":
    cli.define_flags(ClassifierArgs)
    cli.run(
        cli.job_main(ClassifierArgs, run, "run_classifier", clean_output_dir=saves.clean_output_dir)
    )
