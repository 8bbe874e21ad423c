"""The original BERT tokenizer in plain Python: the reference, and a cached version of it for bulk text.

`FullTokenizer` follows Google's original `tokenization.py` rule for rule. `CachedTokenizer`, a
drop-in subclass, gives the same tokens and ids several times faster by tokenizing each distinct
word once. Neither needs TensorFlow (`bert_tf.tokenization.graph_tokenizer.GraphTokenizer`, the in-graph
tokenizer, does), so a process that only tokenizes text, such as a create_pretraining_data worker,
starts in a fraction of a second. The vocabulary file and the character classes both tokenizers
follow are in `bert_tf.tokenization.tokenizer_rules`; `python -m bert_tf.tokenization` (the package's
`__main__.py`) compares the two.

The original pipeline:
  1. decode UTF-8 (bad bytes become U+FFFD);
  2. clean: drop NUL, U+FFFD and control characters (Cc, Cf; but tab, newline and CR are
     whitespace), and turn whitespace (space, tab, newline, CR, Zs) into a space;
  3. put spaces around every CJK ideograph;
  4. split on whitespace (Python's `str.split()`);
  5. uncased only: lower-case each word (`str.lower()`, with Greek final sigma), NFD, drop Mn;
  6. split each word on punctuation (Unicode P* and the ASCII symbol ranges);
  7. greedy longest-match-first WordPiece with `##` continuations; a word over 200 characters,
     or one that cannot be covered by the vocabulary, becomes `[UNK]`.

These are the rules of google-research/bert's last `tokenization.py` (d66a146, 2019-03-28).
Earlier revisions differ in two: until d66a146, step 2 dropped every C* category, as Hugging Face
still does (they differ on private-use, unassigned and surrogate code points only: a word holding
one becomes `[UNK]` here and loses the character there); until 332a687 (2018-11-23), step 7's
limit was 100 characters, as Hugging Face's still is. The TF Model Garden's copy drops Cc and Cf
too, and keeps words up to 400 characters.

Special tokens in text: the original splits a literal "[MASK]" in the input into "[", "mask", "]".
The `special_tokens` option (say `special_tokens=("[MASK]", "[SEP]")`, for fill-mask; the default
`()` keeps the original's rules, which pretraining data and fine-tuning need) makes each listed
literal one token, as Hugging Face's tokenizers do: matched in the decoded text as written
(case-sensitive, before cleaning and lower-casing, so "[mask]" stays three tokens even uncased), with
or without spaces around it ("x[MASK]y" gives x, [MASK], y); the text between literals is tokenized
as texts of their own. Each literal must be in the vocabulary. GraphTokenizer has the same option.
"""

import functools
import itertools
import re
import unicodedata

import numpy as np

from bert_tf.runtime import io_utils
from bert_tf.tokenization.tokenizer_rules import (
    MAX_INPUT_CHARS_PER_WORD,
    NUM_CODE_POINTS,
    UNK_TOKEN,
    check_special_tokens,
    is_cjk,
    is_control,
    is_punctuation,
    is_whitespace,
    load_vocab,
    longest_first,
    special_token_tuple,
)

# Google's released checkpoints, by the name of their directory, as the original's
# validate_case_matches_checkpoint lists them: those trained on lower-cased text, and the cased ones.
LOWER_CASED_CHECKPOINTS = (
    "uncased_L-24_H-1024_A-16",
    "uncased_L-12_H-768_A-12",
    "multilingual_L-12_H-768_A-12",
    "chinese_L-12_H-768_A-12",
)
CASED_CHECKPOINTS = (
    "cased_L-12_H-768_A-12",
    "cased_L-24_H-1024_A-16",
    "multi_cased_L-12_H-768_A-12",
)
# The original's pattern, unchanged (its "." matches any character, and nothing anchors the end, so
# bert_model.ckpt-1000 and bert_model.ckpt.index match too): the directory holding bert_model.ckpt.
_CHECKPOINT_NAME = re.compile(r"^.*?([A-Za-z0-9_-]+)/bert_model.ckpt")


def validate_case_matches_checkpoint(do_lower_case, checkpoint, flag="--init_checkpoint"):
    """Refuses (UsageError) a casing that contradicts the name of one of Google's released checkpoints."""
    # Google's checkpoints do not record their casing (their bert_config.json has no
    # do_lower_case), so, like the original, this reads it from the directory name; any other
    # name passes. A model directory records its casing, and that is what it goes by.
    match = _CHECKPOINT_NAME.match(checkpoint or "")
    if match is None:
        return
    name = match.group(1)
    if name in LOWER_CASED_CHECKPOINTS and not do_lower_case:
        kind, wanted = "lower-cased", "true"
    elif name in CASED_CHECKPOINTS and do_lower_case:
        kind, wanted = "cased", "false"
    else:
        return
    given = "true" if do_lower_case else "false"
    raise io_utils.UsageError(
        f"--do_lower_case={given} contradicts {flag}={checkpoint}: {name} is Google's {kind} model, so "
        f"pass --do_lower_case={wanted} (the input must be cased as in pretraining)"
    )


