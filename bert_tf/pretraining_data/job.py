"""Running a pretraining-data job: PretrainingDataArgs -> plan -> worker processes -> output files.

`run(args)` checks the arguments, plans the work units (plan.py), claims the output location (a
rerun with the same settings resumes; other settings are refused unless `overwrite`), and runs the
units that are not finished in `num_workers` spawned processes (worker.py): phase 1 tokenizes every
unit, phase 2 builds every unit's part file. As soon as all parts of an output file exist they are
concatenated into it (a temp file, then a rename) and deleted; the token files go once every output
is complete. summary.json (counts, label balance, truncations, invalid UTF-8, elapsed time) is
written atomically beside the outputs, the first records are logged readably as the original logs
its first instances, and input that looks wrong (no instances, much invalid UTF-8) is warned about.
With `runner` set, beam.py runs the same units, phases and assembly as an Apache Beam pipeline
instead of the processes here; everything before and after (plan, claim, summary) is shared.

With tfds input this process reads each unit's slice and hands the documents to a worker, since
tensorflow-datasets needs TensorFlow and the workers never import it. Nothing here reads absl flags:
the CLI (bert_tf.create_pretraining_data) turns its flags into a PretrainingDataArgs.
"""

import collections
import concurrent.futures
import contextlib
import dataclasses
import multiprocessing
import os
import sys
import tempfile
import time

from absl import logging

from bert_tf.pretraining_data import (
    documents,
    example_codec,
    files,
    instances,
    schema,
    tfrecord,
    worker,
)
from bert_tf.pretraining_data import plan as planning  # `plan` names the run's Plan here
from bert_tf.pretraining_data.instances import VocabInfo
from bert_tf.runtime import io_utils, quiet
from bert_tf.runtime.cli import arg
from bert_tf.tokenization import tokenizer_rules

EXAMPLES_TO_LOG = 5
# The values of --runner: Apache Beam runners that run the job as a pipeline (beam.py).
RUNNERS = (
    "DirectRunner",
    "DaskRunner",
    "DataflowRunner",
    "FlinkRunner",
    "SparkRunner",
    "PortableRunner",
)
# Warn when more than one sequence in this many bytes of text is invalid UTF-8.
INVALID_UTF8_WARNING_RATE = 100


