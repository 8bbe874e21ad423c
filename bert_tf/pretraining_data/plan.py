"""Planning a pretraining-data run: work units, output shards, and the manifests that make it resume.

  * The input is cut into work units of about `UNIT_BYTES` (1 MiB) of input each. Output file k of N
    holds the units of the k-th of N equal byte ranges of the concatenated input files, in order
    (a tfds split is cut into N times as many even slices).
  * A unit is processed in two phases (worker.py): its token files, then its part file. An output
    file is its units' parts, concatenated (`assemble_output`, for the local path and Beam alike).
  * Every unit's token files, every part and every output file get a small JSON manifest written
    after their rename, carrying a fingerprint of everything that decides the bytes (the
    generation settings, the vocabulary's contents, input paths, sizes and mtimes, output paths,
    format version). A rerun with the same fingerprint skips whatever has a matching manifest and
    the recorded sizes, so a killed run resumes; a run with other settings at the same output paths
    is refused, or with `overwrite` replaces everything of the earlier run (`claim_outputs`). A file
    at an output's name that no recorded run wrote is never removed: the run is refused.

Everything comes in as plain arguments (no absl flags), named as the CLI's flags, which the usage
errors name. Paths may be remote (gs://, for a Beam run): files.py handles both kinds. No
TensorFlow here (`tfds_units` imports tensorflow-datasets when called).
"""

import collections
import dataclasses
import glob
import hashlib
import json
import math
import os
import re
import tempfile

from absl import logging

from bert_tf.pretraining_data import documents, files, tokenized_corpus
from bert_tf.runtime import io_utils

# The input of a work unit: about one block (documents.BLOCK_BYTES), so that a unit's blocks are
# one, except where a huge document makes more. Part of the output's identity (see `settings`).
UNIT_BYTES = documents.BLOCK_BYTES
# Bumped whenever a change to the package changes the records written for the same input and flags.
FORMAT_VERSION = 3


# ---------------------------------------------------------------------------------------------
# The work: units, output files, settings
# ---------------------------------------------------------------------------------------------


# The original's chance that sentence B is a random one (its hard-coded 0.5).
ORIGINAL_RANDOM_NEXT_PROB = 0.5
# The original's replacements of a masked position: [MASK] 80% of the time, a random token 10%.
ORIGINAL_MASK_TOKEN_PROB = 0.8
ORIGINAL_RANDOM_TOKEN_PROB = 0.1
# Settings a run written before their option existed did not record: left out of `settings` at
# these values, so that such a run's fingerprint (and its resume) is unchanged.
UNRECORDED_DEFAULTS = {
    "random_next_prob": ORIGINAL_RANDOM_NEXT_PROB,
    "mask_token_prob": ORIGINAL_MASK_TOKEN_PROB,
    "random_token_prob": ORIGINAL_RANDOM_TOKEN_PROB,
}


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """Everything that decides the records, besides the input: picklable, for worker processes."""

    vocab_file: str
    do_lower_case: bool = True
    masking: str = "token"  # instances.MASKING_KINDS
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    random_seed: int = 12345
    dupe_factor: int = 10
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    random_next_prob: float = ORIGINAL_RANDOM_NEXT_PROB
    mask_token_prob: float = ORIGINAL_MASK_TOKEN_PROB
    random_token_prob: float = ORIGINAL_RANDOM_TOKEN_PROB
    compression: str = "none"  # or "gzip": each part is a gzip member, so parts concatenate


@dataclasses.dataclass(frozen=True)
class WorkUnit:
    """A contiguous piece of the input: (path, start, end) file ranges, or a tfds split slice."""

    index: int
    ranges: tuple = ()  # ((path, start, end), ...)
    tfds: tuple = None  # (name, split_slice, feature, data_dir)
    output_path: str = ""  # the part file this unit writes

    @property
    def tokens_prefix(self):
        """Where phase 1 writes the unit's token files (tokenized_corpus.unit_files)."""
        return os.path.splitext(self.output_path)[0]


@dataclasses.dataclass
class Plan:
    """The work: units, which units make which output file, and the run's fingerprint."""

    outputs: list
    units: list  # WorkUnit, in index order
    units_of_output: list  # per output: unit indices, in order
    settings: dict  # everything that decides the bytes (see `settings`)
    fingerprint: str
    work_dir: str
    input_bytes: int


