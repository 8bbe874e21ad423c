"""GraphTokenizer: WordPiece tokenization with the original BERT semantics, in the TensorFlow graph.

`GraphTokenizer` produces FullTokenizer's ids with TensorFlow core and tensorflow_text ops only, so
it runs inside `tf.data`, `tf.function` and exported SavedModels (and so in stock TF Serving).
`FullTokenizer`, the Python reference that follows Google's original `tokenization.py` rule for
rule, and `CachedTokenizer` (the same ids, fast, for bulk text) live in `bert_tf.tokenization`,
which needs no TensorFlow and lists the original's pipeline, step by step.
"""

import functools
import hashlib
import inspect
import os
import sys
import unicodedata

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from bert_tf.runtime import io_utils
from bert_tf.tokenization.graph_cond import cond_as_call
from bert_tf.tokenization.tokenizer_rules import (
    CJK_RANGES,
    MAX_INPUT_CHARS_PER_WORD,
    NUM_CODE_POINTS,
    SPECIAL_TOKENS,
    UNK_TOKEN,
    check_special_tokens,
    is_cjk,
    is_control,
    is_punctuation,
    is_whitespace,
    load_vocab,
    longest_first,
)

# ---------------------------------------------------------------------------------------------
# The in-graph tokenizer.
#
# tensorflow_text's own normalizers (FastBertTokenizer, BertTokenizer, normalize_utf8) differ from
# the original on ordinary text (`…` -> `. . .`, `ﬁ` -> `fi`, `ß` -> `ss`, full-width letters), and
# RE2/ICU use other Unicode versions than Python. So the normalization runs on code points with
# lookup tables computed from this Python's `unicodedata` (the same tables FullTokenizer consults),
# and only the word-to-pieces step uses tensorflow_text's FastWordpieceTokenizer, with its own
# pre-tokenization and normalization turned off.
# ---------------------------------------------------------------------------------------------

# Packed per-code-point properties: bits 0-7 hold the canonical combining class (for NFD's
# canonical reordering), the bits below are flags.
_CCC_MASK = 0xFF
_DROP = 1 << 8  # removed by cleaning: NUL, U+FFFD, Cc/Cf except tab/newline/CR
_SEPARATOR = 1 << 9  # splits words: whitespace (cleaned to a space) and U+2028/U+2029
_CJK = 1 << 10  # a word of its own
_PUNCTUATION = 1 << 11  # a word of its own, tested after lower-casing and NFD
_MARK_NONSPACING = 1 << 12  # Mn: dropped by accent stripping (uncased only)
_CASED = 1 << 13  # cased and not case-ignorable: Greek final-sigma context
_CASE_IGNORABLE = 1 << 14
_EXACT_ONLY = 1 << 15  # uncased needs the exact path: capital sigma, or a kept mark with ccc > 0
_STRIPPED_EMPTY = 1 << 16  # uncased: lower+NFD+strip leaves nothing
_STRIPPED_MULTI = 1 << 17  # uncased: lower+NFD+strip leaves two or more characters
_CAPITAL_SIGMA, _SMALL_SIGMA, _FINAL_SIGMA = 0x3A3, 0x3C3, 0x3C2


def _code_point_properties(char):
    """The packed property bits of one character (the uncased expansion bits excluded)."""
    bits = unicodedata.combining(char)
    if char in "\x00\ufffd" or is_control(char):
        bits |= _DROP
    if is_whitespace(char) or char.isspace():
        bits |= _SEPARATOR
    if is_cjk(ord(char)):
        bits |= _CJK
    if is_punctuation(char):
        bits |= _PUNCTUATION
    if unicodedata.category(char) == "Mn":
        bits |= _MARK_NONSPACING
    # Python's str.lower() turns a capital sigma into a final sigma when it follows a cased letter
    # (skipping case-ignorable characters) and no cased letter follows. unicodedata has no
    # "cased"/"case-ignorable" queries, so ask lower() itself.
    if (char + "\u03a3").lower()[-1] == "\u03c2":
        bits |= _CASED
    elif ("a" + char + "\u03a3").lower()[-1] == "\u03c2":
        bits |= _CASE_IGNORABLE
    return bits


def _tables_cache_path():
    """Where code_point_tables() keeps its result, keyed by everything that determines it."""
    builders = (
        _code_point_properties,
        _compute_code_point_tables,
        is_whitespace,
        is_control,
        is_punctuation,
        is_cjk,
    )
    source = "".join(inspect.getsource(f) for f in builders) + repr(CJK_RANGES)
    key = hashlib.sha256(
        f"{unicodedata.unidata_version}|{sys.version}|{source}".encode("utf-8")
    ).hexdigest()[:16]
    cache_dir = os.environ.get("BERT_TF_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "bert_tf"
    )
    return os.path.join(cache_dir, f"code_point_tables-{key}.npz")


