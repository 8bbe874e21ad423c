"""Fill-mask and next-sentence from a model directory with heads: the Python API, the CLI, the
export's signatures and the server, each checked against the NumPy BERT of helpers_google (which
follows the original's get_masked_lm_output and get_next_sentence_output)."""

import dataclasses
import http.client
import json
import os
import random
import re

import grpc
import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    SPECIAL_TOKENS,
    TINY_CONFIG,
    run_module_cli,
    session_outputs,
    tiny_inputs,
    write_tiny_vocab,
)
from helpers_google import (
    GOOGLE_TINY,
    NumpyBert,
    hf_state_dict,
    hf_weights,
    np_gelu,
    np_gelu_exact,
    random_weights,
    write_google_dir,
    write_hf_dir,
)
from helpers_serve import model_server
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from bert_tf import fill_mask
from bert_tf.checkpoints import conversion, name_map
from bert_tf.model import modeling
from bert_tf.model.model_dir import ModelDir, ModelDirError
from bert_tf.pretraining import heldout, masked_lm
from bert_tf.runtime import io_utils
from bert_tf.saved_model import export, masked_lm_serving, warmup

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

VOCAB = SPECIAL_TOKENS + [f"w{i}" for i in range(TINY_CONFIG.vocab_size - len(SPECIAL_TOKENS))]
TEXTS = ["w3 w7 [MASK] w1", "w9 [MASK] w2 w2 [MASK]", "[MASK]"]
PAIRS = (["w1 w2 w3", "w4", "w5 w6"], ["w7 w8", "w9 w10 w11", ""])
SEQ = 16


def reference_ids(text):
    """[CLS] text [SEP], tokenized by hand: every word of TEXTS is one vocabulary token."""
    return [VOCAB.index("[CLS]")] + [VOCAB.index(w) for w in text.split()] + [VOCAB.index("[SEP]")]


def reference(w, gelu, rows):
    """NumpyBert over id lists, padded to the longest (mask 0, segment ids given as the 3rd item)."""
    length = max(len(ids) for ids, _ in rows)
    ids = np.zeros([len(rows), length], np.int64)
    mask, types = np.zeros_like(ids), np.zeros_like(ids)
    for row, (row_ids, row_types) in enumerate(rows):
        ids[row, : len(row_ids)] = row_ids
        mask[row, : len(row_ids)] = 1
        types[row, : len(row_types)] = row_types
    return NumpyBert(w, GOOGLE_TINY, ids, mask, types, gelu)


