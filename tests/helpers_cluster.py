"""A real TF_CONFIG cluster on 127.0.0.1: one process per task, their output read as it comes."""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

from helpers import ROOT, child_pythonpath

ENV = dict(os.environ, PYTHONPATH=child_pythonpath(__file__), TF_CPP_MIN_LOG_LEVEL="2")


def free_ports(count):
    """Ports nothing listens on right now."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class Task:
    """One worker process; its merged stdout and stderr are collected line by line."""

    def __init__(self, command, env):
        self.process = subprocess.Popen(
            command,
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines = []
        self.exited_at = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))
        self.process.wait()
        self.exited_at = time.monotonic()

    @property
    def output(self):
        return "\n".join(self.lines)

    def wait_for_line(self, pattern, timeout):
        """The first match of `pattern` in a line; AssertionError if the task exits or `timeout`
        seconds pass first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                match = re.search(pattern, line)
                if match:
                    return match
            if self.exited_at is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r}:\n{self.output[-3000:]}")

    def wait(self, timeout):
        """The exit code; AssertionError (after killing it) if it runs past `timeout` seconds."""
        self._reader.join(timeout)
        if self._reader.is_alive():
            self.process.kill()
            self._reader.join()
            raise AssertionError(f"still running after {timeout} s:\n{self.output[-3000:]}")
        return self.process.returncode


class Cluster:
    """`count` workers of `python -m module flags...`, each with its TF_CONFIG (and `env` added)."""

    def __init__(self, module, flags, count=2, env=None):
        workers = [f"127.0.0.1:{port}" for port in free_ports(count)]
        self.tasks = []
        for index in range(count):
            config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
            task_env = dict(ENV, **(env or {}), TF_CONFIG=json.dumps(config))
            self.tasks.append(Task([sys.executable, "-m", module, *flags], task_env))

    def __getitem__(self, index):
        return self.tasks[index]

    def wait(self, timeout):
        """Every task's exit code, all within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        return [task.wait(max(1.0, deadline - time.monotonic())) for task in self.tasks]

    def kill(self):
        """Ends every task still running (SIGKILL reaches a stopped process too)."""
        for task in self.tasks:
            if task.process.poll() is None:
                task.process.kill()
            task.process.wait()