def to_text(text):
    """Returns `text` as str; bytes are decoded as UTF-8 with bad bytes replaced by U+FFFD."""
    if isinstance(text, str):
        return text
    if isinstance(text, (bytes, bytearray)):
        return bytes(text).decode("utf-8", errors="replace")
    raise TypeError(f"expected str or bytes, got {type(text).__name__}")


def decode_counting_invalid(data):
    """Decodes UTF-8 bytes with replacement; returns (text, number of U+FFFD the decoding added)."""
    text = to_text(data)
    if "\ufffd" not in text:  # the usual case, without copying or counting
        return text, 0
    return text, text.count("\ufffd") - bytes(data).count("\ufffd".encode("utf-8"))


def count_invalid_utf8(data):
    """Returns how many U+FFFD replacements decoding `data` as UTF-8 introduces."""
    return decode_counting_invalid(data)[1]


@functools.lru_cache(maxsize=None)
def clean_char(char):
    """The cleaned form of one character: '' (dropped), ' ' (whitespace) or the character."""
    if char == "\x00" or char == "\ufffd" or is_control(char):
        return ""
    if is_whitespace(char):
        return " "
    if is_cjk(ord(char)):
        return f" {char} "
    return char


def strip_accents(text):
    """NFD, then drops combining marks (Mn), as the original uncased models do."""
    return "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")


def split_on_punctuation(word):
    """Splits a word so that every punctuation character is a token of its own."""
    pieces = []
    start_new = True
    for char in word:
        if is_punctuation(char):
            pieces.append(char)
            start_new = True
        else:
            if start_new:
                pieces.append("")
                start_new = False
            pieces[-1] += char
    return pieces


def special_token_splitter(special_tokens):
    """The `re.split` of text around the literals (at odd indices of its result); None for none."""
    if not special_tokens:
        return None
    return re.compile(f"({'|'.join(map(re.escape, longest_first(special_tokens)))})").split


class BasicTokenizer:
    """Cleaning, CJK splitting, optional lower-casing and accent stripping, punctuation splitting.

    `special_tokens`: literals kept whole as words of their own (see this module's docstring).
    """

    def __init__(self, do_lower_case=True, *, special_tokens=()):
        self.do_lower_case = do_lower_case
        self.special_tokens = special_token_tuple(special_tokens)
        self._split_special = special_token_splitter(self.special_tokens)

    def tokenize(self, text):
        """Splits text into words, the input of WordPiece."""
        if self._split_special is None:
            return self._tokenize_text(text)
        words = []
        for i, part in enumerate(self._split_special(to_text(text))):
            if i % 2:
                words.append(part)  # a literal
            elif part:
                words.extend(self._tokenize_text(part))
        return words

    def _tokenize_text(self, text):
        """The original's rules, on text holding no special token (or with the option off)."""
        cleaned = "".join(clean_char(c) for c in to_text(text))
        words = []
        for word in cleaned.split():
            if self.do_lower_case:
                word = strip_accents(word.lower())
            words.extend(split_on_punctuation(word))
        # The original re-splits on whitespace here; lower-casing and NFD never produce it,
        # but the re-split keeps the rule exact.
        return " ".join(words).split()


class WordpieceTokenizer:
    """Greedy longest-match-first WordPiece with `##` continuation pieces."""

    def __init__(
        self, vocab, unk_token=UNK_TOKEN, max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD
    ):
        self.vocab = vocab
        self.unk_token = unk_token
        self.max_input_chars_per_word = max_input_chars_per_word

    def tokenize_word(self, word):
        """Returns the pieces of one word, or [unk] when it cannot be covered."""
        if len(word) > self.max_input_chars_per_word:
            return [self.unk_token]
        pieces = []
        start = 0
        while start < len(word):
            end = len(word)
            while end > start:
                candidate = word[start:end] if start == 0 else "##" + word[start:end]
                if candidate in self.vocab:
                    pieces.append(candidate)
                    break
                end -= 1
            else:
                return [self.unk_token]
            start = end
        return pieces

    def tokenize(self, text):
        """Tokenizes whitespace-separated words."""
        return [piece for word in text.split() for piece in self.tokenize_word(word)]


