"""Masked-LM + next-sentence pretraining data: documents -> instances -> serialized tf.train.Example.

The instance algorithm is the original BERT `create_pretraining_data.py`, rule for rule, on integer
token ids (see `InstanceBuilder`). What differs is how the corpus is cut so that the work streams,
runs in parallel and stays deterministic:

Work units and blocks (the streaming design)
  The original reads the whole corpus, shuffles its documents, runs `dupe_factor` passes and
  shuffles every instance, so it holds corpus x dupe_factor instances in memory. Here the input is
  cut into *work units*, contiguous byte ranges of about `UNIT_BYTES` (1 MiB) of the concatenated
  input files. A document belongs to the unit that holds its *position*: the offset of the blank
  line before it (or of the start of its file). A unit reads only its own range: a plain file is
  entered with `seek`, a `.gz` file is decompressed from its start (positions are then offsets in
  the compressed file). Each unit's documents are grouped into *blocks* of about `UNIT_BYTES` of
  text (one per unit, except when a single document is huge), and the original algorithm runs on
  each block as if the block were the whole corpus: shuffle its documents, `dupe_factor` passes
  with fresh masks, "random next" segments from the block's other documents, shuffle the block's
  instances. A block holds about 1 MiB of text and its instances, so memory does not grow with the
  corpus. Every unit has its own `random.Random`, seeded from (random_seed, unit index), so a unit's
  records depend on nothing but the input, the flags and the unit index: any number of worker
  processes gives byte-identical files.

What this changes statistically, against the original's whole-corpus sampling
  * a "random next" B comes from another document of the same ~1 MiB block (hundreds to thousands
    of documents of ordinary text), not from the whole corpus; if the corpus is sorted by topic,
    random-next pairs are somewhat closer in topic (slightly harder negatives);
  * instances are shuffled within their block, and an output file is its units in input order, so
    the dupe_factor copies of a document stay within one block's run of records. Readers that
    interleave several files and shuffle (as `run_pretraining` does) mix them further;
  * every other rule (target lengths, segment choice, truncation, masking) is unchanged, and the
    per-instance distributions are the original's.

Bad or odd input
  * A line longer than `MAX_LINE_BYTES` (64 KiB) is read in pieces of at most that size, cut at
    whitespace when there is any (else at a UTF-8 character boundary); each piece is a sentence.
    The original kept such a line as one segment and truncated nearly all of it away.
  * A document longer than `UNIT_BYTES` is cut into documents of about that size at line breaks.
  * Invalid UTF-8 bytes become U+FFFD, which the tokenizer drops, and are counted.
  * Documents with no tokens are skipped; a one-sentence document always gets a random next B, as
    in the original.
"""

import collections
import contextlib
import dataclasses
import gc
import gzip
import hashlib
import os
import random
import struct

from bert_tf import tokenization

# The size of a work unit and of a block (see the module docstring). Part of the output's identity:
# changing it changes which documents share a block.
UNIT_BYTES = 1 << 20
MAX_LINE_BYTES = 64 << 10
# Lines per tokenizer call and bytes per call: big enough to amortize the TF call overhead, small
# enough to bound the memory of one call.
TOKENIZE_BATCH_LINES = 4096
TOKENIZE_BATCH_BYTES = 1 << 20
# How many times the original tries to draw a random document other than the current one.
RANDOM_DOCUMENT_TRIES = 10
REQUIRED_TOKENS = ("[CLS]", "[SEP]", "[MASK]")
# Bumped whenever a change here changes the records written for the same input and flags.
FORMAT_VERSION = 1


# ---------------------------------------------------------------------------------------------
# Vocabulary facts the algorithm needs
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class VocabInfo:
    """The ids of the special tokens, the vocabulary size and which ids are `##` continuations."""

    tokens: tuple
    cls_id: int
    sep_id: int
    mask_id: int
    is_continuation: tuple

    @property
    def size(self):
        """Number of tokens in the vocabulary (random replacements draw from all of them)."""
        return len(self.tokens)

    @classmethod
    def from_file(cls, vocab_file):
        """Loads vocab.txt; a vocabulary without [CLS], [SEP] or [MASK] is a VocabError."""
        vocab = tokenization.load_vocab(vocab_file)
        missing = [t for t in REQUIRED_TOKENS if t not in vocab]
        if missing:
            raise tokenization.VocabError(
                f"{vocab_file}: the vocabulary has no {', '.join(missing)} token; pretraining data "
                f"needs {', '.join(REQUIRED_TOKENS)}"
            )
        tokens = tuple(vocab)
        return cls(
            tokens=tokens,
            cls_id=vocab["[CLS]"],
            sep_id=vocab["[SEP]"],
            mask_id=vocab["[MASK]"],
            is_continuation=tuple(t.startswith("##") for t in tokens),
        )


