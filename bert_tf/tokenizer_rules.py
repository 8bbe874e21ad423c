"""The original BERT tokenizer's rules that both tokenizers follow: the vocabulary file, the special
tokens, and the character classes.

`bert_tf.tokenization` (FullTokenizer and CachedTokenizer, plain Python) and
`bert_tf.graph_tokenizer` (GraphTokenizer, TensorFlow ops) read these, so that they agree by
construction. No TensorFlow here (a vocabulary on gs:// imports it to read the file).
"""

import collections
import functools
import os
import re
import typing
import unicodedata

from bert_tf import io_utils

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
# (tests/test_long_texts.py checks it against is_whitespace over every code point).
WHITESPACE_CLASS = " \t\n\r\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000"
_CJK_CLASS = "".join(f"\\U{low:08x}-\\U{high:08x}" for low, high in CJK_RANGES)
# The pieces the tokenizer splits text into first: a CJK ideograph, or a run of anything else
# between whitespace.
_PIECE = re.compile(f"[{_CJK_CLASS}]|[^{WHITESPACE_CLASS}{_CJK_CLASS}]+")
# A letter or digit: it survives cleaning and accent stripping as at least one character, and it
# is never punctuation (tests/test_long_texts.py checks both over every code point).
_LETTER_OR_DIGIT = re.compile(r"[^\W_]")


def prefix_keeping_tokens(text, count):
    """A prefix of `text` whose tokens, by the original's tokenizer, begin with the first `count`
    tokens of `text` (`text` itself when it has fewer): `text` cut after its `count`-th word,
    where a word gives at least one token: a CJK ideograph, a punctuation character of the BMP,
    or a stretch between whitespace, ideographs and those that holds a letter or digit. The
    tokenizer splits at each of their ends, so no token spans the cut, with one exception: a
    capital sigma lower-cases by what follows it in its whitespace-delimited run (a final sigma),
    so a cut that would change one keeps its run whole (_past_sigma_context). For tokenizers
    without special_tokens (a literal "[MASK]" may be cut after its "["). Linear in the length of
    the prefix and of the run it ends in, once prepare_prefix_cut has run (the first call runs
    it)."""
    words = 0
    for piece in _PIECE.finditer(text):
        start, end = piece.span()
        if end - start == 1 and is_cjk(ord(text[start])):
            words += 1
            if words == count:
                return text[:end]
            continue
        for part in _prefix_cut_patterns().run_part.finditer(text, start, end):
            cut = _word_end(text, part)
            if cut is None:
                continue
            words += 1
            if words == count:
                return text[: _past_sigma_context(text, start, cut, end)]
    return text


def prepare_prefix_cut():
    """Builds the character classes prefix_keeping_tokens reads (about 0.5 s, once a process), so
    that no call of it has to."""
    _prefix_cut_patterns()


# The general categories that Unicode's Case_Ignorable property draws from (Mn, Me, Cf, Lm, Sk,
# and Word_Break's mid-letter punctuation, such as "'", "." and ":") and Cc, which cleaning drops:
# only these are asked of str.lower() (tests/test_long_texts.py checks every code point).
_SIGMA_CONTEXT_CATEGORIES = ("Mn", "Me", "Cf", "Lm", "Sk", "Po", "Pi", "Pf", "Cc")


def _lowers_to_final_sigma(following):
    """Whether str.lower() makes a capital sigma after a cased letter and before `following` a
    final sigma."""
    return ("A\u03a3" + following).lower()[1] == "\u03c2"


def _sigma_context_character(char):
    """Whether str.lower() looks past `char` for a capital sigma's context before it: a
    case-ignorable character (a final sigma at the end, none before a letter), or one that
    cleaning drops before lower-casing."""
    dropped = char in "\x00\ufffd" or is_control.__wrapped__(char)
    return dropped or (_lowers_to_final_sigma(char) and not _lowers_to_final_sigma(char + "b"))