@dataclasses.dataclass
class PretrainingDataArgs:
    """A create_pretraining_data run: every field is a flag of the CLI, with its default and help."""

    input_file: str = arg(
        None,
        "Input raw text file(s): comma-separated globs; `.gz` files are decompressed. One "
        "sentence per line, a blank line between documents.",
    )
    input_tfds: str = arg(
        None,
        "Instead of --input_file: a tensorflow-datasets split, NAME[:SPLIT[:FEATURE]] "
        "(default split `train`, feature `text`), e.g. wikipedia/20230601.en:train:text. "
        "Each example is a document; it is split into sentences.",
    )
    tfds_data_dir: str = arg(None, "tensorflow-datasets data directory for --input_tfds.")
    output_file: str = arg(
        None, "Output TF example file(s), comma-separated. Overrides --output_dir/--num_shards."
    )
    output_dir: str = arg(
        "tfrecords",
        "Directory for PREFIX-00000-of-000NN.tfrecord files when --output_file is not given.",
    )
    num_shards: int = arg(1, "Number of output files written to --output_dir.")
    output_prefix: str = arg("pretrain", "File name prefix of the files in --output_dir.")
    vocab_file: str = arg(None, "The vocabulary file that the BERT model was trained on.")
    do_lower_case: bool = arg(
        True,
        "Whether to lower case the input text. Should be True for uncased models and "
        "False for cased models.",
    )
    do_whole_word_mask: bool = arg(
        False,
        "Whether to use whole word masking rather than per-WordPiece masking (the same as "
        "--masking=whole_word).",
    )
    masking: str = arg(
        "token",
        "What is masked: single WordPieces (`token`, the original's default), whole words "
        "(`whole_word`, the original's --do_whole_word_mask), or spans of whole words (`span`: "
        "SpanBERT's lengths, Geometric(0.2) over 1 to 10 words, mean 3.8; each span gets one "
        "replacement).",
        choices=instances.MASKING_KINDS,
    )
    mask_token_prob: float = arg(
        0.8, "Of the masked positions, the share replaced by [MASK] (the original's 0.8)."
    )
    random_token_prob: float = arg(
        0.1,
        "Of the masked positions, the share replaced by a random token (the original's 0.1); "
        "the rest keep their token.",
    )
    max_seq_length: int = arg(128, "Maximum sequence length.")
    max_predictions_per_seq: int = arg(20, "Maximum number of masked LM predictions per sequence.")
    random_seed: int = arg(12345, "Random seed for data generation.")
    dupe_factor: int = arg(
        10, "Number of times to duplicate the input data (with different masks)."
    )
    masked_lm_prob: float = arg(0.15, "Masked LM probability.")
    short_seq_prob: float = arg(
        0.1, "Probability of creating sequences which are shorter than the maximum length."
    )
    random_next_prob: float = arg(
        0.5,
        "Probability that segment B is a random segment (next_sentence_labels 1) rather than the "
        "text that follows A: the original's 0.5. 0 writes actual-next pairs only, for the "
        "paper's No NSP ablations (a one-sentence chunk then splits its sentence into A and B).",
    )
    num_workers: int = arg(
        help="Worker processes; each reads, tokenizes, builds and writes whole work units. 1 "
        "runs everything in this process. The output does not depend on it. With --runner, it is "
        "passed to Beam as Beam's own --num_workers (Dataflow's initial number of workers).",
        default_factory=lambda: os.cpu_count() or 1,
    )
    overwrite: bool = arg(
        False,
        "Replace the output of an earlier run with other settings at the same output "
        "paths (without it, such a run is refused). Files no recorded run wrote are never "
        "replaced.",
    )
    compression: str = arg(
        "none",
        "Compression of the output files (gzip files are named .tfrecord.gz in --output_dir).",
        choices=tfrecord.COMPRESSIONS,
    )
    runner: str = arg(
        None,
        "Run the job as an Apache Beam pipeline on this runner, over the same work units and "
        "with the same output bytes. Beam's own pipeline options (--direct_num_workers, "
        "--direct_running_mode, --project, --region, --temp_location, --setup_file, "
        "--flink_master, ...) pass through. Without it, --num_workers processes on this machine "
        "run the job.",
        choices=RUNNERS,
    )


