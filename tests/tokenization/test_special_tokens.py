"""The tokenizers' `special_tokens` option: literals such as "[MASK]" in the text become one token.

Off by default (the original splits "[MASK]" into "[", "mask", "]"); on for fill-mask. The reference
is Hugging Face `tokenizers`' BertWordPieceTokenizer, which matches its five special tokens in raw
text, as written, before normalization. FullTokenizer, CachedTokenizer and GraphTokenizer must agree
with each other on every input, and with `tokenizers` where its rules agree with the original's
(not on Greek final sigma or private-use characters: see test_graph_tokenizer.py).
"""

import json
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf
from helpers import hf_wordpiece_reference, saved_model_ops_script
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bert_tf.tokenization.graph_tokenizer import GraphTokenizer
from bert_tf.tokenization.python_tokenizer import BasicTokenizer, CachedTokenizer, FullTokenizer
from bert_tf.tokenization.tokenizer_rules import SPECIAL_TOKENS, VocabError

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

MASK_SEP = ("[MASK]", "[SEP]")

# Texts with "[MASK]" and "[SEP]" literals (and near-misses), and none of [CLS], [PAD], [UNK].
TEXTS = [
    "",
    "[MASK]",
    "paris is the [MASK].",
    "Paris is the [MASK] of France.",
    "x[MASK]y",
    "[MASK][MASK]",
    "[MASK] [MASK]  [MASK]",
    "[MASK]at the start, at the end[MASK]",
    "  [MASK]  ",
    "[[MASK]]",
    "[MASK]]]",
    "[[MASK",
    "[mask] stays text, so do [Mask] and [MASK ] and [ MASK]",
    "[MASKED] [MAS] MASK]",
    "first sentence. [SEP] second sentence.",
    "a[SEP]b[MASK]c[SEP]",
    "[SEP][MASK][SEP]",
    "naïve café[MASK]Ångström résumé",
    "ÉCOLE[MASK]Été ÀÉÎÕÜ[SEP]ß",
    "中文[MASK]字符 日本語の[MASK]テキスト 한국어[SEP]텍스트",
    "emoji 😀[MASK]👍🏽 🇯🇵",
    "a\u0301[MASK]\u0301b combining marks around it",
    "ﬁne[MASK]ﬂow ＡＢＣ[SEP]１２３",
    "… — ‘[MASK]’ “[MASK]” «[SEP]» ¿[MASK]?",
    "tab\t[MASK]\nnewline\r\n[SEP]\u3000\u00a0[MASK]\u00a0",
    "[MA\x00SK] nul inside the literal, and nul\x00[MASK] beside it",
    "zero\u200bwidth[MASK]\u200djoiner \ufeff[MASK]",
    "control\x01[MASK]\x7fchars",
    "$100 ^[MASK]^ `[SEP]` ~[MASK]~ |pipe| {[MASK]} <[SEP]>",
    "y" * 101 + "[MASK]" + "z" * 101,
    "x" * 100 + "[MASK]" + "ab" * 60,
    "y" * 201 + "[MASK]" + "z" * 200,
    "replacement \ufffd[MASK]\ufffd char",
    "the [MASK] " * 200 + "end",
    "long text without the literal, " * 50,
]

# Where `tokenizers` deviates from the original (final sigma), as in test_graph_tokenizer.py.
GREEK = ["ΟΔΟΣ[MASK]ΣΑΣ", "ΑΣ[MASK]"]


@pytest.fixture(scope="module", params=[True, False], ids=["uncased", "cased"])
def tokenizers_with_option(request, real_vocab):
    """(FullTokenizer, CachedTokenizer, tiny-cache CachedTokenizer, GraphTokenizer), the option on."""
    do_lower_case = request.param
    return (
        FullTokenizer(real_vocab, do_lower_case, special_tokens=MASK_SEP),
        CachedTokenizer(real_vocab, do_lower_case, special_tokens=MASK_SEP),
        CachedTokenizer(real_vocab, do_lower_case, max_cached_words=3, special_tokens=MASK_SEP),
        GraphTokenizer(real_vocab, do_lower_case, special_tokens=MASK_SEP),
    )


@pytest.fixture(scope="module")
def hf_reference(real_vocab):
    return {
        do_lower_case: hf_wordpiece_reference(real_vocab, lowercase=do_lower_case)
        for do_lower_case in (True, False)
    }


