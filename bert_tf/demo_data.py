"""python -m bert_tf.demo_data: the demo's labelled task data, written in the tasks' real file formats.

  python -m bert_tf.demo_data --glue_dir=build/demo/glue --swag_dir=build/demo/swag \
      --conll_dir=build/demo/conll --corpus_file=build/demo/corpus.txt

A sentiment task in GLUE SST-2's layout, a multiple choice task in SWAG's and a tagging task in
CoNLL-2003's, each deterministic for its seed; what each holds: bert_tf.tasks.demo_datasets.
"""

from bert_tf.runtime import job_process  # noqa: F401  (first: it sets the process up before TensorFlow loads)

# isort: split

import dataclasses
import os

from bert_tf.runtime import cli, io_utils
from bert_tf.runtime.cli import arg
from bert_tf.tasks import demo_datasets


@dataclasses.dataclass
class DemoDataArgs:
    """Where the demo's task files go (each optional)."""

    glue_dir: str = arg("", "Write the sentiment task here, in GLUE SST-2's layout.")
    swag_dir: str = arg("", "Write the multiple choice task here, in SWAG's layout.")
    conll_dir: str = arg("", "Write the tagging task here, in CoNLL-2003's layout (--corpus_file).")
    pair_dir: str = arg(
        "",
        "Write a sentence-pair task here, in GLUE MRPC's layout (--corpus_file): does the second "
        "sentence follow the first in its document?",
    )
    squad_dir: str = arg(
        "",
        "Write a span task here, in SQuAD v1.1's layout (--corpus_file): a sentence with a word "
        "blanked out asks for that word in its document.",
    )
    corpus_file: str = arg(
        "",
        "The corpus the --conll_dir, --pair_dir and --squad_dir tasks are made of: a sentence a "
        "line, a blank line between documents (bert_tf.corpus).",
    )


def run(args):
    """Writes the task directories `args` name."""
    corpus_tasks = {
        "--conll_dir": (args.conll_dir, demo_datasets.write_demo_conll_dir),
        "--pair_dir": (args.pair_dir, demo_datasets.write_demo_pair_dir),
        "--squad_dir": (args.squad_dir, demo_datasets.write_demo_squad_dir),
    }
    wanted = [flag for flag, (path, _) in corpus_tasks.items() if path]
    if not (args.glue_dir or args.swag_dir or wanted):
        raise io_utils.UsageError(
            "give one or more of --glue_dir, --swag_dir, --conll_dir, --pair_dir and --squad_dir"
        )
    if bool(wanted) != bool(args.corpus_file):
        raise io_utils.UsageError(
            "--conll_dir, --pair_dir and --squad_dir are made of --corpus_file: give them together"
        )
    if args.corpus_file and not os.path.isfile(args.corpus_file):
        raise io_utils.UsageError(f"--corpus_file={args.corpus_file} is not a file")
    for path, write in (
        (args.glue_dir, demo_datasets.write_demo_glue_dir),
        (args.swag_dir, demo_datasets.write_demo_swag_dir),
    ):
        if path:
            print(f"wrote {write(path)}", flush=True)
    for path, write in corpus_tasks.values():
        if path:
            print(f"wrote {write(path, args.corpus_file)}", flush=True)


if __name__ == "__main__":
    cli.define_flags(DemoDataArgs)
    cli.run(cli.job_main(DemoDataArgs, run, "demo_data"))
