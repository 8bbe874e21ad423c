"""python -m bert_tf.inspect_records: pretraining records decoded back to text.

    python -m bert_tf.inspect_records FILE [--limit=N] [--start=K] [--vocab_file=vocab.txt]

Prints each record of a `.tfrecord` (or `.tfrecord.gz`) file written by create_pretraining_data,
ours or Google's: the NSP label, both segments as text, the input as the model sees it, and every
masked position as [MASK], random or kept beside its original token. Without --vocab_file the
tokens are shown as their ids (#N), and a masked position that changed reads "replaced". A damaged
file prints its good records, then one line naming the damage (file, record, byte), and exits 2.
The playground's Records view shows the same decoding (bert_tf.pretraining_data.inspection).
"""

from bert_tf.runtime import job_process  # noqa: F401  (first: it sets the process up before TensorFlow loads)

# isort: split

import dataclasses
import os
import sys

from bert_tf.pretraining_data import inspection
from bert_tf.runtime import cli, io_utils
from bert_tf.runtime.cli import arg
from bert_tf.tokenization import tokenizer_rules


@dataclasses.dataclass
class InspectRecordsArgs:
    """An inspect_records run: which records, and the vocabulary to read their ids with."""

    limit: int = arg(10, "How many records to print.")
    start: int = arg(0, "The first record to print (0 is the file's first).")
    vocab_file: str = arg(
        "", "The vocabulary the records were made with (without it, tokens are shown as ids)."
    )


def vocab_tokens(vocab_file):
    """The vocabulary in id order, or None without a file (then ids stand for tokens)."""
    if not vocab_file:
        return None
    try:
        return tuple(tokenizer_rules.load_vocab(vocab_file))
    except (OSError, tokenizer_rules.VocabError) as e:
        raise io_utils.UsageError(f"--vocab_file: {e}") from e


class _IdNames:
    """A stand-in vocabulary that names every id `#N`."""

    def __len__(self):
        return 1 << 62

    def __getitem__(self, index):
        return f"#{index}"

    def __contains__(self, token):
        return False  # which id is [MASK] is unknown: a masked position reads "replaced"


def run(args, paths):
    """Prints the records; returns the DecodedInstances printed. A damaged record is a RecordError
    (exit 2) raised after the good records before it are printed."""
    if len(paths) != 1:
        raise io_utils.UsageError(f"give one record file, got {len(paths)} arguments")
    if args.limit < 1 or args.start < 0:
        raise io_utils.UsageError("--limit must be at least 1 and --start at least 0")
    path = paths[0]
    if not io_utils.is_remote(path):
        try:
            open(path, "rb").close()
        except OSError as e:
            raise io_utils.UsageError(f"cannot read {path}: {e.strerror}") from None
    tokens = vocab_tokens(args.vocab_file) or _IdNames()
    page = inspection.read_instances(path, tokens, args.start, args.limit)
    instances = page.instances
    lines = [line for instance in instances for line in inspection.instance_lines(instance)]
    if page.damage is None and not instances:
        lines.append(f"{path}: no records from record {args.start} on")
    elif page.damage is None and page.more:
        lines.append(f"... more records follow (--start={instances[-1].index + 1})")
    try:
        for line in lines:
            print(line)
        sys.stdout.flush()
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if page.damage is not None:
        raise page.damage
    return instances


def main(argv):
    """absl's main: flags -> InspectRecordsArgs; the positional argument is the file."""
    run(cli.args_from_flags(InspectRecordsArgs), argv[1:])


if __name__ == "__main__":
    cli.define_flags(InspectRecordsArgs)
    cli.run(main)
