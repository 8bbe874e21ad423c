"""python -m bert_tf.corpus: the embedded default corpus, the docstrings of installed Python, as a text file.

    python -m bert_tf.corpus --output_file=build/demo/corpus.txt [--max_mb=N] [--packages=numpy,keras]
        [--heldout_file=build/demo/heldout.txt --heldout_every=20]

One sentence per line, a blank line between documents; how it is made: bert_tf.pretraining_data.corpus.
With --heldout_file, every --heldout_every-th document goes there instead, for asking a model about
text it was not trained on (python -m bert_tf.fill_mask --evaluate_file).
"""

from bert_tf.runtime import job_process  # noqa: F401  (first: it sets the process up before TensorFlow loads)

# isort: split

import dataclasses
import os
import time

from bert_tf.pretraining_data import corpus
from bert_tf.runtime import cli, io_utils
from bert_tf.runtime.cli import arg


@dataclasses.dataclass
class CorpusArgs:
    """A `python -m bert_tf.corpus` run: its fields are the CLI's flags."""

    output_file: str = arg(
        None, "Where to write the corpus: one sentence per line, a blank line between documents."
    )
    max_mb: float = arg(
        None,
        "Stop before the corpus would exceed this many megabytes (10**6 bytes). Default: "
        "everything found.",
    )
    packages: list = arg(
        help="Installed packages whose docstrings are added after the standard library's. Empty: "
        "the standard library only.",
        default_factory=lambda: list(corpus.DEFAULT_PACKAGES),
    )
    heldout_file: str = arg(
        "", "Write every --heldout_every-th document here instead of to --output_file."
    )
    heldout_every: int = arg(20, "With --heldout_file: hold out one document in this many.")
    num_workers: int = arg(
        min(2, os.cpu_count() or 1),
        "Processes that parse source files. The output does not depend on it.",
    )


def run(args):
    """Writes the default corpus of a `CorpusArgs` and prints what it wrote; returns the counts."""
    if args.max_mb is not None and args.max_mb <= 0:
        raise io_utils.UsageError(f"--max_mb must be positive, got {args.max_mb}")
    if args.num_workers < 1:
        raise io_utils.UsageError(f"--num_workers must be at least 1, got {args.num_workers}")
    if args.heldout_file and args.heldout_every < 2:
        raise io_utils.UsageError(f"--heldout_every must be at least 2, got {args.heldout_every}")
    max_bytes = None if args.max_mb is None else int(args.max_mb * 1e6)
    roots = corpus.corpus_source_dirs(args.packages)
    started = time.time()
    stats = corpus.write_default_corpus(
        args.output_file,
        max_bytes=max_bytes,
        roots=roots,
        processes=args.num_workers,
        heldout_file=args.heldout_file or None,
        heldout_every=args.heldout_every if args.heldout_file else 0,
    )
    print(
        f"wrote {stats['documents']} documents, {stats['sentences']} sentences, "
        f"{stats['bytes'] / 1e6:.2f} MB to {args.output_file} in {time.time() - started:.1f} s "
        f"(docstrings of the standard library and of: {', '.join(args.packages) or 'nothing else'})"
    )
    if args.heldout_file:
        print(f"held out {stats['heldout_documents']} documents in {args.heldout_file}")
    return stats


if __name__ == "__main__":
    cli.define_flags(CorpusArgs)
    cli.run(cli.job_main(CorpusArgs, run, "corpus", required=("output_file",)))
