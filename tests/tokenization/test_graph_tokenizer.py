"""Parity of FullTokenizer, GraphTokenizer and Hugging Face `tokenizers` on the real uncased vocab.

References:
- FullTokenizer implements the original BERT rules and is the reference for GraphTokenizer on
  every input, including random Unicode and invalid UTF-8.
- Hugging Face `tokenizers` (BertWordPieceTokenizer) is an independent implementation of the same
  rules. It deviates from the original in two places, which tests below pin down: it lower-cases
  character by character (no Greek final sigma, which Python's str.lower() applies), and it drops
  private-use and unassigned code points as "control" characters (as one revision of Google's
  tokenization.py does; the Model Garden's drops Cc and Cf only, and so do we: see
  bert_tf.tokenization). It also matches special-token strings such as "[CLS]" in raw text, where
  the original splits them like any other text.
"""

import itertools
import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf
from helpers import hf_wordpiece_reference, run_python_script, saved_model_ops_script
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bert_tf.tokenization import graph_tokenizer, python_tokenizer
from bert_tf.tokenization.graph_tokenizer import GraphTokenizer
from bert_tf.tokenization.python_tokenizer import CachedTokenizer, FullTokenizer
from bert_tf.tokenization.tokenizer_rules import VocabError

EDGE_CASES = [
    "",
    " ",
    "\t\n\r \u3000\u00a0",
    "Hello, World! It's 3:45pm -- isn't it?",
    "naïve café Ångström résumé Ñandú ÀÉÎÕÜ",
    "Straße ß ẞ",
    "ﬁne ﬂow ﬀ ﬃ",  # ligatures: the original keeps them (NFD is not NFKD)
    "ＡＢＣ ａｂｃ １２３ ！？",  # full-width forms
    "… — – ‘quotes’ “double” «guillemets» ¿¡",
    "中文字符 日本語のテキスト 한국어 텍스트",
    "ไทยภาษา ລາວ ᠮᠣᠩᠭᠣᠯ",
    "emoji 😀👍🏽 👨‍👩‍👧 🇯🇵 ❤️",
    "zero\u200bwidth\u200c\u200djoiner\ufeffbom",
    "control\x01chars\x07in\x1fthe\x7fmiddle\x85",
    "nul\x00inside a word, nul\x00 between",
    "combining: e\u0301 a\u0308 o\u0323\u0302 \u0301alone",
    "x" * 100,
    "y" * 101,
    "ab" * 60 + " end",
    "w" * 200,
    "v" * 201,
    "ab" * 100 + "c end",
    "ΟΔΟΣ ΣΑΣ ΑΣ. Σ ΑΣ́ ΑΣ1 ΑΣ'Β",
    "İstanbul ǅemal ΐ",
    "line\u2028separator\u2029paragraph",
    "[CLS] special [SEP] tokens [MASK] are text [UNK]",
    "$100 ^caret^ `tick` ~tilde~ |pipe| {brace} <angle>",
    "\ue000private \U000f0000use \U0010fffd",
    "replacement \ufffd char",
    "music \U0001d16d\U0001d165 \U0001d15f \u302e\u302f",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 math",
    "tab\tseparated\tvalues\nand newlines\r\nCRLF",
    "   leading and trailing   ",
]

# Inputs on which Hugging Face `tokenizers` is known to deviate from the original algorithm.
HF_DEVIATIONS = {
    "ΟΔΟΣ ΣΑΣ ΑΣ. Σ ΑΣ́ ΑΣ1 ΑΣ'Β",  # final sigma
    "\ue000private \U000f0000use \U0010fffd",  # private use (Co) dropped by HF
    "[CLS] special [SEP] tokens [MASK] are text [UNK]",  # HF matches special tokens in raw text
}


@pytest.fixture(scope="module")
def uncased(real_vocab):
    return FullTokenizer(real_vocab, do_lower_case=True), GraphTokenizer(
        real_vocab, do_lower_case=True
    )


@pytest.fixture(scope="module")
def cased(real_vocab):
    return FullTokenizer(real_vocab, do_lower_case=False), GraphTokenizer(
        real_vocab, do_lower_case=False
    )


@pytest.fixture(scope="module")
def hf_uncased(real_vocab):
    return hf_wordpiece_reference(real_vocab)


def graph_ids(graph_tokenizer, texts):
    """Tokenizes a batch in one graph call and returns lists of ids."""
    return graph_tokenizer.tokenize(tf.constant(list(texts), tf.string)).to_list()


