"""A job's child processes die with it: a SIGKILLed job's children are killed by its watcher, and a
job that ends normally leaves what it started alone. Real processes, real signals, /proc."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

from helpers import ROOT, wait_for

from bert_tf.runtime.child_reaper import processes_holding

ENV = dict(os.environ, PYTHONPATH=ROOT)
MARK = "REAPER_TEST_MARK"  # set on the job by the test; its descendants inherit it


def start_job(mark, ending):
    """A job that starts `sh -c 'sleep 60'` (as Beam starts its workers) inside reaped_children,
    then ends as `ending` says."""
    script = textwrap.dedent(
        f"""
        import os, signal, subprocess, sys, time
        from bert_tf.runtime import child_reaper
        with child_reaper.reaped_children():
            subprocess.Popen("sleep 60; true", shell=True)
            print("started", flush=True)
            {ending}
        time.sleep(60)
        """
    )
    return subprocess.Popen(
        [sys.executable, "-c", script],
        env=dict(ENV, **{MARK: mark}),
        stdout=subprocess.PIPE,
        text=True,
    )


def test_the_children_of_a_killed_job_are_killed():
    mark = uuid.uuid4().hex
    job = start_job(mark, "time.sleep(60)")
    try:
        assert job.stdout.readline() == "started\n"
        # The job, its watcher, sh and sleep.
        assert wait_for(lambda: len(processes_holding(mark, MARK)) >= 4)
        job.kill()
        job.wait()
        assert wait_for(lambda: not processes_holding(mark, MARK), seconds=5), processes_holding(
            mark, MARK
        )
    finally:
        for pid in processes_holding(mark, MARK):
            os.kill(pid, signal.SIGKILL)


def test_a_job_that_leaves_the_block_leaves_its_children_alone():
    mark = uuid.uuid4().hex
    job = start_job(mark, "pass")
    try:
        assert job.stdout.readline() == "started\n"
        time.sleep(1.0)  # the watcher has had its word and gone
        job.kill()
        job.wait()
        time.sleep(1.0)
        assert len(processes_holding(mark, MARK)) == 2  # sh and sleep, outliving the job as started
    finally:
        for pid in processes_holding(mark, MARK):
            os.kill(pid, signal.SIGKILL)
