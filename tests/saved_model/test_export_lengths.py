"""Length-aware exports: each batch padded to its own longest input answers as the padded export did.

Every kind is exported from one random-weight model directory the default way (dynamic length)
and with `pad_to_max_seq_length=True` (today's static shapes, the reference); a few kinds also with
`precision="bfloat16"` and with `jit_compile=True`. The dynamic export must give the reference's
probabilities within 1e-5 and the same labels, spans and entities, on short, mixed, megabyte-long
and invalid-UTF-8 inputs; an empty batch gives empty outputs of the right dtypes; the warm-up file
has requests at every multiple of 16 (the lengths an XLA export pads to) and, for a graph export,
at every short length.
"""

import shutil

import numpy as np
import pytest
import tensorflow as tf
from helpers import tiny_config
from tensorflow_serving.apis import prediction_log_pb2

from bert_tf.model import modeling
from bert_tf.model.model_dir import ModelDir
from bert_tf.saved_model import export, warmup
from bert_tf.saved_model.inference_encoder import InferenceEncoder
from bert_tf.serving import servable as servable_module
from bert_tf.tasks import models
from bert_tf.tasks.export_graph import LENGTH_GROUP_ROWS, TextPacker, call_by_length, text_spec
from bert_tf.tasks.packing import LENGTH_BUCKET

pytestmark = pytest.mark.slow

CONFIG = tiny_config(vocab_size=30522, max_position_embeddings=128)  # the real vocabulary
# Not a multiple of LENGTH_BUCKET: the last bucket (64 -> 72) is cut short to max_seq_length.
SEQ_LENGTH = 72
SPECS = {
    "classifier": models.TaskSpec("classifier", labels=["a", "b", "c"], max_seq_length=SEQ_LENGTH),
    "regressor": models.TaskSpec("regressor", is_pair=True, max_seq_length=SEQ_LENGTH),
    "squad": models.TaskSpec(
        "squad",
        max_seq_length=SEQ_LENGTH,
        max_query_length=12,
        doc_stride=24,
        version_2_with_negative=True,
    ),
    "ner": models.TaskSpec(
        "ner", labels=["O", "B-PER", "I-PER", "B-LOC"], max_seq_length=SEQ_LENGTH
    ),
    "multiple_choice": models.TaskSpec("multiple_choice", max_seq_length=SEQ_LENGTH),
}
# Each export takes seconds on CI's 2 cores, so these options are shown on the kinds with the most
# outputs and the most complex batching (SQuAD's windows), not on every kind.
BFLOAT16_KINDS = ["classifier", "squad"]  # probabilities, and spans
XLA_KINDS = ["classifier", "squad"]
MEGABYTE = ("Ünïcode wörds and plain words, " * 40000)[: 1 << 20]
INVALID_UTF8 = b"caf\xc3 broken \xff\xfe bytes"
SHORT = ["Good.", "A fine film about a dog."]
MIXED = SHORT + ["word " * 50, "", MEGABYTE.encode(), INVALID_UTF8]
QUESTIONS = ["who is it?", "where", "", "what is the name of the town?"]
# More rows than export_graph.LENGTH_GROUP_ROWS, of very different lengths and out of order, so
# the batch runs in groups of similar length (call_by_length).
MANY = [("word " * n) + SHORT[n % 2] for n in (0, 40, 3, 70, 1, 12, 0, 25, 5, 60, 2, 0, 33, 8)]
MANY += ["", INVALID_UTF8] + [SHORT[n % 2] * n for n in range(1, 6)]
CONTEXTS = [
    "Jane lives in Bath.",
    "The café is in Zürich, near the lake. " * 12,
    "",
    MEGABYTE[:5000],
]