@pytest.mark.parametrize("mode", ["uncased", "cased"])
def test_graph_matches_full_on_edge_cases(mode, request):
    full, graph = request.getfixturevalue(mode)
    got = graph_ids(graph, EDGE_CASES)
    for text, ids in zip(EDGE_CASES, got):
        assert ids == full.encode(text), (
            f"{text!r}: {full.convert_ids_to_tokens(ids)} != {full.tokenize(text)}"
        )


def test_a_tokenizer_no_variable_holds_answers_its_calls(real_vocab):
    # Its tf.function methods would hold it weakly: collected mid-call, it failed with an
    # AttributeError on None.
    want = FullTokenizer(real_vocab).encode("hello world")
    assert GraphTokenizer(real_vocab).tokenize(["hello world"]).to_list() == [want]
    ids, starts, ends = GraphTokenizer(real_vocab).tokenize_with_offsets(["hello world"])
    assert ids.to_list() == [want] and starts.to_list() == [[0, 6]] and ends.to_list() == [[5, 11]]
    assert GraphTokenizer(real_vocab).split_words(["Hello World"]).to_list() == [
        [b"hello", b"world"]
    ]


def test_graph_matches_full_one_row_at_a_time(uncased):
    # Batching must not let words or sigma contexts leak across rows.
    full, graph = uncased
    for text in EDGE_CASES:
        assert graph_ids(graph, [text]) == [full.encode(text)], repr(text)


def test_hf_tokenizers_matches_full_on_edge_cases(uncased, hf_uncased):
    full, _ = uncased
    for text in EDGE_CASES:
        if text in HF_DEVIATIONS:
            continue
        assert hf_uncased.encode(text, add_special_tokens=False).ids == full.encode(text), repr(
            text
        )


def test_known_deviations_follow_the_original(uncased, hf_uncased):
    full, graph = uncased
    # Python's str.lower() gives a final sigma at the end of a word, as the original does.
    assert full.tokenize("ΟΔΟΣ") == ["ο", "##δ", "##ος"]
    assert hf_uncased.encode("ΟΔΟΣ", add_special_tokens=False).tokens == ["ο", "##δ", "##ο", "##σ"]
    # A private-use character is kept by the original (and is [UNK] with this vocab).
    assert full.tokenize("\ue000x") == ["[UNK]"]
    assert hf_uncased.encode("\ue000x", add_special_tokens=False).tokens == ["x"]
    assert graph_ids(graph, ["ΟΔΟΣ", "\ue000x"]) == [full.encode("ΟΔΟΣ"), full.encode("\ue000x")]


def test_pitfalls_of_tensorflow_text_normalizer_are_avoided(uncased, hf_uncased):
    # tensorflow_text's own lower-casing maps these to `. . .`, `fi`, `abc` and `ss`.
    full, graph = uncased
    texts = ["…", "ﬁ", "ＡＢＣ", "ß", "a\x00b"]
    expected = [hf_uncased.encode(t, add_special_tokens=False).ids for t in texts]
    assert [full.encode(t) for t in texts] == expected
    assert graph_ids(graph, texts) == expected
    assert full.tokenize("…") == ["…"]
    assert full.tokenize("a\x00b") == ["ab"]


def test_real_english_three_way_parity(uncased, hf_uncased, english_lines):
    full, graph = uncased
    assert len(english_lines) >= 3000
    hf = [e.ids for e in hf_uncased.encode_batch(english_lines, add_special_tokens=False)]
    reference = [full.encode(line) for line in english_lines]
    assert hf == reference
    got = []
    for start in range(0, len(english_lines), 512):
        got.extend(graph_ids(graph, english_lines[start : start + 512]))
    assert got == reference


def test_real_english_cased_parity(cased, english_lines):
    full, graph = cased
    lines = english_lines[:1000]
    assert graph_ids(graph, lines) == [full.encode(line) for line in lines]


# Characters that exercise every rule: case, sigma context, combining marks of several classes
# (including kept ones that NFD reorders), CJK, Hangul, punctuation, separators, controls.
INTERESTING = (
    "aAzZ09 \t\n\r.,!?'-$^`~_Σσς΄́ΆΑἈᾼİIıßẞǅǄ\u0301\u0323\u0345\u0308\u034f"
    "\U0001d165\U0001d16d\U0001d16e\u302e\u302f\u1b44\u0f39中文ｶ가각\u3000\u00a0\u2028\u200b\x00"
    "\x01\x7f\ufffd\ue000…ﬁＡ😀"
)


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40),
        min_size=1,
        max_size=8,
    )
)
def test_property_random_unicode(uncased, texts):
    full, graph = uncased
    assert graph_ids(graph, texts) == [full.encode(t) for t in texts]


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.text(alphabet=INTERESTING, max_size=30), min_size=1, max_size=8))
def test_property_dense_edge_characters(uncased, cased, texts):
    for full, graph in (uncased, cased):
        assert graph_ids(graph, texts) == [full.encode(t) for t in texts]


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=60), min_size=1, max_size=8
    )
)
def test_property_ascii(uncased, cased, texts):
    # ASCII rows take GraphTokenizer's fast path; it must agree with the general rules.
    for full, graph in (uncased, cased):
        assert graph_ids(graph, texts) == [full.encode(t) for t in texts]


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=8))
def test_property_invalid_utf8(uncased, blobs):
    full, graph = uncased
    assert graph_ids(graph, blobs) == [full.encode(b) for b in blobs]


