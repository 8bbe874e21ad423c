"""Reading pretraining documents from text files or tfds, and tokenizing them into Blocks.

The input format is the original BERT `create_pretraining_data.py`'s: one sentence per line, a blank
line between documents. Files are read in byte ranges, so that work units stream and run in
parallel (see bert_tf.pretraining_data.plan): a document belongs to the range that holds its *position*,
the offset of the blank line before it (or of the start of its file). A range reads only its own
bytes: a plain file is entered with `seek`, a `.gz` file is decompressed from its start (positions
are then offsets in the compressed file). Documents are grouped into *blocks* of about
`BLOCK_BYTES` of text, the groups on which the instance algorithm runs (see instances.py), and a
block is tokenized into a `Block`: flat int32 ids with sentence and document offsets.

Bad or odd input
  * A line longer than `MAX_LINE_BYTES` (64 KiB) is read in pieces of at most that size, cut at
    whitespace when there is any (else at a UTF-8 character boundary); each piece is a sentence.
    The original kept such a line as one segment and truncated nearly all of it away.
  * A document longer than `BLOCK_BYTES` is cut into documents of about that size at line breaks;
    the pieces remember their original document, so that a random next never comes from it.
  * Invalid UTF-8 bytes become U+FFFD, which the tokenizer drops, and are counted.
  * Documents with no tokens are skipped, and lines without tokens dropped, as in the original.
  * A line of only whitespace as str.strip() sees it (Unicode spaces, U+001C..U+001F) or of only
    invalid UTF-8 (which the original's decoding ignores) ends a document, as in the original.

No TensorFlow here (except to read a tfds split), so that worker processes stay light.
"""

import dataclasses
import functools
import gzip
import itertools
import operator
import os

import numpy as np

from bert_tf.pretraining_data import files
from bert_tf.tokenization import python_tokenizer

# The text of a block, and the most of one document: part of the output's identity, since changing
# it changes which documents share a block (a work unit is about this much input, too).
BLOCK_BYTES = 1 << 20
MAX_LINE_BYTES = 64 << 10
# Lines and bytes per tokenizer call: bound the memory of one call's id list (a block of at most
# BLOCK_BYTES is one call, except for a block of a huge document).
TOKENIZE_BATCH_LINES = 1 << 16
TOKENIZE_BATCH_BYTES = 1 << 20


# ---------------------------------------------------------------------------------------------
# Reading documents
# ---------------------------------------------------------------------------------------------


def is_blank_line(line):
    """Whether a line holds only whitespace as the original sees it: it decodes with errors="ignore"
    and calls str.strip(), so Unicode spaces (U+00A0, U+3000, ...), U+001C..U+001F and invalid
    UTF-8 bytes count as blank. The bytes test settles the usual lines without decoding them."""
    stripped = line.strip()
    if not stripped:
        return True
    if 0x20 < stripped[0] < 0x80:
        return False  # a visible ASCII character
    return not stripped.decode("utf-8", errors="ignore").strip()


def _cut_point(piece):
    """Where to cut an over-long line piece: after its last whitespace, else at a UTF-8 boundary."""
    cut = max(piece.rfind(b" "), piece.rfind(b"\t"))
    if cut > 0:
        return cut + 1
    cut = len(piece)
    # Never split a multi-byte character: back off over continuation bytes (10xxxxxx).
    while cut > 0 and (piece[cut - 1] & 0xC0) == 0x80:
        cut -= 1
    if cut > 0 and piece[cut - 1] >= 0xC0:
        cut -= 1  # the lead byte of the character that would be cut
    return cut if cut > 0 else len(piece)


