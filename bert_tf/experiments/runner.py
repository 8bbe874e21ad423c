"""Runs a study's steps in order, each job in its own process, skipping the finished ones.

A step is finished when its done file exists (plan.Step), so a study killed at any point is
resumed by running the same command again: finished steps are skipped, and the step that was cut
short resumes from its own checkpoints. Each job's output goes to OUTPUT_DIR/logs/<step>.log, and
each step's wall time to OUTPUT_DIR/steps.json (the report's time column).
"""

import json
import os
import subprocess
import sys
import time

from bert_tf.runtime import io_utils

STEPS_FILE = "steps.json"


def read_times(output_dir):
    """{step name: wall seconds} of the steps this output directory has run."""
    path = os.path.join(output_dir, STEPS_FILE)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def run_steps(steps, output_dir, log_fn=print):
    """Runs every unfinished step; raises JobFailure naming the log of a step that fails."""
    logs = os.path.join(output_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    times = read_times(output_dir)
    for number, step in enumerate(steps, 1):
        where = f"[{number}/{len(steps)}] {step.name}"
        if step.kind == "skipped":
            log_fn(f"{where}: skipped ({step.reason})")
            continue
        if os.path.exists(step.done_file):
            log_fn(f"{where}: done already")
            continue
        log_fn(f"{where}: running")
        start = time.perf_counter()
        if step.action is not None:
            step.action()
        else:
            log_path = os.path.join(logs, f"{step.name}.log")
            command = [sys.executable, "-m", f"bert_tf.{step.module}", *step.flags]
            with open(log_path, "a") as log:  # a resumed step's log keeps the killed attempt's
                log.write(" ".join(command) + "\n\n")
                log.flush()
                code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
            if code or not os.path.exists(step.done_file):
                raise io_utils.JobFailure(
                    f"{where} failed (exit {code}): see {log_path}; run the same command again "
                    "to resume"
                )
        times[step.name] = round(time.perf_counter() - start, 1)
        io_utils.atomic_write_json(os.path.join(output_dir, STEPS_FILE), times)
        log_fn(f"{where}: finished in {times[step.name]:.0f} s")
    return times
