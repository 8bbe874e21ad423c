"""The custom training loop shared by pretraining and fine-tuning: any tf.distribute strategy, resumable.

One call of the loop function runs `steps_per_loop` steps inside one `tf.function` (`strategy.run`
in a `tf.range` loop), which is what TPUs need and what keeps the host out of the way on GPUs.
Each step, on every replica:

  1. the objective's loss denominators (e.g. the number of real masked positions) are all-reduced, so
     the loss each replica computes is its share of the exact GLOBAL mean;
  2. forward and backward (optionally XLA-compiled with jit_compile), with num_accumulation_steps
     in that many micro-batches one after another, whose gradients and statistics are summed;
  3. ONE all-reduce of the gradients together with the step's statistics (loss, accuracy sums);
  4. the summed gradients are clipped by their global norm (identical on every replica): the
     gradient of the global batch's loss, clipped as the original clips it on one GPU or CPU,
     where the word embedding's gradient is one row per token and its part of the norm is taken
     over those rows (norm_over_rows); on a multi-core TPU the original clips each core's
     gradient before summing them (see bert_tf.training.optimization);
  5. the update is applied only when the loss and the gradient norm are finite and the loss has
     not exploded (over `max_loss_ratio` times the mean loss of the run's earlier steps). A failed
     step is skipped, as is every later step of its loop, so the weights stay as they were, and
     its number is recorded: the host stops after the loop without saving, so no checkpoint is
     written after a diverged loss. With float16, non-finite gradients instead halve the loss
     scale (dynamic loss scaling).

Why not Keras `fit`: it fails under MultiWorkerMirroredStrategy with dict inputs (Keras 3.15).
Why not `keras.optimizers.LossScaleOptimizer` / `global_clipnorm`: in Keras 3.15 they check and
clip each replica's LOCAL gradients before the all-reduce, so a single replica's overflow can leak
into the summed update and the clip threshold depends on the replica count. Steps 3-5 do both on
the all-reduced gradients instead, and then run the (Keras) optimizer's `update_step` on every
device's copy of each variable in cross-replica context, so the gradients are reduced only once.

The loss and metrics come from the job's `objective.Objective`.

Checkpoints are `tf.train.Checkpoint(**objects, optimizer=, step=[, train_iterator=])` written by a
CheckpointManager with checkpoint_name "ckpt", which writes the data files first and then swaps
the `checkpoint` state file atomically: a kill at any moment leaves the previous checkpoint intact.
(A kill inside a save also leaves TF's `ckpt-N_temp/` directory; the next start removes it.)
Where the input iterator can be checkpointed (the default strategy: one CPU, GPU or host) it is saved
too, so a resumed run sees exactly the batches an uninterrupted run would have seen; elsewhere the
resumed run reshuffles with a seed shifted by the step (tf.distribute's iterators cannot be saved).

While training, SIGTERM (a preemption's notice) saves the step the loop in progress ends at and
raises io_utils.Preempted (bert_tf.training.preemption); in a cluster, a task that died or fell
silent for --lost_worker_timeout stops the others with a LostWorkerError naming it.
"""

import contextlib
import dataclasses
import math
import os
import re
import shutil
import tempfile
import time

import keras
import tensorflow as tf
from absl import logging
from tensorflow.core.framework import summary_pb2
from tensorflow.python.distribute import multi_worker_util

from bert_tf.checkpoints import saves
from bert_tf.model import model_dir, modeling
from bert_tf.model.model_dir import CHECKPOINT_NAME
from bert_tf.runtime import io_utils
from bert_tf.runtime.distribution import is_chief, is_multi_worker
from bert_tf.training import preemption

# --mixed_precision values and the Keras dtype policies they set.
MIXED_PRECISION_POLICIES = {
    "none": "float32",
    "bfloat16": "mixed_bfloat16",
    "float16": "mixed_float16",
}
INITIAL_LOSS_SCALE = 2.0**15
LOSS_SCALE_GROWTH_INTERVAL = 2000
# The training input's key in the checkpoints.
TRAIN_ITERATOR = "train_iterator"
# A healthy loss stays within a few times its running mean (pretraining starts near ln(vocab size)
# and only falls); a diverging one grows by orders of magnitude within a few steps.
DEFAULT_MAX_LOSS_RATIO = 100.0


class NonFiniteLossError(io_utils.JobFailure):
    """The loss or the gradients became NaN/Inf, or the loss exploded; nothing was saved after it.

    `last_checkpoint` is the newest checkpoint whose weights were seen to give a healthy loss (None
    when there is none); `suspect` are the newer ones, whose weights gave the failing loss.
    """

    def __init__(self, step, reason, last_checkpoint, last_checkpoint_step=None, suspect=()):
        self.step = step
        self.last_checkpoint = last_checkpoint
        self.suspect = list(suspect)
        if last_checkpoint:
            kept = (
                f"the last checkpoint saved with a finite, non-exploding loss is {last_checkpoint} "
                f"(step {last_checkpoint_step})"
            )
        else:
            kept = "no checkpoint saved with a finite, non-exploding loss exists"
        if self.suspect:
            # Saved after healthy steps, but the first step of the next loop ran on these weights.
            kept += (
                f"; {', '.join(self.suspect)} {'holds' if len(self.suspect) == 1 else 'hold'} the weights "
                f"that gave this loss, marked suspect in {saves.SUSPECT_FILE}: a rerun resumes from the last "
                "healthy checkpoint by itself (--resume_from=ckpt-N picks another)"
            )
        super().__init__(
            f"{reason}: training stopped without saving; {kept}. "
            "Lower --learning_rate, raise --num_warmup_steps, or check the input data."
        )


