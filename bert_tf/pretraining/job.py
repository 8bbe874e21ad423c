"""A pretraining run: PretrainingArgs -> checked records and model -> TrainingJob -> phases -> evaluation.

`run(args)` checks the arguments and the records against them (no TensorFlow needed for most
usage errors), resolves the model (initial_weights: a config, a named size, a model directory or an
original checkpoint), and refuses a resumed --output_dir whose attention direction, heads or phase
flags differ from the run's. It then builds the masked LM (+ NSP) or the left-to-right LM under the
strategy in a bert_tf.training.training_job.TrainingJob, resumes it or loads the initial weights,
writes the model directory's files, trains phase by phase (bert_tf.pretraining.phases), and
evaluates on the last phase's records. Nothing here reads absl flags: the CLI
(bert_tf.run_pretraining) turns its flags into a PretrainingArgs.
"""

import dataclasses
import math
import os

import keras
from absl import logging

from bert_tf.checkpoints import initial_weights, saves
from bert_tf.model import model_dir, modeling
from bert_tf.model.model_dir import ModelDir
from bert_tf.pretraining import input_pipeline, left_to_right_lm, masked_lm
from bert_tf.pretraining import phases as pretraining_phases
from bert_tf.runtime import distribution, io_utils
from bert_tf.runtime.cli import arg, check_fraction
from bert_tf.training import training_loop
from bert_tf.training.loop_flags import LoopArgs
from bert_tf.training.training_job import JobConfig, TrainingJob

MLM, LTR = "mlm", "ltr"
OBJECTIVES = (MLM, LTR)


