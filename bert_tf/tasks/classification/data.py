"""Sentence and sentence-pair classification and regression: GLUE and a user's own TSV/CSV.

The flow, as the CLI uses it:

    task = get_task("mrpc")                       # or get_task("tsv", text_a_column=..., ...)
    train = read_split(task, data_dir, "train")   # or read_tfds_split(task, "train")
    labels = label_list(task, train.examples)     # fixed for GLUE, collected for tsv, None: regression
    dev = read_split(task, data_dir, "dev"); check_labels(dev, labels)
    features = convert_examples(dev.examples, tokenizer, max_seq_length, labels)
    write_records(path, features)                 # read back with feature_spec([max_seq_length])
    compute_metrics(task, features["label_ids"], predictions)
    write_submission(output_dir, task, "test", test.examples, predictions, labels)

GLUE file layouts (checked against the original BERT and the GLUE processors): which column
holds each field, and whether the file has a header row, differ per task and per split.
"""

import csv
import dataclasses
import io
import os

import numpy as np
import tensorflow as tf
from absl import logging

from bert_tf.runtime import io_utils
from bert_tf.tasks import data_files, packing
from bert_tf.tasks.classification import metrics


@dataclasses.dataclass(frozen=True)
class InputExample:
    """One example: its id, one or two texts, its label (None in test sets) and where it came from."""

    guid: str
    text_a: str
    text_b: str = None
    label: object = None  # a label name (str), a float score (regression), or None
    source: str = ""  # "file:line", for error messages


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where one split file keeps its fields: column indices (negative from the end) or header names."""

    text_a: object
    text_b: object = None
    label: object = None
    guid: object = None
    header: bool = True


@dataclasses.dataclass(frozen=True)
class Task:
    """A classification or regression task: its labels, split files and layouts, metrics, submissions."""

    name: str
    labels: tuple = None  # None: collected from the training data (tsv) or a regression task
    is_regression: bool = False
    files: dict = (
        None  # split -> file name ("train" -> "train.tsv"); None: train/dev/test .tsv or .csv
    )
    layouts: dict = None  # "train" / "dev" / "test" -> Layout (dev_* and test_* use dev and test)
    eval_splits: tuple = ("dev",)
    test_splits: tuple = ("test",)
    submission_files: dict = None  # test split -> GLUE submission file name
    tfds_text_keys: tuple = None  # the tfds glue/<name> feature names of text_a and text_b
    metric_names: tuple = ("accuracy",)

    @property
    def is_pair(self):
        """Whether examples hold two texts."""
        return self.layouts["train"].text_b is not None

    def layout(self, split):
        """The layout of `split` (dev_matched reads like dev, test_mismatched like test)."""
        return self.layouts[split.split("_")[0]]


@dataclasses.dataclass
class SplitData:
    """The examples of one split, where they came from, and how many bad rows were skipped."""

    split: str
    path: str
    examples: list
    skipped_rows: int = 0


BINARY = ("0", "1")
NLI = ("entailment", "not_entailment")


def _glue(name, train, test, labels=BINARY, submission=None, tfds_keys=None, **kwargs):
    return Task(
        name=name,
        labels=labels,
        layouts={"train": train, "dev": train, "test": test},
        submission_files=submission,
        tfds_text_keys=tfds_keys,
        **kwargs,
    )


# Index/id is column 0 of every GLUE test file; submissions are keyed by it.
_GLUE_TASKS = {
    "cola": _glue(
        "cola",
        Layout(text_a=3, label=1, header=False),
        Layout(text_a=1, guid=0),
        submission={"test": "CoLA.tsv"},
        tfds_keys=("sentence", None),
        metric_names=("accuracy", "mcc"),
    ),
    "sst2": _glue(
        "sst2",
        Layout(text_a=0, label=1),
        Layout(text_a=1, guid=0),
        submission={"test": "SST-2.tsv"},
        tfds_keys=("sentence", None),
    ),
    "mrpc": _glue(
        "mrpc",
        Layout(text_a=3, text_b=4, label=0),
        Layout(text_a=3, text_b=4, guid=0),
        submission={"test": "MRPC.tsv"},
        tfds_keys=("sentence1", "sentence2"),
        metric_names=("accuracy", "f1"),
    ),
    "qqp": _glue(
        "qqp",
        Layout(text_a=3, text_b=4, label=5, guid=0),
        Layout(text_a=1, text_b=2, guid=0),
        submission={"test": "QQP.tsv"},
        tfds_keys=("question1", "question2"),
        metric_names=("accuracy", "f1"),
    ),
    "stsb": _glue(
        "stsb",
        Layout(text_a=7, text_b=8, label=9, guid=0),
        Layout(text_a=7, text_b=8, guid=0),
        labels=None,
        is_regression=True,
        submission={"test": "STS-B.tsv"},
        tfds_keys=("sentence1", "sentence2"),
        metric_names=("pearson", "spearman"),
    ),
    "mnli": _glue(
        "mnli",
        Layout(text_a=8, text_b=9, label=-1, guid=0),
        Layout(text_a=8, text_b=9, guid=0),
        labels=("contradiction", "entailment", "neutral"),
        submission={"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv"},
        tfds_keys=("premise", "hypothesis"),
        files={
            "train": "train.tsv",
            "dev_matched": "dev_matched.tsv",
            "dev_mismatched": "dev_mismatched.tsv",
            "test_matched": "test_matched.tsv",
            "test_mismatched": "test_mismatched.tsv",
        },
        eval_splits=("dev_matched", "dev_mismatched"),
        test_splits=("test_matched", "test_mismatched"),
    ),
    "qnli": _glue(
        "qnli",
        Layout(text_a=1, text_b=2, label=3, guid=0),
        Layout(text_a=1, text_b=2, guid=0),
        labels=NLI,
        submission={"test": "QNLI.tsv"},
        tfds_keys=("question", "sentence"),
    ),
    "rte": _glue(
        "rte",
        Layout(text_a=1, text_b=2, label=3, guid=0),
        Layout(text_a=1, text_b=2, guid=0),
        labels=NLI,
        submission={"test": "RTE.tsv"},
        tfds_keys=("sentence1", "sentence2"),
    ),
    "wnli": _glue(
        "wnli",
        Layout(text_a=1, text_b=2, label=3, guid=0),
        Layout(text_a=1, text_b=2, guid=0),
        submission={"test": "WNLI.tsv"},
        tfds_keys=("sentence1", "sentence2"),
    ),
}
GLUE_TASK_NAMES = tuple(_GLUE_TASKS)
TASK_NAMES = GLUE_TASK_NAMES + ("tsv",)


def _column(value):
    """A column given as an int, a string of digits (an index), or a header name."""
    if value is None or isinstance(value, int):
        return value
    value = str(value).strip()
    if not value:
        return None
    return int(value) if value.lstrip("-").isdigit() else value


def get_task(
    name, text_a_column=None, text_b_column=None, label_column=None, labels=None, has_header=None
):
    """The Task named `name` (a GLUE task or "tsv"); the column arguments apply to "tsv" only.

    For "tsv", columns are header names or 0-based indices; the files have a header row when any
    column is a name (or `has_header` says so). `labels` fixes the label list and its order;
    without it the labels are the sorted set of training labels.
    """
    name = name.lower().replace("-", "")
    if name in _GLUE_TASKS:
        return _GLUE_TASKS[name]
    if name != "tsv":
        raise io_utils.UsageError(f"unknown task {name!r}; expected one of {', '.join(TASK_NAMES)}")
    text_a, text_b, label = _column(text_a_column), _column(text_b_column), _column(label_column)
    if text_a is None or label is None:
        raise io_utils.UsageError("the tsv task needs --text_a_column and --label_column")
    if has_header is None:
        has_header = any(isinstance(c, str) for c in (text_a, text_b, label))
    if isinstance(labels, str):
        labels = [x.strip() for x in labels.split(",") if x.strip()]
    return Task(
        name="tsv",
        labels=tuple(labels) if labels else None,
        layouts={
            "train": Layout(text_a, text_b, label, header=has_header),
            "dev": Layout(text_a, text_b, label, header=has_header),
            "test": Layout(text_a, text_b, header=has_header),
        },
    )


def split_file(task, data_dir, split):
    """The path of `split` in `data_dir`; a missing file is a UsageError naming it."""
    if task.files is not None or task.name != "tsv":
        files = task.files or {s: f"{s}.tsv" for s in ("train", "dev", "test")}
        if split not in files:
            raise io_utils.UsageError(
                f"task {task.name} has no split {split!r}; it has {', '.join(files)}"
            )
        return data_files.split_path(data_dir, files[split])
    candidates = [os.path.join(data_dir, f"{split}{ext}") for ext in (".tsv", ".csv")]
    for path in candidates:
        if tf.io.gfile.exists(path):
            return path
    raise io_utils.UsageError(f"split file not found: {' or '.join(candidates)}")


def read_rows(path):
    """(line number, fields) for each non-blank row of a TSV (split on tabs) or CSV (quoted) file.

    GLUE's TSVs hold unbalanced quotes, so a `.tsv` is split on tabs with no quoting at all, as
    the original processors did; a `.csv` follows the CSV quoting rules.
    """
    if path.endswith(".csv") or path.endswith(".csv.gz"):
        with io_utils.open_text(path) as f:
            reader = csv.reader(io.TextIOWrapper(f, encoding="utf-8", newline=""))
            first_line = 1
            try:
                for fields in reader:
                    if any(field.strip() for field in fields):
                        yield first_line, fields
                    first_line = reader.line_num + 1
            except (csv.Error, UnicodeDecodeError) as e:
                raise data_files.DataFormatError(f"{path}:{reader.line_num}: {e}") from None
        return
    for line_number, line in data_files.decoded_lines(path):
        if line.strip():
            yield line_number, line.split("\t")


def _column_index(column, header, path):
    """Resolves a column name against the header row; indices pass through."""
    if column is None or isinstance(column, int):
        return column
    if header is None:
        raise io_utils.UsageError(
            f"{path}: column {column!r} is a name, but the file has no header row"
        )
    if column not in header:
        raise io_utils.UsageError(f"{path}:1: no column named {column!r} in the header {header}")
    return header.index(column)


def _parse_label(task, raw, where):
    """The label of one row: a name from the task's labels, or a float score for regression."""
    raw = raw.strip()
    if not raw:
        raise data_files.DataFormatError(f"{where}: empty label")
    if task.is_regression:
        try:
            return float(raw)
        except ValueError:
            raise data_files.DataFormatError(f"{where}: score {raw!r} is not a number") from None
    if task.labels is not None and raw not in task.labels:
        raise data_files.DataFormatError(
            f"{where}: label {raw!r} is not one of {', '.join(task.labels)}"
        )
    return raw