def parse_tfds_spec(spec):
    """NAME[:SPLIT[:FEATURE]] -> (name, split, feature); a split may hold slices like train[:10%]."""
    match = re.fullmatch(r"([^:\[\]]+)(?::([^:\[]+(?:\[[^\]]*\])?))?(?::([\w/.-]+))?", spec.strip())
    if not match:
        raise io_utils.UsageError(f"--input_tfds: expected NAME[:SPLIT[:FEATURE]], got {spec!r}")
    name, split, feature = match.groups()
    return name, split or "train", feature or "text"


def output_paths(output_file, output_dir, num_shards, prefix, compression):
    """The output files: --output_file's list, or PREFIX-00000-of-000NN.tfrecord[.gz] in output_dir."""
    if output_file:
        paths = [p.strip() for p in output_file.split(",") if p.strip()]
        if not paths:
            raise io_utils.UsageError("--output_file is empty")
        if len(set(paths)) != len(paths):
            raise io_utils.UsageError(f"--output_file names a file twice: {output_file}")
        return paths
    if num_shards < 1:
        raise io_utils.UsageError(f"--num_shards must be at least 1, got {num_shards}")
    suffix = ".tfrecord.gz" if compression == "gzip" else ".tfrecord"
    return [
        os.path.join(output_dir, f"{prefix}-{i:05d}-of-{num_shards:05d}{suffix}")
        for i in range(num_shards)
    ]


def check_output_paths(outputs, flag):
    """Refuses, before any work, outputs that cannot be written: a directory where an output file
    goes, a file where a directory must be, a directory this process cannot write to.

    Creates the output directories (empty) to try them.
    """
    directories = []
    for path in outputs:
        if files.is_remote(path):
            files.check_remote(path, flag)
            continue
        if os.path.isdir(path):
            raise io_utils.UsageError(f"{flag}: {path} is a directory; an output file goes there")
        directory = os.path.dirname(os.path.abspath(path))
        ancestor = directory
        while not os.path.exists(ancestor):
            ancestor = os.path.dirname(ancestor)
        if not os.path.isdir(ancestor):
            raise io_utils.UsageError(
                f"{flag}: {ancestor} is a file; the output directory {directory} "
                "cannot be made there"
            )
        if directory not in directories:
            directories.append(directory)
    for directory in directories:
        try:
            os.makedirs(directory, exist_ok=True)
            with tempfile.TemporaryFile(dir=directory):
                pass
        except OSError as e:
            raise io_utils.UsageError(
                f"{flag}: cannot write to {directory}: {e.strerror or e}"
            ) from None


def work_dir_path(outputs, output_prefix, output_file=None):
    """Where a run keeps its settings, manifests, parts and token files: OUTPUT_DIR/.PREFIX.work, or
    .NAME.work beside the first file of an explicit `output_file` list."""
    first = outputs[0]
    name = output_prefix if not output_file else os.path.basename(first)
    return os.path.join(os.path.dirname(files.abspath(first)), f".{name}.work")


def file_units(paths, num_outputs, unit_bytes=None):
    """Splits the concatenated files `paths` into num_outputs equal ranges, each into ~unit_bytes units.

    Returns (list of per-unit ((path, start, end), ...) ranges, per-output lists of unit indices).
    """
    unit_bytes = unit_bytes or UNIT_BYTES
    sizes = [files.getsize(path) for path in paths]
    bases = [sum(sizes[:i]) for i in range(len(paths))]
    total = sum(sizes)
    unit_ranges, units_of_output = [], []
    for k in range(num_outputs):
        low, high = total * k // num_outputs, total * (k + 1) // num_outputs
        count = max(1, math.ceil((high - low) / unit_bytes))
        indices = []
        for j in range(count):
            unit_low = low + (high - low) * j // count
            unit_high = low + (high - low) * (j + 1) // count
            ranges = tuple(
                (path, max(unit_low, base) - base, min(unit_high, base + size) - base)
                for path, base, size in zip(paths, bases, sizes)
                if max(unit_low, base) < min(unit_high, base + size)
            )
            indices.append(len(unit_ranges))
            unit_ranges.append(ranges)
        units_of_output.append(indices)
    return unit_ranges, units_of_output


