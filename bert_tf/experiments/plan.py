"""What each study runs: the paper's tables as a list of real jobs (`python -m bert_tf.<job> flags`).

A study is data preparation (corpus, vocabulary, pretraining records, task files), pretraining
runs and fine-tuning runs, in that order. Every step names the file whose existence means it has
finished, so the runner skips what a killed study already did. The jobs themselves resume from
their checkpoints, so a step cut short goes on where it stopped.

The studies (Devlin et al. 2018, section 5):
- tasks (Table 5): BERT (MLM + NSP), No NSP, LTR & No NSP, and LTR & No NSP fine-tuned with a
  randomly initialised BiLSTM on top, all pretrained on the same records at the same size;
- sizes (Table 6): the same recipe at each of --model_sizes; the table reports the masked LM's
  perplexity on held-out records and the fine-tuned dev scores;
- features (Table 7): a BERT fine-tuned for tagging, against its frozen activations (each layer
  choice of run_ner --feature_based) feeding a two-layer BiLSTM;
- masking (Table 8, and the masking the paper left open): one model pretrained per masking
  (Table 8's six MASK/SAME/RND mixes, whole-word and span masking), each fine-tuned on
  classification and tagging and used frozen for tagging;
- layers (Table 7's question, for every layer): the frozen embeddings and each layer's output
  alone, read by the same two-layer BiLSTM probe, on tagging and on the GLUE tasks given;
- steps (Appendix C.1's figure): fine-tuned accuracy against pretraining steps, at STEP_CHECKPOINTS
  checkpoints of one masked LM run and one left-to-right run, both without NSP on the same
  contiguous records, so that the objective alone differs.

A fine-tuning cell runs --finetune_seeds times (seeds --seed, --seed + 1, ...); the report gives
the mean, the standard deviation and the count of a cell's runs.
"""

import dataclasses
import functools
import math
import os
import re

from bert_tf.model import modeling
from bert_tf.model.model_dir import ModelDir
from bert_tf.runtime import io_utils
from bert_tf.tasks import representations
from bert_tf.tasks.classification import data as classification

# The pretraining and fine-tuning recipe at each scale. base is the paper's (1M steps of 256
# sequences of 128 tokens); tiny and mini fit a laptop's CPU in minutes to an hour. A BiLSTM starts
# from nothing, so at the small scales the runs with one (+ BiLSTM, the feature-based approach)
# train for more epochs (bilstm_epochs) than fine-tuning takes. Their fine-tuning learning rates are
# 4x to 20x the paper's, where the original's Adam without bias correction (steps up to 3x larger at
# first) left a tiny BERT stuck at chance on the demo's sentiment task: they fine-tune with standard
# AdamW (finetune_bias_correction), and with no early boost to soften they warm up over the
# original's 10% of the steps; base keeps the paper's optimizer and the jobs' 20% warm-up.
# The small scales' feature-based runs keep the schedule and head dropout that their figures in
# benchmarks/RESULTS.md were measured with, from before --feature_based had defaults of its own.
FEATURE_BASED_AS_MEASURED = ("--lr_decay_power=1", "--head_dropout=0.1")
SCALES = {
    "tiny": dict(
        model_size="tiny",
        pretraining_steps=2000,
        pretraining_batch=32,
        pretraining_learning_rate=5e-4,
        max_seq_length=128,
        max_predictions_per_seq=20,
        finetune_learning_rate=1e-3,
        finetune_bias_correction=True,
        finetune_warmup_proportion=0.1,
        finetune_epochs=4.0,
        bilstm_epochs=15.0,
        finetune_batch=32,
        finetune_seq_length=64,
        lstm_units=128,
        feature_based_flags=FEATURE_BASED_AS_MEASURED,
    ),
    "mini": dict(
        model_size="mini",
        pretraining_steps=20000,
        pretraining_batch=64,
        pretraining_learning_rate=2e-4,
        max_seq_length=128,
        max_predictions_per_seq=20,
        finetune_learning_rate=2e-4,
        finetune_bias_correction=True,
        finetune_warmup_proportion=0.1,
        finetune_epochs=3.0,
        bilstm_epochs=10.0,
        finetune_batch=32,
        finetune_seq_length=128,
        lstm_units=256,
        feature_based_flags=FEATURE_BASED_AS_MEASURED,
    ),
    "base": dict(
        model_size="base",
        pretraining_steps=1_000_000,
        pretraining_batch=256,
        pretraining_learning_rate=1e-4,
        max_seq_length=128,
        max_predictions_per_seq=20,
        finetune_learning_rate=5e-5,
        finetune_bias_correction=False,
        finetune_warmup_proportion=None,  # the jobs' default
        finetune_epochs=3.0,
        bilstm_epochs=3.0,
        finetune_batch=32,
        finetune_seq_length=128,
        lstm_units=768,
        feature_based_flags=(),  # the jobs' defaults
    ),
}