@pytest.fixture(scope="module")
def exports(tmp_path_factory, real_vocab):
    """{kind: {"dynamic" | "static" | "bfloat16" | "xla": loaded export}} and the export paths."""
    root = tmp_path_factory.mktemp("lengths")
    tf.keras.utils.set_random_seed(3)
    loaded, paths = {}, {}
    for kind, spec in list(SPECS.items()) + [("encoder", None)]:
        model_dir = str(root / "models" / kind)
        if spec is None:
            ModelDir(model_dir).write(CONFIG, real_vocab, modeling.build_encoder(CONFIG))
        else:
            model, encoder = models.build_task_model(CONFIG, spec)
            head = [layer for layer in model.layers if layer.name.endswith("_head")][0]
            rng = np.random.default_rng(7)  # large head weights: outputs differ between texts
            head.set_weights(
                [rng.normal(0, 1, w.shape).astype(np.float32) for w in head.get_weights()]
            )
            ModelDir(model_dir).write(CONFIG, real_vocab, encoder, spec=spec, model=model)
        loaded[kind], paths[kind] = {}, {}
        for variant, options in (
            ("dynamic", {}),
            ("static", {"pad_to_max_seq_length": True}),
            ("bfloat16", {"precision": "bfloat16"}),
            ("xla", {"jit_compile": True}),
        ):
            if (variant == "bfloat16" and kind not in BFLOAT16_KINDS) or (
                variant == "xla" and kind not in XLA_KINDS
            ):
                continue
            path, _ = export.export(
                model_dir,
                str(root / "export" / kind / variant),
                max_seq_length=SEQ_LENGTH,
                **options,
            )
            paths[kind][variant] = path
            loaded[kind][variant] = tf.saved_model.load(path)
    return loaded, paths


def call_default(module, **inputs):
    """serving_default on numpy/str inputs -> {name: ndarray}."""
    outputs = module.signatures["serving_default"](**{k: tf.constant(v) for k, v in inputs.items()})
    return {name: value.numpy() for name, value in outputs.items()}


def assert_same(dynamic, static, atol=1e-5, repeats_tie=False):
    """Every output equal (strings, ints) or within atol (floats).

    `repeats_tie` (SQuAD): an answer that the context repeats word for word scores the same at
    each repeat, and kernels that sum in another order (XLA's) may pick another of them; such a
    row's span may move, to the same answer text of the same length and score.
    """
    assert dynamic.keys() == static.keys()
    if repeats_tie:
        moved = dynamic["start"] != static["start"]
        np.testing.assert_array_equal(dynamic["answer"], static["answer"], err_msg="answer")
        np.testing.assert_array_equal(
            (dynamic["end"] - dynamic["start"])[moved], (static["end"] - static["start"])[moved]
        )
        np.testing.assert_allclose(dynamic["score"][moved], static["score"][moved], atol=atol)
        dynamic = {name: value[~moved] for name, value in dynamic.items()}
        static = {name: value[~moved] for name, value in static.items()}
    for name in static:
        assert dynamic[name].dtype == static[name].dtype, name
        if static[name].dtype.kind == "f":
            np.testing.assert_allclose(dynamic[name], static[name], atol=atol, err_msg=name)
        else:
            np.testing.assert_array_equal(dynamic[name], static[name], err_msg=name)


# The inputs of each kind's serving_default, for one batch of `texts`.
def kind_inputs(kind, texts):
    """serving_default's inputs of `kind` for the batch of `texts`."""
    texts = list(texts)
    if kind in ("classifier", "ner"):
        return {"text": texts}
    if kind == "regressor":
        return {"text_a": texts, "text_b": texts[::-1]}
    if kind == "squad":
        return {
            "question": [QUESTIONS[i % len(QUESTIONS)] for i in range(len(texts))],
            "context": texts,
        }
    return {"context": texts, "endings": [[t, "a cat.", "the end"] for t in texts[::-1]]}


@pytest.mark.parametrize("kind", list(SPECS))
def test_dynamic_length_answers_as_the_padded_export(exports, kind):
    loaded, _ = exports
    for batch in (SHORT, MIXED, [SHORT[0]], CONTEXTS, MANY):
        inputs = kind_inputs(kind, batch)
        assert_same(
            call_default(loaded[kind]["dynamic"], **inputs),
            call_default(loaded[kind]["static"], **inputs),
        )


@pytest.mark.parametrize("kind", list(SPECS))
def test_empty_batch_gives_empty_outputs_of_the_right_dtypes(exports, kind):
    loaded, _ = exports
    empty = {
        name: np.zeros([0] + ([3] if name == "endings" else []), object)
        for name in kind_inputs(kind, ["x"])
    }
    outputs = call_default(loaded[kind]["dynamic"], **empty)
    reference = call_default(loaded[kind]["static"], **kind_inputs(kind, SHORT))
    for name, value in outputs.items():
        assert value.shape[0] == 0, name
        assert value.dtype == reference[name].dtype, name
        if kind in ("classifier", "multiple_choice") and name == "probabilities":
            assert value.shape[1:] == reference[name].shape[1:]


