"""Exported SavedModels: every kind from a tiny model with the real vocab, loaded in a fresh process.

One module fixture writes the model directories and exports them all (the encoder through the CLI,
in parallel); one subprocess with nothing but `tensorflow` and `tensorflow_text` loads every export,
runs every signature and lists every op. The tests compare those outputs with the in-process Keras
models fed FullTokenizer ids packed by the Python packers of bert_tf.tasks (the training path).
"""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import run_python_script, session_outputs, tiny_config

from bert_tf.model import modeling
from bert_tf.model.model_dir import ModelDir
from bert_tf.runtime import io_utils
from bert_tf.saved_model import export
from bert_tf.tasks import export_graph, models, packing
from bert_tf.tasks.classification import data as classification
from bert_tf.tasks.ner import data as ner
from bert_tf.tasks.ner import metrics as ner_metrics
from bert_tf.tasks.squad import data as squad
from bert_tf.tasks.squad import postprocess as squad_postprocess
from bert_tf.tokenization.python_tokenizer import FullTokenizer

CONFIG = tiny_config(vocab_size=30522)  # the real vocabulary's size
SPECS = {
    "classifier": models.TaskSpec(
        "classifier",
        labels=["negative", "neutral", "positive"],
        max_seq_length=16,
        task_name="sentiment",
    ),
    "regressor": models.TaskSpec("regressor", is_pair=True, max_seq_length=16, task_name="sts-b"),
    "squad": models.TaskSpec(
        "squad", max_seq_length=32, max_query_length=8, doc_stride=8, version_2_with_negative=True
    ),
    "ner": models.TaskSpec(
        "ner", labels=["O", "B-PER", "I-PER", "B-LOC", "I-LOC"], max_seq_length=16
    ),
}
# The export fixture takes most of a minute (six exports, a fresh process loading them all).
pytestmark = pytest.mark.slow

ENCODER_SEQ_LENGTH = 24
MEGABYTE = ("Ünïcode wörds and plain words, " * 40000)[: 1 << 20]

TEXTS = [
    "The movie was wonderful!",
    "",
    "Héllo wörld: naïve café, 中文 and ＡＢＣ …",
    "a " * 40,
    MEGABYTE,
]
PAIRS = (
    ["A man plays a guitar.", "", "Ünïcode", "long " * 30],
    ["Someone plays music.", "nothing", "", "short"],
)
SQUAD_QUESTIONS = [
    "Who wrote the letter?",
    "Where is it?",
    "what",
    "",
    "Why would anybody ask a question that is far longer than the query budget allows?",
]
SQUAD_CONTEXTS = [
    "The letter was written by Jane Austen in Bath, and it reached her sister two weeks later. She read it "
    "twice, folded it into a book of sermons, and did not mention it to anyone until the following spring.",
    "Héllo wörld: the café is near the station, déjà vu for every visitor who comes back to town again. "
    "Its owner, Zoë Brontë-Smith, bakes crêpes; the naïve façade hides a garden with twelve olive trees.",
    "",
    "Short context.",
    "Many many words make several windows here, with punctuation, numbers like 1,234 and more text, "
    '(parentheses) and "quotes", so that the doc stride moves the window a few times over the context; '
    "one, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, thirteen.",
]
NER_TEXTS = [
    "John Smith lives in New York City today.",
    "",
    "Ünïcode naïve café déjà vu in Zürich",
    "word " * 30 + "end",
    "Hello,world mixed-up punctuation!",
]

# Ops that tensorflow_text registers and these graphs use (TF Serving 2.20+ bundles them).
TEXT_OPS = {"FastWordpieceTokenizeWithOffsets", "TFText>RoundRobinTrim"}

# The app's side: only tensorflow and tensorflow_text.
APP_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow.python.framework import op_def_registry

    def graph_ops(path):
        proto = saved_model_pb2.SavedModel()
        proto.ParseFromString(open(path + "/saved_model.pb", "rb").read())
        graph = proto.meta_graphs[0].graph_def
        ops = {n.op for n in graph.node}
        for f in graph.library.function:
            ops |= {n.op for n in f.node_def}
        functions = {f.signature.name for f in graph.library.function}
        return sorted(ops - functions)

    request = json.load(open(sys.argv[1]))
    paths = request["paths"]
    # Which ops core TensorFlow knows, before tensorflow_text registers its own.
    all_ops = {name: graph_ops(path) for name, path in paths.items()}
    core = {name: [op for op in ops if op_def_registry.get(op) is not None] for name, ops in all_ops.items()}
    import tensorflow_text  # noqa: F401  (registers the text ops, as in TF Serving)
    ops_report = {name: {"text": sorted(op for op in ops if op not in core[name]
                                        and op_def_registry.get(op) is not None),
                         "unknown": sorted(op for op in ops if op_def_registry.get(op) is None)}
                  for name, ops in all_ops.items()}

    def plain(outputs):
        result = {}
        for key, value in outputs.items():
            if isinstance(value, tf.RaggedTensor):
                result[key] = value.to_list()
            elif isinstance(value, (list, tuple)):
                result[key] = [np.asarray(v).tolist() for v in value]
            else:
                value = value.numpy()
                result[key] = value.tolist() if value.dtype != object else [
                    [x.decode("utf-8") for x in row] if isinstance(row, np.ndarray) else row.decode("utf-8")
                    for row in value]
        return result

    def examples(rows):
        out = []
        for row in rows:
            feature = {k: tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode("utf-8")]))
                       for k, v in row.items()}
            out.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        return tf.constant(out)

    results = {"ops": ops_report}
    s = tf.constant
    m = tf.saved_model.load(paths["classifier"])
    results["classifier"] = plain(m.signatures["serving_default"](text=s(request["texts"])))
    results["classification"] = plain(m.signatures["classification"](
        inputs=examples([{"text": t} for t in request["texts"]])))
    m = tf.saved_model.load(paths["regressor"])
    a, b = request["pairs"]
    results["regressor"] = plain(m.signatures["serving_default"](text_a=s(a), text_b=s(b)))
    results["regression"] = plain(m.signatures["regression"](
        inputs=examples([{"text_a": x, "text_b": y} for x, y in zip(a, b)])))
    m = tf.saved_model.load(paths["squad"])
    results["squad"] = plain(m.signatures["serving_default"](
        question=s(request["questions"]), context=s(request["contexts"])))
    results["squad_megabyte"] = plain(m.signatures["serving_default"](
        question=s(["what is it"]), context=s([request["texts"][-1]])))
    m = tf.saved_model.load(paths["ner"])
    results["ner"] = plain(m.signatures["serving_default"](text=s(request["ner_texts"])))
    results["ner_megabyte"] = plain(m.signatures["serving_default"](text=s(request["texts"][-1:])))

    pre = tf.saved_model.load(paths["preprocess"])
    enc = tf.saved_model.load(paths["encoder"])
    inputs = pre(s(request["texts"]))
    results["preprocess"] = plain(inputs)
    results["preprocess_signature"] = plain(pre.signatures["serving_default"](text=s(request["texts"])))
    a, b = request["pairs"]
    segments = [pre.tokenize(s(a)), pre.tokenize(s(b))]
    results["tokenize"] = segments[0].to_list()
    results["pack_pair"] = plain(pre.bert_pack_inputs(segments, seq_length=tf.constant(12)))
    results["pack_single_python_int"] = plain(pre.bert_pack_inputs(segments[:1], seq_length=20))
    results["encoder"] = plain(enc(inputs))
    results["encoder_signature"] = plain(enc.signatures["serving_default"](**inputs))
    results["do_lower_case"] = [bool(pre.do_lower_case.numpy()), bool(enc.do_lower_case.numpy())]
    results["vocab_files"] = [pre.vocab_file.asset_path.numpy().decode(), enc.vocab_file.asset_path.numpy().decode()]
    json.dump(results, open(sys.argv[2], "w"))
