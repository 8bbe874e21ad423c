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
from bert_tf.tasks import models
from bert_tf.tasks.squad import data as squad
from bert_tf.tasks.squad import metrics as squad_metrics
from bert_tf.tasks.squad import postprocess as squad_postprocess
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


def validate(args):
    """The SQuAD-specific usage errors."""
    if args.tfds:
        if args.tfds not in ("squad/v1.1", "squad/v2.0"):
            raise io_utils.UsageError(f"--tfds={args.tfds}: expected squad/v1.1 or squad/v2.0")
        if args.tfds.endswith("v2.0") != bool(args.version_2_with_negative):
            raise io_utils.UsageError(
                f"--tfds={args.tfds} needs --version_2_with_negative="
                f"{str(args.tfds.endswith('v2.0')).lower()}"
            )
        return
    if args.do_train and not args.train_file:
        raise io_utils.UsageError("--do_train needs --train_file (or --tfds)")
    if (args.do_predict or args.do_eval) and not args.predict_file:
        raise io_utils.UsageError("--do_predict/--do_eval need --predict_file (or --tfds)")
    for name in ("train_file",) * bool(args.do_train) + ("predict_file",) * bool(
        args.do_predict or args.do_eval
    ):
        io_utils.require_file(getattr(args, name), f"--{name}")
    for name in ("doc_stride", "max_query_length", "n_best_size", "max_answer_length"):
        if getattr(args, name) <= 0:
            raise io_utils.UsageError(f"--{name} must be positive, got {getattr(args, name)}")


def read_examples(args, is_training):
    """(examples, ReadStats, gold answers by question id) of the training or predict data."""
    if args.tfds:
        return squad.read_tfds(
            args.tfds,
            "train" if is_training else "dev",
            is_training,
            data_dir=args.tfds_data_dir or None,
        )
    path = args.train_file if is_training else args.predict_file
    examples, stats = squad.read_squad_json(path, is_training, args.version_2_with_negative)
    gold = None if is_training else squad_metrics.gold_answers_from_json(path)
    return examples, stats, gold


def run(args):
    """Trains and predicts (and evaluates, when the predict data has answers); returns a finetuning.RunResult."""
    args.validate()
    validate(args)
    strategy = args.make_strategy()
    source = args.model_source()
    tokenizer = source.tokenizer()
    spec = models.TaskSpec(
        kind="squad",
        max_seq_length=args.max_seq_length,
        version_2_with_negative=bool(args.version_2_with_negative),
        task_name="squad",
        doc_stride=args.doc_stride,
        max_query_length=args.max_query_length,
        **args.head_fields(),
    )
    windowing = dict(
        max_seq_length=args.max_seq_length,
        doc_stride=args.doc_stride,
        max_query_length=args.max_query_length,
    )

    predicting = args.do_predict or args.do_eval
    if predicting:  # read first: a broken predict file fails before training
        eval_examples, _, gold = read_examples(args, is_training=False)
        print(f"predict: {len(eval_examples)} questions", flush=True)

    train_data = None
    if args.do_train:
        examples, stats, _ = read_examples(args, is_training=True)
        print(f"train: {stats.summary()}", flush=True)
        if not examples:
            raise io_utils.UsageError("no usable training question (see the summary above)")
        features = squad.convert_examples(examples, tokenizer, is_training=True, **windowing)
        print(f"train: {len(features)} windows of {len(examples)} questions", flush=True)
        # The original counts steps in questions, not windows.
        train_data = finetuning.TrainData(
            squad.feature_arrays(features, is_training=True), len(examples)
        )

    def evaluate_and_predict(tuner, final=True):
        if not predicting:
            return {}, []
        features = squad.convert_examples(eval_examples, tokenizer, is_training=False, **windowing)
        outputs = tuner.predict(
            squad.feature_arrays(features, is_training=False), args.predict_batch_size
        )
        results = [
            squad.RawResult(f.unique_id, start, end)
            for f, start, end in zip(features, outputs["start_logits"], outputs["end_logits"])
        ]
        predictions, nbest, null_odds = squad_postprocess.postprocess(
            eval_examples,
            features,
            results,
            n_best_size=args.n_best_size,
            max_answer_length=args.max_answer_length,
            do_lower_case=source.config.do_lower_case,
            version_2_with_negative=args.version_2_with_negative,
            null_score_diff_threshold=args.null_score_diff_threshold,
        )
        v2_odds = null_odds if args.version_2_with_negative else None
        prediction_files = []
        if tuner.is_chief and final:
            prediction_files = list(
                squad_postprocess.write_predictions(
                    args.output_dir, predictions, nbest, v2_odds
                ).values()
            )
            print("predictions written to " + ", ".join(prediction_files), flush=True)
        if not (gold and any(gold.values())):
            return {}, prediction_files
        # The official scripts' key names: v1.1 exact_match and f1; v2.0 exact, f1, total, HasAns_*...
        if args.version_2_with_negative:
            return squad_metrics.evaluate_v2(gold, predictions, v2_odds), prediction_files
        return squad_metrics.evaluate_v1(gold, predictions), prediction_files

    return finetuning.run(
        args.finetune_config(),
        strategy,
        source,
        spec,
        train_data,
        evaluate_and_predict,
        eval_title="Eval results (official SQuAD metrics)",
    )


# ----------------------------------------------------------------------------------------------
# The CLI
# ----------------------------------------------------------------------------------------------

if __name__ == "__main__":
    cli.define_flags(SquadArgs)
    cli.run(cli.job_main(SquadArgs, run, "run_squad", clean_output_dir=saves.clean_output_dir))