# kw_only: the required input_file/output_dir may then follow LoopArgs' defaulted fields.
@dataclasses.dataclass(kw_only=True)
class PretrainingArgs(LoopArgs):
    """Everything a pretraining run needs; the CLI fills it from flags, tests construct it directly."""

    input_file: str = arg(
        None, "Comma-separated globs of TFRecord files in the original pretraining schema."
    )
    output_dir: str = arg(
        None,
        "The model directory: checkpoints, bert_config.json, vocab.txt, TensorBoard logs "
        "(train/, eval/) and eval_results.txt. Rerunning resumes from it.",
    )
    vocab_file: str = arg("", "The vocab.txt the records were made with.")
    bert_config_file: str = arg("", "A bert_config.json giving the model architecture.")
    model_size: str = arg(
        "", f"A named size instead of --bert_config_file: {', '.join(modeling.NAMED_SIZES)}."
    )
    # None: true with --model_size, else the config's (true if it has none).
    do_lower_case: bool = arg(
        None,
        "Whether the input is lower-cased (stored in the output's config). Default: "
        "the --bert_config_file's or model directory's, else true. With an original "
        "--init_checkpoint it must match the checkpoint (e.g. false for "
        "cased_L-12_H-768_A-12).",
    )
    init_checkpoint: str = arg(
        "", "Initial weights only: a model directory or an original BERT checkpoint."
    )
    # The CLI's --do_train defaults to false, as the original's; a run built in Python trains.
    do_train: bool = arg(True, "Whether to run training.")
    do_eval: bool = arg(False, "Whether to run evaluation on the eval records.")
    eval_input_file: str = arg(
        "",
        "Globs of the evaluation records, at the last phase's lengths (default: that phase's "
        "records: --input_file, as the original, or --phase2_input_file).",
    )
    train_batch_size: int = arg(32, "Global batch size for training.")
    eval_batch_size: int = arg(8, "Global batch size for evaluation.")
    max_seq_length: int = arg(
        128, "Maximum sequence length; must match the records (create_pretraining_data's value)."
    )
    max_predictions_per_seq: int = arg(
        20, "Maximum masked LM predictions per sequence; must match the records."
    )
    num_train_steps: int = arg(100000, "Number of training steps.")
    num_warmup_steps: int = arg(10000, "Number of linear warmup steps.")
    max_eval_steps: int = arg(100, "Maximum number of eval steps.")
    learning_rate: float = arg(5e-5, "The peak learning rate.")
    heads_learning_rate: float = arg(
        None,
        "The peak learning rate of the pretraining heads and the pooler (which only NSP reads), "
        "on the same warm-up and decay, in every phase the same multiple of the encoder's. For "
        "heads the --init_checkpoint lacks (a Hugging Face encoder, a sentence-transformers "
        "model): new heads learn their task on a pretrained encoder faster than it may change. "
        "Default: --learning_rate.",
    )
    mlm_bias_from_records: bool = arg(
        False,
        "Start the masked LM's output bias at the log frequency of each token among the training "
        "records' masked tokens (add-one smoothed), not at zero: new heads then start from how "
        "often each word is the answer. A checkpoint's own bias replaces it; a resumed run keeps "
        "its own.",
    )
    dropout: float = arg(
        None,
        "The dropout rate of this run's model, in place of the config's hidden_dropout_prob and "
        "attention_probs_dropout_prob (0.1 in every released config); give it again to a rerun "
        "that resumes. 0 scored higher in the demo's short continuation of a pretrained encoder "
        "(benchmarks/RESULTS.md). The model directory's bert_config.json keeps the config's "
        "rates, which fine-tuning from it reads.",
    )
    dynamic_masking: bool = arg(
        False,
        "Re-mask every batch on the fly (RoBERTa-style) instead of using the records' fixed masks.",
    )
    nsp: bool = arg(
        True,
        "Whether to train the next-sentence prediction head beside the masked LM. false: the "
        "masked LM alone, with no NSP head built or saved (the paper's No NSP ablation).",
    )
    objective: str = arg(
        MLM,
        "mlm: the masked LM (BERT). ltr: a left-to-right language model on the same records, "
        "every position predicting the next token under a left-only attention mask (the paper's "
        "LTR & No NSP ablation; needs --nsp=false).",
        choices=OBJECTIVES,
    )
    phase2_input_file: str = arg(
        "",
        "Globs of the records of a second phase, which trains on from --num_train_steps for "
        "--phase2_train_steps more steps in the same --output_dir (the paper's 90% at length 128, "
        "then 10% at 512).",
    )
    phase2_max_seq_length: int = arg(512, "Phase 2's sequence length; must match its records.")
    phase2_max_predictions_per_seq: int = arg(
        80, "Phase 2's masked LM predictions per sequence; must match its records."
    )
    phase2_train_steps: int = arg(0, "Phase 2's number of steps (after --num_train_steps).")
    phase2_num_accumulation_steps: int = arg(
        None,
        "Phase 2's --num_accumulation_steps (longer sequences need smaller micro-batches). "
        "Default: --num_accumulation_steps.",
    )
    phase2_recipe: str = arg(
        pretraining_phases.CONTINUE,
        "The learning rate and optimizer across the phases. continue (the paper's): one warm-up "
        "and linear decay over both phases, Adam's moments kept. restart (NVIDIA's): phase 1 "
        "decays to 0 at --num_train_steps, phase 2 warms up afresh to --phase2_learning_rate over "
        "--phase2_warmup_steps, the moments kept and bias correction started over.",
        choices=pretraining_phases.RECIPES,
    )
    phase2_learning_rate: float = arg(
        None,
        "Phase 2's peak learning rate under --phase2_recipe=restart. Default: --learning_rate.",
    )
    phase2_warmup_steps: int = arg(
        None,
        "Phase 2's warm-up under --phase2_recipe=restart. Default: a tenth of --phase2_train_steps.",
    )
    overwrite: bool = arg(
        False,
        "Resume a run in --output_dir even though its phase flags (steps, lengths, phase 2's) "
        "differ from the ones it started with; without it that is refused.",
    )

    def phase_settings(self):
        """The pretraining_phases.PhaseSettings of these flags."""
        return pretraining_phases.PhaseSettings(
            input_file=self.input_file,
            max_seq_length=self.max_seq_length,
            max_predictions_per_seq=self.max_predictions_per_seq,
            num_train_steps=self.num_train_steps,
            num_accumulation_steps=self.num_accumulation_steps,
            phase2_input_file=self.phase2_input_file,
            phase2_max_seq_length=self.phase2_max_seq_length,
            phase2_max_predictions_per_seq=self.phase2_max_predictions_per_seq,
            phase2_train_steps=self.phase2_train_steps,
            phase2_num_accumulation_steps=self.phase2_num_accumulation_steps,
            phase2_recipe=self.phase2_recipe,
            phase2_learning_rate=self.phase2_learning_rate,
            phase2_warmup_steps=self.phase2_warmup_steps,
        )