""")


# saved_model_cli's own entry point (the `saved_model_cli` console script calls this main()) on
# every export, in one process: one TensorFlow import serves them all, where a process per export
# imported it seven times over beside the app. "with_text_ops" imports tensorflow_text first; the
# stock CLI does not.
SHOW_SCRIPT = textwrap.dedent("""
    import contextlib, io, json, sys, traceback
    paths, mode = json.loads(sys.argv[1]), sys.argv[2]
    if mode == "with_text_ops":
        import tensorflow_text  # registers the text ops, so the CLI can list their functions
    from tensorflow.python.tools.saved_model_cli import main

    results = {}
    for name, path in paths.items():
        out, err, returncode = io.StringIO(), io.StringIO(), 0
        sys.argv = ["saved_model_cli", "show", "--all", "--dir", path]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as e:  # absl's app.run always exits
                returncode = e.code or 0
            except Exception:
                traceback.print_exc()
                returncode = 1
        results[name] = [returncode, out.getvalue(), err.getvalue()]
    print(json.dumps(results))
""")


def python_env():
    """The subprocess environment: quiet TF logging."""
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


@pytest.fixture(scope="module")
def exported(tmp_path_factory, real_vocab):
    """Model directories with random weights and their exports: {name: path} plus the app's results."""
    root = tmp_path_factory.mktemp("export")
    keras.utils.set_random_seed(1)
    model_dirs, paths = {}, {}
    # The pretrained encoder goes through the CLI, in parallel with the in-process exports.
    encoder_dir = str(root / "models" / "encoder")
    ModelDir(encoder_dir).write(CONFIG, real_vocab, modeling.build_encoder(CONFIG))
    model_dirs["encoder"] = encoder_dir
    encoder_export = root / "export" / "encoder"
    (encoder_export / "2").mkdir(parents=True)  # an older version...
    (encoder_export / "latest").mkdir()  # ...and a name TF Serving ignores
    cli = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bert_tf.export",
            f"--model_dir={encoder_dir}",
            f"--export_dir={encoder_export}",
            f"--max_seq_length={ENCODER_SEQ_LENGTH}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=python_env(),
    )
    try:
        for kind, spec in SPECS.items():
            model, encoder = models.build_task_model(CONFIG, spec)
            # Large head weights and non-zero biases, so that outputs differ between texts and a
            # dropped bias would show.
            head = [layer for layer in model.layers if layer.name.endswith("_head")][0]
            rng = np.random.default_rng(len(kind))
            head.set_weights(
                [rng.normal(0, 1, w.shape).astype(np.float32) for w in head.get_weights()]
            )
            model_dirs[kind] = str(root / "models" / kind)
            ModelDir(model_dirs[kind]).write(CONFIG, real_vocab, encoder, spec=spec, model=model)
            version = 5 if kind == "regressor" else None
            paths[kind], exported_kind = export.export(
                model_dirs[kind], str(root / "export" / kind), version=version
            )
            assert exported_kind == kind
    finally:
        stdout, stderr = cli.communicate(timeout=600)
    assert cli.returncode == 0, stderr[-3000:]
    paths["encoder"] = str(encoder_export / "3")
    assert f"exported encoder model to {paths['encoder']}" in stdout
    paths["preprocess"] = os.path.join(paths["encoder"], export.PREPROCESS_SUBDIR)

    request = {
        "paths": paths,
        "texts": TEXTS,
        "pairs": PAIRS,
        "questions": SQUAD_QUESTIONS,
        "contexts": SQUAD_CONTEXTS,
        "ner_texts": NER_TEXTS,
    }
    (root / "request.json").write_text(json.dumps(request))
    # The app, and saved_model_cli on every export, at once.
    app = subprocess.Popen(
        [sys.executable, "-c", APP_SCRIPT, str(root / "request.json"), str(root / "results.json")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=python_env(),
    )
    shows = {
        mode: subprocess.Popen(
            [sys.executable, "-c", SHOW_SCRIPT, json.dumps(show_paths), mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=python_env(),
        )
        for mode, show_paths in (
            ("stock", paths),
            # The stock CLI cannot list the concrete functions of graphs with tensorflow_text ops
            # (it does not register them); with tensorflow_text imported it lists them too.
            ("with_text_ops", {"preprocess_with_text_ops": paths["preprocess"]}),
        )
    }
    show_results = {}
    for mode, process in shows.items():
        stdout, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, (mode, stderr[-3000:])
        # absl logs to the process's own stderr, not to the per-export capture.
        assert "Traceback" not in stderr, (mode, stderr[-3000:])
        results = json.loads(stdout.splitlines()[-1])  # the script's last line
        show_results.update({name: tuple(result) for name, result in results.items()})
    usage = subprocess.run(
        [sys.executable, "-m", "bert_tf.export", f"--export_dir={root / 'usage'}"],
        capture_output=True,
        text=True,
        env=python_env(),
    )
    app_stdout, app_stderr = app.communicate(timeout=600)
    assert app.returncode == 0, app_stderr[-5000:]
    results = json.loads((root / "results.json").read_text())
    return {
        "root": root,
        "paths": paths,
        "model_dirs": model_dirs,
        "results": results,
        "show": show_results,
        "usage": usage,
    }


def tokenizer(real_vocab):
    return FullTokenizer(real_vocab, do_lower_case=True)


def packed(real_vocab, segments_list, seq_length):
    """The training-side packing of texts: FullTokenizer ids + packing.pack_segments (an empty b dropped)."""
    full = tokenizer(real_vocab)
    rows = [
        packing.pack_segments(
            [full.encode(t) for t in segments],
            seq_length,
            full.vocab["[CLS]"],
            full.vocab["[SEP]"],
            drop_empty_b=True,
        )
        for segments in segments_list
    ]
    return {
        name: np.stack([row[i] for row in rows]) for i, name in enumerate(modeling.ENCODER_INPUTS)
    }


# ----------------------------------------------------------------------------------------------
# Layout, signatures, ops
# ----------------------------------------------------------------------------------------------


def test_layout_and_versions(exported):
    paths = exported["paths"]
    for name, path in paths.items():
        for entry in (
            "saved_model.pb",
            "variables/variables.index",
            "assets/vocab.txt",
            "assets/bert_config.json",
        ):
            assert os.path.exists(os.path.join(path, entry)), (name, entry)
    assert paths["classifier"].endswith(os.path.join("classifier", "1"))
    assert paths["regressor"].endswith(os.path.join("regressor", "5"))  # --version
    assert paths["encoder"].endswith(
        os.path.join("encoder", "3")
    )  # after 2; "latest" is not a number
    for kind in SPECS:  # multiple_choice is exported in test_run_multiple_choice.py
        task = json.load(open(os.path.join(paths[kind], "assets", "task.json")))
        assert task == SPECS[kind].to_dict()
    assert not os.path.exists(os.path.join(paths["encoder"], "assets", "task.json"))
    assert (
        json.load(open(os.path.join(paths["encoder"], "assets", "bert_config.json")))[
            "do_lower_case"
        ]
        is True
    )
    # No temporary directories are left beside the versions.
    for kind in list(SPECS) + ["encoder"]:
        assert not [n for n in os.listdir(exported["root"] / "export" / kind) if n.startswith(".")]


def test_signature_method_names(exported):
    from tensorflow.core.protobuf import saved_model_pb2

    def methods(path):
        proto = saved_model_pb2.SavedModel()
        proto.ParseFromString(open(os.path.join(path, "saved_model.pb"), "rb").read())
        return {
            key: sig.method_name
            for key, sig in proto.meta_graphs[0].signature_def.items()
            if not key.startswith("__")
        }

    paths = exported["paths"]
    assert methods(paths["classifier"]) == {
        "serving_default": "tensorflow/serving/predict",
        "classification": "tensorflow/serving/classify",
    }
    assert methods(paths["regressor"]) == {
        "serving_default": "tensorflow/serving/predict",
        "regression": "tensorflow/serving/regress",
    }
    for name in ("squad", "ner", "encoder", "preprocess"):
        assert methods(paths[name]) == {"serving_default": "tensorflow/serving/predict"}
    # The fingerprint was recomputed after the method names changed.
    fingerprint = tf.saved_model.experimental.read_fingerprint(paths["classifier"])
    assert fingerprint.saved_model_checksum != 0


def test_saved_model_cli_describes_every_export(exported):
    assert set(exported["show"]) == set(exported["paths"]) | {"preprocess_with_text_ops"}
    for name, (returncode, stdout, stderr) in exported["show"].items():
        assert returncode == 0, (name, stderr[-2000:])
        assert "Traceback" not in stderr, (name, stderr[-2000:])
        assert "signature_def['serving_default']" in stdout, name
    classifier = exported["show"]["classifier"][1]
    assert "Method name is: tensorflow/serving/classify" in classifier
    assert "inputs['text'] tensor_info:\n        dtype: DT_STRING" in classifier
    regressor = exported["show"]["regressor"][1]
    assert "Method name is: tensorflow/serving/regress" in regressor
    assert "inputs['text_a']" in regressor and "inputs['text_b']" in regressor
    squad_show = exported["show"]["squad"][1]
    for name in ("question", "context", "answer", "start", "end", "score"):
        assert f"['{name}'] tensor_info" in squad_show
    encoder_show = exported["show"]["encoder"][1]
    assert "Function Name: 'serve'" in encoder_show  # no text ops: the stock CLI lists everything
    assert "shape: (-1, 2, -1, 32)" in encoder_show  # encoder_outputs [batch, layers, seq, hidden]
    with_text = exported["show"]["preprocess_with_text_ops"][1]
    for name in ("__call__", "bert_pack_inputs", "tokenize"):
        assert f"Function Name: '{name}'" in with_text


def test_graphs_use_only_core_and_text_ops(exported):
    ops = exported["results"]["ops"]
    assert set(ops) == set(exported["paths"])
    for name, report in ops.items():
        assert report["unknown"] == [], (name, report)
        assert set(report["text"]) <= TEXT_OPS, (name, report["text"])
    assert "FastWordpieceTokenizeWithOffsets" in ops["classifier"]["text"]
    assert ops["encoder"]["text"] == []  # the encoder takes ids


# ----------------------------------------------------------------------------------------------
# Outputs equal the Keras models' on the training-side ids
# ----------------------------------------------------------------------------------------------


def test_classifier_matches_keras_model(exported, real_vocab):
    model, _, _, spec = models.load_task_model(ModelDir(exported["model_dirs"]["classifier"]))
    x = packed(real_vocab, [[t] for t in TEXTS], spec.max_seq_length)
    probabilities = tf.nn.softmax(model(x, training=False)["logits"]).numpy()
    out = exported["results"]["classifier"]
    np.testing.assert_allclose(out["probabilities"], probabilities, atol=1e-5)
    assert out["label_id"] == probabilities.argmax(-1).tolist()
    assert out["label"] == [spec.labels[i] for i in out["label_id"]]
    classify = exported["results"]["classification"]
    assert classify["classes"] == [spec.labels] * len(TEXTS)
    np.testing.assert_allclose(classify["scores"], probabilities, atol=1e-5)


def test_regressor_matches_keras_model(exported, real_vocab):
    model, _, _, spec = models.load_task_model(ModelDir(exported["model_dirs"]["regressor"]))
    x = packed(real_vocab, list(zip(*PAIRS)), spec.max_seq_length)
    score = model(x, training=False)["score"].numpy()
    np.testing.assert_allclose(exported["results"]["regressor"]["score"], score, atol=1e-5)
    np.testing.assert_allclose(exported["results"]["regression"]["outputs"], score, atol=1e-5)


def test_encoder_and_preprocessor_match(exported, real_vocab):
    results = exported["results"]
    full = tokenizer(real_vocab)
    x = packed(real_vocab, [[t] for t in TEXTS], ENCODER_SEQ_LENGTH)
    for key in ("preprocess", "preprocess_signature"):
        for name in modeling.ENCODER_INPUTS:
            np.testing.assert_array_equal(results[key][name], x[name], err_msg=f"{key} {name}")
    assert results["tokenize"] == [full.encode(t) for t in PAIRS[0]]
    pair = packed(real_vocab, list(zip(*PAIRS)), 12)
    single = packed(real_vocab, [[t] for t in PAIRS[0]], 20)
    for name in modeling.ENCODER_INPUTS:
        np.testing.assert_array_equal(results["pack_pair"][name], pair[name])
        np.testing.assert_array_equal(results["pack_single_python_int"][name], single[name])
    encoder = ModelDir(exported["model_dirs"]["encoder"]).load_encoder()
    expected = encoder(x, training=False)
    for key in ("encoder", "encoder_signature"):
        out = results[key]
        np.testing.assert_allclose(out["sequence_output"], expected["sequence_output"], atol=1e-5)
        np.testing.assert_allclose(out["pooled_output"], expected["pooled_output"], atol=1e-5)
        np.testing.assert_allclose(out["default"], expected["pooled_output"], atol=1e-5)
        np.testing.assert_allclose(out["embedding_output"], expected["embedding_output"], atol=1e-5)
    assert len(results["encoder"]["encoder_outputs"]) == CONFIG.num_hidden_layers
    for layer in range(CONFIG.num_hidden_layers):
        np.testing.assert_allclose(
            results["encoder"]["encoder_outputs"][layer],
            expected["encoder_outputs"][layer],
            atol=1e-5,
        )
        np.testing.assert_allclose(
            np.asarray(results["encoder_signature"]["encoder_outputs"])[:, layer],
            expected["encoder_outputs"][layer],
            atol=1e-5,
        )
    assert results["do_lower_case"] == [True, True]
    assert all(
        path.endswith(os.path.join("assets", "vocab.txt")) for path in results["vocab_files"]
    )


def test_a_left_to_right_encoder_exports_left_to_right(tmp_path, real_vocab):
    """The export reads attention_direction from the model directory: its encoder gives the Keras
    left-to-right encoder's outputs, each text pooled from its last real token."""
    config = dataclasses.replace(CONFIG, attention_direction=modeling.LEFT_TO_RIGHT)
    keras.utils.set_random_seed(2)
    encoder = modeling.build_encoder(config)
    model_dir = str(tmp_path / "model")
    ModelDir(model_dir).write(config, real_vocab, encoder)
    path, kind = export.export(model_dir, str(tmp_path / "export"))
    assert kind == "encoder"
    with open(os.path.join(path, "assets", "bert_config.json")) as f:
        assert json.load(f)["attention_direction"] == "left_to_right"
    x = packed(real_vocab, [[t] for t in TEXTS[:4]], ENCODER_SEQ_LENGTH)
    got, want = tf.saved_model.load(path)(x), encoder(x, training=False)
    for name in ("sequence_output", "pooled_output", "embedding_output"):
        np.testing.assert_allclose(got[name], want[name], atol=1e-5, err_msg=name)


def squad_reference(model_dir, real_vocab):
    """run_squad.py's pipeline as bert_tf.tasks.squad implements it, exhaustive over the n best."""
    model, _, _, spec = models.load_task_model(ModelDir(model_dir))
    examples = []
    for i, (question, context) in enumerate(zip(SQUAD_QUESTIONS, SQUAD_CONTEXTS)):
        if not context:
            continue  # run_squad.py makes no window for it (and so has no answer); checked apart
        doc_tokens, _ = squad.split_doc_tokens(context)
        examples.append(
            squad.SquadExample(
                qas_id=str(i),
                question_text=question,
                doc_tokens=doc_tokens,
                is_impossible=False,
                answers=[],
            )
        )
    features = squad.convert_examples(
        examples,
        tokenizer(real_vocab),
        max_seq_length=spec.max_seq_length,
        doc_stride=spec.doc_stride,
        max_query_length=spec.max_query_length,
    )
    arrays = squad.feature_arrays(features, is_training=False)
    x = {
        packing.MODEL_INPUT_NAMES[k]: np.asarray(v, np.int32)
        for k, v in arrays.items()
        if k in packing.MODEL_INPUT_NAMES
    }
    out = model(x, training=False)
    results = [
        squad.RawResult(unique_id=f.unique_id, start_logits=s, end_logits=e)
        for f, s, e in zip(features, out["start_logits"].numpy(), out["end_logits"].numpy())
    ]
    # n_best_size = seq_length makes the original's candidate search exhaustive, as the export's is.
    predictions, nbest, null_odds = squad_postprocess.postprocess(
        examples, features, results, n_best_size=spec.max_seq_length, version_2_with_negative=True
    )
    return predictions, nbest, null_odds, len(features)


def test_squad_matches_run_squad_pipeline(exported, real_vocab):
    predictions, nbest, null_odds, num_features = squad_reference(
        exported["model_dirs"]["squad"], real_vocab
    )
    assert num_features > len(SQUAD_CONTEXTS) + 3  # long contexts were split into windows
    out = exported["results"]["squad"]
    for i, context in enumerate(SQUAD_CONTEXTS):
        answer, start, end, score = (
            out["answer"][i],
            out["start"][i],
            out["end"][i],
            out["score"][i],
        )
        if not context:
            assert (answer, start, end) == ("", -1, -1)
            continue
        assert answer == predictions[str(i)], i
        if answer:
            assert context[start:end] == answer  # character offsets, also after é and ö
            best = next(c for c in nbest[str(i)] if c["text"])
            assert score == pytest.approx(best["start_logit"] + best["end_logit"], abs=1e-4)
        else:
            assert (start, end) == (-1, -1)
    assert "" in out["answer"] and any(
        out["answer"]
    )  # both outcomes of the null comparison are covered
    megabyte = exported["results"]["squad_megabyte"]
    assert megabyte["answer"][0] == MEGABYTE[megabyte["start"][0] : megabyte["end"][0]]


def ner_reference(model_dir, real_vocab, texts):
    """Entities from bert_tf.tasks.ner's features and conlleval chunking, as (text, type, start, end)."""
    model, _, _, spec = models.load_task_model(ModelDir(model_dir))
    sentences = [ner.Sentence(words=t.split(), tags=["O"] * len(t.split())) for t in texts]
    features = ner.convert_sentences(
        sentences, tokenizer(real_vocab), spec.max_seq_length, spec.labels
    )
    x = {
        packing.MODEL_INPUT_NAMES[k]: v
        for k, v in features.arrays.items()
        if k in packing.MODEL_INPUT_NAMES
    }
    predicted = model(x, training=False)["logits"].numpy().argmax(-1)
    tags = ner.word_predictions(features, predicted, spec.labels)
    entities = []
    for text, sentence, sentence_tags in zip(texts, sentences, tags):
        word_spans, position = [], 0
        for word in sentence.words:
            start = text.index(word, position)
            word_spans.append((start, start + len(word)))
            position = start + len(word)
        entities.append(
            [
                (
                    text[word_spans[s][0] : word_spans[e][1]],
                    entity_type,
                    word_spans[s][0],
                    word_spans[e][1],
                )
                for entity_type, s, e in ner_metrics.get_entities(sentence_tags)
            ]
        )
    return entities


def test_ner_matches_conll_pipeline(exported, real_vocab):
    expected = ner_reference(exported["model_dirs"]["ner"], real_vocab, NER_TEXTS)
    out = exported["results"]["ner"]
    for i, text in enumerate(NER_TEXTS):
        count = out["num_entities"][i]
        got = [
            (
                out["entity_text"][i][j],
                out["entity_type"][i][j],
                out["start"][i][j],
                out["end"][i][j],
            )
            for j in range(count)
        ]
        assert got == expected[i], (text, got, expected[i])
        assert all(text[s:e] == t for t, _, s, e in got)
        assert out["entity_text"][i][count:] == [""] * (len(out["entity_text"][i]) - count)
        assert out["start"][i][count:] == [-1] * (len(out["start"][i]) - count)
    assert sum(out["num_entities"]) > 3
    megabyte = exported["results"]["ner_megabyte"]
    assert (
        megabyte["num_entities"][0] <= SPECS["ner"].max_seq_length
    )  # only the first words are tagged
    assert all(end <= 1000 for end in megabyte["end"][0])


# ----------------------------------------------------------------------------------------------
# Versions and atomicity
# ----------------------------------------------------------------------------------------------


def script_errors(script, *paths):
    """Runs `script` on export paths in a fresh interpreter; returns the {name: [error type,
    message]} JSON it prints (a clean process loads the exports as an app would)."""
    result = subprocess.run(
        [sys.executable, "-c", script, *paths],
        capture_output=True,
        text=True,
        env=python_env(),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


NOT_EXAMPLES_SCRIPT = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    def example(**texts):
        feature = {k: tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode()])) for k, v in texts.items()}
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    garbage = b"\\xff\\xfe\\x00garbage"
    calls = {"classifier": ("classification", [example(text="fine"), garbage]),
             "regressor": ("regression", [example(text_a="a", text_b="b"), example(text_a="c", text_b="d"), garbage])}
    errors = {}
    for name, (signature, inputs) in calls.items():
        try:
            tf.saved_model.load(sys.argv[1 + len(errors)]).signatures[signature](inputs=tf.constant(inputs))
            errors[name] = ["none", ""]
        except Exception as e:
            errors[name] = [type(e).__name__, str(e)]
    print(json.dumps(errors))