def test_invalid_utf8_is_replaced_and_counted(real_vocab):
    full = FullTokenizer(real_vocab)
    assert full.tokenize(b"caf\xc3\xa9 ok") == ["cafe", "ok"]
    assert full.invalid_utf8_count == 0
    assert full.tokenize(b"bad\xff\xfebytes \xc3") == full.tokenize("badbytes")
    assert full.invalid_utf8_count == 3
    assert python_tokenizer.count_invalid_utf8(b"\xed\xa0\x80") == 3  # an encoded surrogate


def test_empty_input(uncased):
    full, graph = uncased
    assert full.tokenize("") == []
    assert graph_ids(graph, [""]) == [[]]
    assert graph.tokenize(tf.constant([], tf.string)).to_list() == []


def test_wordpiece_is_greedy_longest_match_first(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text(
        "\n".join(["[PAD]", "[UNK]", "un", "##aff", "##able", "unaff", "##a", "##ble"]) + "\n"
    )
    full = FullTokenizer(str(vocab))
    graph = GraphTokenizer(str(vocab))
    assert full.tokenize("unaffable") == ["unaff", "##able"]
    assert full.tokenize("unaffablex") == ["[UNK]"]  # one uncovered piece makes the word [UNK]
    assert graph_ids(graph, ["unaffable unaffablex"]) == [full.encode("unaffable unaffablex")]


def test_words_up_to_200_characters_are_split_into_pieces(tmp_path):
    # google-research/bert's tokenization.py, WordpieceTokenizer's max_input_chars_per_word: 200
    # since commit 332a687 (2018-11-23); 100 before it, and 100 in Hugging Face's BertTokenizer.
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "ab", "##ab", "##c"]) + "\n")
    full = FullTokenizer(str(vocab))
    graph = GraphTokenizer(str(vocab))
    texts = ["ab" * 50 + "c", "ab" * 100, "ab" * 100 + "c", "AB" * 80 + " " + "ab" * 101]
    want = [
        ["ab"] + ["##ab"] * 49 + ["##c"],
        ["ab"] + ["##ab"] * 99,
        ["[UNK]"],
        ["ab"] + ["##ab"] * 79 + ["[UNK]"],
    ]
    assert [full.tokenize(text) for text in texts] == want
    assert graph_ids(graph, texts) == [full.encode(text) for text in texts]


def test_token_id_conversions(real_vocab):
    full = FullTokenizer(real_vocab)
    tokens = full.tokenize("The quick brown fox.")
    assert full.convert_ids_to_tokens(full.convert_tokens_to_ids(tokens)) == tokens
    assert full.convert_tokens_to_ids(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]) == [
        0,
        100,
        101,
        102,
        103,
    ]


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "not found"),
        ("", "empty"),
        ("[PAD]\nhello\n", r"no \[UNK\]"),
        ("[UNK]\na\na\n", "duplicate"),
    ],
)
def test_bad_vocab_files_name_the_file(tmp_path, content, message):
    path = tmp_path / "vocab.txt"
    if content is not None:
        path.write_text(content)
    for make in (FullTokenizer, GraphTokenizer):
        with pytest.raises(VocabError, match=message) as excinfo:
            make(str(path))
        assert str(path) in str(excinfo.value)