# What a collective or the coordination service raises in a task whose peer is gone.
_LOST_PEER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.AbortedError,
    tf.errors.DeadlineExceededError,
    tf.errors.CancelledError,
)
_TASK_NAME = re.compile(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)")


def lost_tasks(message, cluster_resolver):
    """The tasks other than this one that TensorFlow's error `message` names ("/job:worker/task:1");
    a failed heartbeat names none: the task lost is then the coordination service's leader."""
    message = message or ""
    if "CoordinationService/Heartbeat" in message and not _TASK_NAME.search(message):
        message = multi_worker_util.coordination_leader(cluster_resolver.cluster_spec())
    own = (cluster_resolver.task_type, str(cluster_resolver.task_id))
    named = {(job, task) for job, task in _TASK_NAME.findall(message)} - {own}
    return [f"/job:{job}/task:{task}" for job, task in sorted(named)]


class LostWorkerError(io_utils.JobFailure):
    """A task of the cluster died or fell silent; this one stopped, its checkpoints intact."""

    def __init__(self, tasks, step, last_checkpoint):
        lost = " and ".join(tasks) if tasks else "a task of the cluster"
        resume = last_checkpoint or "the start (no checkpoint was saved)"
        super().__init__(
            f"lost {lost} (it died, or was silent for --lost_worker_timeout): stopped at step "
            f"{step}; restart every worker with the same command to resume from {resume}"
        )


@dataclasses.dataclass
class LoopConfig:
    """How the loop runs: lengths, cadence, clipping, precision and compilation."""

    num_train_steps: int
    steps_per_loop: int = 100
    save_checkpoints_steps: int = 1000
    clip_norm: float = 1.0
    loss_scaling: bool = False  # float16: dynamic loss scaling.
    jit_compile: bool = False
    max_checkpoints_to_keep: int = 5
    checkpoint_iterator: bool = (
        True  # When the iterator is checkpointable (see restore_or_initialize).
    )
    max_loss_ratio: float = (
        DEFAULT_MAX_LOSS_RATIO  # A step's loss above this times the running mean fails; 0: off.
    )
    # A checkpoint of the output directory to resume from ("ckpt-N"), instead of the newest
    # healthy one.
    resume_from: str = ""
    # Each replica's batch is split into this many micro-batches, whose gradients are summed
    # before the one update: a large batch in the memory of a small one.
    num_accumulation_steps: int = 1
    # The exit code a preempted run's CLI ends with (io_utils.Preempted).
    preempted_exit_code: int = 0


# TensorBoard's scalar plugin metadata. Writing with tf.summary.write and this metadata is what
# tf.summary.scalar does, minus its import of the tensorboard package, which viewing needs but
# training should not.
_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
    data_class=summary_pb2.DATA_CLASS_SCALAR,
)


def norm_over_rows(variable, strategy):
    """Whether the clip norm takes `variable`'s gradient over its rows, when it comes as rows.

    The original clips with tf.clip_by_global_norm, which takes an IndexedSlices' norm over its
    rows as they are (one per token, repeats not summed), not over the table they sum to. Its word
    embedding's gradient is such rows on a GPU or CPU (a tf.gather) and a dense table on a TPU (a
    one-hot matmul); its segment embedding's is always dense (a one-hot matmul), and so is the word
    embedding's in pretraining, where the table is also the MLM output layer.
    """
    return variable.path.endswith(f"{modeling.WORD_EMBEDDING_LAYER}/embeddings") and not isinstance(
        strategy, tf.distribute.TPUStrategy
    )


def norm_group(path):
    """The part of the model a variable belongs to, for the gradient norms logged per part:
    "embeddings", "transformer_layer_<i>", or "head" (the pooler and every head)."""
    top = path.split("/", 1)[0]
    if re.fullmatch(r"transformer_layer_\d+", top):
        return top
    return "embeddings" if "embedding" in top else "head"


def norm_group_order(group):
    """A norm group's place in the model: the embeddings, the layers bottom up, the heads."""
    if group == "embeddings":
        return (0, 0)
    if group == "head":
        return (2, 0)
    return (1, int(group.rpartition("_")[2]))


def half_squared_norm(tensor):
    """sum(tensor ** 2) / 2 in float32 (tf.nn.l2_loss), the term tf.linalg.global_norm adds up."""
    return tf.nn.l2_loss(tf.cast(tensor, tf.float32))


