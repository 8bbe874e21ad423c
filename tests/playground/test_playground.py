"""The playground in a real browser: headless Chromium driven by Selenium, checked against the Python code.

Each test types, moves the slider or toggles in the page, then compares what the page shows with the
function it must agree with, computed here independently: the representation table with
packing.pack_segments on FullTokenizer ids, the masked table with create_masked_lm_predictions for the
page's seed, the top 5 with MaskedLM.fill_mask, a decoded record with TensorFlow's own parse of the
file, the attention rows with their sums. A screenshot of every view goes to the test's tmp output
(and to $PLAYGROUND_SCREENSHOTS_DIR when set, which is how docs/playground/ is made).

The browser tests never skip: without Chromium, chromedriver or selenium they fail, saying how to
install them (`make test` does, as root: apt-get install -y chromium chromium-driver).
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tensorflow as tf
from helpers import CLI_ENV, ROOT, run_module_cli, tiny_config, write_tiny_model_dir, write_vocab
from helpers_records import make_example

from bert_tf.model import modeling
from bert_tf.model.model_dir import ModelDir
from bert_tf.playground import server as playground_server
from bert_tf.playground import views
from bert_tf.pretraining.masked_lm import MaskedLM
from bert_tf.pretraining_data import inspection, schema
from bert_tf.pretraining_data.instances import InstanceBuilder, VocabInfo
from bert_tf.pretraining_data.job import PretrainingDataArgs
from bert_tf.pretraining_data.job import run as create_pretraining_data
from bert_tf.tasks import packing
from bert_tf.tokenization import python_tokenizer, tokenizer_rules

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
INSTALL_HINT = (
    "the playground's browser tests need Debian's Chromium and its driver, and selenium: "
    "`apt-get update && apt-get install -y chromium chromium-driver` (as root; `make test` does "
    "it) and `pip install -r requirements.txt`"
)
# Without these Chromium reaches for the network at start-up (updates, sync, QUIC probes), which
# this machine refuses.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)
MAX_SEQ_LENGTH, MAX_PREDICTIONS = 32, 5
CORPUS = [
    [
        "the man went to the store .",
        "he bought a gallon of milk .",
        "then he walked home in the rain .",
        "his dog was waiting at the door .",
    ],
    [
        "penguins are flightless birds .",
        "they live in the southern hemisphere .",
        "most penguins eat fish and krill .",
    ],
    [
        "the capital of france is paris .",
        "paris is known for its museums .",
        "many tourists visit the city every year .",
        "the river seine runs through it .",
    ],
    [
        "a good recipe needs fresh bread .",
        "you slice the bread and toast it .",
        "butter makes it taste better .",
    ],
    [
        "the children played football in the park .",
        "one of them kicked the ball very far .",
        "everyone laughed and ran after it .",
    ],
]
EXTRA_PIECES = ["##s", "##ing", "##ed", "walk", "play", "kick"]


# ---------------------------------------------------------------------------------------------
# Fixtures: a tiny pretrained-layout model, its corpus and records, servers, the browser
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A vocabulary with ## pieces, a tiny model directory with both heads, a corpus, records."""
    root = tmp_path_factory.mktemp("playground")
    vocab_file = write_vocab(
        str(root / "vocab.txt"), [s for d in CORPUS for s in d], extra_words=EXTRA_PIECES
    )
    tf.keras.utils.set_random_seed(1)
    config = tiny_config(vocab_file)
    model, encoder = modeling.build_pretraining_model(config)
    model_dir = str(root / "model")
    ModelDir(model_dir).write(config, vocab_file, encoder, pretraining_model=model)
    corpus_file = root / "corpus.txt"
    corpus_file.write_text("\n\n".join("\n".join(d) for d in CORPUS) + "\n", encoding="utf-8")
    create_pretraining_data(
        PretrainingDataArgs(
            input_file=str(corpus_file),
            vocab_file=vocab_file,
            output_dir=str(root / "records"),
            max_seq_length=MAX_SEQ_LENGTH,
            max_predictions_per_seq=MAX_PREDICTIONS,
            dupe_factor=2,
            random_seed=3,
            num_workers=1,
        )
    )
    (records,) = glob.glob(str(root / "records" / "*.tfrecord"))
    shots = tmp_path_factory.mktemp("playground_screenshots")
    return {
        "vocab": vocab_file,
        "model_dir": model_dir,
        "corpus": str(corpus_file),
        "records": records,
        "screenshots": str(shots),
    }