def test_preprocessor_pads_to_the_longest_input_and_encoder_agrees(exports):
    loaded, _ = exports
    preprocess = tf.saved_model.load(
        exports[1]["encoder"]["dynamic"] + "/" + export.PREPROCESS_SUBDIR
    )
    static = tf.saved_model.load(exports[1]["encoder"]["static"] + "/" + export.PREPROCESS_SUBDIR)
    short = preprocess(tf.constant(SHORT))
    # A graph export (no XLA) pads to the exact longest row: "a fine film about a dog ." + 2.
    assert short["input_word_ids"].shape == (2, 9)
    assert static(tf.constant(SHORT))["input_word_ids"].shape == (2, SEQ_LENGTH)
    assert preprocess(tf.constant(["word " * 20]))["input_mask"].shape == (1, 22)
    assert preprocess(tf.constant([MEGABYTE]))["input_mask"].shape == (1, SEQ_LENGTH)
    # A caller that asks for a seq_length gets it, as from TF Hub's preprocessors.
    segments = [preprocess.tokenize(tf.constant(SHORT))]
    assert preprocess.bert_pack_inputs(segments, seq_length=40)["input_word_ids"].shape == (2, 40)
    full = static(tf.constant(SHORT))
    encoder = loaded["encoder"]["dynamic"]
    trimmed = encoder(short)["pooled_output"].numpy()
    np.testing.assert_allclose(trimmed, encoder(full)["pooled_output"].numpy(), atol=1e-5)


def test_text_packer_lengths_follow_the_longest_row_rounded_up(tmp_path, real_vocab):
    (tmp_path / "vocab.txt").write_bytes(open(real_vocab, "rb").read())
    exact = TextPacker(str(tmp_path), CONFIG, 80)
    bucketed = TextPacker(str(tmp_path), CONFIG, 80, length_multiple=LENGTH_BUCKET)  # XLA's
    static = TextPacker(str(tmp_path), CONFIG, 80, dynamic_length=False)
    # words -> packed tokens (words + [CLS] + [SEP], at most 80), and rounded up to 16.
    for words, tokens, rounded in (
        (1, 3, 16),
        (14, 16, 16),
        (15, 17, 32),
        (60, 62, 64),
        (78, 80, 80),
        (500, 80, 80),
    ):
        texts = [tf.constant(["word " * words, "short"])]
        assert exact.pack(texts)["input_word_ids"].shape == (2, tokens), words
        assert bucketed.pack(texts)["input_word_ids"].shape == (2, rounded), words
        assert static.pack(texts)["input_word_ids"].shape == (2, 80), words
        window_tokens = tf.constant([tokens, 3])
        assert exact.padded_length(window_tokens).numpy() == tokens
        assert bucketed.padded_length(window_tokens).numpy() == rounded


def inference_encoders(model):
    """The InferenceEncoder layers of a served Keras model (or of the one a CompiledModel runs)."""
    model = getattr(model, "model", model)
    return [layer for layer in model._flatten_layers() if isinstance(layer, InferenceEncoder)]


def test_xla_exports_round_lengths_up_to_the_bucket_and_graph_exports_do_not(tmp_path, real_vocab):
    spec = SPECS["classifier"]
    model, encoder = models.build_task_model(CONFIG, spec)
    ModelDir(str(tmp_path / "task")).write(CONFIG, real_vocab, encoder, spec=spec, model=model)
    ModelDir(str(tmp_path / "pretrained")).write(CONFIG, real_vocab, encoder)
    for jit_compile, multiple, width in ((False, 1, 9), (True, LENGTH_BUCKET, LENGTH_BUCKET)):
        modules, _ = export.build_serving_modules(str(tmp_path / "task"), jit_compile=jit_compile)
        packer = modules[""].packer
        assert packer.length_multiple == multiple
        # "a fine film about a dog ." and [CLS], [SEP]: 9 tokens.
        assert packer.pack([tf.constant(SHORT)])["input_word_ids"].shape == (2, width)
        # XLA compiles no tf.data ops: its encoder runs without the intra-op limit.
        pretrained, _ = export.build_serving_modules(
            str(tmp_path / "pretrained"), jit_compile=jit_compile
        )
        for served in (modules[""].model, pretrained[""].encoder):
            [fast] = inference_encoders(served)
            assert (fast.limited_forward is None) == jit_compile
            assert (fast.limited_pooled_forward is None) == jit_compile