@functools.lru_cache(maxsize=1)
def code_point_tables():
    """GraphTokenizer's lookup tables (see _compute_code_point_tables), cached on disk.

    Computing them walks all 1.1M code points in Python (seconds), and every process that builds a
    GraphTokenizer (an export, a server, a test run) needs them, so the result is kept in
    ~/.cache/bert_tf (or $BERT_TF_CACHE_DIR), keyed by the Unicode version, the Python version and
    the source of the functions that compute them.
    """
    path = _tables_cache_path()
    try:
        with np.load(path) as data:
            return {
                "layout": tuple(int(v) for v in data["layout"]),
                "props": data["props"],
                "lower_delta": data["lower_delta"],
                "expansion_rows": data["expansion_rows"],
                "full": (data["full_values"], data["full_splits"]),
                "stripped": (data["stripped_values"], data["stripped_splits"]),
            }
    except (OSError, KeyError, ValueError):
        pass  # missing or unreadable: compute and (try to) store
    tables = _compute_code_point_tables()
    try:
        # Atomic: readers see no file or the whole file. A file object, since np.savez would add
        # `.npz` to a temp name that lacks it.
        with io_utils.atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(
                f,
                layout=np.asarray(tables["layout"], np.int64),
                props=tables["props"],
                lower_delta=tables["lower_delta"],
                expansion_rows=tables["expansion_rows"],
                full_values=tables["full"][0],
                full_splits=tables["full"][1],
                stripped_values=tables["stripped"][0],
                stripped_splits=tables["stripped"][1],
            )
    except OSError:
        pass  # a read-only home directory only costs the recomputation
    return tables


# code_points_flagged's names for the property bits.
_FLAG_NAMES = {"drop": _DROP, "case_ignorable": _CASE_IGNORABLE, "punctuation": _PUNCTUATION}


def code_points_flagged(*names):
    """The code points (ascending, int64) whose properties in code_point_tables hold any of the
    named flags: "drop" (removed by cleaning), "case_ignorable" (str.lower() looks past it for a
    capital sigma's context), "punctuation" (is_punctuation)."""
    tables = code_point_tables()
    main_end, tail_start, tail_end = tables["layout"]
    code_points = np.concatenate([np.arange(main_end), np.arange(tail_start, tail_end)])
    props = tables["props"][: len(code_points)].view(np.uint32)
    mask = np.uint32(sum(_FLAG_NAMES[name] for name in names))
    return code_points[(props & mask) != 0]


def _compute_code_point_tables():
    """Lookup tables for GraphTokenizer, computed from this Python's `unicodedata`.

    Only code points below `main_end` and in [tail_start, tail_end) have non-default entries (the
    rest are unassigned or private use); GraphTokenizer._table_rows maps a code point to its row. Returns a dict:
      props: packed properties; lower_delta: for a character whose lower+NFD+strip is one
      character, that character minus the code point; expansion_rows: bits 0-15 are 1 + the row
      of NFD(lower(c)) in `full`, bits 16-31 are 1 + the row of its accent-stripped form in
      `stripped` (for two or more characters); full/stripped: (values, row_splits).
    """
    props = np.zeros(NUM_CODE_POINTS, dtype=np.int64)
    lower_delta = np.zeros(NUM_CODE_POINTS, dtype=np.int64)
    expansion_rows = np.zeros(NUM_CODE_POINTS, dtype=np.int64)
    full, stripped = ([], [0]), ([], [0])

    def add_row(table, text):
        table[0].extend(ord(c) for c in text)
        table[1].append(len(table[0]))
        return len(table[1]) - 1  # 1 + the new row's index

    for cp in range(NUM_CODE_POINTS):
        if 0xD800 <= cp <= 0xDFFF:  # surrogates never come out of UTF-8 decoding
            continue
        char = chr(cp)
        bits = _code_point_properties(char)
        lowered = char.lower()
        expansion = lowered if lowered.isascii() else unicodedata.normalize("NFD", lowered)
        if expansion != char:
            expansion_rows[cp] = add_row(full, expansion)
        kept = "".join(c for c in expansion if unicodedata.category(c) != "Mn")
        if cp == _CAPITAL_SIGMA or any(unicodedata.combining(c) for c in kept):
            bits |= _EXACT_ONLY
        if not kept:
            bits |= _STRIPPED_EMPTY
        elif len(kept) == 1:
            lower_delta[cp] = ord(kept) - cp
        else:
            bits |= _STRIPPED_MULTI
            expansion_rows[cp] |= add_row(stripped, kept) << 16
        props[cp] = bits

    nondefault = np.nonzero(props | lower_delta | expansion_rows)[0]
    tail = nondefault[nondefault >= 0xE0000]
    main_end = int(nondefault[nondefault < 0xE0000].max()) + 1
    tail_start, tail_end = (
        (int(tail.min()), int(tail.max()) + 1) if len(tail) else (main_end, main_end)
    )
    rows = np.concatenate([np.arange(main_end), np.arange(tail_start, tail_end), [main_end]])
    # The last row is all defaults (props 0, no mapping); code points outside both ranges use it.
    # Its source, main_end, is itself default by construction.
    assert max(len(full[1]), len(stripped[1])) < 1 << 15

    def packed(table):
        return table[rows].astype(np.uint32).view(np.int32)

    return {
        "layout": (main_end, tail_start, tail_end),
        "props": packed(props),
        "lower_delta": lower_delta[rows].astype(np.int32),
        "expansion_rows": packed(expansion_rows),
        "full": (np.asarray(full[0], np.int32), np.asarray(full[1], np.int64)),
        "stripped": (np.asarray(stripped[0], np.int32), np.asarray(stripped[1], np.int64)),
    }


