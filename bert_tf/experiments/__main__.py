"""The BERT paper's studies on your corpus, with the real jobs: `python -m bert_tf.experiments`.

    python -m bert_tf.experiments --study=tasks --output_dir=build/experiments/tasks --scale=tiny
    python -m bert_tf.experiments --study=sizes --model_sizes=tiny,mini,L4_H512_A8 \\
        --input_file=my_corpus.txt --tasks=sst2:glue/SST-2,swag:swag --output_dir=...
    python -m bert_tf.experiments --study=features --init_checkpoint=my_bert \\
        --tasks=conll:conll2003 --output_dir=...

--study is one of
  tasks     Table 5: MLM + NSP, No NSP, LTR & No NSP, + BiLSTM;
  sizes     Table 6;
  features  Table 7: fine-tuning against frozen features into a BiLSTM, on tagging;
  masking   Table 8's mixes, whole-word and span masking (3 seeds a cell);
  layers    the same BiLSTM probe on the frozen embeddings and each layer's output, on tagging
            and the GLUE tasks given (3 seeds);
  steps     fine-tuned accuracy after each fifth of pretraining, masked LM against
            left-to-right (3 seeds a point), by default on the corpus's sentence pairs.
Without --input_file the corpus is the embedded one (bert_tf.corpus); without --tasks the tasks
are the demo's (bert_tf.demo_data: sentiment, multiple choice, or code-name tagging).
The study runs each job as its own process (plan.py lists them) and writes OUTPUT_DIR/RESULTS.md,
OUTPUT_DIR/<study>.png and the learning curves (report.py). Run the same command again after a
kill: finished steps are skipped and a cut-short one resumes from its checkpoints.
"""

from bert_tf.runtime import job_process  # noqa: F401  (first: it sets the process up before TensorFlow loads)

# isort: split

import dataclasses
import os
import shlex
import sys

from bert_tf.experiments import plan, report, runner
from bert_tf.runtime import child_reaper, cli, io_utils
from bert_tf.runtime.cli import arg