def read_split(task, data_dir, split, skip_bad_rows=False, limit=None):
    """Reads one split file of `task` into a SplitData.

    A malformed row (too few columns, a bad or unknown label) is a DataFormatError naming the file
    and line; with `skip_bad_rows` it is skipped, counted and logged instead. So is a row with more
    columns than the file's first row (its header, or its first example), which a tab inside a text
    makes, except in a tsv task's file without a header: there the columns the user named by index
    are read and any others ignored.
    """
    path = split_file(task, data_dir, split)
    layout = task.layout(split)
    examples, skipped = [], 0
    header = None
    columns = None
    for line_number, fields in read_rows(path):
        if columns is None:
            if layout.header:
                header = [f.strip() for f in fields]
            columns = [
                _column_index(c, header, path)
                for c in (layout.text_a, layout.text_b, layout.label, layout.guid)
            ]
            needed = max([c + 1 if c >= 0 else -c for c in columns if c is not None])
            width = len(fields) if layout.header or task.name != "tsv" else None
            if layout.header:
                continue
        where = f"{path}:{line_number}"
        try:
            if len(fields) < needed:
                raise data_files.DataFormatError(
                    f"{where}: {len(fields)} columns, expected at least {needed}"
                    + ("" if skip_bad_rows else " (--skip_bad_rows skips and counts such rows)")
                )
            if width is not None and len(fields) > width:
                raise data_files.DataFormatError(
                    f"{where}: {len(fields)} columns, but the file's first row has {width} "
                    "(a tab or separator inside a text?)"
                    + ("" if skip_bad_rows else " (--skip_bad_rows skips and counts such rows)")
                )
            text_a_col, text_b_col, label_col, guid_col = columns
            label = _parse_label(task, fields[label_col], where) if label_col is not None else None
            examples.append(
                InputExample(
                    guid=fields[guid_col].strip()
                    if guid_col is not None
                    else f"{split}-{line_number}",
                    text_a=fields[text_a_col],
                    text_b=fields[text_b_col] if text_b_col is not None else None,
                    label=label,
                    source=where,
                )
            )
        except data_files.DataFormatError as e:
            if not skip_bad_rows:
                raise
            skipped += 1
            if skipped <= 5:
                logging.warning("skipping a bad row: %s", e)
        if limit is not None and len(examples) >= limit:
            break
    if skipped:
        logging.warning("%s: skipped %d bad rows, kept %d", path, skipped, len(examples))
    return SplitData(split=split, path=path, examples=examples, skipped_rows=skipped)