class FullTokenizer:
    """The original BERT tokenizer: BasicTokenizer, then WordPiece.

    `special_tokens` (default none, the original's rules): literals such as "[MASK]" that become one
    token wherever they appear in the text (see this module's docstring); each must be in the
    vocabulary (a VocabError names the one that is not).

    Examples:
        >>> from bert_tf.tokenization.python_tokenizer import FullTokenizer
        >>> tokenizer = FullTokenizer("models/minilm/vocab.txt", do_lower_case=True)
        >>> tokenizer.tokenize("Unaffable tokenizers, naïvely!")
        ['una', '##ffa', '##ble', 'token', '##izer', '##s', ',', 'naive', '##ly', '!']
        >>> tokenizer.encode("the capital of france is [MASK] .")  # the original splits [MASK]
        [1996, 3007, 1997, 2605, 2003, 1031, 7308, 1033, 1012]
        >>> FullTokenizer(
        ...     "models/minilm/vocab.txt", special_tokens=("[MASK]", "[SEP]")
        ... ).encode("the capital of france is [MASK] .")
        [1996, 3007, 1997, 2605, 2003, 103, 1012]
        >>> tokenizer.convert_ids_to_tokens([7592, 2088])
        ['hello', 'world']
    """

    def __init__(self, vocab_file, do_lower_case=True, *, special_tokens=()):
        self.vocab_file = vocab_file
        self.do_lower_case = do_lower_case
        self.vocab = load_vocab(vocab_file)
        self.inv_vocab = {i: t for t, i in self.vocab.items()}
        self.special_tokens = check_special_tokens(special_tokens, self.vocab, vocab_file)
        # A literal (in the vocabulary, at most 200 characters) comes out of WordPiece whole.
        self.basic_tokenizer = BasicTokenizer(
            do_lower_case=do_lower_case, special_tokens=self.special_tokens
        )
        self.wordpiece_tokenizer = WordpieceTokenizer(self.vocab)
        self.invalid_utf8_count = 0

    def tokenize(self, text):
        """Returns the WordPiece tokens of `text` (str, or UTF-8 bytes)."""
        if isinstance(text, (bytes, bytearray)):
            text, invalid = decode_counting_invalid(text)
            self.invalid_utf8_count += invalid
        pieces = []
        for word in self.basic_tokenizer.tokenize(text):
            pieces.extend(self.wordpiece_tokenizer.tokenize_word(word))
        return pieces

    def convert_tokens_to_ids(self, tokens):
        """Maps tokens to ids; a token missing from the vocabulary is a KeyError."""
        return [self.vocab[t] for t in tokens]

    def convert_ids_to_tokens(self, ids):
        """Maps ids to tokens."""
        return [self.inv_vocab[int(i)] for i in ids]

    def encode(self, text):
        """Tokenizes and converts to ids in one call."""
        return self.convert_tokens_to_ids(self.tokenize(text))


# ---------------------------------------------------------------------------------------------
# The cached tokenizer.
#
# After cleaning (steps 1-3), every step acts on one whitespace-separated word at a time, so a
# word's tokens depend on nothing but the word. Text repeats its words (a few hundred thousand
# distinct ones in hundreds of MB), so remembering each word's ids (or tokens) leaves, per word, a
# dict lookup.
# benchmarks/bench_tokenization.py, 3 MB of the embedded corpus: 15.5 MB/s on one core with an
# empty cache, 27 MB/s warm, against FullTokenizer's 2.6 and GraphTokenizer's 23.6 (TensorFlow, two
# cores); what it saves is TensorFlow itself, ~3 s of import and ~0.8 GB per process.
# ---------------------------------------------------------------------------------------------

# Printable ASCII that is_punctuation counts as punctuation: the ASCII symbol ranges.
_ASCII_PUNCTUATION = r"!-/:-@\[-`{-~"
_ASCII_PIECES = re.compile(f"[{_ASCII_PUNCTUATION}]|[^{_ASCII_PUNCTUATION}]+")
# ASCII characters that cleaning changes besides whitespace: controls other than tab, LF and CR.
_ASCII_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# Words (and word pieces) remembered per cache before it is emptied. Bounds memory on corpora with
# endless distinct words (code, numbers): about 90 MiB when the word and piece caches of ids are
# full (encoding fills only those two; tokenize() fills the two of tokens). A word not in the cache
# costs about 8 us (random letter strings); a cached one well under 1 us.
MAX_CACHED_WORDS = 1 << 18
# With special tokens on, a literal's key in the word caches: the literal after a space, which no
# cleaned word holds, so that it differs from the same characters met as ordinary text ("[MA\x00SK]").
_LITERAL_MARK = " "