def softmax(logits):
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Model directories with both heads, converted from a Google checkpoint and from Hugging Face's
    BertForPreTraining, with their weights (original names) and GELU form."""
    root = tmp_path_factory.mktemp("fill_mask")
    google_w = random_weights(GOOGLE_TINY, seed=11)
    prefix = write_google_dir(str(root / "google"), google_w)
    conversion.convert("google", prefix, str(root / "from_google"), do_lower_case=True)
    hf_w = hf_weights("BertForPreTraining", seed=12)
    state = hf_state_dict(hf_w, GOOGLE_TINY, "BertForPreTraining")
    hf_dir = write_hf_dir(root / "hf", state, "BertForPreTraining")
    conversion.convert("huggingface", hf_dir, str(root / "from_hf"))
    mlm_w = hf_weights("BertForMaskedLM", seed=13)
    state = hf_state_dict(mlm_w, GOOGLE_TINY, "BertForMaskedLM")
    conversion.convert(
        "huggingface", write_hf_dir(root / "hf_mlm", state, "BertForMaskedLM"), str(root / "mlm")
    )
    encoder_w = hf_weights("BertModel", seed=14)
    state = hf_state_dict(encoder_w, GOOGLE_TINY, "BertModel")
    conversion.convert(
        "huggingface", write_hf_dir(root / "hf_encoder", state, "BertModel"), str(root / "encoder")
    )
    return {
        "google": (str(root / "from_google"), google_w, np_gelu),
        "hf": (str(root / "from_hf"), hf_w, np_gelu_exact),
        "mlm_only": str(root / "mlm"),
        "encoder_only": str(root / "encoder"),
        "root": root,
    }


@pytest.mark.parametrize("source", ["google", "hf"])
def test_fill_mask_equals_the_numpy_bert(sources, source):
    model_dir, w, gelu = sources[source]
    results = masked_lm.MaskedLM(model_dir).fill_mask(TEXTS, top_k=5)
    ref = reference(w, gelu, [(reference_ids(t), []) for t in TEXTS])
    for row, (text, result) in enumerate(zip(TEXTS, results)):
        positions = [
            i for i, token in enumerate(reference_ids(text)) if token == VOCAB.index("[MASK]")
        ]
        assert [m.position for m in result.masks] == positions
        probabilities = softmax(ref.mlm_logits(np.array([positions] * len(TEXTS)))[row])
        for mask, p in zip(result.masks, probabilities):
            order = np.argsort(-p, kind="stable")[:5]
            assert mask.token_ids == order.tolist()
            assert mask.tokens == [VOCAB[i] for i in order]
            np.testing.assert_allclose(mask.probabilities, p[order], atol=1e-4)
        best = [m.tokens[0] for m in result.masks]
        assert result.filled == masked_lm.fill_text(text, best)
        assert result.cut_masks == 0


@pytest.mark.parametrize("source", ["google", "hf"])
def test_next_sentence_equals_the_numpy_bert(sources, source):
    model_dir, w, gelu = sources[source]
    got = masked_lm.MaskedLM(model_dir).next_sentence(*PAIRS)
    rows = []
    for a, b in zip(*PAIRS):
        a_ids = reference_ids(a)
        b_ids = [VOCAB.index(x) for x in b.split()]
        # An empty b packs as the single sentence [CLS] a [SEP], as fine-tuning packs it.
        ids = a_ids + (b_ids + [VOCAB.index("[SEP]")] if b_ids else [])
        rows.append((ids, [0] * len(a_ids) + [1] * (len(ids) - len(a_ids))))
    expected = softmax(reference(w, gelu, rows).nsp_logits())[:, 0]  # label 0 is IsNext
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_a_model_pretrained_here_reads_back_as_the_original_computes_it(tmp_path):
    # Known weights (original names) in a model written in this project's own checkpoint format.
    vocab = write_tiny_vocab(str(tmp_path / "vocab.txt"))
    config = modeling.BertConfig.from_dict(dict(GOOGLE_TINY, do_lower_case=True))
    model, encoder = modeling.build_pretraining_model(config)
    w = random_weights(GOOGLE_TINY, seed=15)
    shapes = {name: value.shape for name, value in w.items()}
    name_map.assign_original_weights("w", shapes, w.get, model, config.num_hidden_layers, True)
    ModelDir(str(tmp_path / "model")).write(config, vocab, encoder, pretraining_model=model)
    (result,) = masked_lm.MaskedLM(str(tmp_path / "model")).fill_mask(TEXTS[:1], top_k=3)
    ref = reference(w, np_gelu, [(reference_ids(TEXTS[0]), [])])
    p = softmax(ref.mlm_logits(np.array([[3]]))[0, 0])
    assert result.masks[0].token_ids == np.argsort(-p)[:3].tolist()
    np.testing.assert_allclose(result.masks[0].probabilities, np.sort(p)[::-1][:3], atol=1e-4)


def test_masks_past_max_seq_length_are_named_as_cut(sources):
    model_dir, _, _ = sources["google"]
    text = " ".join(["[MASK]"] * 500)
    (result,) = masked_lm.MaskedLM(model_dir, max_seq_length=SEQ).fill_mask([text], top_k=2)
    assert len(result.masks) == SEQ - 2 and result.cut_masks == 500 - (SEQ - 2)
    assert [m.position for m in result.masks] == list(range(1, SEQ - 1))
    assert result.filled.count("[MASK]") == result.cut_masks


def test_bad_questions_are_refused_naming_what(sources):
    model = masked_lm.MaskedLM(sources["google"][0])
    with pytest.raises(masked_lm.NoMaskError, match=r"row 1 has no \[MASK\]"):
        model.fill_mask(["w1 [MASK]", "w1 w2"])
    for top_k in (0, TINY_CONFIG.vocab_size + 1):
        with pytest.raises(ValueError, match="top_k must be in"):
            model.fill_mask(["w1 [MASK]"], top_k=top_k)
    assert model.fill_mask([]) == []
    assert model.next_sentence([], []).shape == (0,)
    # A literal [mask] is ordinary text, not the token.
    with pytest.raises(masked_lm.NoMaskError):
        model.fill_mask(["w1 [mask]"])
    with pytest.raises(ModelDirError, match="NSP"):
        masked_lm.MaskedLM(sources["mlm_only"]).next_sentence(["w1"], ["w2"])
    with pytest.raises(ModelDirError, match="MLM"):
        masked_lm.MaskedLM(sources["encoder_only"]).fill_mask(["w1 [MASK]"])


def test_cli_prints_a_table_for_each_mask_and_exits_2_on_bad_input(sources, tmp_path):
    model_dir = sources["google"][0]
    result = run_module_cli("bert_tf.fill_mask", f"--model_dir={model_dir}", "--top_k=3", TEXTS[1])
    assert result.returncode == 0, result.stderr[-2000:]
    expected = masked_lm.MaskedLM(model_dir).fill_mask([TEXTS[1]], top_k=3)[0]
    for mask in expected.masks:
        assert f"(position {mask.position})" in result.stdout
        assert (
            f"{mask.tokens[0]}" in result.stdout and f"{mask.probabilities[0]:.4f}" in result.stdout
        )
    assert f"filled: {expected.filled}" in result.stdout
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("w1 w2 ||| w3\nw4 ||| w5 w6\n")
    result = run_module_cli(
        "bert_tf.fill_mask", f"--model_dir={model_dir}", "--next_sentence", f"--input_file={pairs}"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    probabilities = masked_lm.MaskedLM(model_dir).next_sentence(["w1 w2", "w4"], ["w3", "w5 w6"])
    assert [f"IsNext {p:.4f}" in result.stdout for p in probabilities] == [True, True]
    for flags, message in (
        (["w1 w2"], "row 0 has no [MASK] (the token is [MASK], in capitals)"),
        (["--top_k=0", "w1 [MASK]"], f"--top_k must be in [1, {TINY_CONFIG.vocab_size}]"),
        (["--next_sentence", "w1"], "pairs of texts"),
        ([], "give the texts"),
    ):
        result = run_module_cli("bert_tf.fill_mask", f"--model_dir={model_dir}", *flags)
        assert result.returncode == 2 and message in result.stderr, result.stderr[-1000:]
    result = run_module_cli(
        "bert_tf.fill_mask", f"--model_dir={sources['encoder_only']}", "w1 [MASK]"
    )
    assert result.returncode == 2 and "MLM" in result.stderr and "Traceback" not in result.stderr


def test_a_lower_case_mask_is_refused_saying_the_token_is_in_capitals(sources):
    model = masked_lm.MaskedLM(sources["google"][0])
    with pytest.raises(masked_lm.NoMaskError, match=r"row 1 has no \[MASK\] \(the token is "):
        model.fill_mask(["w1 [MASK]", "w1 [mask]"])


# Held-out documents of the tiny vocabulary's words (w0..w17): 6 of 4 sentences, 3 to 6 words each.
_WORDS = random.Random(7)
HELDOUT = [
    [" ".join(f"w{_WORDS.randrange(18)}" for _ in range(_WORDS.randint(3, 6))) for _ in range(4)]
    for _ in range(6)
]


def write_heldout(path, documents=HELDOUT):
    path.write_text("".join("\n".join(document) + "\n\n" for document in documents))
    return str(path)


def test_heldout_fill_mask_accuracy_is_what_fill_mask_answers(sources, tmp_path):
    assert len({s for d in HELDOUT for s in d}) == sum(len(d) for d in HELDOUT)
    model = masked_lm.MaskedLM(sources["google"][0])
    scores = heldout.evaluate(model, write_heldout(tmp_path / "heldout.txt"), max_questions=20)
    # The same draws, asked one text at a time through the public API: words stand for themselves
    # in this vocabulary, so a masked word is right when the top token is the word.
    rng = random.Random(heldout.SEED)
    sentences = rng.sample([s for d in HELDOUT for s in d], 20)
    right = total = 0
    for sentence in sentences:
        words = sentence.split()
        chosen = sorted(rng.sample(range(len(words)), max(1, round(0.15 * len(words)))))
        text = " ".join("[MASK]" if i in chosen else w for i, w in enumerate(words))
        (result,) = model.fill_mask([text], top_k=1)
        right += sum(m.tokens[0] == words[i] for m, i in zip(result.masks, chosen))
        total += len(chosen)
    assert (scores.sentences, scores.masked_words) == (20, total)
    assert 0 < right < total  # a random model: some right, some wrong, so the count is compared
    assert scores.fill_mask_accuracy == pytest.approx(right / total)


def test_heldout_pairs_are_balanced_real_neighbours_and_other_documents(sources):
    model = masked_lm.MaskedLM(sources["google"][0])
    pairs = heldout.next_sentence_pairs(HELDOUT, random.Random(0), max_pairs=15)
    labels = np.array([is_next for _, _, is_next in pairs])
    assert len(pairs) == 15 and labels.sum() == 8
    neighbours = {(d[i], d[i + 1]) for d in HELDOUT for i in range(len(d) - 1)}
    document_of = {s: index for index, d in enumerate(HELDOUT) for s in d}
    for text_a, text_b, is_next in pairs:
        if is_next:
            assert (text_a, text_b) in neighbours
        else:
            assert document_of[text_a] != document_of[text_b]
    p = model.next_sentence([a for a, _, _ in pairs], [b for _, b, _ in pairs])
    assert heldout.next_sentence_accuracy(model, pairs) == pytest.approx(
        np.mean((p > 0.5) == labels)
    )


def test_cli_prints_the_heldout_accuracies_on_lines_of_their_own(sources, tmp_path):
    model_dir = sources["google"][0]
    path = write_heldout(tmp_path / "heldout.txt")
    result = run_module_cli(
        "bert_tf.fill_mask", f"--model_dir={model_dir}", f"--evaluate_file={path}", TEXTS[0]
    )
    assert result.returncode == 0, result.stderr[-2000:]
    expected = heldout.evaluate(masked_lm.MaskedLM(model_dir), path)
    lines = result.stdout.splitlines()
    assert lines[:2] == expected.lines()
    assert lines[0].startswith("fill-mask top-1 accuracy on held-out sentences: 0.")
    assert lines[1].startswith("next-sentence accuracy on held-out pairs: 0.")
    assert lines[2] == TEXTS[0]  # the texts are answered after the figures


def test_a_model_with_the_mlm_head_alone_gets_its_fill_mask_figure(sources, tmp_path):
    scores = heldout.evaluate(
        masked_lm.MaskedLM(sources["mlm_only"]), write_heldout(tmp_path / "heldout.txt"), 20
    )
    assert scores.masked_words > 0 and scores.next_sentence_accuracy is None
    assert scores.lines()[1] == (
        "next-sentence accuracy on held-out pairs: n/a (the model has no NSP head)"
    )


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "--evaluate_file file not found"),
        ("one_document", "holds 1 documents; at least 2 are needed"),
        ("no_heads", "MLM"),
        ("max_questions", "--max_questions must be at least 1"),
    ],
)
def test_bad_evaluations_are_usage_errors(sources, tmp_path, case, message):
    documents = HELDOUT[:1] if case == "one_document" else HELDOUT
    args = fill_mask.FillMaskArgs(
        model_dir=sources["encoder_only"] if case == "no_heads" else sources["google"][0],
        evaluate_file=str(tmp_path / "missing.txt")
        if case == "missing"
        else write_heldout(tmp_path / "heldout.txt", documents),
        max_questions=0 if case == "max_questions" else heldout.DEFAULT_MAX_QUESTIONS,
    )
    with pytest.raises(io_utils.UsageError, match=re.escape(message)):
        fill_mask.run(args)


@pytest.fixture(scope="module")
def exported(sources):
    """The HF-converted model exported (max_seq_length SEQ), and the SavedModel loaded."""
    export_dir = str(sources["root"] / "export")
    path, kind = export.export(sources["hf"][0], export_dir, max_seq_length=SEQ)
    return path, tf.saved_model.load(path)


def test_export_signatures_answer_as_the_python_api(sources, exported):
    path, loaded = exported
    assert {"serving_default", "fill_mask", "next_sentence"} <= set(loaded.signatures)
    texts = TEXTS + ["w1 " * 20 + "[MASK] [MASK]", "w4 [MASK] w5 " + "[MASK] " * 30]
    model = masked_lm.MaskedLM(sources["hf"][0], max_seq_length=SEQ)
    expected = model.fill_mask(texts, top_k=4)
    got = {
        k: v.numpy()
        for k, v in loaded.signatures["fill_mask"](
            text=tf.constant(texts), top_k=tf.constant(4)
        ).items()
    }
    masks = max(len(r.masks) for r in expected)
    assert got["token_ids"].shape == (len(texts), masks, 4)
    for row, result in enumerate(expected):
        n = len(result.masks)
        assert got["mask_positions"][row, :n].tolist() == [m.position for m in result.masks]
        assert (got["mask_positions"][row, n:] == -1).all() and (
            got["token_ids"][row, n:] == -1
        ).all()
        assert (got["tokens"][row, n:] == b"").all()
        for index, mask in enumerate(result.masks):
            assert got["token_ids"][row, index].tolist() == mask.token_ids
            assert [t.decode() for t in got["tokens"][row, index]] == mask.tokens
            np.testing.assert_allclose(
                got["probabilities"][row, index], mask.probabilities, atol=1e-5
            )
        assert got["filled"][row].decode() == result.filled
    # top_k is optional: its SignatureDef default is 5.
    default = loaded.heads.fill_mask(tf.constant(TEXTS[:1]))
    assert default["token_ids"].shape == (1, 1, masked_lm.DEFAULT_TOP_K)
    got = loaded.signatures["next_sentence"](
        text_a=tf.constant(PAIRS[0]), text_b=tf.constant(PAIRS[1])
    )["is_next_probability"].numpy()
    np.testing.assert_allclose(got, model.next_sentence(*PAIRS), atol=1e-5)


def test_a_session_based_loader_runs_the_heads(sources, exported):
    # As TF Serving loads a SavedModel: a TF1 session, variables restored by the saver.
    path, loaded = exported
    got = session_outputs(path, "fill_mask", {"text": TEXTS, "top_k": 3})
    want = loaded.signatures["fill_mask"](text=tf.constant(TEXTS), top_k=tf.constant(3))
    np.testing.assert_allclose(got["probabilities"], want["probabilities"].numpy(), atol=1e-6)
    got = session_outputs(path, "next_sentence", {"text_a": PAIRS[0], "text_b": PAIRS[1]})
    want = masked_lm.MaskedLM(sources["hf"][0], SEQ).next_sentence(*PAIRS)
    np.testing.assert_allclose(got["is_next_probability"], want, atol=1e-5)


def test_export_refuses_bad_rows_and_answers_an_empty_batch(exported):
    _, loaded = exported
    fill_mask = loaded.signatures["fill_mask"]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"text\[1\] has no \[MASK\]"):
        fill_mask(text=tf.constant(["w1 [MASK]", "w2 w3"]), top_k=tf.constant(2))
    for top_k in (0, TINY_CONFIG.vocab_size + 1):
        with pytest.raises(tf.errors.InvalidArgumentError, match="top_k must be in"):
            fill_mask(text=tf.constant(["w1 [MASK]"]), top_k=tf.constant(top_k))
    empty = fill_mask(text=tf.constant([], tf.string), top_k=tf.constant(3))
    assert {k: tuple(v.shape) for k, v in empty.items()} == {
        "tokens": (0, 0, 3),
        "token_ids": (0, 0, 3),
        "probabilities": (0, 0, 3),
        "mask_positions": (0, 0),
        "filled": (0,),
    }
    empty = loaded.signatures["next_sentence"](
        text_a=tf.constant([], tf.string), text_b=tf.constant([], tf.string)
    )
    assert empty["is_next_probability"].shape == (0,)


def test_warm_up_file_asks_every_signature(exported):
    path, _ = exported
    names = {request.signature_name for request in warmup.read_requests(path)}
    assert names == {"serving_default", "fill_mask", "next_sentence"}


def test_export_of_a_directory_without_heads_has_the_encoder_alone(sources, tmp_path, caplog):
    path, _ = export.export(sources["encoder_only"], str(tmp_path / "export"), max_seq_length=SEQ)
    assert set(tf.saved_model.load(path).signatures) == {"serving_default"}
    assert "no pretraining heads" in caplog.text and "no fill-mask" in caplog.text
    path, _ = export.export(sources["mlm_only"], str(tmp_path / "export_mlm"), max_seq_length=SEQ)
    assert set(tf.saved_model.load(path).signatures) == {"serving_default", "fill_mask"}


def post(port, body):
    """POST a predict request to the served model "bert"; returns (status, parsed JSON)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", "/v1/models/bert:predict", body=json.dumps(body).encode())
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_served_over_rest_and_grpc(exported):
    path, loaded = exported
    expected = loaded.signatures["fill_mask"](text=tf.constant(TEXTS[:2]), top_k=tf.constant(2))
    with model_server({"bert": os.path.dirname(path)}, grpc_port=0) as server:
        body = {"signature_name": "fill_mask", "inputs": {"text": TEXTS[:2], "top_k": 2}}
        status, reply = post(server.port, body)
        assert status == 200, reply
        assert reply["outputs"]["token_ids"] == expected["token_ids"].numpy().tolist()
        assert reply["outputs"]["filled"] == [f.decode() for f in expected["filled"].numpy()]
        body = {"signature_name": "fill_mask", "inputs": {"text": ["w1 w2"], "top_k": 2}}
        status, reply = post(server.port, body)
        assert (
            status == 400
            and "text[0] has no [MASK] (the token is [MASK], in capitals)" in reply["error"]
        )
        body = {"signature_name": "next_sentence", "instances": [{"text_a": "w1", "text_b": "w2"}]}
        status, reply = post(server.port, body)
        assert status == 200 and len(reply["predictions"]) == 1
        # REST may not leave top_k out: TF Serving's REST parser wants every signature input,
        # defaults or not (json_tensor.cc); its gRPC fills the SignatureDef's default in.
        body = {"signature_name": "fill_mask", "inputs": {"text": TEXTS[:1]}}
        status, reply = post(server.port, body)
        assert (status, reply["error"]) == (400, "Missing named input: top_k in 'inputs' object.")
        body = {"signature_name": "fill_mask", "instances": [{"text": TEXTS[0]}]}
        status, reply = post(server.port, body)
        assert status == 400 and "top_k" in reply["error"]
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            request = predict_pb2.PredictRequest()
            request.model_spec.name, request.model_spec.signature_name = "bert", "fill_mask"
            request.inputs["text"].CopyFrom(tf.make_tensor_proto(TEXTS[:1]))
            response = stub.Predict(request, timeout=60)
            assert tuple(tf.make_ndarray(response.outputs["token_ids"]).shape) == (1, 1, 5)


