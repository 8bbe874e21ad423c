"""create_pretraining_data --runner=DaskRunner on a real dask.distributed cluster: a scheduler and
worker processes on 127.0.0.1, started with Dask's own commands as docs/cluster.md shows them."""

import os
import resource
import signal
import time

import pytest
from helpers import ROOT as REPO
from helpers_beam import (
    assert_same_as_reference,
    make_args,
    outputs_in,
    read_bytes,
    run_small_units,
)

from bert_tf.pretraining_data import beam, job
from bert_tf.pretraining_data import dask_cluster as dask_cluster_module

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow


def dask_cluster(directory, workers=2):
    """dask_cluster.local_cluster, with this module importable in its processes: the job's task
    graph holds this module's after_step objects, which the scheduler and workers unpickle."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.path.dirname(here), here]))
    return dask_cluster_module.local_cluster(directory, workers, env)


class RecordWorker:
    """A Beam step's `after_step` that notes which process ran each step and that process's peak
    memory so far, a file per call in `directory`."""

    def __init__(self, directory):
        self.directory = str(directory)

    def __call__(self, phase, key):
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        name = f"{phase}-{key}-{os.getpid()}-{time.monotonic_ns()}"
        with open(os.path.join(self.directory, name), "w") as f:
            f.write(str(peak_kib))


def recorded(directory):
    """[(phase, key, pid, peak KiB)] of RecordWorker's files."""
    rows = []
    for name in os.listdir(directory):
        phase, key, pid, _ = name.split("-")
        with open(os.path.join(directory, name)) as f:
            rows.append((phase, int(key), int(pid), int(f.read())))
    return rows


class KillOnce:
    """A Beam step's `after_step` that SIGKILLs its own worker process at step (phase, key), once
    (`marker` is created first, so that the retry on another worker goes through)."""

    def __init__(self, phase, key, marker):
        self.phase, self.key, self.marker = phase, key, str(marker)

    def __call__(self, phase, key):
        if (phase, key) != (self.phase, self.key):
            return
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        os.kill(os.getpid(), signal.SIGKILL)


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
            args, [f"--dask_client_address={address}"], KillOnce("build", 1, marker)
        )
        assert marker.exists()
        codes = [worker.poll() for worker in workers]
        assert sorted(codes, key=str) == [-signal.SIGKILL, None]  # one killed, one alive
    assert_same_as_reference(directory, summary, reference)


def test_dask_runner_is_a_short_name_and_its_options_are_known(corpus_file, tmp_path):
    options = beam.pipeline_options("DaskRunner", ["--dask_client_address=127.0.0.1:1"])
    assert options.get_all_options()["address"] == "127.0.0.1:1"
    assert options.get_all_options()["partition_size"] == 1  # one work unit a partition
    assert "DaskRunner" in job.RUNNERS