def start_server(settings):
    """A playground server on a free port, serving until .stop()."""
    return playground_server.PlaygroundServer(views.Playground(settings), "127.0.0.1", 0)


@pytest.fixture(scope="module")
def with_model(files):
    httpd = start_server(
        views.PlaygroundSettings(
            model_dir=files["model_dir"],
            corpus=files["corpus"],
            max_seq_length=MAX_SEQ_LENGTH,
            max_predictions_per_seq=MAX_PREDICTIONS,
        )
    )
    yield httpd
    httpd.stop()
    assert httpd.internal_errors == 0, "a view answered with a server error (see the log)"


@pytest.fixture(scope="module")
def without_model(files):
    httpd = start_server(
        views.PlaygroundSettings(
            vocab_file=files["vocab"], corpus=files["corpus"], max_seq_length=MAX_SEQ_LENGTH
        )
    )
    yield httpd
    httpd.stop()
    assert httpd.internal_errors == 0


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium at 1280x800; a failure to start fails the test, naming what to install."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as e:
        pytest.fail(f"selenium is not installed ({e}): {INSTALL_HINT}")
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(path)]
    if missing:
        pytest.fail(f"{', '.join(missing)} not found: {INSTALL_HINT}")
    profile = tempfile.mkdtemp(prefix="playground-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS + (f"--user-data-dir={profile}", "--window-size=1280,800"):
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    except Exception as e:
        shutil.rmtree(profile, ignore_errors=True)
        pytest.fail(f"Chromium did not start ({type(e).__name__}: {str(e)[:300]}): {INSTALL_HINT}")
    # The viewport itself 1280x800, whatever the window's frame takes.
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False},
    )
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Driving the page
# ---------------------------------------------------------------------------------------------


class Page:
    """The playground page in the browser, with waits on each view's finished requests."""

    def __init__(self, driver, httpd, screenshots):
        from selenium.webdriver.common.by import By
        from selenium.webdriver.common.keys import Keys
        from selenium.webdriver.support.ui import Select, WebDriverWait

        self.driver, self.httpd, self.screenshots = driver, httpd, screenshots
        self.By, self.Keys, self.Wait, self.Select = By, Keys, WebDriverWait, Select
        driver.get(httpd.url)
        self.wait(lambda d: d.execute_script("return document.body.dataset.ready") == "true")
        self.wait_done("represent", 0)

    def wait(self, condition, timeout=60):
        return self.Wait(self.driver, timeout).until(condition)

    def find(self, selector, root=None):
        return (root or self.driver).find_element(self.By.CSS_SELECTOR, selector)

    def find_all(self, selector, root=None):
        return (root or self.driver).find_elements(self.By.CSS_SELECTOR, selector)

    def version(self, view):
        return int(self.find(f"#view-{view}").get_attribute("data-version") or 0)

    def wait_done(self, view, before):
        """Waits until `view` has finished a request after version `before`; returns its state."""
        panel = self.find(f"#view-{view}")
        self.wait(
            lambda d: (
                int(panel.get_attribute("data-version") or 0) > before
                and panel.get_attribute("data-state") != "loading"
            )
        )
        return panel.get_attribute("data-state")

    def act(self, view, action):
        """Runs `action()`, then waits for the view's reply; returns the view's state."""
        before = self.version(view)
        action()
        return self.wait_done(view, before)

    def open(self, view):
        tab = self.find(f"#tab-{view}")
        return self.act(view, tab.click)

    def type_into(self, selector, text):
        """Types `text` into a field as a person would (select all, then the keys)."""
        field = self.find(selector)
        field.send_keys(self.Keys.CONTROL, "a")
        field.send_keys(self.Keys.BACKSPACE)
        field.send_keys(text)

    def set_value(self, selector, text, script=False):
        """Puts `text` in a field at once (a 1 MB paste) and fires input; with `script`, `text` is
        a JavaScript string literal's body, for text no keyboard types."""
        value = f'"{text}"' if script else "arguments[1]"
        self.driver.execute_script(
            f"const f = document.querySelector(arguments[0]); f.value = {value};"
            "f.dispatchEvent(new Event('input', {bubbles: true}));",
            selector,
            text,
        )

    def set_pair(self, text_a, text_b):
        """Sentences A and B, which every view reads, as a test that runs alone needs them."""
        self.open("represent")
        for selector, text in (("#text-a", text_a), ("#text-b", text_b)):
            if self.find(selector).get_attribute("value") != text:
                self.act("represent", lambda s=selector, t=text: self.set_value(s, t))

    def message(self, view):
        return self.find(f"#view-{view} > .message").text

    def table(self, selector):
        """The cells' texts of a table's body rows."""
        return [
            [cell.text for cell in self.find_all("td", row)]
            for row in self.find_all(f"{selector} tbody tr")
        ]

    def screenshot(self, name):
        path = os.path.join(self.screenshots, f"{name}.png")
        self.driver.save_screenshot(path)
        extra = os.environ.get("PLAYGROUND_SCREENSHOTS_DIR")
        if extra:
            os.makedirs(extra, exist_ok=True)
            shutil.copy(path, os.path.join(extra, f"{name}.png"))
        return path


