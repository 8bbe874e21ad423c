"""The training loop's flags: LoopArgs, which every training job's arguments extend.

Pretraining's arguments (bert_tf.pretraining.job) extend it directly; the fine-tuning CLIs through
training_flags.FinetuneArgs. `loop_config` turns them into the loop's LoopConfig.
"""

import dataclasses

from bert_tf.runtime import distribution, io_utils
from bert_tf.runtime.cli import arg
from bert_tf.training import optimization, training_loop


@dataclasses.dataclass
class LoopArgs:
    """The training-loop settings every training CLI takes (their flags come from these fields)."""

    optimizer: str = arg(
        "adamw",
        "adamw: the original AdamWeightDecay; lamb: LAMB, for large batches.",
        choices=optimization.OPTIMIZERS,
    )
    # None: the original's; set, it applies to adamw only (validate refuses it with LAMB).
    adam_bias_correction: bool = arg(
        None,
        "AdamW with bias correction (standard AdamW, as torch.optim.AdamW has it) instead of the "
        "original BERT's AdamWeightDecay, which omits it. Default: false, the original's (across "
        "seeds it did not fine-tune better: benchmarks/RESULTS.md).",
    )
    adam_epsilon: float = arg(
        None, f"Adam's epsilon. Default: {optimization.DEFAULT_EPSILON:g}, the original's."
    )
    weight_decay: float = arg(0.01, "Decoupled weight decay (LayerNorm and biases excluded).")
    lr_decay_power: float = arg(
        optimization.DEFAULT_DECAY_POWER,
        "The power of the learning rate's decay after warm-up, lr * (1 - step / steps) ** power: "
        "1 is the original's linear decay, 0.5 NVIDIA's with LAMB (DeepLearningExamples), 0 holds "
        "the rate at its peak after the warm-up (PyTorch's Adam with no scheduler).",
    )
    clip_norm: float = arg(1.0, "Clip the summed gradients to this global norm (0: off).")
    num_accumulation_steps: int = arg(
        1,
        "Gradient accumulation: each replica's share of --train_batch_size is split into this many "
        "micro-batches, run one after another, whose gradients are summed into one update (the "
        "batch stays --train_batch_size; memory is that of a micro-batch). It must divide the "
        "batch per replica.",
    )
    steps_per_loop: int = arg(
        100, "Training steps inside one tf.function call (one progress line and summary per loop)."
    )
    save_checkpoints_steps: int = arg(1000, "How often to save a checkpoint.")
    keep_checkpoint_max: int = arg(5, "How many checkpoints to keep.")
    strategy: str = arg("default", "The tf.distribute strategy.", choices=distribution.STRATEGIES)
    tpu: str = arg("", "A TPU name or grpc:// address; empty means the TPU attached to this VM.")
    num_cpu_replicas: int = arg(
        0, "With --strategy=mirrored and no GPU: mirror over this many logical CPU devices."
    )
    lost_worker_timeout: int = arg(
        distribution.DEFAULT_LOST_WORKER_TIMEOUT,
        "multi_worker_mirrored: seconds without a worker's heartbeat (dead, frozen or cut off) "
        "before the others stop with an error naming it (within about 1.5 times this), exit 1, "
        "and keep their checkpoints (restart every worker to resume from the last one).",
    )
    preempted_exit_code: int = arg(
        0,
        "On SIGTERM (a preemption's notice) training saves a checkpoint at the end of the steps "
        "in progress, on every worker, and exits with this code (0; or one your scheduler "
        "restarts on).",
    )
    mixed_precision: str = arg(
        "none",
        "Compute dtype; float16 adds dynamic loss scaling.",
        choices=training_loop.MIXED_PRECISION_POLICIES,
    )
    jit_compile: bool = arg(False, "XLA-compile the forward and backward pass.")
    seed: int = arg(12345, "Seeds the weights, dropout and the input order.")
    max_loss_ratio: float = arg(
        training_loop.DEFAULT_MAX_LOSS_RATIO,
        "Stop, as for a NaN loss, when a step's loss exceeds this many times the mean loss of the run's earlier "
        "steps (a diverging run, e.g. from too high a learning rate): that step and the rest of its loop are "
        "not applied, nothing is saved after it, and the error names the last healthy checkpoint. The mean is "
        "kept in the checkpoints, so it spans resumed runs. 0 turns the check off.",
    )

    resume_from: str = arg(
        "",
        "Resume from this checkpoint of --output_dir (ckpt-N) instead of the newest healthy one "
        "(a diverged run marks the checkpoints that gave its loss as suspect, and a rerun skips "
        "them).",
    )

    def adam_bias_correction_value(self):
        """--adam_bias_correction; unset, the original's optimizer in every job (across seeds,
        bias correction did not fine-tune better: benchmarks/RESULTS.md, "Fine-tuning: quality
        across seeds against HF")."""
        return bool(self.adam_bias_correction)

    def adam_epsilon_value(self):
        """--adam_epsilon, or the original's."""
        return optimization.DEFAULT_EPSILON if self.adam_epsilon is None else self.adam_epsilon

    def lr_decay_power_value(self):
        """--lr_decay_power (a job whose default depends on other flags resolves its None here)."""
        return self.lr_decay_power

    def validate(self):
        """Usage errors in these flags, each naming its flag."""
        if self.optimizer not in optimization.OPTIMIZERS:
            raise io_utils.UsageError(
                f"--optimizer={self.optimizer} is not one of {', '.join(optimization.OPTIMIZERS)}"
            )
        if self.optimizer != "adamw" and self.adam_bias_correction is not None:
            raise io_utils.UsageError(
                f"--adam_bias_correction applies to --optimizer=adamw, not --optimizer={self.optimizer}"
            )
        if self.adam_epsilon is not None and not self.adam_epsilon > 0:
            raise io_utils.UsageError(f"--adam_epsilon must be positive, got {self.adam_epsilon}")
        if not self.lr_decay_power_value() >= 0:
            raise io_utils.UsageError(
                f"--lr_decay_power must be at least 0, got {self.lr_decay_power}"
            )
        if self.mixed_precision not in training_loop.MIXED_PRECISION_POLICIES:
            raise io_utils.UsageError(
                f"--mixed_precision={self.mixed_precision} is not one of "
                f"{', '.join(training_loop.MIXED_PRECISION_POLICIES)}"
            )
        if self.max_loss_ratio != 0 and not self.max_loss_ratio > 1:
            raise io_utils.UsageError(
                f"--max_loss_ratio must be 0 (off) or above 1, got {self.max_loss_ratio}"
            )
        if not 0 <= self.preempted_exit_code <= 255:
            raise io_utils.UsageError(
                f"--preempted_exit_code must be 0 to 255, got {self.preempted_exit_code}"
            )
        for name in (
            "steps_per_loop",
            "save_checkpoints_steps",
            "num_accumulation_steps",
            "lost_worker_timeout",
        ):
            if getattr(self, name) <= 0:
                raise io_utils.UsageError(f"--{name} must be positive, got {getattr(self, name)}")

    def loop_config(self, num_train_steps, **overrides):
        """The LoopConfig these flags ask for (float16 turns on loss scaling); `overrides` replace fields."""
        fields = dict(
            num_train_steps=num_train_steps,
            steps_per_loop=self.steps_per_loop,
            save_checkpoints_steps=self.save_checkpoints_steps,
            clip_norm=self.clip_norm,
            loss_scaling=self.mixed_precision == "float16",
            jit_compile=self.jit_compile,
            max_checkpoints_to_keep=self.keep_checkpoint_max,
            max_loss_ratio=self.max_loss_ratio,
            resume_from=self.resume_from,
            num_accumulation_steps=self.num_accumulation_steps,
            preempted_exit_code=self.preempted_exit_code,
        )
        fields.update(overrides)
        return training_loop.LoopConfig(**fields)
