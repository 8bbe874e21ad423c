"""The fine-tuning driver every task shares: run_classifier, run_squad, run_ner, run_multiple_choice.

A fine-tuning CLI reads its data into features (bert_tf.tasks.*), then:

    strategy = finetuning.make_strategy(args)                 # first: it may split the CPU
    source = finetuning.resolve_model_source(args)            # config, vocab, initial weights
    tuner = finetuning.Finetuner(args, strategy, source, spec, num_train_steps)
    tuner.start(make_train_dataset)                           # resume from output_dir, or init weights
    tuner.train()                                             # training.Trainer: progress, TensorBoard, ckpts
    outputs = tuner.predict(features, batch_size)             # model outputs in example order
    tuner.write_eval_results(results)                         # eval_results.txt + eval/ summaries

OUTPUT_DIR becomes a fine-tuned model directory (bert_config.json, vocab.txt, task.json and ckpt-N
with the root objects `encoder` and `model`, plus optimizer and step), which bert_tf.export reads
as it is and which a rerun resumes from.

The losses are the task's (bert_tf.tasks.registry -> bert_tf/tasks/<task>/model.py), each a
`tasks.heads.HeadObjective` averaged over the GLOBAL batch, however many replicas share it. The original
scripts average over one device's batch: the whole batch on a GPU or CPU, which is what these do,
but one core's share on a TPU, where the cores' gradients are then summed, each clipped by itself
(see bert_tf.optimization).
"""

import dataclasses
import os

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from bert_tf import distribution, initial_weights, io_utils, optimization, tasks, training
from bert_tf.cli import arg
from bert_tf.model_dir import ModelDir
from bert_tf.tasks import heads, models, registry

EXAMPLE_INDEX = heads.EXAMPLE_INDEX


# ----------------------------------------------------------------------------------------------
# Arguments, the model source and the strategy
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class FinetuneArgs(training.LoopArgs):
    """What every fine-tuning run needs; each CLI's own args dataclass extends it (fields -> flags)."""

    output_dir: str = arg(
        "",
        "The output directory: the fine-tuned model directory (checkpoints, "
        "bert_config.json, vocab.txt, task.json), eval results, predictions and "
        "TensorBoard logs. Rerunning resumes from it.",
    )
    init_checkpoint: str = arg(
        "",
        "The weights: a model directory (pretrained or fine-tuned) or an original BERT checkpoint.",
    )
    bert_config_file: str = arg(
        "", "The bert_config.json of an original checkpoint (a model directory carries its own)."
    )
    vocab_file: str = arg(
        "", "The vocab.txt of an original checkpoint (a model directory carries its own)."
    )
    # None: the model directory's config decides (True for an original checkpoint).
    do_lower_case: bool = arg(
        None,
        "Whether to lower-case the input; with an original checkpoint only (a model "
        "directory's config records it). Default: true.",
    )
    do_train: bool = arg(False, "Whether to run training.")
    do_eval: bool = arg(False, "Whether to run evaluation on the dev set.")
    do_predict: bool = arg(False, "Whether to run prediction on the test set.")
    max_seq_length: int = arg(
        128,
        "The maximum total input sequence length after WordPiece tokenization; longer "
        "sequences are truncated, shorter ones padded.",
    )
    train_batch_size: int = arg(32, "Global batch size for training.")
    eval_batch_size: int = arg(8, "Global batch size for evaluation.")
    predict_batch_size: int = arg(8, "Global batch size for prediction.")
    learning_rate: float = arg(5e-5, "The initial learning rate for Adam.")
    num_train_epochs: float = arg(3.0, "Total number of training epochs to perform.")
    warmup_proportion: float = arg(
        0.1,
        "Proportion of training to perform linear learning rate warmup for. E.g., "
        "0.1 = 10% of training.",
    )
    pad_to_max_seq_length: bool = arg(
        False,
        "Pad every batch to --max_seq_length (static shapes, as the original; always so with "
        "--strategy=tpu). Otherwise each batch is cut to its longest example (with "
        f"--jit_compile, rounded up to a multiple of {tasks.LENGTH_BUCKET} tokens), and training "
        "batches group examples of similar length.",
    )


