"""create_pretraining_data --runner=...: Beam writes the local run's bytes, survives retries, and
refuses bad runners and options before anything starts."""

import dataclasses
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest.mock
import uuid

import pytest
from apache_beam.io.filesystem import FileMetadata
from apache_beam.io.localfilesystem import LocalFileSystem
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from beam_steps import FailOnce
from helpers import ROOT as REPO
from helpers import run_module_cli, wait_for
from helpers_beam import (
    SMALL_UNIT,
    VOCAB_FILE,
    assert_same_as_reference,
    make_args,
    outputs_in,
    read_bytes,
    run_small_units,
    without_timings,
)

from bert_tf.pretraining_data import beam, job, plan
from bert_tf.runtime import io_utils
from bert_tf.runtime.child_reaper import processes_holding


def cli_command(*args):
    return [sys.executable, "-m", "bert_tf.create_pretraining_data", *args]


def run_cli(*args):
    return run_module_cli("bert_tf.create_pretraining_data", *args, timeout=600)


@pytest.mark.slow
def test_direct_runner_with_two_processes_writes_the_local_bytes(corpus_file, reference, tmp_path):
    directory = str(tmp_path / "beam")
    args = make_args(corpus_file, directory, runner="DirectRunner")
    options = ("--direct_running_mode=multi_processing", "--direct_num_workers=2")
    assert_same_as_reference(directory, run_small_units(args, options), reference)


@pytest.mark.slow
def test_cli_passes_beam_options_through(corpus_file, tmp_path):
    # The real CLI: Beam's options are not its flags and reach Beam as given, the flags file keeps
    # them for --flagfile, and the bytes are those of the local path on the same flags.
    flags = [
        f"--input_file={corpus_file}",
        f"--vocab_file={VOCAB_FILE}",
        "--num_shards=2",
        "--dupe_factor=1",
        "--max_seq_length=64",
        "--max_predictions_per_seq=10",
    ]
    local, on_beam = str(tmp_path / "local"), str(tmp_path / "beam")
    beam_options = ["--direct_running_mode", "multi_processing", "--direct_num_workers=2"]
    result = run_cli(*flags, f"--output_dir={on_beam}", "--runner=DirectRunner", *beam_options)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "*** Example ***" not in result.stderr  # at --verbosity=1 only
    job.run(make_args(corpus_file, local, dupe_factor=1))
    assert read_bytes(outputs_in(on_beam)) == read_bytes(outputs_in(local))
    flags_file = open(os.path.join(on_beam, "create_pretraining_data.flags")).read()
    assert "--runner=DirectRunner" in flags_file
    assert "--direct_running_mode=multi_processing\n--direct_num_workers=2\n" in flags_file


