"""A dask.distributed cluster on this machine, started with Dask's own commands, for
`create_pretraining_data --runner=DaskRunner` on one machine (the tests and the benchmark use it):

    dask scheduler --host=127.0.0.1 --port=0 --no-dashboard --scheduler-file=DIR/scheduler.json
    dask worker SCHEDULER_ADDRESS --nthreads=1 --no-nanny --no-dashboard --host=127.0.0.1   (each)

On several machines, start the same two commands there (docs/cluster.md); the job only needs the
scheduler's address, `--dask_client_address=HOST:PORT`.
"""

import contextlib
import json
import os
import subprocess
import sys
import time

START_SECONDS = 90


def dask_command():
    """The `dask` command of this Python's environment."""
    return os.path.join(os.path.dirname(sys.executable), "dask")


def _scheduler_address(scheduler, scheduler_file):
    """The address the scheduler writes to its file once it listens (read whole: it may be
    half-written when first seen)."""
    deadline = time.monotonic() + START_SECONDS
    while True:
        try:
            with open(scheduler_file) as f:
                return json.load(f)["address"]
        except (OSError, ValueError, KeyError):
            if scheduler.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Dask scheduler did not start (exit {scheduler.poll()})")
            time.sleep(0.1)


@contextlib.contextmanager
def local_cluster(directory, workers=2, env=None):
    """Starts a scheduler and `workers` single-threaded worker processes on 127.0.0.1, without a
    nanny (a worker that dies stays dead, as a lost machine does); yields (scheduler address,
    worker Popen objects) once every worker has joined, and kills them all on exit.

    `env` is the processes' environment (default: this one's); the workers import what the job's
    pickled steps name, so bert_tf must be importable there.
    """
    scheduler_file = os.path.join(directory, "scheduler.json")
    with contextlib.suppress(FileNotFoundError):
        os.remove(scheduler_file)  # an earlier cluster's address
    # What Dask's nanny sets for the workers it starts (these run without one): glibc gives freed
    # memory back sooner. The job's own units trim too (worker.release_freed_memory).
    env = dict(env or os.environ, MALLOC_TRIM_THRESHOLD_="65536")
    launch = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=directory)
    scheduler = subprocess.Popen(
        [dask_command(), "scheduler", "--host=127.0.0.1", "--port=0", "--no-dashboard",
         f"--scheduler-file={scheduler_file}"],
        **launch,
    )  # fmt: skip
    processes = [scheduler]
    try:
        address = _scheduler_address(scheduler, scheduler_file)
        worker_processes = [
            subprocess.Popen(
                [dask_command(), "worker", address, "--nthreads=1", "--no-nanny",
                 "--no-dashboard", "--host=127.0.0.1"],
                **launch,
            )
            for _ in range(workers)
        ]  # fmt: skip
        processes += worker_processes
        import distributed

        with distributed.Client(address, timeout=START_SECONDS) as client:
            client.wait_for_workers(workers, timeout=START_SECONDS)
        yield address, worker_processes
    finally:
        for process in processes:
            process.kill()
            process.wait()
