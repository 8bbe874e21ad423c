"""Export: a model directory of every kind to Hugging Face and to a keras-hub preset, exactly.

The Hugging Face files are checked against the NumPy BERT of helpers_google (their names mapped by
hand below, from transformers' modeling_bert.py, independent of both converters), then imported
back with --format=huggingface and compared variable for variable and output for output, bit for
bit. The keras-hub presets are loaded by keras-hub itself.
"""

import dataclasses
import glob
import json
import os

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf
from helpers import run_module_cli, tiny_config, tiny_inputs, write_tiny_vocab
from helpers_google import NumpyBert, np_gelu, np_gelu_exact
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from bert_tf.checkpoints import conversion, huggingface, name_map
from bert_tf.interop import hf_export, keras_hub_export
from bert_tf.model import modeling
from bert_tf.model.model_dir import ALL_HEADS, ModelDir, pretraining_checkpoint_object
from bert_tf.runtime import io_utils
from bert_tf.tasks import models
from bert_tf.tokenization import python_tokenizer

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

PRETRAINED = {
    "pretraining": ALL_HEADS,
    "mlm": frozenset({"mlm"}),
    "nsp": frozenset({"nsp"}),
    "encoder": frozenset(),
}
SPECS = {
    "classifier": models.TaskSpec("classifier", labels=["neg", "neutral", "pos"], is_pair=True),
    "regressor": models.TaskSpec("regressor", is_pair=True),
    "ner": models.TaskSpec("ner", labels=["O", "B-PER", "I-PER", "B-LOC"]),
    "squad": models.TaskSpec("squad", max_seq_length=64, max_query_length=16),
    "multiple_choice": models.TaskSpec("multiple_choice"),
}
KINDS = list(PRETRAINED) + list(SPECS)
WANT_ARCHITECTURE = {
    "pretraining": "BertForPreTraining",
    "mlm": "BertForMaskedLM",
    "nsp": "BertForNextSentencePrediction",
    "encoder": "BertModel",
    "classifier": "BertForSequenceClassification",
    "regressor": "BertForSequenceClassification",
    "ner": "BertForTokenClassification",
    "squad": "BertForQuestionAnswering",
    "multiple_choice": "BertForMultipleChoice",
}
POSITIONS = np.array([[1, 4, 6], [0, 2, 3]], np.int32)
HF_FILES = {
    "config.json",
    "model.safetensors",
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
}