def _code_point_class(code_points):
    """Ascending code points as the inside of a regex character class, in ranges."""
    ranges = []
    for cp in code_points:
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return "".join(f"\\U{low:08x}-\\U{high:08x}" for low, high in ranges)


_BMP_END = 0x10000


class _CutPatterns(typing.NamedTuple):
    """The regexes prefix_keeping_tokens reads (_prefix_cut_patterns)."""

    # Within a run: a punctuation character (is_punctuation), a token of its own, or what lies
    # between them. Only the BMP's punctuation: Python's re tests a class's code points past
    # U+FFFF range by range (an 18 MB run took 2.7 s to split, against 0.11 s); leaving them out
    # only makes the count of words a lower bound.
    run_part: re.Pattern
    # A run of _sigma_context_character characters (all of them: the cut rests on its end).
    sigma_context: re.Pattern
    # One more letter or digit than a word may hold, with only combining marks (M*, which no
    # rule of the tokenizer splits at) between them: the word holding them is an [UNK] in either
    # casing. It starts only where a stretch of letters, digits and marks starts (an ideograph
    # before it is a word of its own), and the marks are matched possessively, so the search is
    # linear. BMP marks only, for the same reason: a mark past U+FFFF ends the stretch.
    too_long: re.Pattern


@functools.cache
def _prefix_cut_patterns():
    """A _CutPatterns, built from one pass over every code point with the classes' own rules
    uncached."""
    punctuation, sigma_context, marks = [], [], []
    for cp in range(NUM_CODE_POINTS):
        char = chr(cp)
        category = unicodedata.category(char)
        if cp < _BMP_END and (
            category[0] == "P" or (cp < 128 and is_punctuation.__wrapped__(char))
        ):
            punctuation.append(cp)
        if (category in _SIGMA_CONTEXT_CATEGORIES or char == "\ufffd") and (
            _sigma_context_character(char)
        ):
            sigma_context.append(cp)
        if cp < _BMP_END and category[0] == "M":
            marks.append(cp)
    punctuation, marks = _code_point_class(punctuation), _code_point_class(marks)
    letter = "[^\\W_]"
    return _CutPatterns(
        run_part=re.compile(f"(?P<punctuation>[{punctuation}])|[^{punctuation}]+"),
        sigma_context=re.compile(f"[{_code_point_class(sigma_context)}]*"),
        too_long=re.compile(
            f"(?<![^\\W_{_CJK_CLASS}]|[{marks}])[{marks}]*+"
            f"(?:{letter}[{marks}]*+){{{MAX_INPUT_CHARS_PER_WORD}}}{letter}"
        ),
    )


def _past_sigma_context(text, start, cut, end):
    """`cut`, or the end of the run text[start:end] where a capital sigma before the cut would
    lower-case otherwise in the prefix. str.lower() makes it a final sigma unless a cased letter
    follows it past case-ignorable characters (and those that cleaning drops first): only when
    that letter lies beyond the cut is the run kept whole (a chain such as "Σ.Σ.Σ." could move a
    tighter cut word by word to the run's end)."""
    sigma = text.rfind("\u03a3", start, cut)
    if sigma < 0:
        return cut
    context_end = _prefix_cut_patterns().sigma_context.match(text, sigma + 1, end).end()
    # Decided inside the prefix, or final in both: its context reaches the run's end (a prefix
    # that ends inside it reads the same) or a character that is no cased letter.
    if context_end < cut or context_end == end or _lowers_to_final_sigma(text[context_end]):
        return cut
    return end


def _word_end(text, part):
    """Where a run part (_prefix_cut_patterns) can be cut keeping its tokens: its end, or right
    after the first stretch of more letters and digits than a word may hold, combining marks
    between them (the word holding it is one [UNK], however far it goes on); None when nothing
    in it is sure to give a token."""
    if part.group("punctuation"):
        return part.end()
    if not _LETTER_OR_DIGIT.search(text, *part.span()):
        return None
    too_long = _prefix_cut_patterns().too_long.search(text, *part.span())
    return too_long.end() if too_long else part.end()
