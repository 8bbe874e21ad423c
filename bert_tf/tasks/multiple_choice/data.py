"""SWAG-style multiple choice data: CSV files or a TFDS split -> examples -> features.

SWAG's files (train.csv, val.csv, test.csv) have the columns
`video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label`
(test.csv without a label). As in the BERT paper, choice i is packed as
`[CLS] sent1 [SEP] sent2 + " " + ending_i [SEP]`, the longer side trimmed at its end until the pair
fits (the original's _truncate_seq_pair). Any number of `endingN` columns (at least 2) works.

TFDS has no `swag` builder (tensorflow-datasets 4.9); its SWAG-style dataset is `hellaswag`
(features context, endings, label), which --tfds reads: choice i is `[CLS] context [SEP] ending_i [SEP]`.
"""

import csv
import dataclasses
import io
import os
import re

import numpy as np
import tensorflow as tf

from bert_tf.runtime import io_utils
from bert_tf.tasks import data_files, packing
from bert_tf.tasks.classification import metrics

# The split files of SWAG's release, by our split names.
SPLIT_FILES = {"train": "train.csv", "dev": "val.csv", "test": "test.csv"}
# TFDS split names, by ours.
TFDS_SPLITS = {"train": "train", "dev": "validation", "test": "test"}
_ENDING_COLUMN = re.compile(r"ending(\d+)")


@dataclasses.dataclass
class ChoiceExample:
    """One question: the context (first segment), each choice's second segment, the gold choice."""

    example_id: str
    context: str
    endings: list
    label: int = None  # None in a test split


def split_file(data_dir, split):
    """DATA_DIR's file of `split` (train.csv, val.csv or test.csv); a missing one is a UsageError."""
    return data_files.split_path(data_dir, SPLIT_FILES[split])


def read_swag_csv(path):
    """ChoiceExamples of a SWAG CSV file; a missing column or a bad label names the file and line."""
    with io_utils.open_text(path) as raw:
        reader = csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8", newline=""))
        header = reader.fieldnames or []
        endings = sorted(
            (int(m.group(1)), name) for name in header if (m := _ENDING_COLUMN.fullmatch(name))
        )
        missing = [name for name in ("sent1", "sent2") if name not in header]
        if missing or len(endings) < 2:
            raise data_files.DataFormatError(
                f"{path}:1: a SWAG header needs sent1, sent2 and ending0, ending1, ... columns; "
                f"got {', '.join(header) or 'nothing'}"
            )
        examples = []
        try:
            for row in reader:
                line = reader.line_num
                label = row.get("label")
                if label not in (None, ""):
                    if not label.strip().isdigit() or int(label) >= len(endings):
                        raise data_files.DataFormatError(
                            f"{path}:{line}: label {label!r} is not an ending number below {len(endings)}"
                        )
                    label = int(label)
                else:
                    label = None
                example_id = (
                    f"{row.get('video-id', '')}-{row.get('fold-ind', '')}"
                    if "fold-ind" in row
                    else str(line)
                )
                examples.append(
                    ChoiceExample(
                        example_id=example_id,
                        context=row["sent1"] or "",
                        endings=[
                            f"{row['sent2'] or ''} {row[name] or ''}".strip() for _, name in endings
                        ],
                        label=label,
                    )
                )
        except (csv.Error, UnicodeDecodeError) as e:
            raise data_files.DataFormatError(f"{path}:{reader.line_num}: {e}") from None
    return examples


def read_split(data_dir, split):
    """(examples, path) of a split of a SWAG directory."""
    path = split_file(data_dir, split)
    return read_swag_csv(path), path


def read_tfds_split(name, split, data_dir=None):
    """(examples, description) of a TFDS split with context, endings and label features (hellaswag)."""
    import tensorflow_datasets as tfds

    try:
        dataset = tfds.load(name, split=TFDS_SPLITS[split], data_dir=data_dir, shuffle_files=False)
    except tfds.core.registered.DatasetNotFoundError as e:
        raise io_utils.UsageError(
            f"--tfds={name}: {str(e).splitlines()[0]} (TFDS's SWAG-style dataset is `hellaswag`)"
        ) from None
    examples = []
    for index, row in enumerate(tfds.as_numpy(dataset)):
        label = int(row["label"])
        examples.append(
            ChoiceExample(
                example_id=str(index),
                context=row["context"].decode("utf-8"),
                endings=[ending.decode("utf-8") for ending in row["endings"]],
                label=label if label >= 0 else None,
            )
        )
    return examples, f"tfds {name}:{TFDS_SPLITS[split]}"


def num_choices(examples):
    """The number of choices every example has; examples that differ are a DataFormatError."""
    counts = {len(example.endings) for example in examples}
    if len(counts) > 1:
        raise data_files.DataFormatError(
            f"examples have different numbers of choices: {sorted(counts)}"
        )
    return counts.pop() if counts else 0


def convert_examples(examples, tokenizer, max_seq_length):
    """Features: input_ids, input_mask, segment_ids int32 [n, choices, max_seq_length]; label_ids
    int32 [n] (0 where there is no label); is_real_example int32 [n]."""
    cls_id, sep_id = tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"]
    count, choices = len(examples), num_choices(examples)
    packed = np.zeros((3, count, choices, max_seq_length), np.int32)
    for i, example in enumerate(examples):
        context = tokenizer.encode(example.context)
        for j, ending in enumerate(example.endings):
            packed[:, i, j] = packing.pack_segments(
                [context, tokenizer.encode(ending)],
                max_seq_length,
                cls_id,
                sep_id,
                drop_empty_b=True,
            )
    return {
        "input_ids": packed[0],
        "input_mask": packed[1],
        "segment_ids": packed[2],
        "label_ids": np.array([example.label or 0 for example in examples], np.int32),
        "is_real_example": np.ones(count, np.int32),
    }


def feature_spec(input_shape):
    """The tf.io.parse_example spec of multiple choice records; `input_shape` is the shape of one
    record's inputs, [choices, max_seq_length]."""
    spec = {
        name: tf.io.FixedLenFeature(list(input_shape), tf.int64)
        for name in packing.MODEL_INPUT_NAMES
    }
    spec["label_ids"] = tf.io.FixedLenFeature([], tf.int64)
    spec["is_real_example"] = tf.io.FixedLenFeature([], tf.int64)
    return spec


def accuracy(examples, predictions):
    """The fraction of examples whose predicted choice is the gold one."""
    return metrics.accuracy([example.label for example in examples], predictions)


def write_predictions(output_dir, split, examples, probabilities):
    """Writes <split>_results.tsv (each choice's probability) and <split>_predictions.csv
    (`example_id,choice`); returns the paths."""
    results = os.path.join(output_dir, f"{split}_results.tsv")
    io_utils.atomic_write_text(
        results, "".join("\t".join(f"{p:.6f}" for p in row) + "\n" for row in probabilities)
    )
    predictions = os.path.join(output_dir, f"{split}_predictions.csv")
    lines = ["example_id,choice"] + [
        f"{example.example_id},{int(np.argmax(row))}"
        for example, row in zip(examples, probabilities)
    ]
    io_utils.atomic_write_text(predictions, "\n".join(lines) + "\n")
    return [results, predictions]