@pytest.mark.slow
def test_a_beam_run_prints_a_few_lines_and_no_alarming_notices(corpus_file, tmp_path):
    # Issue 34: the demo's Beam step printed about 120 lines: "apitools not found", "Discarding
    # unparseable args", every worker's INFO lines twice (once relayed as a protobuf dump).
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # as a user runs it
    command = cli_command(
        f"--input_file={corpus_file}",
        f"--vocab_file={VOCAB_FILE}",
        f"--output_dir={tmp_path / 'beam'}",
        "--num_shards=2",
        "--dupe_factor=1",
        "--max_seq_length=64",
        "--max_predictions_per_seq=10",
        "--runner=DirectRunner",
        "--direct_running_mode=multi_processing",
        "--direct_num_workers=2",
    )
    result = subprocess.run(
        command,
        env={**env, "PYTHONPATH": REPO},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    # The job's own lines: flags, plan, the 5 examples (6 lines each), what it wrote, the schema.
    assert len(output.splitlines()) <= 40, output
    for notice in (
        "apitools",
        "Discarding unparseable args",
        "semi_persistent_directory",
        "Worker: severity",
        "sdk_worker",
        "starting control server",
    ):
        assert notice not in output, output


@pytest.mark.slow
def test_portable_runner_through_a_job_server(corpus_file, reference, tmp_path):
    # Flink and Spark take jobs through Beam's portable runner; Beam's own local job service stands
    # in for their job servers here: the job goes over the Job API, the work to a LOOPBACK worker.
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "apache_beam.runners.portability.local_job_service_main",
            f"--port={port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("localhost", port)) == 0:
                    break
            time.sleep(0.2)
        directory = str(tmp_path / "portable")
        args = make_args(corpus_file, directory, runner="PortableRunner")
        options = (f"--job_endpoint=localhost:{port}", "--environment_type=LOOPBACK")
        assert_same_as_reference(directory, run_small_units(args, options), reference)
    finally:
        server.kill()
        server.wait()


@pytest.mark.slow
@pytest.mark.parametrize("phase,key", [("tokenize", 1), ("build", 2), ("assemble", 1)])
def test_a_work_unit_that_fails_once_is_retried(corpus_file, reference, tmp_path, phase, key):
    # BundleBasedDirectRunner retries a failed bundle (4 attempts; DirectRunner's FnApiRunner does
    # not retry). The failure comes after the step wrote its files, as when a worker is lost before
    # its bundle commits: the retry must overwrite, not duplicate, and lose nothing.
    marker = tmp_path / "failed-once"
    directory = str(tmp_path / "beam")
    args = make_args(corpus_file, directory, runner="DirectRunner")
    with unittest.mock.patch.object(beam, "make_runner", lambda *_: BundleBasedDirectRunner()):
        summary = run_small_units(args, beam_after_step=FailOnce(phase, key, marker))
    assert marker.exists()  # it did fail
    assert_same_as_reference(directory, summary, reference)


@pytest.mark.parametrize(
    "options",
    [
        dict(random_next_prob=0),  # the paper's No NSP data
        dict(masking="span", mask_token_prob=0.0, random_token_prob=1.0),
        dict(masking="whole_word", mask_token_prob=1.0, random_token_prob=0.0),
    ],
    ids=["random_next_prob", "span", "whole_word"],
)
def test_generation_options_reach_the_beam_workers(corpus_file, tmp_path, options):
    local = run_small_units(make_args(corpus_file, str(tmp_path / "local"), **options))
    directory = str(tmp_path / "beam")
    summary = run_small_units(make_args(corpus_file, directory, runner="DirectRunner", **options))
    assert read_bytes(outputs_in(directory)) == read_bytes(outputs_in(str(tmp_path / "local")))
    assert without_timings(summary) == without_timings(local)
    labels, masked_lm = summary["next_sentence_labels"], summary["masked_lm"]
    if "random_next_prob" in options:
        assert labels["random_next_prob"] == 0 and labels["random_next (1)"] == 0
        assert labels["actual_next (0)"] == summary["instances"] > 100
    else:
        assert masked_lm["masking"] == options["masking"]
        as_mask = masked_lm["as_mask"] / summary["masked_positions"]
        assert as_mask == options["mask_token_prob"]


def test_a_failed_run_leaves_no_shard_that_looks_complete_and_resumes(
    corpus_file, reference, tmp_path
):
    # DirectRunner does not retry: the run fails after output 0's manifest was written (output 1's
    # assembly fails). A shard is either complete with its manifest or absent; a rerun finishes.
    fail_once = FailOnce("assemble", 0, tmp_path / "failed-once")
    directory = str(tmp_path / "beam")
    args = make_args(corpus_file, directory, runner="DirectRunner")
    with pytest.raises(io_utils.JobFailure, match="injected failure: assemble 0"):
        run_small_units(args, beam_after_step=fail_once)
    assert not glob.glob(os.path.join(directory, "*.tmp"))
    assert not os.path.exists(os.path.join(directory, "summary.json"))
    finished = plan.find_finished(run_small_plan(args))
    for k, path in enumerate(outputs_in(directory)):
        assert k in finished.outputs, f"{path} is there without its manifest"
    summary = run_small_units(args)
    assert read_bytes(outputs_in(directory)) == read_bytes(outputs_in(reference[0]))
    assert summary["instances"] == reference[1]["instances"]


def run_small_plan(args):
    """The Plan of `args` as a run makes it."""
    outputs = plan.output_paths(None, args.output_dir, args.num_shards, "pretrain", "none")
    config = job.generation_config(args)
    work_dir = plan.work_dir_path(outputs, "pretrain")
    with unittest.mock.patch.object(plan, "UNIT_BYTES", SMALL_UNIT):
        return plan.make_plan(config, outputs, work_dir, input_file=args.input_file)


class FakeCloudStorage(LocalFileSystem):
    """A stand-in for gs://: fakegs://PATH is ROOT/PATH, with no directories, as in GCS."""

    root = None

    @classmethod
    def scheme(cls):
        return "fakegs"

    def has_dirs(self):
        return False

    def _local(self, path):
        assert path.startswith("fakegs://"), path
        return os.path.join(self.root, path[len("fakegs://") :])

    def _list(self, prefix):
        for directory, _, names in os.walk(self.root):
            for name in names:
                local = os.path.join(directory, name)
                path = "fakegs://" + os.path.relpath(local, self.root)
                if path.startswith(prefix):
                    yield FileMetadata(path, os.path.getsize(local), os.path.getmtime(local))

    def metadata(self, path):
        local = self._local(path)
        return FileMetadata(path, os.path.getsize(local), os.path.getmtime(local))

    def exists(self, path):
        return os.path.isfile(self._local(path))

    def create(self, path, *args, **kwargs):
        return super().create(self._local(path), *args, **kwargs)

    def open(self, path, *args, **kwargs):
        return super().open(self._local(path), *args, **kwargs)

    def rename(self, sources, targets):
        super().rename([self._local(p) for p in sources], [self._local(p) for p in targets])

    def delete(self, paths):
        for path in paths:
            os.remove(self._local(path))


def test_remote_paths_go_through_beams_file_systems(corpus_file, reference, tmp_path):
    # Input, vocabulary and outputs on a remote file system (a fake gs://, in this process: the
    # in-memory DirectRunner): the workers write on their disk and upload, copy the token files
    # down for phase 2, and the shards are still the local run's.
    FakeCloudStorage.root = str(tmp_path / "bucket")
    os.makedirs(os.path.join(FakeCloudStorage.root, "in"))
    for source in (corpus_file, VOCAB_FILE):
        shutil.copy(source, os.path.join(FakeCloudStorage.root, "in"))
    local_copies = os.path.join(tempfile.gettempdir(), "bert_tf_beam-*")
    copies_before = set(glob.glob(local_copies))
    args = make_args(
        "fakegs://in/corpus.txt",
        "fakegs://out",
        vocab_file="fakegs://in/vocab.txt",
        runner="DirectRunner",
    )
    summary = run_small_units(args)
    directory = os.path.join(FakeCloudStorage.root, "out")
    assert read_bytes(outputs_in(directory)) == read_bytes(outputs_in(reference[0]))
    expected = {k: v for k, v in without_timings(reference[1]).items() if k != "fingerprint"}
    assert {k: v for k, v in without_timings(summary).items() if k != "fingerprint"} == expected
    assert summary["outputs"] == [
        f"fakegs://out/pretrain-0000{k}-of-00002.tfrecord" for k in (0, 1)
    ]
    work_dir = os.path.join(directory, ".pretrain.work")
    assert sorted(os.listdir(work_dir)) == [
        "output-00000.json",
        "output-00001.json",
        "settings.json",
    ]
    assert set(glob.glob(local_copies)) == copies_before  # the DirectRunner's copies are gone
    # The local path writes its token files with local system calls: a remote output needs Beam.
    with pytest.raises(
        io_utils.UsageError, match="--output_dir: a remote output .* needs --runner"
    ):
        job.run(dataclasses.replace(args, runner=None))


@pytest.mark.parametrize("missing", beam.DATAFLOW_REQUIRED)
def test_dataflow_without_a_required_option_fails_before_anything_starts(
    corpus_file, tmp_path, missing
):
    given = {"project": "p", "region": "europe-west1", "temp_location": "gs://b/tmp"}
    del given[missing]
    directory = tmp_path / "out"
    args = make_args(corpus_file, str(directory), runner="DataflowRunner")
    options = [f"--{k}={v}" for k, v in given.items()]
    with pytest.raises(io_utils.UsageError, match=f"--runner=DataflowRunner needs --{missing}$"):
        job.run(args, pipeline_args=options)
    assert not directory.exists()


def test_dataflow_refuses_paths_its_workers_cannot_reach(corpus_file, tmp_path):
    options = ("--project=p", "--region=europe-west1", "--temp_location=gs://b/tmp")
    args = make_args(corpus_file, str(tmp_path / "out"), runner="DataflowRunner")
    # gs:// needs apache-beam[gcp], which requirements.txt does not install (Dataflow's workers and
    # its users do); either way the run stops before it starts, naming the option.
    with pytest.raises(io_utils.UsageError, match="--temp_location|--output_dir: Dataflow"):
        job.run(args, pipeline_args=options)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "runner,pipeline_args,message",
    [
        (
            None,
            ("--direct_num_workers=2",),
            r"--direct_num_workers=2 \(Beam's pipeline options need --runner\)",
        ),
        ("DirectRunner", ("--no_such_option=1",), "unknown flags --no_such_option: neither"),
        ("DirectRunner", ("stray",), "unexpected argument 'stray'"),
        ("FooRunner", (), "unknown runner 'FooRunner'; the known runners are DirectRunner, "),
    ],
)
def test_bad_beam_arguments_are_usage_errors(corpus_file, tmp_path, runner, pipeline_args, message):
    args = make_args(corpus_file, str(tmp_path / "out"), runner=runner)
    with pytest.raises(io_utils.UsageError, match=message):
        job.run(args, pipeline_args=pipeline_args)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "flags,named",
    [
        (["--runner=FooRunner"], ["FooRunner", "DirectRunner", "DataflowRunner", "PortableRunner"]),
        (["--runner=DataflowRunner", "--project=p", "--temp_location=gs://b/t"], ["--region"]),
        (
            ["--runner=DirectRunner", "--input_file=/nonexistent/shard-*.txt"],
            ["/nonexistent/shard-*.txt"],
        ),
        (["--direct_num_workers=2"], ["--direct_num_workers", "--runner"]),
    ],
)
def test_bad_runs_exit_2_naming_what_is_wrong(corpus_file, tmp_path, flags, named):
    result = run_cli(
        f"--input_file={corpus_file}",
        f"--vocab_file={VOCAB_FILE}",
        f"--output_dir={tmp_path / 'out'}",
        *flags,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert all(name in result.stderr for name in named), result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_killed_beam_job_leaves_no_worker_behind(corpus_file, tmp_path):
    # Issue 34: kill -9 of the job while Beam's workers started left 2 sdk_worker_main processes
    # (145 MB each) running for about 2 minutes.
    mark, MARK = uuid.uuid4().hex, "REAPER_TEST_MARK"  # its descendants inherit it
    job = subprocess.Popen(
        cli_command(
            f"--input_file={corpus_file}",
            f"--vocab_file={VOCAB_FILE}",
            f"--output_dir={tmp_path / 'beam'}",
            "--max_seq_length=64",
            "--max_predictions_per_seq=10",
            "--runner=DirectRunner",
            "--direct_running_mode=multi_processing",
            "--direct_num_workers=2",
        ),
        env=dict(os.environ, PYTHONPATH=REPO, **{MARK: mark}),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def workers():
        found = []
        for pid in processes_holding(mark, MARK):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"sdk_worker_main" in f.read():
                        found.append(pid)
            except OSError:
                continue
        return found

    try:
        assert wait_for(lambda: len(workers()) >= 2, seconds=120), "no Beam worker started"
        job.kill()
        job.wait()
        assert wait_for(lambda: not processes_holding(mark, MARK), seconds=10), processes_holding(
            mark, MARK
        )
    finally:
        job.kill()
        for pid in processes_holding(mark, MARK):
            os.kill(pid, signal.SIGKILL)