def write_scalar(name, value, step):
    """Writes one TensorBoard scalar to the default summary writer."""
    tf.summary.write(name, tf.constant(value, tf.float32), step=step, metadata=_SCALAR_METADATA)


def is_checkpointable(obj):
    """Whether tf.train.Checkpoint can save `obj` (a tf.data iterator can; a DistributedIterator cannot)."""
    try:
        tf.train.Checkpoint(obj=obj)
    except ValueError:
        return False
    return True


def check_accumulation(
    global_batch_size, num_replicas, num_accumulation_steps, flag="--num_accumulation_steps"
):
    """A usage error, naming `flag`, unless the micro-batches split every replica's batch evenly."""
    if num_accumulation_steps < 1:
        raise io_utils.UsageError(f"{flag} must be positive, got {num_accumulation_steps}")
    per_replica = global_batch_size // max(num_replicas, 1)
    if per_replica % num_accumulation_steps:
        raise io_utils.UsageError(
            f"{flag}={num_accumulation_steps} does not divide the batch per replica, "
            f"{per_replica} (--train_batch_size={global_batch_size} over {num_replicas} "
            f"replica{'s' if num_replicas != 1 else ''})"
        )


def split_micro_batches(batch, num_micro_batches):
    """Every tensor of `batch` reshaped to [num_micro_batches, rows // num_micro_batches, ...]."""

    def split(tensor):
        inner = [
            size if size is not None else tf.shape(tensor)[axis + 1]
            for axis, size in enumerate(tensor.shape[1:])
        ]
        return tf.reshape(tensor, [num_micro_batches, -1] + inner)

    return tf.nest.map_structure(split, batch)