class _Memo(dict):
    """A dict that computes a missing key's value with `compute` and remembers it (up to `limit`)."""

    def __init__(self, compute, limit):
        super().__init__()
        self.compute = compute
        self.limit = limit

    def __missing__(self, key):
        value = self.compute(key)
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value


class CachedTokenizer(FullTokenizer):
    """FullTokenizer with each distinct word tokenized once: the same tokens and ids, much faster.

    Examples:
        >>> from bert_tf.tokenization.python_tokenizer import CachedTokenizer
        >>> tokenizer = CachedTokenizer("models/minilm/vocab.txt", do_lower_case=True)
        >>> tokenizer.encode("hello world")  # FullTokenizer's ids
        [7592, 2088]
        >>> ids, row_splits = tokenizer.encode_lines(["hello world", "hello again"])  # bulk text
        >>> ids.tolist(), row_splits.tolist()
        ([7592, 2088, 7592, 2153], [0, 2, 4])
    """

    def __init__(
        self,
        vocab_file,
        do_lower_case=True,
        max_cached_words=MAX_CACHED_WORDS,
        *,
        special_tokens=(),
    ):
        super().__init__(vocab_file, do_lower_case, special_tokens=special_tokens)
        self._split_special = special_token_splitter(self.special_tokens)
        # Steps 5-6 on cleaned words, which hold no literal to keep whole.
        self._word_splitter = BasicTokenizer(do_lower_case=do_lower_case)
        # str.translate table of cleaning (steps 2-3), filled as characters are first seen.
        self._clean_table = _Memo(lambda code_point: clean_char(chr(code_point)), NUM_CODE_POINTS)
        # Ids and tokens are cached apart: bulk encoding (pretraining data) never fills the tokens.
        self._word_ids = _Memo(
            lambda word: self._join(self._piece_ids, self._pieces(word)), max_cached_words
        )
        self._piece_ids = _Memo(
            lambda piece: tuple(map(self.vocab.__getitem__, self._piece_tokens[piece])),
            max_cached_words,
        )
        self._word_tokens = _Memo(
            lambda word: self._join(self._piece_tokens, self._pieces(word)), max_cached_words
        )
        self._piece_tokens = _Memo(
            lambda piece: tuple(self.wordpiece_tokenizer.tokenize_word(piece)), max_cached_words
        )

    def words(self, text):
        """Steps 1-4: the cleaned, whitespace-split words of `text` (str, or UTF-8 bytes).

        With special tokens on, each literal is a word of its own, led by a space (_LITERAL_MARK).
        """
        if isinstance(text, (bytes, bytearray)):
            text, invalid = decode_counting_invalid(text)
            self.invalid_utf8_count += invalid
        if self._split_special is not None:
            return self._words_around_special_tokens(text)
        if text.isascii() and not _ASCII_CONTROL.search(text):
            return text.split()  # cleaning changes nothing here
        return text.translate(self._clean_table).split()

    def _words_around_special_tokens(self, text):
        """words() with the special tokens on: each literal is one word, keyed apart (_LITERAL_MARK)."""
        words = []
        for i, part in enumerate(self._split_special(text)):
            if i % 2:
                words.append(_LITERAL_MARK + part)
            elif part.isascii() and not _ASCII_CONTROL.search(part):
                words.extend(part.split())  # as words() does
            else:
                words.extend(part.translate(self._clean_table).split())
        return words

    def tokenize(self, text):
        """Returns the WordPiece tokens of `text` (str, or UTF-8 bytes), as FullTokenizer.tokenize."""
        return self._join(self._word_tokens, self.words(text))

    def encode(self, text):
        """The ids of `text`, as FullTokenizer.encode."""
        return self._join(self._word_ids, self.words(text))

    def encode_lines(self, lines):
        """Tokenizes each line; returns (int32 ids of all lines, int64 row splits)."""
        ids, splits = [], [0]
        word_ids = self._word_ids.__getitem__
        for line in lines:
            ids.extend(itertools.chain.from_iterable(map(word_ids, self.words(line))))
            splits.append(len(ids))
        return np.array(ids, dtype=np.int32), np.array(splits, dtype=np.int64)

    def _pieces(self, word):
        """Steps 5-6 on one cleaned word: the words WordPiece gets."""
        if word.startswith(_LITERAL_MARK):
            # A special token's literal: WordPiece keeps it whole (it is in the vocabulary).
            return [word[len(_LITERAL_MARK) :]]
        if word.isascii():
            # Printable ASCII: lower-casing is str.lower, NFD and Mn stripping change nothing.
            return _ASCII_PIECES.findall(word.lower() if self.do_lower_case else word)
        return self._word_splitter.tokenize(word)

    @staticmethod
    def _join(cache, keys):
        return list(itertools.chain.from_iterable(map(cache.__getitem__, keys)))