@pytest.fixture(scope="module")
def page(browser, with_model, files):
    return Page(browser, with_model, files["screenshots"])


# ---------------------------------------------------------------------------------------------
# What the page must agree with, computed here
# ---------------------------------------------------------------------------------------------


def packed(vocab_file, text_a, text_b):
    """(tokens, ids, segment ids) of the pair as the fine-tuning jobs pack it (FullTokenizer)."""
    tokenizer = python_tokenizer.FullTokenizer(vocab_file, do_lower_case=True)
    vocab = tokenizer.vocab
    ids, mask, segments = packing.pack_segments(
        [tokenizer.encode(text_a), tokenizer.encode(text_b)],
        MAX_SEQ_LENGTH,
        vocab["[CLS]"],
        vocab["[SEP]"],
        drop_empty_b=True,
    )
    length = int(mask.sum())
    ids = ids[:length].tolist()
    return tokenizer.convert_ids_to_tokens(ids), ids, segments[:length].tolist()


def masked_by_the_data_job(vocab_file, text_a, text_b, seed, rate, **masking):
    """(corrupted tokens, {position: original token}) from create_masked_lm_predictions itself;
    `masking`: InstanceBuilder's masking, mask_token_prob and random_token_prob."""
    tokens, ids, segments = packed(vocab_file, text_a, text_b)
    vocab = VocabInfo.from_file(vocab_file)
    builder = InstanceBuilder(
        vocab, MAX_SEQ_LENGTH, MAX_PREDICTIONS, masked_lm_prob=rate, **masking
    )
    n = len(ids)
    row = np.zeros((1, MAX_SEQ_LENGTH), np.int32)
    row[0, :n] = ids
    is_token = np.zeros(row.shape, bool)
    is_token[0, :n] = True
    is_token[0, [0, segments.count(0) - 1, n - 1]] = False
    positions, labels, chosen = builder.create_masked_lm_predictions(
        row, np.array([n]), is_token, np.random.default_rng(seed)
    )
    corrupted = [vocab.tokens[i] for i in row[0, :n]]
    return corrupted, {
        int(p): vocab.tokens[int(label)]
        for p, label in zip(positions[0][chosen[0]], labels[0][chosen[0]])
    }


# ---------------------------------------------------------------------------------------------
# The views, with a model
# ---------------------------------------------------------------------------------------------

TEXT_A = "the man walks to the store and bought milk . " * 4  # 44 tokens: cut to fit 32
TEXT_B = "the dog was playing in the park ."


