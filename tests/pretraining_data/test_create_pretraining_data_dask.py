"""create_pretraining_data --runner=DaskRunner on a real dask.distributed cluster: a scheduler and
worker processes on 127.0.0.1, started with Dask's own commands as docs/cluster.md shows them."""

import json
import os
import signal
import unittest.mock

import pytest
from beam_steps import FailOnce, RecordWorker, recorded
from helpers import ROOT as REPO
from helpers import run_module_cli
from helpers_beam import (
    assert_same_as_reference,
    make_args,
    outputs_in,
    read_bytes,
    run_small_units,
)

from bert_tf.pretraining_data import beam, corpus, job, plan
from bert_tf.pretraining_data import dask_cluster as dask_cluster_module

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow


def dask_cluster(directory, workers=2):
    """dask_cluster.local_cluster, with beam_steps importable in its processes: the job's task
    graph holds its after_step objects, which the scheduler and workers unpickle."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, here]))
    return dask_cluster_module.local_cluster(directory, workers, env)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with dask_cluster(str(tmp_path_factory.mktemp("dask"))) as running:
        yield running


@pytest.mark.parametrize("num_shards", [1, 2, 3])
def test_dask_runner_writes_the_local_bytes_on_both_workers(
    corpus_file, reference, cluster, tmp_path, num_shards
):
    address, workers = cluster
    steps = tmp_path / "steps"
    steps.mkdir()
    directory = str(tmp_path / "dask")
    args = make_args(corpus_file, directory, runner="DaskRunner", num_shards=num_shards)
    summary = run_small_units(args, [f"--dask_client_address={address}"], RecordWorker(steps))
    if num_shards == 2:
        assert_same_as_reference(directory, summary, reference)
    else:
        local = str(tmp_path / "local")
        run_small_units(make_args(corpus_file, local, num_shards=num_shards))
        assert read_bytes(outputs_in(directory)) == read_bytes(outputs_in(local))
        assert len(outputs_in(directory)) == num_shards
    ran = recorded(steps)
    tokenized = sorted(key for phase, key, _, _ in ran if phase == "tokenize")
    assert tokenized == list(range(summary["units"]))  # each unit once: no worker was lost
    # The work ran in the cluster's worker processes, on both of them, and not in this one.
    assert {pid for _, _, pid, _ in ran} == {worker.pid for worker in workers}


def test_a_worker_killed_mid_job_costs_nothing_but_its_work(corpus_file, reference, tmp_path):
    # Dask's scheduler gives a lost worker's tasks to the workers left (a task is given up only
    # after it has been on 3 workers that died: distributed.scheduler.allowed-failures).
    marker = tmp_path / "killed"
    with dask_cluster(str(tmp_path)) as (address, workers):
        directory = str(tmp_path / "dask")
        args = make_args(corpus_file, directory, runner="DaskRunner")
        summary = run_small_units(
            args, [f"--dask_client_address={address}"], FailOnce("build", 1, marker, kill=True)
        )
        assert marker.exists()
        codes = [worker.poll() for worker in workers]
        assert sorted(codes, key=str) == [-signal.SIGKILL, None]  # one killed, one alive
    assert_same_as_reference(directory, summary, reference)


def test_dask_runner_is_a_short_name_and_its_options_are_known():
    options = beam.pipeline_options("DaskRunner", ["--dask_client_address=127.0.0.1:1"])
    assert options.get_all_options()["address"] == "127.0.0.1:1"
    assert options.get_all_options()["partition_size"] == 1  # one work unit a partition
    assert "DaskRunner" in job.RUNNERS


def test_the_cli_runs_on_the_cluster_as_documented(corpus_file, cluster, tmp_path):
    address, _ = cluster
    local, on_dask = str(tmp_path / "local"), str(tmp_path / "dask")
    job.run(make_args(corpus_file, local))
    flags = [f"--{name}={value}" for name, value in vars(make_args(corpus_file, on_dask)).items()
             if name in ("input_file", "vocab_file", "output_dir", "num_shards", "dupe_factor",
                         "max_seq_length", "max_predictions_per_seq")]  # fmt: skip
    result = run_module_cli(
        "bert_tf.create_pretraining_data",
        *flags,
        "--runner=DaskRunner",
        f"--dask_client_address={address}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_bytes(outputs_in(on_dask)) == read_bytes(outputs_in(local))
    with open(os.path.join(on_dask, "summary.json")) as f:
        assert json.load(f)["text_mb_per_second_this_run"] > 0  # counted without Beam's metrics


def test_a_workers_peak_memory_does_not_grow_with_the_corpus(corpus_file, tmp_path):
    peaks = {}
    for scale in (1, 4):
        text = str(tmp_path / f"corpus_{scale}.txt")
        corpus.repeat_corpus(corpus_file, text, scale * 2_000_000)
        steps = tmp_path / f"steps_{scale}"
        steps.mkdir()
        with dask_cluster(str(tmp_path)) as (address, workers):
            args = make_args(text, str(tmp_path / f"out_{scale}"), runner="DaskRunner")
            with unittest.mock.patch.object(plan, "UNIT_BYTES", 512 << 10):
                summary = job.run(
                    args,
                    pipeline_args=[f"--dask_client_address={address}"],
                    beam_after_step=RecordWorker(steps),
                )
        assert summary["units"] >= 4 * scale
        ran = recorded(steps)
        peaks[scale] = max(peak for _, _, _, peak in ran)
        # Unit after unit, a worker's peak stays put: what one unit freed, the next one reuses or
        # the worker gives back (worker.release_freed_memory). Without that, each 512 KiB unit
        # built added about 2 MiB (17 MiB over 8 units).
        for pid in {pid for _, _, pid, _ in ran}:
            builds = [peak for phase, _, p, peak in ran if phase == "build" and p == pid]
            assert builds[-1] - builds[0] <= 8 << 10, (scale, pid, builds)
    # A worker builds a unit at a time (about 512 KiB of text): 4x the units, the same peak.
    assert peaks[4] <= 1.2 * peaks[1], peaks