def validate(args, pipeline_args=()):
    """Errors in `args` (and Beam's `pipeline_args`) found before any work, each a UsageError (the
    CLI's exit code 2) naming the flag; returns the output paths, whose directories it creates
    (empty) to try them."""
    if args.vocab_file is None:
        raise io_utils.UsageError("--vocab_file is required")
    if args.max_seq_length < 5:
        raise io_utils.UsageError(f"--max_seq_length must be at least 5, got {args.max_seq_length}")
    if not 1 <= args.max_predictions_per_seq <= args.max_seq_length:
        raise io_utils.UsageError(
            f"--max_predictions_per_seq must be between 1 and --max_seq_length "
            f"({args.max_seq_length}), got {args.max_predictions_per_seq}"
        )
    if args.dupe_factor < 1:
        raise io_utils.UsageError(f"--dupe_factor must be at least 1, got {args.dupe_factor}")
    if not 0.0 < args.masked_lm_prob <= 1.0:
        raise io_utils.UsageError(f"--masked_lm_prob must be in (0, 1], got {args.masked_lm_prob}")
    for flag in ("mask_token_prob", "random_token_prob"):
        if not 0.0 <= getattr(args, flag) <= 1.0:
            raise io_utils.UsageError(f"--{flag} must be in [0, 1], got {getattr(args, flag)}")
    if args.mask_token_prob + args.random_token_prob > 1.0 + 1e-9:
        raise io_utils.UsageError(
            f"--mask_token_prob + --random_token_prob must be at most 1 (the rest keep their "
            f"token), got {args.mask_token_prob} + {args.random_token_prob}"
        )
    if args.masking not in instances.MASKING_KINDS:
        raise io_utils.UsageError(
            f"--masking must be one of {', '.join(instances.MASKING_KINDS)}, got {args.masking!r}"
        )
    if args.do_whole_word_mask and args.masking == "span":
        raise io_utils.UsageError("--do_whole_word_mask and --masking=span contradict each other")
    if not 0.0 <= args.short_seq_prob <= 1.0:
        raise io_utils.UsageError(f"--short_seq_prob must be in [0, 1], got {args.short_seq_prob}")
    if not 0.0 <= args.random_next_prob <= 1.0:
        raise io_utils.UsageError(
            f"--random_next_prob must be in [0, 1], got {args.random_next_prob}"
        )
    if args.num_workers < 1:
        raise io_utils.UsageError(f"--num_workers must be at least 1, got {args.num_workers}")
    if bool(args.input_file) == bool(args.input_tfds):
        raise io_utils.UsageError("give exactly one of --input_file and --input_tfds")
    if args.compression not in tfrecord.COMPRESSIONS:
        raise io_utils.UsageError(
            f"--compression must be one of {', '.join(tfrecord.COMPRESSIONS)}, "
            f"got {args.compression!r}"
        )
    outputs = planning.output_paths(
        args.output_file, args.output_dir, args.num_shards, args.output_prefix, args.compression
    )
    output_flag = "--output_file" if args.output_file else "--output_dir"
    if pipeline_args and not args.runner:
        raise io_utils.UsageError(
            f"unknown flags {' '.join(pipeline_args)} (Beam's pipeline options need --runner)"
        )
    if args.runner:
        if args.runner not in RUNNERS:
            raise io_utils.UsageError(
                f"--runner: unknown runner {args.runner!r}; the known runners are "
                f"{', '.join(RUNNERS)}"
            )
        # Beam's options and paths first: a bad Dataflow setup must fail before anything starts.
        try:
            from bert_tf.pretraining_data import beam
        except ImportError as e:
            raise io_utils.UsageError(f"--runner needs apache-beam ({e}): pip install it") from e
        beam.validate(args, pipeline_args, outputs, output_flag)
    elif files.is_remote(outputs[0]):
        raise io_utils.UsageError(
            f"{output_flag}: a remote output ({outputs[0]}) needs --runner (e.g. "
            "--runner=DirectRunner): this machine's worker processes write local files only"
        )
    if args.input_file:
        files.expand_globs(args.input_file, what="--input_file")  # fail before any work
    if files.is_remote(args.vocab_file):
        files.check_remote(args.vocab_file, "--vocab_file")
    if not files.isfile(args.vocab_file):
        raise io_utils.UsageError(f"--vocab_file: vocabulary file not found: {args.vocab_file}")
    planning.check_output_paths(outputs, output_flag)
    return outputs


def generation_config(args, vocab_file=None):
    """The settings that decide the records, besides the input: what the worker processes get.

    `vocab_file` is a local copy of a remote --vocab_file."""
    return planning.GenerationConfig(
        vocab_file=os.path.abspath(vocab_file or args.vocab_file),
        do_lower_case=args.do_lower_case,
        masking="whole_word" if args.do_whole_word_mask else args.masking,
        mask_token_prob=args.mask_token_prob,
        random_token_prob=args.random_token_prob,
        max_seq_length=args.max_seq_length,
        max_predictions_per_seq=args.max_predictions_per_seq,
        random_seed=args.random_seed,
        dupe_factor=args.dupe_factor,
        masked_lm_prob=args.masked_lm_prob,
        short_seq_prob=args.short_seq_prob,
        random_next_prob=args.random_next_prob,
        compression=args.compression,
    )


def run(args, log_flags=None, pipeline_args=(), beam_after_step=None):
    """Writes the pretraining records `args` asks for; returns the summary (as in summary.json).

    `log_flags(output_dir)`, when given, runs once the output location is this run's and before
    any work: the CLI writes its resolved flags there. With `args.runner` the units run as an Apache
    Beam pipeline (beam.py) with Beam's options `pipeline_args` (command-line arguments such as
    "--direct_num_workers=2"), and `beam_after_step` is beam.run_units' `after_step`; else they run
    in `args.num_workers` processes here.
    """
    start = time.time()
    outputs = validate(args, pipeline_args)
    if not tfrecord.has_fast_crc32c():
        logging.warning(
            "google-crc32c runs without its C extension here: writing records will be slow"
        )
    with _local_copy(args.vocab_file) as vocab_file:
        config = generation_config(args, vocab_file)
        pool = None if args.runner else start_workers(args.num_workers, config)
        try:
            return _run_planned(
                args, config, outputs, pool, start, log_flags, pipeline_args, beam_after_step
            )
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def _local_copy(path):
    """Yields `path`, or for a remote file a local copy of it, deleted afterwards."""
    if not files.is_remote(path):
        yield path
        return
    with tempfile.TemporaryDirectory() as directory:
        local = os.path.join(directory, os.path.basename(path))
        files.download(path, local)
        yield local


