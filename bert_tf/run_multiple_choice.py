"""python -m bert_tf.run_multiple_choice: SWAG, the BERT paper's multiple choice task.

    python -m bert_tf.run_multiple_choice --task_name=swag --data_dir=swag --init_checkpoint=build/pretrain \\
      --do_train --do_eval --do_predict --max_seq_length=128 --train_batch_size=16 \\
      --learning_rate=2e-5 --num_train_epochs=3 --output_dir=build/swag

--data_dir holds SWAG's train.csv, val.csv and test.csv (or --tfds=hellaswag reads TFDS's
SWAG-style dataset). Writes into --output_dir: eval_results.txt (eval_accuracy, eval_loss,
eval_examples, global_step), test_results.tsv (each choice's probability) and
test_predictions.csv (`example_id,choice`), train/ and eval/ TensorBoard logs, and the fine-tuned
model directory that `python -m bert_tf.export` exports (context and endings in). Rerunning the
same command resumes training from the newest checkpoint.
"""

from bert_tf.runtime import job_process  # noqa: F401  (first: it sets the process up before TensorFlow loads)

# isort: split

import dataclasses

from bert_tf.checkpoints import saves
from bert_tf.runtime import cli, io_utils
from bert_tf.runtime.cli import arg
from bert_tf.tasks import data_files
from bert_tf.tasks.multiple_choice import job as multiple_choice_job
from bert_tf.training import finetuning
from bert_tf.training.training_flags import FinetuneArgs

TASK_NAMES = ("swag",)


@dataclasses.dataclass
class MultipleChoiceArgs(FinetuneArgs):
    """A run_multiple_choice run: the common fine-tuning arguments plus the task and its data."""

    task_name: str = arg("swag", f"The task: {', '.join(TASK_NAMES)}.")
    data_dir: str = arg("", "SWAG's directory: train.csv, val.csv and test.csv.")
    tfds: str = arg(
        "",
        "Read the data from TensorFlow Datasets instead: a dataset with context, endings and label "
        "features (hellaswag; TFDS has no swag builder).",
    )
    tfds_data_dir: str = arg("", "The TensorFlow Datasets data directory (default: tfds's own).")

    def validate(self):
        """The common checks, and the task and where its data comes from."""
        super().validate()
        if self.task_name.lower() not in TASK_NAMES:
            raise io_utils.UsageError(
                f"--task_name={self.task_name}: the multiple choice tasks are {', '.join(TASK_NAMES)}"
            )
        if not self.tfds and not self.data_dir:
            raise io_utils.UsageError(
                "--data_dir (SWAG's train.csv, val.csv, test.csv) or --tfds is required"
            )


def run(args):
    """Trains, evaluates and predicts as `args` say; returns a finetuning.RunResult."""
    args.validate()
    splits = multiple_choice_job.read_splits(
        data_files.run_splits(args.do_train, args.do_eval, args.do_predict),
        data_dir=args.data_dir,
        tfds=args.tfds,
        tfds_data_dir=args.tfds_data_dir,
    )
    strategy = args.make_strategy()
    source = args.model_source()
    job = multiple_choice_job.MultipleChoiceJob(
        args.task_name.lower(), splits, args.max_seq_length, args.head_fields()
    )
    return finetuning.run(args.finetune_config(), strategy, source, job)


if __name__ == "__main__":
    cli.define_flags(MultipleChoiceArgs)
    cli.run(
        cli.job_main(
            MultipleChoiceArgs,
            run,
            "run_multiple_choice",
            clean_output_dir=saves.clean_output_dir,
        )
    )
