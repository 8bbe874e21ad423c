"""Long texts cut before tokenization, keeping every token the whole text gives up to the cut.

A served export that reads only a text's first max_seq_length tokens need not tokenize the rest:
prefix_keeping_tokens finds a prefix whose tokens, by the original's tokenizer, are exactly the
whole text's first ones (servable._cut_texts applies it). Its character classes come from
GraphTokenizer's per-code-point tables (graph_tokenizer.code_point_tables), the same properties
both tokenizers follow.
"""

import functools
import re
import typing
import unicodedata

from bert_tf.tokenization import graph_tokenizer
from bert_tf.tokenization.tokenizer_rules import (
    CJK_RANGES,
    MAX_INPUT_CHARS_PER_WORD,
    WHITESPACE_CLASS,
    is_cjk,
)

_CJK_CLASS = "".join(f"\\U{low:08x}-\\U{high:08x}" for low, high in CJK_RANGES)
# The pieces the tokenizer splits text into first: a CJK ideograph, or a run of anything else
# between whitespace.
_PIECE = re.compile(f"[{_CJK_CLASS}]|[^{WHITESPACE_CLASS}{_CJK_CLASS}]+")
# A letter or digit: it survives cleaning and accent stripping as at least one character, and it
# is never punctuation (tests/serving/test_long_texts.py checks both over every code point).
_LETTER_OR_DIGIT = re.compile(r"[^\W_]")
_BMP_END = 0x10000


def prefix_keeping_tokens(text, count):
    """A prefix of `text` whose tokens, by the original's tokenizer, begin with the first `count`
    tokens of `text` (`text` itself when it has fewer): `text` cut after its `count`-th word,
    where a word gives at least one token: a CJK ideograph, a punctuation character of the BMP,
    or a stretch between whitespace, ideographs and those that holds a letter or digit. The
    tokenizer splits at each of their ends, so no token spans the cut, with one exception: a
    capital sigma lower-cases by what follows it in its whitespace-delimited run (a final sigma),
    so a cut that would change one keeps its run whole (_past_sigma_context). For tokenizers
    without special_tokens (a literal "[MASK]" may be cut after its "["). Linear in the length of
    the prefix and of the run it ends in, once prepare has run (the first call runs it)."""
    words = 0
    for piece in _PIECE.finditer(text):
        start, end = piece.span()
        if end - start == 1 and is_cjk(ord(text[start])):
            words += 1
            if words == count:
                return text[:end]
            continue
        for part in _cut_patterns().run_part.finditer(text, start, end):
            cut = _word_end(text, part)
            if cut is None:
                continue
            words += 1
            if words == count:
                return text[: _past_sigma_context(text, start, cut, end)]
    return text


def prepare():
    """Builds the regexes prefix_keeping_tokens reads (once a process), so that no call of it
    has to."""
    _cut_patterns()


def _code_point_class(code_points):
    """Ascending code points as the inside of a regex character class, in ranges."""
    ranges = []
    for cp in code_points:
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return "".join(f"\\U{low:08x}-\\U{high:08x}" for low, high in ranges)


class _CutPatterns(typing.NamedTuple):
    """The regexes prefix_keeping_tokens reads (_cut_patterns)."""

    # Within a run: a punctuation character (is_punctuation), a token of its own, or what lies
    # between them. Only the BMP's punctuation: Python's re tests a class's code points past
    # U+FFFF range by range (an 18 MB run took 2.7 s to split, against 0.11 s); leaving them out
    # only makes the count of words a lower bound.
    run_part: re.Pattern
    # A run of characters str.lower() reads past for a capital sigma's context (case-ignorable)
    # or that cleaning drops before it: all of them, since the cut rests on where the run ends.
    sigma_context: re.Pattern
    # One more letter or digit than a word may hold, with only combining marks (M*, which no
    # rule of the tokenizer splits at) between them: the word holding them is an [UNK] in either
    # casing. It starts only where a stretch of letters, digits and marks starts (an ideograph
    # before it is a word of its own), and the marks are matched possessively, so the search is
    # linear. BMP marks only, for the same reason: a mark past U+FFFF ends the stretch.
    too_long: re.Pattern


@functools.cache
def _cut_patterns():
    """A _CutPatterns, from GraphTokenizer's tables (and the BMP's marks)."""
    punctuation = graph_tokenizer.code_points_flagged("punctuation")
    punctuation = _code_point_class(punctuation[punctuation < _BMP_END])
    sigma_context = _code_point_class(graph_tokenizer.code_points_flagged("drop", "case_ignorable"))
    marks = _code_point_class(
        cp for cp in range(_BMP_END) if unicodedata.category(chr(cp))[0] == "M"
    )
    letter = "[^\\W_]"
    return _CutPatterns(
        run_part=re.compile(f"(?P<punctuation>[{punctuation}])|[^{punctuation}]+"),
        sigma_context=re.compile(f"[{sigma_context}]*"),
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
    context_end = _cut_patterns().sigma_context.match(text, sigma + 1, end).end()
    # Decided inside the prefix, or final in both: its context reaches the run's end (a prefix
    # that ends inside it reads the same) or a character that is no cased letter.
    if context_end < cut or context_end == end:
        return cut
    if ("A\u03a3" + text[context_end]).lower()[1] == "\u03c2":
        return cut  # str.lower() itself says that character is no cased letter
    return end


def _word_end(text, part):
    """Where a run part (_cut_patterns) can be cut keeping its tokens: its end, or right after
    the first stretch of more letters and digits than a word may hold, combining marks between
    them (the word holding it is one [UNK], however far it goes on); None when nothing in it is
    sure to give a token."""
    if part.group("punctuation"):
        return part.end()
    if not _LETTER_OR_DIGIT.search(text, *part.span()):
        return None
    too_long = _cut_patterns().too_long.search(text, *part.span())
    return too_long.end() if too_long else part.end()
