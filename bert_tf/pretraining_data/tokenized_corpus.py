"""The tokenized corpus on disk, and the original's "random next" draw over all of it.

The original `create_pretraining_data.py` draws a random-next segment B from any document of the
whole input: up to 10 tries for a document other than A's, a uniformly random first sentence, then
whole sentences until B reaches its target length. Drawing from a ~1 MiB block instead would take B
from A's own document whenever a block holds one or two documents (books), so the data job runs in
two phases:

1. every work unit tokenizes its documents into three files (`UnitTokensWriter`): the token ids,
   the sentence offsets, and the document tables (pieces, the original documents they were cut
   from, blocks);
2. every unit then builds its records from its own blocks, drawing B from the whole corpus
   (`FileCorpus`): a draw reads a few hundred bytes with `os.pread`, so no process holds the corpus
   and memory stays flat however large it grows.

A document longer than a block is stored as several *pieces* (see documents.py): B is drawn from
*original documents*, so that no piece of A's own document counts as "another document". Arrays
are little-endian; no TensorFlow here, so worker processes stay light.

Unit files, for a prefix P (e.g. `.work/unit-000003`):
  P.tokens     int32 [num_tokens]
  P.sentences  int64 [num_sentences + 1]  token offset of each sentence, then the total
  P.documents  int64 header [num_pieces, num_originals, num_blocks], then
               piece_starts [num_pieces + 1]        sentence offset of each piece
               piece_originals [num_pieces]         the unit's original document of each piece
               original_starts [num_originals + 1]  sentence offset of each original document
               block_starts [num_blocks + 1]        piece offset of each block
"""

import bisect
import collections
import contextlib
import os
import struct
import sys

import numpy as np

from bert_tf.runtime import io_utils

# How many times the original tries to draw a random document other than the current one.
RANDOM_DOCUMENT_TRIES = 10
TOKEN_DTYPE = np.dtype("<i4")
OFFSET_DTYPE = np.dtype("<i8")
_OFFSET = struct.Struct("<q")
_TWO_OFFSETS = struct.Struct("<qq")
SUFFIXES = (".tokens", ".sentences", ".documents")
# Units whose files a process keeps open for draws (three descriptors each).
OPEN_UNITS = 64


def unit_files(prefix):
    """The three files of a unit's tokens, in SUFFIXES order."""
    return [prefix + suffix for suffix in SUFFIXES]


def draw_random_next(corpus, random_, exclude, target_b_length, out):
    """The original's random-next B: appends its tokens' bytes to `out`; returns the document drawn.

    Up to RANDOM_DOCUMENT_TRIES uniform draws of a document other than `exclude` (a corpus of one
    document falls back to it, as the original does), a uniform first sentence, then whole
    sentences until target_b_length tokens, at least one. `random_` is random.Random().random.
    """
    num_documents = corpus.num_documents
    for _ in range(RANDOM_DOCUMENT_TRIES):
        document = int(random_() * num_documents)  # randint(0, num_documents - 1)
        if document != exclude:
            break
    source, first, end = corpus.locate(document)
    first += int(random_() * (end - first))
    # Every sentence has a token, so target_b_length sentences always reach the target.
    count = max(1, min(end - first, target_b_length))
    starts = source.sentence_starts(first, count + 1)
    taken = 1
    while taken < count and starts[taken] - starts[0] < target_b_length:
        taken += 1
    out += source.token_bytes(starts[0], starts[taken])
    return document


class MemoryCorpus:
    """A Block's documents as the corpus to draw from (`create_training_instances`, tests).

    Document d is the block's document order[d], so draws name documents as the block's shuffled
    order does, as the original names them after its shuffle.
    """

    def __init__(self, block, order=None):
        order = np.arange(block.num_documents) if order is None else np.asarray(order)
        self._first = block.document_starts[:-1][order].tolist()
        self._end = block.document_starts[1:][order].tolist()
        self._sentences = block.sentence_starts.tolist()
        self._tokens = block.tokens.astype(TOKEN_DTYPE, copy=False).tobytes()
        self.num_documents = len(order)

    def locate(self, document):
        """(source, first sentence, end sentence) of a document."""
        return self, self._first[document], self._end[document]

    def sentence_starts(self, first, count):
        """`count` sentence offsets from sentence `first`."""
        return self._sentences[first : first + count]

    def token_bytes(self, start, end):
        """The little-endian int32 bytes of tokens [start, end)."""
        return self._tokens[4 * start : 4 * end]