# ---------------------------------------------------------------------------------------------
# Reading documents
# ---------------------------------------------------------------------------------------------


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


def iter_file_documents(path, start=0, end=None, max_line_bytes=MAX_LINE_BYTES,
                        max_document_bytes=UNIT_BYTES, stats=None):
    """Yields the documents (lists of line bytes) of `path` whose position lies in [start, end).

    A document's position is the offset of the last blank line before it, or 0 for a file's first
    document; for `.gz` files offsets count compressed bytes. Reading every range of a partition
    of [0, size) yields every document exactly once.
    """
    end = float("inf") if end is None else end
    with open(path, "rb") as raw:
        # Reading from the file's start, the first document's position is 0.
        in_document, owner, blank_position = False, None, 0
        tell = raw.tell
        if path.endswith(".gz"):
            # A gzip stream cannot seek: decompress from the start and skip what lies before `start`.
            # A line's position is how far the decompressor has read (it reads ahead in chunks, so
            # it can reach the end of the file: clamp to the last byte, which a range holds).
            stream = gzip.GzipFile(fileobj=raw, mode="rb")
            last_byte = max(os.fstat(raw.fileno()).st_size - 1, 0)
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
        lines, document_bytes = [], 0
        for position, piece, whole_line in _iter_lines(stream, tell, max_line_bytes):
            if whole_line and not piece.strip():
                if lines:
                    yield lines
                lines, document_bytes = [], 0
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
            if document_bytes + len(piece) > max_document_bytes and lines:
                # Bound memory: an enormous document is cut into documents of about a block.
                if stats is not None:
                    stats["documents_cut"] += 1
                yield lines
                lines, document_bytes = [], 0
            lines.append(piece)
            document_bytes += len(piece)
        if lines:
            yield lines


def iter_text_documents(texts, split_sentences, max_document_bytes=UNIT_BYTES):
    """Turns whole-document strings (a tfds text feature) into documents of sentence bytes."""
    for text in texts:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        lines, document_bytes = [], 0
        for paragraph in text.splitlines():
            for sentence in split_sentences(paragraph):
                encoded = sentence.encode("utf-8")
                if not encoded.strip():
                    continue
                if document_bytes + len(encoded) > max_document_bytes and lines:
                    yield lines
                    lines, document_bytes = [], 0
                lines.append(encoded)
                document_bytes += len(encoded)
        if lines:
            yield lines


def iter_blocks(documents, block_bytes=UNIT_BYTES):
    """Groups documents into blocks of about `block_bytes` of text: the mini-corpora of the algorithm."""
    block, size = [], 0
    for document in documents:
        block.append(document)
        size += sum(len(line) for line in document)
        if size >= block_bytes:
            yield block
            block, size = [], 0
    if block:
        yield block


# ---------------------------------------------------------------------------------------------
# Tokenization
# ---------------------------------------------------------------------------------------------


def make_id_tokenizer(vocab_file, do_lower_case):
    """Returns tokenize(list of line bytes) -> list of lists of int ids, with the in-graph tokenizer.

    GraphTokenizer gives exactly FullTokenizer's ids, several times faster, on whole batches.
    """
    import tensorflow as tf

    graph_tokenizer = tokenization.GraphTokenizer(vocab_file, do_lower_case)

    def tokenize(lines):
        ragged = graph_tokenizer.tokenize(tf.constant(lines, dtype=tf.string))
        flat = ragged.flat_values.numpy().tolist()
        splits = ragged.row_splits.numpy().tolist()
        return [flat[a:b] for a, b in zip(splits, splits[1:])]

    return tokenize


