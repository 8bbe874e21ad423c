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

import tensorflow as tf

from bert_tf.checkpoints import saves
from bert_tf.runtime import cli, io_utils
from bert_tf.runtime.cli import arg
from bert_tf.tasks import data_files, models
from bert_tf.tasks.multiple_choice import data as multiple_choice
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


def read_splits(args, splits):
    """{split: examples} from --data_dir or --tfds; a missing or empty train/dev split is a UsageError."""
    if args.task_name.lower() not in TASK_NAMES:
        raise io_utils.UsageError(
            f"--task_name={args.task_name}: the multiple choice tasks are {', '.join(TASK_NAMES)}"
        )
    if not args.tfds and not args.data_dir:
        raise io_utils.UsageError(
            "--data_dir (SWAG's train.csv, val.csv, test.csv) or --tfds is required"
        )
    result = {}
    for split in splits:
        if args.tfds:
            examples, source = multiple_choice.read_tfds_split(
                args.tfds, split, args.tfds_data_dir or None
            )
        else:
            examples, source = multiple_choice.read_split(args.data_dir, split)
        print(f"{split}: {len(examples)} examples from {source}", flush=True)
        result[split] = data_files.require_examples(examples, source, split)
        if split != "test" and any(example.label is None for example in examples):
            raise data_files.DataFormatError(
                f"{source}: the {split} split needs a label in every row"
            )
    return result


def run(args):
    """Trains, evaluates and predicts as `args` say; returns a finetuning.RunResult."""
    args.validate()
    splits = read_splits(
        args,
        [
            split
            for split, wanted in (
                ("train", args.do_train),
                ("dev", args.do_eval),
                ("test", args.do_predict),
            )
            if wanted
        ],
    )
    strategy = args.make_strategy()
    source = args.model_source()
    tokenizer = source.tokenizer()
    spec = models.TaskSpec(
        kind="multiple_choice",
        max_seq_length=args.max_seq_length,
        is_pair=True,
        task_name=args.task_name.lower(),
        **args.head_fields(),
    )

    def features_of(split):
        return multiple_choice.convert_examples(splits[split], tokenizer, args.max_seq_length)

    def evaluate_and_predict(tuner, final=True):
        eval_results, prediction_files = {}, []
        if args.do_eval:
            outputs = tuner.predict(features_of("dev"), args.eval_batch_size, has_labels=True)
            eval_results = {
                "eval_accuracy": multiple_choice.accuracy(
                    splits["dev"], outputs["logits"].argmax(-1)
                ),
                "eval_loss": finetuning.mean_loss(outputs),
                "eval_examples": len(splits["dev"]),
            }
        if args.do_predict and final:
            outputs = tuner.predict(features_of("test"), args.predict_batch_size)
            if tuner.is_chief:
                probabilities = tf.nn.softmax(outputs["logits"], axis=-1).numpy()
                prediction_files = multiple_choice.write_predictions(
                    args.output_dir, "test", splits["test"], probabilities
                )
            print("predictions written to " + ", ".join(prediction_files), flush=True)
        return eval_results, prediction_files

    train_data = None
    if args.do_train:
        train_data = finetuning.TrainData(features_of("train"), len(splits["train"]))
    return finetuning.run(
        args.finetune_config(), strategy, source, spec, train_data, evaluate_and_predict
    )


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
