"""A multi-worker cluster on this machine: one process per task of a TF_CONFIG cluster on
127.0.0.1, each task's output read as it comes (the tests and benchmarks/bench_lost_worker.py
stop, freeze and kill its workers). On several machines, start the same command on each with
its TF_CONFIG (docs/cluster.md).
"""

import json
import os
import re
import socket
import subprocess
import threading
import time


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

    def __init__(self, command, env=None, cwd=None):
        self.process = subprocess.Popen(
            command,
            env=env,
            cwd=cwd,
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
        """The first match of `pattern` in a line; TimeoutError if the task exits or `timeout`
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
        raise TimeoutError(f"no line matching {pattern!r}:\n{self.output[-3000:]}")

    def wait(self, timeout):
        """The exit code; TimeoutError (after killing it) if it runs past `timeout` seconds."""
        self._reader.join(timeout)
        if self._reader.is_alive():
            self.process.kill()
            self._reader.join()
            raise TimeoutError(f"still running after {timeout} s:\n{self.output[-3000:]}")
        return self.process.returncode


class Cluster:
    """`count` workers running `command`, each with its TF_CONFIG added to `env` (default: this
    process's environment)."""

    def __init__(self, command, count=2, env=None, cwd=None):
        workers = [f"127.0.0.1:{port}" for port in free_ports(count)]
        self.tasks = []
        for index in range(count):
            config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
            task_env = dict(os.environ if env is None else env, TF_CONFIG=json.dumps(config))
            self.tasks.append(Task(command, task_env, cwd))

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