def _iter_lines(stream, tell, max_line_bytes):
    """Yields (position, piece, whole_line) for each line of `stream`; long lines come in pieces.

    `position` is `tell()` before the line was read. A line longer than `max_line_bytes` comes as
    several pieces, each with the line's position and `whole_line` False, so memory stays bounded.
    """
    while True:
        position = tell()
        buffer = stream.readline(max_line_bytes)
        if not buffer:
            return
        if buffer.endswith(b"\n") or len(buffer) < max_line_bytes:
            yield position, buffer, True
            continue
        while True:
            if buffer.endswith(b"\n"):
                yield position, buffer, False
                break
            if len(buffer) >= max_line_bytes:
                cut = _cut_point(buffer)
                yield position, buffer[:cut], False
                buffer = buffer[cut:]
            more = stream.readline(max_line_bytes - len(buffer))
            if not more:
                if buffer:
                    yield position, buffer, False
                break
            buffer += more


def _cut_document(lines, max_document_bytes, stats=None):
    """Yields one document's `lines` as documents of at most `max_document_bytes` each.

    Bounds memory: an enormous document is cut, at line breaks, into documents of about a block
    (a single longer line stays whole). `lines` may be a stream; it is never held whole.
    """
    document, document_bytes = [], 0
    for line in lines:
        if document_bytes + len(line) > max_document_bytes and document:
            if stats is not None:
                stats["documents_cut"] += 1
            yield document
            document, document_bytes = [], 0
        document.append(line)
        document_bytes += len(line)
    if document:
        yield document


def _owned_lines(path, start, end, max_line_bytes, stats):
    """Yields (document number, line piece) for the lines of the documents of `path` whose
    position lies in [start, end); the number changes from one document to the next."""
    end = float("inf") if end is None else end
    with files.open_read(path) as raw:  # a remote (gs://) input through Beam, for Beam runs
        # Reading from the file's start, the first document's position is 0.
        in_document, owner, blank_position = False, None, 0
        tell = raw.tell
        if path.endswith(".gz"):
            # A gzip stream cannot seek: decompress from the start and skip what lies before `start`.
            # A line's position is how far the decompressor has read (it reads ahead in chunks, so
            # it can reach the end of the file: clamp to the last byte, which a range holds).
            # Positions can therefore repeat, which is why documents are numbered, not keyed by them.
            stream = gzip.GzipFile(fileobj=raw, mode="rb")
            last_byte = max(raw.seek(0, os.SEEK_END) - 1, 0)
            raw.seek(0)
            tell = lambda: min(raw.tell(), last_byte)
        else:
            stream = raw
            if start > 0:
                # Land on the first line that starts at or after `start`. The lines up to the next
                # blank line continue a document whose position is before `start`: not ours.
                raw.seek(start - 1)
                while True:
                    skipped = raw.readline(max_line_bytes)
                    if not skipped or skipped.endswith(b"\n"):
                        break
                in_document, owner, blank_position = True, None, None
        document = 0
        for position, piece, whole_line in _iter_lines(stream, tell, max_line_bytes):
            if whole_line and is_blank_line(piece):
                document += 1
                in_document, blank_position = False, position
                continue
            if not in_document:
                # The first line of a document: its position is the blank line's before it.
                in_document, owner = True, blank_position
                if owner >= end:
                    return
            if owner is None or owner < start:
                continue
            if not whole_line and stats is not None:
                stats["long_line_pieces"] += 1
            yield document, piece


def iter_file_pieces(
    path,
    start=0,
    end=None,
    max_line_bytes=MAX_LINE_BYTES,
    max_document_bytes=BLOCK_BYTES,
    stats=None,
):
    """Yields (original, document) for the documents of `path` whose position lies in [start, end).

    A document is a list of line bytes; `original` is the same for the pieces of one document
    that was cut for being longer than `max_document_bytes`, and differs between documents.
    A document's position is the offset of the last blank line before it, or 0 for a file's first
    document; for `.gz` files offsets count compressed bytes. Reading every range of a partition
    of [0, size) yields every document exactly once.
    """
    lines = _owned_lines(path, start, end, max_line_bytes, stats)
    for number, document in itertools.groupby(lines, key=operator.itemgetter(0)):
        for piece in _cut_document((piece for _, piece in document), max_document_bytes, stats):
            yield (path, number), piece


