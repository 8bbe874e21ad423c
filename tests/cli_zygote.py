"""A process that has imported TensorFlow and forks a child per `python -m bert_tf.<job>` call.

Starting a fresh interpreter that imports TensorFlow, Keras and keras-hub takes 3 to 8 s on two
cores, and the suite runs a CLI well over a hundred times. A child forked from here starts in
milliseconds and is otherwise what `python -m` gives: its own process, a pristine absl FLAGS (no
job module is imported before the fork), the job's `__main__`, its exit code, and its stdout and
stderr. What it cannot show is what the interpreter prints while TensorFlow loads; the tests of
quiet output (tests/runtime/test_quiet.py) and one smoke test per CLI start real interpreters.

Protocol, one JSON object a line: the zygote writes {"ready": true} once imported; a request
{"module", "argv", "cwd", "stdout", "stderr"} (the last two: files the child writes) gets
{"pid"} at once and {"returncode"} when the child ends (negative: killed by that signal).
The zygote ends when its stdin closes.
"""

import json
import os
import sys

# What the jobs import; bert_tf's library packages define no flags (only the job modules do).
import keras  # noqa: F401
import keras_hub  # noqa: F401
import numpy  # noqa: F401
import tensorflow  # noqa: F401
import tensorflow_text  # noqa: F401

# Set up again in each child for its own job (quiet output, oneDNN for training jobs).
PER_JOB_MODULES = ("bert_tf.runtime.job_process",)


def exit_code(code):
    """The process exit status of `sys.exit(code)`, as the interpreter computes it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def run_child(request):
    """In the forked child: runs the module as `__main__` and never returns."""
    import atexit
    import runpy
    import threading
    import traceback

    code = 1
    try:
        os.chdir(request["cwd"])
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, fd)
            os.close(out)
        sys.stdout = sys.__stdout__  # the zygote's own print()s went to stderr
        for name in PER_JOB_MODULES:
            sys.modules.pop(name, None)
        sys.argv = [request["module"], *request["argv"]]
        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = exit_code(e.code)
        except BaseException:
            traceback.print_exc()
            code = 1
        threading._shutdown()  # as the interpreter does at exit: non-daemon threads, then atexit
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def main():
    reply = sys.stdout
    sys.stdout = sys.stderr  # nothing but replies on the protocol's pipe
    print(json.dumps({"ready": True}), file=reply, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(reply.fileno())
            run_child(request)
        print(json.dumps({"pid": pid}), file=reply, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), file=reply, flush=True)


if __name__ == "__main__":
    main()
