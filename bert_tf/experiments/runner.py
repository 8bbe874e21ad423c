"""Runs a study's steps in order, each job in its own process, skipping the finished ones.

A step is finished when its done file exists (plan.Step), so a study killed at any point is
resumed by running the same command again: finished steps are skipped, and the step that was cut
short resumes from its own checkpoints. Each job's output goes to OUTPUT_DIR/logs/<step>.log, and
each step's wall time to OUTPUT_DIR/steps.json (the report's time column).

One study owns its directory (`study_dir`): a lock that the runner and its jobs hold refuses a
second runner while any of them lives, and the flags the study's runs were made with are kept, so
that a rerun with other flags is refused instead of reporting runs it did not make. The jobs die with
the runner (child_reaper), and the running job's step and ETA show on the console.
"""

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time

from bert_tf.runtime import io_utils

STEPS_FILE = "steps.json"
LOCK_FILE = "experiments.lock"
SETTINGS_FILE = "study.json"
# Off a terminal, the running job's progress shows at most this often (on one, in place).
PROGRESS_INTERVAL_S = 60.0
# The training loop's progress line: "step 75/300  loss ...  ETA 1m05s".
_PROGRESS = re.compile(r"\bstep (\d+)/(\d+)\b.*?(?:\bETA (\S+))?\s*$")


@contextlib.contextmanager
def study_dir(output_dir, settings):
    """Makes `output_dir` this study's while the block runs; yields the lock's file descriptor,
    which the jobs inherit, so that the directory stays locked while one of them lives.

    A directory whose study ran with other `settings` ({flag: value}, as record_settings wrote
    them) is a UsageError naming each changed flag. A usage error inside the block removes a
    directory the block made, if it holds nothing but the lock and a flags file.
    """
    created = not os.path.exists(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, LOCK_FILE), "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            raise io_utils.UsageError(
                f"{output_dir} is in use by another bert_tf.experiments run (pid {holder}) or a "
                "job it started: wait for it to end, or stop it, then run again"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        try:
            _check_settings(output_dir, settings)
            yield lock.fileno()
        except io_utils.UsageError:
            names = os.listdir(output_dir)
            if created and all(n == LOCK_FILE or n.endswith(".flags") for n in names):
                shutil.rmtree(output_dir, ignore_errors=True)
            raise


def record_settings(output_dir, settings):
    """Records the settings the study's runs are made with, once: before its first step."""
    path = os.path.join(output_dir, SETTINGS_FILE)
    if not os.path.exists(path):
        io_utils.atomic_write_json(path, _as_recorded(settings))


def _as_recorded(settings):
    return json.loads(json.dumps(settings))  # as the file holds them (tuples become lists)


def _check_settings(output_dir, settings):
    """A UsageError naming each flag whose value differs from the recorded settings, if any."""
    path = os.path.join(output_dir, SETTINGS_FILE)
    if not os.path.exists(path):
        return
    with open(path) as f:
        recorded = json.load(f)
    settings = _as_recorded(settings)
    # Only flags both runs know: a flag a later version added (or dropped) names no change.
    changed = [
        f"--{name} was {_flag_text(recorded[name])}, now {_flag_text(settings[name])}"
        for name in sorted(set(recorded) & set(settings))
        if recorded[name] != settings[name]
    ]
    if changed:
        raise io_utils.UsageError(
            f"{output_dir} holds a study run with other flags ({'; '.join(changed)}): run the "
            "same flags to resume it, or give another --output_dir"
        )


def _flag_text(value):
    return ",".join(map(str, value)) if isinstance(value, list) else repr(value)


def read_times(output_dir):
    """{step name: wall seconds} of the steps this output directory has run."""
    path = os.path.join(output_dir, STEPS_FILE)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def run_steps(steps, output_dir, log_fn=print, pass_fds=(), console=None):
    """Runs every unfinished step; raises JobFailure naming the log of a step that fails.

    `pass_fds` go on to every job (study_dir's lock); the running job's progress goes to
    `console` (default stdout), in place when it is a terminal.
    """
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
        start = time.perf_counter()
        if step.action is not None:
            log_fn(f"{where}: running")
            step.action()
        else:
            log_path = os.path.join(logs, f"{step.name}.log")
            log_fn(f"{where}: running (its log: {log_path})")
            command = [sys.executable, "-m", f"bert_tf.{step.module}", *step.flags]
            with open(log_path, "a") as log:  # a resumed step's log keeps the killed attempt's
                log.write(" ".join(command) + "\n\n")
                log.flush()
                process = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, pass_fds=pass_fds
                )
                code = _wait_showing_progress(process, log_path, where, log_fn, console)
            if code or not os.path.exists(step.done_file):
                raise io_utils.JobFailure(
                    f"{where} failed (exit {code}): see {log_path}; run the same command again "
                    "to resume"
                )
        times[step.name] = round(time.perf_counter() - start, 1)
        io_utils.atomic_write_json(os.path.join(output_dir, STEPS_FILE), times)
        log_fn(f"{where}: finished in {times[step.name]:.0f} s")
    return times


def _wait_showing_progress(process, log_path, where, log_fn, console=None):
    """Waits for the job; shows its latest progress line (step and ETA) from its log meanwhile.

    On a terminal the line is rewritten in place every second; otherwise it is logged when the job
    first reports a step and then at most every PROGRESS_INTERVAL_S. Returns the exit code.
    """
    console = console or sys.stdout
    interactive = console.isatty()
    with open(log_path, errors="replace") as log:
        log.seek(0, os.SEEK_END)
        pending, latest, shown, shown_at = "", None, None, None
        while True:
            try:
                code = process.wait(timeout=1)
            except subprocess.TimeoutExpired:
                code = None
            # Progress bars rewrite their line with \r: each piece is a line of its own.
            pieces = re.split(r"[\r\n]", pending + log.read())
            pending = pieces.pop()
            for piece in pieces:
                match = _PROGRESS.search(piece)
                if match:
                    steps, eta = f"step {match[1]}/{match[2]}", match[3]
                    latest = f"{steps}, ETA {eta}" if eta else steps
            now = time.monotonic()
            if latest and latest != shown:
                if interactive:
                    console.write(f"\r{where}: {latest}\033[K")
                    console.flush()
                    shown = latest
                elif shown_at is None or now - shown_at >= PROGRESS_INTERVAL_S:
                    log_fn(f"{where}: {latest}")
                    shown, shown_at = latest, now
            if code is not None:
                if interactive and shown:
                    console.write("\n")
                return code
