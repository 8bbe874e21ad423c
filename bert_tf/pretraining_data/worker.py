"""What a worker process does with a work unit: two phases, NumPy only, no TensorFlow.

Phase 1, `tokenize_unit`: read the unit's byte range (or take the documents of its tfds slice),
group the documents into blocks and tokenize each with CachedTokenizer (FullTokenizer's ids, in
plain Python with a cache of words) into the unit's token files (tokenized_corpus.py's
UnitTokensWriter).

Phase 2, `build_unit_part`, once every unit is tokenized: read the unit's blocks back, build each
block's instances and records with NumPy (`BlockRecordBuilder`), drawing random-next segments from
every unit's token files (tokenized_corpus.py's FileCorpus), and write them with their TFRecord
framing into the unit's part file (tfrecord.PartWriter: a temp file, then a rename).

Every block has its own random generators, seeded from (random_seed, unit index, block index)
(`block_seed`), so a block's records depend on nothing but the input and the settings: any number
of worker processes gives byte-identical files. Importing TensorFlow would cost each process ~3 s of
start-up and ~0.8 GB of RSS, more than tokenizing and writing 10 MB takes; tests check that nothing
here imports it. A process keeps its tokenizer (and its word cache), its record builder and its
open corpus files from one unit to the next.
"""

import collections
import ctypes
import functools
import hashlib
import json
import os
import random
import signal
import threading
import time

import numpy as np

from bert_tf.pretraining_data import documents, tokenized_corpus
from bert_tf.pretraining_data.example_codec import ExampleSerializer
from bert_tf.pretraining_data.instances import (
    InstanceBuilder,
    VocabInfo,
    add_batch_stats,
    iter_block_batches,
)
from bert_tf.pretraining_data.tfrecord import PartWriter
from bert_tf.runtime import io_utils
from bert_tf.tokenization import tokenizer_rules


