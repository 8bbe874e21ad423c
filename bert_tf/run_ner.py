"""python -m bert_tf.run_ner: named-entity tagging on CoNLL-2003-format files.

    python -m bert_tf.run_ner --data_dir=conll2003 --init_checkpoint=build/pretrain \\
      --do_train --do_eval --do_predict --max_seq_length=128 --output_dir=build/ner

Data: --data_dir with train.txt, dev.txt and test.txt, or --train_file/--dev_file/--test_file;
one token per line, the tag (BIO or IOB1) in the last column, blank or -DOCSTART- lines between
sentences. Each word's first WordPiece carries its tag. Writes into --output_dir:
eval_results.txt (entity-level precision, recall and F1 with conlleval semantics),
eval_predictions.txt and test_predictions.txt (`token gold predicted`, conlleval's input), the
TensorBoard logs and the fine-tuned model directory with task.json.

--feature_based --features=sum_last_four (the paper's Table 7) trains a BiLSTM tagger on the frozen
encoder's activations instead (bert_tf.tasks.representations); the same files come out, and the
encoder's weights in OUTPUT_DIR are those of --init_checkpoint, bit for bit.
"""

from bert_tf.runtime import job_process  # noqa: F401  (first: it sets the process up before TensorFlow loads)

# isort: split

import dataclasses
import os

from bert_tf.checkpoints import saves
from bert_tf.runtime import cli, io_utils
from bert_tf.runtime.cli import arg
from bert_tf.tasks import data_files, models, representations
from bert_tf.tasks.ner import data as ner
from bert_tf.tasks.ner import metrics as ner_metrics
from bert_tf.training import finetuning
from bert_tf.training.training_flags import FinetuneArgs

SPLIT_FILES = {"train": "train.txt", "dev": "dev.txt", "test": "test.txt"}


@dataclasses.dataclass
class NerArgs(FinetuneArgs):
    """A run_ner run: the common fine-tuning arguments plus the CoNLL files."""

    data_dir: str = arg(
        "", "A directory with train.txt, dev.txt and test.txt in CoNLL-2003 format."
    )
    train_file: str = arg("", "The CoNLL training file (default: DATA_DIR/train.txt).")
    dev_file: str = arg("", "The CoNLL dev file (default: DATA_DIR/dev.txt).")
    test_file: str = arg("", "The CoNLL test file (default: DATA_DIR/test.txt).")
    feature_based: bool = arg(
        False,
        "The feature-based approach (the paper's Table 7): the encoder stays frozen (its weights "
        "are not trained, and it runs without dropout) and a randomly initialised two-layer "
        "BiLSTM (--lstm_units) with a classification layer is trained on the activations "
        "--features names. Implies --head=bilstm.",
    )
    features: str = arg(
        None,
        "With --feature_based, the activations the BiLSTM reads: embeddings (the embedding "
        "layer's output), second_to_last, last, sum_last_four (a learned softmax-weighted sum of "
        "the last four layers, scaled: ELMo's scalar mix), concat_last_four, sum_all (the scalar "
        "mix of the embedding output and every layer). Recorded in task.json.",
        choices=representations.FEATURES,
    )

    def validate(self):
        """The common checks, and --feature_based with its --features and --head."""
        super().validate()
        if self.features is not None and not self.feature_based:
            raise io_utils.UsageError("--features applies to --feature_based only")
        if self.feature_based and self.features is None:
            raise io_utils.UsageError(
                f"--feature_based needs --features (one of {', '.join(representations.FEATURES)})"
            )
        if self.features is not None and self.features not in representations.FEATURES:
            raise io_utils.UsageError(
                f"--features={self.features} is not one of {', '.join(representations.FEATURES)}"
            )
        if self.feature_based and self.head not in (None, "bilstm"):
            raise io_utils.UsageError(
                f"--feature_based trains a BiLSTM head on the frozen encoder: --head={self.head} "
                "contradicts it (leave --head out)"
            )

    LSTM_FLAGS = "--head=bilstm or --feature_based"

    def builds_lstm(self):
        return self.feature_based or super().builds_lstm()

    def head_fields(self):
        """The TaskSpec fields of --head, --lstm_units and --feature_based's --features."""
        if not self.feature_based:
            return super().head_fields()
        return dict(super().head_fields(), head="bilstm", features=self.features)


