"""The flags every fine-tuning job shares, and the plain settings the library takes from them.

Only the CLI modules import this (the run_<task> CLIs, extract_features): a job's args dataclass
extends `FinetuneArgs` (loop_flags.LoopArgs, the training loop's flags, plus the fine-tuning flags),
and turns into the library's settings with `loop_config`, `finetune_config`, `make_strategy` and
`model_source`.
"""

import dataclasses

from bert_tf.checkpoints import initial_weights
from bert_tf.runtime import distribution, io_utils
from bert_tf.runtime.cli import arg, check_fraction, inherit
from bert_tf.tasks import packing, representations
from bert_tf.training import finetuning, optimization, training_loop
from bert_tf.training.loop_flags import LoopArgs


@dataclasses.dataclass
class FinetuneArgs(LoopArgs):
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
    eval_every_epoch: bool = arg(
        False,
        "With --do_train and --do_eval: evaluate on the dev set after every epoch too, one JSON line "
        "each in OUTPUT_DIR/eval_history.jsonl (the learning curve).",
    )
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
        finetuning.WARMUP_PROPORTION,
        "Proportion of training to perform linear learning rate warmup for. E.g., 0.1 = 10% of "
        "training, the original's; the default is twice that: with the original's optimizer a "
        "short run at 0.1 can collapse (every input alike to the head; benchmarks/RESULTS.md).",
    )
    pad_to_max_seq_length: bool = arg(
        False,
        "Pad every batch to --max_seq_length (static shapes, as the original; always so with "
        "--strategy=tpu). Otherwise each batch is cut to its longest example (with "
        f"--jit_compile, rounded up to a multiple of {packing.LENGTH_BUCKET} tokens), and training "
        "batches group examples of similar length.",
    )
    group_by_length: bool = arg(
        True,
        "Training batches group examples of similar length (with dynamic lengths: not with "
        "--pad_to_max_seq_length or a TPU); false: plain shuffled batches, each cut to its longest "
        "example.",
    )
    # None: --seed's.
    data_seed: int = arg(
        None,
        "Seeds the training input's order (the shuffle, and which examples share a batch) apart "
        "from --seed, which then seeds the new weights and dropout only: runs that differ in one "
        "of the two tell which one a run's luck came from. Default: --seed. With --num_restarts "
        "the restarts keep it and vary --seed.",
    )
    num_restarts: int = arg(
        1,
        "Fine-tune this many times, with seeds --seed, --seed+1, ..., and keep the run best on dev "
        "as --output_dir (the BERT paper's random restarts on small data); eval_results.txt gives "
        "every run's seed and score. Needs --do_train and the dev set (--do_eval; SQuAD: a "
        "predict file with answers).",
    )
    # None: dense, or bilstm with --feature_based (FeatureBasedArgs, which refuses an explicit dense).
    head: str = arg(
        None,
        "What the task's output layer reads: dense, the encoder's output as the paper fine-tunes "
        "(sequence_output per token, pooled_output per sequence); bilstm, a randomly initialised "
        'two-layer bidirectional LSTM over sequence_output (the paper\'s Table 5, "+ BiLSTM"): '
        "token tasks read its outputs, sequence tasks its last forward and first backward states. "
        "Recorded in task.json. Default: dense.",
        choices=representations.HEADS,
    )
    # None: the config's initializer_range (0.02 in every released config), the original's.
    head_initializer_range: float = arg(
        None,
        "The standard deviation of the task's output layer's initial weights (a truncated normal, "
        "as the original's); 0 starts them at zero, so the first steps train the output layer "
        "before any gradient reaches the encoder. Default: the config's initializer_range.",
    )
    # None: the config's hidden_dropout_prob (0.1 in every released config), the original's.
    head_dropout: float = arg(
        None,
        "The dropout rate on what the task's output layer reads (the encoder's own dropout "
        "keeps the config's hidden_dropout_prob; run_squad refuses it: its output layer has no "
        "dropout, as the original's). Default: the config's hidden_dropout_prob.",
    )
    # None: the paper's 768, where a BiLSTM is built (set without one, it is a usage error).
    lstm_units: int = arg(
        None,
        "Units per direction of each layer of the bilstm head. Default: "
        f"{representations.DEFAULT_LSTM_UNITS}, the paper's.",
    )

    def validate(self):
        """Usage errors common to every fine-tuning run (no TensorFlow needed), naming the flags."""
        if not (self.do_train or self.do_eval or self.do_predict):
            raise io_utils.UsageError(
                "at least one of --do_train, --do_eval and --do_predict must be set"
            )
        if not self.output_dir:
            raise io_utils.UsageError("--output_dir is required")
        super().validate()
        for name in ("train_batch_size", "eval_batch_size", "predict_batch_size"):
            if getattr(self, name) <= 0:
                raise io_utils.UsageError(f"--{name} must be positive, got {getattr(self, name)}")
        if self.do_train and self.num_train_epochs <= 0:
            raise io_utils.UsageError(
                f"--num_train_epochs must be positive, got {self.num_train_epochs}"
            )
        if self.num_restarts < 1:
            raise io_utils.UsageError(f"--num_restarts must be at least 1, got {self.num_restarts}")
        if self.num_restarts > 1 and not self.do_train:
            raise io_utils.UsageError("--num_restarts trains several runs: it needs --do_train")
        if self.num_restarts > 1 and self.strategy == "multi_worker_mirrored":
            raise io_utils.UsageError(
                "--num_restarts runs on one machine (any other --strategy): with "
                "--strategy=multi_worker_mirrored, run the job once per --seed"
            )
        if self.eval_every_epoch and not (self.do_train and self.do_eval):
            raise io_utils.UsageError("--eval_every_epoch needs --do_train and --do_eval")
        check_fraction("warmup_proportion", self.warmup_proportion)
        if self.head_initializer_range is not None and not self.head_initializer_range >= 0:
            raise io_utils.UsageError(
                f"--head_initializer_range must be at least 0, got {self.head_initializer_range}"
            )
        check_fraction("head_dropout", self.head_dropout)
        if self.max_seq_length < 3:
            raise io_utils.UsageError(
                f"--max_seq_length must be at least 3 ([CLS] x [SEP]), got {self.max_seq_length}"
            )
        if self.head is not None and self.head not in representations.HEADS:
            raise io_utils.UsageError(
                f"--head={self.head} is not one of {', '.join(representations.HEADS)}"
            )
        if self.lstm_units is not None:
            if self.lstm_units <= 0:
                raise io_utils.UsageError(f"--lstm_units must be positive, got {self.lstm_units}")
            if not self.builds_lstm():
                raise io_utils.UsageError(
                    f"--lstm_units sizes a BiLSTM: it needs {self.LSTM_FLAGS}"
                )

    def head_dropout_value(self):
        """--head_dropout (None: the config's hidden_dropout_prob)."""
        return self.head_dropout

    LSTM_FLAGS = "--head=bilstm"  # the flags that build a BiLSTM (builds_lstm), for messages

    def builds_lstm(self):
        """Whether these flags put a BiLSTM between the encoder and the output layer."""
        return self.head == "bilstm"

    def head_fields(self):
        """The TaskSpec fields of --head and --lstm_units."""
        units = self.lstm_units or representations.DEFAULT_LSTM_UNITS
        return dict(head=self.head or "dense", lstm_units=units)

    def batch_sizes(self):
        """{flag name: global batch size} of the batches this run makes."""
        return {
            name: getattr(self, name)
            for name in ("train_batch_size", "eval_batch_size", "predict_batch_size")
        }

    def make_strategy(self):
        """The --strategy, checked against the batch sizes; call it before any other TensorFlow op."""
        strategy = distribution.make_strategy(
            self.strategy,
            self.tpu,
            self.num_cpu_replicas,
            self.batch_sizes(),
            lost_worker_timeout=self.lost_worker_timeout,
        )
        training_loop.check_accumulation(
            self.train_batch_size, strategy.num_replicas_in_sync, self.num_accumulation_steps
        )
        return strategy

    def model_source(self):
        """The config, vocab and initial weights (initial_weights.resolve of these flags).

        --init_checkpoint is a model directory (pretrained or fine-tuned) or an original
        checkpoint; a resumed --output_dir must hold the same config.
        """
        return initial_weights.resolve(
            self.init_checkpoint,
            self.bert_config_file,
            self.vocab_file,
            self.do_lower_case,
            output_dir=self.output_dir,
            max_seq_length=self.max_seq_length,
        )

    def finetune_config(self):
        """The driver's FinetuneConfig of these flags."""
        return finetuning.FinetuneConfig(
            output_dir=self.output_dir,
            do_train=self.do_train,
            do_eval=self.do_eval,
            do_predict=self.do_predict,
            train_batch_size=self.train_batch_size,
            eval_batch_size=self.eval_batch_size,
            predict_batch_size=self.predict_batch_size,
            learning_rate=self.learning_rate,
            num_train_epochs=self.num_train_epochs,
            warmup_proportion=self.warmup_proportion,
            lr_decay_power=self.lr_decay_power_value(),
            weight_decay=self.weight_decay,
            optimizer=self.optimizer,
            adam_epsilon=self.adam_epsilon_value(),
            adam_bias_correction=self.adam_bias_correction_value(),
            mixed_precision=self.mixed_precision,
            seed=self.seed,
            data_seed=self.data_seed,
            head_initializer_range=self.head_initializer_range,
            head_dropout=self.head_dropout_value(),
            num_restarts=self.num_restarts,
            length_bucket=finetuning.length_bucket(
                self.pad_to_max_seq_length, self.strategy, self.jit_compile
            ),
            group_by_length=self.group_by_length,
            eval_every_epoch=self.eval_every_epoch,
            loop=self.loop_config(0),
        )


