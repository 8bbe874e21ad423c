"""Long texts are cut before tokenization where the export keeps only their first max_seq_length
tokens, and the cut never changes a token it keeps: checked against the original's tokenizer on
adversarial text, and through a served classifier export against a direct call on the whole text."""

import json
import random
import re
import unicodedata

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import tiny_config
from helpers_serve import model_server

from bert_tf.model.model_dir import ModelDir
from bert_tf.saved_model import export
from bert_tf.serving import long_texts
from bert_tf.serving import servable as servable_module
from bert_tf.tasks import models
from bert_tf.tokenization import tokenizer_rules
from bert_tf.tokenization.python_tokenizer import FullTokenizer

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

# Letters with and without accents, lone combining marks (stripped when lower-casing), long
# words with marks between the letters (accents, Thai, Devanagari, a mark past U+FFFF), controls
# the tokenizer drops (NUL, U+001C, a zero-width space, U+FFFD), every kind of whitespace (Zs, tab,
# newline), ASCII and Unicode punctuation, CJK ideographs (with and without spaces around),
# digits, underscore, a currency sign and an emoji (symbols, no letter), capital sigmas (whose
# lower case depends on what follows, past case-ignorable characters such as ".", ":", "'", marks
# and format characters, and past those cleaning drops), and words around the 200 characters past
# which a word is an [UNK].
PIECES = [
    "the", "Movie", "élan", "Ünïcödé", "e\u0301", "\u0301", "\u0301\u0308", "\x00", "\x1c",
    "\u200b", "\ufffd", " ", "  ", "\u3000", "\u00a0", "\t", "\n", "\r\n", "!", "...", "(",
    "\u4e2d\u6587", "x\u4e2d", "\U00020000", "42", "_", "\U0001f600", "a" * 120, "x" * 99, "-", "don't", "[MASK]",
    "y" * 200, "z" * 201, "b" * 260, "«", "»", "\u20ac", "a_b", "\u03a3", "\u039f\u03a3", ".\u0392", "'\u03a3",
    "\u4e2d" + "7" * 260,
    "\u03a3:", "\u0301\u200b", ":\x00", "\u2019", "\u00b7\u03a3\u0345", "\u2026",
    "e\u0301" * 120, "\u0e01\u0e34" * 90, "\u0915\u093e\U0001d165",
]  # fmt: skip
WHITESPACE = {" ", "  ", "\u3000", "\u00a0", "\t", "\n", "\r\n"}


def random_text(rng, pieces=40, choices=PIECES):
    return "".join(rng.choice(choices) for _ in range(pieces))


@pytest.mark.parametrize("do_lower_case", [True, False])
@pytest.mark.parametrize("spaced", [True, False], ids=["spaced", "glued"])
def test_a_cut_text_keeps_the_first_tokens_of_the_whole(real_vocab, do_lower_case, spaced):
    tokenizer = FullTokenizer(real_vocab, do_lower_case=do_lower_case)
    rng = random.Random(7)
    choices = PIECES if spaced else [piece for piece in PIECES if piece not in WHITESPACE]
    cut_somewhere = 0
    for _ in range(400):
        text = random_text(rng, choices=choices)
        whole = tokenizer.tokenize(text)
        for count in (1, 2, 3, 5, 8, 13):
            prefix = long_texts.prefix_keeping_tokens(text, count)
            assert text.startswith(prefix)
            kept = tokenizer.tokenize(prefix)
            assert whole[: len(kept)] == kept, (text, count)
            assert len(kept) >= min(count, len(whole)), (text, count)
            cut_somewhere += len(prefix) < len(text)
    assert cut_somewhere > 1000  # the cases cut, not only kept whole


def test_a_run_of_too_many_letters_is_cut_wherever_it_starts():
    # Each is one [UNK] however long it goes on: cut after 201 letters or digits. Before it: a
    # word of its own (x, an ideograph, punctuation) or a combining mark the count does not see.
    cases = [("", 1), ("x ", 2), ("\u4e2d", 2), ("(", 2), ("\u00ab", 2), ("\u0301", 1)]
    for before, count in cases:
        text = before + "7" * 300 + " z"
        cut = long_texts.prefix_keeping_tokens(text, count)
        assert len(cut) == len(before) + 201, before
    # With combining marks between the letters: Thai (no spaces between words, vowel signs Mn),
    # Devanagari (vowel signs Mc), accents; cut after the 201st letter.
    for letter_and_mark in ("\u0e01\u0e34", "\u0915\u093e", "e\u0301", "x\u0301\u0308"):
        text = letter_and_mark * 100_000 + " z"
        cut = long_texts.prefix_keeping_tokens(text, 1)
        assert len(cut) == 200 * len(letter_and_mark) + 1, letter_and_mark


