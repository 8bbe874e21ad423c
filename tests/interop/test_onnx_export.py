"""convert_checkpoint --to=onnx: every kind as a fused ONNX model plus tokenizer.json, answering in
ONNX Runtime as our SavedModel export answers the same strings."""

import json
import os
import pathlib

import numpy as np
import onnx
import onnxruntime
import pytest
import tensorflow as tf
from helpers import run_module_cli
from helpers_exports import PRETRAINED, shared_exports
from tokenizers import Tokenizer

from bert_tf.interop import onnx_export
from bert_tf.model.model_dir import ModelDir
from bert_tf.runtime import io_utils
from bert_tf.tasks import models

TEXTS = ["the quick brown fox jumps over the lazy dog .", "a delightful film", ""]
PAIRS = [("is it raining ?", "the streets are wet ."), ("who won", "nobody knows")]
# Within CHECK_TOLERANCE of the export; the outputs are probabilities or logits of size ~1.
TOLERANCE = onnx_export.CHECK_TOLERANCE


@pytest.fixture(scope="module")
def every_export(tmp_path_factory, real_vocab):
    return shared_exports(tmp_path_factory, real_vocab)


@pytest.fixture(scope="module")
def converted(every_export, tmp_path_factory):
    """{name: ONNX output dir} of every shared model directory, converted once."""
    root = tmp_path_factory.mktemp("onnx")
    result = {}
    for name, version_dir in every_export.items():
        if name == "preprocess":
            continue
        model_dir = pathlib.Path(version_dir).parents[2] / "models" / name
        result[name] = str(root / name)
        onnx_export.export(str(model_dir), result[name])
    return result


def session(output_dir):
    return onnxruntime.InferenceSession(
        os.path.join(output_dir, onnx_export.MODEL_FILE), providers=["CPUExecutionProvider"]
    )


