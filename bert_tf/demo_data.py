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
    corpus_file: str = arg("", "The sentences --conll_dir tags, one per line (bert_tf.corpus).")


def run(args):
    """Writes the task directories `args` name."""
    if not (args.glue_dir or args.swag_dir or args.conll_dir):
        raise io_utils.UsageError("give one or more of --glue_dir, --swag_dir and --conll_dir")
    if bool(args.conll_dir) != bool(args.corpus_file):
        raise io_utils.UsageError(
            "--conll_dir and --corpus_file (the sentences to tag) go together"
        )
    if args.corpus_file and not os.path.isfile(args.corpus_file):
        raise io_utils.UsageError(f"--corpus_file={args.corpus_file} is not a file")
    for path, write in (
        (args.glue_dir, demo_datasets.write_demo_glue_dir),
        (args.swag_dir, demo_datasets.write_demo_swag_dir),
    ):
        if path:
            print(f"wrote {write(path)}", flush=True)
    if args.conll_dir:
        print(
            f"wrote {demo_datasets.write_demo_conll_dir(args.conll_dir, args.corpus_file)}",
            flush=True,
        )


if __name__ == "__main__":
    cli.define_flags(DemoDataArgs)
    cli.run(cli.job_main(DemoDataArgs, run, "demo_data"))