""")


def test_classify_and_regress_signatures_name_bytes_that_are_not_examples(exported):
    """Issue 16: bytes that are not a tf.Example raised UnicodeDecodeError in an app, not InvalidArgumentError."""
    paths = exported["paths"]
    errors = script_errors(NOT_EXAMPLES_SCRIPT, paths["classifier"], paths["regressor"])
    assert errors["classifier"][0] == "InvalidArgumentError", errors
    assert "inputs[1] is not a serialized tf.Example" in errors["classifier"][1]
    assert errors["regressor"][0] == "InvalidArgumentError", errors
    assert "inputs[2] is not a serialized tf.Example" in errors["regressor"][1]


WRONG_RANK_SCRIPT = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    errors = {}
    for name, path, inputs in (
        ("classifier", sys.argv[1], {"text": [["a b", "c"]]}),
        ("ner", sys.argv[2], {"text": [["John lives", "in Paris"]]}),
        ("squad", sys.argv[3], {"question": ["who?"], "context": [["a", "b"]]}),
    ):
        signature = tf.saved_model.load(path).signatures["serving_default"]
        try:
            signature(**{k: tf.constant(v) for k, v in inputs.items()})
            errors[name] = ["none", ""]
        except Exception as e:
            errors[name] = [type(e).__name__, str(e)]
    print(json.dumps(errors))
""")