def count_invalid_utf8(lines):
    """Returns how many invalid UTF-8 sequences `lines` hold (each becomes one U+FFFD)."""
    invalid = 0
    for line in lines:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            invalid += tokenization.count_invalid_utf8(line)
    return invalid


def tokenize_documents(documents, tokenize, stats=None):
    """Tokenizes documents of line bytes into documents of id lists; empty lines and documents go.

    As in the original, a line that yields no tokens is dropped and a document left without lines
    is skipped.
    """
    flat_lines = [line for document in documents for line in document]
    ids = []
    batch, batch_bytes = [], 0
    for line in flat_lines:
        batch.append(line)
        batch_bytes += len(line)
        if len(batch) >= TOKENIZE_BATCH_LINES or batch_bytes >= TOKENIZE_BATCH_BYTES:
            ids.extend(tokenize(batch))
            batch, batch_bytes = [], 0
    if batch:
        ids.extend(tokenize(batch))
    if stats is not None:
        stats["invalid_utf8"] += count_invalid_utf8(flat_lines)
        stats["text_bytes"] += sum(len(line) for line in flat_lines)
    result = []
    cursor = 0
    for document in documents:
        sentences = [s for s in ids[cursor:cursor + len(document)] if s]
        cursor += len(document)
        if sentences:
            result.append(sentences)
            if stats is not None:
                stats["documents"] += 1
                stats["sentences"] += len(sentences)
                stats["tokens"] += sum(len(s) for s in sentences)
        elif stats is not None:
            stats["documents_skipped"] += 1
    return result


# ---------------------------------------------------------------------------------------------
# Instances: the original algorithm on ids
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TrainingInstance:
    """One `[CLS] A [SEP] B [SEP]` example, masked, with where it came from (for logs and tests)."""

    input_ids: list  # after masking, unpadded
    segment_ids: list
    masked_lm_positions: list  # sorted
    masked_lm_ids: list  # the original ids at those positions
    is_random_next: bool
    document_index: int  # index in the block's (shuffled) documents
    random_document_index: int  # where B came from when is_random_next, else -1
    target_seq_length: int
    num_truncated: int  # tokens trimmed by truncate_seq_pair


def truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
    """Trims the longer list one token at a time, from the front or back at random; returns the count.

    The original's rule. Works on (start, end) bounds rather than `del list[0]`, which is quadratic
    for long segments; the coin flips are the same.
    """
    a_start, a_end, b_start, b_end = 0, len(tokens_a), 0, len(tokens_b)
    trimmed = 0
    while (a_end - a_start) + (b_end - b_start) > max_num_tokens:
        trimmed += 1
        if a_end - a_start > b_end - b_start:
            if rng.random() < 0.5:
                a_start += 1
            else:
                a_end -= 1
        else:
            if rng.random() < 0.5:
                b_start += 1
            else:
                b_end -= 1
    if trimmed:
        tokens_a[:] = tokens_a[a_start:a_end]
        tokens_b[:] = tokens_b[b_start:b_end]
    return trimmed