class GraphTokenizer(tf.Module):
    """The original BERT tokenizer as TensorFlow ops: same ids as FullTokenizer, inside any graph.

    `tokenize(tf.string [batch])` returns a tf.RaggedTensor int32 [batch, (tokens)]. It uses only
    TensorFlow core ops and tensorflow_text's FastWordpieceTokenizer, so SavedModels that contain
    it run in stock TF Serving (2.20+ bundles the tensorflow_text ops).

    `special_tokens`, as FullTokenizer's (default none, the original's rules): literals such as
    "[MASK]" that become one token wherever they appear in the text; each must be in the
    vocabulary. With it on, the graph also holds tensorflow_text's RegexSplitWithOffsets.

    Examples:
        >>> import tensorflow as tf
        >>> from bert_tf.tokenization.graph_tokenizer import GraphTokenizer
        >>> tokenizer = GraphTokenizer("models/minilm/vocab.txt", do_lower_case=True)
        >>> tokenizer.tokenize(tf.constant(["Unaffable tokenizers, naïvely!", "hello world"])).to_list()
        [[14477, 20961, 3468, 19204, 17629, 2015, 1010, 15743, 2135, 999], [7592, 2088]]
        >>> ids, starts, ends = tokenizer.tokenize_with_offsets(tf.constant(["naïvely hello"]))
        >>> ids.to_list(), starts.to_list(), ends.to_list()  # byte offsets into the UTF-8 input
        ([[15743, 2135, 7592]], [[0, 6, 9]], [[6, 8, 14]])
    """

    def __init__(self, vocab_file, do_lower_case=True, name=None, *, special_tokens=()):
        super().__init__(name=name)
        vocab = load_vocab(vocab_file)
        self.vocab_file = vocab_file
        self.do_lower_case = do_lower_case
        self.vocab_size = len(vocab)
        self.vocab_asset = tf.saved_model.Asset(vocab_file)
        self.unk_id = vocab[UNK_TOKEN]
        self.special_ids = {t: vocab[t] for t in SPECIAL_TOKENS if t in vocab}
        self.special_tokens = check_special_tokens(special_tokens, vocab, vocab_file)
        # The literals, escaped for RE2 and tried longest first, as FullTokenizer's re.split does.
        self._special_pattern = "|".join(map(_re2_literal, longest_first(self.special_tokens)))
        self._special_token_ids = tuple((t, vocab[t]) for t in self.special_tokens)
        tables = code_point_tables()
        self._layout = tables["layout"]
        self._props = tf.constant(tables["props"])
        if do_lower_case:
            self._lower_delta = tf.constant(tables["lower_delta"])
            self._expansion_rows = tf.constant(tables["expansion_rows"])
            self._full = tf.RaggedTensor.from_row_splits(*map(tf.constant, tables["full"]))
            self._stripped = tf.RaggedTensor.from_row_splits(*map(tf.constant, tables["stripped"]))
        # Words arrive normalized and split; FastWordpieceTokenizer only matches pieces. Words
        # over MAX_INPUT_CHARS_PER_WORD characters are replaced by [UNK] before it, so a limit of
        # 4 bytes a character never cuts one.
        self._wordpiece = tf_text.FastWordpieceTokenizer(
            vocab=list(vocab),
            suffix_indicator="##",
            max_bytes_per_word=4 * MAX_INPUT_CHARS_PER_WORD,
            token_out_type=tf.int32,
            unknown_token=UNK_TOKEN,
            no_pretokenization=True,
        )
        # Printable ASCII with tab, newline and CR needs no cleaning and no NFD, and on it
        # tensorflow_text's own whitespace and punctuation splitting equals the original's (the
        # same ASCII punctuation ranges; only the dropped controls differ, and they are excluded).
        # Such rows skip the code-point pipeline, which is most rows of most corpora.
        self._ascii_wordpiece = tf_text.FastWordpieceTokenizer(
            vocab=list(vocab),
            suffix_indicator="##",
            max_bytes_per_word=MAX_INPUT_CHARS_PER_WORD,
            token_out_type=tf.int32,
            unknown_token=UNK_TOKEN,
            no_pretokenization=False,
        )
        # A tf.function method holds its instance weakly, so `GraphTokenizer(vocab).tokenize(x)`
        # would find its tokenizer collected mid-call; these bindings hold it for as long as they live.
        for name in ("tokenize", "tokenize_with_offsets", "split_words"):
            method = getattr(type(self), name)
            setattr(
                self,
                name,
                tf.function(
                    functools.partial(method.python_function, self),
                    input_signature=method.input_signature,
                    autograph=False,
                ),
            )

    # No AutoGraph, as for the exported graphs (export_graph.serving_function): what branches on
    # a tensor here is a tf.cond; the Python ifs test settings (do_lower_case, with_offsets).
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def tokenize(self, texts):
        """Tokenizes a batch of UTF-8 strings into a RaggedTensor of int32 ids [batch, (tokens)]."""
        return self._tokenize(texts, with_offsets=False)[0]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def tokenize_with_offsets(self, texts):
        """Like tokenize, plus each token's [start, end) byte offsets into its input string.

        Returns (ids int32, starts int64, ends int64), RaggedTensors [batch, (tokens)]. A piece of a
        normalized word maps back to the source characters it came from; a word that became [UNK]
        spans the whole word. Dropped characters inside a span stay inside it. A special token's
        literal spans itself.
        """
        return self._tokenize(texts, with_offsets=True)

    def _tokenize(self, texts, with_offsets):
        """_plain_or, or with special tokens on, _plain_or between their literals."""
        # A graph that calls these functions does not check its inputs' shapes against their
        # signature, and the pipeline would take texts of any rank to a wrong answer.
        texts = tf.ensure_shape(texts, [None])
        if not self.special_tokens:
            return self._plain_or(texts, with_offsets)  # the graph without the option
        return self._around_special_tokens(texts, self._plain_or, _literal_ids, with_offsets)

    def _around_special_tokens(self, texts, tokenize, tokenize_literals, with_offsets):
        """Splits `texts` at the special tokens' literals and joins the parts' results in order.

        `tokenize(parts, with_offsets)` tokenizes the text between literals, each part as a text of
        its own; `tokenize_literals(literals, ids, with_offsets)` gives the literals' results. Both
        return tuples of RaggedTensors [parts, (tokens)], offsets (with_offsets) into each part.
        """
        pattern = self._special_pattern
        # RegexSplitWithOffsets reads each string up to its first NUL byte. NUL and U+0001 are one
        # byte each and both dropped by cleaning, and no literal holds either, so U+0001 stands
        # in for NUL with the same tokens and offsets.
        texts = tf.strings.regex_replace(texts, "\\x00", "\x01")
        # The literals are valid UTF-8, so no match starts or ends inside a character, and
        # decoding each part on its own equals decoding the text (an invalid sequence never takes
        # in an ASCII byte). Empty parts are left out; they have no tokens.
        parts, part_starts, _ = tf_text.regex_split_with_offsets(texts, pattern, pattern)
        flat = parts.flat_values
        # A part equal to a literal is one: any occurrence of a literal was split off.
        ids = tf.fill(tf.shape(flat), -1)
        for token, token_id in self._special_token_ids:
            ids = tf.where(tf.equal(flat, token), token_id, ids)
        is_literal = ids >= 0
        other_rows = tf.where(~is_literal)[:, 0]
        literal_rows = tf.where(is_literal)[:, 0]
        results = _in_input_order(
            tokenize(tf.gather(flat, other_rows), with_offsets),
            tokenize_literals(
                tf.gather(flat, literal_rows), tf.gather(ids, literal_rows), with_offsets
            ),
            other_rows,
            literal_rows,
        )
        if with_offsets:
            # Offsets into a part become offsets into its text.
            ids, starts, ends = results
            results = (ids,) + tuple(
                r.with_flat_values(
                    r.flat_values + tf.gather(part_starts.flat_values, r.value_rowids())
                )
                for r in (starts, ends)
            )
        return tuple(
            tf.RaggedTensor.from_row_splits(r, parts.row_splits, validate=False).merge_dims(1, 2)
            for r in results
        )

    def _plain_or(self, texts, with_offsets):
        """Tokenizes plain-ASCII strings on the fast path and the others segment by segment."""
        plain = _is_plain(texts)
        # A batch of plain rows skips the other pipeline and the reordering: their hundreds of ops
        # cost as much as the plain path even on no rows, and visited as the dead ops of a lowered
        # cond they still took 0.29 of the tokenizer's 0.49 ms a call (benchmarks/RESULTS.md,
        # "Inference: what each export choice buys"). On the CPU, whose kernels its string ops
        # have: an unlowered If runs its whole branch on the If's device.
        with tf.device("/CPU:0"):
            return cond_as_call(
                tf.reduce_all(plain),
                lambda: self._plain(texts, with_offsets),
                lambda: self._mixed(texts, plain, self._tokenize_by_segment, with_offsets),
            )

    def _plain(self, texts, with_offsets):
        """Tokenizes printable-ASCII strings (tab, newline and CR allowed) with tensorflow_text alone."""
        if self.do_lower_case:
            texts = tf.strings.lower(texts)  # ASCII-only, so byte offsets are unchanged
        if with_offsets:
            return self._ascii_wordpiece.tokenize_with_offsets(texts)
        return (self._ascii_wordpiece.tokenize(texts),)

    def _mixed(self, texts, plain, tokenize_other, with_offsets):
        """Tokenizes the `plain` rows with _plain and the others with `tokenize_other`, in order."""
        plain_rows = tf.where(plain)[:, 0]
        other_rows = tf.where(~plain)[:, 0]
        plain_results = self._plain(tf.gather(texts, plain_rows), with_offsets)
        other_results = tokenize_other(tf.gather(texts, other_rows), with_offsets)
        return _in_input_order(plain_results, other_results, plain_rows, other_rows)

    def _tokenize_by_segment(self, texts, with_offsets):
        """Tokenizes each space-separated segment on its own, so plain segments stay on the fast path.

        Exact because a space ends a word, a Final_Sigma context and an NFD run alike.
        """
        segments = tf.strings.split(texts, sep=" ")
        # These texts are not all plain (_plain_or sent them here), so neither are their segments.
        flat = segments.flat_values
        results = self._mixed(flat, _is_plain(flat), self._tokenize_general, with_offsets)
        if with_offsets:
            # A segment starts after the earlier segments of its text and one space after each.
            lengths = tf.cast(tf.strings.length(segments.flat_values), tf.int64) + 1
            position = tf.math.cumsum(lengths, exclusive=True)
            first_of_row = tf.gather(segments.row_starts(), segments.value_rowids())
            segment_start = position - tf.gather(position, first_of_row)
            ids, starts, ends = results
            results = (ids,) + tuple(
                r.with_flat_values(r.flat_values + tf.gather(segment_start, r.value_rowids()))
                for r in (starts, ends)
            )
        return tuple(
            tf.RaggedTensor.from_row_splits(r, segments.row_splits).merge_dims(1, 2)
            for r in results
        )

    def _tokenize_general(self, texts, with_offsets):
        """The code-point pipeline, for any text."""
        words, word_rows, spans = self._words(texts, with_offsets)
        if with_offsets:
            pieces, piece_starts, piece_ends = self._wordpiece.tokenize_with_offsets(words)
            results = (pieces,) + _source_offsets(piece_starts, piece_ends, spans)
        else:
            results = (self._wordpiece.tokenize(words),)
        nrows = tf.size(texts, tf.int64)
        return tuple(
            tf.RaggedTensor.from_value_rowids(r, word_rows, nrows=nrows).merge_dims(1, 2)
            for r in results
        )

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def split_words(self, texts):
        """Returns the normalized words, the input of WordPiece, as a RaggedTensor [batch, (words)].

        With special tokens on, each literal is a word of its own, as in BasicTokenizer.
        """

        def split(texts, with_offsets):
            words, word_rows, _ = self._words(texts, with_offsets=False)
            nrows = tf.size(texts, tf.int64)
            return (tf.RaggedTensor.from_value_rowids(words, word_rows, nrows=nrows),)

        if not self.special_tokens:
            return split(texts, with_offsets=False)[0]
        return self._around_special_tokens(texts, split, _literal_words, with_offsets=False)[0]

    def _table_rows(self, chars):
        """Maps code points to rows of the lookup tables (see code_point_tables)."""
        main_end, tail_start, tail_end = self._layout
        in_tail = (chars >= tail_start) & (chars < tail_end)
        default_row = main_end + tail_end - tail_start
        return tf.where(
            chars < main_end, chars, tf.where(in_tail, chars - tail_start + main_end, default_row)
        )

    def _words(self, texts, with_offsets):
        """Cleans, splits and normalizes `texts` into words for WordPiece.

        Returns (words [W] string, row of each word [W], spans). With offsets, spans describes the
        words' characters for _source_offsets; otherwise it is None.
        """
        code_points, byte_starts = tf.strings.unicode_decode_with_offsets(
            texts, "UTF-8", errors="replace", replacement_char=0xFFFD
        )
        chars = code_points.flat_values
        rows = code_points.value_rowids()
        # Every per-character array moves with `chars` through filtering and expansion.
        aligned = {"rows": rows}
        if with_offsets:
            starts = byte_starts.flat_values
            same_row_next = tf.concat([tf.equal(rows[1:], rows[:-1]), [False]], axis=0)
            text_ends = tf.gather(tf.cast(tf.strings.length(texts), tf.int64), rows)
            aligned["start"] = starts
            aligned["end"] = tf.where(
                same_row_next, tf.concat([starts[1:], [0]], axis=0), text_ends
            )
        table_rows = self._table_rows(chars)
        props = tf.gather(self._props, table_rows)
        keep = ~_has(props, _DROP)
        chars, props, table_rows = (tf.boolean_mask(t, keep) for t in (chars, props, table_rows))
        aligned = {k: tf.boolean_mask(v, keep) for k, v in aligned.items()}
        aligned["separator"] = _has(props, _SEPARATOR)
        aligned["cjk"] = _has(props, _CJK)
        if self.do_lower_case:
            exact = tf.reduce_any(_has(props, _EXACT_ONLY))
            chars, props, aligned = tf.cond(
                exact,
                lambda: self._lower_exactly(chars, props, aligned),
                lambda: self._lower_fast(chars, props, table_rows, aligned),
            )
        rows, separator, cjk = aligned["rows"], aligned["separator"], aligned["cjk"]
        alone = _has(props, _PUNCTUATION) | cjk  # characters that form a word of their own

        previous_ends_word = tf.concat([[True], (separator | alone)[:-1]], axis=0)
        word_start = _row_changes(rows) | previous_ends_word | alone
        in_word = ~separator
        chars, rows, word_start = (tf.boolean_mask(t, in_word) for t in (chars, rows, word_start))
        word_ids = tf.math.cumsum(tf.cast(word_start, tf.int64)) - 1
        words = tf.RaggedTensor.from_value_rowids(chars, word_ids)
        word_rows = tf.boolean_mask(rows, word_start)
        encoded = tf.strings.unicode_encode(words, "UTF-8")
        # The original gives [UNK] to a word of over 200 characters; the vocabulary holds "[UNK]",
        # so that string tokenizes to exactly the [UNK] id.
        too_long = words.row_lengths() > MAX_INPUT_CHARS_PER_WORD
        encoded = tf.where(too_long, tf.constant(UNK_TOKEN), encoded)
        spans = None
        if with_offsets:
            spans = {
                "words": words,
                "too_long": too_long,
                "start": tf.boolean_mask(aligned["start"], in_word),
                "end": tf.boolean_mask(aligned["end"], in_word),
            }
        return encoded, word_rows, spans

    def _lower_fast(self, chars, props, table_rows, aligned):
        """lower+NFD+strip as a per-character map, valid when no character needs _lower_exactly.

        NFD may reorder combining marks, but without a kept mark of nonzero class (and without a
        capital sigma) only dropped marks move, so mapping character by character is exact.
        """
        keep = ~_has(props, _STRIPPED_EMPTY)
        chars, props, table_rows = (tf.boolean_mask(t, keep) for t in (chars, props, table_rows))
        aligned = {k: tf.boolean_mask(v, keep) for k, v in aligned.items()}
        chars = chars + tf.gather(self._lower_delta, table_rows)
        multi = _has(props, _STRIPPED_MULTI)

        def expand():
            row = tf.bitwise.right_shift(tf.gather(self._expansion_rows, table_rows), 16) - 1
            return self._expand(self._stripped, row, multi, chars, aligned)

        chars, aligned = tf.cond(tf.reduce_any(multi), expand, lambda: (chars, aligned))
        return chars, tf.gather(self._props, self._table_rows(chars)), aligned

    def _lower_exactly(self, chars, props, aligned):
        """str.lower() with final sigma, NFD with canonical reordering, then drops Mn."""
        rows = aligned["rows"]
        chars = self._final_sigma(chars, rows, props)
        row = (
            tf.bitwise.bitwise_and(tf.gather(self._expansion_rows, self._table_rows(chars)), 0xFFFF)
            - 1
        )
        chars, aligned = self._expand(self._full, row, row >= 0, chars, aligned)
        props = tf.gather(self._props, self._table_rows(chars))

        # NFD sorts each run of combining marks by combining class; the sort runs only when some
        # mark follows one of a higher class.
        ccc = tf.bitwise.bitwise_and(props, _CCC_MASK)
        needs_reordering = tf.reduce_any((ccc[1:] > 0) & (ccc[:-1] > ccc[1:]))

        def reorder():
            run = tf.math.cumsum(
                tf.cast(tf.equal(ccc, 0) | _row_changes(aligned["rows"]), tf.int64)
            )
            order = tf.argsort(run * 256 + tf.cast(ccc, tf.int64), stable=True)
            return (
                tf.gather(chars, order),
                tf.gather(props, order),
                {k: tf.gather(v, order) for k, v in aligned.items()},
            )

        chars, props, aligned = tf.cond(needs_reordering, reorder, lambda: (chars, props, aligned))
        keep = ~_has(props, _MARK_NONSPACING)
        return (
            tf.boolean_mask(chars, keep),
            tf.boolean_mask(props, keep),
            {k: tf.boolean_mask(v, keep) for k, v in aligned.items()},
        )

    @staticmethod
    def _expand(expansions, row, expanded, chars, aligned):
        """Replaces chars[i] by expansions[row[i]] where expanded[i]; repeats `aligned` to match."""
        safe_row = tf.maximum(row, 0)
        lengths = tf.where(expanded, tf.gather(expansions.row_lengths(), safe_row), 1)
        source = tf.repeat(tf.range(tf.size(chars, tf.int64)), lengths)
        offset = tf.range(tf.size(source, tf.int64)) - tf.gather(
            tf.math.cumsum(lengths, exclusive=True), source
        )
        start = tf.gather(expansions.row_starts(), safe_row)
        new_chars = tf.where(
            tf.gather(expanded, source),
            tf.gather(expansions.flat_values, tf.gather(start, source) + offset),
            tf.gather(chars, source),
        )
        return new_chars, {k: tf.gather(v, source) for k, v in aligned.items()}

    def _final_sigma(self, chars, rows, props):
        """Turns each capital sigma in str.lower()'s Final_Sigma context into U+03C2.

        The context: the nearest character before it that is not case-ignorable is cased, and the
        nearest one after it is not. Python lower-cases whitespace-separated words, but separators
        and CJK ideographs are neither cased nor case-ignorable, so they end the scan by
        themselves; only row edges need checking. Other capital sigmas are left for the
        expansion table, which maps them to U+03C3.
        """
        sigma_positions = tf.where(tf.equal(chars, _CAPITAL_SIGMA))[:, 0]

        def replace():
            relevant = ~_has(props, _CASE_IGNORABLE)
            relevant_positions = tf.where(relevant)[:, 0]
            num_relevant = tf.size(relevant_positions, tf.int64)
            # The sigma is relevant itself, at index k among the relevant characters.
            k = tf.gather(
                tf.math.cumsum(tf.cast(relevant, tf.int64), exclusive=True), sigma_positions
            )
            sigma_rows = tf.gather(rows, sigma_positions)
            cased = _has(props, _CASED)
            previous = tf.gather(relevant_positions, tf.maximum(k - 1, 0))
            previous_cased = (
                (k > 0)
                & tf.equal(tf.gather(rows, previous), sigma_rows)
                & tf.gather(cased, previous)
            )
            following = tf.gather(relevant_positions, tf.minimum(k + 1, num_relevant - 1))
            following_cased = (
                (k + 1 < num_relevant)
                & tf.equal(tf.gather(rows, following), sigma_rows)
                & tf.gather(cased, following)
            )
            final = tf.boolean_mask(sigma_positions, previous_cased & ~following_cased)
            return tf.tensor_scatter_nd_update(
                chars, tf.expand_dims(final, 1), tf.fill(tf.shape(final), _FINAL_SIGMA)
            )

        return tf.cond(tf.size(sigma_positions) > 0, replace, lambda: chars)