def test_a_fill_mask_call_refuses_an_answer_past_its_bound_before_the_model_runs(exported):
    _, loaded = exported
    masks = SEQ - 2
    rows = masked_lm_serving.MAX_ANSWERS // (masks * TINY_CONFIG.vocab_size) + 1
    texts = tf.constant([" ".join(["[MASK]"] * masks)] * rows)
    fill_mask = loaded.signatures["fill_mask"]
    message = f"{rows} rows x {masks} \\[MASK\\]s x top_k {TINY_CONFIG.vocab_size} tokens"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        fill_mask(text=texts, top_k=tf.constant(TINY_CONFIG.vocab_size))
    # One row fewer is answered.
    answer = fill_mask(text=texts[1:], top_k=tf.constant(TINY_CONFIG.vocab_size))
    assert answer["token_ids"].shape == (rows - 1, masks, TINY_CONFIG.vocab_size)


def test_the_server_bounds_every_answer_over_rest_and_grpc(exported):
    path, _ = exported
    texts = ["[MASK] w1 [MASK]"] * 6  # 6 rows x 2 masks x top_k 20 = 240 tokens, 3 outputs
    limit = 600
    with model_server(
        {"bert": os.path.dirname(path)}, grpc_port=0, max_batch_size=2, max_response_elements=limit
    ) as server:
        status, reply = post(
            server.port, {"signature_name": "fill_mask", "inputs": {"text": texts, "top_k": 20}}
        )
        # Stopped after its first chunk, whose answer projects past the limit.
        assert status == 429, reply
        assert "from its first 2 rows of 6" in reply["error"]
        assert "--max_response_elements" in reply["error"]
        status, reply = post(
            server.port, {"signature_name": "fill_mask", "inputs": {"text": texts, "top_k": 4}}
        )
        assert status == 200 and np.shape(reply["outputs"]["token_ids"]) == (6, 2, 4)
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            request = predict_pb2.PredictRequest()
            request.model_spec.name, request.model_spec.signature_name = "bert", "fill_mask"
            request.inputs["text"].CopyFrom(tf.make_tensor_proto(texts))
            request.inputs["top_k"].CopyFrom(tf.make_tensor_proto(20))
            with pytest.raises(grpc.RpcError) as refused:
                stub.Predict(request, timeout=60)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # An output_filter counts only the outputs kept: 240 ids fit.
            request.output_filter.append("token_ids")
            response = stub.Predict(request, timeout=60)
            assert tuple(tf.make_ndarray(response.outputs["token_ids"]).shape) == (6, 2, 20)


