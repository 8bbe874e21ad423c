"""The fine-tuning driver every task shares: run_classifier, run_squad, run_ner, run_multiple_choice.

A fine-tuning CLI maps its flags onto its task's job (bert_tf/tasks/<task>/job.py), then hands
the flow to `run`, configured by a plain FinetuneConfig:

    strategy = distribution.make_strategy(...)                # first: it may split the CPU
    source = initial_weights.resolve(...)                     # config, vocab, initial weights
    result = finetuning.run(config, strategy, source, job)    # the task's data, metrics and files

The job is the task's side of the run. `job.prepare(config, source)` reads the task's data (usage
errors first) and returns its model's TaskSpec with the training set (a packing.TrainData, needed
with config.do_train); `job.evaluate_and_predict(finetuner, final)` predicts with
`Finetuner.predict` (outputs in example order) and returns the eval results (written to
eval_results.txt and eval/ summaries, printed under `job.eval_title`) and the files it wrote.
`run` writes the training records, builds their input pipeline from the task's record schema (its
registry entry), resumes from OUTPUT_DIR or loads the initial weights, and trains
(training_loop.Trainer: progress, TensorBoard, checkpoints) between the job's two calls.

OUTPUT_DIR becomes a fine-tuned model directory (bert_config.json, vocab.txt, task.json and ckpt-N
with the root objects `encoder` and `model`, plus optimizer and step), which bert_tf.export reads
as it is and which a rerun resumes from.

The losses are the task's (bert_tf.tasks.registry -> bert_tf/tasks/<task>/model.py), each a
`tasks.heads.HeadObjective` averaged over the GLOBAL batch, however many replicas share it. The original
scripts average over one device's batch: the whole batch on a GPU or CPU, which is what these do,
but one core's share on a TPU, where the cores' gradients are then summed, each clipped by itself
(see bert_tf.training.optimization).
"""

import dataclasses
import json
import math
import os

import numpy as np
import tensorflow as tf
from absl import logging

from bert_tf.model.model_dir import ModelDir
from bert_tf.runtime import io_utils
from bert_tf.tasks import heads, models, packing, registry
from bert_tf.training import optimization, restarts, training_loop
from bert_tf.training.training_job import JobConfig, TrainingJob

EXAMPLE_INDEX = heads.EXAMPLE_INDEX


# Twice the original's 0.1: without bias correction a short run's first steps are several times
# the nominal rate, and at 0.1 one pair-classification run in five of our benchmark collapsed
# (benchmarks/RESULTS.md, "Fine-tuning: quality across seeds against HF").
WARMUP_PROPORTION = 0.2


@dataclasses.dataclass
class FinetuneConfig:
    """Everything the fine-tuning driver needs, as plain values (the CLIs fill it from their flags)."""

    output_dir: str
    do_train: bool = False
    do_eval: bool = False
    do_predict: bool = False
    train_batch_size: int = 32
    eval_batch_size: int = 8
    predict_batch_size: int = 8
    learning_rate: float = 5e-5
    num_train_epochs: float = 3.0
    warmup_proportion: float = WARMUP_PROPORTION
    # The decay's power after warm-up (optimization.warmup_linear_decay): 1 linear, 0 constant.
    lr_decay_power: float = optimization.DEFAULT_DECAY_POWER
    weight_decay: float = 0.01
    optimizer: str = "adamw"
    adam_epsilon: float = optimization.DEFAULT_EPSILON
    adam_bias_correction: bool = False
    mixed_precision: str = "none"
    seed: int = 12345
    # The training input's order, apart from the weights' and dropout's seed (None: seed).
    data_seed: int | None = None
    # The output layer's initial stddev (None: the config's initializer_range).
    head_initializer_range: float | None = None
    # The dropout rate before the output layer (None: the config's hidden_dropout_prob).
    head_dropout: float | None = None
    # Runs from seeds seed, seed + 1, ...; the best on dev is kept (bert_tf.training.restarts).
    num_restarts: int = 1
    # What batch lengths are rounded up to (see `length_bucket`); None: padded to the records' length.
    length_bucket: int = 1
    # Training batches of similar lengths (with a length_bucket); off: plain shuffled batches.
    group_by_length: bool = True
    # Evaluate after every epoch too (eval_history.jsonl: the learning curve), not only at the end.
    eval_every_epoch: bool = False
    # The loop's cadence, clipping and compilation; its num_train_steps is set from the data.
    loop: training_loop.LoopConfig = dataclasses.field(
        default_factory=lambda: training_loop.LoopConfig(num_train_steps=0)
    )


