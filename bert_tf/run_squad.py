"""python -m bert_tf.run_squad: extractive question answering on SQuAD v1.1 and v2.0.

    python -m bert_tf.run_squad --train_file=train-v2.0.json --predict_file=dev-v2.0.json \\
      --version_2_with_negative --init_checkpoint=build/pretrain --do_train --do_predict \\
      --max_seq_length=384 --doc_stride=128 --train_batch_size=24 --output_dir=build/squad

Data: SQuAD JSON files, or --tfds=squad/v1.1 / squad/v2.0 (train and validation splits). A
training answer not found at its offset is counted, skipped and summarized. Writes into
--output_dir: predictions.json, nbest_predictions.json and, for v2, null_odds.json (the original
files); when the predict file has answers, eval_results.txt with the official scripts' metrics
under their names (v1.1: exact_match, f1; v2.0: exact, f1, total, HasAns_exact/f1/total and
NoAns_exact/f1/total, best_exact, best_exact_thresh, best_f1, best_f1_thresh), also printed; the
TensorBoard logs and the fine-tuned model directory with task.json (doc_stride and
max_query_length included, for export).
"""

from bert_tf.runtime import job_process  # noqa: F401  (first: it sets the process up before TensorFlow loads)

# isort: split

import dataclasses

from bert_tf.checkpoints import saves
from bert_tf.runtime import cli, io_utils
from bert_tf.runtime.cli import arg
from bert_tf.tasks.squad import job as squad_job
from bert_tf.training import finetuning
from bert_tf.training.training_flags import FinetuneArgs


@dataclasses.dataclass
class SquadArgs(FinetuneArgs):
    """A run_squad run: the common fine-tuning arguments plus the SQuAD files and windowing."""

    train_file: str = arg("", "SQuAD json for training. E.g., train-v1.1.json")
    predict_file: str = arg("", "SQuAD json for predictions. E.g., dev-v1.1.json or test-v1.1.json")
    tfds: str = arg("", "Read the data from TensorFlow Datasets instead: squad/v1.1 or squad/v2.0.")
    tfds_data_dir: str = arg("", "The TensorFlow Datasets data directory (default: tfds's own).")
    max_seq_length: int = cli.inherit(FinetuneArgs, "max_seq_length", 384)
    train_batch_size: int = cli.inherit(FinetuneArgs, "train_batch_size", 12)
    doc_stride: int = arg(
        128,
        "When splitting up a long document into chunks, how much stride to take between chunks.",
    )
    max_query_length: int = arg(
        64,
        "The maximum number of tokens for the question. Questions longer than this "
        "will be truncated to this length.",
    )
    n_best_size: int = arg(
        20,
        "The total number of n-best predictions to generate in the nbest_predictions.json "
        "output file.",
    )
    max_answer_length: int = arg(
        30,
        "The maximum length of an answer that can be generated. This is needed "
        "because the start and end predictions are not conditioned on one another.",
    )
    version_2_with_negative: bool = arg(
        False, "If true, the SQuAD examples contain some that do not have an answer."
    )
    null_score_diff_threshold: float = arg(
        0.0, "If null_score - best_non_null is greater than the threshold predict null."
    )

    def validate(self):
        """The common checks, and SQuAD's: its data, and positive windowing and answer settings."""
        super().validate()
        if self.head_dropout is not None:
            raise io_utils.UsageError(
                "--head_dropout: run_squad's output layer reads sequence_output with no dropout "
                "before it, as the original's"
            )
        if self.tfds:
            if self.tfds not in ("squad/v1.1", "squad/v2.0"):
                raise io_utils.UsageError(f"--tfds={self.tfds}: expected squad/v1.1 or squad/v2.0")
            if self.tfds.endswith("v2.0") != bool(self.version_2_with_negative):
                raise io_utils.UsageError(
                    f"--tfds={self.tfds} needs --version_2_with_negative="
                    f"{str(self.tfds.endswith('v2.0')).lower()}"
                )
            return
        if self.do_train and not self.train_file:
            raise io_utils.UsageError("--do_train needs --train_file (or --tfds)")
        if (self.do_predict or self.do_eval) and not self.predict_file:
            raise io_utils.UsageError("--do_predict/--do_eval need --predict_file (or --tfds)")
        for name in ("train_file",) * bool(self.do_train) + ("predict_file",) * bool(
            self.do_predict or self.do_eval
        ):
            io_utils.require_file(getattr(self, name), f"--{name}")
        for name in ("doc_stride", "max_query_length", "n_best_size", "max_answer_length"):
            if getattr(self, name) <= 0:
                raise io_utils.UsageError(f"--{name} must be positive, got {getattr(self, name)}")


def run(args):
    """Trains and predicts (and evaluates, when the predict data has answers); returns a finetuning.RunResult."""
    args.validate()
    strategy = args.make_strategy()
    source = args.model_source()
    job = squad_job.SquadJob(
        head_fields=args.head_fields(),
        train_file=args.train_file,
        predict_file=args.predict_file,
        tfds=args.tfds,
        tfds_data_dir=args.tfds_data_dir,
        version_2_with_negative=args.version_2_with_negative,
        max_seq_length=args.max_seq_length,
        doc_stride=args.doc_stride,
        max_query_length=args.max_query_length,
        n_best_size=args.n_best_size,
        max_answer_length=args.max_answer_length,
        null_score_diff_threshold=args.null_score_diff_threshold,
    )
    return finetuning.run(args.finetune_config(), strategy, source, job)


# ----------------------------------------------------------------------------------------------
# The CLI
# ----------------------------------------------------------------------------------------------

if __name__ == "__main__":
    cli.define_flags(SquadArgs)
    cli.run(cli.job_main(SquadArgs, run, "run_squad", clean_output_dir=saves.clean_output_dir))