def test_a_text_input_of_another_rank_is_refused_naming_it(exported):
    """A signature call does not check shapes: the graph does, so a [1, 2] batch of texts gets
    INVALID_ARGUMENT naming the input instead of an answer for a shape no client meant."""
    paths = exported["paths"]
    errors = script_errors(WRONG_RANK_SCRIPT, paths["classifier"], paths["ner"], paths["squad"])
    for name, input_name in (("classifier", "text"), ("ner", "text"), ("squad", "context")):
        kind, message = errors[name]
        assert kind == "InvalidArgumentError", (name, errors[name])
        assert f"Shape of tensor {input_name} [1,2] is not compatible" in message, (name, message)


def test_serving_functions_take_inputs_by_position_or_name_and_check_shapes(tmp_path):
    class Module(tf.Module):
        def __init__(self):
            super().__init__()
            self.serve = export_graph.serving_function(
                self._serve,
                input_signature=[
                    export_graph.text_spec("question"),
                    export_graph.text_spec("context"),
                ],
            )

        def _serve(self, question, context):
            return {"n": tf.strings.length(question) + tf.strings.length(context)}

    module = Module()
    tf.saved_model.save(module, str(tmp_path), signatures={"serving_default": module.serve})
    loaded = tf.saved_model.load(str(tmp_path))
    question, context = tf.constant(["ab"]), tf.constant(["xyz"])
    for serve in (module.serve, loaded.serve):
        assert serve(question, context)["n"].numpy().tolist() == [5]
        assert serve(question=question, context=context)["n"].numpy().tolist() == [5]
    signature = loaded.signatures["serving_default"]
    assert sorted(signature.structured_input_signature[1]) == ["context", "question"]
    with pytest.raises(tf.errors.InvalidArgumentError, match="Shape of tensor context"):
        signature(question=question, context=tf.constant([["x", "y"]]))