@dataclasses.dataclass
class PretrainingResult:
    """What a run ends with: the step, the last train and eval metrics, and the models."""

    step: int
    train_metrics: dict
    eval_results: dict
    pretraining_model: keras.Model
    encoder: keras.Model


def validate(args):
    """Usage errors that need no TensorFlow: flags that contradict each other."""
    if not (args.do_train or args.do_eval):
        raise io_utils.UsageError("at least one of --do_train and --do_eval must be set")
    if not args.output_dir:
        raise io_utils.UsageError("--output_dir is required")
    args.validate()
    if args.bert_config_file and args.model_size:
        raise io_utils.UsageError("give --bert_config_file or --model_size, not both")
    for name in (
        "train_batch_size",
        "eval_batch_size",
        "max_seq_length",
        "max_predictions_per_seq",
    ):
        if getattr(args, name) <= 0:
            raise io_utils.UsageError(f"--{name} must be positive, got {getattr(args, name)}")
    # Else --max_eval_steps=0 reported "no full batch: lower --eval_batch_size", and
    # --num_train_steps=0 "trained" without writing a checkpoint.
    for name, needed in (("num_train_steps", args.do_train), ("max_eval_steps", args.do_eval)):
        if needed and getattr(args, name) <= 0:
            raise io_utils.UsageError(f"--{name} must be positive, got {getattr(args, name)}")
    if args.heads_learning_rate is not None:
        if not 0 < args.heads_learning_rate < math.inf:
            raise io_utils.UsageError(
                f"--heads_learning_rate must be positive, got {args.heads_learning_rate}"
            )
        if not args.learning_rate > 0:
            raise io_utils.UsageError(
                f"--heads_learning_rate is a multiple of --learning_rate, which must then be "
                f"positive, got {args.learning_rate}"
            )
    check_fraction("dropout", args.dropout)
    if args.mlm_bias_from_records and args.objective == LTR:
        raise io_utils.UsageError(
            "--mlm_bias_from_records is for --objective=mlm: the left-to-right model has no masked "
            "LM head"
        )
    if args.num_warmup_steps < 0:
        raise io_utils.UsageError(
            f"--num_warmup_steps must not be negative, got {args.num_warmup_steps}"
        )
    if args.objective not in OBJECTIVES:
        raise io_utils.UsageError(
            f"--objective must be one of {', '.join(OBJECTIVES)}, got {args.objective!r}"
        )
    if args.objective == LTR and args.nsp:
        raise io_utils.UsageError(
            "--objective=ltr needs --nsp=false: the left-to-right model has no NSP head"
        )
    if args.objective == LTR and args.dynamic_masking:
        raise io_utils.UsageError(
            "--dynamic_masking is for --objective=mlm: the left-to-right model reads no masks"
        )
    args.phase_settings().validate()
    if args.model_size and args.model_size not in modeling.NAMED_SIZES:
        raise io_utils.UsageError(
            f"--model_size={args.model_size} is not one of {', '.join(modeling.NAMED_SIZES)}"
        )
    distribution.check_tpu_paths(
        args.tpu if args.strategy == "tpu" else "",
        input_file=args.input_file,
        phase2_input_file=args.phase2_input_file,
        eval_input_file=args.eval_input_file,
        output_dir=args.output_dir,
        init_checkpoint=args.init_checkpoint,
    )


