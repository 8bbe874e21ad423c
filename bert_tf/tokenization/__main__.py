"""python -m bert_tf.tokenization: the first lines of a file through both tokenizers, side by side.

    python -m bert_tf.tokenization --vocab_file=vocab.txt --do_lower_case=true \\
      --input_file=corpus.txt --num_lines=3

prints each line's FullTokenizer tokens and GraphTokenizer ids, and whether they agree; a line on
which they differ ends the run with exit code 1. The CLI lives apart from the tokenizers, so that
importing them loads neither TensorFlow nor GraphTokenizer.
"""

from bert_tf.runtime import job_process  # noqa: F401  (first: it sets the process up before TensorFlow loads)

# isort: split

import dataclasses

import tensorflow as tf

from bert_tf.runtime import cli, io_utils
from bert_tf.runtime.cli import arg
from bert_tf.tokenization import python_tokenizer, tokenizer_rules
from bert_tf.tokenization.graph_tokenizer import GraphTokenizer


@dataclasses.dataclass
class CompareArgs:
    """A `python -m bert_tf.tokenization` run: its fields are the CLI's flags."""

    vocab_file: str = arg(None, "The vocabulary file, one token per line.")
    do_lower_case: bool = arg(True, "Lower-case and strip accents (uncased models).")
    input_file: str = arg(None, "Comma-separated globs of text files to sample.")
    num_lines: int = arg(3, "How many non-empty lines to tokenize and print.")


def read_sample_lines(input_file, num_lines):
    """The first `num_lines` non-empty lines (raw bytes, line ends stripped) of the --input_file globs."""
    lines = []
    for path in io_utils.expand_globs(input_file, what="--input_file"):
        with io_utils.open_text(path) as f:
            for raw in f:
                if raw.strip():
                    lines.append(raw.rstrip(b"\r\n"))
                if len(lines) == num_lines:
                    break
        if len(lines) == num_lines:
            break
    if not lines:
        raise io_utils.UsageError(f"--input_file: no non-empty lines in {input_file}")
    return lines


def compare(args):
    """Tokenizes the first lines of a file with both tokenizers and prints them side by side.

    A line on which GraphTokenizer's ids differ from FullTokenizer's is a JobFailure (exit code 1).
    """
    try:
        full = python_tokenizer.FullTokenizer(args.vocab_file, do_lower_case=args.do_lower_case)
        graph = GraphTokenizer(args.vocab_file, do_lower_case=args.do_lower_case)
    except tokenizer_rules.VocabError as e:
        raise io_utils.UsageError(str(e)) from e
    lines = read_sample_lines(args.input_file, args.num_lines)
    graph_ids = graph.tokenize(tf.constant(lines)).to_list()
    for raw, ids in zip(lines, graph_ids):
        tokens = full.tokenize(raw)
        print(f"text:   {python_tokenizer.to_text(raw)}")
        print(f"tokens: {' '.join(tokens)}")
        print(f"ids:    {' '.join(map(str, ids))}")
        same = ids == full.convert_tokens_to_ids(tokens)
        print(f"GraphTokenizer agrees with FullTokenizer: {'yes' if same else 'NO'}\n", flush=True)
        if not same:
            raise io_utils.JobFailure(
                f"GraphTokenizer and FullTokenizer disagree on: {python_tokenizer.to_text(raw)}"
            )


if __name__ == "__main__":
    cli.define_flags(CompareArgs)
    cli.run(
        cli.job_main(CompareArgs, compare, "tokenization", required=("vocab_file", "input_file"))
    )