def test_next_version(tmp_path):
    assert export.next_version(str(tmp_path / "missing")) == 1
    for name in ("1", "3", "10", "latest", ".11.tmp-abc", "7x"):
        (tmp_path / name).mkdir()
    assert export.numeric_versions(str(tmp_path)) == [1, 3, 10]
    assert export.next_version(str(tmp_path)) == 11


def test_version_directories_have_ordinary_permissions(exported, tmp_path):
    """A version directory is readable like any new directory (regression: mkdtemp's 0700 survived the rename)."""
    reference = tmp_path / "reference"
    reference.mkdir()
    expected = os.stat(reference).st_mode & 0o777
    for name, path in exported["paths"].items():
        assert os.stat(path).st_mode & 0o777 == expected, name


def test_existing_version_is_refused_before_any_work(exported):
    root = exported["root"]
    with pytest.raises(io_utils.UsageError, match="already exists"):
        export.export("/nonexistent/model", str(root / "export" / "classifier"), version=1)
    with pytest.raises(io_utils.UsageError, match="model directory .* does not exist"):
        export.export(str(root / "models" / "nonexistent"), str(root / "export" / "none"))


def test_failed_export_leaves_no_version(exported, monkeypatch):
    """A failure after the SavedModel is written (here: while setting method names) leaves nothing."""
    export_dir = exported["root"] / "export" / "classifier"
    before = sorted(os.listdir(export_dir))

    def fail(path, methods):
        assert os.path.exists(os.path.join(path, "saved_model.pb"))  # the version was half done
        raise OSError("disk full")

    monkeypatch.setattr(export, "set_method_names", fail)
    with pytest.raises(OSError, match="disk full"):
        export.export(exported["model_dirs"]["classifier"], str(export_dir))
    assert sorted(os.listdir(export_dir)) == before
    assert export.next_version(str(export_dir)) == 2


