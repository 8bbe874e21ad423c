"""Every `python -m bert_tf.<job>` started as a user starts it: a fresh interpreter.

The other tests run the CLIs through `helpers.run_module_cli`, which forks them from a process
that has already imported TensorFlow; this is the one check per CLI that the module runs as the
program on its own, with its imports, flags, exit codes and quiet start-up.
"""

import pathlib
import subprocess
import sys

from helpers import CLI_ENV, ROOT

PACKAGE = pathlib.Path(ROOT) / "bert_tf"
NOT_JOBS = {"bert_tf.runtime.child_reaper"}  # a helper process that the jobs start, not a command
UNKNOWN_FLAG = [
    "error: Unknown command line flag 'no_such_flag'",
    "Try --helpfull for the list of flags.",
]
# It hands the flags it does not know to Beam, after checking its own required ones.
REFUSALS = {"bert_tf.create_pretraining_data": ["error: --vocab_file is required"]}


def entry_points():
    """Every module under bert_tf/ that runs as a program: `__main__.py` or `if __name__ == ...`."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if path.stem == "__main__":
            names.add(".".join(parts[:-1]))
        elif 'if __name__ == "__main__":' in path.read_text():
            names.add(".".join(parts))
    return sorted(names - NOT_JOBS)


def test_the_list_finds_the_jobs():
    found = entry_points()
    assert {"bert_tf.run_classifier", "bert_tf.serve", "bert_tf.playground"} <= set(found)
    assert len(found) >= 19


def test_every_entry_point_runs_as_the_program_and_refuses_an_unknown_flag_with_exit_2():
    # Without TF_CPP_MIN_LOG_LEVEL, as a user runs them: TensorFlow's start-up notices are dropped.
    env = {k: v for k, v in CLI_ENV.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    processes = {
        module: subprocess.Popen(
            [sys.executable, "-m", module, "--no_such_flag"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for module in entry_points()
    }
    results = {module: process.communicate(timeout=300) for module, process in processes.items()}
    for module, process in processes.items():
        stdout, stderr = results[module]
        assert process.returncode == 2, (module, stderr[-2000:])
        assert stdout == "", module
        assert stderr.splitlines() == REFUSALS.get(module, UNKNOWN_FLAG), (module, stderr[-2000:])