def _run_planned(args, config, outputs, pool, start, log_flags, pipeline_args, beam_after_step):
    """run() once the workers are starting: vocabulary, plan, units, outputs, summary."""
    try:
        vocab = VocabInfo.from_file(config.vocab_file)
    except tokenizer_rules.VocabError as e:
        raise io_utils.UsageError(f"--vocab_file: {e}") from e
    work_dir = planning.work_dir_path(outputs, args.output_prefix, args.output_file)
    plan = planning.make_plan(
        config,
        outputs,
        work_dir,
        input_file=args.input_file,
        input_tfds=args.input_tfds,
        tfds_data_dir=args.tfds_data_dir,
    )
    planning.claim_outputs(plan, args.overwrite)
    files.makedirs(plan.work_dir)
    if log_flags is not None:
        log_flags(os.path.dirname(files.abspath(outputs[0])))
    planning.remove_stale_temporaries(plan)

    # What a previous run with the same fingerprint already finished.
    finished = planning.find_finished(plan)
    resumed_outputs = len(finished.outputs)
    if resumed_outputs < len(outputs):
        files.remove(planning.summary_path(plan))  # it must describe exactly the files beside it
    for k in finished.outputs:
        planning.remove_parts(plan, k)  # left by a run killed between an output's manifest and this
    logging.info(
        "%d output files (%d already complete), %d work units (%d to tokenize, %d to build), %s",
        len(outputs),
        resumed_outputs,
        len(plan.units),
        len(finished.to_tokenize),
        len(finished.to_build),
        f"Beam's {args.runner}" if args.runner else f"{args.num_workers} workers",
    )
    try:
        if args.runner:
            from bert_tf.pretraining_data import beam

            output_stats, run_text_bytes = beam.run_units(
                args.runner, pipeline_args, config, plan, finished, beam_after_step
            )
        else:
            output_stats, run_text_bytes = _run_units_here(args, config, plan, finished, pool)
    except OSError as e:
        message = io_utils.full_disk_message(e)
        if message is None:
            raise
        raise io_utils.JobFailure(full_disk_report(message, plan.work_dir)) from e

    total = collections.Counter()
    for stats in output_stats.values():
        total.update(stats)
    elapsed = time.time() - start
    summary = summarize(total, plan, elapsed, run_text_bytes, resumed_outputs)
    files.write_json(planning.summary_path(plan), summary)
    planning.remove_token_files(plan)
    log_first_examples(outputs, args.compression, vocab.tokens)
    logging.info(
        "wrote %d instances from %d documents to %d file(s) in %.1f s; summary: %s",
        summary["instances"],
        summary["documents"],
        len(outputs),
        elapsed,
        planning.summary_path(plan),
    )
    logging.info(
        "each record: %s", schema.describe(args.max_seq_length, args.max_predictions_per_seq)
    )
    warn_about_input(summary)
    return summary


def full_disk_report(message, work_dir):
    """What a run stopped by a full disk says: the file (`message`), and what the work directory
    keeps (every unfinished file was removed when its write failed)."""
    kept = sum(files.getsize(path) for path in files.glob(os.path.join(work_dir, "*")))
    return (
        f"{message}. No partial output file is left; {work_dir} keeps {kept / 1e6:.1f} MB of "
        "finished work that a rerun resumes from once there is space (delete it to start over)"
    )