def test_representation_table_is_the_packing_and_keyboard_selects_a_token(page, files):
    page.act("represent", lambda: page.type_into("#text-a", TEXT_A))
    page.act("represent", lambda: page.type_into("#text-b", TEXT_B))
    tokens, ids, segments = packed(files["vocab"], TEXT_A, TEXT_B)
    rows = page.table("#represent-table")
    assert [r[1] for r in rows] == tokens and len(rows) == MAX_SEQ_LENGTH
    assert [int(r[2]) for r in rows] == ids
    assert [r[3] for r in rows] == [f"{'AB'[s]} ({s})" for s in segments]
    assert [int(r[4]) for r in rows] == list(range(len(ids)))
    assert "cut to max_seq_length=32" in page.message("represent")
    assert "##s" in tokens  # "walks" is walk ##s: the pieces show as the tokenizer gives them

    # The keyboard: a token's button, then the down arrow selects the next token.
    third = page.find('#represent-table button[data-index="2"]')
    page.act("represent", third.click)
    page.act("represent", lambda: third.send_keys(page.Keys.ARROW_DOWN))
    assert page.find('#represent-table button[aria-pressed="true"]').text == tokens[3]
    # The strips are the model's own vectors: the token row of the word table, and so on.
    encoder = ModelDir(files["model_dir"]).load_encoder()
    token_row = encoder.get_layer(modeling.WORD_EMBEDDING_LAYER).embeddings.numpy()[ids[3]]
    strips = page.find_all("#strips canvas")
    assert [s.get_attribute("data-name") for s in strips] == [
        "token",
        "segment",
        "position",
        "sum",
        "layer_norm",
    ]
    assert all(int(s.get_attribute("width")) == 32 for s in strips)
    assert f"norm {np.linalg.norm(token_row):.3f}" in strips[0].get_attribute("aria-label")
    page.screenshot("1-representation")


def test_masking_table_is_create_masked_lm_predictions_for_the_seed(page, files):
    page.open("mask")
    page.act("mask", lambda: page.type_into("#mask-seed", "7"))
    slider = page.find("#mask-rate")
    for _ in range(25):  # 15% -> 40%, with the keyboard
        slider.send_keys(page.Keys.ARROW_RIGHT)
    page.wait(lambda d: page.find("#mask-rate-out").text == "40%")
    page.wait(lambda d: "× 0.40" in page.find("#mask-summary").text)

    def check(seed, **masking):
        corrupted, labels = masked_by_the_data_job(
            files["vocab"], TEXT_A, TEXT_B, seed, 0.40, **masking
        )
        rows = page.table("#mask-table")
        assert [r[2] for r in rows] == corrupted
        assert {int(r[0]): r[3] for r in rows if r[3]} == labels
        # round(32 * 0.4) = 13, capped at 5 (whole words and spans may stop short of the cap)
        assert len(labels) == MAX_PREDICTIONS or masking.get("masking", "token") != "token"
        assert all(len(r[5].split(" · ")) == 5 for r in rows if r[3])  # the model's top 5
        assert f"(seed {seed})" in page.find("#mask-summary").text
        return rows

    check(7)
    page.act("mask", page.find("#mask-again").click)
    assert page.find("#mask-seed").get_attribute("value") == "8"
    check(8)
    kind = page.Select(page.find("#mask-kind"))
    page.act("mask", lambda: kind.select_by_value("whole_word"))
    check(8, masking="whole_word")
    page.act("mask", lambda: kind.select_by_value("span"))
    assert "spans of whole words" in page.find("#mask-summary").text
    check(8, masking="span")
    # Table 8's 0/0/100 row: every masked position a random token.
    page.act("mask", lambda: page.type_into("#mask-as-mask", "0"))
    page.act("mask", lambda: page.type_into("#mask-as-random", "100"))
    rows = check(8, masking="span", mask_token_prob=0.0, random_token_prob=1.0)
    assert not any(r[4] == "[MASK]" for r in rows)
    assert "0% become [MASK], 100% a random token" in page.find("#mask-summary").text
    page.act("mask", lambda: page.type_into("#mask-as-mask", "80"))
    page.act("mask", lambda: page.type_into("#mask-as-random", "10"))
    page.screenshot("2-masking")