class UnitTokens:
    """One unit's token files, open for reading blocks and for draws (with os.pread)."""

    def __init__(self, prefix):
        self.prefix = prefix
        self._fds = [os.open(path, os.O_RDONLY) for path in unit_files(prefix)]
        self._tokens_fd, self._sentences_fd, documents_fd = self._fds
        num_pieces, num_originals, num_blocks = struct.unpack("<3q", os.pread(documents_fd, 24, 0))
        table_bytes = 8 * (2 * num_pieces + num_originals + num_blocks + 3)
        tables = np.frombuffer(os.pread(documents_fd, table_bytes, 24), OFFSET_DTYPE)
        sizes = (num_pieces + 1, num_pieces, num_originals + 1, num_blocks + 1)
        self.piece_starts, self.piece_originals, self.original_starts, self.block_starts = np.split(
            tables, np.cumsum(sizes)[:-1]
        )
        self._original_starts = self.original_starts.tolist()
        self.num_originals = num_originals
        self.num_blocks = num_blocks

    def close(self):
        """Closes the files."""
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def locate(self, original):
        """(self, first sentence, end sentence) of the unit's original document `original`."""
        return self, self._original_starts[original], self._original_starts[original + 1]

    def sentence_starts(self, first, count):
        """`count` sentence offsets from sentence `first`, as a tuple of ints."""
        return struct.unpack(f"<{count}q", os.pread(self._sentences_fd, 8 * count, 8 * first))

    def token_bytes(self, start, end):
        """The little-endian int32 bytes of tokens [start, end)."""
        return os.pread(self._tokens_fd, 4 * (end - start), 4 * start)

    def read_block(self, block_index):
        """(tokens, sentence_starts, piece_starts, piece_originals) of one block, rebased to 0."""
        first_piece, end_piece = self.block_starts[block_index : block_index + 2].tolist()
        piece_starts = self.piece_starts[first_piece : end_piece + 1]
        first_sentence, end_sentence = int(piece_starts[0]), int(piece_starts[-1])
        sentence_starts = np.frombuffer(
            os.pread(
                self._sentences_fd, 8 * (end_sentence - first_sentence + 1), 8 * first_sentence
            ),
            OFFSET_DTYPE,
        )
        first_token, end_token = int(sentence_starts[0]), int(sentence_starts[-1])
        tokens = np.frombuffer(
            os.pread(self._tokens_fd, 4 * (end_token - first_token), 4 * first_token), TOKEN_DTYPE
        )
        return (
            tokens.astype(np.int32),
            sentence_starts - first_token,
            piece_starts - first_sentence,
            self.piece_originals[first_piece:end_piece],
        )


class FileCorpus:
    """Every unit's token files as one corpus of original documents, numbered unit by unit.

    `units` is [(prefix, num_originals), ...] in unit order. Files are opened on demand and at
    most OPEN_UNITS units stay open, so a corpus of any number of units costs a few descriptors.
    """

    def __init__(self, units):
        self.prefixes = [prefix for prefix, _ in units]
        self.first_original = [0]
        for _, num_originals in units:
            self.first_original.append(self.first_original[-1] + num_originals)
        self.num_documents = self.first_original[-1]
        self._open = collections.OrderedDict()

    def unit(self, unit_index):
        """The UnitTokens of a unit, opened on first use (least recently used ones are closed)."""
        tokens = self._open.get(unit_index)
        if tokens is None:
            tokens = self._open[unit_index] = UnitTokens(self.prefixes[unit_index])
            if len(self._open) > OPEN_UNITS:
                self._open.popitem(last=False)[1].close()
        else:
            self._open.move_to_end(unit_index)
        return tokens

    def locate(self, document):
        """(source, first sentence, end sentence) of a corpus-wide original document number."""
        unit_index = bisect.bisect_right(self.first_original, document) - 1
        return self.unit(unit_index).locate(document - self.first_original[unit_index])

    def close(self):
        """Closes every open unit."""
        while self._open:
            self._open.popitem()[1].close()


class UnitTokensWriter:
    """A context manager that writes one unit's token files block by block.

    `add_block(block, originals)` takes a tokenized Block and, for each of its documents (pieces),
    a key of the original document it was cut from; consecutive pieces with the same key are one
    original document. Each file appears under its name only when the block exits without an
    error; the caller's manifest, written after that, is what marks the unit as tokenized.
    """

    def __init__(self, prefix):
        self.prefix = prefix
        self._stack = contextlib.ExitStack()
        self._tokens = self._sentences = None
        self._num_tokens = self._num_sentences = 0
        self._piece_starts, self._piece_originals = [0], []
        self._original_starts, self._block_starts = [], [0]
        self._last_key = object()

    def __enter__(self):
        tokens_path, sentences_path, _ = unit_files(self.prefix)
        self._tokens = self._stack.enter_context(
            open(self._stack.enter_context(io_utils.atomic_path(tokens_path)), "wb")
        )
        self._sentences = self._stack.enter_context(
            open(self._stack.enter_context(io_utils.atomic_path(sentences_path)), "wb")
        )
        self._sentences.write(_OFFSET.pack(0))
        return self

    def add_block(self, block, originals):
        """Appends a Block whose documents come from the originals keyed by `originals`."""
        self._tokens.write(block.tokens.astype(TOKEN_DTYPE, copy=False).tobytes())
        self._sentences.write(
            (block.sentence_starts[1:] + self._num_tokens).astype(OFFSET_DTYPE).tobytes()
        )
        document_starts = (block.document_starts + self._num_sentences).tolist()
        for document, key in enumerate(originals):
            if key != self._last_key:
                self._original_starts.append(document_starts[document])
                self._last_key = key
            self._piece_originals.append(len(self._original_starts) - 1)
            self._piece_starts.append(document_starts[document + 1])
        self._num_tokens += len(block.tokens)
        self._num_sentences += len(block.sentence_starts) - 1
        self._block_starts.append(len(self._piece_originals))

    @property
    def num_originals(self):
        """How many original documents the unit holds so far."""
        return len(self._original_starts)

    def __exit__(self, *exc_info):
        if exc_info[0] is None:
            try:
                self._write_tables()
            except BaseException:
                self._stack.__exit__(*sys.exc_info())  # the streamed files' temporaries go too
                raise
        return self._stack.__exit__(*exc_info)

    def _write_tables(self):
        header = [
            len(self._piece_originals),
            len(self._original_starts),
            len(self._block_starts) - 1,
        ]
        tables = np.array(
            header
            + self._piece_starts
            + self._piece_originals
            + self._original_starts
            + [self._num_sentences]
            + self._block_starts,
            OFFSET_DTYPE,
        )
        with io_utils.atomic_path(unit_files(self.prefix)[2]) as tmp, open(tmp, "wb") as f:
            f.write(tables.tobytes())