def iter_file_documents(
    path,
    start=0,
    end=None,
    max_line_bytes=MAX_LINE_BYTES,
    max_document_bytes=BLOCK_BYTES,
    stats=None,
):
    """Yields the documents (lists of line bytes) of `path` whose position lies in [start, end)."""
    for _, document in iter_file_pieces(
        path, start, end, max_line_bytes, max_document_bytes, stats
    ):
        yield document


def read_document_sentences(path):
    """Every document of the pretraining-format file `path` as a list of its lines (str, stripped;
    invalid UTF-8 replaced)."""
    return [
        [line.decode("utf-8", "replace").strip() for line in document]
        for document in iter_file_documents(path)
    ]


def iter_text_pieces(texts, split_sentences, max_document_bytes=BLOCK_BYTES):
    """Turns whole-document strings (a tfds text feature) into (original, document of sentence
    bytes) pairs, as iter_file_pieces does for files."""
    for number, text in enumerate(texts):
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        sentences = (
            sentence.encode("utf-8")
            for paragraph in text.splitlines()
            for sentence in split_sentences(paragraph)
        )
        for piece in _cut_document(
            (s for s in sentences if not is_blank_line(s)), max_document_bytes
        ):
            yield number, piece


def iter_tfds_pieces(name, split, feature, data_dir=None):
    """(original, document) pairs of a tensorflow-datasets split: each example's `feature` text,
    cut into sentences."""
    import tensorflow_datasets as tfds

    from bert_tf.pretraining_data.corpus import split_sentences

    dataset = tfds.load(name, split=split, data_dir=data_dir, shuffle_files=False)
    texts = (example[feature] for example in tfds.as_numpy(dataset))
    return iter_text_pieces(texts, split_sentences)


def iter_blocks(pieces, block_bytes=BLOCK_BYTES):
    """Groups (original, document) pairs into blocks of about `block_bytes` of text: the groups of
    documents that share a document shuffle and an instance shuffle."""
    block, size = [], 0
    for original, document in pieces:
        block.append((original, document))
        size += sum(len(line) for line in document)
        if size >= block_bytes:
            yield block
            block, size = [], 0
    if block:
        yield block


# ---------------------------------------------------------------------------------------------
# Tokenization: documents of line bytes -> a Block of flat id arrays
# ---------------------------------------------------------------------------------------------


def _offsets(lengths):
    """[0, l0, l0 + l1, ...]: the start offsets of consecutive runs, with the total at the end."""
    result = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=result[1:])
    return result


@dataclasses.dataclass(eq=False)
class Block:
    """Tokenized documents as flat arrays: what the instance algorithm and the workers work on.

    Sentence s is `tokens[sentence_starts[s]:sentence_starts[s + 1]]`; document d is sentences
    `document_starts[d]` to `document_starts[d + 1]`. No sentence and no document is empty.
    `originals[d]` names the original document that document d was cut from (pieces of one long
    document share it); None when every document is whole and its own.
    """

    tokens: np.ndarray  # int32 [num_tokens]
    sentence_starts: np.ndarray  # int64 [num_sentences + 1]
    document_starts: np.ndarray  # int64 [num_documents + 1]
    originals: list = None

    @property
    def num_documents(self):
        """How many documents the block holds."""
        return len(self.document_starts) - 1

    @classmethod
    def from_documents(cls, documents):
        """A Block from documents given as lists of id lists; empty sentences and documents go."""
        documents = [[s for s in document if len(s)] for document in documents]
        documents = [document for document in documents if document]
        sentences = [s for document in documents for s in document]
        lengths = [len(s) for s in sentences]
        tokens = np.fromiter((t for s in sentences for t in s), dtype=np.int32, count=sum(lengths))
        return cls(tokens, _offsets(lengths), _offsets([len(d) for d in documents]))

    def index(self, order=None):
        """Python lists for the instance loop: sentence lengths and token starts, and each
        document's (first, end) sentences and original, with the documents in `order` (default: as
        stored). Without `originals`, a document's original is its place in that order."""
        if order is None and getattr(self, "_index", None) is not None:
            return self._index
        starts = self.sentence_starts.tolist()
        lengths = np.diff(self.sentence_starts).tolist()
        first = self.document_starts[:-1]
        end = self.document_starts[1:]
        originals = range(self.num_documents)
        if order is not None:
            first, end = first[order], end[order]
            if self.originals is not None:
                originals = [self.originals[o] for o in order]
        elif self.originals is not None:
            originals = self.originals
        index = (lengths, starts, first.tolist(), end.tolist(), originals)
        if order is None:
            self._index = index  # create_instances_from_document calls this once per document
        return index