def warmup_flags(proportion):
    """--warmup_proportion, or nothing for the jobs' default (None)."""
    return [] if proportion is None else [f"--warmup_proportion={proportion:g}"]


STUDIES = ("tasks", "sizes", "features", "masking", "layers", "steps", "nsp")
# Fine-tuning runs per cell when --finetune_seeds is 0: the newer studies compare rows closer than
# one seed can tell apart.
DEFAULT_FINETUNE_SEEDS = {
    "tasks": 1,
    "sizes": 1,
    "features": 1,
    "masking": 3,
    "layers": 3,
    "steps": 3,
    "nsp": 3,
}

# The steps study fine-tunes this many evenly spaced checkpoints of each pretraining run.
STEP_CHECKPOINTS = 5

GLUE_TASKS = classification.GLUE_TASK_NAMES
OTHER_TASKS = ("swag", "conll", "squad")
FEATURE_CHOICES = (
    ("embeddings", "Embeddings"),
    ("second_to_last", "Second-to-Last Hidden"),
    ("last", "Last Hidden"),
    ("sum_last_four", "Weighted Sum Last Four Hidden"),
    ("concat_last_four", "Concat Last Four Hidden"),
    ("sum_all", "Weighted Sum All Layers"),
)


@dataclasses.dataclass(frozen=True)
class Masking:
    """A row of the masking study: create_pretraining_data's --masking and replacement shares."""

    row: str
    masking: str
    mask_token_prob: float
    random_token_prob: float

    @property
    def name(self):
        kept = round(100 * (1 - self.mask_token_prob - self.random_token_prob))
        shares = f"{round(100 * self.mask_token_prob)}_{kept}_{round(100 * self.random_token_prob)}"
        return f"{self.masking}_{shares}"

    @property
    def shares(self):
        """The MASK / SAME / RND percentages, as the paper's Table 8 columns show them."""
        mask, random = round(100 * self.mask_token_prob), round(100 * self.random_token_prob)
        return mask, 100 - mask - random, random

    @property
    def flags(self):
        return [
            f"--masking={self.masking}",
            f"--mask_token_prob={self.mask_token_prob:g}",
            f"--random_token_prob={self.random_token_prob:g}",
        ]


# Table 8's rows (MASK / SAME / RND), then whole words and SpanBERT's spans at the original's mix.
MASKINGS = (
    Masking("80% / 10% / 10%", "token", 0.8, 0.1),
    Masking("100% / 0% / 0%", "token", 1.0, 0.0),
    Masking("80% / 0% / 20%", "token", 0.8, 0.2),
    Masking("80% / 20% / 0%", "token", 0.8, 0.0),
    Masking("0% / 20% / 80%", "token", 0.0, 0.8),
    Masking("0% / 0% / 100%", "token", 0.0, 1.0),
    Masking("Whole words, 80% / 10% / 10%", "whole_word", 0.8, 0.1),
    Masking("Spans of words, 80% / 10% / 10%", "span", 0.8, 0.1),
)
# What a masking masks, as the masking study's table names it.
MASKING_UNITS = {"token": "WordPieces", "whole_word": "Whole words", "span": "Spans of words"}
# The frozen features of the masking study's feature-based column: the paper's Table 8 uses the
# last four layers concatenated; a model too shallow for them mixes all its layers.
MASKING_FEATURES = ("concat_last_four", "sum_all")