class InstanceBuilder:
    """The original create_instances_from_document / create_masked_lm_predictions, on token ids."""

    def __init__(self, vocab, max_seq_length=128, max_predictions_per_seq=20, masked_lm_prob=0.15,
                 short_seq_prob=0.1, do_whole_word_mask=False):
        if max_seq_length < 5:
            raise ValueError(f"max_seq_length must be at least 5, got {max_seq_length}")
        if max_predictions_per_seq > max_seq_length:
            raise ValueError(
                f"max_predictions_per_seq ({max_predictions_per_seq}) cannot exceed "
                f"max_seq_length ({max_seq_length})"
            )
        self.vocab = vocab
        self.max_seq_length = max_seq_length
        self.max_predictions_per_seq = max_predictions_per_seq
        self.masked_lm_prob = masked_lm_prob
        self.short_seq_prob = short_seq_prob
        self.do_whole_word_mask = do_whole_word_mask
        # How the masked positions were filled, for summary.json: [MASK], kept, random token.
        self.replacement_counts = collections.Counter()

    def create_instances_from_document(self, all_documents, document_index, rng):
        """All instances of one pass over `all_documents[document_index]` (a list of id lists)."""
        document = all_documents[document_index]
        max_num_tokens = self.max_seq_length - 3
        # As in the original, the target is drawn once per document pass: usually the full length,
        # sometimes shorter, to reduce the mismatch with fine-tuning's short sequences.
        target_seq_length = max_num_tokens
        if rng.random() < self.short_seq_prob:
            target_seq_length = rng.randint(2, max_num_tokens)

        instances = []
        current_chunk = []
        current_length = 0
        i = 0
        while i < len(document):
            segment = document[i]
            current_chunk.append(segment)
            current_length += len(segment)
            if i == len(document) - 1 or current_length >= target_seq_length:
                if current_chunk:
                    # How many chunk segments go to A.
                    a_end = 1
                    if len(current_chunk) >= 2:
                        a_end = rng.randint(1, len(current_chunk) - 1)
                    tokens_a = [t for j in range(a_end) for t in current_chunk[j]]

                    tokens_b = []
                    random_document_index = -1
                    if len(current_chunk) == 1 or rng.random() < 0.5:
                        is_random_next = True
                        target_b_length = target_seq_length - len(tokens_a)
                        # The original tries 10 times for another document; a corpus (here a
                        # block) of one document falls back to itself.
                        for _ in range(RANDOM_DOCUMENT_TRIES):
                            random_document_index = rng.randint(0, len(all_documents) - 1)
                            if random_document_index != document_index:
                                break
                        random_document = all_documents[random_document_index]
                        random_start = rng.randint(0, len(random_document) - 1)
                        for j in range(random_start, len(random_document)):
                            tokens_b.extend(random_document[j])
                            if len(tokens_b) >= target_b_length:
                                break
                        # The chunk's segments after A were not used: put them back.
                        num_unused_segments = len(current_chunk) - a_end
                        i -= num_unused_segments
                    else:
                        is_random_next = False
                        for j in range(a_end, len(current_chunk)):
                            tokens_b.extend(current_chunk[j])
                    num_truncated = truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                    assert tokens_a and tokens_b

                    input_ids = [self.vocab.cls_id, *tokens_a, self.vocab.sep_id, *tokens_b,
                                 self.vocab.sep_id]
                    segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
                    input_ids, positions, labels = self.create_masked_lm_predictions(input_ids, rng)
                    instances.append(TrainingInstance(
                        input_ids=input_ids,
                        segment_ids=segment_ids,
                        masked_lm_positions=positions,
                        masked_lm_ids=labels,
                        is_random_next=is_random_next,
                        document_index=document_index,
                        random_document_index=random_document_index,
                        target_seq_length=target_seq_length,
                        num_truncated=num_truncated,
                    ))
                current_chunk = []
                current_length = 0
            i += 1
        return instances

    def create_masked_lm_predictions(self, input_ids, rng):
        """Masks `input_ids` (a fresh list); returns (masked ids, sorted positions, original ids)."""
        num_to_predict = min(self.max_predictions_per_seq,
                             max(1, int(round(len(input_ids) * self.masked_lm_prob))))
        output_ids = list(input_ids)
        random_ = rng.random
        mask_id = self.vocab.mask_id
        last_id = self.vocab.size - 1
        masked = []
        # The original shuffles every candidate, then walks them in order until it has enough.
        # Shuffling lazily (Fisher-Yates, one swap per candidate visited) gives the same
        # distribution for the visited prefix, with a fraction of the random draws.
        if self.do_whole_word_mask:
            candidates = self._word_candidates(input_ids)
            n = len(candidates)
            for k in range(n):
                if len(masked) >= num_to_predict:
                    break
                swap = k + int(random_() * (n - k))
                group = candidates[swap]
                candidates[swap] = candidates[k]
                if len(masked) + len(group) > num_to_predict:
                    continue  # the original skips a word that would overshoot, and goes on
                masked.extend(group)
        else:
            candidates = self._token_candidates(input_ids)
            n = len(candidates)
            for k in range(min(num_to_predict, n)):
                swap = k + int(random_() * (n - k))
                masked.append(candidates[swap])
                candidates[swap] = candidates[k]
        kept = replaced = 0
        for index in masked:
            # 80% [MASK], 10% the original token, 10% a random token of the vocabulary.
            if random_() < 0.8:
                output_ids[index] = mask_id
            elif random_() < 0.5:
                kept += 1
            else:
                output_ids[index] = rng.randint(0, last_id)
                replaced += 1
        counts = self.replacement_counts
        counts["masked_as_mask"] += len(masked) - kept - replaced
        counts["masked_kept"] += kept
        counts["masked_random"] += replaced
        masked.sort()
        return output_ids, masked, [input_ids[index] for index in masked]

    def _token_candidates(self, input_ids):
        """Positions that may be masked: every token but [CLS] and [SEP]."""
        cls_id, sep_id = self.vocab.cls_id, self.vocab.sep_id
        n = len(input_ids)
        if (input_ids[0] == cls_id and input_ids[-1] == sep_id and input_ids.count(cls_id) == 1
                and input_ids.count(sep_id) == 2):
            # The usual layout, [CLS] A [SEP] B [SEP]: the same positions, found at C speed.
            middle = input_ids.index(sep_id)
            return [*range(1, middle), *range(middle + 1, n - 1)]
        return [index for index, token in enumerate(input_ids) if token != cls_id and token != sep_id]

    def _word_candidates(self, input_ids):
        """Whole-word groups of positions: the `##` pieces of a word join the word's group.

        As in the original, a `##` piece right after [SEP] joins the group before it.
        """
        cls_id, sep_id = self.vocab.cls_id, self.vocab.sep_id
        is_continuation = self.vocab.is_continuation
        candidates = []
        for index, token in enumerate(input_ids):
            if token == cls_id or token == sep_id:
                continue
            if candidates and is_continuation[token]:
                candidates[-1].append(index)
            else:
                candidates.append([index])
        return candidates