def encode(output_dir, texts, pairs=None):
    """tokenizer.json's int64 inputs for `texts` (or text pairs), padded to the longest row."""
    tokenizer = Tokenizer.from_file(os.path.join(output_dir, "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    encodings = tokenizer.encode_batch(pairs if pairs is not None else texts)
    return {
        "input_ids": np.array([e.ids for e in encodings], np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], np.int64),
        "token_type_ids": np.array([e.type_ids for e in encodings], np.int64),
    }


def run(output_dir, inputs):
    onnx_session = session(output_dir)
    names = [o.name for o in onnx_session.get_outputs()]
    return dict(zip(names, onnx_session.run(None, inputs)))


def softmax(logits):
    shifted = np.exp(logits - logits.max(-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)


def serve(every_export, name, **inputs):
    signature = tf.saved_model.load(every_export[name]).signatures["serving_default"]
    return {k: v.numpy() for k, v in signature(**inputs).items()}


def serve_pairs(every_export, name):
    return serve(
        every_export,
        name,
        text_a=tf.constant([a for a, _ in PAIRS]),
        text_b=tf.constant([b for _, b in PAIRS]),
    )


def test_the_graph_is_fused_as_onnx_runtimes_optimizer_fuses_a_bert(converted):
    model = onnx.load(os.path.join(converted["classifier"], onnx_export.MODEL_FILE))
    ops = [node.op_type for node in model.graph.node]
    layers = 2  # helpers.tiny_config
    assert ops.count("EmbedLayerNormalization") == 1
    assert ops.count("Attention") == layers
    assert ops.count("SkipLayerNormalization") == 2 * layers
    assert ops.count("FastGelu") == layers  # our "gelu", the tanh form
    assert "Softmax" not in ops and "Erf" not in ops
    assert [i.name for i in model.graph.input] == list(onnx_export.INPUTS)
    assert [o.name for o in model.graph.output] == ["logits"]


def test_a_classifier_and_a_pair_classifier_give_the_exports_probabilities(every_export, converted):
    got = softmax(run(converted["classifier"], encode(converted["classifier"], TEXTS))["logits"])
    want = serve(every_export, "classifier", text=tf.constant(TEXTS))["probabilities"]
    np.testing.assert_allclose(got, want, atol=TOLERANCE)
    got = softmax(
        run(converted["pair_classifier"], encode(converted["pair_classifier"], None, PAIRS))[
            "logits"
        ]
    )
    want = serve_pairs(every_export, "pair_classifier")["probabilities"]
    np.testing.assert_allclose(got, want, atol=TOLERANCE)


def test_a_regressor_gives_the_exports_score(every_export, converted):
    got = run(converted["regressor"], encode(converted["regressor"], None, PAIRS))["logits"]
    want = serve_pairs(every_export, "regressor")["score"]
    np.testing.assert_allclose(got[:, 0], want, atol=TOLERANCE)


def test_multiple_choice_gives_the_exports_probabilities(every_export, converted):
    context, endings = "she opened the door", ["and walked in .", "a cat", "then it rained ."]
    single = encode(converted["multiple_choice"], None, [(context, e) for e in endings])
    inputs = {name: value[np.newaxis] for name, value in single.items()}  # [1, choices, s]
    got = softmax(run(converted["multiple_choice"], inputs)["logits"])
    want = serve(
        every_export,
        "multiple_choice",
        context=tf.constant([context]),
        endings=tf.constant([endings]),
    )["probabilities"]
    assert got.shape == (1, 3)
    np.testing.assert_allclose(got, want, atol=TOLERANCE)


@pytest.mark.parametrize("name", ["ner", "squad"])
def test_token_level_kinds_give_our_models_logits(converted, every_export, name):
    model_dir = pathlib.Path(every_export[name]).parents[2] / "models" / name
    model, *_ = models.load_task_model(ModelDir(str(model_dir)))
    inputs = encode(converted[name], None, [("when did it start ?", "it started in 1990 .")])
    want = model(
        {
            "input_word_ids": tf.constant(inputs["input_ids"], tf.int32),
            "input_mask": tf.constant(inputs["attention_mask"], tf.int32),
            "input_type_ids": tf.constant(inputs["token_type_ids"], tf.int32),
        },
        training=False,
    )
    got = run(converted[name], inputs)
    assert set(got) == set(want)
    for key in got:
        np.testing.assert_allclose(got[key], want[key].numpy(), atol=TOLERANCE, err_msg=key)


def test_the_pretrained_heads_give_the_exports_fill_mask_and_next_sentence(every_export, converted):
    text = "the [MASK] of the module is returned ."
    inputs = encode(converted[PRETRAINED], [text])
    outputs = run(converted[PRETRAINED], inputs)
    position = int(np.flatnonzero(inputs["input_ids"][0] == 103)[0])  # [MASK] in the real vocab
    probabilities = softmax(outputs["logits"][0, position])
    signatures = tf.saved_model.load(every_export[PRETRAINED]).signatures
    filled = signatures["fill_mask"](text=tf.constant([text]), top_k=tf.constant(3))
    np.testing.assert_array_equal(np.argsort(-probabilities)[:3], filled["token_ids"][0, 0])
    np.testing.assert_allclose(
        np.sort(probabilities)[::-1][:3], filled["probabilities"][0, 0], atol=TOLERANCE
    )
    pair = encode(converted[PRETRAINED], None, PAIRS)
    is_next = softmax(run(converted[PRETRAINED], pair)["seq_relationship_logits"])[:, 0]
    want = signatures["next_sentence"](
        text_a=tf.constant([a for a, _ in PAIRS]), text_b=tf.constant([b for _, b in PAIRS])
    )["is_next_probability"]
    np.testing.assert_allclose(is_next, want.numpy(), atol=TOLERANCE)


def test_any_attention_mask_works_not_only_right_padding(converted, every_export):
    """Attention reads the raw mask: a row padded on the left answers as the same row unpadded."""
    inputs = encode(converted["ner"], ["a delightful film"])
    padded = {name: np.pad(value, ((0, 0), (3, 0))) for name, value in inputs.items()}
    plain, left = run(converted["ner"], inputs)["logits"], run(converted["ner"], padded)["logits"]
    # Positions differ by 3 on the left, so the position embeddings differ: compare the model's own
    # answer for the padded layout instead.
    model_dir = pathlib.Path(every_export["ner"]).parents[2] / "models" / "ner"
    model, *_ = models.load_task_model(ModelDir(str(model_dir)))
    want = model(
        {
            "input_word_ids": tf.constant(padded["input_ids"], tf.int32),
            "input_mask": tf.constant(padded["attention_mask"], tf.int32),
            "input_type_ids": tf.constant(padded["token_type_ids"], tf.int32),
        },
        training=False,
    )["logits"]
    np.testing.assert_allclose(left, want.numpy(), atol=TOLERANCE)
    assert plain.shape[1] + 3 == left.shape[1]


def test_the_cli_writes_the_onnx_door_and_refuses_what_onnx_cannot_hold(every_export, tmp_path):
    model_dir = pathlib.Path(every_export["classifier"]).parents[2] / "models" / "classifier"
    output_dir = tmp_path / "onnx"
    process = run_module_cli(
        "bert_tf.convert_checkpoint",
        "--to=onnx",
        f"--model_dir={model_dir}",
        f"--output_dir={output_dir}",
    )
    assert process.returncode == 0, process.stderr[-2000:]
    assert "outputs logits): ONNX Runtime's outputs are within" in process.stdout
    assert sorted(os.listdir(output_dir)) == [
        "bert_tf_output.json",
        "config.json",
        "model.onnx",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    config = json.loads((output_dir / "config.json").read_text())
    assert config["id2label"] == {"0": "no", "1": "yes"}
    # A model of another activation is refused before anything is written.
    relu_dir = tmp_path / "relu"
    (relu_dir).mkdir()
    for entry in os.listdir(model_dir):
        tf.io.gfile.copy(str(model_dir / entry), str(relu_dir / entry))
    config_file = relu_dir / "bert_config.json"
    values = json.loads(config_file.read_text())
    config_file.write_text(json.dumps(dict(values, hidden_act="relu")))
    with pytest.raises(io_utils.UsageError, match="hidden_act=relu: the ONNX export writes gelu"):
        onnx_export.export(str(relu_dir), str(tmp_path / "relu_onnx"))
    assert not (tmp_path / "relu_onnx").exists()