@dataclasses.dataclass
class ExperimentArgs:
    """The study, its data and its scale."""

    study: str = arg(
        None,
        "The study: tasks (Table 5), sizes (Table 6), features (Table 7), masking (Table 8, "
        "with whole-word and span masking), layers (a frozen-feature probe on every layer), "
        "steps (fine-tuned accuracy against pretraining steps, masked LM against "
        "left-to-right).",
        choices=plan.STUDIES,
    )
    output_dir: str = arg("", "Where the data, models, runs, RESULTS.md and charts go.")
    scale: str = arg(
        "tiny",
        "The recipe: tiny and mini fit a CPU (minutes, an hour); base is the paper's (1M steps of "
        "256 sequences). plan.SCALES has each one's numbers.",
        choices=tuple(plan.SCALES),
    )
    input_file: str = arg(
        "",
        "The pretraining corpus (one sentence per line, blank lines between documents). Default: the embedded corpus.",
    )
    vocab_file: str = arg("", "A vocab.txt for the corpus (default: built from it).")
    vocab_size: int = arg(8000, "The vocabulary's size when it is built from the corpus.")
    tasks: list = arg(
        default_factory=list,
        help="The fine-tuning tasks, NAME:DIR each: a GLUE task (sst2, mrpc, ...: run_classifier's "
        "layout), swag (SWAG's CSV) or conll (CoNLL-2003). Default: the demo's.",
    )
    model_sizes: list = arg(
        default_factory=lambda: ["tiny", "mini"],
        help="--study=sizes: the sizes, named (tiny, mini, small, medium, base, large) or "
        "L<layers>_H<hidden>_A<heads>.",
    )
    init_checkpoint: str = arg(
        "",
        "--study=features and --study=layers: study this pretrained model directory instead of "
        "pretraining one.",
    )
    pretraining_steps: int = arg(0, "Pretraining steps (0: the scale's).")
    dupe_factor: int = arg(5, "How many maskings of the corpus the pretraining records hold.")
    max_eval_steps: int = arg(50, "Held-out pretraining batches for the LM loss and perplexity.")
    finetune_learning_rate: float = arg(0.0, "Fine-tuning learning rate (0: the scale's).")
    finetune_epochs: float = arg(0.0, "Fine-tuning epochs (0: the scale's).")
    bilstm_epochs: float = arg(
        0.0,
        "Epochs of the runs that train a BiLSTM from scratch: + BiLSTM, and the feature-based "
        "approach (0: the scale's).",
    )
    finetune_seq_length: int = arg(0, "Fine-tuning max_seq_length (0: the scale's).")
    lstm_units: int = arg(0, "BiLSTM units per direction (0: the scale's; the paper's is 768).")
    seed: int = arg(12345, "Seeds the data and every run.")
    finetune_seeds: int = arg(
        0,
        "Fine-tuning runs per table cell, seeded --seed, --seed + 1, ...; the table shows their "
        "mean ± standard deviation. 0: the study's default (3 for masking, layers and steps, 1 for the others).",
    )

    def validate(self):
        if not self.study:
            raise io_utils.UsageError(f"--study is required: one of {', '.join(plan.STUDIES)}")
        if not self.output_dir:
            raise io_utils.UsageError("--output_dir is required")
        for name in (
            "pretraining_steps",
            "finetune_learning_rate",
            "finetune_epochs",
            "bilstm_epochs",
            "finetune_seq_length",
            "lstm_units",
            "dupe_factor",
            "vocab_size",
            "finetune_seeds",
        ):
            if getattr(self, name) < 0:
                raise io_utils.UsageError(
                    f"--{name} must not be negative, got {getattr(self, name)}"
                )
        if self.init_checkpoint and self.study not in ("features", "layers"):
            raise io_utils.UsageError(
                "--init_checkpoint is for --study=features and --study=layers (the others pretrain)"
            )
        if self.study == "sizes":
            for size in self.model_sizes:
                plan.size_shape(size)  # names a bad entry
        if self.tasks:
            plan.parse_tasks(self.tasks)


def study_settings(args):
    """The flags a study's runs depend on, as its directory records them: paths made absolute (a
    resume from another working directory names the same files), the output directory left out
    (a study may be moved, or named with a trailing slash)."""
    settings = dataclasses.asdict(args)
    del settings["output_dir"]
    for name in ("input_file", "vocab_file", "init_checkpoint"):
        settings[name] = os.path.abspath(settings[name]) if settings[name] else ""
    settings["tasks"] = [
        f"{task}:{os.path.abspath(path)}"
        for task, path in (entry.split(":", 1) for entry in settings["tasks"])
    ]
    return settings


def run(args, log_fn=print, on_start=None):
    """Runs the study's unfinished steps and writes the report; returns RESULTS.md's path.

    The output directory is the study's alone while it runs (runner.study_dir); `on_start()` runs
    once it is, before any step (the CLI writes its flags file there).
    """
    args.validate()
    settings = study_settings(args)
    with runner.study_dir(args.output_dir, settings) as lock_fd:
        if on_start is not None:
            on_start()
        steps = plan.plan(args)
        runner.record_settings(args.output_dir, settings)
        with child_reaper.reaped_children():
            times = runner.run_steps(steps, args.output_dir, log_fn, pass_fds=(lock_fd,))
        command = shlex.join(["python", "-m", "bert_tf.experiments", *sys.argv[1:]])
        path = report.write_report(args, steps, times, command)
    log_fn(f"wrote {path}")
    return path


def main(argv):
    """absl's main: flags -> ExperimentArgs -> run; the flags file is written once the directory
    is the study's (a refused run leaves the study's own)."""
    if len(argv) > 1:
        raise io_utils.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    args = cli.args_from_flags(ExperimentArgs)
    run(args, on_start=lambda: cli.log_flags(args.output_dir, "experiments"))


if __name__ == "__main__":
    cli.define_flags(ExperimentArgs)
    cli.run(main)