def test_long_runs_of_unicode_punctuation_or_after_a_capital_sigma_are_cut():
    # Each Unicode punctuation character is a word of its own; a capital sigma's lower case reads
    # only up to the first character that is neither case-ignorable nor dropped.
    assert long_texts.prefix_keeping_tokens("\u00ab" * 100_000, 5) == "\u00ab" * 5
    assert len(long_texts.prefix_keeping_tokens("\u03a3" + "b" * 100_000, 1)) == 201
    # A cased letter that decides a sigma's case past the cut: the run is kept whole (a final
    # sigma before the run's end or a digit is cut where it is).
    assert long_texts.prefix_keeping_tokens("x\u03a3.\u0301y.z w", 1) == "x\u03a3.\u0301y.z"
    assert long_texts.prefix_keeping_tokens("x\u03a3\u00b7\u2019. z", 1) == "x\u03a3"
    assert long_texts.prefix_keeping_tokens("x\u03a3.7", 1) == "x\u03a3"


def test_every_punctuation_character_is_a_token_between_split_points(real_vocab):
    # What counting each punctuation character as a word rests on, over every code point.
    tokenizers = [FullTokenizer(real_vocab, do_lower_case=lower) for lower in (True, False)]
    run_part = long_texts._cut_patterns().run_part
    for cp in range(tokenizer_rules.NUM_CODE_POINTS):
        char = chr(cp)
        is_punctuation = tokenizer_rules.is_punctuation.__wrapped__(char)
        in_class = bool(run_part.fullmatch(char)["punctuation"])
        assert in_class == (is_punctuation and cp < 0x10000), hex(cp)  # the BMP's only
        if is_punctuation:
            for tokenizer in tokenizers:
                tokens = tokenizer.tokenize("a" + char + "b")
                assert len(tokens) >= 3 and tokens[0] == "a" and tokens[-1] == "b", hex(cp)


def test_the_sigma_context_class_is_what_str_lower_reads_past():
    # Against str.lower() itself: after "a" and a capital sigma, a character it reads past leaves
    # the sigma final at the text's end and not before a letter. The class also holds what
    # cleaning drops before lower-casing.
    context = long_texts._cut_patterns().sigma_context
    for cp in range(tokenizer_rules.NUM_CODE_POINTS):
        char = chr(cp)
        dropped = char in "\x00\ufffd" or tokenizer_rules.is_control.__wrapped__(char)
        reads_past = ("a\u03a3" + char + "b").lower()[1] == "\u03c3" and not (
            ("a\u03a3" + char).lower()[1] == "\u03c3"
        )
        assert bool(context.fullmatch(char)) == (dropped or reads_past), hex(cp)


def test_no_rule_of_the_tokenizer_splits_a_word_at_a_combining_mark(real_vocab):
    # What the cut's count of letters between marks rests on, over every mark (M*): cleaning keeps
    # it, the original's whitespace split (str.split) and punctuation split leave "a", the mark
    # and "b" one word, in either casing.
    basic = [
        FullTokenizer(real_vocab, do_lower_case=lower).basic_tokenizer for lower in (True, False)
    ]
    for cp in range(tokenizer_rules.NUM_CODE_POINTS):
        char = chr(cp)
        if unicodedata.category(char)[0] == "M":
            for tokenizer in basic:
                assert len(tokenizer.tokenize("a" + char + "b")) == 1, hex(cp)


def test_the_whitespace_class_is_the_tokenizers_whitespace():
    pattern = re.compile(f"[{tokenizer_rules.WHITESPACE_CLASS}]")
    for cp in range(tokenizer_rules.NUM_CODE_POINTS):
        char = chr(cp)
        assert bool(pattern.fullmatch(char)) == tokenizer_rules.is_whitespace(char), hex(cp)