@dataclasses.dataclass(frozen=True)
class TaskData:
    """One fine-tuning task: its name (a GLUE task, swag, conll or squad) and its data directory
    (squad: train.json and dev.json in SQuAD v1.1's layout)."""

    name: str
    data_dir: str

    @property
    def job(self):
        if self.name in GLUE_TASKS:
            return "run_classifier"
        return {"swag": "run_multiple_choice", "conll": "run_ner", "squad": "run_squad"}[self.name]

    def flags(self, max_seq_length):
        """The task's flags for its job: its name and data, and SQuAD's windows for the length."""
        if self.name == "squad":
            return [
                f"--train_file={os.path.join(self.data_dir, 'train.json')}",
                f"--predict_file={self.dev_file}",
                f"--max_query_length={max_seq_length // 3}",
                f"--doc_stride={max_seq_length // 2}",
            ]
        name = [f"--task_name={self.name}"] if self.name != "conll" else []
        return [*name, f"--data_dir={self.data_dir}"]

    @property
    def _glue(self):
        return classification.get_task(self.name) if self.name in GLUE_TASKS else None

    @property
    def metric(self):
        """The dev score the table shows: a GLUE task's first metric (CoLA's MCC, STS-B's Pearson,
        MNLI's matched accuracy), F1 for tagging, else accuracy."""
        if self._glue:
            return self._glue.metric_names[0]
        return "f1" if self.name in ("conll", "squad") else "accuracy"

    @property
    def score_key(self):
        """The dev score's key in eval_results.txt (SQuAD's: the official script's)."""
        if self.name == "squad":
            return "f1"
        split = self._glue.eval_splits[0] if self._glue else "dev"
        return f"{classification.eval_prefix(split)}_{self.metric}"

    def score(self, results):
        """The dev score in `results` (eval results), or None; on one scale, 0 to 1, with the
        other tasks' (the official SQuAD script reports percent)."""
        value = results.get(self.score_key)
        if value is None or self.name != "squad":
            return value
        return value / 100

    @property
    def dev_file(self):
        """The dev split's file in the task's layout."""
        if self._glue:
            split = self._glue.eval_splits[0]
            return os.path.join(self.data_dir, (self._glue.files or {}).get(split, f"{split}.tsv"))
        files = {"swag": "val.csv", "squad": "dev.json"}
        return os.path.join(self.data_dir, files.get(self.name, "dev.txt"))

    @property
    def column(self):
        return f"{self.name} ({self.metric})"


def parse_tasks(entries):
    """`NAME:DIR` entries (NAME a GLUE task, swag, conll or squad) -> TaskData, naming a bad entry."""
    tasks = []
    for entry in entries:
        name, _, data_dir = entry.partition(":")
        if name not in (*GLUE_TASKS, *OTHER_TASKS) or not data_dir:
            raise io_utils.UsageError(
                f"--tasks entry {entry!r}: expected NAME:DIR with NAME one of "
                f"{', '.join(GLUE_TASKS + OTHER_TASKS)}"
            )
        if not os.path.isdir(data_dir):
            raise io_utils.UsageError(f"--tasks entry {entry!r}: {data_dir} is not a directory")
        tasks.append(TaskData(name, data_dir))
    return tasks


_SIZE_SPEC = re.compile(r"^L(\d+)_H(\d+)_A(\d+)$")


def size_shape(size):
    """(layers, hidden, heads) of a named size or an `L<layers>_H<hidden>_A<heads>` spec."""
    if size in modeling.NAMED_SIZES:
        layers, hidden = modeling.NAMED_SIZES[size]
        return layers, hidden, hidden // 64
    match = _SIZE_SPEC.match(size)
    if not match:
        raise io_utils.UsageError(
            f"--model_sizes entry {size!r}: expected one of {', '.join(modeling.NAMED_SIZES)} "
            "or L<layers>_H<hidden>_A<heads> (e.g. L4_H256_A4)"
        )
    layers, hidden, heads = (int(g) for g in match.groups())
    if not (layers and hidden and heads):
        raise io_utils.UsageError(
            f"--model_sizes entry {size!r}: layers, hidden size and heads must each be at least 1"
        )
    if hidden % heads:
        raise io_utils.UsageError(
            f"--model_sizes entry {size!r}: {hidden} is not a multiple of {heads}"
        )
    return layers, hidden, heads