def test_an_export_removes_the_temporary_directories_of_killed_exports_never_a_live_one(
    tmp_path, monkeypatch
):
    """Issue 34: a killed export's .N.tmp-* directories were never removed."""
    export_dir = tmp_path / "export"
    export_dir.mkdir()
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    host = export._host()
    dead = export_dir / f".1.tmp-{host}-{int(gone.stdout)}-{'a' * 32}"  # its writer was killed
    live = export_dir / f".2.tmp-{host}-{os.getpid()}-{'b' * 32}"  # a writer still at work
    old = export_dir / f".3.tmp-{'c' * 32}"  # an older bert_tf's, untouched for two days
    fresh = export_dir / f".4.tmp-{'d' * 32}"  # the same, but it may still be written
    other_host = export_dir / f".5.tmp-elsewhere-1-{'e' * 32}"
    for path in (dead, live, old, fresh, other_host):
        path.mkdir()
    two_days_ago = os.path.getmtime(old) - 2 * 24 * 3600
    os.utime(old, (two_days_ago, two_days_ago))

    monkeypatch.setattr(export, "build_serving_modules", lambda *a, **k: ({"": None}, "encoder"))
    monkeypatch.setattr(export, "save_module", lambda module, path: None)
    monkeypatch.setattr(export, "write_warmup_requests", lambda *a, **k: None)
    path, _ = export.export("unused", str(export_dir))
    assert path == str(export_dir / "1")
    assert sorted(os.listdir(export_dir)) == sorted(["1", live.name, fresh.name, other_host.name])


