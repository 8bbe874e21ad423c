"""Quiet command lines: TensorFlow's start-up notices are dropped, progress and real warnings stay.

`python -m bert_tf.<job>` on a CPU machine would otherwise print, before any line of ours, the
notices that TensorFlow's C++ code logs while it starts: "All log messages before
absl::InitializeLog() ...", oneDNN's, the CPU-feature and missing-CUDA ones, an E-level "failed
call to cuInit" on every machine without a GPU, and SavedModel notices. In TensorFlow 2.21 most of
them are written before TF_CPP_MIN_LOG_LEVEL takes effect, so no setting removes them: here the
process's stderr (file descriptor 2) goes through a filter thread that drops those lines and passes
every other byte on. The INFO lines that TensorFlow's and Keras' Python code logs (through absl, as
ours do) are dropped too; their warnings stay. Log lines carry no absl prefix (PlainFormatter).

It is installed only for a command line (`bert_tf.runtime.job_process` sees `python -m bert_tf.<job>`), never when
bert_tf is imported as a library, and not when the user asks for more: `--verbosity=1` (or any
positive absl verbosity) or their own TF_CPP_MIN_LOG_LEVEL.
"""

import atexit
import logging
import os
import re
import sys
import threading

# The notices dropped: each a pattern of one line that TensorFlow writes while it starts or saves.
NOISE = re.compile(
    rb"All log messages before absl::InitializeLog\(\) is called"
    rb"|oneDNN custom operations are on"
    rb"|oneDNN supports DT_\w+ only on platforms with"
    rb"|Could not find cuda drivers on your machine"
    rb"|This TensorFlow binary is optimized to use available CPU instructions"
    rb"|To enable the following instructions: .* rebuild TensorFlow"
    rb"|failed call to cuInit"
    rb"|cuda_executor\.cc.*(NUMA|could not open file to read NUMA)"
    rb"|Unable to register (cuDNN|cuFFT|cuBLAS) factory"
    rb"|computation placer already registered"
    rb"|TF-TRT Warning"
    rb"|has unsupported characters which will be renamed"
    rb"|TFRecordDataset `buffer_size` is unspecified"
    rb"|Fingerprint not found\. Saved model loading will continue"
    rb"|Reading SavedModel (from|with tags)|Restoring SavedModel bundle|SavedModel load for tags"
    rb"|Running initialization op on SavedModel bundle"
    # Apache Beam's, from the job and its DirectRunner workers (their lines also come back relayed
    # as "Worker: severity: ... message: ..." dumps): harmless notices that read as alarms.
    rb"|apitools not found, and bigquery client libraries are not available"
    rb"|No module named google\.cloud\.bigquery_storage_v1"
    rb"|Discarding unparseable args: \["
    rb"|No semi_persistent_directory found"
    rb"|^INFO:(__main__|apache_beam[\w.]*):"  # a worker's INFO lines, before it reads its level
)
# The packages whose absl INFO lines (e.g. "Sharding callback duration") are not ours to show.
LIBRARY_PATHS = re.compile(
    r"[/\\](tensorflow|tf_keras|keras|keras_hub|tensorflow_text|tensorflow_datasets)[/\\]"
)
# How long the filter may take to pass on what is left when the process exits.
DRAIN_SECONDS = 2.0


# Set beside the TF_CPP_MIN_LOG_LEVEL that `install` sets: a job's children (the experiments
# runner's jobs, Beam's workers) inherit both, and the level is then not the user's own.
QUIET_LEVEL_VARIABLE = "BERT_TF_QUIET_TF_CPP_MIN_LOG_LEVEL"


def verbose_requested(argv, environ):
    """Whether the user asked for TensorFlow's notices: a positive --verbosity/-v, or their own
    TF_CPP_MIN_LOG_LEVEL (not one a quiet parent job set)."""
    level = environ.get("TF_CPP_MIN_LOG_LEVEL")
    if level is not None and level != environ.get(QUIET_LEVEL_VARIABLE):
        return True
    for i, arg in enumerate(argv):
        value = None
        if arg.startswith(("--verbosity=", "-v=")):
            value = arg.split("=", 1)[1]
        elif arg in ("--verbosity", "-v") and i + 1 < len(argv):
            value = argv[i + 1]
        if value is not None:
            try:
                if int(value) > 0:
                    return True
            except ValueError:
                return False  # absl reports the bad value
    return False