@dataclasses.dataclass
class Step:
    """One job of a study: `python -m bert_tf.<module> <flags>` (or, without a module, `action()`),
    done once `done_file` exists."""

    name: str
    module: str
    flags: list
    done_file: str
    action: object = None
    kind: str = "data"  # data | pretraining | finetuning | skipped (a run the model cannot do)
    row: str = ""  # the table row it fills
    task: TaskData = None  # (fine-tuning steps)
    reason: str = ""  # (skipped steps) why, shown in the table's cell
    column: str = ""  # (fine-tuning and skipped steps) the table column it fills
    seed: int = None  # (fine-tuning steps of a cell with several seeds) its run's seed


@dataclasses.dataclass
class Pretraining:
    """A pretraining row: its name, the model's directory and its run_pretraining flags."""

    row: str
    model_dir: str
    flags: list


class Planner:
    """Builds a study's steps from the runner's settings (see __main__.ExperimentArgs)."""

    def __init__(self, args, scale):
        self.args = args
        self.scale = scale
        self.out = args.output_dir
        self.data_dir = os.path.join(self.out, "data")
        self.steps = []

    def path(self, *parts):
        return os.path.join(self.out, *parts)

    def add(self, step):
        self.steps.append(step)
        return step

    # ------------------------------------------------------------------------------------------
    # Data
    # ------------------------------------------------------------------------------------------
    def corpus_file(self):
        if self.args.input_file:
            return self.args.input_file
        corpus = os.path.join(self.data_dir, "corpus.txt")
        self.add(Step("corpus", "corpus", [f"--output_file={corpus}"], corpus))
        return corpus

    def vocab_file(self, corpus):
        if self.args.vocab_file:
            return self.args.vocab_file
        vocab = os.path.join(self.data_dir, "vocab.txt")
        flags = [
            f"--input_file={corpus}",
            f"--output_file={vocab}",
            f"--vocab_size={self.args.vocab_size}",
            "--do_lower_case=true",
        ]
        self.add(Step("vocab", "build_vocab", flags, vocab))
        return vocab

    def records(self, corpus, vocab, random_next_prob=0.5, masking=None):
        """Pretraining records; `random_next_prob` 0 gives contiguous text (the No NSP rows');
        `masking`, a Masking, masks as its row says."""
        name = "records" if random_next_prob == 0.5 else f"records_random_next_{random_next_prob:g}"
        if masking is not None:
            name = f"records_{masking.name}"
        records = os.path.join(self.data_dir, name)
        flags = [
            f"--input_file={corpus}",
            f"--vocab_file={vocab}",
            "--do_lower_case=true",
            f"--output_dir={records}",
            f"--max_seq_length={self.scale['max_seq_length']}",
            f"--max_predictions_per_seq={self.scale['max_predictions_per_seq']}",
            f"--dupe_factor={self.args.dupe_factor}",
            "--num_shards=4",
            f"--random_seed={self.args.seed}",
            f"--random_next_prob={random_next_prob:g}",
            *(masking.flags if masking is not None else ()),
            "--overwrite",  # a rerun after a kill starts the data job over
        ]
        self.add(
            Step(name, "create_pretraining_data", flags, os.path.join(records, "summary.json"))
        )
        return os.path.join(records, "*.tfrecord")

    def task_data(self, corpus, kinds):
        """The --tasks given, else the demo's tasks of `kinds` (glue: sst2, swag, conll, and of the
        corpus's documents pair: a sentence-pair task in MRPC's layout, squad: spans)."""
        if self.args.tasks:
            return parse_tasks(self.args.tasks)
        demo = os.path.join(self.data_dir, "tasks")
        # kind -> (demo_data's flag, the task's name, its folder)
        demo_tasks = {
            "glue": ("--glue_dir", "sst2", "sst2"),
            "pair": ("--pair_dir", "mrpc", "pair"),
            "swag": ("--swag_dir", "swag", "swag"),
            "conll": ("--conll_dir", "conll", "conll"),
            "squad": ("--squad_dir", "squad", "squad"),
        }
        flags, tasks = [], []
        for kind, (flag, name, folder) in demo_tasks.items():
            if kind in kinds:
                flags.append(f"{flag}={demo}/{folder}")
                tasks.append(TaskData(name, f"{demo}/{folder}"))
        if {"conll", "pair", "squad"} & set(kinds):
            flags.append(f"--corpus_file={corpus}")
        self.add(Step("tasks", "demo_data", flags, tasks[-1].dev_file))
        return tasks

    # ------------------------------------------------------------------------------------------
    # Runs
    # ------------------------------------------------------------------------------------------
    def pretrain(self, pretraining, records, vocab, size_flags):
        scale, args = self.scale, self.args
        steps = args.pretraining_steps or scale["pretraining_steps"]
        flags = [
            f"--input_file={records}",
            f"--output_dir={pretraining.model_dir}",
            f"--vocab_file={vocab}",
            "--do_lower_case=true",
            "--do_train",
            "--do_eval",
            f"--train_batch_size={scale['pretraining_batch']}",
            f"--eval_batch_size={scale['pretraining_batch']}",
            f"--max_seq_length={scale['max_seq_length']}",
            f"--max_predictions_per_seq={scale['max_predictions_per_seq']}",
            f"--num_train_steps={steps}",
            f"--num_warmup_steps={max(1, steps // 10)}",
            f"--learning_rate={scale['pretraining_learning_rate']}",
            f"--steps_per_loop={steps_per_loop(steps)}",
            f"--save_checkpoints_steps={max(1, steps // 4)}",
            f"--max_eval_steps={args.max_eval_steps}",
            f"--seed={args.seed}",
            *size_flags,
        ]
        # A row's own flags replace the recipe's of the same name.
        given = {flag.split("=", 1)[0] for flag in pretraining.flags}
        flags = [f for f in flags if f.split("=", 1)[0] not in given] + list(pretraining.flags)
        self.add(
            Step(
                f"pretrain_{os.path.basename(pretraining.model_dir)}",
                "run_pretraining",
                flags,
                os.path.join(pretraining.model_dir, "eval_results.txt"),
                kind="pretraining",
                row=pretraining.row,
            )
        )

    def finetune(self, name, model_dir, task, row, extra_flags=(), epochs=None, column=None):
        """A fine-tuning cell: one run per seed (named NAME_sSEED when there are several)."""
        count = finetune_seed_count(self.args)
        for seed in range(self.args.seed, self.args.seed + count):
            run = name if count == 1 else f"{name}_s{seed}"
            self._finetune_run(run, model_dir, task, row, extra_flags, epochs, seed, column, count)

    def _finetune_run(self, name, model_dir, task, row, extra_flags, epochs, seed, column, seeds):
        """One of a cell's `seeds` fine-tuning runs, with `seed`."""
        scale, args = self.scale, self.args
        epochs = epochs or args.finetune_epochs or scale["finetune_epochs"]
        output_dir = self.path("runs", name)
        seq_length = args.finetune_seq_length or scale["finetune_seq_length"]
        flags = [
            *task.flags(seq_length),
            f"--init_checkpoint={model_dir}",
            f"--output_dir={output_dir}",
            "--do_train",
            "--do_eval",
            "--eval_every_epoch",
            f"--max_seq_length={seq_length}",
            f"--train_batch_size={scale['finetune_batch']}",
            "--eval_batch_size=64",
            f"--learning_rate={args.finetune_learning_rate or scale['finetune_learning_rate']}",
            f"--num_train_epochs={epochs:g}",
            f"--adam_bias_correction={str(scale['finetune_bias_correction']).lower()}",
            *warmup_flags(scale["finetune_warmup_proportion"]),
            f"--seed={seed}",
            *extra_flags,
        ]
        self.add(
            Step(
                name,
                task.job,
                flags,
                os.path.join(output_dir, "eval_results.txt"),
                kind="finetuning",
                row=row,
                task=task,
                column=column or task.column,
                seed=seed if seeds > 1 else None,
            )
        )

    def lstm_flags(self):
        return [f"--lstm_units={self.args.lstm_units or self.scale['lstm_units']}"]

    def feature_based_flags(self, features):
        """A feature-based run's flags: its frozen `features` into this scale's BiLSTM."""
        return [
            "--feature_based",
            f"--features={features}",
            *self.lstm_flags(),
            *self.scale["feature_based_flags"],
        ]

    def bilstm_epochs(self):
        return self.args.bilstm_epochs or self.scale["bilstm_epochs"]