def test_a_vocab_with_a_byte_order_mark_loads_as_without(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes("\ufeff[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n".encode())
    assert list(FullTokenizer(str(path)).vocab)[:2] == ["[PAD]", "[UNK]"]
    graph = GraphTokenizer(str(path))
    assert (graph.special_ids["[PAD]"], graph.unk_id) == (0, 1)


def test_graph_tokenizer_in_tf_data(uncased, english_lines):
    full, graph = uncased
    lines = english_lines[:64]
    dataset = tf.data.Dataset.from_tensor_slices(lines).batch(16).map(graph.tokenize)
    got = list(itertools.chain.from_iterable(batch.to_list() for batch in dataset))
    assert got == [full.encode(line) for line in lines]


def test_saved_model_loads_in_fresh_process(tmp_path, uncased, real_vocab):
    full, _ = uncased
    module = tf.Module()
    module.tokenizer = GraphTokenizer(real_vocab)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def serve(texts):
        ids = module.tokenizer.tokenize(texts)
        return {"ids": ids.to_tensor(), "lengths": ids.row_lengths()}

    export_dir = str(tmp_path / "tokenizer" / "1")
    tf.saved_model.save(module, export_dir, signatures={"serving_default": serve})
    assert os.path.exists(os.path.join(export_dir, "assets", "vocab.txt"))
    texts = ["Héllo ΟΔΟΣ, wörld!", "中文 and ＡＢＣ …", ""]
    script = textwrap.dedent(
        f"""
        import json, tensorflow as tf, tensorflow_text
        fn = tf.saved_model.load({export_dir!r}).signatures["serving_default"]
        out = fn(tf.constant({texts!r}))
        ids, lengths = out["ids"].numpy().tolist(), out["lengths"].numpy().tolist()
        print(json.dumps([row[:n] for row, n in zip(ids, lengths)]))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    import json

    assert json.loads(result.stdout.strip().splitlines()[-1]) == [full.encode(t) for t in texts]


def test_saved_graph_uses_only_core_and_text_ops(tmp_path, real_vocab):
    module = tf.Module()
    module.tokenizer = GraphTokenizer(real_vocab)
    export_dir = str(tmp_path / "export")
    tf.saved_model.save(module, export_dir)
    script = saved_model_ops_script(export_dir) + textwrap.dedent(
        """
        print(json.dumps({"unknown": sorted(ops - core - text), "text": sorted(text)}))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    import json

    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["unknown"] == []
    assert set(report["text"]) <= {"FastWordpieceTokenizeWithOffsets"}, report["text"]


def _normalized(text, do_lower_case):
    """What a source span reads as after cleaning (and lower-casing), spaces removed."""
    cleaned = "".join(python_tokenizer.clean_char(c) for c in text)
    if do_lower_case:
        cleaned = python_tokenizer.strip_accents(cleaned.lower())
    return "".join(cleaned.split())


def _check_offsets(full, graph, texts, check_text):
    ids, starts, ends = graph.tokenize_with_offsets(tf.constant(texts))
    assert ids.to_list() == [full.encode(t) for t in texts]
    for text, row_ids, row_starts, row_ends in zip(
        texts, ids.to_list(), starts.to_list(), ends.to_list()
    ):
        data = text.encode("utf-8") if isinstance(text, str) else text
        for token_id, start, end in zip(row_ids, row_starts, row_ends):
            assert 0 <= start < end <= len(data), (ascii(text), start, end)
            if not check_text:
                continue
            source = data[start:end].decode("utf-8", errors="replace")
            token = full.inv_vocab[token_id]
            if token == "[UNK]":
                assert _normalized(source, full.do_lower_case), (text, source)
            else:
                # One source character can expand into several pieces (a Hangul syllable under
                # NFD), so the span reads as the piece or as text that contains it.
                assert token.removeprefix("##") in _normalized(source, full.do_lower_case), (
                    text,
                    source,
                    token,
                )


def test_offsets_on_examples(uncased):
    full, graph = uncased
    text = "Naïve café: ΟΔΟΣ 中文!"
    ids, starts, ends = graph.tokenize_with_offsets(tf.constant([text]))
    data = text.encode("utf-8")
    spans = [data[s:e].decode("utf-8") for s, e in zip(starts.to_list()[0], ends.to_list()[0])]
    assert full.convert_ids_to_tokens(ids.to_list()[0]) == [
        "naive",
        "cafe",
        ":",
        "ο",
        "##δ",
        "##ος",
        "中",
        "文",
        "!",
    ]
    assert spans == ["Naïve", "café", ":", "Ο", "Δ", "ΟΣ", "中", "文", "!"]
    long_word = "x" + "y" * 250
    _, starts, ends = graph.tokenize_with_offsets(tf.constant([f"a {long_word} b"]))
    assert list(zip(starts.to_list()[0], ends.to_list()[0])) == [
        (0, 1),
        (2, 2 + len(long_word)),
        (3 + len(long_word), 4 + len(long_word)),
    ]


# Without capital sigma or kept reordered marks, every token's span reads back as (or contains) the token.
SPAN_CHECKED = "aAbBzZ09 \t\n.,!'-$ÀéñÅçẞǅﬁ\u0301\u0323\u0345中文가각ＡＢ…\x00\x01\u200b😀"


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.text(alphabet=SPAN_CHECKED, max_size=40), min_size=1, max_size=6))
def test_property_offsets_point_at_the_source(uncased, cased, texts):
    for full, graph in (uncased, cased):
        _check_offsets(full, graph, texts, check_text=True)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.one_of(
            st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40),
            st.text(alphabet=INTERESTING, max_size=40),
            st.binary(max_size=30),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_property_offsets_in_bounds(uncased, texts):
    full, graph = uncased
    _check_offsets(full, graph, texts, check_text=False)