def test_warm_up_words_come_from_any_vocabulary(tmp_path):
    # A converted checkpoint's vocabulary may hold no plain lower-case word (digits in every token).
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(SPECIAL_TOKENS + ["##a", "W1", "w1", "x2"]) + "\n")
    assert warmup.filler_word(str(path)) == "w1"
    path.write_text("\n".join(SPECIAL_TOKENS + ["hello", "w1"]) + "\n")
    assert warmup.filler_word(str(path)) == "hello"
    path.write_text("\n".join(SPECIAL_TOKENS + ["##a", "A", "é"]) + "\n")
    with pytest.raises(io_utils.UsageError, match="no whole word"):
        warmup.filler_word(str(path))


def test_a_big_fill_mask_request_runs_in_chunks_with_the_same_answers(exported):
    # top_k, a scalar, goes whole to every chunk; rows with more [MASK]s pad the others as one
    # call would (the server evens the chunks' outputs out).
    path, loaded = exported
    texts = TEXTS + ["w1 [MASK] w2", "w3 w4 [MASK] [MASK] [MASK] w5"]
    expected = loaded.signatures["fill_mask"](text=tf.constant(texts), top_k=tf.constant(2))
    with model_server({"bert": os.path.dirname(path)}, max_batch_size=2, warmup=False) as server:
        body = {"signature_name": "fill_mask", "inputs": {"text": texts, "top_k": 2}}
        status, reply = post(server.port, body)
    assert status == 200, reply
    assert reply["outputs"]["token_ids"] == expected["token_ids"].numpy().tolist()
    assert reply["outputs"]["mask_positions"] == expected["mask_positions"].numpy().tolist()
    np.testing.assert_allclose(
        reply["outputs"]["probabilities"], expected["probabilities"].numpy(), atol=1e-5
    )