def block_seed(random_seed, unit_index, block_index):
    """The seed of one block's generators: independent of how blocks are spread over workers."""
    digest = hashlib.sha256(f"{random_seed}/{unit_index}/{block_index}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def iter_unit_blocks(unit, tokenize, stats, pieces=None):
    """Yields the tokenized Blocks of a unit, in order, with their `originals`.

    `tokenize` is a make_array_tokenizer function; `stats` (a Counter) gets the reading counts.
    `pieces` are the unit's (original, document) pairs when the caller read them (the job reads
    tfds units in its main process); else the unit's file ranges, or
    its tfds slice, are read here.
    """
    if pieces is None and unit.tfds is not None:
        pieces = documents.iter_tfds_pieces(*unit.tfds)
    elif pieces is None:
        pieces = (
            piece
            for path, start, end in unit.ranges
            for piece in documents.iter_file_pieces(path, start, end, stats=stats)
        )
    for raw_block in documents.iter_blocks(pieces):
        block = documents.tokenize_block(
            [document for _, document in raw_block],
            tokenize,
            stats,
            [original for original, _ in raw_block],
        )
        if block.num_documents:
            yield block


class BlockRecordBuilder:
    """Turns Blocks into serialized records with NumPy only."""

    def __init__(self, config, vocab):
        self.config = config
        self.builder = InstanceBuilder(
            vocab,
            max_seq_length=config.max_seq_length,
            max_predictions_per_seq=config.max_predictions_per_seq,
            masked_lm_prob=config.masked_lm_prob,
            short_seq_prob=config.short_seq_prob,
            masking=config.masking,
            mask_token_prob=config.mask_token_prob,
            random_token_prob=config.random_token_prob,
            random_next_prob=config.random_next_prob,
        )
        self.serializer = ExampleSerializer(
            vocab.size, config.max_seq_length, config.max_predictions_per_seq
        )

    def build(self, unit_index, block_index, block, corpus):
        """Returns (the block's records concatenated, int64 record lengths, stats dict); random-next
        segments come from `corpus`."""
        rng = random.Random(block_seed(self.config.random_seed, unit_index, block_index))
        stats = collections.Counter(
            blocks=1, document_passes=block.num_documents * self.config.dupe_factor
        )
        blobs, lengths = [], []
        self.builder.replacement_counts.clear()
        for batch in iter_block_batches(
            block, self.builder, self.config.dupe_factor, rng, corpus=corpus, stats=stats
        ):
            add_batch_stats(stats, batch, self.builder)
            blob, record_lengths = self.serializer.serialize_batch(batch)
            blobs.append(blob)
            lengths.append(record_lengths)
        stats.update(self.builder.replacement_counts)
        self.builder.replacement_counts.clear()
        return (
            b"".join(blobs),
            (np.concatenate(lengths) if lengths else np.zeros(0, np.int64)),
            dict(stats),
        )


def tokenize_unit(config, unit, pieces=None):
    """Phase 1 of a unit: reads and tokenizes its documents into its token files (atomically).

    Returns the reading stats, with the unit's number of original documents as `originals`.
    The tokenizer is built once per process and kept, so its word cache stays warm.
    """
    tokenize = documents.cached_array_tokenizer(config.vocab_file, config.do_lower_case)
    stats = collections.Counter()
    with tokenized_corpus.UnitTokensWriter(unit.tokens_prefix) as writer:
        for block in iter_unit_blocks(unit, tokenize, stats, pieces):
            writer.add_block(block, block.originals)
    stats["originals"] = writer.num_originals
    release_freed_memory()
    return dict(stats)


def build_unit_part(config, unit, corpus_index):
    """Phase 2 of a unit: builds the records of its blocks and writes its part file (atomically).

    Random-next segments come from every unit's token files, listed in the JSON file
    `corpus_index` ({"units": [[tokens prefix, originals], ...]}). Returns the build stats, with
    the part's size as `part_bytes`.
    """
    return build_part(config, unit, _file_corpus(corpus_index))


def build_part(config, unit, corpus):
    """build_unit_part with the FileCorpus of every unit's token files given (the Beam path's)."""
    builder = _block_record_builder(config)
    unit_tokens = corpus.unit(unit.index)
    first_original = corpus.first_original[unit.index]
    stats = collections.Counter()
    with PartWriter(unit.output_path, config.compression) as writer:
        for block_index in range(unit_tokens.num_blocks):
            tokens, sentence_starts, piece_starts, piece_originals = unit_tokens.read_block(
                block_index
            )
            originals = (piece_originals + first_original).tolist()  # numbered corpus-wide
            block = documents.Block(tokens, sentence_starts, piece_starts, originals)
            blob, lengths, block_stats = builder.build(unit.index, block_index, block, corpus)
            writer.write(blob, lengths)
            stats.update(block_stats)
    stats["part_bytes"] = os.path.getsize(unit.output_path)
    release_freed_memory()
    return dict(stats)


def release_freed_memory():
    """Hands the memory this process has freed back to the system, where the C library can (glibc's
    malloc_trim; elsewhere nothing happens).

    A unit's buffers are freed when it is done, but glibc keeps freed memory in the arena of the
    thread that used it, and a Dask worker runs its tasks on a thread of its own: without this, a
    worker's memory grew with every unit it built (benchmarks/RESULTS.md, "Pretraining data").
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def write_corpus_index(path, units):
    """Writes the corpus index that build_unit_part reads: [(tokens prefix, originals), ...]."""
    io_utils.atomic_write_json(path, {"units": [list(unit) for unit in units]})


# ---------------------------------------------------------------------------------------------
# The worker process: its state, kept from unit to unit, and its life
# ---------------------------------------------------------------------------------------------

# Per-process state: the BlockRecordBuilder and the FileCorpus of this process, built on first use.
_BLOCK_RECORD_BUILDER = None
_FILE_CORPUS = (None, None)

# Linux's prctl option that delivers a signal to this process when its parent dies.
_PR_SET_PDEATHSIG = 1
# How often a worker's watchdog checks that the main process is still there.
PARENT_WATCH_SECONDS = 0.5


def exit_with_parent(parent_pid):
    """Worker initializer: end this process as soon as the main process `parent_pid` dies.

    Workers of a killed run must not go on writing parts that nobody assembles (and that a rerun
    would race with). On Linux the kernel kills them at once (a parent-death signal); a watchdog
    thread covers other systems, and a parent that died before the signal was set.
    """
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the watchdog alone

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(PARENT_WATCH_SECONDS)
        os._exit(1)

    if os.getppid() != parent_pid:
        os._exit(1)
    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def warm_up_worker(config):
    """A job that starts a worker process and builds its tokenizer and builder before units arrive."""
    try:
        _block_record_builder(config)
        documents.cached_array_tokenizer(config.vocab_file, config.do_lower_case)
    except (OSError, tokenizer_rules.VocabError):
        pass  # a missing or bad vocabulary: the main process reports it
    return os.getpid()


def _file_corpus(corpus_index):
    """This process's FileCorpus for the index file `corpus_index`, read on first use."""
    global _FILE_CORPUS
    key = (corpus_index, os.stat(corpus_index).st_mtime_ns)
    if _FILE_CORPUS[0] != key:
        if _FILE_CORPUS[1] is not None:
            _FILE_CORPUS[1].close()
        with open(corpus_index) as f:
            units = json.load(f)["units"]
        _FILE_CORPUS = (key, tokenized_corpus.FileCorpus(units))
    return _FILE_CORPUS[1]


def _block_record_builder(config):
    """This process's BlockRecordBuilder for `config`, built on first use."""
    global _BLOCK_RECORD_BUILDER
    if _BLOCK_RECORD_BUILDER is None or _BLOCK_RECORD_BUILDER.config != config:
        _BLOCK_RECORD_BUILDER = BlockRecordBuilder(config, VocabInfo.from_file(config.vocab_file))
    return _BLOCK_RECORD_BUILDER
