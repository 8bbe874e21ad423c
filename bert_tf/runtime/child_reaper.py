"""The processes a job starts die with it, however it dies.

Beam's DirectRunner starts its workers (`sh -c python -m ...sdk_worker_main`) with plain Popen:
a job killed with SIGKILL leaves them running, about 145 MB each, until their control channel gives
up. Nothing can run in a process that SIGKILL ends, so a small watcher process does it instead:

    with child_reaper.reaped_children():
        ...start processes...

Inside the block every process started from this one inherits a token in its environment. The
watcher holds the read end of a pipe whose only writer is this process: end of file without the
word "done" means this process died, and the watcher kills every process whose environment holds
the token (Linux /proc), again until none is left (one may have forked meanwhile). Leaving the
block, normally or by an exception, tells the watcher "done": then the job's own shutdown ran.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid

TOKEN_VARIABLE = "BERT_TF_REAPED_BY"
_DONE = b"done"


@contextlib.contextmanager
def reaped_children():
    """Within the block, processes started by this one are killed if this process dies first."""
    if not os.path.isdir("/proc"):
        yield  # no /proc to find them by (not Linux): Beam's own shutdown is all there is
        return
    token = uuid.uuid4().hex
    read_fd, write_fd = os.pipe()
    watcher = subprocess.Popen(
        [sys.executable, "-m", "bert_tf.runtime.child_reaper", token],
        stdin=read_fd,
        stdout=subprocess.DEVNULL,
        close_fds=True,
        start_new_session=True,  # a Ctrl-C at the terminal must not end it before the job
    )
    os.close(read_fd)
    os.set_inheritable(write_fd, False)  # the children must not keep the pipe open
    previous = os.environ.get(TOKEN_VARIABLE)
    os.environ[TOKEN_VARIABLE] = token
    try:
        yield
    finally:
        if previous is None:
            del os.environ[TOKEN_VARIABLE]
        else:
            os.environ[TOKEN_VARIABLE] = previous
        with contextlib.suppress(OSError):
            os.write(write_fd, _DONE)
        os.close(write_fd)
        try:
            watcher.wait(timeout=30)
        except subprocess.TimeoutExpired:  # it has nothing left to do: the job must not wait on it
            watcher.kill()


def processes_holding(token, variable=TOKEN_VARIABLE):
    """The ids of the live processes (zombies left out), this one excepted, whose environment
    holds `variable`=`token`."""
    entry = f"{variable}={token}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if entry not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
        except OSError:  # gone, or not ours to read
            continue
        found.append(int(name))
    return found


def _watch(token):
    """The watcher: waits for its job's word or end of file on stdin; on end of file alone, kills
    what carries the job's token."""
    said = b""
    while True:
        chunk = os.read(0, 64)
        if not chunk:
            break
        said += chunk
    if said == _DONE:
        return
    for _ in range(100):  # a process may fork between a scan and its kill: scan until none is left
        found = processes_holding(token)
        if not found:
            return
        for pid in found:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


if __name__ == "__main__":
    _watch(sys.argv[1])
