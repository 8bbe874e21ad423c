"""Tests for vocabulary learning (bert_tf.tokenization.vocab_learner) and its CLI (bert_tf.build_vocab)."""

import collections
import gzip
import os
import re

import pytest
from helpers import run_module_cli

from bert_tf.pretraining_data import corpus
from bert_tf.tokenization import vocab_learner
from bert_tf.tokenization.python_tokenizer import BasicTokenizer, FullTokenizer
from bert_tf.tokenization.tokenizer_rules import SPECIAL_TOKENS, load_vocab

VOCAB_SIZE = 400
# A word of 60 characters: the learner ignores words over 50, yet its letter 'ж' must not be [UNK].
LONG_WORD = "ж" + "abcdefghij" * 5 + "klmnopqrs"
EXTRA_LINES = [
    "Café, naïve façade: Ünïcödé accents are stripped when lower-casing.",
    "中文字符 are split one ideograph at a time.",
    f"A long word {LONG_WORD} appears once.",
]


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    """About 60 kB of real prose (standard library docstrings) plus a few non-ASCII lines."""
    path = str(tmp_path_factory.mktemp("corpus") / "corpus.txt")
    corpus.write_default_corpus(path, max_bytes=60_000, roots=corpus.corpus_source_dirs(()))
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n".join(EXTRA_LINES) + "\n\n")
    return path


@pytest.fixture(scope="module")
def learned(corpus_file):
    """The counted words and the vocabulary learned from them."""
    counts, stats = vocab_learner.count_words(
        [corpus_file], do_lower_case=True, show_progress=False
    )
    tokens, info = vocab_learner.learn_vocab(counts, VOCAB_SIZE)
    return counts, stats, tokens, info


def test_special_tokens_come_first_and_size_is_bounded(learned):
    _, _, tokens, _ = learned
    assert tuple(tokens[: len(SPECIAL_TOKENS)]) == SPECIAL_TOKENS
    assert tokens[0] == "[PAD]"
    assert len(tokens) <= VOCAB_SIZE
    assert len(tokens) >= 0.8 * VOCAB_SIZE  # the learner lands close below the target
    assert len(set(tokens)) == len(tokens)
    assert all(t and not any(c.isspace() for c in t) for t in tokens)


def test_pieces_are_learned_not_just_characters(learned):
    _, _, tokens, _ = learned
    multi_char = [t for t in tokens if len(t.replace("##", "")) > 1]
    assert len(multi_char) > VOCAB_SIZE // 4
    assert "the" in tokens and any(t.startswith("##") and len(t) > 3 for t in tokens)


def test_every_character_of_the_counted_words_is_in_the_vocab(learned):
    counts, _, tokens, info = learned
    vocab = set(tokens)
    chars = {c for word in counts for c in word}
    assert "ж" in chars and "中" in chars
    assert not [c for c in chars if c not in vocab or "##" + c not in vocab]
    # 'ж' occurs only in the 60-character word, which the learner skips; it was added afterwards.
    assert info["chars_added"] >= 2
    assert info["chars_left_out"] == 0


def test_vocab_tokenizes_the_corpus_without_unknowns(corpus_file, learned, tmp_path):
    _, _, tokens, _ = learned
    vocab_file = str(tmp_path / "vocab.txt")
    vocab_learner.write_vocab(tokens, vocab_file)
    vocab = load_vocab(vocab_file)
    assert list(vocab) == tokens and vocab["[PAD]"] == 0
    tokenizer = FullTokenizer(vocab_file, do_lower_case=True)
    basic = BasicTokenizer(do_lower_case=True)
    num_pieces = 0
    with open(corpus_file, encoding="utf-8") as f:
        for line in f:
            pieces = tokenizer.tokenize(line)
            num_pieces += len(pieces)
            assert "[UNK]" not in pieces, line
            # The pieces spell the words back exactly.
            assert "".join(p.removeprefix("##") for p in pieces) == "".join(basic.tokenize(line))
    assert num_pieces > 5000


def ascii_reference_words(text, do_lower_case):
    """An independent word splitter for ASCII text: runs of letters/digits, and each other symbol."""
    if do_lower_case:
        text = text.lower()
    return re.findall(r"[A-Za-z0-9]+|[^A-Za-z0-9\s]", text)


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_word_counts_match_an_independent_splitter_on_ascii(tmp_path, do_lower_case):
    lines = [
        "The Quick brown fox's tail_end, (x+y)=z; $5 @home.",
        "",
        "  Tabs\tand  spaces!  ",
        "A#B~C^D`E|F",
    ]
    path = tmp_path / "ascii.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    counts, stats = vocab_learner.count_words([str(path)], do_lower_case, show_progress=False)
    expected = collections.Counter(
        w for line in lines for w in ascii_reference_words(line, do_lower_case)
    )
    assert counts == expected
    assert stats.lines == len(lines) and stats.bytes == path.stat().st_size
    assert ("Quick" in counts) is not do_lower_case