def test_a_letter_or_digit_always_leaves_a_character_that_is_no_split_point():
    # What the cut's word count rests on: a character Python's re takes for a letter or digit
    # ([^\W_]) is never dropped by cleaning, never whitespace or punctuation, no combining mark
    # (so nothing reorders across a cut next to it), and lower-casing with accent stripping leaves
    # at least one character of it, none of them whitespace, punctuation or dropped.
    letter_or_digit = re.compile(r"[^\W_]")
    for cp in range(tokenizer_rules.NUM_CODE_POINTS):
        char = chr(cp)
        if not letter_or_digit.match(char):
            continue
        assert cp not in (0, 0xFFFD) and not tokenizer_rules.is_control(char), hex(cp)
        assert not tokenizer_rules.is_whitespace(char), hex(cp)
        assert not tokenizer_rules.is_punctuation(char), hex(cp)
        assert unicodedata.combining(char) == 0, hex(cp)
        lowered = unicodedata.normalize("NFD", char.lower())
        kept = [c for c in lowered if unicodedata.category(c) != "Mn"]
        assert kept, hex(cp)
        for c in kept:
            assert not tokenizer_rules.is_whitespace(c), hex(cp)
            assert not tokenizer_rules.is_punctuation(c), hex(cp)
            assert not tokenizer_rules.is_control(c), hex(cp)


@pytest.fixture(scope="module")
def pair_export(tmp_path_factory, real_vocab):
    """A served pair classifier (random weights, max_seq_length 16) and its direct signature."""
    root = tmp_path_factory.mktemp("long_texts")
    spec = models.TaskSpec("classifier", labels=["0", "1", "2"], is_pair=True, max_seq_length=16)
    keras.utils.set_random_seed(5)
    model, encoder = models.build_task_model(tiny_config(real_vocab), spec)
    head = [layer for layer in model.layers if layer.name.endswith("_head")][0]
    rng = np.random.default_rng(5)  # large head weights, so that outputs differ between texts
    head.set_weights([rng.normal(0, 1, w.shape).astype(np.float32) for w in head.get_weights()])
    ModelDir(str(root / "model")).write(
        tiny_config(real_vocab), real_vocab, encoder, spec=spec, model=model
    )
    path, _ = export.export(str(root / "model"), str(root / "export" / "pair"))
    return str(root / "export" / "pair"), tf.saved_model.load(path)


def test_a_served_long_text_is_cut_and_answered_as_the_whole_text(
    pair_export, monkeypatch, real_vocab
):
    base, loaded = pair_export
    rng = random.Random(11)
    # Past the 64 KiB from which texts are looked at, and mostly what gives no token.
    long_a = "\u0301 \x00 \u3000 " * 4000 + random_text(rng, 3000)
    long_b = "...\u200b " * 8000 + random_text(rng, 3000)
    texts_a = [long_a, "a short one", long_a[::-1]]
    texts_b = ["short", long_b, long_b]
    seen = []
    call_signature = servable_module.call_signature

    def recording(signature, arrays):
        seen.append({name: [len(v) for v in value] for name, value in arrays.items()})
        return call_signature(signature, arrays)

    monkeypatch.setattr(servable_module, "call_signature", recording)
    with model_server({"pair": base}, warmup=False) as server:
        import http.client

        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        body = json.dumps({"inputs": {"text_a": texts_a, "text_b": texts_b}})
        connection.request("POST", "/v1/models/pair:predict", body=body)
        response = connection.getresponse()
        reply = json.loads(response.read())
        connection.close()
    assert response.status == 200, reply
    direct = loaded.signatures["serving_default"](
        text_a=tf.constant(texts_a), text_b=tf.constant(texts_b)
    )
    np.testing.assert_allclose(
        reply["outputs"]["probabilities"], direct["probabilities"].numpy(), atol=1e-6
    )
    assert reply["outputs"]["label"] == [v.decode() for v in direct["label"].numpy()]
    (lengths,) = seen
    wholes = {"text_a": texts_a, "text_b": texts_b}
    for name, texts in wholes.items():
        for length, text in zip(lengths[name], texts):
            whole = len(text.encode())
            assert length < whole if whole > 64 << 10 else length == whole, (name, length, whole)


def test_texts_of_other_exports_and_invalid_utf8_are_not_cut():
    text = ("word " * 20_000).encode()
    assert servable_module._cut_texts(np.array([text], dtype=object), 16)[0] == text[:79]
    chinese = "\u4e2d" * 30_000  # no whitespace at all: every ideograph is a word of its own
    assert servable_module._cut_texts(np.array([chinese.encode()], dtype=object), 16)[0] == (
        chinese[:16].encode()
    )
    invalid = text + b"\xff"
    assert servable_module._cut_texts(np.array([invalid], dtype=object), 16)[0] == invalid
    assert servable_module._words_to_keep("/nonexistent") is None