def graph_ids(graph, texts):
    return graph.tokenize(tf.constant(list(texts), tf.string)).to_list()


def cached_lines_ids(cached, texts):
    flat, splits = cached.encode_lines(texts)
    return [flat[a:b].tolist() for a, b in zip(splits, splits[1:])]


def assert_all_agree(tokenizers, texts):
    full, cached, tiny_cache, graph = tokenizers
    want = [full.encode(t) for t in texts]
    for cached_tokenizer in (cached, tiny_cache):
        assert [cached_tokenizer.encode(t) for t in texts] == want
        assert [cached_tokenizer.tokenize(t) for t in texts] == [full.tokenize(t) for t in texts]
        assert cached_lines_ids(cached_tokenizer, texts) == want
    got = graph_ids(graph, texts)
    for text, ids, expected in zip(texts, got, want):
        assert ids == expected, (
            f"{text!r}: {full.convert_ids_to_tokens(ids)} != {full.convert_ids_to_tokens(expected)}"
        )
    ids, _, _ = graph.tokenize_with_offsets(tf.constant(list(texts), tf.string))
    assert ids.to_list() == want


def test_literal_is_one_token(tokenizers_with_option):
    full, cached, _, graph = tokenizers_with_option
    mask, sep = full.vocab["[MASK]"], full.vocab["[SEP]"]
    for tokenizer in (full, cached):
        assert tokenizer.tokenize("paris is the [MASK].") == ["paris", "is", "the", "[MASK]", "."]
        assert tokenizer.tokenize("x[MASK]y") == ["x", "[MASK]", "y"]
        assert tokenizer.tokenize("[MASK][MASK]") == ["[MASK]", "[MASK]"]
        assert tokenizer.tokenize("a[SEP]b") == ["a", "[SEP]", "b"]
        # Other special tokens are not in the option: text, as the original has it.
        assert tokenizer.tokenize("[CLS]")[0] == "["
    assert graph_ids(graph, ["x[MASK]y", "[SEP][MASK]"]) == [
        [full.vocab["x"], mask, full.vocab["y"]],
        [sep, mask],
    ]


def test_literal_is_case_sensitive_and_never_lower_cased(real_vocab):
    uncased = FullTokenizer(real_vocab, do_lower_case=True, special_tokens=MASK_SEP)
    graph = GraphTokenizer(real_vocab, do_lower_case=True, special_tokens=MASK_SEP)
    assert uncased.tokenize("The [MASK] IS [SEP]") == ["the", "[MASK]", "is", "[SEP]"]
    # Only the literal as written matches; lower-cased text is not looked at again.
    for text in ("[mask]", "[Mask]", "[sep]"):
        assert uncased.tokenize(text) == ["[", text[1:-1].lower(), "]"]
    assert graph_ids(graph, ["[mask]", "The [MASK]"]) == [
        uncased.encode("[mask]"),
        uncased.encode("The [MASK]"),
    ]


def test_option_off_splits_the_literal_as_the_original(real_vocab):
    default_full, empty_option = (
        FullTokenizer(real_vocab),
        FullTokenizer(real_vocab, special_tokens=()),
    )
    graph = GraphTokenizer(real_vocab)
    text = "paris is the [MASK]. [SEP]"
    want = ["paris", "is", "the", "[", "mask", "]", ".", "[", "sep", "]"]
    for tokenizer in (default_full, empty_option, CachedTokenizer(real_vocab)):
        assert tokenizer.tokenize(text) == want
    assert BasicTokenizer().tokenize(text) == want
    assert graph_ids(graph, [text]) == [default_full.convert_tokens_to_ids(want)]
    cased = FullTokenizer(real_vocab, do_lower_case=False)
    assert cased.tokenize("[MASK]") == ["[", "[UNK]", "]"]
    assert default_full.special_tokens == graph.special_tokens == ()


def test_option_off_keeps_the_graph(real_vocab):
    # With the option off, nothing of it enters the graph (the same ops as before it existed).
    def ops(tokenizer, method):
        graph_def = getattr(tokenizer, method).get_concrete_function().graph.as_graph_def()
        names = {n.op for n in graph_def.node}
        for function in graph_def.library.function:
            names |= {n.op for n in function.node_def}
        return names

    off, on = GraphTokenizer(real_vocab), GraphTokenizer(real_vocab, special_tokens=MASK_SEP)
    for method in ("tokenize", "tokenize_with_offsets", "split_words"):
        assert not {"RegexSplitWithOffsets", "StaticRegexReplace"} & ops(off, method)
        assert "RegexSplitWithOffsets" in ops(on, method)