# Rows sorted by length and grouped by the multiple of LENGTH_BUCKET they round up to, at most
# LENGTH_GROUP_ROWS at a time: 19 rows of at most 16 tokens (16, then 3), 17 and 20, 33 and 48, 64,
# and 70 and 72. Each group is cut to its longest row: exactly (graph exports), or rounded up to
# LENGTH_BUCKET (XLA), where 70 and 72's bucket (80) is cut to the batch's length.
GROUP_SHAPES = {
    1: [(16, 13), (3, 16), (2, 20), (2, 48), (1, 64), (2, SEQ_LENGTH)],
    LENGTH_BUCKET: [(16, 16), (3, 16), (2, 32), (2, 48), (1, 64), (2, SEQ_LENGTH)],
}


@pytest.mark.parametrize("length_multiple", sorted(GROUP_SHAPES))
def test_call_by_length_runs_groups_cut_to_their_own_length_in_the_batch_order(length_multiple):
    tf.keras.utils.set_random_seed(5)
    model, _ = models.build_task_model(CONFIG, SPECS["ner"])  # logits [b, s, labels]
    lengths = [3, 70, 5, 9, 64, 2, 17, 33, 4, 72, 6, 1, 48, 7, 20, 11, 3, 5, 2]
    lengths += [8, 10, 12, 14, 15, 16, 13]
    assert len(lengths) > LENGTH_GROUP_ROWS
    rng = np.random.default_rng(0)
    mask = (np.arange(SEQ_LENGTH)[None, :] < np.array(lengths)[:, None]).astype(np.int32)
    inputs = {
        "input_word_ids": tf.constant(rng.integers(1000, 2000, mask.shape) * mask, tf.int32),
        "input_mask": tf.constant(mask),
        "input_type_ids": tf.zeros(mask.shape, tf.int32),
    }
    calls = []

    def recording_model(batch, training=False):
        calls.append(batch["input_mask"].shape)
        return model(batch, training=training)

    recording_model.output = model.output
    grouped = call_by_length(recording_model, inputs, ("logits",), length_multiple)["logits"]
    grouped = grouped.numpy()
    whole = model(inputs, training=False)["logits"].numpy()
    assert grouped.shape == whole.shape
    kept = mask.astype(bool)
    np.testing.assert_allclose(grouped[kept], whole[kept], atol=1e-5)
    assert LENGTH_GROUP_ROWS == 16 and LENGTH_BUCKET == 16
    assert [tuple(shape) for shape in calls] == GROUP_SHAPES[length_multiple]
    shortest = np.argsort(lengths, kind="stable")[:LENGTH_GROUP_ROWS]
    first_length = GROUP_SHAPES[length_multiple][0][1]
    assert not grouped[shortest, first_length:].any()  # padded back with zeros past the group
    # Up to LENGTH_GROUP_ROWS rows run as one batch, untrimmed (the packer trimmed it already).
    few = {name: value[:LENGTH_GROUP_ROWS] for name, value in inputs.items()}
    calls.clear()
    np.testing.assert_array_equal(
        call_by_length(recording_model, few, ("logits",), length_multiple)["logits"].numpy(),
        model(few, training=False)["logits"].numpy(),
    )
    assert [tuple(shape) for shape in calls] == [(LENGTH_GROUP_ROWS, SEQ_LENGTH)]


@pytest.mark.parametrize("kind", BFLOAT16_KINDS)
def test_bfloat16_export_keeps_dtypes_and_answers(exports, kind):
    loaded, _ = exports
    inputs = kind_inputs(kind, SHORT + ["word " * 30])
    bf16 = call_default(loaded[kind]["bfloat16"], **inputs)
    reference = call_default(loaded[kind]["static"], **inputs)
    for name in reference:
        assert bf16[name].dtype == reference[name].dtype, name
    if "probabilities" in reference:
        # bfloat16 keeps 8 bits of mantissa: close, not equal.
        np.testing.assert_allclose(bf16["probabilities"], reference["probabilities"], atol=0.05)


@pytest.mark.parametrize("kind", XLA_KINDS)
def test_xla_compiled_export_answers_as_the_padded_export(exports, kind):
    loaded, _ = exports
    for batch in (SHORT, MIXED, CONTEXTS, MANY):
        inputs = kind_inputs(kind, batch)
        assert_same(
            call_default(loaded[kind]["xla"], **inputs),
            call_default(loaded[kind]["static"], **inputs),
            repeats_tie=kind == "squad",
        )