def test_next_sentence_pairs_follow_the_label_and_the_model(page, files):
    page.open("nsp")
    model = MaskedLM(files["model_dir"], MAX_SEQ_LENGTH)
    sentences = {s: (d + 1, i + 1) for d, doc in enumerate(CORPUS) for i, s in enumerate(doc)}
    for label in ("NotNext", "IsNext"):
        radio = page.find(f"input[name=nsp-label][value={label}]")
        if not radio.is_selected():
            page.act("nsp", radio.click)
        cards = page.find_all("#nsp-pairs .card")
        assert cards and all(c.get_attribute("data-label") == label for c in cards)
        for card in cards:
            a, b = page.find(".where-a", card), page.find(".where-b", card)
            text_a, text_b = page.find(".text-a", card).text, page.find(".text-b", card).text
            # Where A and B came from is where their sentences are in the corpus file.
            first_sentence = text_a.split(" . ")[0].rstrip(" .") + " ."
            assert sentences[first_sentence] == (
                int(a.get_attribute("data-document")),
                int(a.get_attribute("data-first")),
            )
            same = a.get_attribute("data-document") == b.get_attribute("data-document")
            follows = int(b.get_attribute("data-first")) == int(a.get_attribute("data-last")) + 1
            assert (same and follows) if label == "IsNext" else not same
            shown = float(page.find(".prob", card).get_attribute("data-probability"))
            assert shown == pytest.approx(
                float(model.next_sentence([text_a], [text_b])[0]), abs=1e-5
            )
    page.screenshot("3-next-sentence")
    page.type_into("#own-a", "penguins are birds .")
    page.type_into("#own-b", "they eat fish .")
    page.act("nsp", lambda: page.find("#own-pair button").click())
    shown = float(page.find("#own-result").get_attribute("data-probability"))
    want = model.next_sentence(["penguins are birds ."], ["they eat fish ."])[0]
    assert shown == pytest.approx(float(want), abs=1e-5)


def test_fill_mask_top5_is_masked_lm_fill_mask(page, files):
    page.open("fill")
    text = "the man went to the [MASK] and bought [MASK] ."
    page.type_into("#fill-text", text)
    page.act("fill", lambda: page.find("#fill-text").send_keys(page.Keys.CONTROL, page.Keys.ENTER))
    (result,) = MaskedLM(files["model_dir"], MAX_SEQ_LENGTH).fill_mask([text], 5)
    cards = page.find_all("#fill-results .card")
    assert len(cards) == len(result.masks) == 2
    for card, mask in zip(cards, result.masks):
        assert int(card.get_attribute("data-position")) == mask.position
        rows = page.find_all("tbody tr", card)
        assert [page.find("td.token", r).text for r in rows] == mask.tokens
        shown = [float(r.get_attribute("data-probability")) for r in rows]
        np.testing.assert_allclose(shown, mask.probabilities, rtol=1e-6)
    assert page.find("#fill-filled").text == f"Filled: {result.filled}"
    page.screenshot("4-fill-mask")


def read_records_with_tensorflow(path, vocab_file):
    """Each record of the file as TensorFlow's own parser reads it: tokens, segments, masks, label."""
    tokens = list(tokenizer_rules.load_vocab(vocab_file))
    spec = schema.feature_spec(MAX_SEQ_LENGTH, MAX_PREDICTIONS)
    records = []
    for raw in tf.data.TFRecordDataset(path):
        x = {k: v.numpy() for k, v in tf.io.parse_single_example(raw, spec).items()}
        n, m = int(x["input_mask"].sum()), int(x["masked_lm_weights"].sum())
        records.append(
            {
                "tokens": [tokens[i] for i in x["input_ids"][:n]],
                "segments": x["segment_ids"][:n].tolist(),
                "masked": [
                    [str(p), tokens[x["input_ids"][p]], tokens[i]]
                    for p, i in zip(x["masked_lm_positions"][:m], x["masked_lm_ids"][:m])
                ],
                "label": "NotNext" if x["next_sentence_labels"][0] else "IsNext",
            }
        )
    return records


