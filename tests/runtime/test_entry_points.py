"""Every `python -m bert_tf.<job>` started as a user starts it: a fresh interpreter.

The other tests run the CLIs through `helpers.run_module_cli`, which forks them from a process
that has already imported TensorFlow; this is the one check per CLI that the module runs as the
program on its own, with its imports, flags, exit codes and quiet start-up.
"""

import pathlib
import subprocess
import sys

import pytest
from helpers import CLI_ENV, ROOT, CliZygote, run_module_cli

from bert_tf.runtime import quiet

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


def messages(stderr):
    """stderr's lines less TensorFlow's start-up notices."""
    return [line for line in stderr.splitlines() if not quiet.NOISE.search(line.encode())]


def test_a_forked_cli_answers_as_a_fresh_interpreter_does(tmp_path):
    flags = [f"--input_file={tmp_path / 'missing.txt'}", f"--output_file={tmp_path / 'v.txt'}"]
    forked = run_module_cli("bert_tf.build_vocab", *flags)
    fresh = subprocess.run(
        [sys.executable, "-m", "bert_tf.build_vocab", *flags],
        cwd=ROOT,
        env=CLI_ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert forked.returncode == fresh.returncode == 2
    assert "missing.txt" in forked.stderr
    # The same but for what TensorFlow's C++ code writes while it loads (in the zygote, once).
    assert forked.stdout == fresh.stdout
    assert messages(forked.stderr) == messages(fresh.stderr) == [forked.stderr.splitlines()[-1]]


def test_a_forked_cli_past_its_timeout_is_killed_and_the_zygote_goes_on(tmp_path):
    zygote = CliZygote(CLI_ENV)
    try:
        # An empty base path is polled until an export appears, as TF Serving does.
        with pytest.raises(subprocess.TimeoutExpired):
            zygote.run("bert_tf.serve", [f"--model_base_path={tmp_path}"], timeout=3)
        refused = zygote.run("bert_tf.serve", ["--no_such_flag"], timeout=60)
        assert refused.returncode == 2 and refused.stderr.splitlines() == UNKNOWN_FLAG
    finally:
        zygote.process.stdin.close()
        assert zygote.process.wait(timeout=60) == 0