def create_training_instances(documents, builder, dupe_factor, rng):
    """The original create_training_instances on one block: shuffle, dupe_factor passes, shuffle."""
    documents = list(documents)
    rng.shuffle(documents)
    instances = []
    for _ in range(dupe_factor):
        for document_index in range(len(documents)):
            instances.extend(builder.create_instances_from_document(documents, document_index, rng))
    rng.shuffle(instances)
    return instances


def add_instance_stats(stats, instances, builder):
    """Adds counts about `instances` to `stats` (a Counter) for summary.json."""
    max_num_tokens = builder.max_seq_length - 3
    stats["instances"] += len(instances)
    stats["instance_tokens"] += sum(len(i.input_ids) for i in instances)
    stats["masked_positions"] += sum(len(i.masked_lm_positions) for i in instances)
    random_next = sum(i.is_random_next for i in instances)
    stats["random_next"] += random_next
    stats["actual_next"] += len(instances) - random_next
    truncated = [i.num_truncated for i in instances if i.num_truncated]
    stats["truncated_instances"] += len(truncated)
    stats["truncated_tokens"] += sum(truncated)
    stats["short_target_instances"] += sum(i.target_seq_length < max_num_tokens for i in instances)


# ---------------------------------------------------------------------------------------------
# Serialization: tf.train.Example in the original's schema, encoded directly
# ---------------------------------------------------------------------------------------------

FEATURE_NAMES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                 "masked_lm_weights", "next_sentence_labels")