def test_all_three_tokenizers_agree(tokenizers_with_option):
    assert_all_agree(tokenizers_with_option, TEXTS + GREEK)
    # One row at a time: nothing leaks across rows.
    full, _, _, graph = tokenizers_with_option
    for text in TEXTS[:12] + GREEK:
        assert graph_ids(graph, [text]) == [full.encode(text)], repr(text)


def test_bytes_and_invalid_utf8(tokenizers_with_option):
    full, cached, _, graph = tokenizers_with_option
    blobs = [
        b"\xe4[MASK]\xff",
        b"a\xe4\xb8[SEP]b",
        b"[MA\xffSK]",
        b"\xc3[MASK]\xa9",
        b"caf\xc3\xa9[MASK]",
    ]
    assert_all_agree(tokenizers_with_option, blobs)
    assert full.tokenize(b"\xe4[MASK]\xff") == ["[MASK]"]
    assert full.tokenize(b"[MA\xffSK]")[0] == "["


def test_matches_hugging_face_tokenizers(tokenizers_with_option, hf_reference):
    full, _, _, graph = tokenizers_with_option
    reference = hf_reference[full.do_lower_case]
    want = [reference.encode(t, add_special_tokens=False).ids for t in TEXTS]
    assert [full.encode(t) for t in TEXTS] == want
    assert graph_ids(graph, TEXTS) == want


def test_all_five_special_tokens_match_hugging_face(real_vocab, hf_reference):
    # BertWordPieceTokenizer matches all five special tokens; with all five on, so do these.
    texts = TEXTS + ["[CLS] special [SEP] tokens [MASK] are [PAD] text [UNK]", "[CLS][PAD][UNK]x"]
    for do_lower_case in (True, False):
        full = FullTokenizer(real_vocab, do_lower_case, special_tokens=SPECIAL_TOKENS)
        cached = CachedTokenizer(real_vocab, do_lower_case, special_tokens=SPECIAL_TOKENS)
        graph = GraphTokenizer(real_vocab, do_lower_case, special_tokens=SPECIAL_TOKENS)
        want = [hf_reference[do_lower_case].encode(t, add_special_tokens=False).ids for t in texts]
        assert [full.encode(t) for t in texts] == want
        assert [cached.encode(t) for t in texts] == want
        assert graph_ids(graph, texts) == want


def test_overlapping_literals_match_leftmost_then_longest(real_vocab, hf_reference):
    # "[" and "[MASK]" both start at the "[" of "[MASK]": the longer one wins, as in `tokenizers`.
    texts = ["x[MASK]y", "[[MASK]", "[MASK[", "[ [MASK]"]
    full = FullTokenizer(real_vocab, special_tokens=("[", "[MASK]"))
    graph = GraphTokenizer(real_vocab, special_tokens=("[", "[MASK]"))
    assert full.tokenize("x[MASK]y") == ["x", "[MASK]", "y"]
    assert full.tokenize("[MASK[") == ["[", "mask", "["]
    assert graph_ids(graph, texts) == [full.encode(t) for t in texts]
    assert [
        CachedTokenizer(real_vocab, special_tokens=("[", "[MASK]")).encode(t) for t in texts
    ] == [full.encode(t) for t in texts]
    reference = hf_wordpiece_reference(real_vocab)
    reference.add_special_tokens(["["])
    assert [reference.encode(t, add_special_tokens=False).ids for t in texts] == [
        full.encode(t) for t in texts
    ]


def test_offsets_span_the_literal(tokenizers_with_option):
    full, _, _, graph = tokenizers_with_option
    texts = [
        "paris is the [MASK].",
        "x[MASK]y",
        "é[SEP]中[MASK]",
        "nul\x00[MASK]\x00x",
        "[MASK][MASK]",
    ]
    ids, starts, ends = graph.tokenize_with_offsets(tf.constant(texts))
    for text, row_ids, row_starts, row_ends in zip(
        texts, ids.to_list(), starts.to_list(), ends.to_list()
    ):
        assert row_ids == full.encode(text)
        data = text.encode("utf-8")
        for token, start, end in zip(full.convert_ids_to_tokens(row_ids), row_starts, row_ends):
            if token in MASK_SEP:
                assert data[start:end] == token.encode()
            assert 0 <= start < end <= len(data)
    assert starts.to_list()[1] == [0, 1, 7] and ends.to_list()[1] == [1, 7, 8]