def length_bucket(pad_to_max_seq_length, strategy_name, jit_compile):
    """What the task datasets round batch lengths up to: None for static shapes, else a multiple.

    TPUs compile a program per input shape and want one, so --strategy=tpu always pads to
    --max_seq_length, as --pad_to_max_seq_length does everywhere. XLA (--jit_compile) compiles a
    program per shape too, so its lengths are multiples of packing.LENGTH_BUCKET (a few shapes).
    TensorFlow's graph kernels take any shape at no extra cost: there a batch is cut to exactly
    its longest row, which on short sentences trains about 20% faster than multiples of 16.
    """
    if pad_to_max_seq_length or strategy_name == "tpu":
        return None
    return packing.length_multiple(jit_compile)


def num_train_steps(num_examples, train_batch_size, num_train_epochs):
    """The original's count: int(examples / batch size * epochs), at least 1."""
    return max(1, int(num_examples / train_batch_size * num_train_epochs))


# ----------------------------------------------------------------------------------------------
# The driver
# ----------------------------------------------------------------------------------------------


def _pad_rows(features, multiple):
    """Features padded to a multiple of `multiple` rows, with EXAMPLE_INDEX -1 on padding.

    The padding repeats the last row, which is in the same batch, so it never makes the batch longer.
    """
    count = len(next(iter(features.values())))
    padded_count = max(multiple, -(-count // multiple) * multiple)
    result = {}
    for name, values in features.items():
        values = np.asarray(values)
        if count == 0:
            values = np.zeros((padded_count,) + values.shape[1:], values.dtype)
        elif padded_count > count:
            values = np.concatenate([values, np.repeat(values[-1:], padded_count - count, axis=0)])
        result[name] = values
    index = np.full(padded_count, -1, np.int32)
    index[:count] = np.arange(count, dtype=np.int32)
    result[EXAMPLE_INDEX] = index
    return result


def _pad_positions(values, seq_length, fill):
    """Per-token outputs [b, s', ...] of a trimmed batch padded with `fill` to [b, seq_length, ...]."""
    missing = seq_length - values.shape[1]
    if not missing:
        return values
    widths = [(0, 0), (0, missing)] + [(0, 0)] * (values.ndim - 2)
    return np.pad(values, widths, constant_values=fill)


class Finetuner(TrainingJob):
    """Builds the task model under the strategy, trains it with training_loop.Trainer, and predicts."""

    def __init__(self, config, strategy, source, spec, train_steps=0):
        self.config = config
        self.source = source
        self.spec = spec
        self.num_train_steps = int(train_steps)
        # The iterator's shuffle buffer would go into every checkpoint, and so into the exported
        # model directory; a resumed run reshuffles with a seed shifted by the step instead.
        loop = dataclasses.replace(
            config.loop, num_train_steps=self.num_train_steps, checkpoint_iterator=False
        )
        job = JobConfig(
            output_dir=config.output_dir,
            train_batch_size=config.train_batch_size,
            learning_rate=config.learning_rate,
            num_warmup_steps=int(self.num_train_steps * config.warmup_proportion),
            decay_power=config.lr_decay_power,
            loop=loop,
            optimizer=config.optimizer,
            weight_decay=config.weight_decay,
            adam_epsilon=config.adam_epsilon,
            adam_bias_correction=config.adam_bias_correction,
            mixed_precision=config.mixed_precision,
            seed=config.seed,
            data_seed=config.data_seed,
        )
        super().__init__(strategy, job, self._build)
        self._predict_fns = {}

    def _build(self):
        """The task model on a fresh encoder, and its objective (under the strategy's scope)."""
        self.model, self.encoder = models.build_task_model(
            self.source.config,
            self.spec,
            head_initializer_range=self.config.head_initializer_range,
            head_dropout=self.config.head_dropout,
        )
        objective = registry.get(self.spec.kind).objective(self.model)
        return objective, {"encoder": self.encoder, "model": self.model}

    def _check_output_dir_task(self):
        """A resumed OUTPUT_DIR must have been fine-tuned for the same head."""
        output_dir = self.config.output_dir
        previous = models.read_task_spec(ModelDir(output_dir))
        if (
            previous is not None
            and ModelDir(output_dir).latest_step()
            and not previous.same_head(self.spec)
        ):
            raise io_utils.UsageError(
                f"--output_dir={output_dir} holds a {previous.describe()} model, not a "
                f"{self.spec.describe()}; use a new --output_dir"
            )

    def start(self, make_train_dataset=None):
        """Resumes from OUTPUT_DIR, or loads the initial weights; writes the model directory files.

        `make_train_dataset(batch_size, seed, input_context)` builds one input pipeline of
        per-replica training batches (needed to train).
        """
        self._check_output_dir_task()
        make_iterator = None
        if self.config.do_train:
            global_batch = self.config.train_batch_size

            def make_iterator(seed):
                def dataset_fn(input_context):
                    return make_train_dataset(
                        input_context.get_per_replica_batch_size(global_batch), seed, input_context
                    )

                return iter(self.strategy.distribute_datasets_from_function(dataset_fn))

        resumed = super().start(make_iterator, self._initialize)
        if self.is_chief and (self.config.do_train or resumed):
            self.write_model_dir_files()
        return resumed

    def _initialize(self):
        """Loads the initial weights (the encoder, and a fine-tuned head of the same kind)."""
        loaded = self.source.load_weights(self.encoder, task_model=self.model, spec=self.spec)
        if not loaded:
            logging.warning("no --init_checkpoint: the encoder starts from random weights")

    def write_model_dir_files(self):
        """bert_config.json, vocab.txt and task.json beside the checkpoints: OUTPUT_DIR is a model directory."""
        ModelDir(self.config.output_dir).write_files(
            self.source.config, self.source.vocab_file, self.spec
        )

    def train(self, log_fn=print, until_step=None):
        """Trains to num_train_steps, or `until_step` if sooner (resuming where OUTPUT_DIR left
        off); returns the last metrics."""
        if not self.finished:  # (a finished run says so in TrainingJob.train)
            log_fn(
                f"training {self.spec.kind} for {self.num_train_steps} steps "
                f"(global batch {self.config.train_batch_size}, "
                f"{self.strategy.num_replicas_in_sync} replicas)"
            )
        return super().train(log_fn=log_fn, until_step=until_step)

    def _predict_fn(self, has_labels):
        """The tf.function running one distributed prediction step (traced once per has_labels)."""
        if has_labels not in self._predict_fns:

            def step(batch):
                if isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy):
                    return self.objective.predict_step(batch, has_labels)
                return self.strategy.run(self.objective.predict_step, args=(batch, has_labels))

            # reduce_retracing: a call whose shapes an earlier, more general trace covers reuses
            # it, so batches of any length run the one trace made for the dataset's element spec.
            # No AutoGraph: the step has no tensor-dependent Python control flow (see training).
            self._predict_fns[has_labels] = tf.function(
                step, reduce_retracing=True, autograph=False
            )
        return self._predict_fns[has_labels]

    def predict(self, features, batch_size, has_labels=False):
        """The head's outputs for every row of `features` (arrays, record names), in row order.

        Rows are padded to whole global batches (static shapes for TPUs; every replica gets rows),
        run through the model under the strategy, and put back in order by their index. With
        `has_labels`, each row also gets its summed loss and weight (example_loss, example_weight).
        Batches are cut to their longest row (FinetuneConfig.length_bucket) and run one trace of the step
        for every length; per-token outputs come back padded to the features' length with the
        objective's `token_outputs` fill values.
        """
        count = len(next(iter(features.values())))
        padded = _pad_rows(features, batch_size)
        seq_length = np.shape(features["input_mask"])[-1]
        dataset = packing.features_dataset(
            padded,
            batch_size,
            is_training=False,
            drop_remainder=True,
            length_bucket=self.config.length_bucket,
        )
        predict_step = self._predict_fn(has_labels)
        if isinstance(self.strategy, tf.distribute.MultiWorkerMirroredStrategy):
            # Each worker would see only its shard of the rows; inference needs no collectives, so
            # every worker predicts all rows on its local copy of the weights (the chief writes).
            batches, local_results = dataset, lambda value: [value]
        else:
            batches = self.strategy.experimental_distribute_dataset(dataset)
            local_results = self.strategy.experimental_local_results
        # One trace for every batch length (a None dimension), not one per length.
        predict_step.get_concrete_function(batches.element_spec)
        collected = {}
        for batch in batches:
            outputs = predict_step(batch)
            for name, value in outputs.items():
                fill = self.objective.token_outputs.get(name)
                collected.setdefault(name, []).extend(
                    np.asarray(v)
                    if fill is None
                    else _pad_positions(np.asarray(v), seq_length, fill)
                    for v in local_results(value)
                )
        result = {name: np.concatenate(parts) for name, parts in collected.items()}
        index = result.pop(EXAMPLE_INDEX)
        keep = index >= 0
        order = np.argsort(index[keep], kind="stable")
        result = {name: values[keep][order] for name, values in result.items()}
        if len(order) != count:
            raise RuntimeError(f"prediction returned {len(order)} rows for {count} inputs")
        return result

    def write_eval_results(self, results, file_name="eval_results.txt"):
        """Writes `key = value` lines (the original's eval_results.txt) and eval/ TensorBoard scalars."""
        if not self.is_chief:
            return None
        path = os.path.join(self.config.output_dir, file_name)
        training_loop.write_eval_results(path, results)
        scalars = {
            k: float(v)
            for k, v in results.items()
            if isinstance(v, (int, float, np.floating, np.integer)) and k != "global_step"
        }
        training_loop.write_summaries(
            os.path.join(self.config.output_dir, "eval"), self.step, scalars
        )
        return path


@dataclasses.dataclass
class RunResult:
    """What a fine-tuning CLI's run ends with: the step, the metrics, and the files it wrote."""

    step: int
    train_metrics: dict
    eval_results: dict
    output_files: list  # predictions / submissions (the chief's; empty on other workers)
    finetuner: Finetuner


EVAL_HISTORY_FILE = "eval_history.jsonl"


def epoch_ends(train_steps, num_train_epochs):
    """The step at which each epoch ends (a fractional last epoch ends at train_steps)."""
    per_epoch = train_steps / num_train_epochs
    ends = [round(k * per_epoch) for k in range(1, math.ceil(num_train_epochs))]
    return [step for step in ends if 0 < step < train_steps] + [train_steps]


class EvalHistory:
    """OUTPUT_DIR/eval_history.jsonl: one line of eval results per epoch, rewritten atomically.

    A resumed run keeps the lines of the steps it has already passed.
    """

    def __init__(self, output_dir, current_step, is_chief=True):
        self.path = os.path.join(output_dir, EVAL_HISTORY_FILE)
        self.is_chief = is_chief
        self.entries = [
            entry for entry in read_eval_history(output_dir) if entry["global_step"] <= current_step
        ]

    def has(self, step):
        return any(entry["global_step"] == step for entry in self.entries)

    def add(self, epoch, step, results):
        self.entries = [e for e in self.entries if e["global_step"] != step]
        self.entries.append({"epoch": epoch, "global_step": step, **_json_scalars(results)})
        if self.is_chief:
            io_utils.atomic_write_text(
                self.path, "".join(json.dumps(entry) + "\n" for entry in self.entries)
            )


def read_eval_history(output_dir):
    """The eval_history.jsonl entries of a fine-tuning run ([] without one)."""
    path = os.path.join(output_dir, EVAL_HISTORY_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _json_scalars(results):
    """The numeric entries of eval results as plain Python numbers."""
    return {
        k: v.item() if isinstance(v, (np.floating, np.integer)) else v
        for k, v in results.items()
        if isinstance(v, (int, float, np.floating, np.integer))
    }


def print_results(title, results, log_fn=print):
    """Prints `key = value` lines under a title, as the original scripts log their eval results."""
    log_fn(f"***** {title} *****")
    for key in sorted(results):
        log_fn(f"  {key} = {results[key]}")


def run(config, strategy, source, job, log_fn=print, after_prepare=None):
    """Fine-tunes the model of a task `job` as `config` says, then evaluates and predicts; returns a
    RunResult.

    `job.prepare(config, source)` gives the TaskSpec and the training set; `job.evaluate_and_predict(
    finetuner, final)` returns (eval results, files written): non-empty results get the global
    step, go to eval_results.txt and are printed under `job.eval_title`. With
    config.eval_every_epoch it is also called after each epoch but the last with final=False:
    evaluate only, write nothing. `after_prepare()` is called once the data is read, before any
    training. With config.num_restarts > 1 the run is made once per seed and the best on dev is
    kept (bert_tf.training.restarts; `job.selection_key()` names the score that ranks them).
    """
    if config.num_restarts > 1:
        kept, eval_results = restarts.run(
            config,
            lambda sub_config, after_prepare: run(
                sub_config, strategy, source, job, log_fn, after_prepare
            ),
            job.selection_key,
            log_fn,
        )
        if kept is None:  # the kept run finished in an earlier process
            kept = RunResult(
                ModelDir(config.output_dir).latest_step() or 0, {}, eval_results, [], None
            )
        return kept
    spec, train = job.prepare(config, source)
    if after_prepare is not None:
        after_prepare()
    train_steps, make_train_dataset = 0, None
    if config.do_train:
        train_steps = num_train_steps(
            train.num_examples, config.train_batch_size, config.num_train_epochs
        )
        make_train_dataset = _train_dataset(config, spec, train)
    tuner = Finetuner(config, strategy, source, spec, train_steps)
    tuner.start(make_train_dataset)
    train_metrics, history = {}, None
    ends = [train_steps] if config.do_train else []
    if config.do_train and config.eval_every_epoch:
        ends = epoch_ends(train_steps, config.num_train_epochs)
        # Every worker evaluates (the prediction runs under the strategy); the chief writes.
        history = EvalHistory(config.output_dir, tuner.step, tuner.is_chief)
    for epoch, end in enumerate(ends, 1):
        if tuner.step < end:
            train_metrics = tuner.train(log_fn, until_step=end) or train_metrics
        elif end == train_steps:
            train_metrics = tuner.train(log_fn)  # (says the run is already trained)
        # An epoch's end a resumed run has passed cannot be evaluated any more; one it stopped
        # at (killed before the evaluation) still can.
        if history is not None and end < train_steps and tuner.step == end:
            if not history.has(end):
                history.add(epoch, end, job.evaluate_and_predict(tuner, final=False)[0])
    eval_results, output_files = job.evaluate_and_predict(tuner)
    if eval_results:
        eval_results["global_step"] = tuner.step
        tuner.write_eval_results(eval_results)
        print_results(job.eval_title, eval_results, log_fn)
        if history is not None and config.do_train:
            history.add(len(ends), tuner.step, eval_results)
    return RunResult(tuner.step, train_metrics, eval_results, list(output_files), tuner)


def _train_dataset(config, spec, train):
    """Writes `train` into OUTPUT_DIR/train.tf_record; returns make_train_dataset(batch_size, seed,
    input_context), its input pipeline by the task's record schema."""
    records = os.path.join(config.output_dir, "train.tf_record")
    packing.write_records(records, train.features)
    input_shape = np.shape(train.features["input_ids"])[1:]
    record_spec = registry.get(spec.kind).feature_spec(input_shape)

    def make_train_dataset(batch_size, seed, input_context):
        return packing.records_dataset(
            records,
            record_spec,
            batch_size,
            is_training=True,
            seed=seed,
            input_context=input_context,
            length_bucket=config.length_bucket,
            group_by_length=config.group_by_length,
        )

    return make_train_dataset
