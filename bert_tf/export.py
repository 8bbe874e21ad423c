"""python -m bert_tf.export: a model directory -> a SavedModel version, tokenization baked in.

    python -m bert_tf.export --model_dir=DIR --export_dir=export/NAME [--version=N] [--max_seq_length=N]
        [--pad_to_max_seq_length] [--precision=float32|bfloat16] [--jit_compile]

writes EXPORT_DIR/N/ in TF Serving's layout; what goes in, and the signatures of each kind of
model: bert_tf.saved_model.export.
"""

from bert_tf.runtime import job_process  # noqa: F401  (first: it sets the process up before TensorFlow loads)

# isort: split

import dataclasses

from bert_tf.runtime import cli
from bert_tf.runtime.cli import arg
from bert_tf.saved_model import export
from bert_tf.saved_model.export import PRECISION_POLICIES


@dataclasses.dataclass
class ExportArgs:
    """One export: which model directory, where, and how the serving graph pads and computes."""

    model_dir: str = arg(
        None,
        "The model directory to export: a fine-tuned one (with task.json) "
        "or a pretrained one (exported as a TF Hub style encoder + preprocessor).",
    )
    export_dir: str = arg(
        None,
        "Where versions go: EXPORT_DIR/N/ is one SavedModel version, "
        "TF Serving's --model_base_path.",
    )
    version: int = arg(
        None,
        "The version number to write. Default: one more than the highest "
        "numeric version already in --export_dir (1 if none).",
    )
    max_seq_length: int = arg(
        None,
        "Tokens per packed input at most (the truncation limit). Default: the "
        "model directory's task.json max_seq_length, or 128 for an encoder.",
    )
    pad_to_max_seq_length: bool = arg(
        False,
        "Pad every batch to max_seq_length (static shapes, as before) instead of to its own "
        "longest input (rounded up to a multiple of 16 with --jit_compile).",
    )
    precision: str = arg(
        "float32",
        "The compute precision of the exported model; outputs keep their dtypes.",
        choices=PRECISION_POLICIES,
    )
    jit_compile: bool = arg(
        False,
        "XLA-compile the model in the exported graph (faster on CPU; stock TF Serving then needs "
        "--xla_cpu_compilation_enabled=true).",
    )


def run(args):
    """Runs one export from its arguments and prints where it went."""
    path, kind = export.export(**dataclasses.asdict(args))
    print(f"exported {kind} model to {path}")


if __name__ == "__main__":
    cli.define_flags(ExportArgs)
    cli.run(cli.job_main(ExportArgs, run, "export", required=("model_dir", "export_dir")))
