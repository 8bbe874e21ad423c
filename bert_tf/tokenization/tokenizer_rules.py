"""The original BERT tokenizer's rules that both tokenizers follow: the vocabulary file, the special
tokens, and the character classes.

`bert_tf.tokenization` (FullTokenizer and CachedTokenizer, plain Python) and
`bert_tf.tokenization.graph_tokenizer` (GraphTokenizer, TensorFlow ops) read these, so that they agree by
construction. No TensorFlow here (a vocabulary on gs:// imports it to read the file).
"""

import collections
import functools
import os
import unicodedata

from bert_tf.runtime import io_utils

# FullTokenizer, CachedTokenizer and GraphTokenizer each take every constructor option (with the
# same default) and honour it alike, except the options listed here, which one class alone has and
# which change no token; tests/test_pairs_in_step.py holds the three classes to this.
ONE_SIDED_TOKENIZER_OPTIONS = frozenset(
    {
        "max_cached_words",  # CachedTokenizer's memory bound: when its caches empty, not their ids
        "name",  # GraphTokenizer's tf.Module name, for its variables and graph scopes
    }
)

UNK_TOKEN = "[UNK]"
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# google-research/bert's WordpieceTokenizer since 332a687 (2018-11-23; 100 before it, and in HF's).
MAX_INPUT_CHARS_PER_WORD = 200
NUM_CODE_POINTS = 0x110000

# The CJK Unified Ideographs blocks the original treats as "Chinese characters". Hangul, kana and
# Thai are not in them, so those scripts are split on whitespace like any other.
CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


class VocabError(ValueError):
    """A vocabulary file that is missing, empty or unusable."""


def load_vocab(vocab_file):
    """Reads a vocab.txt (one token per line, id = line number) into an ordered token->id dict."""
    # A vocab on gs:// (next to a TPU's data) loads through tf.io.gfile; a local one needs no TensorFlow.
    if io_utils.is_remote(vocab_file):
        import tensorflow as tf

        exists = tf.io.gfile.exists(vocab_file) and not tf.io.gfile.isdir(vocab_file)
    else:
        exists = os.path.isfile(vocab_file)
    if not exists:
        raise VocabError(f"vocabulary file not found: {vocab_file}")
    vocab = collections.OrderedDict()
    with io_utils.open_text(vocab_file) as f:
        for line_number, raw in enumerate(f, start=1):
            token = raw.decode("utf-8", errors="replace").strip()
            if not token:
                raise VocabError(f"{vocab_file}:{line_number}: empty token")
            if token in vocab:
                raise VocabError(
                    f"{vocab_file}:{line_number}: duplicate token {token!r} "
                    f"(first on line {vocab[token] + 1})"
                )
            vocab[token] = line_number - 1
    if not vocab:
        raise VocabError(f"vocabulary file is empty: {vocab_file}")
    if UNK_TOKEN not in vocab:
        raise VocabError(f"vocabulary file has no {UNK_TOKEN} token: {vocab_file}")
    return vocab


# Special tokens in text (the tokenizers' `special_tokens` option, off by default: the original
# splits a literal "[MASK]" into "[", "mask", "]"). With it on, each listed literal in the raw text,
# exactly as written (case-sensitive, before cleaning and lower-casing), is one token, and the text
# between literals is tokenized as texts of their own, as Hugging Face does with special tokens (its
# added tokens with normalized=False). Overlapping literals match leftmost, then longest.


def special_token_tuple(special_tokens):
    """A `special_tokens` option as a tuple of non-empty strings, duplicates dropped."""
    if isinstance(special_tokens, (str, bytes)):
        raise TypeError(
            f"special_tokens must be a sequence of strings such as ('[MASK]', '[SEP]'), "
            f"not {special_tokens!r}"
        )
    tokens = tuple(dict.fromkeys(special_tokens))
    for token in tokens:
        if not isinstance(token, str) or not token:
            raise ValueError(f"a special token must be a non-empty string, got {token!r}")
        # Such a literal could only be matched in text before cleaning; GraphTokenizer also relies
        # on it (it splits with U+0001 in place of NUL).
        if any(c in "\x00\ufffd" or is_control(c) for c in token):
            raise ValueError(
                f"special token {token!r} holds a character that cleaning drops (NUL, U+FFFD, "
                f"a control or format character)"
            )
    return tokens


def check_special_tokens(special_tokens, vocab, vocab_file):
    """Validates a tokenizer's `special_tokens` option against its vocabulary; returns the tuple."""
    tokens = special_token_tuple(special_tokens)
    for token in tokens:
        if token not in vocab:
            raise VocabError(f"special token {token!r} is not in the vocabulary {vocab_file}")
        if len(token) > MAX_INPUT_CHARS_PER_WORD:
            # FullTokenizer gives the literal to WordPiece, which keeps only words up to this long.
            raise ValueError(
                f"special token {token!r} is longer than {MAX_INPUT_CHARS_PER_WORD} characters"
            )
    return tokens


def longest_first(special_tokens):
    """The literals in the order an alternation must try them for a leftmost-longest match."""
    return sorted(special_tokens, key=len, reverse=True)


# Character classes. They are cached because text repeats a small set of characters, and
# unicodedata lookups dominate the cost of the Python tokenizer.


@functools.lru_cache(maxsize=None)
def is_whitespace(char):
    """True for the characters the original maps to a space: space, tab, newline, CR and Zs."""
    return char in " \t\n\r" or unicodedata.category(char) == "Zs"


@functools.lru_cache(maxsize=None)
def is_control(char):
    """True for the characters the original drops: Cc and Cf, except tab, newline and CR."""
    if char in "\t\n\r":
        return False
    return unicodedata.category(char) in ("Cc", "Cf")


@functools.lru_cache(maxsize=None)
def is_punctuation(char):
    """True for Unicode P* and for every non-alphanumeric printable ASCII symbol, such as `$` or `^`."""
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def is_cjk(cp):
    """True for a code point in one of the CJK ideograph blocks."""
    return any(low <= cp <= high for low, high in CJK_RANGES)


# What is_whitespace accepts, as one regex class: the four ASCII ones and the Zs category
# (tests/serving/test_long_texts.py checks it against is_whitespace over every code point).
WHITESPACE_CLASS = " \t\n\r\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000"