def finetune_seed_count(args):
    """How many seeds each fine-tuning cell of the study runs."""
    return args.finetune_seeds or DEFAULT_FINETUNE_SEEDS[args.study]


def steps_per_loop(steps):
    """A pretraining run's --steps_per_loop: about 20 loops, of at most 100 steps."""
    return max(1, min(100, steps // 20))


def write_size_config(path, layers, hidden, heads, vocab_file):
    """A bert_config.json of that shape (intermediate 4H, as the paper's) for the vocabulary."""
    with open(vocab_file, encoding="utf-8") as f:
        vocab_size = sum(1 for line in f if line.strip())
    os.makedirs(os.path.dirname(path), exist_ok=True)
    modeling.BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
    ).to_json_file(path)


def tasks_study(planner):
    """Table 5: the pretraining tasks' ablations, fine-tuned on every task."""
    corpus = planner.corpus_file()
    vocab = planner.vocab_file(corpus)
    records = planner.records(corpus, vocab)
    # Without NSP, B is always the text that follows A: the rows train on contiguous text.
    contiguous = planner.records(corpus, vocab, random_next_prob=0.0)
    tasks = planner.task_data(corpus, ("glue", "swag"))
    size = [f"--model_size={planner.scale['model_size']}"]
    rows = [
        Pretraining("BERT (MLM + NSP)", planner.path("models", "bert"), []),
        Pretraining("No NSP", planner.path("models", "no_nsp"), ["--nsp=false"]),
        Pretraining(
            "LTR & No NSP", planner.path("models", "ltr"), ["--nsp=false", "--objective=ltr"]
        ),
    ]
    for pretraining, row_records in zip(rows, (records, contiguous, contiguous)):
        planner.pretrain(pretraining, row_records, vocab, size)
    for pretraining in rows:
        for task in tasks:
            name = f"{os.path.basename(pretraining.model_dir)}_{task.name}"
            planner.finetune(name, pretraining.model_dir, task, pretraining.row)
    ltr = rows[-1]
    for task in tasks:
        planner.finetune(
            f"ltr_bilstm_{task.name}",
            ltr.model_dir,
            task,
            "+ BiLSTM",
            ["--head=bilstm", *planner.lstm_flags()],
            epochs=planner.bilstm_epochs(),
        )
    return planner.steps


def sizes_study(planner):
    """Table 6: the same recipe at each model size."""
    corpus = planner.corpus_file()
    vocab = planner.vocab_file(corpus)
    records = planner.records(corpus, vocab)
    tasks = planner.task_data(corpus, ("glue", "swag"))
    for size in planner.args.model_sizes:
        layers, hidden, heads = size_shape(size)
        row = f"L{layers}_H{hidden}_A{heads}"
        model_dir = planner.path("models", row)
        if size in modeling.NAMED_SIZES and hidden // 64 == heads:
            size_flags = [f"--model_size={size}"]
        else:
            config_file = planner.path("configs", f"{row}.json")
            size_flags = [f"--bert_config_file={config_file}"]
            write = functools.partial(write_size_config, config_file, layers, hidden, heads, vocab)
            planner.add(Step(f"config_{row}", None, [], config_file, action=write))
        planner.pretrain(Pretraining(row, model_dir, []), records, vocab, size_flags)
        for task in tasks:
            planner.finetune(f"{row}_{task.name}", model_dir, task, row)
    return planner.steps


def study_model(planner, corpus):
    """(model directory, its number of layers): --init_checkpoint's, else one the study
    pretrains (MLM + NSP) at the scale's size."""
    args = planner.args
    if args.init_checkpoint:
        return args.init_checkpoint, ModelDir(args.init_checkpoint).load_config().num_hidden_layers
    vocab = planner.vocab_file(corpus)
    records = planner.records(corpus, vocab)
    model_dir = planner.path("models", "bert")
    size = [f"--model_size={planner.scale['model_size']}"]
    planner.pretrain(Pretraining("BERT (MLM + NSP)", model_dir, []), records, vocab, size)
    return model_dir, modeling.NAMED_SIZES[planner.scale["model_size"]][0]


def tagging_task(planner, corpus, study):
    """The conll task of --tasks (or the demo's); a UsageError without one."""
    tasks = [t for t in planner.task_data(corpus, ("conll",)) if t.name == "conll"]
    if not tasks:
        raise io_utils.UsageError(f"--study={study} needs a conll:DIR entry in --tasks")
    return tasks[0]


def layers_study(planner):
    """Every layer's frozen output, and the embeddings', read by the same BiLSTM probe, on tagging
    and on every GLUE task given (a sentence pair task such as mrpc among them)."""
    args = planner.args
    corpus = None if (args.init_checkpoint and args.tasks) else planner.corpus_file()
    tasks = [
        t for t in planner.task_data(corpus, ("glue", "conll")) if t.job != "run_multiple_choice"
    ]
    if not any(t.name == "conll" for t in tasks):
        raise io_utils.UsageError("--study=layers needs a conll:DIR entry in --tasks")
    model_dir, num_layers = study_model(planner, corpus)
    for layer in range(num_layers + 1):
        features = f"layer_{layer}" if layer else "embeddings"
        for task in tasks:
            planner.finetune(
                f"probe_{features}_{task.name}",
                model_dir,
                task,
                str(layer),
                planner.feature_based_flags(features),
                epochs=planner.bilstm_epochs(),
                column=f"{task.name} frozen-feature probe ({task.metric})",
            )
    return planner.steps


def features_study(planner):
    """Table 7: fine-tuning against the feature-based approach, on tagging.

    A layer choice the model is too shallow for (the last four of a 2-layer model) is a row that
    says so rather than a run.
    """
    args = planner.args
    corpus = None if (args.init_checkpoint and args.tasks) else planner.corpus_file()
    task = tagging_task(planner, corpus, "features")
    model_dir, num_layers = study_model(planner, corpus)
    planner.finetune("finetuned_conll", model_dir, task, "Fine-tuning approach")
    for choice, row in FEATURE_CHOICES:
        needed = representations.layers_needed(choice)
        if num_layers < needed:
            reason = f"n/a: needs {needed} layers, the model has {num_layers}"
            planner.add(
                Step(
                    f"features_{choice}",
                    None,
                    [],
                    "",
                    kind="skipped",
                    row=row,
                    task=task,
                    reason=reason,
                    column=task.column,
                )
            )
            continue
        planner.finetune(
            f"features_{choice}",
            model_dir,
            task,
            row,
            planner.feature_based_flags(choice),
            epochs=planner.bilstm_epochs(),
        )
    return planner.steps


def masking_study(planner):
    """Table 8: a model pretrained per masking, fine-tuned on classification and tagging, and its
    frozen features into a BiLSTM for tagging."""
    corpus = planner.corpus_file()
    vocab = planner.vocab_file(corpus)
    tasks = planner.task_data(corpus, ("glue", "conll"))
    size = [f"--model_size={planner.scale['model_size']}"]
    num_layers = modeling.NAMED_SIZES[planner.scale["model_size"]][0]
    features = next(f for f in MASKING_FEATURES if representations.layers_needed(f) <= num_layers)
    for masking in MASKINGS:
        records = planner.records(corpus, vocab, masking=masking)
        model_dir = planner.path("models", masking.name)
        planner.pretrain(Pretraining(masking.row, model_dir, []), records, vocab, size)
        for task in tasks:
            planner.finetune(f"{masking.name}_{task.name}", model_dir, task, masking.row)
        for task in (t for t in tasks if t.name == "conll"):
            planner.finetune(
                f"{masking.name}_features_{task.name}",
                model_dir,
                task,
                masking.row,
                planner.feature_based_flags(features),
                epochs=planner.bilstm_epochs(),
                column=f"{task.name} feature-based, {features} ({task.metric})",
            )
    return planner.steps


def steps_study(planner):
    """Appendix C.1: fine-tuned accuracy after each fifth of pretraining, masked LM against
    left-to-right."""
    corpus = planner.corpus_file()
    vocab = planner.vocab_file(corpus)
    contiguous = planner.records(corpus, vocab, random_next_prob=0.0)
    # The corpus's sentence pairs by default: the demo's templated sst2 is solved at every step.
    tasks = [t for t in planner.task_data(corpus, ("pair",)) if t.job == "run_classifier"]
    if not tasks:
        raise io_utils.UsageError("--study=steps needs a GLUE task in --tasks")
    size = [f"--model_size={planner.scale['model_size']}"]
    total = planner.args.pretraining_steps or planner.scale["pretraining_steps"]
    every = max(1, total // STEP_CHECKPOINTS)
    checkpoints = [every * k for k in range(1, STEP_CHECKPOINTS + 1)]
    keep = [
        f"--save_checkpoints_steps={every}",
        f"--keep_checkpoint_max={STEP_CHECKPOINTS + 1}",
        f"--num_train_steps={checkpoints[-1]}",
        # A checkpoint is saved where a loop ends: the loops must end on every `every`th step.
        f"--steps_per_loop={math.gcd(every, steps_per_loop(total))}",
    ]
    rows = [
        Pretraining("Masked LM", planner.path("models", "mlm"), ["--nsp=false", *keep]),
        Pretraining(
            "Left-to-right",
            planner.path("models", "ltr"),
            ["--nsp=false", "--objective=ltr", *keep],
        ),
    ]
    for pretraining in rows:
        planner.pretrain(pretraining, contiguous, vocab, size)
    for pretraining in rows:
        for step in checkpoints:
            for task in tasks:
                planner.finetune(
                    f"{os.path.basename(pretraining.model_dir)}_{step}_{task.name}",
                    os.path.join(pretraining.model_dir, f"ckpt-{step}"),
                    task,
                    str(step),
                    column=f"{pretraining.row}: {task.column}",
                )
    return planner.steps


def nsp_study(planner):
    """Table 5's NSP question across every task kind: a model pretrained with and without NSP,
    fine-tuned on classification, sentence pairs, multiple choice, tagging and spans."""
    corpus = planner.corpus_file()
    vocab = planner.vocab_file(corpus)
    records = planner.records(corpus, vocab)
    # Without NSP, B is always the text that follows A: the row trains on contiguous text.
    contiguous = planner.records(corpus, vocab, random_next_prob=0.0)
    tasks = planner.task_data(corpus, ("glue", "pair", "swag", "conll", "squad"))
    size = [f"--model_size={planner.scale['model_size']}"]
    rows = [
        (Pretraining("BERT (MLM + NSP)", planner.path("models", "bert"), []), records),
        (Pretraining("No NSP", planner.path("models", "no_nsp"), ["--nsp=false"]), contiguous),
    ]
    for pretraining, row_records in rows:
        planner.pretrain(pretraining, row_records, vocab, size)
    for pretraining, _ in rows:
        for task in tasks:
            name = f"{os.path.basename(pretraining.model_dir)}_{task.name}"
            planner.finetune(name, pretraining.model_dir, task, pretraining.row)
    return planner.steps


def plan(args):
    """The steps of `args.study`, in order."""
    planner = Planner(args, SCALES[args.scale])
    studies = {
        "tasks": tasks_study,
        "sizes": sizes_study,
        "features": features_study,
        "masking": masking_study,
        "layers": layers_study,
        "steps": steps_study,
        "nsp": nsp_study,
    }
    return studies[args.study](planner)