@pytest.mark.parametrize("kind", list(SPECS) + ["encoder"])
def test_warmup_file_has_requests_of_every_bucket_length_that_the_export_answers(exports, kind):
    loaded, paths = exports
    # (length, rows). An XLA export also compiles a full group and a group of 1 per length; a
    # graph export runs exact lengths, so it is also warmed at every one up to 64, shortest last.
    lengths = list(range(LENGTH_BUCKET, SEQ_LENGTH, LENGTH_BUCKET)) + [SEQ_LENGTH]
    assert warmup.EXACT_LENGTHS_UP_TO == 64
    expected = {
        "dynamic": [(n, 1) for n in lengths + list(range(64, 2, -1))],
        "static": [(SEQ_LENGTH, 1)],
        "xla": [(n, 1) for n in lengths] + [(n, LENGTH_GROUP_ROWS + 1) for n in lengths],
    }
    for variant, shapes in expected.items():
        if variant not in paths[kind]:
            continue
        path = warmup.requests_path(paths[kind][variant])
        records = list(tf.data.TFRecordDataset(path).as_numpy_iterator())
        assert len(records) == len(shapes)
        for record in records:  # TF Serving's own proto parses them
            log = prediction_log_pb2.PredictionLog.FromString(record)
            assert log.predict_log.request.model_spec.signature_name == "serving_default"
        requests = warmup.read_requests(paths[kind][variant])
        answered_rows = []
        for request in requests:
            outputs = call_default(loaded[kind][variant], **request.inputs)
            answered_rows.append({value.shape[0] for value in outputs.values()})
        assert answered_rows == [{rows} for _, rows in shapes]
        if kind == "encoder":
            word_ids = [request.inputs["input_word_ids"].shape for request in requests]
            assert word_ids == [(rows, n) for n, rows in shapes]


@pytest.mark.parametrize("names", [("text",), ("text_a", "text_b")])
def test_warmup_texts_pack_to_every_length_in_their_range(tmp_path, real_vocab, names):
    (tmp_path / "vocab.txt").write_bytes(open(real_vocab, "rb").read())
    packer = TextPacker(str(tmp_path), CONFIG, SEQ_LENGTH)
    specs = {name: text_spec(name) for name in names}
    word = warmup.filler_word(real_vocab)
    packed = set()
    for length in range(3, warmup.EXACT_LENGTHS_UP_TO + 1):
        inputs = warmup.signature_inputs(specs, length, word, ids={})
        texts = [tf.constant(inputs[name]) for name in names]
        packed.add(packer.pack(texts)["input_word_ids"].shape[1])
    # One text packs [CLS] words [SEP], a pair [CLS] word [SEP] words [SEP]: no length is skipped
    # (splitting the words evenly skipped every other length of a pair).
    shortest, longest = (3, 63) if len(names) == 1 else (5, 64)
    assert packed == set(range(shortest, longest + 1))


def test_serve_replays_the_warmup_requests_before_serving(exports, tmp_path, monkeypatch):
    _, paths = exports
    calls, real = [], servable_module.call_signature

    def recording(signature, arrays):
        calls.append((signature.name, {name: a.shape for name, a in arrays.items()}))
        return real(signature, arrays)

    monkeypatch.setattr(servable_module, "call_signature", recording)
    servable_module.Servable("clf", 1, paths["classifier"]["dynamic"])
    replayed = [shapes for name, shapes in calls if name == "serving_default"]
    assert len(replayed) == len(warmup.read_requests(paths["classifier"]["dynamic"])) == 5 + 62
    # A signature the warm-up file left out still gets its dummy call.
    assert [name for name, _ in calls if name != "serving_default"] == ["classification"]

    # A broken warm-up file fails the load (TF Serving's behaviour), naming the file.
    broken = tmp_path / "broken" / "1"
    shutil.copytree(paths["classifier"]["dynamic"], broken)
    with tf.io.TFRecordWriter(warmup.requests_path(str(broken))) as writer:
        writer.write(b"\xff not a PredictionLog")
    with pytest.raises(ValueError, match="tf_serving_warmup_requests: record 1"):
        servable_module.Servable("clf", 1, str(broken))


def text_example(**texts):
    """A tf.Example of bytes features."""
    feature = {
        name: tf.train.Feature(bytes_list=tf.train.BytesList(value=[text.encode()]))
        for name, text in texts.items()
    }
    return tf.train.Example(features=tf.train.Features(feature=feature))


def write_logs(version_dir, logs):
    """Replaces VERSION_DIR's warm-up file with `logs` (PredictionLog protos)."""
    with tf.io.TFRecordWriter(warmup.requests_path(str(version_dir))) as writer:
        for log in logs:
            writer.write(log.SerializeToString())