def tfds_units(name, split, feature, data_dir, num_outputs, unit_bytes=None):
    """Splits a tfds split into contiguous slices (per-unit tfds specs, per-output unit indices)."""
    import tensorflow_datasets as tfds

    unit_bytes = unit_bytes or UNIT_BYTES
    builder = tfds.builder(name, data_dir=data_dir)
    builder.download_and_prepare()
    try:
        num_bytes = builder.info.splits[split].num_bytes
    except (KeyError, ValueError):
        num_bytes = 0  # unknown split sizes (e.g. mocked data): one unit per output file
    count = max(num_outputs, math.ceil(num_bytes / unit_bytes))
    count = math.ceil(count / num_outputs) * num_outputs
    slices = [split] if count == 1 else tfds.even_splits(split, n=count)
    per_output = count // num_outputs
    specs = [(name, str(s), feature, data_dir) for s in slices]
    units_of_output = [
        list(range(k * per_output, (k + 1) * per_output)) for k in range(num_outputs)
    ]
    return specs, units_of_output


def settings(config, inputs, outputs, work_dir):
    """Everything that decides the output bytes, as JSON-able values.

    Output paths are relative to the work directory, so that a copied output directory still
    resumes (or is found complete) under the same settings.
    """
    with open(config.vocab_file, "rb") as f:
        vocab_digest = hashlib.sha256(f.read()).hexdigest()
    values = {**dataclasses.asdict(config), "vocab_file": vocab_digest}
    for key, value in UNRECORDED_DEFAULTS.items():
        if values[key] == value:
            del values[key]
    # Whole words recorded as the original's flag (so the fingerprints of such runs stay); spans
    # under `masking`.
    masking = values.pop("masking")
    values["do_whole_word_mask"] = masking == "whole_word"
    if masking == "span":
        values["masking"] = masking
    return {
        "format_version": FORMAT_VERSION,
        "unit_bytes": UNIT_BYTES,
        "config": values,
        "inputs": inputs,
        "outputs": [os.path.relpath(files.abspath(p), work_dir) for p in outputs],
    }


def fingerprint(settings_):
    """A hash of the settings; every manifest must carry the same one."""
    return hashlib.sha256(json.dumps(settings_, sort_keys=True).encode()).hexdigest()


def setting_differences(old, new):
    """The settings that differ between two `settings` dicts, named as a user would fix them."""
    differences = []
    old_config, new_config = old.get("config", {}), new["config"]
    unset = {**UNRECORDED_DEFAULTS, "masking": "token"}  # (settings() leaves them out)
    for key in dict.fromkeys([*new_config, *old_config]):
        was, now = old_config.get(key, unset.get(key)), new_config.get(key, unset.get(key))
        if key == "vocab_file":
            if was != now:
                differences.append("the --vocab_file contents")
        elif was != now:
            differences.append(f"--{key} (was {was!r}, now {now!r})")
    if old.get("inputs") != new["inputs"]:
        differences.append("the input (its files, their sizes or modification times)")
    if old.get("outputs") != new["outputs"]:
        differences.append(
            "the output files (--num_shards, --output_prefix, --output_file or --compression)"
        )
    if (old.get("format_version"), old.get("unit_bytes")) != (
        new["format_version"],
        new["unit_bytes"],
    ):
        differences.append("the record format of this bert_tf version")
    return differences


def make_plan(config, outputs, work_dir, input_file=None, input_tfds=None, tfds_data_dir=None):
    """The Plan of a run that reads `input_file` (comma-separated globs) or the tfds split `input_tfds`
    (NAME[:SPLIT[:FEATURE]]; exactly one of them) into `outputs`."""
    if input_file:
        paths = files.expand_globs(input_file, what="--input_file")
        unit_specs, units_of_output = file_units(paths, len(outputs))
        inputs = [(files.abspath(p), *files.size_and_mtime(p)) for p in paths]
        input_bytes = sum(size for _, size, _ in inputs)
        as_unit = lambda spec: dict(ranges=spec)
    else:
        name, split, feature = parse_tfds_spec(input_tfds)
        unit_specs, units_of_output = tfds_units(name, split, feature, tfds_data_dir, len(outputs))
        inputs = [input_tfds, tfds_data_dir]
        input_bytes = 0
        as_unit = lambda spec: dict(tfds=spec)
    units = [
        WorkUnit(
            index=i, output_path=os.path.join(work_dir, f"unit-{i:06d}.tfrecord"), **as_unit(spec)
        )
        for i, spec in enumerate(unit_specs)
    ]
    run_settings = settings(config, inputs, outputs, work_dir)
    return Plan(
        outputs=outputs,
        units=units,
        units_of_output=units_of_output,
        settings=run_settings,
        fingerprint=fingerprint(run_settings),
        work_dir=work_dir,
        input_bytes=input_bytes,
    )


# ---------------------------------------------------------------------------------------------
# Manifests: how a rerun knows a part or an output file is complete and made the same way
# ---------------------------------------------------------------------------------------------