def test_records_decode_to_what_the_file_holds(page, files):
    page.open("records")
    page.type_into("#records-path", files["records"])
    page.type_into("#records-limit", "2")
    page.act("records", lambda: page.find("#records-form button[type=submit]").click())
    want = read_records_with_tensorflow(files["records"], files["vocab"])
    for start in (0, 2):
        cards = page.find_all("#records-list .card")
        assert [int(c.get_attribute("data-index")) for c in cards] == [start, start + 1]
        for card, record in zip(cards, want[start : start + 2]):
            assert page.find(".label", card).text.endswith(record["label"])
            chips = page.find_all(".chip", card)
            assert len(chips) == len(record["tokens"])
            assert [int("seg-1" in c.get_attribute("class")) for c in chips] == record["segments"]
            rows = [
                [td.text for td in page.find_all("td", r)] for r in page.find_all("tbody tr", card)
            ]
            assert [[r[0], r[1], r[3]] for r in rows] == record["masked"]
        if start == 0:
            page.screenshot("5-records")
            page.act("records", page.find("#records-next").click)


def test_attention_rows_sum_to_one(page, files):
    page.set_pair(TEXT_A, TEXT_B)
    page.open("attention")
    layer, head = page.find("#att-layer"), page.find("#att-head")
    page.act("attention", lambda: layer.send_keys(page.Keys.ARROW_DOWN))  # layer 2 of 2
    page.act("attention", lambda: head.send_keys(page.Keys.ARROW_DOWN))  # head 2 of 2
    matrix = page.find("#att-matrix")
    assert (matrix.get_attribute("data-layer"), matrix.get_attribute("data-head")) == ("1", "1")
    values = page.driver.execute_script(
        "return Array.from(document.querySelectorAll('#att-matrix tbody tr')).map("
        "r => Array.from(r.querySelectorAll('td')).map(c => Number(c.dataset.value)))"
    )
    tokens, _, _ = packed(files["vocab"], TEXT_A, TEXT_B)
    assert np.shape(values) == (len(tokens), len(tokens))
    np.testing.assert_allclose(np.sum(values, axis=1), 1.0, atol=1e-4)
    assert len(page.find_all("#att-overview canvas")) == 2 * 2  # every layer's every head
    page.screenshot("6-attention")


