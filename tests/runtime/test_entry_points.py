"""Every `python -m bert_tf.<job>` started as a user starts it: a fresh interpreter.

The other tests run the CLIs through `helpers.run_module_cli`, which forks most of them from a
process that has already imported TensorFlow (tests/cli_zygote.py); this is the one check per CLI
that the module runs as the program on its own, quietly, and that a fork lists the same flags.
"""

import concurrent.futures
import os
import pathlib
import subprocess

import pytest
from helpers import (
    CLI_ENV,
    FRESH_JOBS,
    ROOT,
    CliZygote,
    pooled_zygote,
    run_fresh_cli,
    run_module_cli,
)

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


@pytest.mark.slow  # 19 fresh interpreters: left to `make test`
def test_every_entry_point_runs_as_the_program_and_lists_its_flags_as_when_forked():
    # Without TF_CPP_MIN_LOG_LEVEL, as a user runs them: quiet, TensorFlow's notices dropped.
    env = {k: v for k, v in CLI_ENV.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    modules = entry_points()
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
        helped = dict(
            zip(modules, pool.map(lambda m: run_fresh_cli(m, "--helpfull", env=env), modules))
        )
    zygote = pooled_zygote(CLI_ENV)
    for module in modules:
        assert helped[module].returncode == 1, (module, helped[module].stderr[-2000:])  # absl's
        assert helped[module].stderr == "", module
        forked = zygote.run(module, ["--helpfull"])
        assert forked.returncode == 1, (module, forked.stderr[-2000:])
        # A job that loads no TensorFlow would list absl flags that TensorFlow's imports define.
        same = forked.stdout == helped[module].stdout
        assert same == (module not in FRESH_JOBS), module


def test_every_entry_point_refuses_an_unknown_flag_with_exit_2():
    for module in entry_points():
        result = run_module_cli(module, "--no_such_flag")
        assert result.returncode == 2, (module, result.stderr[-2000:])
        assert result.stdout == "", module
        assert messages(result.stderr) == REFUSALS.get(module, UNKNOWN_FLAG), module


def messages(stderr):
    """stderr's lines less TensorFlow's start-up notices."""
    return [line for line in stderr.splitlines() if not quiet.NOISE.search(line.encode())]


def test_a_forked_cli_answers_as_a_fresh_interpreter_does(tmp_path):
    flags = [f"--input_file={tmp_path / 'missing.txt'}", f"--output_file={tmp_path / 'v.txt'}"]
    forked = run_module_cli("bert_tf.build_vocab", *flags)
    started = run_fresh_cli("bert_tf.build_vocab", *flags)
    assert forked.returncode == started.returncode == 2
    assert "missing.txt" in forked.stderr
    # The same but for what TensorFlow's C++ code writes while it loads (in the zygote, once).
    assert forked.stdout == started.stdout
    assert messages(forked.stderr) == messages(started.stderr) == [forked.stderr.splitlines()[-1]]


def test_a_forked_cli_past_its_timeout_is_killed_with_its_zygote(tmp_path):
    zygote = CliZygote(CLI_ENV)
    # An empty base path is polled until an export appears, as TF Serving does.
    flags = [f"--model_base_path={tmp_path}", "--port=0", "--rest_api_port=0"]
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.run("bert_tf.serve", flags, timeout=5)
    assert zygote.process.poll() == 0  # closed: no reply is left unread on its pipe
