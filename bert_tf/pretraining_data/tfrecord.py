"""TFRecord files without TensorFlow: the framing, a part writer, and a reader of the first records.

A TFRecord is: uint64 length, uint32 masked CRC-32C of those 8 bytes, the data, uint32 masked CRC-32C
of the data, all little-endian (tensorflow/core/lib/io/record_writer.cc). A gzip TFRecord file is
such a stream, gzip-compressed. Writing them here spares the worker processes TensorFlow, which
would cost each ~3 s of start-up and ~0.8 GB of RSS; google-crc32c computes the checksums.
"""

import contextlib
import functools
import gzip
import struct

import google_crc32c
import numpy as np

from bert_tf.pretraining_data import files
from bert_tf.runtime import io_utils

# The values of --compression: "gzip" writes each part as one gzip member, so parts concatenate.
COMPRESSIONS = ("none", "gzip")
# A record's length field and its CRCs.
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")


def has_fast_crc32c():
    """Whether google-crc32c runs its C extension here; without it, writing records is slow."""
    return google_crc32c.implementation == "c"


def masked_crc32c(data):
    """The CRC-32C of `data`, masked as TFRecord files store it."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@functools.lru_cache(maxsize=4096)
def _record_header(length):
    """The 12 bytes before a record of `length` bytes (cached: record lengths repeat)."""
    encoded = _LENGTH.pack(length)
    return encoded + _CRC.pack(masked_crc32c(encoded))


def tfrecord_frames(blob, lengths):
    """The TFRecord file bytes of records given as their concatenation and their lengths."""
    pieces = []
    start = 0
    for length in np.asarray(lengths).tolist():
        data = blob[start : start + length]
        pieces += (_record_header(length), data, _CRC.pack(masked_crc32c(data)))
        start += length
    return b"".join(pieces)


class PartWriter:
    """A context manager that writes one unit's part file: TFRecords (or one gzip member).

    The file appears under its name only when the block exits without an error. A part without
    records is an empty file, also with gzip: TensorFlow's GZIP reader stops at an empty member,
    so an empty member in the middle of an output file would hide every record after it.
    """

    def __init__(self, path, compression):
        self.path = path
        self.compression = compression
        self._stack = contextlib.ExitStack()
        self._file = None

    def __enter__(self):
        tmp = self._stack.enter_context(io_utils.atomic_path(self.path))
        self._file = self._stack.enter_context(open(tmp, "wb"))
        return self

    def write(self, blob, lengths):
        """Writes records given as their concatenation and their lengths."""
        if not len(lengths):
            return
        if self.compression == "gzip" and not isinstance(self._file, gzip.GzipFile):
            # Level 6 (zlib's default, as TensorFlow's GZIP writer uses); no file name or time in
            # the header, which would make the bytes differ from run to run.
            self._file = self._stack.enter_context(
                gzip.GzipFile(filename="", mode="wb", compresslevel=6, fileobj=self._file, mtime=0)
            )
        self._file.write(tfrecord_frames(blob, lengths))

    def __exit__(self, *exc_info):
        return self._stack.__exit__(*exc_info)


def iter_first_records(path, compression, count):
    """Yields the first `count` records of a TFRecord file written here (for logs; no CRC check)."""
    with files.open_read(path) as raw:
        f = gzip.GzipFile(fileobj=raw, mode="rb") if compression == "gzip" else raw
        for _ in range(count):
            header = f.read(12)
            if len(header) < 12:
                return
            length = _LENGTH.unpack(header[:8])[0]
            yield f.read(length)
            f.read(4)
