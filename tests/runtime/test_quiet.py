"""Command lines are quiet by default: TensorFlow's start-up notices go, errors and warnings stay."""

import os
import pty
import re
import subprocess
import sys
import threading

import pytest
from helpers import ROOT

from bert_tf.runtime import job_process, quiet

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

NOTICES = (
    "All log messages before absl::InitializeLog",
    "oneDNN custom operations",
    "cuda drivers",
    "cpu_feature_guard",
    "failed call to cuInit",
)


def run_export_cli(*extra, environ=None):
    """`python -m bert_tf.export` on a missing model directory: it imports TensorFlow, then exits 2."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(environ or {}, PYTHONPATH=ROOT)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "bert_tf.export",
            "--model_dir=/nonexistent/model",
            "--export_dir=/tmp/unused",
            *extra,
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_command_line_keeps_its_error_and_drops_tensorflows_notices():
    result = run_export_cli()
    assert result.returncode == 2 and "/nonexistent/model" in result.stderr
    assert not [notice for notice in NOTICES if notice in result.stderr], result.stderr
    assert result.stderr.count("\n") <= 3, result.stderr


def test_a_job_started_by_a_quiet_job_is_quiet_too():
    """The experiments runner's jobs inherit the level their quiet parent set: not the user's."""
    inherited = {"TF_CPP_MIN_LOG_LEVEL": "2", quiet.QUIET_LEVEL_VARIABLE: "2"}
    result = run_export_cli(environ=inherited)
    assert result.returncode == 2 and "/nonexistent/model" in result.stderr
    assert not [notice for notice in NOTICES if notice in result.stderr], result.stderr


def test_verbosity_or_the_users_own_level_brings_the_notices_back():
    assert any(notice in run_export_cli("--verbosity=1").stderr for notice in NOTICES)
    assert any(
        notice in run_export_cli(environ={"TF_CPP_MIN_LOG_LEVEL": "0"}).stderr for notice in NOTICES
    )


def test_a_training_job_turns_onednn_on_unless_the_user_set_it(tmp_path):
    # TensorFlow logs this notice when it reads TF_ENABLE_ONEDNN_OPTS as on; on a CPU without
    # AVX-512 VNNI/BF16, AVX-VNNI or AMX it would otherwise stay off. The job imports TensorFlow,
    # then exits 2 for the missing --init_checkpoint.
    def run(environ=None):
        env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
        env.update(environ or {}, PYTHONPATH=ROOT)
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "bert_tf.run_classifier",
                "--task_name=mrpc",
                f"--data_dir={tmp_path / 'missing'}",
                f"--output_dir={tmp_path / 'out'}",
                "--do_train",
                "--verbosity=1",
            ],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 2, result.stderr
        return "oneDNN custom operations are on" in result.stderr

    assert run()
    assert not run({"TF_ENABLE_ONEDNN_OPTS": "0"})


def test_only_a_bert_tf_job_running_as_the_program_sets_its_process_up():
    class Main:
        def __init__(self, name):
            self.__spec__ = type("Spec", (), {"name": name})() if name else None

    assert job_process.main_module_name({"__main__": Main("bert_tf.run_squad")}) == (
        "bert_tf.run_squad"
    )
    assert job_process.main_module_name({"__main__": Main(None)}) is None  # a script or -c
    assert job_process.main_module_name({}) is None
    environ = {}
    assert not job_process.set_up(None, environ) and not job_process.set_up("pytest", environ)
    assert environ == {}
    assert set(job_process.TRAINING_JOBS) >= {"bert_tf.run_classifier", "bert_tf.run_pretraining"}


def test_importing_bert_tf_as_a_library_changes_nothing():
    script = (
        "import os, sys; before = dict(os.environ); err = sys.stderr; "
        "import bert_tf, bert_tf.run_classifier, bert_tf.export; "
        "assert dict(os.environ) == before, set(os.environ) ^ set(before); "
        "assert sys.stderr is err"
    )
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    env.update(PYTHONPATH=ROOT)
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


def test_verbose_requested_reads_absl_verbosity_and_the_environment():
    assert not quiet.verbose_requested(["-m", "--flag=1"], {})
    assert quiet.verbose_requested(["-m", "--verbosity=1"], {})
    assert quiet.verbose_requested(["-m", "-v", "2"], {})
    assert not quiet.verbose_requested(["-m", "--verbosity=0"], {})
    assert quiet.verbose_requested(["-m"], {"TF_CPP_MIN_LOG_LEVEL": "1"})
    inherited = {"TF_CPP_MIN_LOG_LEVEL": "2", quiet.QUIET_LEVEL_VARIABLE: "2"}
    assert not quiet.verbose_requested(["-m"], inherited)
    assert quiet.verbose_requested(["-m"], dict(inherited, TF_CPP_MIN_LOG_LEVEL="0"))


def test_the_filter_drops_notices_and_passes_progress_bars_on_at_once():
    source_read, source_write = os.pipe()
    sink_read, sink_write = os.pipe()
    os.write(
        source_write, b"I0000 port.cc:153] oneDNN custom operations are on. ...\n\rbar 1\rbar 2"
    )
    thread = threading.Thread(target=quiet._filter, args=(source_read, sink_write))
    thread.start()
    # The redraws before the last "\r" come out while the writer is still open.
    assert os.read(sink_read, 100) == b"\rbar 1\r"
    os.write(source_write, b"\nerror: kept\n")
    os.close(source_write)
    thread.join(5)
    os.close(sink_write)
    assert os.read(sink_read, 100) == b"bar 2\nerror: kept\n"


def test_a_terminal_under_the_filter_is_still_a_terminal_for_progress_bars():
    # fd 2 becomes the filter's pipe; whether the user's stderr is a terminal is kept from before.
    script = (
        "import os; from bert_tf.runtime import quiet; "
        "quiet.install(argv=['job'], environ={}); "
        "print(quiet.stderr_is_terminal(), os.isatty(2))"
    )
    main_end, terminal_end = pty.openpty()
    try:
        result = subprocess.run(
            [sys.executable, "-c", script],
            stderr=terminal_end,
            stdout=subprocess.PIPE,
            env=dict(os.environ, PYTHONPATH=ROOT),
            text=True,
            timeout=60,
        )
    finally:
        os.close(main_end)
        os.close(terminal_end)
    assert result.stdout.split() == ["True", "False"]
    piped = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, env=dict(os.environ, PYTHONPATH=ROOT),
        text=True, timeout=60,
    )  # fmt: skip
    assert piped.stdout.split() == ["False", "False"]


def test_log_lines_carry_absl_prefixes_only_at_verbosity_1(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat .\nthe dog ran .\n\nanother document here .\n")

    def build_vocab(*extra):
        env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
        return subprocess.run(
            [
                sys.executable, "-m", "bert_tf.build_vocab", f"--input_file={corpus}",
                f"--output_file={tmp_path / 'vocab.txt'}", "--vocab_size=120", *extra,
            ],
            env=dict(env, PYTHONPATH=ROOT), cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    absl_prefix = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d", re.M)
    plain = build_vocab()
    assert plain.returncode == 0, plain.stderr
    assert re.search(r"^learning: \d+ distinct words", plain.stderr, re.M), plain.stderr
    assert not absl_prefix.search(plain.stderr), plain.stderr
    verbose = build_vocab("--verbosity=1")
    assert verbose.returncode == 0, verbose.stderr
    assert re.search(r"^I\d{4} .*\] learning: \d+ distinct words", verbose.stderr, re.M)