@dataclasses.dataclass
class FeatureBasedArgs(FinetuneArgs):
    """The common fine-tuning arguments plus the feature-based approach (--feature_based,
    --features), for the jobs whose heads read a BiLSTM's output: run_ner and run_classifier."""

    feature_based: bool = arg(
        False,
        "The feature-based approach (the paper's Table 7): the encoder stays frozen (its weights "
        "are not trained, and it runs without dropout) and a randomly initialised two-layer "
        "BiLSTM (--lstm_units) with the task's output layer is trained on the activations "
        "--features names. Implies --head=bilstm. Two defaults differ from fine-tuning's, as a "
        "fresh head on frozen features trains better: the rate is held after the warm-up "
        "(--lr_decay_power=0) and nothing is dropped before the output layer (--head_dropout=0).",
    )
    # None: 0 with --feature_based, else the common defaults (FEATURE_BASED_DEFAULTS).
    lr_decay_power: float = inherit(
        LoopArgs,
        "lr_decay_power",
        None,
        f"Default: {optimization.DEFAULT_DECAY_POWER:g}; with --feature_based, 0.",
    )
    head_dropout: float = inherit(
        FinetuneArgs, "head_dropout", more_help="With --feature_based the default is 0."
    )
    features: str = arg(
        None,
        "With --feature_based, the activations the BiLSTM reads: embeddings (the embedding "
        "layer's output), second_to_last, last, sum_last_four (a learned softmax-weighted sum of "
        "the last four layers, scaled: ELMo's scalar mix), concat_last_four, sum_all (the scalar "
        "mix of every transformer layer, the paper's Weighted Sum All 12 Layers), "
        "sum_all_with_embeddings (the same mix with the embedding output too), or layer_K (the "
        "K-th transformer layer's output alone, K from 1). Recorded in task.json.",
    )

    def validate(self):
        """The common checks, and --feature_based with its --features and --head."""
        super().validate()
        if self.features is not None and not self.feature_based:
            raise io_utils.UsageError("--features applies to --feature_based only")
        if self.feature_based and self.features is None:
            raise io_utils.UsageError(
                f"--feature_based needs --features (one of {representations.FEATURES_HELP})"
            )
        if self.features is not None and not representations.is_feature_choice(self.features):
            raise io_utils.UsageError(
                f"--features={self.features} is not one of {representations.FEATURES_HELP}"
            )
        if self.feature_based and self.head not in (None, "bilstm"):
            raise io_utils.UsageError(
                f"--feature_based trains a BiLSTM head on the frozen encoder: --head={self.head} "
                "contradicts it (leave --head out)"
            )

    LSTM_FLAGS = "--head=bilstm or --feature_based"

    # A fresh BiLSTM on frozen features trains better with its rate held after the warm-up and no
    # dropout before its output layer (benchmarks/RESULTS.md, "Fine-tuning: feature-based tagging
    # against HF").
    FEATURE_BASED_DEFAULTS = {"lr_decay_power": 0.0, "head_dropout": 0.0}

    def _feature_based_default(self, name, otherwise):
        value = getattr(self, name)
        if value is not None:
            return value
        return self.FEATURE_BASED_DEFAULTS[name] if self.feature_based else otherwise

    def lr_decay_power_value(self):
        return self._feature_based_default("lr_decay_power", optimization.DEFAULT_DECAY_POWER)

    def head_dropout_value(self):
        return self._feature_based_default("head_dropout", super().head_dropout_value())

    def builds_lstm(self):
        return self.feature_based or super().builds_lstm()

    def head_fields(self):
        """The TaskSpec fields of --head, --lstm_units and --feature_based's --features."""
        if not self.feature_based:
            return super().head_fields()
        return dict(super().head_fields(), head="bilstm", features=self.features)
