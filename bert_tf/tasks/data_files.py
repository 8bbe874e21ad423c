"""Reading a task's data files: required examples, decoded lines, text pairs, format errors."""

import os

from bert_tf.runtime import io_utils


class DataFormatError(io_utils.UsageError):
    """An input file that breaks its format; the message names the file and line."""


# The flag whose job needs the examples of each split, for errors about an empty split.
SPLIT_FLAGS = {"train": "--do_train", "dev": "--do_eval", "test": "--do_predict"}


def run_splits(do_train, do_eval, do_predict, eval_splits=("dev",), test_splits=("test",)):
    """The splits a run reads, in order: train to train, the eval splits to evaluate, the test
    splits to predict."""
    return (
        (["train"] if do_train else [])
        + (list(eval_splits) if do_eval else [])
        + (list(test_splits) if do_predict else [])
    )


def dev_score(key, has_dev_scores, needs="--do_eval"):
    """`key`, the dev score that ranks restarts (--num_restarts), or a usage error naming what the
    run lacks to compute it."""
    if not has_dev_scores:
        raise io_utils.UsageError(f"--num_restarts keeps the run best on dev: it needs {needs}")
    return key


def require_examples(examples, path, split):
    """Returns `examples`; an empty train or eval split is a UsageError naming the file and flag.

    An empty training set would stop training at its first step and leave a model directory
    without a checkpoint; an empty eval set would report an accuracy of 0 over 0 examples.
    """
    if not len(examples) and not split.startswith("test"):
        flag = SPLIT_FLAGS.get(split.split("_")[0], "--do_eval")
        raise io_utils.UsageError(f"{flag}: {path} has no examples ({split} split)")
    return examples


def decoded_lines(path):
    """(line number, text without its line ending) for each line of `path` (.gz too); bad UTF-8 names the line."""
    with io_utils.open_text(path) as f:
        for line_number, raw in enumerate(f, start=1):
            try:
                yield line_number, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise DataFormatError(f"{path}:{line_number}: not UTF-8 ({e})") from None


def read_text_pairs(path, what="input"):
    """[(text_a, text_b or None)] for each line of `path`, blank lines included, as the original
    extract_features.py reads its input: a pair is split at the LAST " ||| ", spaces included."""
    io_utils.require_file(path, what)
    pairs = []
    for _, line in decoded_lines(path):
        line = line.strip()
        text_a, separator, text_b = line.rpartition(" ||| ")
        pairs.append((text_a, text_b) if separator else (line, None))
    return pairs


def split_path(data_dir, file_name):
    """DATA_DIR/FILE_NAME, required to exist (a missing split file is a UsageError naming it)."""
    return io_utils.require_file(os.path.join(data_dir, file_name), "split")