def test_cli_usage_errors_exit_2(exported):
    usage = exported["usage"]  # run beside the app in the fixture: no --model_dir
    assert usage.returncode == 2 and "--model_dir is required" in usage.stderr


def test_squad_v1_context_without_tokens_has_no_answer(tmp_path, real_vocab):
    """A SQuAD v1 model answers "" (-1, -1, the null score) for a context with no tokens, in any batch.

    Regression: `best` came from unsorted_segment_max, which starts at float32's lowest finite
    value, so it was never -inf; such a context "had" an answer read from another row's tokens
    (an op error, or start 0 with a score of -3.4e38).
    """
    spec = models.TaskSpec(
        "squad", max_seq_length=32, max_query_length=8, doc_stride=8, version_2_with_negative=False
    )
    config = tiny_config(real_vocab, max_position_embeddings=32)
    keras.utils.set_random_seed(2)
    model, encoder = models.build_task_model(config, spec)
    model_dir = str(tmp_path / "squad_v1")
    ModelDir(model_dir).write(config, real_vocab, encoder, spec=spec, model=model)
    modules, kind = export.build_serving_modules(model_dir)
    assert kind == "squad"
    serve = modules[""].serve
    contexts = ["The letter was written by Jane Austen.", "", "   ", "\xff", "Short context."]
    questions = ["Who wrote it?"] * len(contexts)
    contexts_bytes = [c.encode("utf-8") if c != "\xff" else b"\xff" for c in contexts]
    out = {
        k: v.numpy() for k, v in serve(tf.constant(questions), tf.constant(contexts_bytes)).items()
    }
    for i, context in enumerate(contexts):
        if context.strip() and context != "\xff":
            assert (
                out["start"][i] >= 0
                and context[out["start"][i] : out["end"][i]] == out["answer"][i].decode()
            )
        else:
            assert (out["answer"][i], out["start"][i], out["end"][i]) == (b"", -1, -1), i
            assert out["score"][i] > -1e30, i  # the null score, not float32's lowest
    alone = {k: v.numpy() for k, v in serve(tf.constant(["who"]), tf.constant([""])).items()}
    assert (alone["answer"][0], alone["start"][0], alone["end"][0]) == (b"", -1, -1)
    # Decomposed (NFD) text: the lower-casing tokenizer drops the accent after the last token, and
    # the answer must still end after it (regression: it was "Cafe", half a character short).
    for context in ["Cafe\u0301", "Zu\u0308rich\u0301\u0300"]:
        one = {
            k: v.numpy() for k, v in serve(tf.constant(["where"]), tf.constant([context])).items()
        }
        assert (one["answer"][0].decode(), one["start"][0], one["end"][0]) == (
            context,
            0,
            len(context),
        )


def test_pair_with_a_b_without_tokens_serves_as_fine_tuning_packed_it(tmp_path, real_vocab):
    """A text_b that tokenizes to nothing ("", "\u200b") is served as `[CLS] a [SEP]`, as convert_examples packs it.

    Regression: the serving graph packed `[CLS] a [SEP] [SEP]` (a cut one token earlier), while
    fine-tuning, like the original, packed the single sentence.
    """
    spec = models.TaskSpec("classifier", labels=["0", "1"], is_pair=True, max_seq_length=8)
    config = tiny_config(real_vocab, max_position_embeddings=8)
    keras.utils.set_random_seed(3)
    model, encoder = models.build_task_model(config, spec)
    model_dir = str(tmp_path / "pair")
    ModelDir(model_dir).write(config, real_vocab, encoder, spec=spec, model=model)
    module = export.build_serving_modules(model_dir)[0][""]
    texts_a = ["one two three four five six seven", "one two", "a b c d e f g h", "x"]
    texts_b = ["\u200b", "three four", "", " \u200b\u200c "]
    examples = [
        classification.InputExample(str(i), a, b, "0")
        for i, (a, b) in enumerate(zip(texts_a, texts_b))
    ]
    expected = classification.convert_examples(
        examples, tokenizer(real_vocab), spec.max_seq_length, spec.labels
    )
    got = module.packer.pack([tf.constant(texts_a), tf.constant(texts_b)])
    for name, model_name in packing.MODEL_INPUT_NAMES.items():
        np.testing.assert_array_equal(got[model_name].numpy(), expected[name], err_msg=name)
    full = tokenizer(real_vocab)
    assert full.convert_ids_to_tokens(got["input_word_ids"][0].numpy()) == (
        ["[CLS]"] + "one two three four five six".split() + ["[SEP]"]
    )
    inputs = {model_name: expected[name] for name, model_name in packing.MODEL_INPUT_NAMES.items()}
    probabilities = tf.nn.softmax(model(inputs, training=False)["logits"]).numpy()
    served = module.serve(tf.constant(texts_a), tf.constant(texts_b))
    np.testing.assert_allclose(served["probabilities"].numpy(), probabilities, atol=1e-5)


def test_ner_entities_keep_trailing_combining_marks(tmp_path, real_vocab):
    """With every word tagged B-PER, the entities are the whitespace words, accents of NFD text included."""
    spec = models.TaskSpec("ner", labels=["O", "B-PER", "I-PER"], max_seq_length=32)
    config = tiny_config(real_vocab, max_position_embeddings=32)
    model, encoder = models.build_task_model(config, spec)
    head = [layer for layer in model.layers if layer.name.endswith("_head")][0]
    kernel = head.get_weights()[0]
    head.set_weights(
        [np.zeros_like(kernel), np.array([0.0, 10.0, 0.0], np.float32)]
    )  # always B-PER
    model_dir = str(tmp_path / "ner")
    ModelDir(model_dir).write(config, real_vocab, encoder, spec=spec, model=model)
    serve = export.build_serving_modules(model_dir)[0][""].serve
    texts = ["Cafe\u0301 Zu\u0308rich nai\u0308ve\u0301\u0300 plain", "\u00e9 e\u0301"]
    out = {k: v.numpy() for k, v in serve(tf.constant(texts)).items()}
    for row, text in enumerate(texts):
        expected, position = [], 0
        for word in text.split():
            start = text.index(word, position)
            position = start + len(word)
            expected.append((word, start, position))
        count = out["num_entities"][row]
        got = [
            (out["entity_text"][row, i].decode(), out["start"][row, i], out["end"][row, i])
            for i in range(count)
        ]
        assert got == expected