def feature_spec(max_seq_length, max_predictions_per_seq):
    """The original run_pretraining.py parsing spec for these records."""
    import tensorflow as tf

    return {
        "input_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "input_mask": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([max_predictions_per_seq], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }


def _varint(value):
    """Protocol-buffer base-128 varint of a non-negative int."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class ExampleSerializer:
    """Serializes instances into tf.train.Example bytes, padded to the fixed lengths.

    The wire format is written directly: Example.features(1) -> Features.feature(1) map entries of
    key(1) and Feature(2); Feature.float_list(2) / int64_list(3); the lists pack their values(1).
    Building a tf.train.Example in Python costs several times more per record; the records parse
    identically (tests compare them with tf.train.Example and tf.io.parse_example).
    """

    def __init__(self, vocab_size, max_seq_length, max_predictions_per_seq):
        self.max_seq_length = max_seq_length
        self.max_predictions_per_seq = max_predictions_per_seq
        # Varints of every id and every length a record can hold, looked up rather than computed.
        self._varints = [_varint(i) for i in range(max(vocab_size, 8 * max_seq_length + 64) + 1)]
        self._keys = {name: b"\x0a" + _varint(len(name)) + name.encode() for name in FEATURE_NAMES}
        self._cache = {}

    def _entry(self, name, list_field, packed):
        """One Features.feature map entry: key, then Feature{int64_list(3)|float_list(2){packed}}."""
        varints = self._varints
        key = self._keys[name]
        list_length = 1 + len(varints[len(packed)]) + len(packed)
        feature_length = 1 + len(varints[list_length]) + list_length
        entry_length = len(key) + 1 + len(varints[feature_length]) + feature_length
        return b"".join((
            b"\x0a", varints[entry_length], key,
            b"\x12", varints[feature_length],
            list_field, varints[list_length],
            b"\x0a", varints[len(packed)], packed,
        ))

    def _cached(self, key, build):
        """Entries that depend only on a few small ints (lengths, counts) are built once."""
        value = self._cache.get(key)
        if value is None:
            value = self._cache[key] = build()
        return value

    def serialize(self, instance):
        """The tf.train.Example bytes of one TrainingInstance."""
        seq = self.max_seq_length
        preds = self.max_predictions_per_seq
        varints = self._varints
        length = len(instance.input_ids)
        num_masked = len(instance.masked_lm_positions)
        if length > seq or num_masked > preds:
            raise ValueError(f"instance of {length} tokens / {num_masked} predictions does not fit")
        a_length = instance.segment_ids.count(0)
        pad = b"\x00" * (seq - length)
        pad_preds = b"\x00" * (preds - num_masked)
        int64 = b"\x1a"
        features = b"".join((
            self._entry("input_ids", int64, b"".join(map(varints.__getitem__, instance.input_ids)) + pad),
            self._cached(("input_mask", length), lambda: self._entry(
                "input_mask", int64, b"\x01" * length + pad)),
            self._cached(("segment_ids", a_length, length), lambda: self._entry(
                "segment_ids", int64, b"\x00" * a_length + b"\x01" * (length - a_length) + pad)),
            self._entry("masked_lm_positions", int64,
                        b"".join(map(varints.__getitem__, instance.masked_lm_positions)) + pad_preds),
            self._entry("masked_lm_ids", int64,
                        b"".join(map(varints.__getitem__, instance.masked_lm_ids)) + pad_preds),
            self._cached(("masked_lm_weights", num_masked), lambda: self._entry(
                "masked_lm_weights", b"\x12",
                struct.pack(f"<{preds}f", *([1.0] * num_masked + [0.0] * (preds - num_masked))))),
            self._cached(("next_sentence_labels", instance.is_random_next), lambda: self._entry(
                "next_sentence_labels", int64, b"\x01" if instance.is_random_next else b"\x00")),
        ))
        return b"\x0a" + _varint(len(features)) + features


def example_to_text(example, tokens):
    """Readable lines for a log, as the original prints its first instances.

    `example` maps feature names to value lists (a parsed record); `tokens` is the vocabulary.
    """
    length = sum(example["input_mask"])
    num_masked = int(sum(example["masked_lm_weights"]))
    input_ids = [int(i) for i in example["input_ids"][:length]]
    positions = [int(p) for p in example["masked_lm_positions"][:num_masked]]
    labels = [int(i) for i in example["masked_lm_ids"][:num_masked]]
    return [
        "tokens: " + " ".join(tokens[i] for i in input_ids),
        "segment_ids: " + " ".join(str(int(s)) for s in example["segment_ids"][:length]),
        f"is_random_next: {bool(example['next_sentence_labels'][0])}",
        "masked_lm_positions: " + " ".join(map(str, positions)),
        "masked_lm_labels: " + " ".join(tokens[i] for i in labels),
    ]


# ---------------------------------------------------------------------------------------------
# One work unit: a byte range of the input -> one part file of records
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """Everything that decides the records, besides the input: picklable, for worker processes."""

    vocab_file: str
    do_lower_case: bool = True
    do_whole_word_mask: bool = False
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    random_seed: int = 12345
    dupe_factor: int = 10
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    compression: str = "none"  # or "gzip": each part is a gzip member, so parts concatenate


@dataclasses.dataclass(frozen=True)
class WorkUnit:
    """A contiguous piece of the input: (path, start, end) file ranges, or a tfds split slice."""

    index: int
    ranges: tuple = ()  # ((path, start, end), ...)
    tfds: tuple = None  # (name, split_slice, feature, data_dir)
    output_path: str = ""  # the part file this unit writes


def unit_seed(random_seed, unit_index):
    """The seed of one unit's random.Random: independent of how units are spread over workers."""
    digest = hashlib.sha256(f"{random_seed}/{unit_index}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


class UnitProcessor:
    """Holds the tokenizer, builder and serializer of one process and turns units into part files."""

    def __init__(self, config, tokenize=None):
        self.config = config
        self.vocab = VocabInfo.from_file(config.vocab_file)
        self.tokenize = tokenize or make_id_tokenizer(config.vocab_file, config.do_lower_case)
        self.builder = InstanceBuilder(
            self.vocab,
            max_seq_length=config.max_seq_length,
            max_predictions_per_seq=config.max_predictions_per_seq,
            masked_lm_prob=config.masked_lm_prob,
            short_seq_prob=config.short_seq_prob,
            do_whole_word_mask=config.do_whole_word_mask,
        )
        self.serializer = ExampleSerializer(
            self.vocab.size, config.max_seq_length, config.max_predictions_per_seq)

    def unit_documents(self, unit, stats):
        """The raw documents of a unit, in input order."""
        if unit.tfds is not None:
            return iter_tfds_documents(*unit.tfds)
        return (document for path, start, end in unit.ranges
                for document in iter_file_documents(path, start, end, stats=stats))

    def iter_unit_records(self, unit, stats):
        """Yields the serialized records of a unit, block by block."""
        rng = random.Random(unit_seed(self.config.random_seed, unit.index))
        for block in iter_blocks(self.unit_documents(unit, stats)):
            documents = tokenize_documents(block, self.tokenize, stats)
            if not documents:
                continue
            stats["blocks"] += 1
            stats["document_passes"] += len(documents) * self.config.dupe_factor
            with paused_gc():
                instances = create_training_instances(
                    documents, self.builder, self.config.dupe_factor, rng)
                add_instance_stats(stats, instances, self.builder)
                stats.update(self.builder.replacement_counts)
                self.builder.replacement_counts.clear()
                records = [self.serializer.serialize(instance) for instance in instances]
            del instances
            yield from records

    def write_unit(self, unit):
        """Writes a unit's records to `unit.output_path` atomically; returns its stats (a dict)."""
        import tensorflow as tf

        from bert_tf import io_utils

        stats = collections.Counter()
        with io_utils.atomic_path(unit.output_path) as tmp:
            options = "GZIP" if self.config.compression == "gzip" else None
            with tf.io.TFRecordWriter(tmp, options=options) as writer:
                for record in self.iter_unit_records(unit, stats):
                    writer.write(record)
        stats["part_bytes"] = os.path.getsize(unit.output_path)
        return dict(stats)


def iter_tfds_documents(name, split, feature, data_dir=None):
    """Documents of a tensorflow-datasets split: each example's `feature` text, cut into sentences."""
    import tensorflow_datasets as tfds

    from bert_tf.corpus import split_sentences

    dataset = tfds.load(name, split=split, data_dir=data_dir, shuffle_files=False)
    texts = (example[feature] for example in tfds.as_numpy(dataset))
    return iter_text_documents(texts, split_sentences)


@contextlib.contextmanager
def paused_gc():
    """Pauses the cyclic garbage collector: a block allocates ~10^5 lists and no cycles.

    Otherwise its collections rescan the growing block again and again, which more than doubles the
    time spent building instances.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# Worker-process state: one UnitProcessor per process, built on first use.
_PROCESSOR = None


def process_unit(config, unit):
    """Worker entry point: builds this process's UnitProcessor once, then writes `unit`."""
    global _PROCESSOR
    if _PROCESSOR is None or _PROCESSOR.config != config:
        import tensorflow as tf

        # Parallelism comes from processes; one thread each keeps them from fighting for cores.
        try:
            tf.config.threading.set_intra_op_parallelism_threads(1)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:
            pass  # already initialized (the in-process worker shares the main process's runtime)
        _PROCESSOR = UnitProcessor(config)
    return _PROCESSOR.write_unit(unit)