def read_json(path):
    """The JSON in `path`, or None when it is missing or unreadable (a kill mid-write cannot
    leave half a file, since manifests are written atomically; this guards against hand edits)."""
    return files.read_json(path)


def settings_path(plan):
    """Where the settings of the run that owns the outputs live."""
    return os.path.join(plan.work_dir, "settings.json")


def summary_path(plan):
    """Where summary.json lives: beside the first output file."""
    return os.path.join(os.path.dirname(files.abspath(plan.outputs[0])), "summary.json")


def claim_outputs(plan, overwrite):
    """Makes the output location this run's before anything is written there.

    A rerun with the recorded settings resumes. Outputs of a run with other settings are a
    UsageError naming what differs, unless `overwrite`: then that run's files go first, so that no
    output file of one run ever sits beside another's. Files this job did not write (not listed in
    the recorded settings) at this run's output names are a UsageError, `overwrite` or not: they
    are never removed. The work directory (.PREFIX.work, a name of this job's) is. Records the
    settings.
    """
    recorded = read_json(settings_path(plan))
    if recorded is not None and recorded.get("fingerprint") == plan.fingerprint:
        return
    ours = set()
    if recorded is not None:
        ours = {
            files.abspath(files.normpath(os.path.join(plan.work_dir, p)))
            for p in recorded.get("settings", {}).get("outputs", [])
        }
        ours.add(files.abspath(summary_path(plan)))  # the recorded run's, beside its outputs
    wanted = {files.abspath(p) for p in list(plan.outputs) + [summary_path(plan)]}
    foreign = sorted(p for p in wanted - ours if files.isfile(p))
    if foreign:
        raise io_utils.UsageError(
            f"{foreign[0]} is in the way of this run's output, and create_pretraining_data did not "
            f"write it (no run's settings in {settings_path(plan)} name it): it is never replaced, "
            "--overwrite or not. Move it, or write to a new --output_dir."
        )
    earlier = sorted(p for p in ours if files.isfile(p))
    if earlier and not overwrite:
        what = "a run with other settings: " + "; ".join(
            setting_differences(recorded.get("settings", {}), plan.settings)
        )
        raise io_utils.UsageError(
            f"{earlier[0]} is the output of {what}. Write to a new --output_dir, or pass --overwrite to "
            "replace that output."
        )
    for path in earlier:
        logging.warning("--overwrite: removing %s", path)
        files.remove(path)
    files.rmtree(plan.work_dir)  # manifests, parts and token files of the other run
    files.write_json(
        settings_path(plan), {"fingerprint": plan.fingerprint, "settings": plan.settings}
    )


def unit_manifest_path(unit):
    """Where the manifest of a unit's part file lives."""
    return unit.output_path[: -len(".tfrecord")] + ".json"


def tokens_manifest_path(unit):
    """Where the manifest of a unit's token files (phase 1) lives."""
    return unit.tokens_prefix + ".tokens.json"


def record_tokens(plan, unit, stats):
    """Writes the manifest that marks `unit`'s token files (phase 1) complete, with their sizes."""
    sizes = [files.getsize(p) for p in tokenized_corpus.unit_files(unit.tokens_prefix)]
    files.write_json(
        tokens_manifest_path(unit),
        {"fingerprint": plan.fingerprint, "bytes": sizes, "stats": stats},
    )


def record_part(plan, unit, token_stats, build_stats):
    """Writes the manifest that marks `unit`'s part (phase 2) complete; returns the unit's stats,
    both phases' counts together."""
    merged = collections.Counter(token_stats)
    merged.update(build_stats)  # (`+` would drop zero counts such as an empty part's size)
    stats = dict(merged)
    files.write_json(
        unit_manifest_path(unit),
        {"fingerprint": plan.fingerprint, "bytes": stats["part_bytes"], "stats": stats},
    )
    return stats


def output_of_unit(plan):
    """{unit index: the index of the output file its part goes into}."""
    return {u: k for k, indices in enumerate(plan.units_of_output) for u in indices}


def tokens_completed(manifest, plan, unit):
    """True when phase 1 of `unit` finished in a run with this fingerprint and its files are intact."""
    paths = tokenized_corpus.unit_files(unit.tokens_prefix)
    return (
        manifest is not None
        and manifest.get("fingerprint") == plan.fingerprint
        and [files.getsize(p) if files.isfile(p) else None for p in paths] == manifest.get("bytes")
    )