def _run_units_here(args, config, plan, finished, pool):
    """Runs the units left in `finished` in this machine's worker processes (or this process), and
    assembles each output file once its parts exist. Returns (stats per output file, text bytes
    tokenized in this run)."""
    output_stats, unit_stats, token_stats = finished.outputs, finished.parts, finished.tokens
    to_tokenize, pending = finished.to_tokenize, finished.to_build
    remaining = {
        k: set(indices) - set(unit_stats)
        for k, indices in enumerate(plan.units_of_output)
        if k not in output_stats
    }
    output_of_unit = planning.output_of_unit(plan)
    run_stats = collections.Counter()

    def finish_ready_outputs():
        for k in sorted(remaining):
            if not remaining[k]:
                output_stats[k] = planning.assemble_output(plan, k, unit_stats)
                del remaining[k]

    def on_tokenized(unit, stats):
        planning.record_tokens(plan, unit, stats)
        token_stats[unit.index] = stats
        run_stats.update(stats)
        progress.update(stats)

    def on_built(unit, stats):
        run_stats.update(stats)
        progress.update(stats)
        unit_stats[unit.index] = planning.record_part(plan, unit, token_stats[unit.index], stats)
        remaining[output_of_unit[unit.index]].discard(unit.index)
        finish_ready_outputs()

    units = len(plan.units)
    progress = Progress(2 * units, 2 * units - len(to_tokenize) - len(pending))
    corpus_index = planning.corpus_index_path(plan)
    try:
        finish_ready_outputs()  # outputs whose parts all survived a killed run
        run_units(
            lambda unit: (worker.tokenize_unit, config, unit, unit_pieces(unit)),
            to_tokenize,
            pool,
            args.num_workers,
            on_tokenized,
        )
        if pending:
            worker.write_corpus_index(
                corpus_index,
                [(unit.tokens_prefix, token_stats[unit.index]["originals"]) for unit in plan.units],
            )
        run_units(
            lambda unit: (worker.build_unit_part, config, unit, corpus_index),
            pending,
            pool,
            args.num_workers,
            on_built,
        )
    finally:
        progress.close()
    return output_stats, run_stats.get("text_bytes", 0)


# ---------------------------------------------------------------------------------------------
# Running the units
# ---------------------------------------------------------------------------------------------


class Progress:
    """A tqdm bar on stderr over units, with documents/s and instances written."""

    def __init__(self, total_units, done_units):
        from tqdm import tqdm

        self.bar = tqdm(
            total=total_units,
            initial=done_units,
            unit="unit",
            file=sys.stderr,
            desc="create_pretraining_data",
            dynamic_ncols=True,
            mininterval=0.5,
            disable=not quiet.stderr_is_terminal(),
        )
        self.start = time.time()
        self.documents = 0
        self.instances = 0

    def update(self, stats):
        """Counts one finished unit."""
        self.documents += stats.get("documents", 0)
        self.instances += stats.get("instances", 0)
        rate = self.documents / max(time.time() - self.start, 1e-9)
        self.bar.set_postfix_str(f"docs/s={rate:,.0f} instances={self.instances:,}", refresh=False)
        self.bar.update(1)

    def close(self):
        """Closes the bar."""
        self.bar.close()


def start_workers(num_workers, config):
    """The worker processes (None for --num_workers=1), started at once, so that their start-up
    overlaps this process's planning. spawn: a clean interpreter, which never imports TensorFlow."""
    if num_workers < 2:
        return None
    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=num_workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=worker.exit_with_parent,
        initargs=(os.getpid(),),
    )
    for _ in range(num_workers):
        pool.submit(
            worker.warm_up_worker, config
        )  # the pool starts a process per job while none is idle
    return pool


def unit_pieces(unit):
    """The (original, document) pairs of a tfds unit, read here (tensorflow-datasets needs
    TensorFlow, which workers do not import); None for a file unit, which its worker reads itself."""
    return list(documents.iter_tfds_pieces(*unit.tfds)) if unit.tfds is not None else None


def run_units(job, pending, pool, num_workers, on_done):
    """Runs `job(unit)`, a (function, *args) tuple, for each of the `pending` units in a worker.

    `on_done(unit, result)` runs here as each unit finishes, in completion order. At most two units
    per worker are queued, so that a tfds unit's documents, read here, wait in memory for a short
    while only. Without a pool, this process runs the units one by one.
    """
    if pool is None:
        for unit in pending:
            function, *args = job(unit)
            on_done(unit, function(*args))
        return
    units = iter(pending)
    in_flight = {}

    def submit_next():
        unit = next(units, None)
        if unit is not None:
            in_flight[pool.submit(*job(unit))] = unit

    for _ in range(2 * num_workers):
        submit_next()
    try:
        while in_flight:
            done, _ = concurrent.futures.wait(
                in_flight, return_when=concurrent.futures.FIRST_COMPLETED
            )
            for future in sorted(done, key=lambda f: in_flight[f].index):
                on_done(in_flight.pop(future), future.result())
                submit_next()
    finally:
        for future in in_flight:
            future.cancel()


# ---------------------------------------------------------------------------------------------
# Reporting: summary.json, the first records, warnings
# ---------------------------------------------------------------------------------------------