def format_duration(seconds):
    """Seconds as 1h02m / 3m05s / 12s for the progress line."""
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class Trainer:
    """Runs an Objective under a strategy: train with checkpoints, summaries and progress; evaluate."""

    def __init__(
        self,
        strategy,
        objective,
        optimizer,
        checkpoint_objects,
        output_dir,
        config,
        global_batch_size,
    ):
        self.strategy = strategy
        self.objective = objective
        self.optimizer = optimizer
        self.config = config
        self.output_dir = output_dir
        self.global_batch_size = global_batch_size
        self.is_chief = is_chief(strategy)
        self._multi_worker = is_multi_worker(strategy)
        check_accumulation(
            global_batch_size, strategy.num_replicas_in_sync, config.num_accumulation_steps
        )
        self._variables = list(objective.model.trainable_variables)
        self._norm_over_rows = [norm_over_rows(variable, strategy) for variable in self._variables]
        groups = [norm_group(variable.path) for variable in self._variables]
        self.norm_groups = sorted(set(groups), key=norm_group_order)
        self._group_of_variable = [self.norm_groups.index(group) for group in groups]
        with strategy.scope():
            # Slots are created now, under the strategy, so that restoring fills them immediately.
            optimizer.build(self._variables)
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
            num_stats = len(objective.stat_names)
            self._stat_sums = tf.Variable(tf.zeros([num_stats]), trainable=False, name="stat_sums")
            # Over a loop's updates: the global gradient norm, each part's, and the updates.
            self._norm_sums = tf.Variable(
                tf.zeros([len(self.norm_groups) + 2]), trainable=False, name="norm_sums"
            )
            self._first_bad_step = tf.Variable(
                -1, dtype=tf.int64, trainable=False, name="first_bad_step"
            )
            self._first_bad_loss = tf.Variable(0.0, trainable=False, name="first_bad_loss")
            # The mean loss of the run's accepted steps, the yardstick of an exploding loss. It is
            # checkpointed, so a run resumed from diverged weights is measured against the healthy past.
            self.mean_loss = tf.Variable(0.0, trainable=False, name="mean_loss")
            self._mean_loss_steps = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="mean_loss_steps"
            )
            self.loss_scale = tf.Variable(
                INITIAL_LOSS_SCALE if config.loss_scaling else 1.0,
                trainable=False,
                name="loss_scale",
            )
            self._good_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="good_steps")
        self._checkpoint_objects = dict(
            checkpoint_objects,
            optimizer=optimizer,
            step=self.step,
            mean_loss=self.mean_loss,
            mean_loss_steps=self._mean_loss_steps,
        )
        # Keras keeps dropout's random state in seed-generator variables that the model's object
        # graph does not save; saving them makes a resumed run draw the same dropout masks.
        rng_states = [
            v.value for v in objective.model.non_trainable_variables if "seed_generator" in v.path
        ]
        if rng_states:
            self._checkpoint_objects["dropout_rng_states"] = rng_states
        if config.loss_scaling:
            self._checkpoint_objects["loss_scale"] = self.loss_scale
        self._compute = (
            tf.function(self._forward_backward, jit_compile=True)
            if config.jit_compile
            else self._forward_backward
        )
        self._train_loop = tf.function(self._train_loop_fn)
        self._eval_loop = tf.function(self._eval_loop_fn)
        self._agree = tf.function(self._sum_over_workers)
        self._manager = None
        self._scratch_dir = None
        self._saved_step = None

    # ------------------------------------------------------------------------------------------
    # Checkpoints
    # ------------------------------------------------------------------------------------------

    def _checkpoint_dir(self):
        """The chief writes into output_dir; other workers into a scratch dir (they must save too)."""
        if self.is_chief:
            return self.output_dir
        if self._scratch_dir is None:
            self._scratch_dir = tempfile.mkdtemp(prefix="bert_tf_worker_ckpt_")
        return self._scratch_dir

    def _track(self, train_iterator, iterator_name):
        """The checkpoint of the run's objects, with `train_iterator` under `iterator_name` when it
        can be saved, and its CheckpointManager."""
        objects = dict(self._checkpoint_objects)
        if (
            train_iterator is not None
            and self.config.checkpoint_iterator
            and is_checkpointable(train_iterator)
        ):
            objects[iterator_name] = train_iterator
        self._checkpoint = tf.train.Checkpoint(**objects)
        self._manager = tf.train.CheckpointManager(
            self._checkpoint,
            self._checkpoint_dir(),
            max_to_keep=self.config.max_checkpoints_to_keep,
            checkpoint_name=CHECKPOINT_NAME,
        )

    def restore_or_initialize(self, train_iterator=None, iterator_name=TRAIN_ITERATOR):
        """Resumes everything from the newest checkpoint in output_dir; returns its path or None.

        The input iterator is checkpointed too when it can be (the default strategy's iterator can;
        tf.distribute's DistributedIterator cannot), which makes a resumed run see the same batches.
        `iterator_name` is its key in the checkpoint: an input that changes mid-run (pretraining's
        phase 2) takes another, so that a checkpoint of the old input never restores into the new.
        The chief first removes what interrupted saves left in output_dir (remove_interrupted_saves).
        """
        if self.is_chief:
            saves.remove_interrupted_saves(self.output_dir)
        self._track(train_iterator, iterator_name)
        latest = saves.resume_point(self.output_dir, self.config.resume_from)
        if latest:
            # Every worker restores from the chief's directory.
            # Partial: a checkpoint written under another strategy may lack (or have) the iterator.
            self._checkpoint.restore(latest).expect_partial().assert_nontrivial_match()
            logging.info("resumed from %s at step %d", latest, int(self.step.numpy()))
        return latest

    def replace_train_iterator(self, train_iterator, iterator_name, num_accumulation_steps):
        """Goes on with another input (under its own checkpoint key) split into
        `num_accumulation_steps` micro-batches (checked by the caller, who knows its flag); the
        weights and the optimizer stay as they are."""
        self.config.num_accumulation_steps = num_accumulation_steps
        # A fresh trace: inputs of the old shapes would otherwise reuse the old micro-batch count.
        self._train_loop = tf.function(self._train_loop_fn)
        self._track(train_iterator, iterator_name)

    def save(self):
        """Writes a checkpoint numbered by the step (every worker saves; only the chief's is kept).

        A full disk removes what the save wrote (a half-written checkpoint would hold the space the
        rerun needs) and stops the run with a JobFailure naming the file and the resume point."""
        step = int(self.step.numpy())
        try:
            path = self._manager.save(checkpoint_number=step)
        except (OSError, tf.errors.OpError) as e:
            message = io_utils.full_disk_message(e)
            if message is None:
                raise
            directory = self._checkpoint_dir()
            for removed in saves.remove_failed_save(directory, step):
                logging.warning("removed %s, written by the failed save", removed)
            # The chief's checkpoints are the run's (another task saves to a scratch directory).
            resume = tf.train.latest_checkpoint(self.output_dir) or "the start"
            raise io_utils.JobFailure(
                f"the checkpoint of step {step} was not saved, {message}: free some space and "
                f"rerun, which resumes from {resume}"
            ) from e
        self._saved_step = step
        if self.is_chief:
            saves.clear_suspect(self.output_dir, path)
            return path
        # The scratch copy is of no use: empty the folder; the next save makes it again.
        shutil.rmtree(self._scratch_dir, ignore_errors=True)
        self._manager = tf.train.CheckpointManager(
            self._checkpoint, self._scratch_dir, max_to_keep=1, checkpoint_name=CHECKPOINT_NAME
        )
        return None

    def _remove_scratch_dir(self):
        """Removes a non-chief task's scratch folder (the chief has none)."""
        if self._scratch_dir is not None:
            shutil.rmtree(self._scratch_dir, ignore_errors=True)

    # ------------------------------------------------------------------------------------------
    # The step (replica context) and the loops (tf.functions)
    # ------------------------------------------------------------------------------------------

    def _stats_vector(self, loss, stats):
        """The objective's stats (with the loss) as one float32 vector in stat_names order, for one all-reduce."""
        stats = dict(stats, loss=loss)
        return tf.stack([tf.cast(stats[name], tf.float32) for name in self.objective.stat_names])

    def _forward_backward(self, batch, denominators, loss_scale):
        """Per replica: dense gradients in variable order, the stats vector, and the row norms.

        The row norms are two vectors over the variables: the half squared norm (l2_loss) of the
        gradient's rows where the clip norm is taken over rows (norm_over_rows) and the gradient
        came as rows, and 1 where it did (0 elsewhere). Summed over replicas, the first is the
        norm of all the global batch's rows, as one GPU running the original would take it.
        The gradients themselves go to the all-reduce dense: MirroredStrategy's
        all-reduce takes IndexedSlices by another path ("Efficient allreduce is not supported"
        in cross_device_ops.py), which copies every replica's rows around.
        """
        with tf.GradientTape() as tape:
            loss, stats = self.objective.loss_and_stats(batch, denominators, training=True)
            scaled_loss = loss * loss_scale if self.config.loss_scaling else loss
        grads = tape.gradient(scaled_loss, self._variables)
        row_half_squares, by_rows = [], []
        for grad, over_rows in zip(grads, self._norm_over_rows):
            rows = over_rows and isinstance(grad, tf.IndexedSlices)
            half_square = half_squared_norm(grad.values) if rows else 0.0
            row_half_squares.append(half_square)
            by_rows.append(1.0 if rows else 0.0)
        grads = [
            tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
            for g, v in zip(grads, self._variables)
        ]
        row_norms = [tf.stack(row_half_squares), tf.constant(by_rows)]
        return grads, self._stats_vector(loss, stats), row_norms

    def _accumulate(self, batch, denominators, loss_scale):
        """`_forward_backward` summed over the batch's micro-batches (num_accumulation_steps).

        Every micro-batch's loss is its share of the GLOBAL batch's loss (the denominators are the
        whole batch's), so the sums are the whole batch's gradients, stats and row norms: the
        update, clip and divergence checks that follow see one large batch, exactly.
        """
        count = self.config.num_accumulation_steps
        if count == 1:
            return self._compute(batch, denominators, loss_scale)
        micro_batches = split_micro_batches(batch, count)

        def add_micro_batch(index, grads, stats, row_half_squares, by_rows):
            micro_batch = tf.nest.map_structure(lambda tensor: tensor[index], micro_batches)
            more_grads, more_stats, (more_rows, by_rows) = self._compute(
                micro_batch, denominators, loss_scale
            )
            return (
                index + 1,
                [g + more for g, more in zip(grads, more_grads)],
                stats + more_stats,
                row_half_squares + more_rows,
                by_rows,
            )

        num_variables = len(self._variables)
        # A graph loop, not a Python one: the graph holds one micro-batch's step for any count.
        # One iteration at a time, so that only one micro-batch's activations are ever alive.
        _, grads, stats, row_half_squares, by_rows = tf.while_loop(
            lambda index, *_: index < count,
            add_micro_batch,
            (
                tf.constant(0),
                [tf.zeros_like(v) for v in self._variables],
                tf.zeros([len(self.objective.stat_names)]),
                tf.zeros([num_variables]),
                tf.zeros([num_variables]),
            ),
            parallel_iterations=1,
        )
        return grads, stats, (row_half_squares, by_rows)

    def _gradient_norms(self, grads, row_half_squares, by_rows):
        """[global norm, each norm group's norm] of the summed gradients, each variable's part
        over its rows where the original takes it so; the same arithmetic as
        tf.linalg.global_norm (sqrt(2 sum l2_loss))."""
        half_squares = []
        for index, (grad, over_rows) in enumerate(zip(grads, self._norm_over_rows)):
            if over_rows:  # a cond, so that a table measured by its rows is not read again
                half_squares.append(
                    tf.cond(
                        by_rows[index] > 0,
                        lambda index=index: row_half_squares[index],
                        lambda grad=grad: half_squared_norm(grad),
                    )
                )
            else:
                half_squares.append(half_squared_norm(grad))
        half_squares = tf.stack(half_squares)
        per_group = tf.math.unsorted_segment_sum(
            half_squares, self._group_of_variable, len(self.norm_groups)
        )
        return tf.sqrt(2.0 * tf.concat([[tf.reduce_sum(half_squares)], per_group], 0))

    # The loops need AutoGraph (tf.range, break); the steps do not, and converting the model's and
    # the optimizer's code on every trace took 1.4 to 3.3 s of the 13 s that the first loop of a
    # MiniLM fine-tuning spent tracing and compiling.
    @tf.autograph.experimental.do_not_convert
    def _replica_train_step(self, batch):
        """One step on one replica; the update happens in cross-replica context via merge_call."""
        context = tf.distribute.get_replica_context()
        denominators = context.all_reduce(
            tf.distribute.ReduceOp.SUM, self.objective.denominators(batch)
        )
        loss_scale = tf.convert_to_tensor(self.loss_scale)
        grads, stats, (row_half_squares, by_rows) = self._accumulate(
            batch, denominators, loss_scale
        )
        # by_rows is the same constant on every replica: only the sums need the all-reduce.
        reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, grads + [stats, row_half_squares])
        grads, (stats, row_half_squares) = reduced[:-2], reduced[-2:]
        if self.config.loss_scaling:
            grads = [g / loss_scale for g in grads]
            row_half_squares /= tf.square(loss_scale)
        norms = self._gradient_norms(grads, row_half_squares, by_rows)
        global_norm = norms[0]
        if self.config.clip_norm and self.config.clip_norm > 0:
            grads, _ = tf.clip_by_global_norm(grads, self.config.clip_norm, use_norm=global_norm)
        grads_finite = tf.math.is_finite(global_norm)
        context.merge_call(self._apply_update, args=(grads, stats, grads_finite, norms))

    def learning_rate(self):
        """The schedule's rate at the run's step. Keras' optimizer reads it at its update count,
        which a skipped float16 step does not advance: the step keeps the schedule in line with
        the steps taken (and with pretraining's phases, which the step counts)."""
        schedule = self.optimizer._learning_rate
        if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
            return schedule(self.step)
        return self.optimizer.learning_rate

    def _loss_ok(self, loss):
        """Whether a step's (global) loss is finite and not over max_loss_ratio times the running mean."""
        ok = tf.math.is_finite(loss)
        if self.config.max_loss_ratio:
            exploded = (self._mean_loss_steps > 0) & (
                loss > self.config.max_loss_ratio * self.mean_loss
            )
            ok = ok & tf.logical_not(exploded)
        return ok

    def _apply_update(self, strategy, grads, stats, grads_finite, norms):
        """Cross-replica: apply the (already summed) gradients if the step is healthy; bookkeeping
        otherwise. `norms` (the gradient norms, before clipping) are summed for the log when the
        update is applied."""
        # These were computed from all-reduced values, so every replica holds the same ones.
        loss = strategy.experimental_local_results(stats)[0][0]
        grads_finite = strategy.experimental_local_results(grads_finite)[0]
        # After a failure the loop's remaining steps change nothing: the run stops after the loop.
        loss_ok = self._loss_ok(loss) & (self._first_bad_step < 0)
        ok = loss_ok & grads_finite

        def apply():
            # What Keras' own TF optimizer does after ITS all-reduce: update_step per variable, on
            # each device's copy. Called directly because optimizer.apply() would all-reduce again.
            # (So only update_step runs: no Keras-side clipping, EMA or base weight decay; ours need none.)
            learning_rate = self.learning_rate()

            def update(variable, grad):
                return self.optimizer.update_step(grad, variable, learning_rate)

            for grad, variable in zip(grads, self._variables):
                strategy.extended.update(variable.value, update, args=(grad,), group=False)
            self.optimizer.iterations.assign_add(1)
            return tf.constant(True)

        tf.cond(ok, apply, lambda: tf.constant(False))
        applied = tf.concat([strategy.experimental_local_results(norms)[0], [1.0]], 0)
        strategy.extended.update(
            self._norm_sums,
            lambda var, value: var.assign_add(value),
            args=(tf.where(ok, applied, tf.zeros_like(applied)),),
            group=False,
        )
        step = self.step + 1
        failed = tf.logical_not(loss_ok) if self.config.loss_scaling else tf.logical_not(ok)
        first_failure = failed & (self._first_bad_step < 0)
        self._first_bad_step.assign(tf.where(first_failure, step, self._first_bad_step))
        self._first_bad_loss.assign(tf.where(first_failure, loss, self._first_bad_loss))
        # A healthy loss joins the running mean (a float16 overflow only skipped the update).
        count = self._mean_loss_steps + tf.cast(loss_ok, tf.int64)
        self.mean_loss.assign(
            tf.where(
                loss_ok,
                self.mean_loss + (loss - self.mean_loss) / tf.cast(count, tf.float32),
                self.mean_loss,
            )
        )
        self._mean_loss_steps.assign(count)
        if self.config.loss_scaling:
            self._update_loss_scale(grads_finite)
        strategy.extended.update(
            self._stat_sums, lambda var, value: var.assign_add(value), args=(stats,), group=False
        )
        self.step.assign(step)

    def _update_loss_scale(self, grads_finite):
        """Dynamic loss scaling: halve on overflow, double after LOSS_SCALE_GROWTH_INTERVAL good steps."""
        good = tf.where(grads_finite, self._good_steps + 1, 0)
        grow = good >= LOSS_SCALE_GROWTH_INTERVAL
        scale = tf.where(
            grads_finite,
            tf.where(grow, self.loss_scale * 2.0, self.loss_scale),
            tf.maximum(self.loss_scale / 2.0, 1.0),
        )
        self.loss_scale.assign(scale)
        self._good_steps.assign(tf.where(grow, tf.zeros_like(good), good))

    def _train_loop_fn(self, iterator, num_steps):
        """`num_steps` training steps in one tf.function call."""
        for _ in tf.range(num_steps):
            self.strategy.run(self._replica_train_step, args=(next(iterator),))

    @tf.autograph.experimental.do_not_convert
    def _replica_eval_step(self, batch):
        """One evaluation step on one replica: the stats vector, summed over replicas."""
        context = tf.distribute.get_replica_context()
        denominators = context.all_reduce(
            tf.distribute.ReduceOp.SUM, self.objective.denominators(batch)
        )
        loss, stats = self.objective.loss_and_stats(batch, denominators, training=False)
        return context.all_reduce(tf.distribute.ReduceOp.SUM, self._stats_vector(loss, stats))

    def _eval_loop_fn(self, iterator, max_steps):
        """Up to `max_steps` eval steps, stopping early when the data runs out: (sums, steps run)."""
        sums = tf.zeros([len(self.objective.stat_names)])
        steps = tf.constant(0)
        for _ in tf.range(max_steps):
            batch = iterator.get_next_as_optional()
            if not batch.has_value():
                break
            per_replica = self.strategy.run(self._replica_eval_step, args=(batch.get_value(),))
            sums += self.strategy.experimental_local_results(per_replica)[0]
            steps += 1
        return sums, steps

    # ------------------------------------------------------------------------------------------
    # Host side
    # ------------------------------------------------------------------------------------------

    def train(self, iterator, log_fn=print, until_step=None):
        """Trains until config.num_train_steps (or `until_step`, if sooner) and saves there; returns the
        final metrics. Raises NonFiniteLossError."""
        if not isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            # A Python iterator would be consumed once, while tracing, and replay that batch forever.
            raise TypeError(
                f"train() needs a tf.data or tf.distribute iterator, got {type(iterator).__name__}"
            )
        if self._manager is None:
            raise RuntimeError(
                "call restore_or_initialize() before train(): it sets up the checkpoints"
            )
        config = self.config
        writer = (
            tf.summary.create_file_writer(os.path.join(self.output_dir, "train"))
            if self.is_chief
            else tf.summary.create_noop_writer()
        )
        step = int(self.step.numpy())
        metrics = {}
        steady_rate = None
        last_step = min(until_step or config.num_train_steps, config.num_train_steps)
        with preemption.sigterm_notice() as notice, self._naming_lost_workers():
            while step < last_step:
                step, metrics, steady_rate = self._train_one_loop(
                    iterator, step, last_step, steady_rate, writer, log_fn
                )
                if step < last_step and self._any_worker_noticed(notice):
                    raise self._preempted(step)
        self._remove_scratch_dir()
        writer.flush()
        return metrics

    def _train_one_loop(self, iterator, step, last_step, steady_rate, writer, log_fn):
        """Runs the steps up to the next save, progress line or `last_step`, then logs and saves as
        due; returns (step, metrics, steady_rate)."""
        config = self.config
        next_save = (step // config.save_checkpoints_steps + 1) * config.save_checkpoints_steps
        num_steps = min(config.steps_per_loop, last_step - step, next_save - step)
        self._stat_sums.assign(tf.zeros_like(self._stat_sums))
        self._norm_sums.assign(tf.zeros_like(self._norm_sums))
        start = time.perf_counter()
        self._train_loop(iterator, tf.constant(num_steps, tf.int32))
        sums = self._stat_sums.numpy()  # Reading waits for the loop to finish.
        elapsed = time.perf_counter() - start
        bad_step = int(self._first_bad_step.numpy())
        if bad_step >= 0 or not all(math.isfinite(s) for s in sums):
            raise self._failure(bad_step, step, num_steps)
        step = int(self.step.numpy())
        learning_rate = float(tf.convert_to_tensor(self.learning_rate()))  # The value at `step`.
        metrics = self.objective.metrics(dict(zip(self.objective.stat_names, sums)), num_steps)
        steps_per_second = num_steps / elapsed
        examples_per_second = steps_per_second * self.global_batch_size
        # The first loop includes tracing and compilation: keep it out of the ETA when possible.
        if steady_rate is None or step - num_steps > 0:
            steady_rate = steps_per_second
        eta = (config.num_train_steps - step) / steady_rate if steady_rate > 0 else float("inf")
        scalars = dict(
            metrics,
            learning_rate=learning_rate,
            steps_per_second=steps_per_second,
            examples_per_second=examples_per_second,
        )
        if config.loss_scaling:
            scalars["loss_scale"] = float(self.loss_scale.numpy())
        norms = self.mean_gradient_norms()
        scalars.update(norms)
        with writer.as_default():
            for name, value in scalars.items():
                write_scalar(name, value, step)
        if self.is_chief:
            extra = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k != "loss")
            log_fn(
                f"step {step}/{config.num_train_steps}  loss {metrics['loss']:.4f}  {extra}  "
                f"lr {learning_rate:.3g}  grad_norm {norms['gradient_norm']:.3g}  "
                f"{examples_per_second:.1f} examples/s  "
                f"{steps_per_second:.2f} steps/s  ETA {format_duration(eta)}"
            )
        if step % config.save_checkpoints_steps == 0 or step >= last_step:
            self.save()
        return step, metrics, steady_rate

    def mean_gradient_norms(self):
        """{"gradient_norm": the global norm, "gradient_norm/<part>": each part's (norm_groups)},
        before clipping, averaged over the last loop's applied updates (NaN without one)."""
        *sums, updates = self._norm_sums.numpy().tolist()
        means = [value / updates if updates else math.nan for value in sums]
        names = ["gradient_norm"] + [f"gradient_norm/{group}" for group in self.norm_groups]
        return {name: float(value) for name, value in zip(names, means)}

    def _sum_over_workers(self, value):
        """`value` summed over every replica of the strategy (a tf.function: one all-reduce)."""
        per_replica = self.strategy.run(tf.identity, args=(value,))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def _any_worker_noticed(self, notice):
        """Whether any task got SIGTERM; every task of a cluster gets the same answer."""
        if not self._multi_worker:
            return notice.received
        return float(self._agree(tf.constant(1.0 if notice.received else 0.0))) > 0

    def _preempted(self, step):
        """Saves the checkpoint of `step` unless it was just saved; the Preempted that stops the run."""
        if self._saved_step != step:
            self.save()
        self._remove_scratch_dir()
        checkpoint = os.path.join(self.output_dir, f"{CHECKPOINT_NAME}-{step}")
        return io_utils.Preempted(
            f"SIGTERM: saved {checkpoint} and stopped at step {step}/{self.config.num_train_steps}; "
            "run the same command again (on every worker) to resume from it",
            self.config.preempted_exit_code,
        )

    @contextlib.contextmanager
    def _naming_lost_workers(self):
        """In a cluster, turns the errors of a lost task (its collectives aborted, or its heartbeat
        gone) into a JobFailure naming it and the checkpoint to resume from."""
        try:
            yield
        except _LOST_PEER_ERRORS as e:
            if not self._multi_worker:
                raise
            self._remove_scratch_dir()
            raise LostWorkerError(
                lost_tasks(e.message, self.strategy.cluster_resolver),
                int(self.step.numpy()),
                tf.train.latest_checkpoint(self.output_dir),
            ) from e

    def _failure(self, bad_step, loop_start, num_steps):
        """The NonFiniteLossError for a loop that failed at `bad_step` (-1: somewhere in the loop)."""
        if bad_step < 0:
            # Only the loop's sums were non-finite: any of its steps may be the first bad one.
            first_suspect = loop_start + 1
            reason = f"non-finite (NaN or Inf) metrics in steps {first_suspect}..{loop_start + num_steps}"
        else:
            loss, mean = float(self._first_bad_loss.numpy()), float(self.mean_loss.numpy())
            first_suspect = bad_step
            if not math.isfinite(loss):
                reason = f"non-finite (NaN or Inf) loss at step {bad_step}"
            elif self.config.max_loss_ratio and loss > self.config.max_loss_ratio * mean:
                reason = (
                    f"loss {loss:.3g} at step {bad_step} is over {self.config.max_loss_ratio:g} times the mean "
                    f"loss of the earlier steps ({mean:.3g}; --max_loss_ratio)"
                )
            else:
                reason = f"non-finite (NaN or Inf) gradients at step {bad_step}"
        # A checkpoint of step C holds the weights that step C + 1 ran on: it is healthy only if C + 1
        # came before the failure. The one saved just before the failing step is not.
        healthy, healthy_step, suspect = None, None, []
        state = tf.train.get_checkpoint_state(self.output_dir)
        for path in reversed(list(state.all_model_checkpoint_paths) if state else []):
            if not tf.io.gfile.exists(path + ".index"):
                continue
            saved_step = model_dir.checkpoint_step(path)
            if saved_step + 1 < first_suspect:
                healthy, healthy_step = path, saved_step
                break
            suspect.append(path)
        if suspect and self.is_chief:
            saves.mark_suspect(self.output_dir, suspect, reason)
        return NonFiniteLossError(
            bad_step if bad_step >= 0 else first_suspect,
            reason,
            healthy,
            healthy_step,
            reversed(suspect),
        )

    def evaluate(self, iterator, max_steps):
        """Runs up to `max_steps` eval steps; returns {metric: value} with the number of steps."""
        with self._naming_lost_workers():
            sums, steps = self._eval_loop(iterator, tf.constant(max_steps, tf.int32))
            steps = int(steps.numpy())
        if steps == 0:
            raise io_utils.UsageError(
                "the evaluation data yields no full batch: lower --eval_batch_size"
            )
        return self.objective.metrics(
            dict(zip(self.objective.stat_names, sums.numpy())), steps
        ), steps


def write_eval_results(path, results):
    """Writes `key = value` lines, sorted, as the original run_pretraining.py's eval_results.txt."""
    io_utils.atomic_write_text(
        path, "".join(f"{key} = {results[key]}\n" for key in sorted(results))
    )


def write_summaries(log_dir, step, values):
    """Writes scalar summaries for TensorBoard at `step`."""
    writer = tf.summary.create_file_writer(log_dir)
    with writer.as_default():
        for name, value in values.items():
            write_scalar(name, value, step)
    writer.flush()