def _re2_literal(text):
    """`text` as an RE2 pattern that matches it literally."""
    return "".join(c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):X}}}" for c in text)


def _literal_ids(literals, ids, with_offsets):
    """A special token's literal as a one-token result: its id, spanning the whole literal."""
    one_each = tf.range(tf.size(ids, tf.int64) + 1)
    results = (tf.RaggedTensor.from_row_splits(ids, one_each, validate=False),)
    if with_offsets:
        lengths = tf.cast(tf.strings.length(literals), tf.int64)
        results += (
            tf.RaggedTensor.from_row_splits(tf.zeros_like(lengths), one_each, validate=False),
            tf.RaggedTensor.from_row_splits(lengths, one_each, validate=False),
        )
    return results


def _literal_words(literals, ids, with_offsets):
    """A special token's literal as split_words gives it: one word, itself."""
    del ids, with_offsets
    one_each = tf.range(tf.size(literals, tf.int64) + 1)
    return (tf.RaggedTensor.from_row_splits(literals, one_each, validate=False),)


def _in_input_order(first, second, first_rows, second_rows):
    """Joins two tuples of per-row results, for rows `first_rows` and `second_rows`, in row order."""
    order = tf.math.invert_permutation(tf.concat([first_rows, second_rows], axis=0))
    return tuple(tf.gather(tf.concat([a, b], axis=0), order) for a, b in zip(first, second))