def test_a_left_to_right_model_answers_no_fill_mask_and_exports_its_encoder(tmp_path, caplog):
    # run_pretraining --objective=ltr's layout: a left_to_right config, the MLM head's layer
    # (trained to predict the next token) and no NSP head.
    vocab = write_tiny_vocab(str(tmp_path / "vocab.txt"))
    config = dataclasses.replace(TINY_CONFIG, attention_direction=modeling.LEFT_TO_RIGHT)
    model, encoder = modeling.build_pretraining_model(config, with_nsp_head=False)
    model_dir = str(tmp_path / "ltr")
    ModelDir(model_dir).write(config, vocab, encoder, pretraining_model=model, heads={"mlm"})
    assert ModelDir(model_dir).pretraining_heads() == {"mlm"}
    with pytest.raises(ModelDirError, match="is a left-to-right language model"):
        masked_lm.MaskedLM(model_dir).fill_mask(["w1 [MASK]"])
    result = run_module_cli("bert_tf.fill_mask", f"--model_dir={model_dir}", "w1 [MASK] w2")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "its LM head predicts the next token, not a [MASK]" in result.stderr
    # The export has the encoder alone, and it computes what the Keras encoder does.
    path, kind = export.export(model_dir, str(tmp_path / "export"), max_seq_length=SEQ)
    loaded = tf.saved_model.load(path)
    assert kind == "encoder" and set(loaded.signatures) == {"serving_default"}
    assert "left-to-right language model" in caplog.text and "no fill_mask" in caplog.text
    inputs = tiny_inputs(seq=9, seed=5)
    got = loaded.signatures["serving_default"](**{k: tf.constant(v) for k, v in inputs.items()})
    np.testing.assert_allclose(
        got["sequence_output"].numpy(), encoder(inputs)["sequence_output"].numpy(), atol=1e-5
    )