def check_records(args, phases):
    """(train files per phase, eval files): the expanded globs, each file checked against its
    phase's length flags. The evaluation reads the last phase's lengths, and by default its records."""
    train_files = {}
    if args.do_train:
        for phase in phases:
            train_files[phase.number] = input_pipeline.check_input_files(
                io_utils.expand_globs(phase.input_file, phase.input_flag),
                phase.max_seq_length,
                phase.max_predictions_per_seq,
                phase.input_flag,
                phase.length_flags,
            )
    last = phases[-1]
    if not args.do_eval:
        return train_files, []
    if not args.eval_input_file and last.number in train_files:
        return train_files, train_files[last.number]  # The same files, just checked.
    flag = "--eval_input_file" if args.eval_input_file else last.input_flag
    eval_files = input_pipeline.check_input_files(
        io_utils.expand_globs(args.eval_input_file or last.input_file, flag),
        last.max_seq_length,
        last.max_predictions_per_seq,
        flag,
        last.length_flags,
    )
    return train_files, eval_files


def check_attention_direction(args, config):
    """The model's attention direction (from the flags' config, the init checkpoint or a resumed
    --output_dir) must be the one --objective trains: a usage error naming where it came from."""
    wanted = modeling.LEFT_TO_RIGHT if args.objective == LTR else modeling.BIDIRECTIONAL
    if config.attention_direction == wanted:
        return
    if args.init_checkpoint and ModelDir(args.init_checkpoint).exists():
        source = f"--init_checkpoint={args.init_checkpoint}"
    elif args.bert_config_file:
        source = f"--bert_config_file={args.bert_config_file}"
    else:
        source = f"the model in --output_dir={args.output_dir}"
    if args.objective == LTR:
        raise io_utils.UsageError(
            f"--objective=ltr trains a left-to-right model, but {source} has "
            f"attention_direction={config.attention_direction}: give a config with "
            f'"attention_direction": "{modeling.LEFT_TO_RIGHT}", or --model_size'
        )
    raise io_utils.UsageError(
        f"--objective={args.objective} trains a bidirectional model, but {source} has "
        f"attention_direction={config.attention_direction}: use --objective=ltr --nsp=false"
    )


def check_resumed_heads(args):
    """A run resumed from --output_dir keeps the heads it started with: a usage error naming --nsp
    otherwise (restoring would silently drop the NSP head, or train a fresh one from mid-run)."""
    latest = ModelDir(args.output_dir).latest_checkpoint()
    if not latest:
        return
    heads = model_dir.checkpoint_pretraining_heads(latest)
    wanted = frozenset(
        {model_dir.MLM_HEAD, model_dir.NSP_HEAD} if args.nsp else {model_dir.MLM_HEAD}
    )
    if heads and heads != wanted:
        raise io_utils.UsageError(
            f"--output_dir={args.output_dir} holds a run with {model_dir.describe_heads(heads)}, "
            f"and --nsp={str(args.nsp).lower()} would train {model_dir.describe_heads(wanted)}: "
            "resume with the run's --nsp, or use a new --output_dir"
        )


def job_config(args, phase=None):
    """The TrainingJob's settings of these flags (its steps: every phase's), starting in `phase`."""
    phases = args.phase_settings()
    return JobConfig(
        output_dir=args.output_dir,
        train_batch_size=args.train_batch_size,
        learning_rate=args.learning_rate,
        num_warmup_steps=args.num_warmup_steps,
        loop=args.loop_config(
            phases.total_steps,
            num_accumulation_steps=(phase or phases.phases()[0]).num_accumulation_steps,
        ),
        optimizer=args.optimizer,
        weight_decay=args.weight_decay,
        adam_epsilon=args.adam_epsilon_value(),
        adam_bias_correction=args.adam_bias_correction_value(),
        mixed_precision=args.mixed_precision,
        seed=args.seed,
        schedule_restart=phases.schedule_restart(args.learning_rate),
        decay_power=args.lr_decay_power_value(),
        learning_rate_factors=heads_learning_rate_factors(args),
    )