def _is_plain(texts):
    """Whether each string is printable ASCII (tab, newline and CR allowed): the fast path's rows."""
    return tf.strings.regex_full_match(texts, "[\\x20-\\x7e\\t\\n\\r]*")


def _has(props, flag):
    """True where the packed code-point properties carry `flag`."""
    return tf.not_equal(tf.bitwise.bitwise_and(props, flag), 0)


def _source_offsets(piece_starts, piece_ends, spans):
    """Maps WordPiece byte offsets inside normalized words back to byte offsets in the source text.

    `piece_starts`/`piece_ends` are [W, (pieces)] offsets into each normalized word; `spans` holds
    the words (code points), which words became [UNK], and each word character's source span.
    Returns (starts, ends) as [W, (pieces)] RaggedTensors.
    """
    words = spans["words"]
    chars = words.flat_values
    # Position of every normalized character in the concatenation of all words' UTF-8.
    utf8_length = (
        1
        + tf.cast(chars >= 0x80, tf.int64)
        + tf.cast(chars >= 0x800, tf.int64)
        + tf.cast(chars >= 0x10000, tf.int64)
    )
    position = tf.math.cumsum(utf8_length, exclusive=True)
    piece_word = piece_starts.value_rowids()
    word_first = words.row_starts()
    word_last = words.row_limits() - 1
    base = tf.gather(
        tf.gather(position, tf.minimum(word_first, tf.size(position, tf.int64) - 1)), piece_word
    )

    def char_at(byte_position):
        return (
            tf.searchsorted(
                position[tf.newaxis], byte_position[tf.newaxis], side="right", out_type=tf.int64
            )[0]
            - 1
        )

    first_char = char_at(base + piece_starts.flat_values)
    last_char = char_at(base + piece_ends.flat_values - 1)
    # An [UNK] for a word over 200 characters covers the whole word.
    whole_word = tf.gather(spans["too_long"], piece_word)
    first_char = tf.where(whole_word, tf.gather(word_first, piece_word), first_char)
    last_char = tf.where(whole_word, tf.gather(word_last, piece_word), last_char)
    # NFD's canonical reordering can move a character before one that precedes it in the source,
    # so a piece spans from the smallest start to the largest end of its characters.
    characters = tf.ragged.range(first_char, last_char + 1)
    return (
        piece_starts.with_flat_values(tf.reduce_min(tf.gather(spans["start"], characters), axis=1)),
        piece_ends.with_flat_values(tf.reduce_max(tf.gather(spans["end"], characters), axis=1)),
    )


def _row_changes(rows):
    """True where an element's row differs from the previous element's (and for the first)."""
    return tf.concat([[True], tf.not_equal(rows[1:], rows[:-1])], axis=0)