def split_file(args, split):
    """--<split>_file, or DATA_DIR/<split>.txt; a missing one is a UsageError naming it."""
    explicit = getattr(args, f"{split}_file")
    if explicit:
        return io_utils.require_file(explicit, f"--{split}_file")
    if not args.data_dir:
        raise io_utils.UsageError(f"give --{split}_file or --data_dir (with {SPLIT_FILES[split]})")
    return data_files.split_path(args.data_dir, SPLIT_FILES[split])


def resolve_labels(train, source, output_dir):
    """The tags of the training data, or (without training) those of the fine-tuned model."""
    if train is not None:
        return ner.label_list(train)
    labels = finetuning.finetuned_labels("ner", source, output_dir)
    if labels is not None:
        return labels
    raise io_utils.UsageError(
        "the tags are unknown without --do_train: give an --init_checkpoint or "
        "--output_dir fine-tuned for NER"
    )


def predict_tags(tuner, sentences, features, batch_size, labels, has_labels):
    """(per-sentence word tags, model outputs); words cut by max_seq_length are tagged O."""
    outputs = tuner.predict(features.arrays, batch_size, has_labels=has_labels)
    tags = ner.word_predictions(features, outputs["predicted_ids"], labels)
    return ner.pad_predictions(sentences, tags), outputs


def run(args):
    """Trains, evaluates and predicts as `args` say; returns a finetuning.RunResult."""
    args.validate()
    wanted = (
        (["train"] if args.do_train else [])
        + (["dev"] if args.do_eval else [])
        + (["test"] if args.do_predict else [])
    )
    paths = {split: split_file(args, split) for split in wanted}  # every missing file fails first
    strategy = args.make_strategy()
    source = args.model_source()
    tokenizer = source.tokenizer()
    sentences = {}
    for split, path in paths.items():
        sentences[split] = ner.read_conll(path)
        print(f"{split}: {len(sentences[split])} sentences from {path}", flush=True)
        data_files.require_examples(sentences[split], path, split)
    labels = resolve_labels(sentences.get("train"), source, args.output_dir)
    if args.do_eval:
        ner.check_labels(sentences["dev"], labels)
    spec = models.TaskSpec(
        kind="ner",
        labels=labels,
        max_seq_length=args.max_seq_length,
        task_name="ner",
        **args.head_fields(),
    )

    def evaluate_and_predict(tuner, final=True):
        eval_results, prediction_files = {}, []
        if args.do_eval:
            dev = sentences["dev"]
            features = ner.convert_sentences(dev, tokenizer, args.max_seq_length, labels)
            predicted, outputs = predict_tags(
                tuner, dev, features, args.eval_batch_size, labels, has_labels=True
            )
            scores = ner_metrics.entity_scores([s.tags for s in dev], predicted)
            eval_results = {
                f"eval_{name}": scores[name] for name in ("precision", "recall", "f1", "accuracy")
            }
            eval_results.update(
                eval_loss=finetuning.mean_loss(outputs),
                eval_gold_entities=scores["gold_entities"],
                eval_predicted_entities=scores["predicted_entities"],
                eval_correct_entities=scores["correct_entities"],
            )
            if tuner.is_chief and final:
                prediction_files.append(
                    ner.write_conll_predictions(
                        os.path.join(args.output_dir, "eval_predictions.txt"), dev, predicted
                    )
                )
            print("\n".join(ner_metrics.eval_result_lines(scores)), flush=True)
        if args.do_predict and final:
            test = sentences["test"]
            # Test tags may be anything (or placeholders): they are written back, never mapped to ids.
            features = ner.convert_sentences(test, tokenizer, args.max_seq_length, None)
            predicted, _ = predict_tags(
                tuner, test, features, args.predict_batch_size, labels, has_labels=False
            )
            if tuner.is_chief:
                prediction_files.append(
                    ner.write_conll_predictions(
                        os.path.join(args.output_dir, "test_predictions.txt"), test, predicted
                    )
                )
            print(
                f"predictions written to {prediction_files[-1] if prediction_files else '(chief only)'}",
                flush=True,
            )
        return eval_results, prediction_files

    train_data = None
    if args.do_train:
        features = ner.convert_sentences(sentences["train"], tokenizer, args.max_seq_length, labels)
        train_data = finetuning.TrainData(features.arrays, len(sentences["train"]))
    return finetuning.run(
        args.finetune_config(), strategy, source, spec, train_data, evaluate_and_predict
    )


# ----------------------------------------------------------------------------------------------
# The CLI
# ----------------------------------------------------------------------------------------------

if __name__ == "__main__":
    cli.define_flags(NerArgs)
    cli.run(cli.job_main(NerArgs, run, "run_ner", clean_output_dir=saves.clean_output_dir))
