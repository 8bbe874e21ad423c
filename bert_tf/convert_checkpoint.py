"""CLI: convert Google's original or Hugging Face BERT weights into a bert_tf model directory.

    python -m bert_tf.convert_checkpoint --format=google \
      --checkpoint=uncased_L-12_H-768_A-12/bert_model.ckpt --do_lower_case=true --output_dir=models/base
    python -m bert_tf.convert_checkpoint --format=huggingface --checkpoint=path/to/hf_dir \
      --output_dir=models/minilm
"""

import dataclasses

from bert_tf import checkpoints, cli, tokenization
from bert_tf.cli import arg
from bert_tf.io_utils import UsageError


@dataclasses.dataclass
class ConvertArgs:
    """A convert_checkpoint run: its fields are the CLI's flags."""

    format: str = arg(
        None,
        "The source format: 'google' for the original TF1 bert_model.ckpt, 'huggingface' for a "
        "directory with config.json and model.safetensors or pytorch_model.bin.",
        choices=checkpoints.FORMATS,
    )
    checkpoint: str = arg(
        None,
        "For google, the checkpoint prefix (e.g. .../bert_model.ckpt) or its directory; for "
        "huggingface, the directory holding config.json and the weights.",
    )
    bert_config_file: str = arg(
        None,
        "The config of the source model. Defaults to bert_config.json (google) or config.json "
        "(huggingface) beside the checkpoint.",
    )
    vocab_file: str = arg(
        None, "The WordPiece vocabulary. Defaults to vocab.txt beside the checkpoint."
    )
    do_lower_case: bool = arg(
        None,
        "Whether the model expects lower-cased input. Required unless the config (or Hugging "
        "Face tokenizer_config.json) records it; it is stored in the model directory. It must "
        "match the name of Google's released checkpoints (false for cased_L-12_H-768_A-12).",
    )
    output_dir: str = arg(None, "The model directory to write.")


def run(args):
    """Converts the checkpoint of a `ConvertArgs` into a model directory; bad inputs are UsageErrors."""
    if args.format == "google" and args.do_lower_case is not None:
        try:
            prefix = checkpoints.resolve_google_checkpoint(args.checkpoint)
        except FileNotFoundError:
            prefix = None  # convert() names what is missing
        if prefix:
            tokenization.validate_case_matches_checkpoint(
                args.do_lower_case, prefix, flag="--checkpoint"
            )
    try:
        path = checkpoints.convert(
            args.format,
            args.checkpoint,
            args.output_dir,
            bert_config_file=args.bert_config_file,
            vocab_file=args.vocab_file,
            do_lower_case=args.do_lower_case,
        )
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(str(e)) from e
    print(f"wrote model directory {args.output_dir} (checkpoint {path})")
    return path


if __name__ == "__main__":
    cli.define_flags(ConvertArgs)
    cli.run(
        cli.job_main(
            ConvertArgs,
            run,
            "convert_checkpoint",
            required=("format", "checkpoint", "output_dir"),
        )
    )