def test_invalid_utf8_is_replaced_and_counted_and_gz_is_read(tmp_path):
    raw = b"caf\xe9 ok \xff\xfe end\nvalid \xef\xbf\xbd stays uncounted\n"
    plain = tmp_path / "bad.txt"
    plain.write_bytes(raw)
    with gzip.open(tmp_path / "bad.txt.gz", "wb") as f:
        f.write(raw)
    for path in (plain, tmp_path / "bad.txt.gz"):
        counts, stats = vocab_learner.count_words([str(path)], True, show_progress=False)
        assert stats.invalid_utf8 == 3
        expected = collections.Counter(
            BasicTokenizer(True).tokenize(raw.decode("utf-8", "replace").replace("\n", " "))
        )
        assert counts == expected
        assert counts["caf"] == 1 and counts["end"] == 1 and "\ufffd" not in "".join(counts)


def test_counting_and_learning_are_deterministic(corpus_file, learned, tmp_path):
    counts, _, tokens, _ = learned
    parallel_counts, _ = vocab_learner.count_words(
        [corpus_file], True, num_workers=2, show_progress=False
    )
    assert parallel_counts == counts
    # A different insertion order of the same counts gives the same vocabulary.
    shuffled = collections.Counter(dict(sorted(counts.items(), key=lambda wc: wc[0][::-1])))
    assert vocab_learner.learn_vocab(shuffled, VOCAB_SIZE)[0] == tokens


def test_rare_characters_beyond_the_alphabet_limit_are_reported():
    counts = collections.Counter({"abc": 50, "abd": 40, "xyz": 30, "q": 1})
    tokens, info = vocab_learner.learn_vocab(counts, 60, max_unique_chars=6)
    assert info["chars_left_out"] == 2  # 'q' and one of x/y/z, the rarest characters
    assert "q" not in tokens and all(c in tokens for c in "abcd")


def test_alphabet_limit_holds_when_long_words_rank_characters_differently():
    # 'd' is frequent only in a word too long for the learner, so the learner alone would rank
    # a, b, c as the top 3; the vocabulary must still keep d, leave out c, and not exceed the size.
    counts = collections.Counter({"ab": 10, "abab": 8, "c": 5, "cc": 5, "d" * 60: 1})
    for vocab_size in (11, 12, 14):
        tokens, info = vocab_learner.learn_vocab(counts, vocab_size, max_unique_chars=3)
        assert len(tokens) <= vocab_size and len(set(tokens)) == len(tokens)
        assert {"a", "##a", "b", "##b", "d", "##d"} <= set(tokens)
        assert info["chars_left_out"] == 1 and not [t for t in tokens if "c" in t]


def test_vocab_file_gets_the_usual_file_mode(tmp_path):
    # Atomic writes go through a mkstemp file (mode 0600); the renamed file must not stay private.
    umask = os.umask(0o022)
    os.umask(umask)
    path = tmp_path / "vocab.txt"
    vocab_learner.write_vocab(["[PAD]", "a"], str(path))
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_too_small_vocab_and_empty_input_are_value_errors():
    with pytest.raises(ValueError, match="too small"):
        vocab_learner.learn_vocab(collections.Counter({"abcdef": 3}), 10)
    with pytest.raises(ValueError, match="no words"):
        vocab_learner.learn_vocab(collections.Counter(), 100)


def run_cli(*args):
    """Runs `python -m bert_tf.build_vocab` as a real subprocess."""
    return run_module_cli("bert_tf.build_vocab", *args)


def test_cli_builds_the_same_vocab_as_the_library(corpus_file, learned, tmp_path):
    _, _, tokens, _ = learned
    out = tmp_path / "vocab.txt"
    result = run_cli(
        f"--input_file={corpus_file}",
        f"--output_file={out}",
        f"--vocab_size={VOCAB_SIZE}",
        "--do_lower_case=true",
    )
    assert result.returncode == 0, result.stderr
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == tokens
    assert "invalid UTF-8 sequences replaced: 0" in result.stdout
    assert "counting words" not in result.stderr  # the progress bar: on a terminal only


def test_cli_bad_inputs_exit_2_naming_the_problem(corpus_file, tmp_path):
    missing = str(tmp_path / "nothing-here-*.txt")
    result = run_cli(f"--input_file={corpus_file},{missing}", f"--output_file={tmp_path / 'v.txt'}")
    assert result.returncode == 2
    assert missing in result.stderr
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    result = run_cli(f"--input_file={empty}", f"--output_file={tmp_path / 'v.txt'}")
    assert result.returncode == 2
    assert "no words" in result.stderr and str(empty) in result.stderr
    assert not (tmp_path / "v.txt").exists()