def test_serve_replays_classify_regress_and_multi_inference_logs(exports, tmp_path, monkeypatch):
    _, paths = exports
    calls, real = [], servable_module.call_signature

    def recording(signature, arrays):
        calls.append((signature.name, {name: list(a) for name, a in arrays.items()}))
        return real(signature, arrays)

    monkeypatch.setattr(servable_module, "call_signature", recording)
    classifier = tmp_path / "classifier" / "1"
    shutil.copytree(paths["classifier"]["dynamic"], classifier)
    classify = prediction_log_pb2.PredictionLog()
    request = classify.classify_log.request
    request.model_spec.signature_name = "classification"
    request.input.example_list.examples.add().CopyFrom(text_example(text="A fine film."))
    multi = prediction_log_pb2.PredictionLog()
    task = multi.multi_inference_log.request.tasks.add()
    task.model_spec.name = "clf"
    task.model_spec.signature_name = "classification"
    task.method_name = tf.saved_model.CLASSIFY_METHOD_NAME
    with_context = multi.multi_inference_log.request.input.example_list_with_context
    with_context.context.CopyFrom(text_example(text="from the context"))
    with_context.examples.add().CopyFrom(tf.train.Example())
    with_context.examples.add().CopyFrom(text_example(text="its own"))
    write_logs(classifier, [classify, multi])
    servable_module.Servable("clf", 1, str(classifier))
    replayed = [arrays for name, arrays in calls if name == "classification"]
    assert len(replayed) == 2
    assert [len(arrays["inputs"]) for arrays in replayed] == [1, 2]
    merged = [tf.train.Example.FromString(e) for e in replayed[1]["inputs"]]
    texts = [e.features.feature["text"].bytes_list.value[0] for e in merged]
    assert texts == [b"from the context", b"its own"]  # context merged, the example's own wins

    # TF Serving's multi-inference checks fail the load: a predict task, a task with no model name.
    for field, value, message in (
        ("method_name", tf.saved_model.PREDICT_METHOD_NAME, "Unsupported signature method_name"),
        ("model_name", "", "Found ModelSpec with an empty model name"),
    ):
        broken = prediction_log_pb2.PredictionLog()
        broken.CopyFrom(multi)
        broken_task = broken.multi_inference_log.request.tasks[0]
        if field == "method_name":
            broken_task.method_name = value
        else:
            broken_task.model_spec.name = value
        write_logs(classifier, [broken])
        with pytest.raises(ValueError, match=f"warm-up request 1: {message}"):
            servable_module.Servable("clf", 1, str(classifier))
    # The error names the record's place in the file, the empty log TF Serving skips included.
    write_logs(classifier, [prediction_log_pb2.PredictionLog(), broken])
    with pytest.raises(ValueError, match="warm-up request 2: Found ModelSpec with an empty"):
        servable_module.Servable("clf", 1, str(classifier))

    regressor = tmp_path / "regressor" / "1"
    shutil.copytree(paths["regressor"]["dynamic"], regressor)
    regress = prediction_log_pb2.PredictionLog()
    request = regress.regress_log.request
    request.model_spec.signature_name = "regression"
    request.input.example_list.examples.add().CopyFrom(text_example(text_a="a", text_b="b"))
    write_logs(regressor, [regress])
    calls.clear()
    servable_module.Servable("reg", 1, str(regressor))
    regressed = [arrays for name, arrays in calls if name == "regression"]
    assert [len(arrays["inputs"]) for arrays in regressed] == [1]

    # As in TF Serving: a regress log for a predict signature, an empty Input and a session_run
    # log fail the load.
    request.model_spec.signature_name = "serving_default"
    write_logs(regressor, [regress])
    with pytest.raises(ValueError, match="Expected regression signature method_name"):
        servable_module.Servable("reg", 1, str(regressor))
    request.model_spec.signature_name = "regression"
    request.input.example_list.Clear()
    write_logs(regressor, [regress])
    with pytest.raises(ValueError, match="warm-up request 1: Input is empty"):
        servable_module.Servable("reg", 1, str(regressor))
    session_run = prediction_log_pb2.PredictionLog()
    session_run.session_run_log.request.fetch.append("x")
    write_logs(regressor, [session_run])
    with pytest.raises(
        ValueError, match="record 1: unsupported log_type for warm-up: session_run_log"
    ):
        servable_module.Servable("reg", 1, str(regressor))