# The variables of the pretraining heads and of the pooler, which only NSP reads in pretraining; the
# MLM head's tied word embeddings are the encoder's.
HEAD_VARIABLE_PATTERNS = ("mlm_head/", "nsp_head/", "pooled_dense/")


def heads_learning_rate_factors(args):
    """The optimizer's (pattern, factor) pairs for --heads_learning_rate (none without it)."""
    if args.heads_learning_rate is None or args.heads_learning_rate == args.learning_rate:
        return ()
    factor = args.heads_learning_rate / args.learning_rate
    return tuple((pattern, factor) for pattern in HEAD_VARIABLE_PATTERNS)


def check_phase_lengths(phases, config):
    """Every phase's length fits the model's position embeddings (phase 1's: initial_weights)."""
    for phase in phases[1:]:
        if phase.max_seq_length > config.max_position_embeddings:
            raise io_utils.UsageError(
                f"--phase{phase.number}_max_seq_length={phase.max_seq_length} exceeds the model's "
                f"max_position_embeddings={config.max_position_embeddings}"
            )


def run(args):
    """Trains and/or evaluates as `args` say; returns a PretrainingResult."""
    validate(args)
    # The strategy comes first: splitting the CPU into logical devices must precede any TF op.
    strategy = distribution.make_strategy(
        args.strategy,
        args.tpu,
        args.num_cpu_replicas,
        {"train_batch_size": args.train_batch_size, "eval_batch_size": args.eval_batch_size},
        lost_worker_timeout=args.lost_worker_timeout,
    )
    settings = args.phase_settings()
    phases = settings.phases()
    for phase in phases:
        training_loop.check_accumulation(
            args.train_batch_size,
            strategy.num_replicas_in_sync,
            phase.num_accumulation_steps,
            phase.accumulation_flag,
        )
    train_files, eval_files = check_records(args, phases)
    source = model_source(args)
    check_attention_direction(args, source.config)
    check_phase_lengths(phases, source.config)
    check_resumed_heads(args)
    if args.do_train:
        pretraining_phases.check_resumed(args.output_dir, settings, args.overwrite)
    # The phase to resume in follows from the step of the checkpoint resumed from.
    resume_point = saves.resume_point(args.output_dir, args.resume_from)
    phase = pretraining_phases.phase_at(
        phases, model_dir.checkpoint_step(resume_point) if resume_point else 0
    )
    models = {}
    job = TrainingJob(
        strategy, job_config(args, phase), lambda: build_objective(args, source.config, models)
    )
    phase_input = train_input(args, strategy, train_files, source)

    def initialize():
        counted = None
        if args.mlm_bias_from_records and args.do_train:
            first = phases[0]
            counted = masked_lm.set_output_bias_to_token_frequencies(
                models["pretraining_model"],
                train_files[first.number],
                first.max_seq_length,
                first.max_predictions_per_seq,
            )
        loaded = source.load_weights(**models)
        if counted is not None and "pretraining_model" in (loaded or ()):
            logging.info("--mlm_bias_from_records: the init checkpoint's own MLM bias is kept")
        elif counted is not None:
            logging.info("masked LM output bias: log frequencies of %d masked tokens", counted)

    job.start(
        phase_input(phase) if args.do_train else None,
        initialize,
        iterator_name=phase.iterator_name,
    )
    if job.is_chief:
        ModelDir(args.output_dir).write_files(source.config, source.vocab_file)
        if args.do_train:
            pretraining_phases.record(args.output_dir, settings)
    train_metrics = train_phases(job, phases, phase, phase_input) if args.do_train else {}
    eval_results = evaluate(args, job, eval_files, phases[-1]) if args.do_eval else {}
    return PretrainingResult(
        job.step, train_metrics, eval_results, models["pretraining_model"], models["encoder"]
    )