def test_max_seq_length_zero_is_refused_not_defaulted(tmp_path, real_vocab):
    """--max_seq_length=0 is an error, not "use the default" (regression: `0 or default`)."""
    config = tiny_config(real_vocab, max_position_embeddings=32)
    model_dir = str(tmp_path / "encoder")
    ModelDir(model_dir).write(config, real_vocab, modeling.build_encoder(config))
    for bad in (0, 2, 33):
        with pytest.raises(io_utils.UsageError, match="max_seq_length"):
            export.build_serving_modules(model_dir, max_seq_length=bad)


def test_export_does_not_import_the_server():
    # Exporting must not pay for (or depend on) grpc and the serving package: they share only
    # bert_tf.saved_model.model_versions.
    script = (
        "import sys, bert_tf.export; "
        "loaded = [m for m in sys.modules if m.startswith(('bert_tf.serv', 'grpc'))]; "
        "assert not loaded, loaded"
    )
    result = run_python_script(script)
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_session_based_loader_restores_every_variable(exported):
    # Keras 3 keeps a layer's tf.Variables inside its Keras variables, which a session-based loader
    # (TF Serving's, saved_model_cli run) would leave uninitialized without the export's tracking.
    paths, results = exported["paths"], exported["results"]
    got = session_outputs(paths["classifier"], "serving_default", {"text": TEXTS})
    np.testing.assert_allclose(
        got["probabilities"], results["classifier"]["probabilities"], atol=1e-5
    )
    a, b = PAIRS
    got = session_outputs(paths["regressor"], "serving_default", {"text_a": a, "text_b": b})
    np.testing.assert_allclose(got["score"], results["regressor"]["score"], atol=1e-5)
    got = session_outputs(
        paths["squad"], "serving_default", {"question": SQUAD_QUESTIONS, "context": SQUAD_CONTEXTS}
    )
    assert got["start"].tolist() == results["squad"]["start"]
    got = session_outputs(paths["ner"], "serving_default", {"text": NER_TEXTS})
    assert got["num_entities"].tolist() == results["ner"]["num_entities"]
    inputs = {k: np.array(v, np.int32) for k, v in results["preprocess_signature"].items()}
    got = session_outputs(paths["encoder"], "serving_default", inputs)
    np.testing.assert_allclose(
        got["pooled_output"], results["encoder_signature"]["pooled_output"], atol=1e-5
    )


def test_bilstm_and_feature_based_exports_serve_what_their_keras_models_give(tmp_path, real_vocab):
    """A BiLSTM head, on a fine-tuned encoder or on a frozen one's scalar mix, exports like any
    head: the InferenceEncoder takes the encoder's place (inside the FrozenEncoder too)."""
    config = tiny_config(real_vocab, num_hidden_layers=4, max_position_embeddings=32)
    keras.utils.set_random_seed(4)
    specs = {
        "classifier": dataclasses.replace(SPECS["classifier"], head="bilstm", lstm_units=4),
        "ner": dataclasses.replace(
            SPECS["ner"], max_seq_length=32, head="bilstm", lstm_units=4, features="sum_last_four"
        ),
    }
    served = {}
    for kind, spec in specs.items():
        model, encoder = models.build_task_model(config, spec)
        head = model.get_layer(f"{kind}_head")
        rng = np.random.default_rng(5)
        head.set_weights([rng.normal(0, 3, w.shape).astype(np.float32) for w in head.get_weights()])
        if kind == "ner":
            model.get_layer("encoder_features").set_weights(
                [np.float32([2, -1, 0, 1]), np.float32(1.5)]
            )
        model_dir = str(tmp_path / "models" / kind)
        ModelDir(model_dir).write(config, real_vocab, encoder, spec=spec, model=model)
        path, _ = export.export(model_dir, str(tmp_path / "export" / kind))
        served[kind] = tf.saved_model.load(path).signatures["serving_default"]
    model, _, _, spec = models.load_task_model(ModelDir(str(tmp_path / "models" / "classifier")))
    x = packed(real_vocab, [[t] for t in TEXTS], spec.max_seq_length)
    probabilities = tf.nn.softmax(model(x, training=False)["logits"]).numpy()
    got = served["classifier"](text=tf.constant(TEXTS))["probabilities"].numpy()
    np.testing.assert_allclose(got, probabilities, atol=1e-5)
    assert np.ptp(probabilities[:, 0]) > 0.01  # the texts' outputs differ: the test can fail
    # TF Serving's session-based loader restores the BiLSTM's variables too.
    session = session_outputs(
        str(tmp_path / "export" / "classifier" / "1"), "serving_default", {"text": TEXTS}
    )
    np.testing.assert_allclose(session["probabilities"], probabilities, atol=1e-5)

    expected = ner_reference(str(tmp_path / "models" / "ner"), real_vocab, NER_TEXTS)
    out = served["ner"](text=tf.constant(NER_TEXTS))
    for i in range(len(NER_TEXTS)):
        count = int(out["num_entities"][i])
        got = [
            (
                out["entity_text"][i, j].numpy().decode(),
                out["entity_type"][i, j].numpy().decode(),
                int(out["start"][i, j]),
                int(out["end"][i, j]),
            )
            for j in range(count)
        ]
        assert got == expected[i], (NER_TEXTS[i], got, expected[i])
    assert sum(len(entities) for entities in expected) > 3
