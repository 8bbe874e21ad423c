"""python -m bert_tf.build_vocab: learns a WordPiece vocabulary (vocab.txt) from text files.

  python -m bert_tf.build_vocab --input_file=corpus.txt[,more/*.txt.gz] --output_file=vocab.txt \
      --vocab_size=8000 --do_lower_case=true

How the words are counted and the pieces learned: bert_tf.tokenization.vocab_learner.
"""

from bert_tf.runtime import job_process  # noqa: F401  (first: it sets the process up before TensorFlow loads)

# isort: split

import dataclasses
import os

from bert_tf.runtime import cli, io_utils
from bert_tf.runtime.cli import arg
from bert_tf.tokenization import vocab_learner
from bert_tf.tokenization.tokenizer_rules import SPECIAL_TOKENS


@dataclasses.dataclass
class BuildVocabArgs:
    """A build_vocab run: its fields are the CLI's flags."""

    input_file: str = arg(
        None,
        "Input text files: comma-separated globs, one sentence per line (.gz files are "
        "decompressed).",
    )
    output_file: str = arg(None, "Where to write vocab.txt, one token per line.")
    vocab_size: int = arg(
        30522,
        "The largest vocabulary to produce, reserved tokens included. The learner lands at or a "
        "few percent below it.",
    )
    do_lower_case: bool = arg(
        True,
        "Whether to lower case and strip accents; must match the tokenizer that will use the "
        "vocabulary.",
    )
    num_workers: int = arg(
        min(2, os.cpu_count() or 1),
        "Processes that count words. The vocabulary does not depend on it.",
    )


def run(args):
    """Builds the vocabulary of a `BuildVocabArgs` and prints a summary; bad arguments are UsageErrors."""
    if args.vocab_size < len(SPECIAL_TOKENS) + 1:
        raise io_utils.UsageError(
            f"--vocab_size must be more than {len(SPECIAL_TOKENS)}, got {args.vocab_size}"
        )
    if args.num_workers < 1:
        raise io_utils.UsageError(f"--num_workers must be at least 1, got {args.num_workers}")
    files = io_utils.expand_globs(args.input_file, what="--input_file")
    try:
        summary = vocab_learner.build_vocab(
            files, args.output_file, args.vocab_size, args.do_lower_case, args.num_workers
        )
    except ValueError as e:
        raise io_utils.UsageError(
            f"{e} (--input_file={args.input_file}, --vocab_size={args.vocab_size})"
        ) from e
    print(
        f"wrote {summary['vocab_size']} tokens (asked for at most {summary['requested_vocab_size']}) "
        f"to {summary['output_file']} from {summary['words']} words "
        f"({summary['distinct_words']} distinct) in {summary['lines']} lines of "
        f"{summary['files']} files in {summary['seconds']} s; "
        f"invalid UTF-8 sequences replaced: {summary['invalid_utf8']}"
    )
    if summary["chars_left_out"]:
        print(
            f"note: {summary['chars_left_out']} rare characters beyond the "
            f"{vocab_learner.MAX_UNIQUE_CHARS} most frequent are not in the vocabulary; words "
            "containing them become [UNK]"
        )
    return summary


if __name__ == "__main__":
    cli.define_flags(BuildVocabArgs)
    cli.run(
        cli.job_main(BuildVocabArgs, run, "build_vocab", required=("input_file", "output_file"))
    )
