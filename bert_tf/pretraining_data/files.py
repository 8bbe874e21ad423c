"""The pretraining job's file operations: local paths through os, remote ones (gs://...) through Beam.

A Beam run reads its input and writes its outputs and work directory wherever its workers can reach,
gs:// on Dataflow. Remote paths go through Beam's FileSystems (gs:// needs `apache-beam[gcp]`),
not tf.io.gfile, so that no worker process imports TensorFlow for them; apache_beam is imported only
when a remote path comes up. Local paths take the same os calls as before, at the same speed.

A remote file is written as a local file first and then uploaded under a temporary name and
renamed (`atomic_path`), so that a reader, or a retried Beam bundle, never sees half a file under
the final name.
"""

import contextlib
import glob as local_glob
import json
import os
import posixpath
import shutil
import tempfile
import uuid

from bert_tf.runtime import io_utils

is_remote = io_utils.is_remote
# The buffer of a streamed copy.
COPY_BYTES = 1 << 22


def _beam():
    """Beam's FileSystems and CompressionTypes (imported on first use: only remote paths need it)."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    return FileSystems, CompressionTypes


def check_remote(path, flag):
    """Raises a UsageError naming `flag` when Beam has no file system for the remote `path`."""
    file_systems, _ = _beam()
    try:
        file_systems.get_filesystem(path)
    except ValueError as e:
        raise io_utils.UsageError(f"{flag}: {e}") from None


def abspath(path):
    """An absolute local path; a remote path as it is."""
    return path if is_remote(path) else os.path.abspath(path)


def normpath(path):
    """os.path.normpath that keeps a remote path's `scheme://`."""
    if not is_remote(path):
        return os.path.normpath(path)
    scheme, rest = path.split("://", 1)
    return f"{scheme}://{posixpath.normpath(rest)}"


def _metadata(path):
    """Beam's FileMetadata of a remote file, or None when it does not exist."""
    file_systems, _ = _beam()
    try:
        results = file_systems.match([path])
    except Exception:  # Beam's BeamIOError wraps the file system's own "not found"
        return None
    matches = [m for m in results[0].metadata_list if m.path == path]
    return matches[0] if matches else None


def isfile(path):
    """Whether `path` is a file (for a remote path: an object)."""
    return _metadata(path) is not None if is_remote(path) else os.path.isfile(path)


def exists(path):
    """Whether `path` exists."""
    return _beam()[0].exists(path) if is_remote(path) else os.path.exists(path)


def getsize(path):
    """The size of a file in bytes."""
    if not is_remote(path):
        return os.path.getsize(path)
    metadata = _metadata(path)
    if metadata is None:
        raise FileNotFoundError(path)
    return metadata.size_in_bytes


def size_and_mtime(path):
    """(size in bytes, modification time in ns) of a file: what identifies an input's version."""
    if not is_remote(path):
        stat = os.stat(path)
        return stat.st_size, stat.st_mtime_ns
    metadata = _metadata(path)
    if metadata is None:
        raise FileNotFoundError(path)
    return metadata.size_in_bytes, int(metadata.last_updated_in_seconds * 1e9)


def glob(pattern):
    """The files matching `pattern`, sorted."""
    if not is_remote(pattern):
        return sorted(p for p in local_glob.glob(os.path.expanduser(pattern)) if os.path.isfile(p))
    file_systems, _ = _beam()
    try:
        results = file_systems.match([pattern])
    except Exception:  # a pattern under a missing prefix
        return []
    return sorted(m.path for m in results[0].metadata_list if not m.path.endswith("/"))


def expand_globs(patterns, what):
    """io_utils.expand_globs for local and remote patterns; a pattern matching nothing is a UsageError."""
    if not any(is_remote(p) for p in patterns.split(",")):
        return io_utils.expand_globs(patterns, what=what)
    files = []
    for pattern in (p.strip() for p in patterns.split(",") if p.strip()):
        if is_remote(pattern):
            check_remote(pattern, what)
        matches = glob(pattern)
        if not matches:
            raise io_utils.UsageError(f"no {what} file matches {pattern!r}")
        files.extend(matches)
    return files


def remove(path):
    """Deletes a file if it exists."""
    if not is_remote(path):
        if os.path.exists(path):
            os.remove(path)
    elif isfile(path):
        _beam()[0].delete([path])


def remove_matching(patterns):
    """Deletes the files matching any of the glob `patterns` (remote ones in one batch)."""
    paths = [path for pattern in patterns for path in glob(pattern)]
    if any(is_remote(p) for p in paths):
        _beam()[0].delete(paths)
    else:
        for path in paths:
            os.remove(path)


def rmtree(directory):
    """Deletes a directory and everything under it, if it exists."""
    if not is_remote(directory):
        if os.path.isdir(directory):
            shutil.rmtree(directory)
        return
    paths = glob(directory.rstrip("/") + "/**")
    if paths:
        _beam()[0].delete(paths)


def makedirs(directory):
    """Creates a local directory and its parents (remote object stores have no directories)."""
    if not is_remote(directory):
        os.makedirs(directory, exist_ok=True)


def open_read(path):
    """Opens a file for reading bytes, seekable; a remote `.gz` file is not decompressed."""
    if not is_remote(path):
        return open(path, "rb")
    file_systems, compression = _beam()
    return file_systems.open(path, compression_type=compression.UNCOMPRESSED)


def copy_to(path, out):
    """Streams the bytes of file `path` into the open binary file `out`."""
    with open_read(path) as f:
        while chunk := f.read(COPY_BYTES):
            out.write(chunk)


def download(path, local_path):
    """Copies a file (local or remote) to a local path, atomically."""
    with io_utils.atomic_path(local_path) as tmp, open(tmp, "wb") as out:
        copy_to(path, out)


def upload(local_path, path):
    """Copies a local file to `path` (local or remote): a temporary name, then a rename."""
    if not is_remote(path):
        with io_utils.atomic_path(path) as tmp:
            shutil.copyfile(local_path, tmp)
        return
    file_systems, compression = _beam()
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    try:
        with file_systems.create(tmp, compression_type=compression.UNCOMPRESSED) as out:
            with open(local_path, "rb") as f:
                shutil.copyfileobj(f, out, COPY_BYTES)
        file_systems.rename([tmp], [path])
    except BaseException:
        remove(tmp)
        raise


@contextlib.contextmanager
def atomic_path(path):
    """io_utils.atomic_path for local and remote paths: yields a local temporary path to write."""
    if not is_remote(path):
        with io_utils.atomic_path(path) as tmp:
            yield tmp
        return
    fd, tmp = tempfile.mkstemp(suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        upload(tmp, path)
    finally:
        os.remove(tmp)


def read_json(path):
    """The JSON in `path`, or None when it is missing or unreadable."""
    try:
        with open_read(path) as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None
    except Exception:  # Beam's errors for a missing remote object
        if is_remote(path):
            return None
        raise


def write_text(path, text):
    """Writes `text` to `path` atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def write_json(path, obj):
    """Writes `obj` as indented JSON to `path` atomically (io_utils.atomic_write_json's format)."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