def log_first_examples(outputs, compression, vocab_tokens, count=EXAMPLES_TO_LOG):
    """Logs the first records of the output readably, as the original logs its first instances;
    at --verbosity=1 (DEBUG), as they fill a screen."""
    if not logging.level_debug():
        return
    logged = 0
    for path in outputs:
        for record in tfrecord.iter_first_records(path, compression, count - logged):
            logging.debug("*** Example ***")
            for line in example_codec.example_to_text(
                example_codec.parse_example(record), vocab_tokens
            ):
                logging.debug("%s", line)
            logged += 1
        if logged >= count:
            return


def summarize(stats, plan, elapsed, run_text_bytes, resumed_outputs):
    """The content of summary.json."""
    instances = stats.get("instances", 0)
    masked = stats.get("masked_positions", 0)
    ratio = lambda a, b: round(a / b, 6) if b else None
    return {
        "outputs": plan.outputs,
        "documents": stats.get("documents", 0),
        "documents_skipped_empty": stats.get("documents_skipped", 0),
        "documents_cut_long": stats.get("documents_cut", 0),
        "sentences": stats.get("sentences", 0),
        "tokens": stats.get("tokens", 0),
        "text_bytes": stats.get("text_bytes", 0),
        "instances": instances,
        "instance_tokens": stats.get("instance_tokens", 0),
        "masked_positions": masked,
        "masked_lm": {
            **masking_summary(plan.settings["config"]),
            "as_mask": stats.get("masked_as_mask", 0),
            "kept": stats.get("masked_kept", 0),
            "random": stats.get("masked_random", 0),
            "fraction_of_tokens": ratio(masked, stats.get("instance_tokens", 0)),
        },
        "next_sentence_labels": {
            # --random_next_prob: the chance of a random B for a chunk of two or more sentences.
            "random_next_prob": plan.settings["config"].get(
                "random_next_prob", planning.ORIGINAL_RANDOM_NEXT_PROB
            ),
            "random_next (1)": stats.get("random_next", 0),
            "actual_next (0)": stats.get("actual_next", 0),
            "random_next_fraction": ratio(stats.get("random_next", 0), instances),
            # B drawn from A's own document: only when the corpus has a single document.
            "random_next_own_document": stats.get("random_next_own_document", 0),
        },
        "short_target_instances": stats.get("short_target_instances", 0),
        "truncated_instances": stats.get("truncated_instances", 0),
        "truncated_tokens": stats.get("truncated_tokens", 0),
        "invalid_utf8": stats.get("invalid_utf8", 0),
        "long_line_pieces": stats.get("long_line_pieces", 0),
        "units": len(plan.units),
        "outputs_resumed": resumed_outputs,
        "input_bytes": plan.input_bytes,
        "elapsed_seconds": round(elapsed, 3),
        "text_mb_per_second_this_run": round(run_text_bytes / 1e6 / elapsed, 4)
        if elapsed
        else None,
        "fingerprint": plan.fingerprint,
    }


def masking_summary(config):
    """How positions were masked and replaced, from a run's recorded settings (plan.settings)."""
    config = {**planning.UNRECORDED_DEFAULTS, **config}
    masking = config.get("masking") or ("whole_word" if config["do_whole_word_mask"] else "token")
    summary = {
        "masking": masking,
        "mask_token_prob": config["mask_token_prob"],
        "random_token_prob": config["random_token_prob"],
    }
    if masking == "span":
        summary["span_words"] = {
            "geometric_p": instances.SPAN_GEOMETRIC_P,
            "max": instances.MAX_SPAN_WORDS,
            "mean": round(float(instances.mean_span_words()), 4),
        }
    return summary


def warn_about_input(summary):
    """Warns when the input gave no instances, or looks like something other than UTF-8 text."""
    if not summary["instances"]:
        logging.warning(
            "the input gave no instances (%d documents with text in %d bytes): is it empty, or not "
            "text with one sentence per line and a blank line between documents?",
            summary["documents"],
            summary["text_bytes"],
        )
    invalid, text_bytes = summary["invalid_utf8"], summary["text_bytes"]
    if invalid and invalid * INVALID_UTF8_WARNING_RATE > text_bytes:
        logging.warning(
            "the input holds %d invalid UTF-8 sequences in %d bytes of text; they are dropped. Is it "
            "UTF-8 text?",
            invalid,
            text_bytes,
        )