def model_source(args):
    """The config, vocab and initial weights (initial_weights.resolve of the model arguments);
    a --model_size model is built for the --objective's attention direction."""
    return initial_weights.resolve(
        args.init_checkpoint,
        args.bert_config_file,
        args.vocab_file,
        args.do_lower_case,
        model_size=args.model_size,
        output_dir=args.output_dir,
        max_seq_length=args.max_seq_length,
        model_size_attention_direction=(
            modeling.LEFT_TO_RIGHT if args.objective == LTR else modeling.BIDIRECTIONAL
        ),
    )


def build_objective(args, config, models):
    """The pretraining model of `config` (with --dropout's rate; under the strategy's scope) and
    the --objective's loss on it: (objective, checkpoint roots); the models also go into `models`
    (pretraining_model, encoder)."""
    models["pretraining_model"], models["encoder"] = modeling.build_pretraining_model(
        training_config(args, config), with_nsp_head=args.nsp
    )
    model = models["pretraining_model"]
    if args.objective == LTR:
        objective = left_to_right_lm.LeftToRightObjective(model)
    else:
        objective = masked_lm.PretrainingObjective(model, nsp=args.nsp)
    return objective, dict(models)


def training_config(args, config):
    """`config` with --dropout in place of its dropout rates (both: the encoder has one rate)."""
    if args.dropout is None:
        return config
    return dataclasses.replace(
        config, hidden_dropout_prob=args.dropout, attention_probs_dropout_prob=args.dropout
    )


def train_input(args, strategy, train_files, source):
    """phase_input(phase) -> make_train_iterator(seed) over that phase's records (re-masked on the fly
    with --dynamic_masking)."""
    masking = (
        input_pipeline.DynamicMasking.from_vocab_file(source.vocab_file, source.config.vocab_size)
        if args.dynamic_masking
        else None
    )

    def phase_input(phase):
        def make_train_iterator(seed):
            return iter(
                input_pipeline.distributed_pretraining_dataset(
                    strategy,
                    train_files[phase.number],
                    args.train_batch_size,
                    phase.max_seq_length,
                    phase.max_predictions_per_seq,
                    is_training=True,
                    seed=seed,
                    dynamic_masking=masking,
                    restore_masked_tokens=args.objective == LTR,
                )
            )

        return make_train_iterator

    return phase_input


def evaluate(args, job, eval_files, phase):
    """Evaluates `job`'s model on `eval_files` at `phase`'s lengths; returns the metrics with the
    global step. The chief writes eval_results.txt and the eval/ summaries, and prints the metrics."""
    eval_iterator = iter(
        input_pipeline.distributed_pretraining_dataset(
            job.strategy,
            eval_files,
            args.eval_batch_size,
            phase.max_seq_length,
            phase.max_predictions_per_seq,
            is_training=False,
            restore_masked_tokens=args.objective == LTR,
        )
    )
    metrics, steps = job.trainer.evaluate(eval_iterator, args.max_eval_steps)
    eval_results = dict(metrics, global_step=job.step)
    if job.is_chief:
        training_loop.write_eval_results(
            os.path.join(args.output_dir, "eval_results.txt"), eval_results
        )
        training_loop.write_summaries(os.path.join(args.output_dir, "eval"), job.step, metrics)
        print(
            "eval (%d steps): %s"
            % (steps, "  ".join(f"{k} {v:.4f}" for k, v in sorted(metrics.items()))),
            flush=True,
        )
    return eval_results


def train_phases(job, phases, current, phase_input):
    """Trains `job` through the phases from `current` on; returns the last metrics.

    At a boundary the job switches to the next phase's records and micro-batches in place: the
    weights, the optimizer, the step and the summaries run on.
    """
    if job.finished:
        return job.train()  # which says so
    metrics = {}
    for phase in phases[phases.index(current) :]:
        if phase is not current:
            job.switch_input(phase_input(phase), phase.iterator_name, phase.num_accumulation_steps)
        if len(phases) > 1 and job.is_chief:
            print(f"pretraining {phase.describe()}", flush=True)
        metrics = job.train(until_step=phase.end_step)
    return metrics
