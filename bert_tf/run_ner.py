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

from bert_tf.checkpoints import saves
from bert_tf.runtime import cli, io_utils
from bert_tf.runtime.cli import arg
from bert_tf.tasks import data_files
from bert_tf.tasks.ner import job as ner_job
from bert_tf.training import finetuning
from bert_tf.training.training_flags import FeatureBasedArgs

SPLIT_FILES = {"train": "train.txt", "dev": "dev.txt", "test": "test.txt"}


@dataclasses.dataclass
class NerArgs(FeatureBasedArgs):
    """A run_ner run: the common fine-tuning arguments plus the CoNLL files."""

    data_dir: str = arg(
        "", "A directory with train.txt, dev.txt and test.txt in CoNLL-2003 format."
    )
    train_file: str = arg("", "The CoNLL training file (default: DATA_DIR/train.txt).")
    dev_file: str = arg("", "The CoNLL dev file (default: DATA_DIR/dev.txt).")
    test_file: str = arg("", "The CoNLL test file (default: DATA_DIR/test.txt).")


def split_file(args, split):
    """--<split>_file, or DATA_DIR/<split>.txt; a missing one is a UsageError naming it."""
    explicit = getattr(args, f"{split}_file")
    if explicit:
        return io_utils.require_file(explicit, f"--{split}_file")
    if not args.data_dir:
        raise io_utils.UsageError(f"give --{split}_file or --data_dir (with {SPLIT_FILES[split]})")
    return data_files.split_path(args.data_dir, SPLIT_FILES[split])


def run(args):
    """Trains, evaluates and predicts as `args` say; returns a finetuning.RunResult."""
    args.validate()
    wanted = data_files.run_splits(args.do_train, args.do_eval, args.do_predict)
    paths = {split: split_file(args, split) for split in wanted}  # every missing file fails first
    strategy = args.make_strategy()
    source = args.model_source()
    job = ner_job.NerJob(paths, args.max_seq_length, args.head_fields())
    return finetuning.run(args.finetune_config(), strategy, source, job)


# ----------------------------------------------------------------------------------------------
# The CLI
# ----------------------------------------------------------------------------------------------

if __name__ == "__main__":
    cli.define_flags(NerArgs)
    cli.run(cli.job_main(NerArgs, run, "run_ner", clean_output_dir=saves.clean_output_dir))