def test_the_layer_by_layer_trace_is_the_encoder(files):
    # The attention and embeddings come from the encoder's layers called one by one: their end is
    # the encoder's own output, and each attention row is a distribution.
    playground = views.Playground(
        views.PlaygroundSettings(model_dir=files["model_dir"], max_seq_length=MAX_SEQ_LENGTH)
    )
    packed_input = playground._pack(views.RequestFields({"text_a": TEXT_A, "text_b": TEXT_B}))
    trace = playground._trace(packed_input)
    ids = np.array([packed_input.ids], np.int32)
    outputs = ModelDir(files["model_dir"]).load_encoder()(
        {
            "input_word_ids": ids,
            "input_mask": np.ones_like(ids),
            "input_type_ids": np.array([packed_input.segment_ids], np.int32),
        }
    )
    np.testing.assert_allclose(
        trace["sequence_output"], outputs["sequence_output"][0], rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(trace["attention"].sum(axis=-1), 1.0, atol=1e-5)


def test_a_model_without_heads_shows_its_layers_and_says_the_heads_are_missing(tmp_path, files):
    encoder_only = write_tiny_model_dir(tmp_path / "encoder_only", files["vocab"])
    playground = views.Playground(views.PlaygroundSettings(model_dir=encoder_only))
    info = playground.info()
    assert not info["missing"]["model"] and "has no MLM (masked-LM) head" in info["missing"]["mlm"]
    request = {"text_a": "penguins are birds .", "text_b": "they eat fish ."}
    reply = playground.handle("attention", dict(request, layer=1, head=0))
    np.testing.assert_allclose(np.sum(reply["matrix"], axis=1), 1.0, atol=1e-4)
    assert playground.handle("mask", dict(request, seed=1))["rows"][0]["top"] == []
    for view, extra in (("fill_mask", {"text": "a [MASK] ."}), ("score_pair", {})):
        with pytest.raises(views.ViewError, match="pretraining heads"):
            playground.handle(view, dict(request, **extra))


def test_bad_input_gets_a_message_never_a_server_error(page, files):
    page.set_pair(TEXT_A, TEXT_B)
    assert page.act("represent", lambda: page.set_value("#text-a", "")) == "error"
    assert "Sentence A is empty" in page.message("represent")
    page.act("represent", lambda: page.set_value("#text-a", "walk " * 200_000))  # 1 MB
    kept_a = packing.truncated_lengths(
        [200_000, len(packed(files["vocab"], TEXT_B, "")[1]) - 2], 29
    )[0]
    assert f"A keeps {kept_a} of its 200,000 tokens" in page.message("represent")
    assert len(page.table("#represent-table")) == MAX_SEQ_LENGTH
    # A lone surrogate: what invalid UTF-8 becomes in a page (made in the page: WebDriver's JSON
    # cannot carry one).
    page.act("represent", lambda: page.set_value("#text-a", "the man \\ud800 walks", script=True))
    assert "invalid UTF-8" in page.message("represent")
    assert [r[1] for r in page.table("#represent-table")][:5] == [
        "[CLS]",
        "the",
        "man",
        "walk",
        "##s",
    ]
    page.open("mask")
    assert page.act("mask", lambda: page.type_into("#mask-seed", "twelve")) == "error"
    assert "The seed must be a whole number" in page.message("mask")
    page.open("fill")
    page.type_into("#fill-text", "no mask here")
    assert page.act("fill", lambda: page.find("#fill-form button").click()) == "error"
    assert "has no [MASK]" in page.message("fill")
    page.open("records")
    page.type_into("#records-path", files["corpus"])  # a text file, not records
    assert page.act("records", lambda: page.find("#records-form button").click()) == "error"
    assert "not a TFRecord file" in page.message("records")
    # Bytes no browser sends: invalid UTF-8 and broken JSON get a 400 with a message.
    for body in (b'{"text_a": "\xff\xfe"}', b"{not json"):
        request = urllib.request.Request(page.httpd.url + "api/represent", data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(request, timeout=30)
        assert error.value.code == 400 and json.loads(error.value.read())["error"]


def test_offline_and_only_for_its_own_page(page):
    # Everything the page loaded came from the playground itself.
    resources = page.driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
    )
    assert resources and all(r.startswith(page.httpd.url) for r in resources)
    static = os.path.join(os.path.dirname(playground_server.__file__), "static")
    for name in os.listdir(static):
        with open(os.path.join(static, name), encoding="utf-8") as f:
            text = f.read()
        assert "http://" not in text and "https://" not in text, name
    assert page.httpd.server_address[0] == "127.0.0.1"
    # Another host name (DNS rebinding) or another site's form is refused.
    for headers in ({"Host": "evil.example"}, {"Origin": "http://evil.example"}):
        request = urllib.request.Request(page.httpd.url + "api/info", headers=headers, method="GET")
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(request, timeout=30)
        assert error.value.code == 403


# ---------------------------------------------------------------------------------------------
# Without a model
# ---------------------------------------------------------------------------------------------


def test_without_a_model_the_data_views_work_and_the_model_views_say_what_is_missing(
    browser, without_model, files
):
    page = Page(browser, without_model, files["screenshots"])
    assert "No model" in page.find("#status").text
    assert len(page.table("#represent-table")) > 2
    assert "--model_dir" in page.find("#view-represent .model-message").text
    page.open("mask")
    rows = page.table("#mask-table")
    assert any(r[3] for r in rows) and not any(r[5] for r in rows)
    assert "--model_dir" in page.message("mask")
    page.open("nsp")
    assert page.find_all("#nsp-pairs .card") and not page.find_all("#nsp-pairs .prob")
    page.screenshot("no-model-next-sentence")
    for view in ("fill", "attention"):
        page.open(view)
        assert "No model" in page.message(view)
    page.screenshot("no-model-attention")
    # The keyboard moves between the views: right arrow on a tab opens the next one.
    page.act("represent", lambda: page.find("#tab-attention").send_keys(page.Keys.HOME))
    assert page.find("#tab-represent").get_attribute("aria-selected") == "true"
    page.act("mask", lambda: page.find("#tab-represent").send_keys(page.Keys.ARROW_RIGHT))
    assert page.driver.switch_to.active_element.get_attribute("id") == "tab-mask"
    assert (
        page.find("#view-mask").is_displayed() and not page.find("#view-represent").is_displayed()
    )


# ---------------------------------------------------------------------------------------------
# The command lines
# ---------------------------------------------------------------------------------------------


def test_inspect_records_prints_the_records_decoded(files):
    want = read_records_with_tensorflow(files["records"], files["vocab"])
    done = run_module_cli(
        "bert_tf.inspect_records", files["records"], "--limit=2", f"--vocab_file={files['vocab']}"
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for index in (0, 1):
        head = next(line for line in lines if line.startswith(f"record {index}:"))
        assert want[index]["label"] in head
        assert f"input: {' '.join(want[index]['tokens'])}" in done.stdout
    assert "more records follow (--start=2)" in done.stdout
    ids_only = run_module_cli("bert_tf.inspect_records", files["records"], "--limit=1")
    assert ids_only.returncode == 0 and "input: #2 " in ids_only.stdout  # [CLS] is id 2
    assert "replaced" in ids_only.stdout or "kept" in ids_only.stdout
    bad = run_module_cli("bert_tf.inspect_records", files["corpus"])
    assert bad.returncode == 2 and "not a TFRecord file" in bad.stderr


def test_records_written_as_google_writes_them_plain_or_gzip(tmp_path, files):
    # Google's create_pretraining_data writes the same features through TensorFlow's writer.
    example = make_example(
        [2, 10, 4, 3, 11, 12, 3], [0, 0, 0, 0, 1, 1, 1], [2, 5], [20, 21], 1, 8, 3
    )
    tokens = tuple(tokenizer_rules.load_vocab(files["vocab"]))
    for name, options in (("plain.tfrecord", None), ("zipped.tfrecord.gz", "GZIP")):
        path = str(tmp_path / name)
        with tf.io.TFRecordWriter(path, options) as writer:
            for _ in range(3):
                writer.write(example.SerializeToString())
        page = inspection.read_instances(path, tokens, start=1, limit=1)
        (x,) = page.instances
        assert (x.index, page.more, x.label, x.max_seq_length, x.max_predictions_per_seq) == (
            1,
            True,
            "NotNext",
            8,
            3,
        )
        assert x.segment_ids == [0, 0, 0, 0, 1, 1, 1]
        assert [(m.position, m.shown, m.original, m.kind) for m in x.masked] == [
            (2, "[MASK]", tokens[20], "[MASK]"),
            (5, tokens[12], tokens[21], "random"),
        ]
        assert x.text_a == f"{tokens[10]} {tokens[20]}"


def test_the_command_serves_the_page_on_loopback(files):
    process = subprocess.Popen(
        [sys.executable, "-m", "bert_tf.playground", f"--vocab_file={files['vocab']}", "--port=0"],
        cwd=ROOT,
        env=CLI_ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.time() + 120
        line = ""
        while "playground at" not in line and time.time() < deadline:
            line = process.stdout.readline()
            assert line or process.poll() is None, "the playground exited"
        url = line.split("playground at ")[1].split()[0]
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url, timeout=30) as reply:
            assert b"BERT playground" in reply.read()
        with urllib.request.urlopen(url + "api/info", timeout=30) as reply:
            assert json.loads(reply.read())["missing"]["model"].startswith("No model")
    finally:
        process.terminate()
        process.wait(timeout=30)
    refused = run_module_cli("bert_tf.playground", "--port=0")
    assert refused.returncode == 2 and "--model_dir" in refused.stderr


def test_the_example_texts_are_in_words_the_vocabulary_holds_whole(tmp_path):
    english = views.EXAMPLES[0].values()
    docstrings = views.EXAMPLES[1].values()
    # A vocabulary learned from docstrings has their words, not the English set's "penguins".
    for name, texts, expected in (
        ("both", [*english, *docstrings], views.EXAMPLES[0]),
        ("docstrings", docstrings, views.EXAMPLES[1]),
        ("neither", ["an unrelated line ."], views.EXAMPLES[0]),
    ):
        vocab = write_vocab(str(tmp_path / f"{name}.txt"), texts, extra_words=["##s"])
        info = views.Playground(views.PlaygroundSettings(vocab_file=vocab)).info()
        assert info["examples"] == expected, name
