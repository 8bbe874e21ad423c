"""Small file helpers shared by every job: atomic writes and input globs."""

import ast
import codecs
import contextlib
import errno
import glob
import gzip
import json
import os
import re
import shutil
import tempfile

# TensorFlow is imported only for remote paths (gs://...), which need tf.io.gfile: local work (and
# importing this module, which every CLI does) costs no process TensorFlow's start-up and memory.

# mkstemp creates files readable by their owner only; a finished file gets the mode that `open`
# would have given it. The umask can only be read by setting it, so it is read once, at import.
_UMASK = os.umask(0o022)
os.umask(_UMASK)


class UsageError(Exception):
    """A bad flag or a missing input: the CLIs report it and exit with code 2."""


class JobFailure(RuntimeError):
    """A run that started and cannot go on (e.g. a diverged loss): the CLIs report it and exit with code 1."""


_FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# TensorFlow's file system errors end "<path>; No space left on device" (or the quota's message).
_TF_FULL_DISK = re.compile(
    "(?:(\\S+); )?(" + "|".join(os.strerror(n) for n in _FULL_DISK_ERRNOS) + ")"
)


def full_disk_message(error):
    """'no space left on device writing PATH' when `error` (an OSError, or a TensorFlow error from a
    file write) says that the disk or the quota is full; None for any other error."""
    if isinstance(error, OSError):
        if error.errno not in _FULL_DISK_ERRNOS:
            return None
        reason, path = error.strerror, error.filename
    else:
        if type(error).__module__.split(".")[0] != "tensorflow":
            return None
        found = _TF_FULL_DISK.search(str(error))
        if not found:
            return None
        path, reason = found.groups()
        if path and ".tempstate" in path:
            path = path[: path.index(".tempstate")]  # TF's scratch name for the file it writes
    where = f" writing {path}" if path else ""
    return f"{reason.lower()}{where}"


# An OSError as text (str(error): "[Errno N] reason: 'file'", the file name as repr writes it),
# the form in which a Beam worker's error reaches the job.
_ERRNO_TEXT = re.compile(r"\[Errno (\d+)\] ")
_QUOTED_NAME = re.compile(r": (b?'(?:[^'\\\n]|\\.)*'|b?\"(?:[^\"\\\n]|\\.)*\")")


def full_disk_error_in(text):
    """The first full-disk OSError written out in `text` (a remote worker's failure, say), rebuilt
    with its errno and, where it can be read back, its file name; None when `text` holds none."""
    for found in _ERRNO_TEXT.finditer(text):
        number = int(found.group(1))
        reason = os.strerror(number)
        if number not in _FULL_DISK_ERRNOS or not text.startswith(reason, found.end()):
            continue
        name = _QUOTED_NAME.match(text, found.end() + len(reason))
        try:
            filename = os.fsdecode(ast.literal_eval(name.group(1))) if name else None
        except (ValueError, SyntaxError, TypeError):
            filename = None  # cut short or mangled on its way: the reason alone
        return OSError(number, reason, filename)
    return None


def is_remote(path):
    """True for a path on a TensorFlow file system such as gs://, which needs tf.io.gfile."""
    return "://" in path


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


@contextlib.contextmanager
def atomic_path(path):
    """Yields a temporary path beside `path`; renames it onto `path` only if the block succeeds.

    A kill at any moment therefore leaves either the old file or the complete new one, never a
    half-written file under the final name. Works for local paths and for `gs://` via tf.io.gfile
    (TensorFlow is imported only for the latter).
    """
    directory = os.path.dirname(path) or "."
    if is_remote(path):
        gfile = _gfile()
        gfile.makedirs(directory)
        tmp = f"{path}.tmp-{os.getpid()}"
        exists, rename, remove = (
            gfile.exists,
            lambda a, b: gfile.rename(a, b, overwrite=True),
            gfile.remove,
        )
    else:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(
            prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory
        )
        os.fchmod(fd, 0o666 & ~_UMASK)
        os.close(fd)
        exists, rename, remove = os.path.exists, os.replace, os.remove
    try:
        yield tmp
        rename(tmp, path)
    except BaseException as e:
        if exists(tmp):
            remove(tmp)
        if isinstance(e, OSError) and e.errno and e.filename is None:
            # A failed write() names no file; the caller's message should name the one it wrote.
            raise OSError(e.errno, e.strerror, path) from e
        raise


@contextlib.contextmanager
def atomic_directory(path, overwrite=False):
    """Yields a new empty directory beside `path` (`path.tmp-XXXX`), renamed onto `path` only when the
    block succeeds; removed when it fails. A kill leaves at most a `.tmp-` directory, never a
    half-written one under `path`. Local paths only.

    An existing `path` that is not empty is a UsageError unless `overwrite`; then it is moved aside
    (`path.old-XXXX`) and removed once the new one is in place.
    """
    if is_remote(path):
        raise UsageError(f"{path}: the output must be a local directory")
    path = os.path.abspath(path)
    if os.path.lexists(path):
        if not os.path.isdir(path):
            raise UsageError(f"{path} exists and is not a directory")
        if os.listdir(path) and not overwrite:
            raise UsageError(f"{path} is not empty: pass --overwrite to replace it")
    parent, name = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=name + ".tmp-", dir=parent)
    os.chmod(tmp, 0o777 & ~_UMASK)
    try:
        yield tmp
        if os.path.lexists(path):
            old = tempfile.mkdtemp(prefix=name + ".old-", dir=parent)
            os.replace(path, old)  # onto the empty directory mkdtemp made
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_text(path, text):
    """Writes `text` to `path` atomically."""
    with atomic_path(path) as tmp:
        with _gfile().GFile(tmp, "w") if is_remote(tmp) else open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


def atomic_write_json(path, obj):
    """Writes `obj` as indented JSON to `path` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def expand_globs(patterns, what="input"):
    """Expands comma-separated globs into a sorted file list; a pattern matching nothing is a UsageError."""
    if isinstance(patterns, str):
        patterns = [p for p in patterns.split(",") if p.strip()]
    if not patterns:
        raise UsageError(f"no {what} files given")
    files = []
    for pattern in patterns:
        pattern = pattern.strip()
        if is_remote(pattern):
            gfile = _gfile()
            matches = [m for m in gfile.glob(pattern) if not gfile.isdir(m)]
        else:
            matches = [m for m in glob.glob(os.path.expanduser(pattern)) if not os.path.isdir(m)]
        if not matches:
            raise UsageError(f"no {what} file matches {pattern!r}")
        files.extend(sorted(matches))
    return files


def open_text(path):
    """Opens a text file for reading as bytes lines; `.gz` files are decompressed (gs:// ones too).

    A UTF-8 byte order mark at the start is skipped, as Python's "utf-8-sig" codec does: editors on
    Windows write one, and it would otherwise glue U+FEFF to the first field of the first line.
    """
    if is_remote(path):
        raw = _gfile().GFile(path, "rb")
        f = gzip.GzipFile(fileobj=raw, mode="rb") if path.endswith(".gz") else raw
    else:
        f = gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")
    try:
        if f.read(len(codecs.BOM_UTF8)) != codecs.BOM_UTF8:
            f.seek(0)
    except BaseException:
        f.close()
        raise
    return f