def corpus_index_path(plan):
    """Where the list of every unit's token files, read by phase 2's workers, lives."""
    return os.path.join(plan.work_dir, "corpus.json")


def remove_token_files(plan):
    """Deletes phase 1's files once every output is complete (they take about the input's size)."""
    suffixes = [*tokenized_corpus.SUFFIXES, ".tokens.json"]
    patterns = [os.path.join(glob.escape(plan.work_dir), "unit-*" + s) for s in suffixes]
    files.remove_matching(patterns + [glob.escape(corpus_index_path(plan))])


def output_manifest_path(plan, k):
    """Where the manifest of output file k lives."""
    return os.path.join(plan.work_dir, f"output-{k:05d}.json")


def completed(manifest, plan, path):
    """True when `manifest` matches this run's fingerprint and `path` has the recorded size."""
    return (
        manifest is not None
        and manifest.get("fingerprint") == plan.fingerprint
        and files.isfile(path)
        and files.getsize(path) == manifest.get("bytes")
    )


def assemble_output(plan, k, unit_stats):
    """Concatenates output k's parts into the output file, writes its manifest, drops the parts.

    Concatenated TFRecord files are one TFRecord file; concatenated gzip members are one gzip file,
    which TFRecordDataset(compression_type="GZIP") reads.
    """
    path = plan.outputs[k]
    with files.atomic_path(path) as tmp:
        with open(tmp, "wb") as out:
            for u in plan.units_of_output[k]:
                files.copy_to(plan.units[u].output_path, out)
    stats = collections.Counter()
    for u in plan.units_of_output[k]:
        stats.update(unit_stats[u])
    manifest = {
        "fingerprint": plan.fingerprint,
        "output": files.abspath(path),
        "bytes": files.getsize(path),
        "units": len(plan.units_of_output[k]),
        "stats": stats,
    }
    files.write_json(output_manifest_path(plan, k), manifest)
    remove_parts(plan, k)
    return stats


def remove_parts(plan, k):
    """Deletes the parts of output k and their manifests, once the output file and its manifest exist."""
    for u in plan.units_of_output[k]:
        for path in (plan.units[u].output_path, unit_manifest_path(plan.units[u])):
            files.remove(path)


def remove_stale_temporaries(plan):
    """Deletes temp files a killed run left (atomic_path's NAME.XXXX.tmp) beside parts and outputs."""
    patterns = [os.path.join(plan.work_dir, "*.tmp")]
    patterns += [glob.escape(p) + ".*.tmp" for p in plan.outputs]
    files.remove_matching(patterns)


@dataclasses.dataclass
class Finished:
    """What an earlier run with the plan's fingerprint left complete, and what is left to do."""

    outputs: dict  # output index -> stats, for each complete output file
    parts: dict  # unit index -> stats, for each complete part of an output still to assemble
    tokens: (
        dict  # unit index -> phase 1 stats, for each tokenized unit (when a part is left to build)
    )
    to_build: list  # units whose part is still to build (phase 2), in index order
    to_tokenize: list  # units still to tokenize (phase 1), in index order


def find_finished(plan):
    """What is complete at the plan's paths: manifests with its fingerprint, files of the recorded sizes."""
    # One listing instead of a read per unit: a remote work directory answers each in ~30 ms.
    manifests = set(files.glob(os.path.join(glob.escape(plan.work_dir), "*.json")))
    read_json = lambda path: files.read_json(path) if path in manifests else None
    outputs = {}
    for k, path in enumerate(plan.outputs):
        manifest = read_json(output_manifest_path(plan, k))
        if completed(manifest, plan, path):
            outputs[k] = manifest["stats"]
    parts, to_build = {}, []
    for k, indices in enumerate(plan.units_of_output):
        if k in outputs:
            continue
        for u in indices:
            unit = plan.units[u]
            manifest = read_json(unit_manifest_path(unit))
            if completed(manifest, plan, unit.output_path):
                parts[u] = manifest["stats"]
            else:
                to_build.append(unit)
    # Phase 1 tokenizes every unit whenever a part is still to build: its random-next segments can
    # come from any unit.
    tokens, to_tokenize = {}, []
    if to_build:
        for unit in plan.units:
            manifest = read_json(tokens_manifest_path(unit))
            if tokens_completed(manifest, plan, unit):
                tokens[unit.index] = manifest["stats"]
            else:
                to_tokenize.append(unit)
    return Finished(
        outputs=outputs, parts=parts, tokens=tokens, to_build=to_build, to_tokenize=to_tokenize
    )