def _filter(read_fd, write_fd):
    """Copies lines from `read_fd` to `write_fd`, dropping the NOISE lines, until end of file."""
    pending = b""
    with os.fdopen(read_fd, "rb", buffering=0) as source:
        while chunk := source.read(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            kept = b"".join(line + b"\n" for line in lines if not NOISE.search(line))
            # A progress bar redraws with "\r" and no newline: pass each redraw on at once. A line
            # that grows past a chunk without ending is passed on too (it is no notice of theirs).
            cut = pending.rfind(b"\r") + 1 if len(pending) <= 65536 else len(pending)
            kept, pending = kept + pending[:cut], pending[cut:]
            _write_all(write_fd, kept)
    if pending and not NOISE.search(pending):
        _write_all(write_fd, pending)


def _write_all(fd, data):
    """os.write until every byte is out (a pipe may take fewer bytes than it is given)."""
    while data:
        data = data[os.write(fd, data) :]


class LibraryInfoFilter(logging.Filter):
    """Drops log records below WARNING that come from TensorFlow's or Keras' own modules."""

    def filter(self, record):
        return record.levelno >= logging.WARNING or not LIBRARY_PATHS.search(record.pathname or "")


class PlainFormatter(logging.Formatter):
    """A log line as a command line's user reads it: the message, after "warning: " or "error: "
    from WARNING up; absl's prefix (level, date, time, thread, file and line) is for --verbosity=1."""

    def format(self, record):
        message = super().format(record)
        if record.levelno >= logging.WARNING:
            level = "error" if record.levelno >= logging.ERROR else "warning"
            return f"{level}: {message}"
        return message


# Whether stderr was a terminal before install() put its filter (a pipe) in between.
_stderr_was_terminal = None


def stderr_is_terminal():
    """Whether this process's stderr reaches a terminal (the user's, under the filter): where a
    progress bar redraws in place; elsewhere (a log file, a pipe) bars are left out."""
    if _stderr_was_terminal is not None:
        return _stderr_was_terminal
    return os.isatty(2)


def install(argv=None, environ=None):
    """Filters this process's stderr (and its children's) as described above; returns whether it did."""
    argv = sys.argv if argv is None else argv
    environ = os.environ if environ is None else environ
    if verbose_requested(argv, environ):
        return False
    # TensorFlow's C++ INFO and WARNING lines that do honour the level.
    environ["TF_CPP_MIN_LOG_LEVEL"] = environ[QUIET_LEVEL_VARIABLE] = "2"
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
    # Beam's runner logs its servers' ports and relays every worker's INFO line (as a protobuf dump).
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    # absl's own logger class must create the "absl" logger (it reports the caller's file and line),
    # so absl.logging is imported first.
    from absl import logging as absl_logging

    absl_logging.get_absl_logger().addFilter(LibraryInfoFilter())
    absl_logging.get_absl_handler().setFormatter(PlainFormatter())
    # What a job prints (stdout) and logs (stderr) reach a pipe in the order written: a print
    # block-buffered in a pipe came out later, run into the middle of a log line.
    try:
        sys.stdout.reconfigure(line_buffering=True)
    except (AttributeError, ValueError):
        pass  # replaced by something that is no TextIOWrapper
    sys.stderr.flush()
    global _stderr_was_terminal
    _stderr_was_terminal = os.isatty(2)
    original = os.dup(2)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    thread = threading.Thread(
        target=_filter, args=(read_fd, original), name="quiet-stderr", daemon=True
    )
    thread.start()

    def restore():
        """Gives fd 2 back and lets the filter pass on what is left."""
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(original, 2)  # this process's write end of the pipe closes here
        thread.join(DRAIN_SECONDS)  # children that outlive us may hold the pipe open

    atexit.register(restore)
    return True
