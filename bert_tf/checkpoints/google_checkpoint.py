"""Google's original TF1 BERT checkpoints: finding one, and reading its variables under their names."""

import os
import re

import tensorflow as tf

from bert_tf.model.model_dir import reading_checkpoint

# Optimizer slots and counters in checkpoints written by the original run_pretraining.py.
_IGNORED_GOOGLE_NAME = re.compile(r"(^|/)(adam_m|adam_v|global_step)$")


def resolve_google_checkpoint(path):
    """The checkpoint prefix for PATH: a prefix (`.../bert_model.ckpt`) or a directory holding one."""
    if tf.io.gfile.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest:
            return latest
        indexes = tf.io.gfile.glob(os.path.join(path, "*.index"))
        if len(indexes) == 1:
            return indexes[0][: -len(".index")]
        raise FileNotFoundError(
            f"{path}: expected exactly one checkpoint (*.index), found {len(indexes)}"
        )
    if path.endswith(".index") or ".data-" in path:
        path = (
            path[: path.rfind(".index")]
            if path.endswith(".index")
            else path[: path.rfind(".data-")]
        )
    if not tf.io.gfile.exists(path + ".index"):
        raise FileNotFoundError(f"no checkpoint at {path} ({path}.index does not exist)")
    return path


def read_google_checkpoint_shapes(prefix):
    """({original name: shape} without optimizer slots and counters, read(name) -> its array).

    A checkpoint whose files are cut short or damaged is a DamagedCheckpointError naming them,
    here or when `read` comes to the damage."""
    with reading_checkpoint(prefix):
        reader = tf.train.load_checkpoint(prefix)
    shapes = {
        name: tuple(shape)
        for name, shape in reader.get_variable_to_shape_map().items()
        if not _IGNORED_GOOGLE_NAME.search(name)
    }

    def read(name):
        with reading_checkpoint(prefix):
            return reader.get_tensor(name)

    return shapes, read
