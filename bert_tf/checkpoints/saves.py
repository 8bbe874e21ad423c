"""A training run's own saves: where a run resumes, the saves a diverged run marks suspect, and
what an interrupted or failed save leaves behind.

Checkpoints are written by a tf.train.CheckpointManager as OUTPUT_DIR/ckpt-N.* with the
`checkpoint` state file naming them (bert_tf.training.training_loop); a diverged run records the
checkpoints whose weights gave the failing loss in SUSPECT_FILE, and a rerun skips them.
"""

import json
import os
import re

import tensorflow as tf
from absl import logging

from bert_tf.model.model_dir import CHECKPOINT_NAME
from bert_tf.runtime import distribution, io_utils

# Written into the output directory when a run diverges: the checkpoints whose weights gave the
# failing loss, which a rerun skips (Trainer.restore_or_initialize).
SUSPECT_FILE = "suspect_checkpoints.json"


def remove_interrupted_saves(directory):
    """Deletes the `ckpt-N_temp/` directories of saves that were killed midway; returns their paths.

    TF writes a checkpoint into `<prefix>_temp/` and merges it into `<prefix>.index/.data-*` at the
    end, deleting the directory; a kill in between leaves it, and no later save removes it.
    """
    pattern = re.compile(re.escape(CHECKPOINT_NAME) + r"-\d+_temp")
    removed = []
    if not tf.io.gfile.isdir(directory):
        return removed
    for entry in sorted(tf.io.gfile.listdir(directory)):
        name = entry.rstrip("/")  # gs:// lists directories with a trailing slash.
        path = os.path.join(directory, name)
        if pattern.fullmatch(name) and tf.io.gfile.isdir(path):
            tf.io.gfile.rmtree(path)
            logging.warning("removed %s, left by a checkpoint save that was interrupted", path)
            removed.append(path)
    return removed


def clean_output_dir(output_dir):
    """The training jobs' cleanup before they write anything (cli.job_main's clean_output_dir):
    the chief removes what interrupted saves left, which can be what filled the disk. Other tasks
    leave the directory alone: a restarted worker must not remove a save the chief has under way."""
    if distribution.is_chief_task():
        remove_interrupted_saves(output_dir)


def remove_failed_save(directory, step):
    """Deletes what a save of `step` that raised wrote: its `_temp/` directory and, unless the
    `checkpoint` state names it, the merged files; returns the removed paths."""
    prefix = os.path.join(directory, f"{CHECKPOINT_NAME}-{step}")
    removed = []
    if tf.io.gfile.isdir(prefix + "_temp"):
        tf.io.gfile.rmtree(prefix + "_temp")
        removed.append(prefix + "_temp")
    if tf.train.latest_checkpoint(directory) != prefix:
        name = f"{CHECKPOINT_NAME}-{step}."  # listed, not globbed: the directory may hold [ or *
        for entry in tf.io.gfile.listdir(directory):
            if entry.startswith(name):
                tf.io.gfile.remove(os.path.join(directory, entry))
                removed.append(os.path.join(directory, entry))
    return removed


def _suspect_path(directory):
    return os.path.join(directory, SUSPECT_FILE)


def suspect_checkpoints(directory):
    """The names (ckpt-N) of the checkpoints of `directory` marked suspect by a diverged run."""
    path = _suspect_path(directory)
    if not tf.io.gfile.exists(path):
        return []
    with tf.io.gfile.GFile(path) as f:
        return list(json.load(f)["suspect"])


def mark_suspect(directory, prefixes, reason):
    """Records checkpoints (prefixes) whose weights gave a diverging loss, for reruns to skip."""
    names = sorted(set(suspect_checkpoints(directory)) | {os.path.basename(p) for p in prefixes})
    io_utils.atomic_write_json(_suspect_path(directory), {"suspect": names, "reason": reason})


def clear_suspect(directory, prefix):
    """A checkpoint saved anew is no longer suspect; the file goes once none is left."""
    names = suspect_checkpoints(directory)
    if os.path.basename(prefix) not in names:
        return
    names.remove(os.path.basename(prefix))
    if names:
        with tf.io.gfile.GFile(_suspect_path(directory)) as f:
            reason = json.load(f).get("reason", "")
        io_utils.atomic_write_json(_suspect_path(directory), {"suspect": names, "reason": reason})
    else:
        tf.io.gfile.remove(_suspect_path(directory))


def _checkpoint_step_of(name):
    """N of a checkpoint name or prefix ckpt-N."""
    return int(os.path.basename(name).rsplit("-", 1)[1])


def resume_point(directory, resume_from=""):
    """The checkpoint a run in `directory` resumes from, or None for a fresh start.

    `resume_from` ("ckpt-N") names one. Otherwise the newest checkpoint that a diverged run did not
    mark suspect (SUSPECT_FILE), with a warning when suspect ones are skipped. A directory holding
    checkpoints but no `checkpoint` index naming them is an error, never a fresh start (which would
    then delete them as it saves its own).
    """
    state = tf.train.get_checkpoint_state(directory) if tf.io.gfile.isdir(directory) else None
    listed = list(state.all_model_checkpoint_paths) if state else []
    on_disk = sorted(
        (
            os.path.join(directory, name[: -len(".index")])
            for name in (tf.io.gfile.listdir(directory) if tf.io.gfile.isdir(directory) else [])
            if re.fullmatch(re.escape(CHECKPOINT_NAME) + r"-\d+\.index", name)
        ),
        key=_checkpoint_step_of,
    )
    if resume_from:
        prefix = os.path.join(directory, resume_from)
        if not tf.io.gfile.exists(prefix + ".index"):
            found = ", ".join(os.path.basename(p) for p in on_disk) or "none"
            raise io_utils.UsageError(
                f"--resume_from={resume_from}: no such checkpoint in {directory} (it has: {found})"
            )
        return prefix
    if not listed:
        if on_disk:
            raise io_utils.UsageError(
                f"{directory} holds checkpoints ({', '.join(os.path.basename(p) for p in on_disk)}) "
                "but no valid `checkpoint` index naming them: give --resume_from=ckpt-N to resume, "
                "or a new --output_dir"
            )
        return None
    suspect = set(suspect_checkpoints(directory))
    healthy = [
        p for p in listed if os.path.basename(p) not in suspect and tf.io.gfile.exists(p + ".index")
    ]
    newest = listed[-1]
    if os.path.basename(newest) not in suspect:
        return newest
    if not healthy:
        raise io_utils.UsageError(
            f"every checkpoint in {directory} is marked suspect in {SUSPECT_FILE} (a diverged run): "
            "give --resume_from=ckpt-N to resume from one anyway, or a new --output_dir"
        )
    logging.warning(
        "resuming from %s, the last healthy checkpoint: %s gave a diverging loss (%s); "
        "--resume_from=ckpt-N picks another",
        healthy[-1],
        ", ".join(sorted(suspect)),
        _suspect_path(directory),
    )
    return healthy[-1]
