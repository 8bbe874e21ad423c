"""A process that has imported TensorFlow and forks a child per `python -m bert_tf.<job>` call.

Starting a fresh interpreter that imports TensorFlow, Keras and keras-hub takes 3 to 8 s on two
cores, and the suite runs a CLI well over a hundred times. A child forked from here starts in a
fraction of a second and is otherwise what `python -m` gives: its own process, its argv, cwd and
sys.path, the job module run as `__main__` by the function `-m` itself calls, and the
interpreter's own shutdown (atexit, threads, exit code, a crash's signal). What differs:
- what the interpreter prints while TensorFlow loads (here, once, before any child);
- TensorFlow's, Keras', keras-hub's and tensorflow_text's modules, ops and absl flags are loaded
  whether or not the job imports them, so `helpers.run_module_cli` starts the jobs that do not
  load TensorFlow (`FRESH_JOBS`) in fresh interpreters instead;
- the children share the zygote's string-hash seed (numpy's global generator is reseeded here):
  a test of run-to-run determinism needs fresh interpreters.
tests/runtime/test_entry_points.py starts every job once in a fresh interpreter and compares.

Protocol, one JSON object a line: the zygote writes {"ready": true, "onednn": <bool>} once
imported; a request {"module", "argv", "cwd", "stdout", "stderr"} (the last two: files the child
writes) gets {"pid"} at once and {"returncode"} when the child ends (negative: killed by that
signal). The zygote ends when its stdin closes, killing a child still running.
"""

import json
import os
import runpy
import select
import signal
import sys
import types

# What the jobs import. No TensorFlow op runs and no bert_tf module loads before a fork: the
# children must find no thread pool started and no job's flags defined.
import keras  # noqa: F401
import keras_hub  # noqa: F401
import numpy
import tensorflow  # noqa: F401
import tensorflow_text  # noqa: F401
from tensorflow.python.util import _pywrap_util_port

assert not [name for name in sys.modules if name.split(".")[0] == "bert_tf"]


def run_child(request):
    """In the forked child: runs the module as `python -m` would; leaves through SystemExit or the
    job's own exception, which end the interpreter as they would end `python -m`."""
    os.chdir(request["cwd"])
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    os.close(stdin)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    sys.stdout = sys.__stdout__  # the zygote's own print()s went to stderr
    sys.path[0] = request["cwd"]  # -m puts the current directory first
    sys.argv = [request["module"], *request["argv"]]
    numpy.random.seed()
    sys.modules["__main__"] = types.ModuleType("__main__")  # the job's globals, not the zygote's
    runpy._run_module_as_main(request["module"])
    raise SystemExit(0)


def wait_for_child(pid):
    """The child's exit status; kills it and exits when the parent goes (stdin at its end)."""
    pidfd = os.pidfd_open(pid)
    try:
        while True:
            ready, _, _ = select.select([pidfd, sys.stdin], [], [])
            if pidfd in ready:
                return os.waitpid(pid, 0)[1]
            if sys.stdin in ready and not sys.stdin.readline():
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                sys.exit(0)
    finally:
        os.close(pidfd)


def main():
    reply = sys.stdout
    sys.stdout = sys.stderr  # nothing but replies on the protocol's pipe
    ready = {"ready": True, "onednn": bool(_pywrap_util_port.IsMklEnabled())}
    print(json.dumps(ready), file=reply, flush=True)
    while line := sys.stdin.readline():
        request = json.loads(line)
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            run_child(request)
        print(json.dumps({"pid": pid}), file=reply, flush=True)
        status = wait_for_child(pid)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), file=reply, flush=True)


if __name__ == "__main__":
    main()
