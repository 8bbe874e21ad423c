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
import json

import numpy as np
import tensorflow as tf
from absl import logging

from bert_tf.checkpoints import initial_weights
from bert_tf.model import modeling
from bert_tf.runtime import cli, io_utils
from bert_tf.runtime.cli import arg
from bert_tf.tasks import data_files, packing
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


# The --layers name of the embedding layer's output (the encoder's embedding_output).
EMBEDDINGS = "embeddings"


def parse_layers(text, num_layers):
    """The --layers entries: ints naming the model's layers (-1 the last), or EMBEDDINGS."""
    try:
        layers = [
            EMBEDDINGS if x.strip() == EMBEDDINGS else int(x) for x in text.split(",") if x.strip()
        ]
    except ValueError:
        raise io_utils.UsageError(
            f"--layers={text}: expected comma-separated integers such as -1,-2,-3,-4, "
            f"or {EMBEDDINGS}"
        ) from None
    if not layers:
        raise io_utils.UsageError("--layers is empty")
    for layer in layers:
        if layer != EMBEDDINGS and not -num_layers <= layer < num_layers:
            raise io_utils.UsageError(
                f"--layers: {layer} is out of range for a model with {num_layers} layers"
            )
    return layers


def pack(inputs, tokenizer, max_seq_length):
    """(features: input_ids/input_mask/segment_ids [n, max_seq_length], the token strings of each row)."""
    cls_id, sep_id = tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"]
    count = len(inputs)
    features = {
        name: np.zeros((count, max_seq_length), np.int32) for name in packing.MODEL_INPUT_NAMES
    }
    all_tokens = []
    for row, (text_a, text_b) in enumerate(inputs):
        segments = [tokenizer.tokenize(text_a)]
        tokens_b = tokenizer.tokenize(text_b) if text_b is not None else []
        if tokens_b:  # the original's rule: a b with no tokens makes a single-sentence input
            segments.append(tokens_b)
        segments = packing.truncate_segments(segments, max_seq_length - len(segments) - 1)
        tokens = ["[CLS]"]
        for segment in segments:
            tokens += segment + ["[SEP]"]
        all_tokens.append(tokens)
        ids = [tokenizer.convert_tokens_to_ids(s) for s in segments]
        packed = packing.pack_segments(ids, max_seq_length, cls_id, sep_id)
        for name, values in zip(packing.MODEL_INPUT_NAMES, packed):
            features[name][row] = values
    return features, all_tokens


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
    layers = parse_layers(args.layers, source.config.num_hidden_layers)
    features, tokens = pack(inputs, source.tokenizer(), args.max_seq_length)

    @tf.function
    def selected_layers(batch):
        outputs = encoder({name: batch[name] for name in modeling.ENCODER_INPUTS}, training=False)
        chosen = [
            outputs["embedding_output"]
            if layer == EMBEDDINGS
            else outputs["encoder_outputs"][layer]
            for layer in layers
        ]
        return tf.stack([tf.cast(x, tf.float32) for x in chosen], axis=1)

    with io_utils.atomic_path(args.output_file) as tmp, tf.io.gfile.GFile(tmp, "w") as out:
        dataset = packing.features_dataset(features, args.batch_size)
        row = 0
        for batch in dataset:
            values = selected_layers(batch).numpy()  # [b, layers, s, h]
            for activations in values:
                line = {
                    "linex_index": row,
                    "features": [
                        {
                            "token": token,
                            "layers": [
                                {
                                    "index": layer,
                                    "values": [
                                        round(float(x), 6) for x in activations[i, position]
                                    ],
                                }
                                for i, layer in enumerate(layers)
                            ],
                        }
                        for position, token in enumerate(tokens[row])
                    ],
                }
                out.write(json.dumps(line) + "\n")
                row += 1
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
