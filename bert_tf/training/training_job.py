"""What every training job does around the loop: build under the strategy, resume or initialize, train.

    job = TrainingJob(strategy, JobConfig(...), build)     # build() -> (objective, checkpoint objects)
    resumed = job.start(make_train_iterator, initialize)   # the output directory's newest checkpoint, or
                                                           # initialize() (the initial weights)
    metrics = job.train()                                  # training_loop.Trainer: progress, TensorBoard, ckpts

bert_tf.pretraining.job drives one directly; bert_tf.training.finetuning's Finetuner is one, with prediction added.
"""

import dataclasses

import keras
from absl import logging

from bert_tf.model.model_dir import ModelDir
from bert_tf.training import optimization, training_loop


@dataclasses.dataclass
class JobConfig:
    """What a training job's optimizer, precision and loop are; the CLIs fill it from their flags."""

    output_dir: str
    train_batch_size: int
    learning_rate: float
    num_warmup_steps: int
    loop: training_loop.LoopConfig
    optimizer: str = "adamw"
    weight_decay: float = 0.01
    adam_epsilon: float = optimization.DEFAULT_EPSILON
    adam_bias_correction: bool = False  # standard AdamW; the original omits the correction
    mixed_precision: str = "none"  # a key of training_loop.MIXED_PRECISION_POLICIES
    seed: int = 12345
    # The training input's order, when it is to differ from `seed`'s (None: seed).
    data_seed: int | None = None
    # A second schedule taking over mid-run (pretraining's phase 2 under the restart recipe).
    schedule_restart: optimization.ScheduleRestart | None = None
    # The decay's power after warm-up: 1, linear (the original's); NVIDIA's LAMB recipes use 0.5.
    decay_power: float = 1.0
    # (variable path pattern, factor) pairs: those variables step at that multiple of the rate.
    learning_rate_factors: tuple = ()


class TrainingJob:
    """A model built under a strategy, resumed from its output directory or initialized, then trained."""

    def __init__(self, strategy, config, build):
        """`build()` runs under the strategy's scope and returns (objective, {root name: trackable})."""
        self.strategy = strategy
        self.job_config = config
        keras.mixed_precision.set_global_policy(
            training_loop.MIXED_PRECISION_POLICIES[config.mixed_precision]
        )
        keras.utils.set_random_seed(config.seed)
        with strategy.scope():
            self.objective, checkpoint_objects = build()
            self.optimizer = optimization.create_optimizer(
                config.optimizer,
                config.learning_rate,
                max(config.loop.num_train_steps, 1),
                config.num_warmup_steps,
                config.weight_decay,
                config.adam_epsilon,
                config.adam_bias_correction,
                config.schedule_restart,
                config.decay_power,
                config.learning_rate_factors,
            )
        self.trainer = training_loop.Trainer(
            strategy,
            self.objective,
            self.optimizer,
            checkpoint_objects,
            config.output_dir,
            config.loop,
            config.train_batch_size,
        )
        self.is_chief = self.trainer.is_chief
        self.train_iterator = None

    @property
    def step(self):
        """The global step (the checkpoint's after a resume)."""
        return int(self.trainer.step.numpy())

    def input_seed(self):
        """The seed of the training input's order: data_seed, else seed."""
        config = self.job_config
        return config.seed if config.data_seed is None else config.data_seed

    def _train_iterator(self, make_train_iterator):
        """The training input, reshuffled with a seed shifted by the step when its position cannot be resumed.

        Without a checkpointed iterator a resumed run would replay the first batches.
        """
        seed = self.input_seed()
        start_step = ModelDir(self.job_config.output_dir).latest_step()
        if start_step and not self.job_config.loop.checkpoint_iterator:
            return make_train_iterator(seed + start_step)
        iterator = make_train_iterator(seed)
        if start_step and not training_loop.is_checkpointable(iterator):
            logging.warning(
                "resuming at step %d with a reshuffled input order (this strategy's input "
                "iterator cannot be checkpointed)",
                start_step,
            )
            iterator = make_train_iterator(seed + start_step)
        return iterator

    def start(
        self, make_train_iterator=None, initialize=None, iterator_name=training_loop.TRAIN_ITERATOR
    ):
        """Resumes from the output directory's newest checkpoint, or calls `initialize()` (under the
        strategy's scope) to load the initial weights; returns the checkpoint resumed from, or None.

        `make_train_iterator(seed)` builds the training input (needed to train); `iterator_name`
        is its key in the checkpoints.
        """
        if make_train_iterator is not None:
            self.train_iterator = self._train_iterator(make_train_iterator)
        resumed = self.trainer.restore_or_initialize(self.train_iterator, iterator_name)
        if not resumed and initialize is not None:
            with self.strategy.scope():
                initialize()
        return resumed

    def switch_input(self, make_train_iterator, iterator_name, num_accumulation_steps):
        """Trains on from here on another input (`make_train_iterator(seed)`), checkpointed under
        `iterator_name`, in `num_accumulation_steps` micro-batches: pretraining's second phase."""
        self.train_iterator = make_train_iterator(self.input_seed())
        self.trainer.replace_train_iterator(
            self.train_iterator, iterator_name, num_accumulation_steps
        )

    def train(self, log_fn=print, until_step=None):
        """Trains to the loop's num_train_steps (or `until_step`, if sooner), resuming where the output
        directory left off; returns the last metrics."""
        if self.train_iterator is None:
            raise RuntimeError("start() with a training input must come before train()")
        if self.finished:
            log_fn(
                f"{self.job_config.output_dir} is already trained to step {self.step} of "
                f"{self.job_config.loop.num_train_steps}: nothing to train"
            )
            return {}
        return self.trainer.train(self.train_iterator, log_fn=log_fn, until_step=until_step)

    @property
    def finished(self):
        """Whether the run has reached its num_train_steps (a rerun of a finished run)."""
        return self.step >= self.job_config.loop.num_train_steps