def task_from_tfds_name(tfds_name):
    """The GLUE Task of a `--tfds` value such as "glue/mrpc"; anything else is a UsageError."""
    prefix, _, name = str(tfds_name).partition("/")
    if prefix != "glue" or name.lower().replace("-", "") not in _GLUE_TASKS:
        raise io_utils.UsageError(
            f"--tfds={tfds_name}: expected glue/<task> with a task among {', '.join(GLUE_TASK_NAMES)}"
        )
    return get_task(name)


def read_tfds_split(task, split, data_dir=None):
    """Reads `split` of the tfds dataset glue/<task> into a SplitData (labels mapped to the task's)."""
    import tensorflow_datasets as tfds  # imported here: loading it is slow, and only this path needs it

    if task.tfds_text_keys is None:
        raise io_utils.UsageError(f"task {task.name} has no tfds dataset")
    tfds_split = split.replace("dev", "validation")
    name = f"glue/{task.name}"
    builder = tfds.builder(name, data_dir=data_dir)
    label_feature = builder.info.features["label"]
    label_names = getattr(label_feature, "names", None)
    key_a, key_b = task.tfds_text_keys
    examples = []
    for record in tfds.as_numpy(builder.as_dataset(split=tfds_split, shuffle_files=False)):
        raw_label = record["label"]
        if task.is_regression:
            label = float(raw_label)
        elif int(raw_label) < 0:  # the test splits carry label -1
            label = None
        else:
            # tfds names the classes (mnli: entailment/neutral/contradiction, cola: unacceptable/
            # acceptable); the original label lists use those names, or "0"/"1".
            named = label_names[int(raw_label)] if label_names else str(int(raw_label))
            label = named if named in task.labels else str(int(raw_label))
        idx = int(record["idx"])
        examples.append(
            InputExample(
                guid=str(idx),
                text_a=record[key_a].decode("utf-8"),
                text_b=record[key_b].decode("utf-8") if key_b else None,
                label=label,
                source=f"tfds:{name}:{tfds_split}:{idx}",
            )
        )
    return SplitData(split=split, path=f"tfds:{name}:{tfds_split}", examples=examples)


