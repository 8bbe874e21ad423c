"""python -m bert_tf.extract_features: per-token activations of chosen layers (the feature-based approach).

    python -m bert_tf.extract_features --input_file=input.txt --output_file=output.jsonl \\
      --init_checkpoint=build/pretrain --layers=-1,-2,-3,-4 --max_seq_length=128 --batch_size=8

--input_file holds one text per line, or `text_a ||| text_b` for a pair. --output_file gets one
JSON object per input line, in the original layout:

    {"linex_index": 0, "features": [{"token": "[CLS]", "layers": [{"index": -1, "values": [...]}, ...]}, ...]}

one entry per token of the packed input ([CLS] a [SEP] (b [SEP]), b only when it has tokens,
truncated by the original rule), values rounded to 6 decimals. Layer -1 is the last transformer
layer, -2 the one before; `embeddings` (its "index" the string "embeddings") is the embedding
layer's output, what the first transformer layer reads (the encoder's embedding_output).
"""

from bert_tf.runtime import job_process  # noqa: F401  (first: it sets the process up before TensorFlow loads)

# isort: split

import dataclasses

from absl import logging

from bert_tf.checkpoints import initial_weights
from bert_tf.model import modeling
from bert_tf.runtime import cli, io_utils
from bert_tf.runtime.cli import arg
from bert_tf.tasks import data_files, feature_extraction
from bert_tf.training.training_flags import FinetuneArgs


@dataclasses.dataclass
class ExtractArgs:
    """An extract_features run (its fields are the original extract_features.py's flags)."""

    input_file: str = arg(None, "One text per line, or `text_a ||| text_b`.")
    output_file: str = arg(None, "Where the JSON lines go.")
    init_checkpoint: str = cli.inherit(FinetuneArgs, "init_checkpoint")
    bert_config_file: str = cli.inherit(FinetuneArgs, "bert_config_file")
    vocab_file: str = cli.inherit(FinetuneArgs, "vocab_file")
    do_lower_case: bool = cli.inherit(FinetuneArgs, "do_lower_case")
    layers: str = arg(
        "-1,-2,-3,-4",
        "The layers to output, comma-separated (-1 is the last; `embeddings` is the embedding "
        "layer's output, what the first layer reads).",
    )
    max_seq_length: int = arg(
        128,
        "The maximum total input sequence length after WordPiece tokenization; longer "
        "sequences are truncated.",
    )
    batch_size: int = arg(32, "Batch size for predictions.")


def load_encoder(args):
    """(encoder, initial_weights.ModelSource) from --init_checkpoint: a model directory or an original checkpoint."""
    source = initial_weights.resolve(
        args.init_checkpoint,
        args.bert_config_file,
        args.vocab_file,
        args.do_lower_case,
        max_seq_length=args.max_seq_length,
    )
    encoder = modeling.build_encoder(source.config)
    if not source.load_weights(encoder):
        logging.warning("no --init_checkpoint: the encoder has random weights")
    return encoder, source


def run(args):
    """Writes the JSON lines of --output_file; returns the number of lines."""
    if not args.input_file or not args.output_file:
        raise io_utils.UsageError("--input_file and --output_file are required")
    if args.batch_size <= 0:
        raise io_utils.UsageError(f"--batch_size must be positive, got {args.batch_size}")
    if args.max_seq_length < 3:
        raise io_utils.UsageError(
            f"--max_seq_length must be at least 3 ([CLS] x [SEP]), got {args.max_seq_length}"
        )
    inputs = data_files.read_text_pairs(args.input_file, "--input_file")
    encoder, source = load_encoder(args)
    layers = feature_extraction.parse_layers(args.layers, source.config.num_hidden_layers)
    features, tokens = feature_extraction.pack(inputs, source.tokenizer(), args.max_seq_length)
    feature_extraction.write_features(
        args.output_file, encoder, features, tokens, layers, args.batch_size
    )
    print(
        f"wrote features of {len(inputs)} inputs ({len(layers)} layers) to {args.output_file}",
        flush=True,
    )
    return len(inputs)


# ----------------------------------------------------------------------------------------------
# The CLI
# ----------------------------------------------------------------------------------------------

if __name__ == "__main__":
    cli.define_flags(ExtractArgs)
    cli.run(
        cli.job_main(ExtractArgs, run, "extract_features", required=("input_file", "output_file"))
    )
