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

from bert_tf.checkpoints import saves
from bert_tf.runtime import cli, io_utils
from bert_tf.runtime.cli import arg
from bert_tf.tasks.classification import data as classification
from bert_tf.tasks.classification import job as classification_job
from bert_tf.training import finetuning
from bert_tf.training.training_flags import FeatureBasedArgs


@dataclasses.dataclass
class ClassifierArgs(FeatureBasedArgs):
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


def run(args):
    """Trains, evaluates and predicts as `args` say; returns a finetuning.RunResult."""
    args.validate()
    task = resolve_task(args)
    strategy = args.make_strategy()
    source = args.model_source()
    job = classification_job.ClassificationJob(
        task,
        args.max_seq_length,
        args.head_fields(),
        data_dir=args.data_dir,
        tfds=args.tfds,
        tfds_data_dir=args.tfds_data_dir,
        skip_bad_rows=args.skip_bad_rows,
    )
    return finetuning.run(args.finetune_config(), strategy, source, job)


# ----------------------------------------------------------------------------------------------
# The CLI
# ----------------------------------------------------------------------------------------------

if __name__ == "__main__":
    cli.define_flags(ClassifierArgs)
    cli.run(
        cli.job_main(ClassifierArgs, run, "run_classifier", clean_output_dir=saves.clean_output_dir)
    )