def label_list(task, train_examples):
    """The label names in id order: the task's own, or the sorted training labels; None for regression."""
    if task.is_regression:
        return None
    if task.labels is not None:
        return list(task.labels)
    found = sorted({e.label for e in train_examples if e.label is not None})
    if not found:
        raise io_utils.UsageError("the training data holds no labels")
    return found


def check_labels(split_data, labels):
    """Raises a DataFormatError naming the row of the first label outside `labels` (seen in training)."""
    if labels is None:
        return
    known = set(labels)
    examples = split_data.examples if isinstance(split_data, SplitData) else split_data
    for example in examples:
        if example.label is not None and example.label not in known:
            raise data_files.DataFormatError(
                f"{example.source}: label {example.label!r} was never seen in training "
                f"(training labels: {', '.join(labels)})"
            )


def label_values(examples, labels):
    """Label ids (int32) for classification, or float32 scores when `labels` is None; test rows get 0."""
    if labels is None:
        return np.array([0.0 if e.label is None else float(e.label) for e in examples], np.float32)
    index = {name: i for i, name in enumerate(labels)}
    ids = np.zeros(len(examples), np.int32)
    for i, example in enumerate(examples):
        if example.label is not None:
            if example.label not in index:
                raise data_files.DataFormatError(
                    f"{example.source}: label {example.label!r} not in {labels}"
                )
            ids[i] = index[example.label]
    return ids