def validate_args(args):
    """Usage errors common to every fine-tuning run (no TensorFlow needed)."""
    if not (args.do_train or args.do_eval or args.do_predict):
        raise io_utils.UsageError(
            "at least one of --do_train, --do_eval and --do_predict must be set"
        )
    if not args.output_dir:
        raise io_utils.UsageError("--output_dir is required")
    args.validate()
    for name in ("train_batch_size", "eval_batch_size", "predict_batch_size"):
        if getattr(args, name) <= 0:
            raise io_utils.UsageError(f"--{name} must be positive, got {getattr(args, name)}")
    if args.do_train and args.num_train_epochs <= 0:
        raise io_utils.UsageError(
            f"--num_train_epochs must be positive, got {args.num_train_epochs}"
        )
    if not 0.0 <= args.warmup_proportion < 1.0:
        raise io_utils.UsageError(
            f"--warmup_proportion must be in [0, 1), got {args.warmup_proportion}"
        )
    if args.max_seq_length < 3:
        raise io_utils.UsageError(
            f"--max_seq_length must be at least 3 ([CLS] x [SEP]), got {args.max_seq_length}"
        )


def make_strategy(args):
    """The --strategy; call it before any other TensorFlow op (splitting the CPU must come first)."""
    strategy = distribution.get_strategy(
        args.strategy, tpu=args.tpu, num_cpu_replicas=args.num_cpu_replicas
    )
    logging.info(
        "strategy %s with %d replicas", type(strategy).__name__, strategy.num_replicas_in_sync
    )
    for name in ("train_batch_size", "eval_batch_size", "predict_batch_size"):
        if getattr(args, name) % strategy.num_replicas_in_sync:
            raise io_utils.UsageError(
                f"--{name}={getattr(args, name)} is not divisible by the "
                f"{strategy.num_replicas_in_sync} replicas"
            )
    return strategy


def resolve_model_source(args):
    """The config, vocab and initial weights of a fine-tuning run (initial_weights.resolve of its flags).

    --init_checkpoint is a model directory (pretrained or fine-tuned) or an original checkpoint; a
    resumed --output_dir must hold the same config.
    """
    return initial_weights.resolve(
        args.init_checkpoint,
        args.bert_config_file,
        args.vocab_file,
        args.do_lower_case,
        output_dir=args.output_dir,
        max_seq_length=args.max_seq_length,
    )


def finetuned_labels(kind, source, output_dir):
    """The labels of a `kind` model fine-tuned before: --output_dir's (a rerun), else --init_checkpoint's; or None."""
    for spec in (ModelDir(output_dir).read_task_spec(), source.init_spec):
        if spec is not None and spec.kind == kind:
            return list(spec.labels)
    return None


def length_bucket(args):
    """The `length_bucket` of the task datasets: None for static shapes, else the multiple that
    batch lengths are rounded up to.

    TPUs compile a program per input shape and want one, so --strategy=tpu always pads to
    --max_seq_length, as --pad_to_max_seq_length does everywhere. XLA (--jit_compile) compiles a
    program per shape too, so its lengths are multiples of tasks.LENGTH_BUCKET (a few shapes).
    TensorFlow's graph kernels take any shape at no extra cost: there a batch is cut to exactly
    its longest row, which on short sentences trains about 20% faster than multiples of 16.
    """
    if args.pad_to_max_seq_length or args.strategy == "tpu":
        return None
    return tasks.length_multiple(args.jit_compile)


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


