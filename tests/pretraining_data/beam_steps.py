"""Beam steps' `after_step` hooks (see beam.run_units) for the Beam and Dask tests, in a module of
their own: the workers (and Dask's scheduler) unpickle them, so importing this must stay cheap (no
TensorFlow, no test helpers), or every worker's memory would hold TensorFlow too."""

import os
import signal
import time


class RecordWorker:
    """A Beam step's `after_step` that notes which process ran each step and that process's peak
    memory so far, a file per call in `directory`."""

    def __init__(self, directory):
        self.directory = str(directory)

    def __call__(self, phase, key):
        peak_kib = peak_rss_kib()
        name = f"{phase}-{key}-{os.getpid()}-{time.monotonic_ns()}"
        with open(os.path.join(self.directory, name), "w") as f:
            f.write(str(peak_kib))


def peak_rss_kib():
    """This process's peak resident memory in KiB: Linux's VmHWM, which starts again at exec.
    (getrusage's ru_maxrss keeps the parent's peak across fork and exec: a worker started from a
    test process would report the test's TensorFlow-sized peak.)"""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def recorded(directory):
    """[(phase, key, pid, peak KiB)] of RecordWorker's files, in the order the steps ended (the
    monotonic clock is the machine's, whichever process read it)."""
    rows = []
    for name in os.listdir(directory):
        phase, key, pid, at = name.split("-")
        with open(os.path.join(directory, name)) as f:
            rows.append((int(at), phase, int(key), int(pid), int(f.read())))
    return [row[1:] for row in sorted(rows)]


class InjectedFailure(RuntimeError):
    """The failure FailOnce raises."""


class FailOnce:
    """A Beam step's `after_step` that fails step (phase, key) once, after it wrote its files, as a
    worker lost before its bundle commits would: by raising InjectedFailure, or with `kill`, by
    SIGKILLing its own worker process. `marker` is a file created at the failure, so that the
    retry (in any process) goes through."""

    def __init__(self, phase, key, marker, kill=False):
        self.phase, self.key, self.marker, self.kill = phase, key, str(marker), kill

    def __call__(self, phase, key):
        if (phase, key) != (self.phase, self.key):
            return
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        if self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        raise InjectedFailure(f"injected failure: {phase} {key}")
