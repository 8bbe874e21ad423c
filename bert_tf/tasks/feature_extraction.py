"""The feature-based approach's activations written out: chosen layers, per token, as JSON lines.

What `python -m bert_tf.extract_features` does with a model's encoder: `pack` turns text (pairs)
into features by the original's rule ([CLS] a [SEP] (b [SEP]), b only when it has tokens),
`parse_layers` reads a layer list (-1 the last layer; EMBEDDINGS the embedding layer's output, what
the first layer reads), and `write_features` runs the encoder and writes one JSON object a text in
the original extract_features.py's layout, values rounded to 6 decimals.
"""

import json

import numpy as np
import tensorflow as tf

from bert_tf.model import modeling
from bert_tf.runtime import io_utils
from bert_tf.tasks import packing

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


def write_features(output_file, encoder, features, tokens, layers, batch_size):
    """Writes one JSON line per row of `features` (pack's output, with `tokens` its token strings):
    each token's activations in `layers`, through `io_utils.atomic_path`."""

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

    with io_utils.atomic_path(output_file) as tmp, tf.io.gfile.GFile(tmp, "w") as out:
        dataset = packing.features_dataset(features, batch_size)
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