def convert_examples(examples, tokenizer, max_seq_length, labels):
    """Features of `examples` with a FullTokenizer, as the original convert_single_example.

    Returns arrays: input_ids, input_mask, segment_ids int32 [n, max_seq_length]; label_ids [n]
    (int32 ids, or float32 scores when `labels` is None); is_real_example int32 [n].
    """
    cls_id, sep_id = tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"]
    count = len(examples)
    input_ids = np.zeros((count, max_seq_length), np.int32)
    input_mask = np.zeros((count, max_seq_length), np.int32)
    segment_ids = np.zeros((count, max_seq_length), np.int32)
    for i, example in enumerate(examples):
        segments = [tokenizer.encode(example.text_a)]
        if example.text_b is not None:
            segments.append(tokenizer.encode(example.text_b))
        # A text_b with no tokens ("", "\u200b") makes a single-sentence example: the original tests
        # `if tokens_b:`, the tokens, not the text.
        input_ids[i], input_mask[i], segment_ids[i] = packing.pack_segments(
            segments, max_seq_length, cls_id, sep_id, drop_empty_b=True
        )
    return {
        "input_ids": input_ids,
        "input_mask": input_mask,
        "segment_ids": segment_ids,
        "label_ids": label_values(examples, labels),
        "is_real_example": np.ones(count, np.int32),
    }


def feature_spec(input_shape, is_regression=False):
    """The tf.io.parse_example spec of classification records (the original run_classifier schema);
    `input_shape` is the shape of one record's inputs, [max_seq_length]."""
    spec = {
        name: tf.io.FixedLenFeature(list(input_shape), tf.int64)
        for name in packing.MODEL_INPUT_NAMES
    }
    spec["label_ids"] = tf.io.FixedLenFeature([], tf.float32 if is_regression else tf.int64)
    spec["is_real_example"] = tf.io.FixedLenFeature([], tf.int64)
    return spec


def write_records(path, features):
    """Writes classification features to a TFRecord file atomically; returns the number of records."""
    return packing.write_records(path, features)


def compute_metrics(task, gold, predictions):
    """The task's metrics (accuracy, f1, mcc, pearson, spearman) from gold and predicted label ids or scores."""
    compute = {
        "accuracy": metrics.accuracy,
        "f1": metrics.f1_score,
        "mcc": metrics.matthews_corrcoef,
        "pearson": metrics.pearson,
        "spearman": metrics.spearman,
    }
    return {name: compute[name](gold, predictions) for name in task.metric_names}


def eval_prefix(split):
    """The prefix of an eval split's metrics: eval for dev; eval_matched / eval_mismatched for MNLI's
    two dev sets."""
    return "eval" if split == "dev" else "eval_" + split.replace("dev_", "")


def submission_file(task, split):
    """The GLUE submission file name of a test split (CoLA.tsv, MNLI-m.tsv, ...); tsv: <split>_predictions.tsv."""
    if task.submission_files and split in task.submission_files:
        return task.submission_files[split]
    return f"{split}_predictions.tsv"


def write_submission(output_dir, task, split, examples, predictions, labels):
    """Writes test predictions in the GLUE submission format (`index<TAB>prediction`, a header row).

    `predictions` are label ids (written as label names) or, for regression, scores. The index is
    the test file's own id column, in file order. Returns the path written.
    """
    if len(examples) != len(predictions):
        raise ValueError(f"{len(examples)} examples but {len(predictions)} predictions")
    lines = ["index\tprediction"]
    for position, (example, prediction) in enumerate(zip(examples, predictions)):
        index = example.guid if example.guid.isdigit() else str(position)
        value = f"{float(prediction):.3f}" if labels is None else labels[int(prediction)]
        lines.append(f"{index}\t{value}")
    path = os.path.join(output_dir, submission_file(task, split))
    io_utils.atomic_write_text(path, "\n".join(lines) + "\n")
    return path