def test_offsets_on_real_english(uncased, english_lines):
    full, graph = uncased
    _check_offsets(full, graph, english_lines[:500], check_text=True)


def test_code_point_tables_cache_round_trip(tmp_path, monkeypatch):
    import numpy as np

    monkeypatch.setenv("BERT_TF_CACHE_DIR", str(tmp_path))
    graph_tokenizer.code_point_tables.cache_clear()
    try:
        computed = graph_tokenizer.code_point_tables()  # computes and stores
        assert len(list(tmp_path.glob("code_point_tables-*.npz"))) == 1
        graph_tokenizer.code_point_tables.cache_clear()
        loaded = graph_tokenizer.code_point_tables()  # reads the file back
    finally:
        graph_tokenizer.code_point_tables.cache_clear()
    assert loaded["layout"] == computed["layout"]
    for key in ("props", "lower_delta", "expansion_rows"):
        np.testing.assert_array_equal(loaded[key], computed[key])
    for key in ("full", "stripped"):
        for got, want in zip(loaded[key], computed[key]):
            np.testing.assert_array_equal(got, want)


# CachedTokenizer: FullTokenizer's ids through a cache of words. FullTokenizer is the reference;
# the tiny-cache variant checks that emptying the cache mid-text changes nothing.


@pytest.fixture(scope="module")
def cached_pairs(real_vocab):
    pairs = []
    for do_lower_case in (True, False):
        full = FullTokenizer(real_vocab, do_lower_case=do_lower_case)
        pairs.append((full, CachedTokenizer(real_vocab, do_lower_case)))
        pairs.append((full, CachedTokenizer(real_vocab, do_lower_case, max_cached_words=3)))
    return pairs


def cached_lines_ids(cached, texts):
    flat, splits = cached.encode_lines(texts)
    return [flat[a:b].tolist() for a, b in zip(splits, splits[1:])]


def test_cached_matches_full_on_edge_cases(cached_pairs):
    for full, cached in cached_pairs:
        for text in EDGE_CASES * 2:  # the second time from the cache
            assert cached.encode(text) == full.encode(text), repr(text)
            assert cached.tokenize(text) == full.tokenize(text), repr(text)
        assert cached_lines_ids(cached, EDGE_CASES) == [full.encode(t) for t in EDGE_CASES]


def test_cached_matches_full_on_real_english(cached_pairs, english_lines):
    lines = [line.encode() for line in english_lines[:3000]]
    for full, cached in cached_pairs[:2]:
        assert cached_lines_ids(cached, lines) == [full.encode(line) for line in lines]


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.one_of(
            st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40),
            st.text(alphabet=INTERESTING, max_size=30),
            st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=60),
            st.binary(max_size=40),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_property_cached_matches_full(cached_pairs, texts):
    for full, cached in cached_pairs:
        assert cached_lines_ids(cached, texts) == [full.encode(t) for t in texts]
        assert [cached.tokenize(t) for t in texts] == [full.tokenize(t) for t in texts]


def test_cached_is_a_drop_in_full_tokenizer(real_vocab):
    full, cached = FullTokenizer(real_vocab), CachedTokenizer(real_vocab)
    for tokenizer in (full, cached):
        assert tokenizer.tokenize(b"bad\xff\xfebytes \xc3") == ["bad", "##by", "##tes"]
        assert tokenizer.encode(b"caf\xc3\xa9 \xff") == tokenizer.convert_tokens_to_ids(["cafe"])
        assert tokenizer.invalid_utf8_count == 4
    assert cached.convert_ids_to_tokens(cached.encode("Hello!")) == ["hello", "!"]


def test_python_tokenizers_import_without_tensorflow():
    # create_pretraining_data's workers tokenize with CachedTokenizer and must not pay for TensorFlow.
    script = "import sys, bert_tf.tokenization; assert 'tensorflow' not in sys.modules, 'TensorFlow imported'"
    result = run_python_script(script, timeout=60)
    assert result.returncode == 0, result.stderr