def make_array_tokenizer(vocab_file, do_lower_case):
    """Returns tokenize(list of line bytes) -> (int32 ids of all lines, int64 row splits).

    CachedTokenizer gives exactly FullTokenizer's ids, without TensorFlow, at tens of MB/s once its
    cache of words is warm (which it stays for the life of a worker process).
    """
    return python_tokenizer.CachedTokenizer(vocab_file, do_lower_case).encode_lines


@functools.lru_cache(maxsize=2)
def cached_array_tokenizer(vocab_file, do_lower_case):
    """make_array_tokenizer, built once per process, so that its word cache lives on."""
    return make_array_tokenizer(vocab_file, do_lower_case)


def count_invalid_utf8(lines):
    """Returns how many invalid UTF-8 sequences `lines` hold (each becomes one U+FFFD)."""
    try:
        b"".join(lines).decode("utf-8")  # the usual case, at C speed
        return 0
    except UnicodeDecodeError:
        return sum(python_tokenizer.count_invalid_utf8(line) for line in lines)


def tokenize_block(documents, tokenize, stats=None, originals=None):
    """Tokenizes documents of line bytes into a Block; lines without tokens and empty documents go.

    `tokenize(lines)` returns (flat ids, row splits). As in the original, a line that yields no
    tokens is dropped and a document left without lines is skipped. `originals` (one per
    document) become the kept documents' Block.originals.
    """
    lines = [line for document in documents for line in document]
    flat_ids, line_lengths = [], []
    start = 0
    while start < len(lines):
        end, size = start, 0
        while (
            end < len(lines) and end - start < TOKENIZE_BATCH_LINES and size < TOKENIZE_BATCH_BYTES
        ):
            size += len(lines[end])
            end += 1
        flat, splits = tokenize(lines[start:end])
        flat_ids.append(flat)
        line_lengths.append(np.diff(splits))
        start = end
    tokens = (
        np.concatenate(flat_ids).astype(np.int32, copy=False) if flat_ids else np.zeros(0, np.int32)
    )
    line_lengths = np.concatenate(line_lengths) if line_lengths else np.zeros(0, np.int64)
    line_document = np.repeat(np.arange(len(documents)), [len(d) for d in documents])
    has_tokens = line_lengths > 0
    sentences_per_document = np.bincount(line_document[has_tokens], minlength=len(documents))
    kept = sentences_per_document[sentences_per_document > 0]
    if originals is not None:
        originals = [originals[d] for d in np.flatnonzero(sentences_per_document).tolist()]
    block = Block(tokens, _offsets(line_lengths[has_tokens]), _offsets(kept), originals)
    if stats is not None:
        stats["invalid_utf8"] += count_invalid_utf8(lines)
        stats["text_bytes"] += sum(len(line) for line in lines)
        stats["documents"] += len(kept)
        stats["documents_skipped"] += len(documents) - len(kept)
        stats["sentences"] += int(has_tokens.sum())
        stats["tokens"] += len(tokens)
    return block