class Finetuner:
    """Builds the task model under the strategy, trains it with training.Trainer, and predicts."""

    def __init__(self, args, strategy, source, spec, train_steps=0):
        self.args = args
        self.strategy = strategy
        self.source = source
        self.spec = spec
        self.num_train_steps = int(train_steps)
        keras.mixed_precision.set_global_policy(
            training.MIXED_PRECISION_POLICIES[args.mixed_precision]
        )
        keras.utils.set_random_seed(args.seed)
        warmup_steps = int(self.num_train_steps * args.warmup_proportion)
        with strategy.scope():
            self.model, self.encoder = models.build_task_model(source.config, spec)
            self.optimizer = optimization.create_optimizer(
                "adamw",
                args.learning_rate,
                max(self.num_train_steps, 1),
                warmup_steps,
                args.weight_decay,
            )
        self.objective = registry.get(spec.kind).objective(self.model)
        # The iterator's shuffle buffer would go into every checkpoint, and so into the exported
        # model directory; a resumed run reshuffles with a seed shifted by the step instead.
        loop = args.loop_config(self.num_train_steps, checkpoint_iterator=False)
        self.trainer = training.Trainer(
            strategy,
            self.objective,
            self.optimizer,
            {"encoder": self.encoder, "model": self.model},
            args.output_dir,
            loop,
            args.train_batch_size,
        )
        self.is_chief = self.trainer.is_chief
        self._train_iterator = None
        self._predict_fns = {}

    def _check_output_dir_task(self):
        """A resumed --output_dir must have been fine-tuned for the same head."""
        previous = ModelDir(self.args.output_dir).read_task_spec()
        if (
            previous is not None
            and training.checkpoint_step(self.args.output_dir)
            and not previous.same_head(self.spec)
        ):
            raise io_utils.UsageError(
                f"--output_dir={self.args.output_dir} holds a {previous.kind} model with labels {previous.labels}, "
                f"not a {self.spec.kind} with labels {self.spec.labels}; use a new --output_dir"
            )

    def start(self, make_train_dataset=None):
        """Resumes from --output_dir, or loads --init_checkpoint; writes the model directory files.

        `make_train_dataset(batch_size, seed, input_context)` builds one input pipeline of
        per-replica training batches (needed with --do_train).
        """
        self._check_output_dir_task()
        if self.args.do_train:
            start_step = training.checkpoint_step(self.args.output_dir)
            # Without a checkpointed iterator a resumed run reshuffles rather than replaying the first batches.
            seed = self.args.seed + start_step
            global_batch = self.args.train_batch_size

            def dataset_fn(input_context):
                return make_train_dataset(
                    input_context.get_per_replica_batch_size(global_batch), seed, input_context
                )

            self._train_iterator = iter(self.strategy.distribute_datasets_from_function(dataset_fn))
        resumed = self.trainer.restore_or_initialize(self._train_iterator)
        if not resumed:
            with self.strategy.scope():
                loaded = self.source.load_weights(
                    self.encoder, task_model=self.model, spec=self.spec
                )
            if not loaded:
                logging.warning("no --init_checkpoint: the encoder starts from random weights")
        if self.is_chief and (self.args.do_train or resumed):
            self.write_model_dir_files()
        return resumed

    def write_model_dir_files(self):
        """bert_config.json, vocab.txt and task.json beside the checkpoints: OUTPUT_DIR is a model directory."""
        ModelDir(self.args.output_dir).write_files(
            self.source.config, self.source.vocab_file, self.spec
        )

    @property
    def step(self):
        """The global step (the checkpoint's after a resume)."""
        return int(self.trainer.step.numpy())

    def train(self, log_fn=print):
        """Trains to num_train_steps (resuming where the output_dir left off); returns the last metrics."""
        if self._train_iterator is None:
            raise RuntimeError("start() with a training dataset must come before train()")
        log_fn(
            f"training {self.spec.kind} for {self.num_train_steps} steps "
            f"(global batch {self.args.train_batch_size}, {self.strategy.num_replicas_in_sync} replicas)"
        )
        return self.trainer.train(self._train_iterator, log_fn=log_fn)

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
        Batches are cut to their longest row (see `length_bucket`) and run one trace of the step
        for every length; per-token outputs come back padded to the features' length with the
        objective's `token_outputs` fill values.
        """
        count = len(next(iter(features.values())))
        padded = _pad_rows(features, batch_size)
        seq_length = np.shape(features["input_mask"])[-1]
        dataset = tasks.features_dataset(
            padded,
            batch_size,
            is_training=False,
            drop_remainder=True,
            length_bucket=length_bucket(self.args),
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
        path = os.path.join(self.args.output_dir, file_name)
        training.write_eval_results(path, results)
        scalars = {
            k: float(v)
            for k, v in results.items()
            if isinstance(v, (int, float, np.floating, np.integer)) and k != "global_step"
        }
        training.write_summaries(os.path.join(self.args.output_dir, "eval"), self.step, scalars)
        return path


@dataclasses.dataclass
class RunResult:
    """What a fine-tuning CLI's run ends with: the step, the metrics, and the files it wrote."""

    step: int
    train_metrics: dict
    eval_results: dict
    output_files: list  # predictions / submissions (the chief's; empty on other workers)
    finetuner: Finetuner


def mean_loss(outputs):
    """The weighted mean loss over the rows returned by Finetuner.predict(has_labels=True)."""
    weight = float(np.sum(outputs["example_weight"]))
    return float(np.sum(outputs["example_loss"]) / weight) if weight else 0.0


def print_results(title, results, log_fn=print):
    """Prints `key = value` lines under a title, as the original scripts log their eval results."""
    log_fn(f"***** {title} *****")
    for key in sorted(results):
        log_fn(f"  {key} = {results[key]}")