def test_split_words_keeps_the_literal(tokenizers_with_option):
    full, _, _, graph = tokenizers_with_option
    words = graph.split_words(tf.constant(TEXTS)).to_list()
    for text, row in zip(TEXTS, words):
        # split_words gives a word over 200 characters as "[UNK]", what WordPiece makes of it.
        want = [w if len(w) <= 200 else "[UNK]" for w in full.basic_tokenizer.tokenize(text)]
        assert [w.decode("utf-8") for w in row] == want, repr(text)


def test_basic_tokenizer_option(real_vocab):
    basic = BasicTokenizer(do_lower_case=True, special_tokens=MASK_SEP)
    assert basic.tokenize("The [MASK]ed Café[SEP]") == ["the", "[MASK]", "ed", "cafe", "[SEP]"]
    assert BasicTokenizer(do_lower_case=True).tokenize("[MASK]") == ["[", "mask", "]"]


def test_unknown_special_token_is_refused(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n")
    for make in (FullTokenizer, CachedTokenizer, GraphTokenizer):
        with pytest.raises(VocabError, match=r"special token '\[MASK\]' is not in the vocabulary"):
            make(str(vocab), special_tokens=("[SEP]", "[MASK]"))
        with pytest.raises(TypeError, match="sequence of strings"):
            make(str(vocab), special_tokens="[SEP]")
        with pytest.raises(ValueError, match="non-empty string"):
            make(str(vocab), special_tokens=("",))
    with pytest.raises(ValueError, match="cleaning drops"):
        BasicTokenizer(special_tokens=("[SEP\x01]",))
    # Duplicates are dropped; a token in the vocabulary is accepted.
    assert FullTokenizer(str(vocab), special_tokens=["[SEP]", "[SEP]"]).special_tokens == ("[SEP]",)


def test_saved_model_with_the_option(tmp_path, real_vocab):
    # The option's graph uses only TensorFlow core and tensorflow_text ops, and loads on its own.
    module = tf.Module()
    module.tokenizer = GraphTokenizer(real_vocab, special_tokens=MASK_SEP)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def serve(texts):
        ids = module.tokenizer.tokenize(texts)
        return {"ids": ids.to_tensor(), "lengths": ids.row_lengths()}

    export_dir = str(tmp_path / "tokenizer" / "1")
    tf.saved_model.save(module, export_dir, signatures={"serving_default": serve})
    texts = ["Paris is the [MASK].", "x[MASK]y [SEP] ÉCOLE", "[mask]", ""]
    script = saved_model_ops_script(export_dir) + textwrap.dedent(
        f"""
        fn = tf.saved_model.load({export_dir!r}).signatures["serving_default"]
        out = fn(tf.constant({texts!r}))
        ids, lengths = out["ids"].numpy().tolist(), out["lengths"].numpy().tolist()
        print(json.dumps({{"unknown": sorted(ops - core - text), "text": sorted(text),
                          "ids": [row[:n] for row, n in zip(ids, lengths)]}}))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["unknown"] == []
    assert set(report["text"]) <= {"FastWordpieceTokenizeWithOffsets", "RegexSplitWithOffsets"}
    full = FullTokenizer(real_vocab, special_tokens=MASK_SEP)
    assert report["ids"] == [full.encode(t) for t in texts]


# Random text with literals, near-misses and the characters that matter around them.
_PIECES = st.one_of(
    st.sampled_from(["[MASK]", "[SEP]", "[mask]", "[MA", "SK]", "[", "]", " ", "\x00", "\u0301"]),
    st.text(alphabet=st.characters(exclude_categories=["Cs", "Co", "Cn"]), max_size=12),
    st.text(alphabet="aAéÉΣσ中 \t[]MASKSEP.", max_size=12),
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.lists(_PIECES, max_size=8).map("".join), min_size=1, max_size=6))
def test_property_all_three_tokenizers_agree(tokenizers_with_option, texts):
    assert_all_agree(tokenizers_with_option, texts)