def randomize(model, seed):
    """Every variable random (LayerNorm gammas near 1), so a weight in the wrong place shows."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        value = rng.normal(0, 0.5 if "embedding" in variable.path else 0.3, variable.shape)
        if variable.path.endswith("gamma"):
            value = 1 + 0.1 * value
        variable.assign(value.astype(np.float32))


def write_model_dir(path, kind, seed=0, **config_overrides):
    """A tiny model directory of `kind` with random weights; returns (path, the Keras model written)."""
    path = str(path)
    os.makedirs(path)
    vocab = write_tiny_vocab(os.path.join(path, "vocab.txt"))
    config = tiny_config(**config_overrides)
    directory = ModelDir(path)
    if kind in SPECS:
        model, encoder = models.build_task_model(config, SPECS[kind])
        randomize(model, seed)
        directory.write(config, vocab, encoder, spec=SPECS[kind], model=model)
    elif PRETRAINED[kind]:
        model, encoder = modeling.build_pretraining_model(config)
        randomize(model, seed)
        directory.write(config, vocab, encoder, pretraining_model=model, heads=PRETRAINED[kind])
    else:
        model = modeling.build_encoder(config)
        randomize(model, seed)
        directory.write(config, vocab, model)
    return path, model


def load_back(path, kind):
    """The model of a model directory of `kind`, as written by write_model_dir (only real heads)."""
    directory = ModelDir(path)
    if kind in SPECS:
        model, _, config, spec = models.load_task_model(directory)
        assert spec == SPECS[kind]
        return config, model
    config = directory.load_config()
    heads = PRETRAINED[kind]
    assert directory.pretraining_heads() == heads
    if not heads:
        return config, directory.load_encoder()
    model, encoder = modeling.build_pretraining_model(config)
    directory.restore(
        encoder=encoder, pretraining_model=pretraining_checkpoint_object(model, heads)
    )
    return config, model


def model_inputs(kind):
    """The inputs of a model of `kind`: [b, choices, s] for multiple choice, with masked positions
    for a pretraining model."""
    if kind == "multiple_choice":
        x = tiny_inputs(batch=6, seq=7, seed=5)
        return {name: value.reshape(2, 3, 7) for name, value in x.items()}
    x = tiny_inputs(seq=7, seed=4)
    if kind in PRETRAINED and PRETRAINED[kind]:
        x["masked_lm_positions"] = POSITIONS
    return x


def our_outputs(model, kind):
    """{name: numpy array} of every output of `model` that the export carries."""
    outputs = model(model_inputs(kind), training=False)
    if kind == "encoder":
        names = ["sequence_output", "pooled_output"]
    elif kind in PRETRAINED:
        names = [f"{head}_logits" for head in sorted(PRETRAINED[kind])]
    else:
        names = list(outputs)
    return {name: np.asarray(outputs[name]) for name in names}


# --- The Hugging Face files, read by hand -----------------------------------------------------


def reference_weights(state, num_layers):
    """The weights of `state` (transformers' names) under the NumPy BERT's names, mapped by hand from
    transformers' modeling_bert.py: Linear weights are [out, in], LayerNorm's weight/bias are
    gamma/beta, a BertModel's names have no `bert.` prefix. Every name must be used."""
    used = set()

    def take(name, transpose=False):
        used.add(name)
        return state[name].T if transpose else state[name]

    p = "" if "embeddings.word_embeddings.weight" in state else "bert."
    w = {
        "bert/embeddings/word_embeddings": take(f"{p}embeddings.word_embeddings.weight"),
        "bert/embeddings/position_embeddings": take(f"{p}embeddings.position_embeddings.weight"),
        "bert/embeddings/token_type_embeddings": take(
            f"{p}embeddings.token_type_embeddings.weight"
        ),
        "bert/embeddings/LayerNorm/gamma": take(f"{p}embeddings.LayerNorm.weight"),
        "bert/embeddings/LayerNorm/beta": take(f"{p}embeddings.LayerNorm.bias"),
        "bert/pooler/dense/kernel": take(f"{p}pooler.dense.weight", True),
        "bert/pooler/dense/bias": take(f"{p}pooler.dense.bias"),
    }
    for n in range(num_layers):
        ours, theirs = f"bert/encoder/layer_{n}/", f"{p}encoder.layer.{n}."
        for dense in ("attention.self.query", "attention.self.key", "attention.self.value"):
            name = ours + dense.replace(".", "/")
            w[name + "/kernel"] = take(theirs + dense + ".weight", True)
            w[name + "/bias"] = take(theirs + dense + ".bias")
        for a, b in (
            ("attention/output/dense", "attention.output.dense"),
            ("intermediate/dense", "intermediate.dense"),
            ("output/dense", "output.dense"),
        ):
            w[ours + a + "/kernel"] = take(theirs + b + ".weight", True)
            w[ours + a + "/bias"] = take(theirs + b + ".bias")
        for a, b in (
            ("attention/output/LayerNorm", "attention.output.LayerNorm"),
            ("output/LayerNorm", "output.LayerNorm"),
        ):
            w[ours + a + "/gamma"] = take(theirs + b + ".weight")
            w[ours + a + "/beta"] = take(theirs + b + ".bias")
    if "cls.predictions.bias" in state:
        # The decoder is tied to the word embeddings (transformers leaves it out of the file).
        w["cls/predictions/output_bias"] = take("cls.predictions.bias")
        w["cls/predictions/transform/dense/kernel"] = take(
            "cls.predictions.transform.dense.weight", True
        )
        w["cls/predictions/transform/dense/bias"] = take("cls.predictions.transform.dense.bias")
        w["cls/predictions/transform/LayerNorm/gamma"] = take(
            "cls.predictions.transform.LayerNorm.weight"
        )
        w["cls/predictions/transform/LayerNorm/beta"] = take(
            "cls.predictions.transform.LayerNorm.bias"
        )
    if "cls.seq_relationship.weight" in state:  # [2, H], as the original's output_weights
        w["cls/seq_relationship/output_weights"] = take("cls.seq_relationship.weight")
        w["cls/seq_relationship/output_bias"] = take("cls.seq_relationship.bias")
    head = {}
    for name in ("classifier", "qa_outputs"):
        if f"{name}.weight" in state:
            head = {"weight": take(f"{name}.weight"), "bias": take(f"{name}.bias")}
    assert used == set(state), sorted(set(state) - used)
    return w, head


def numpy_outputs(hf_dir, kind):
    """The outputs of the exported model, computed by the NumPy BERT from the files alone."""
    with open(os.path.join(hf_dir, "config.json")) as f:
        config = json.load(f)
    w, head = reference_weights(
        load_file(os.path.join(hf_dir, "model.safetensors")), config["num_hidden_layers"]
    )
    # transformers' names: "gelu" is the erf form, "gelu_new" the tanh approximation.
    gelu = {"gelu": np_gelu_exact, "gelu_new": np_gelu}[config["hidden_act"]]
    x = model_inputs(kind)
    ids, mask, types = (x[name] for name in modeling.ENCODER_INPUTS)
    shape = ids.shape
    if kind == "multiple_choice":
        ids, mask, types = (a.reshape(-1, shape[-1]) for a in (ids, mask, types))
    bert = NumpyBert(w, config, ids, mask, types, gelu)

    def linear(t):
        return t @ head["weight"].T.astype(np.float64) + head["bias"]

    if kind == "encoder":
        return {"sequence_output": bert.sequence_output, "pooled_output": bert.pooled_output}
    if kind in PRETRAINED:
        out = {}
        if "mlm" in PRETRAINED[kind]:
            out["mlm_logits"] = bert.mlm_logits(POSITIONS)
        if "nsp" in PRETRAINED[kind]:
            out["nsp_logits"] = bert.nsp_logits()
        return out
    if kind == "classifier":
        return {"logits": linear(bert.pooled_output)}
    if kind == "regressor":
        return {"score": linear(bert.pooled_output)[:, 0]}
    if kind == "ner":
        return {"logits": linear(bert.sequence_output)}
    if kind == "squad":
        logits = linear(bert.sequence_output)
        return {"start_logits": logits[..., 0], "end_logits": logits[..., 1]}
    return {"logits": linear(bert.pooled_output).reshape(shape[:2])}  # multiple choice


def check_hf_config(hf_dir, kind, hidden_act):
    with open(os.path.join(hf_dir, "config.json")) as f:
        config = json.load(f)
    assert config["model_type"] == "bert"
    assert config["architectures"] == [WANT_ARCHITECTURE[kind]]
    assert config["hidden_act"] == {"gelu": "gelu_new", "gelu_exact": "gelu"}[hidden_act]
    assert config["layer_norm_eps"] == 1e-12 and config["do_lower_case"] is True
    spec = SPECS.get(kind)
    if kind in ("classifier", "ner"):
        assert config["id2label"] == {str(i): label for i, label in enumerate(spec.labels)}
        assert config["label2id"] == {label: i for i, label in enumerate(spec.labels)}
    if kind == "classifier":
        assert config["problem_type"] == "single_label_classification"
    if kind == "regressor":
        assert config["problem_type"] == "regression" and len(config["id2label"]) == 1
    assert config.get(hf_export.TASK_KEY) == (spec.to_dict() if spec else None)
    with open(os.path.join(hf_dir, "tokenizer_config.json")) as f:
        tokenizer_config = json.load(f)
    assert tokenizer_config["do_lower_case"] is True
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "token_type_ids" in tokenizer_config["model_input_names"]
    with open(os.path.join(hf_dir, "special_tokens_map.json")) as f:
        assert json.load(f)["mask_token"] == "[MASK]"


@pytest.mark.parametrize(
    "kind,hidden_act",
    [(kind, "gelu") for kind in KINDS] + [("classifier", "gelu_exact"), ("mlm", "gelu_exact")],
)
def test_huggingface_export_is_exact_and_comes_back_bit_for_bit(tmp_path, kind, hidden_act):
    model_dir, model = write_model_dir(tmp_path / "model", kind, hidden_act=hidden_act)
    ours = our_outputs(model, kind)
    hf_dir = str(tmp_path / "hf")
    result = hf_export.export(model_dir, hf_dir)
    assert result.architecture == WANT_ARCHITECTURE[kind]
    assert set(os.listdir(hf_dir)) == HF_FILES | {io_utils.OUTPUT_MARKER}
    check_hf_config(hf_dir, kind, hidden_act)

    # The files, read by hand and run by the NumPy BERT, compute what our model computes.
    reference = numpy_outputs(hf_dir, kind)
    assert set(reference) == set(ours)
    for name, want in reference.items():
        atol = 1e-5 if name in ("sequence_output", "pooled_output") else 1e-4
        np.testing.assert_allclose(ours[name], want, rtol=0, atol=atol, err_msg=name)

    # Importing the export gives back the same model directory: every variable, every output.
    back = str(tmp_path / "back")
    conversion.convert("huggingface", hf_dir, back, task_model=hf_export.task_model)
    config, loaded = load_back(back, kind)
    assert config == ModelDir(model_dir).load_config()
    want = {v.path: v.numpy() for v in model.weights}
    got = {v.path: v.numpy() for v in loaded.weights}
    if kind in PRETRAINED:  # a head the directory does not have keeps fresh weights on both sides
        left_out = [f"{h}_head/" for h in ALL_HEADS - PRETRAINED[kind]]
        want = {p: v for p, v in want.items() if not p.startswith(tuple(left_out))}
        got = {p: v for p, v in got.items() if not p.startswith(tuple(left_out))}
    assert set(got) == set(want)
    for path, value in want.items():
        assert got[path].dtype == value.dtype and np.array_equal(got[path], value), path
    again = our_outputs(loaded, kind)
    for name, value in ours.items():
        np.testing.assert_array_equal(again[name], value, err_msg=name)


# Real text, and what the limits of a word's length and the special tokens touch: words of 151
# and 200 characters are wordpieces in the original (a limit of 200 since 332a687), where
# transformers' default WordPiece (100) makes them [UNK]; 201 characters are [UNK] in both.
TOKENIZER_TEXTS = [
    "Return the value of the attribute, or None if it is missing.",
    "Café déjà vu: naïve résumé, 東京 and ÉCOLE!",
    "a" + "bc" * 75,
    "x" * 200 + " then " + "y" * 201,
    "the [MASK] is [SEP] here",
    # Where `tokenizers`' own BERT parts differ from the original: a word-final capital sigma
    # (str.lower() makes it a final sigma), and CJK ideographs from U+2B820 to U+2B91F.
    "ΟΔΟΣ ΟΔ'Σ ΑΣ.Β ΣΑ Α Σ",
    "a\U0002b820b a\U0002b91fb a\U0002b920b",
]


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_huggingface_tokenizer_json_tokenizes_as_the_original(real_vocab, do_lower_case):
    vocab = hf_export.read_vocab(real_vocab)
    exported = Tokenizer.from_str(json.dumps(hf_export.wordpiece_tokenizer(vocab, do_lower_case)))
    ours = python_tokenizer.FullTokenizer(
        real_vocab, do_lower_case, special_tokens=tuple(hf_export.SPECIAL_TOKENS.values())
    )
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    for text in TOKENIZER_TEXTS:
        assert exported.encode(text).ids == [cls, *ours.encode(text), sep], text
    assert exported.encode(TOKENIZER_TEXTS[2]).ids.count(vocab["[UNK]"]) == 0
    assert exported.encode(TOKENIZER_TEXTS[3]).ids.count(vocab["[UNK]"]) == 1
    pair = exported.encode(TOKENIZER_TEXTS[0], TOKENIZER_TEXTS[1])
    a, b = ours.encode(TOKENIZER_TEXTS[0]), ours.encode(TOKENIZER_TEXTS[1])
    assert pair.ids == [cls, *a, sep, *b, sep]
    assert pair.type_ids == [0] * (len(a) + 2) + [1] * (len(b) + 1)


def test_the_reverse_names_are_the_importers_names():
    # Every original name goes out and comes back through huggingface_to_original_name.
    config = tiny_config()
    model, _ = modeling.build_pretraining_model(config)
    names = name_map.original_weights(model, config.num_hidden_layers, ALL_HEADS)
    for prefix in ("bert.", ""):
        for original in names:
            hf_name, transpose = huggingface.huggingface_name(original, prefix)
            assert huggingface.huggingface_to_original_name(hf_name) == (original, transpose)
    assert huggingface.huggingface_name("bert/encoder/layer_1/attention/self/query/kernel") == (
        "bert.encoder.layer.1.attention.self.query.weight",
        True,
    )
    assert huggingface.huggingface_name("cls/seq_relationship/output_weights") == (
        "cls.seq_relationship.weight",
        False,
    )
    assert huggingface.huggingface_activation("gelu") == "gelu_new"
    assert huggingface.huggingface_activation("gelu_exact") == "gelu"
    assert huggingface.huggingface_activation("relu") == "relu"


def test_a_failed_export_leaves_nothing_behind(tmp_path, monkeypatch):
    model_dir, _ = write_model_dir(tmp_path / "model", "classifier")

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(hf_export, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        hf_export.export(model_dir, str(tmp_path / "hf"))
    assert sorted(os.listdir(tmp_path)) == ["model"]


def test_the_output_directory_appears_only_once_complete_with_its_marker(tmp_path):
    out = tmp_path / "out"
    with io_utils.atomic_directory(str(out), "a_job") as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            f.write("{}")
        # A kill now leaves out.tmp-XXXX, never a directory named out.
        assert not out.exists() and os.path.basename(tmp).startswith("out.tmp-")
    assert sorted(os.listdir(out)) == sorted(["config.json", io_utils.OUTPUT_MARKER])
    assert os.listdir(tmp_path) == ["out"]
    marker = json.loads((out / io_utils.OUTPUT_MARKER).read_text())
    assert marker == {"job": "a_job", "files": ["config.json"]}
    # Replaced only by the same job, and only while it holds nothing but what that job wrote.
    with pytest.raises(io_utils.UsageError, match="holds files another_job did not write"):
        with io_utils.atomic_directory(str(out), "another_job", overwrite=True):
            pass
    with io_utils.atomic_directory(str(out), "a_job", overwrite=True) as tmp:
        os.makedirs(os.path.join(tmp, "assets"))
        (tmp_path / os.path.basename(tmp) / "assets" / "vocab.txt").write_text("a")
    assert json.loads((out / io_utils.OUTPUT_MARKER).read_text())["files"] == [
        "assets",
        os.path.join("assets", "vocab.txt"),
    ]
    (out / "assets" / "mine.txt").write_text("mine")
    with pytest.raises(io_utils.UsageError, match=r"did not write \(assets/mine.txt\)"):
        with io_utils.atomic_directory(str(out), "a_job", overwrite=True):
            pass
    assert (out / "assets" / "mine.txt").read_text() == "mine" and os.listdir(tmp_path) == ["out"]


def test_an_output_directory_is_replaced_only_when_it_is_this_jobs_and_overwrite(tmp_path):
    model_dir, _ = write_model_dir(tmp_path / "model", "encoder")
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(
            io_utils.UsageError, match=f"{out} holds files convert_checkpoint did not"
        ):
            hf_export.export(model_dir, str(out), overwrite=overwrite)
        assert os.listdir(out) == ["keep.txt"]
    os.remove(out / "keep.txt")
    hf_export.export(model_dir, str(out))  # empty: no --overwrite needed
    assert set(os.listdir(out)) == HF_FILES | {io_utils.OUTPUT_MARKER}
    with pytest.raises(io_utils.UsageError, match="not empty .*: pass --overwrite"):
        hf_export.export(model_dir, str(out))
    hf_export.export(model_dir, str(out), overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["hf", "model"]
    with pytest.raises(io_utils.UsageError, match="would replace the model directory"):
        hf_export.export(model_dir, model_dir, overwrite=True)


def test_a_config_setting_beyond_the_original_bert_is_refused():
    # A field added to BertConfig one day (say, the attention direction) has no equivalent there:
    # refused where it is set, not where it keeps its default.
    extended = dataclasses.make_dataclass(
        "ExtendedConfig",
        [("attention", str, dataclasses.field(default="bidirectional"))],
        bases=(modeling.BertConfig,),
    )
    fields = dataclasses.asdict(tiny_config())
    hf_export.check_exportable(extended(**fields), "Hugging Face", "models/x")
    with pytest.raises(
        io_utils.UsageError,
        match="models/x has attention='left_to_right': Hugging Face's BERT has no such",
    ):
        hf_export.check_exportable(
            extended(**fields, attention="left_to_right"), "Hugging Face", "models/x"
        )


@pytest.mark.parametrize("to", ["huggingface", "keras_hub"])
def test_cli_refuses_a_left_to_right_model(tmp_path, to):
    # BertModel and BertBackbone attend both ways: the model would compute something else there.
    model_dir, _ = write_model_dir(
        tmp_path / "model", "classifier", attention_direction=modeling.LEFT_TO_RIGHT
    )
    result = run_cli(f"--to={to}", f"--model_dir={model_dir}", f"--output_dir={tmp_path / 'out'}")
    assert result.returncode == 2, result.stderr
    assert "attention_direction='left_to_right'" in result.stderr
    assert f"model directory {model_dir}" in result.stderr and "Traceback" not in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["model"]


@pytest.mark.parametrize("to", ["huggingface", "keras_hub"])
def test_cli_refuses_a_bilstm_head(tmp_path, to):
    # Neither has a BiLSTM between the encoder and the output layer.
    path = str(tmp_path / "model")
    os.makedirs(path)
    vocab = write_tiny_vocab(os.path.join(path, "vocab.txt"))
    spec = models.TaskSpec("classifier", labels=["a", "b"], head="bilstm", lstm_units=4)
    model, encoder = models.build_task_model(tiny_config(), spec)
    ModelDir(path).write(tiny_config(), vocab, encoder, spec=spec, model=model)
    result = run_cli(f"--to={to}", f"--model_dir={path}", f"--output_dir={tmp_path / 'out'}")
    assert result.returncode == 2, result.stderr
    assert f"model directory {path} has a head=bilstm classifier head" in result.stderr
    assert "Traceback" not in result.stderr and sorted(os.listdir(tmp_path)) == ["model"]


# --- The CLI ----------------------------------------------------------------------------------


def run_cli(*args):
    return run_module_cli("bert_tf.convert_checkpoint", *args)


def test_cli_exports_and_imports_a_fine_tuned_model(tmp_path):
    model_dir, model = write_model_dir(tmp_path / "model", "ner")
    hf_dir, back = tmp_path / "hf", tmp_path / "back"
    result = run_cli("--to=huggingface", f"--model_dir={model_dir}", f"--output_dir={hf_dir}")
    assert result.returncode == 0, result.stderr
    assert "wrote BertForTokenClassification" in result.stdout
    # Nothing of ours but the marker, which holds the flags (reusable with --flagfile).
    assert set(os.listdir(hf_dir)) == HF_FILES | {io_utils.OUTPUT_MARKER}
    flags_text = json.loads((hf_dir / io_utils.OUTPUT_MARKER).read_text())["flags"]
    assert "--to=huggingface" in flags_text.splitlines()
    result = run_cli("--format=huggingface", f"--checkpoint={hf_dir}", f"--output_dir={back}")
    assert result.returncode == 0, result.stderr
    assert "a fine-tuned ner" in result.stdout
    _, loaded = load_back(str(back), "ner")
    for a, b in zip(model.weights, loaded.weights):
        assert a.path == b.path and np.array_equal(a.numpy(), b.numpy()), a.path
    # Not empty: refused, and the directory is left as it was.
    result = run_cli("--to=huggingface", f"--model_dir={model_dir}", f"--output_dir={hf_dir}")
    assert result.returncode == 2 and "--overwrite" in result.stderr
    # The flags of the other direction are refused.
    result = run_cli("--to=huggingface", "--format=google", f"--model_dir={model_dir}")
    assert result.returncode == 2 and "--format: only when importing" in result.stderr


@pytest.mark.parametrize(
    "remove,named",
    [
        ("checkpoint", "checkpoint"),
        ("bert_config.json", "bert_config.json"),
        ("vocab.txt", "vocab.txt"),
        ("ckpt-1.index", "ckpt-N.index"),
    ],
)
def test_cli_an_incomplete_model_directory_exits_2_naming_what_is_missing(tmp_path, remove, named):
    model_dir, _ = write_model_dir(tmp_path / "model", "classifier")
    os.remove(os.path.join(model_dir, remove))
    out = tmp_path / "hf"
    result = run_cli("--to=huggingface", f"--model_dir={model_dir}", f"--output_dir={out}")
    assert result.returncode == 2, result.stderr
    assert named in result.stderr and "Traceback" not in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["model"]


def error_lines(result):
    """The `error: ...` lines a CLI printed (a usage error's on stderr, a failed run's on stdout)."""
    return [
        line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error:")
    ]


@pytest.mark.parametrize("to", ["huggingface", "keras_hub"])
def test_cli_never_replaces_a_folder_it_did_not_write(tmp_path, to):
    # A typo in --output_dir must not cost the user the folder it names, --overwrite or not.
    model_dir, _ = write_model_dir(tmp_path / "model", "classifier")
    out = tmp_path / "photos"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    for overwrite in ([], ["--overwrite"]):
        result = run_cli(
            f"--to={to}", f"--model_dir={model_dir}", f"--output_dir={out}", *overwrite
        )
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        (line,) = error_lines(result)
        assert f"{out} holds files convert_checkpoint did not write" in line
        assert os.listdir(out) == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["model", "photos"]


def test_cli_overwrite_replaces_its_own_earlier_output_and_nothing_else(tmp_path):
    model_dir, _ = write_model_dir(tmp_path / "model", "classifier")
    out = tmp_path / "out"
    export = lambda to, *extra: run_cli(
        f"--to={to}", f"--model_dir={model_dir}", f"--output_dir={out}", *extra
    )
    assert export("huggingface").returncode == 0
    marker = json.loads((out / io_utils.OUTPUT_MARKER).read_text())
    assert marker["job"] == "convert_checkpoint"
    assert set(marker["files"]) == HF_FILES
    result = export("huggingface")
    assert result.returncode == 2 and "pass --overwrite" in error_lines(result)[0]
    # Its own output, replaced by another kind of export.
    result = export("keras_hub", "--overwrite")
    assert result.returncode == 0, result.stderr
    assert "model.weights.h5" in os.listdir(out) and "model.safetensors" not in os.listdir(out)
    # A file the user put into it since: the folder is no longer only what the job wrote.
    (out / "notes.txt").write_text("mine")
    result = export("huggingface", "--overwrite")
    assert result.returncode == 2, result.stderr
    assert (
        f"{out} holds files convert_checkpoint did not write (notes.txt)" in error_lines(result)[0]
    )
    assert (out / "notes.txt").read_text() == "mine" and "model.weights.h5" in os.listdir(out)
    assert sorted(os.listdir(tmp_path)) == ["model", "out"]


def test_cli_os_errors_on_the_output_are_one_line_and_leave_nothing(tmp_path, small_disk):
    model_dir, _ = write_model_dir(tmp_path / "model", "encoder")
    (tmp_path / "a_file").write_text("x")
    read_only, mount_point = small_disk("1m", read_only=True), small_disk("1m")
    for out, code, reason in (
        ("/proc/bert_tf_out", 1, "No such file or directory"),
        (tmp_path / "a_file" / "out", 2, "is not a directory"),
        (read_only / "out", 1, "Read-only file system"),
        (mount_point, 2, "is a mount point"),
    ):
        result = run_cli("--to=huggingface", f"--model_dir={model_dir}", f"--output_dir={out}")
        assert result.returncode == code and "Traceback" not in result.stderr, result.stderr
        (line,) = error_lines(result)
        assert str(out) in line and reason in line, line
    assert sorted(os.listdir(tmp_path)) == ["a_file", "disk0", "disk1", "model"]
    assert os.listdir(read_only) == [] and os.listdir(mount_point) == []


@pytest.mark.parametrize("to", ["huggingface", "keras_hub"])
def test_cli_a_checkpoint_cut_short_exits_2_naming_its_file(tmp_path, to):
    model_dir, _ = write_model_dir(tmp_path / "model", "classifier")
    (data,) = glob.glob(os.path.join(model_dir, "ckpt-1.data-*"))
    os.truncate(data, os.path.getsize(data) // 2)
    out = tmp_path / "new" / "out"  # the folders made for it go again too
    result = run_cli(f"--to={to}", f"--model_dir={model_dir}", f"--output_dir={out}")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = error_lines(result)
    assert data in line and "cut short" in line
    assert sorted(os.listdir(tmp_path)) == ["model"]


# --- keras-hub --------------------------------------------------------------------------------


def keras_hub_outputs(preset, x):
    got = keras_hub.models.BertBackbone.from_preset(preset)(
        keras_hub_export.keras_hub_inputs(x), training=False
    )
    return {name: np.asarray(got[name]) for name in ("sequence_output", "pooled_output")}


def test_keras_hub_preset_of_a_pretrained_model_loads_in_keras_hub(tmp_path):
    model_dir, model = write_model_dir(tmp_path / "model", "pretraining")
    preset = str(tmp_path / "preset")
    result = keras_hub_export.export(model_dir, preset)
    assert {"config.json", "model.weights.h5", "tokenizer.json", "metadata.json"} <= set(
        os.listdir(preset)
    )
    assert os.path.exists(os.path.join(preset, "assets", "tokenizer", "vocabulary.txt"))
    assert not result.gelu_changed and result.left_out.startswith("the MLM and NSP pretraining")
    x = tiny_inputs(seq=7, seed=4)
    ours = model.get_layer("bert_encoder")(x, training=False)
    for name, got in keras_hub_outputs(preset, x).items():
        np.testing.assert_allclose(got, np.asarray(ours[name]), rtol=0, atol=1e-5, err_msg=name)
    # keras-hub's tokenizer gives our tokenizer's ids.
    tokenizer = keras_hub.models.BertTokenizer.from_preset(preset)
    ours_tokenizer = python_tokenizer.FullTokenizer(os.path.join(model_dir, "vocab.txt"), True)
    for text in ("w0 w1 w17", "W3 w12, w4!", "w5w6 unknown w7"):
        assert np.asarray(tokenizer(text)).tolist() == ours_tokenizer.encode(text), text


@pytest.mark.parametrize("kind", ["classifier", "regressor"])
def test_keras_hub_text_classifier_holds_our_classifier_head(tmp_path, kind):
    model_dir, model = write_model_dir(tmp_path / "model", kind)
    preset = str(tmp_path / "preset")
    result = keras_hub_export.export(model_dir, preset)
    assert result.classes == ["BertBackbone", "BertTokenizer", "BertTextClassifier"]
    x = tiny_inputs(seq=7, seed=4)
    classifier = keras_hub.models.BertTextClassifier.from_preset(preset)
    got = np.asarray(classifier(keras_hub_export.keras_hub_inputs(x), training=False))
    want = np.asarray(model(x, training=False)["logits" if kind == "classifier" else "score"])
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=0, atol=1e-5)
    ours = model.get_layer("bert_encoder")(x, training=False)
    for name, value in keras_hub_outputs(preset, x).items():
        np.testing.assert_allclose(value, np.asarray(ours[name]), rtol=0, atol=1e-5)


def test_a_keras_hub_regressor_preset_says_how_to_train_it_and_trains_so(tmp_path):
    model_dir, _ = write_model_dir(tmp_path / "model", "regressor")
    preset = str(tmp_path / "preset")
    result = keras_hub_export.export(model_dir, preset)
    assert result.note == keras_hub_export.REGRESSOR_NOTE
    metadata = json.loads((tmp_path / "preset" / "metadata.json").read_text())
    assert metadata["bert_tf_task"] == "regressor"
    assert "MeanSquaredError" in metadata["bert_tf_note"]
    task = keras_hub.models.BertTextClassifier.from_preset(preset)
    task.preprocessor.sequence_length = 16  # the tiny model has 32 positions
    texts, scores = ["w0 w1 w17", "W3 w12, w4!"], np.array([0.5, 2.0], np.float32)
    # keras-hub's default compile is a classification loss: real-valued labels are refused.
    task.compile()
    with pytest.raises(tf.errors.InvalidArgumentError):
        task.evaluate(texts, scores, verbose=0)
    # As the note says: the loss is then the score's squared error, and fit trains the head on it.
    task.compile(optimizer=keras.optimizers.SGD(1e-3), loss=keras.losses.MeanSquaredError())
    predicted = task.predict(texts, verbose=0).reshape(-1)
    loss = task.evaluate(texts, scores, verbose=0, return_dict=True)["loss"]
    assert loss == pytest.approx(np.mean((predicted - scores) ** 2), rel=1e-5)
    kernel = task.get_layer("logits").kernel.numpy()
    task.fit(texts, scores, epochs=1, verbose=0)
    assert np.abs(task.get_layer("logits").kernel.numpy() - kernel).max() > 0


@pytest.mark.parametrize("kind", ["squad", "ner", "multiple_choice"])
def test_keras_hub_refuses_a_head_it_has_no_task_for(tmp_path, kind):
    model_dir, _ = write_model_dir(tmp_path / "model", kind)
    with pytest.raises(io_utils.UsageError, match=f"keras-hub has no BERT task for a {kind} head"):
        keras_hub_export.export(model_dir, str(tmp_path / "preset"))
    assert sorted(os.listdir(tmp_path)) == ["model"]


def test_keras_hub_gelu_form_is_measured_and_a_change_is_refused_unless_allowed(tmp_path):
    backbone = keras_hub_export.build_backbone(tiny_config())
    # keras-hub 0.32's BertBackbone applies the tanh approximation: our "gelu".
    assert keras_hub_export.activation_form(backbone.transformer_layers[0].activation) == "gelu"
    model_dir, _ = write_model_dir(tmp_path / "model", "encoder", hidden_act="gelu_exact")
    with pytest.raises(io_utils.UsageError, match="--allow_gelu_change"):
        keras_hub_export.export(model_dir, str(tmp_path / "preset"))
    assert sorted(os.listdir(tmp_path)) == ["model"]
    relu_dir, _ = write_model_dir(tmp_path / "relu", "encoder", hidden_act="relu")
    with pytest.raises(io_utils.UsageError, match="cannot hold this model"):
        keras_hub_export.export(relu_dir, str(tmp_path / "preset"))
    # Allowed: the CLI prints the difference it measured.
    result = run_cli(
        "--to=keras_hub",
        "--allow_gelu_change",
        f"--model_dir={model_dir}",
        f"--output_dir={tmp_path / 'preset'}",
    )
    assert result.returncode == 0, result.stderr
    assert "GELU form changed to keras-hub's: outputs differ from this model's by up to" in (
        result.stdout
    )
    x = tiny_inputs(seq=7, seed=4)
    ours = ModelDir(model_dir).load_encoder()(x)
    got = keras_hub_outputs(str(tmp_path / "preset"), x)
    difference = np.abs(got["sequence_output"] - np.asarray(ours["sequence_output"])).max()
    assert 0 < difference < 0.05
    marker = json.loads((tmp_path / "preset" / io_utils.OUTPUT_MARKER).read_text())
    assert "--to=keras_hub" in marker["flags"].splitlines()
    assert "convert_checkpoint.flags" not in marker["files"]
