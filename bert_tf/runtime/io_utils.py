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


class Preempted(Exception):
    """Training saved a checkpoint and stopped on SIGTERM (a preemption's notice): the CLIs say
    where it stopped and exit with `exit_code` (0 unless --preempted_exit_code says otherwise)."""

    def __init__(self, message, exit_code=0):
        super().__init__(message)
        self.exit_code = exit_code


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


# TensorFlow's file system errors read "<path>; <the system's reason>".
_TF_OS_ERROR = re.compile(
    "(\\S+); ("
    + "|".join(sorted({re.escape(os.strerror(n)) for n in errno.errorcode}, key=len, reverse=True))
    + ")"
)


def os_error_message(error):
    """One line for an error of the file system (an OSError with an errno, or TensorFlow's error
    from a file operation): the file and the reason, as full_disk_message words a full disk; None
    for any other error."""
    message = full_disk_message(error)
    if message is not None:
        return message
    if isinstance(error, OSError):
        if not error.errno or not error.strerror:
            return None
        reason, path = error.strerror, error.filename
    else:
        if type(error).__module__.split(".")[0] != "tensorflow":
            return None
        found = _TF_OS_ERROR.search(str(error))
        if not found:
            return None
        path, reason = found.groups()
    return f"{os.fsdecode(path)}: {reason}" if path is not None else reason


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


# The file that marks a folder as a job's own output: {"job": NAME, "files": [every path it wrote
# there, relative, folders included]}. A job replaces a folder only when it is empty or carries this
# file with its name and holds nothing else.
OUTPUT_MARKER = "bert_tf_output.json"


def _tree(path):
    """Every file and folder under `path`, as sorted relative paths (symbolic links not followed)."""
    entries = []
    for root, folders, names in os.walk(path):
        for name in folders + names:
            entries.append(os.path.relpath(os.path.join(root, name), path))
    return sorted(entries)


def read_output_marker(path):
    """The marker of the folder `path` as a dict, or None when it has none (or one not ours)."""
    try:
        with open(os.path.join(path, OUTPUT_MARKER), encoding="utf-8") as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return None
    files = marker.get("files") if isinstance(marker, dict) else None
    if not isinstance(files, list) or not all(isinstance(name, str) for name in files):
        return None
    return marker


def check_replaceable(path, job, overwrite):
    """A UsageError unless the local folder `path` may become `job`'s output: it does not exist, is
    empty, or (with `overwrite`) holds exactly what `job` wrote there before, as its marker says.

    A file where a folder is wanted, and a mount point (which cannot be renamed), are refused too.
    Nothing is ever removed here.
    """
    existing = path
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        if existing == path:
            raise UsageError(f"{path} exists and is not a directory")
        raise UsageError(f"{path}: {existing} is not a directory")
    if existing != path:
        return
    if os.path.ismount(path):
        raise UsageError(
            f"{path} is a mount point, which cannot be replaced as a whole: write to a new folder "
            "inside it"
        )
    if not os.listdir(path):
        return
    marker = read_output_marker(path)
    if marker is None or marker.get("job") != job:
        raise UsageError(
            f"{path} holds files {job} did not write (no {OUTPUT_MARKER} of {job} is there): it "
            "is never replaced, --overwrite or not; write to a new or empty folder"
        )
    written = set(marker["files"]) | {OUTPUT_MARKER}
    strays = [name for name in _tree(path) if name not in written]  # walked only once it is ours
    if strays:
        shown = ", ".join(strays[:5]) + (f" and {len(strays) - 5} more" if len(strays) > 5 else "")
        raise UsageError(
            f"{path} holds files {job} did not write ({shown}): it is never replaced, "
            "--overwrite or not; move them out, or write to a new or empty folder"
        )
    if not overwrite:
        raise UsageError(
            f"{path} is not empty (an earlier output of {job}): pass --overwrite to replace it"
        )


def _output_name(filename, path, tmp):
    """The name an error about `filename` should give: `path` for a temporary beside it (or for no
    name), the file under `path` for one under the temporary `tmp`."""
    if filename is None:
        return path
    filename = os.fsdecode(filename)
    if tmp is not None and filename.startswith(tmp + os.sep):
        return path + filename[len(tmp) :]
    if filename == tmp or filename.startswith(path + "."):
        return path
    return filename


def _swap_in(tmp, path):
    """Renames the finished folder `tmp` onto `path`; an earlier `path` is moved aside first and
    removed after, or put back when the rename fails."""
    if not os.path.lexists(path):
        os.replace(tmp, path)
        return
    parent, name = os.path.split(path)
    aside = tempfile.mkdtemp(prefix=name + ".old-", dir=parent)
    try:
        os.replace(path, aside)  # onto the empty directory mkdtemp made
    except OSError:
        os.rmdir(aside)
        raise
    try:
        os.replace(tmp, path)
    except OSError:
        os.replace(aside, path)
        raise
    shutil.rmtree(aside)


@contextlib.contextmanager
def atomic_directory(path, job, overwrite=False, record=None):
    """Yields a new empty directory beside `path` (`path.tmp-XXXX`), renamed onto `path` only when the
    block succeeds, with `job`'s OUTPUT_MARKER listing what the block wrote (and the fields of
    `record`, such as the job's flags); removed when it fails.
    A kill leaves at most a `.tmp-` directory, never a half-written one under `path`. Local paths
    only.

    An existing `path` is replaced only as check_replaceable allows (empty, or `job`'s own earlier
    output with `overwrite`). An OSError names `path` (or the file under it), not the temporary.
    """
    if is_remote(path):
        raise UsageError(f"{path}: the output must be a local directory")
    path = os.path.realpath(path)  # a symbolic link's target is what gets replaced
    check_replaceable(path, job, overwrite)
    parent, name = os.path.split(path)
    missing = parent  # the folders made for `path`, removed again when the block fails
    while not os.path.lexists(os.path.dirname(missing)):
        missing = os.path.dirname(missing)
    made = not os.path.lexists(missing)
    tmp = None
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=name + ".tmp-", dir=parent)
        os.chmod(tmp, 0o777 & ~_UMASK)
        yield tmp
        written = _tree(tmp)
        marker = {**(record or {}), "job": job, "files": written}
        atomic_write_json(os.path.join(tmp, OUTPUT_MARKER), marker)
        _swap_in(tmp, path)
    except BaseException as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        folder = parent
        while made and folder.startswith(missing):  # empty ones only: never what another wrote
            try:
                os.rmdir(folder)
            except OSError:
                break
            folder = os.path.dirname(folder)
        if not isinstance(e, OSError) or not e.errno:
            raise
        filename = _output_name(e.filename, path, tmp)
        if filename == e.filename:
            raise
        raise OSError(e.errno, e.strerror, filename) from e


def atomic_write_text(path, text):
    """Writes `text` to `path` atomically."""
    with atomic_path(path) as tmp:
        with _gfile().GFile(tmp, "w") if is_remote(tmp) else open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


def atomic_write_json(path, obj):
    """Writes `obj` as indented JSON to `path` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def require_file(path, what="input"):
    """Returns `path` if it is a file; otherwise a UsageError naming it (the CLIs exit with code 2)."""
    gfile = _gfile()
    if not gfile.exists(path) or gfile.isdir(path):
        raise UsageError(f"{what} file not found: {path}")
    return path


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
