"""Task heads, task.json and the fine-tuned model directory: shapes, NumPy references, round trips, errors."""

import dataclasses
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import TINY_CONFIG, round_trip, tiny_config, tiny_inputs, write_tiny_vocab
from helpers_google import NumpyBert, google_config

from bert_tf.checkpoints import name_map
from bert_tf.model import modeling
from bert_tf.model.model_dir import ModelDir, ModelDirError
from bert_tf.runtime import io_utils
from bert_tf.tasks import models, representations

SPECS = {
    "classifier": models.TaskSpec(
        "classifier", labels=["neg", "neutral", "pos"], max_seq_length=16, task_name="t"
    ),
    "regressor": models.TaskSpec("regressor", is_pair=True, max_seq_length=16, task_name="sts"),
    "squad": models.TaskSpec(
        "squad", max_seq_length=16, max_query_length=4, doc_stride=4, version_2_with_negative=True
    ),
    "ner": models.TaskSpec("ner", labels=["O", "B-PER", "I-PER"], max_seq_length=16),
}


def dense_weights(model, name):
    layer = model.get_layer(name)
    return [np.asarray(w) for w in layer.get_weights()]


@pytest.mark.parametrize("kind", list(SPECS))
def test_heads_match_numpy(kind):
    spec = SPECS[kind]
    model, encoder = models.build_task_model(TINY_CONFIG, spec)
    x = tiny_inputs()
    out = {k: np.asarray(v) for k, v in model(x, training=False).items()}
    encoded = {
        k: np.asarray(v) if not isinstance(v, list) else v
        for k, v in encoder(x, training=False).items()
    }
    pooled, sequence = encoded["pooled_output"], encoded["sequence_output"]
    if kind == "classifier":
        kernel, bias = dense_weights(model, "classifier_head")
        assert set(out) == {"logits"} and out["logits"].shape == (2, 3)
        np.testing.assert_allclose(out["logits"], pooled @ kernel + bias, rtol=1e-5, atol=1e-6)
    elif kind == "regressor":
        kernel, bias = dense_weights(model, "regressor_head")
        assert set(out) == {"score"} and out["score"].shape == (2,)
        np.testing.assert_allclose(
            out["score"], (pooled @ kernel + bias)[:, 0], rtol=1e-5, atol=1e-6
        )
    elif kind == "squad":
        kernel, bias = dense_weights(model, "squad_head")
        assert set(out) == {"start_logits", "end_logits"} and out["start_logits"].shape == (2, 7)
        logits = sequence @ kernel + bias
        np.testing.assert_allclose(out["start_logits"], logits[..., 0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out["end_logits"], logits[..., 1], rtol=1e-5, atol=1e-6)
    else:
        kernel, bias = dense_weights(model, "ner_head")
        assert set(out) == {"logits"} and out["logits"].shape == (2, 7, 3)
        np.testing.assert_allclose(out["logits"], sequence @ kernel + bias, rtol=1e-5, atol=1e-6)


def test_head_initializer_is_truncated_normal_with_initializer_range():
    # A 64 x 300 kernel: enough draws for its spread to estimate the initializer's closely.
    config = tiny_config(hidden_size=64, initializer_range=0.05)
    model, _ = models.build_task_model(
        config, models.TaskSpec("ner", labels=[f"L{i}" for i in range(300)])
    )
    kernel, bias = dense_weights(model, "ner_head")
    assert np.all(bias == 0)
    assert np.abs(kernel).max() <= 2 * 0.05 + 1e-6  # truncated at two standard deviations
    assert 0.6 * 0.05 < kernel.std() < 0.05  # a truncated normal's std is 0.88 sigma


def test_head_initializer_range_sets_the_heads_weights_and_leaves_the_encoders():
    config = tiny_config(hidden_size=64, initializer_range=0.05)
    spec = models.TaskSpec("ner", labels=[f"L{i}" for i in range(300)])
    wide, wide_encoder = models.build_task_model(config, spec, head_initializer_range=0.2)
    kernel, _ = dense_weights(wide, "ner_head")
    assert 0.6 * 0.2 < kernel.std() < 0.2
    pooler = wide_encoder.get_layer("pooled_dense").get_weights()[0]
    assert pooler.std() < 0.05  # the encoder's new weights keep the config's stddev
    zero, _ = models.build_task_model(config, spec, head_initializer_range=0.0)
    assert not any(np.any(w) for w in dense_weights(zero, "ner_head"))


def test_dropout_only_in_training():
    spec = SPECS["classifier"]
    config = tiny_config(hidden_dropout_prob=0.5)  # heavy dropout, so training visibly differs
    model, _ = models.build_task_model(config, spec)
    x = tiny_inputs()
    a, b = model(x, training=False)["logits"], model(x, training=False)["logits"]
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(model(x, training=True)["logits"], a)


def test_head_dropout_sets_the_heads_rate_and_leaves_the_encoders():
    config = tiny_config(hidden_dropout_prob=0.5)
    x = tiny_inputs()
    features = dataclasses.replace(SPECS["ner"], head="bilstm", lstm_units=2, features="last")
    # On a frozen encoder (run without dropout) the head's dropout is the only one left.
    for rate, same in ((None, False), (0.0, True)):
        model, _ = models.build_task_model(config, features, head_dropout=rate)
        trained = model(x, training=True)["logits"]
        assert np.allclose(trained, model(x, training=False)["logits"]) == same
    model, encoder = models.build_task_model(config, SPECS["classifier"], head_dropout=0.0)
    assert model.get_layer("head_dropout").rate == 0.0
    sequence = encoder(x, training=True)["sequence_output"]  # the encoder keeps its dropout
    assert not np.allclose(sequence, encoder(x, training=False)["sequence_output"])


@pytest.mark.parametrize("kind", ["classifier", "squad", "bilstm", "features"])
def test_outputs_are_float32_under_mixed_precision(kind):
    spec = SPECS.get(kind) or SPECS["ner"]
    if kind in ("bilstm", "features"):
        spec = dataclasses.replace(
            spec, head="bilstm", lstm_units=2, features="sum_all" if kind == "features" else ""
        )
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model, _ = models.build_task_model(TINY_CONFIG, spec)
        out = model(tiny_inputs(), training=False)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert all(v.dtype == tf.float32 for v in out.values())


def test_task_spec_json_round_trip(tmp_path):
    path = str(tmp_path / "task.json")
    for spec in SPECS.values():
        spec.to_json_file(path)
        assert models.TaskSpec.from_json_file(path) == spec
    values = json.load(open(path))
    assert values["kind"] == "ner" and values["labels"] == ["O", "B-PER", "I-PER"]
    # The fields fine-tuning must write are the documented ones; the squad windowing ones default.
    minimal = {
        "kind": "classifier",
        "labels": ["a", "b"],
        "max_seq_length": 64,
        "is_pair": True,
        "version_2_with_negative": False,
        "task_name": "mrpc",
    }
    spec = models.TaskSpec.from_dict(minimal)
    assert spec.is_pair and spec.max_seq_length == 64 and spec.doc_stride == 128
    # A task.json from before the head fields: a dense head on a fine-tuned encoder.
    assert (spec.head, spec.features) == ("dense", "")
    assert spec.same_head(dataclasses.replace(spec, lstm_units=5))  # no BiLSTM: units unused


@pytest.mark.parametrize(
    "values,message",
    [
        ({"labels": ["a", "b"]}, "missing field kind"),
        ({"kind": "tagger"}, "kind must be one of"),
        ({"kind": "classifier", "labels": ["a"]}, "at least 2 labels"),
        ({"kind": "classifier", "labels": ["a", "a"]}, "distinct"),
        ({"kind": "regressor", "labels": ["a", "b"]}, "regressor has no labels"),
        (
            {"kind": "classifier", "labels": ["a", "b"], "max_seq_length": "128"},
            "max_seq_length must be a positive",
        ),
        (
            {"kind": "classifier", "labels": ["a", "b"], "is_pair": "yes"},
            "is_pair must be true or false",
        ),
        (
            {"kind": "classifier", "labels": ["a", "b"], "num_labels": 2},
            "unknown field.*num_labels",
        ),
        (
            {"kind": "squad", "max_seq_length": 32, "max_query_length": 64},
            "no room for the context",
        ),
        ({"kind": "ner", "labels": ["O", "B"], "head": "crf"}, "head must be one of dense"),
        ({"kind": "regressor", "head": "bilstm", "lstm_units": 0}, "lstm_units must be a pos"),
        (
            {"kind": "ner", "labels": ["O", "B"], "head": "bilstm", "features": "middle"},
            "features must be empty or one of embeddings",
        ),
        (
            {"kind": "ner", "labels": ["O", "B"], "features": "last"},
            "features .* needs head bilstm, got 'dense'",
        ),
    ],
)
def test_task_spec_errors_name_file_and_field(tmp_path, values, message):
    path = tmp_path / "task.json"
    path.write_text(json.dumps(values))
    with pytest.raises(models.TaskSpecError, match=f"task.json: .*{message}"):
        models.TaskSpec.from_json_file(str(path))


def test_task_spec_file_errors(tmp_path):
    with pytest.raises(models.TaskSpecError, match="not found"):
        models.TaskSpec.from_json_file(str(tmp_path / "task.json"))
    (tmp_path / "task.json").write_text("{kind: classifier")
    with pytest.raises(models.TaskSpecError, match="task.json: not valid JSON"):
        models.TaskSpec.from_json_file(str(tmp_path / "task.json"))
    (tmp_path / "task.json").write_text("[]")
    with pytest.raises(models.TaskSpecError, match="expected a JSON object"):
        models.TaskSpec.from_json_file(str(tmp_path / "task.json"))
    assert issubclass(models.TaskSpecError, io_utils.UsageError)  # the CLIs exit 2 on it


@pytest.mark.parametrize("kind", list(SPECS))
def test_model_dir_round_trip(tmp_path, kind):
    spec = SPECS[kind]
    model, encoder = models.build_task_model(TINY_CONFIG, spec)
    model_dir = str(tmp_path / "model")
    # The config, the spec and every output of the model and of its encoder come back the same.
    _, prefix = round_trip(
        model_dir,
        TINY_CONFIG,
        write_tiny_vocab(tmp_path / "vocab.txt"),
        encoder,
        spec=spec,
        model=model,
    )
    assert sorted(os.listdir(model_dir)) == sorted(
        [
            "bert_config.json",
            "vocab.txt",
            "task.json",
            "checkpoint",
            "ckpt-1.index",
            "ckpt-1.data-00000-of-00001",
        ]
    )
    assert prefix.endswith("ckpt-1")
    loaded, loaded_encoder, _, _ = models.load_task_model(ModelDir(model_dir))
    assert loaded_encoder is loaded.get_layer("bert_encoder")


def test_loads_a_fine_tuning_checkpoint_with_optimizer_and_step(tmp_path):
    """Fine-tuning saves Checkpoint(encoder, model, optimizer, step) with the same manager layout."""
    spec = SPECS["classifier"]
    model, encoder = models.build_task_model(TINY_CONFIG, spec)
    model_dir = tmp_path / "finetuned"
    model_dir.mkdir()
    modeling.BertConfig.to_json_file(TINY_CONFIG, str(model_dir / "bert_config.json"))
    write_tiny_vocab(model_dir / "vocab.txt")
    spec.to_json_file(str(model_dir / "task.json"))
    optimizer = keras.optimizers.Adam(1e-3)
    x = tiny_inputs()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(x, training=True)["logits"] ** 2)
    optimizer.apply_gradients(
        zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    )
    step = tf.Variable(7, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(encoder=encoder, model=model, optimizer=optimizer, step=step)
    tf.train.CheckpointManager(
        checkpoint, str(model_dir), max_to_keep=2, checkpoint_name="ckpt"
    ).save()
    loaded, _, _, _ = models.load_task_model(ModelDir(str(model_dir)))
    np.testing.assert_array_equal(loaded(x)["logits"], model(x)["logits"])


def test_load_errors(tmp_path):
    vocab = write_tiny_vocab(tmp_path / "vocab.txt")
    # A pretrained model directory: no task.json.
    pretrained = str(tmp_path / "pretrained")
    ModelDir(pretrained).write(TINY_CONFIG, vocab, modeling.build_encoder(TINY_CONFIG))
    with pytest.raises(models.TaskSpecError, match="has no task.json"):
        models.load_task_model(ModelDir(pretrained))
    assert models.read_task_spec(ModelDir(pretrained)) is None
    # task.json added, but the checkpoint has no task model.
    SPECS["classifier"].to_json_file(os.path.join(pretrained, "task.json"))
    with pytest.raises(ModelDirError, match="no task model"):
        models.load_task_model(ModelDir(pretrained))
    # A bad field names the file.
    with open(os.path.join(pretrained, "task.json"), "w") as f:
        json.dump({"kind": "classifier", "labels": ["x"]}, f)
    with pytest.raises(models.TaskSpecError, match=r"pretrained/task.json: .*at least 2 labels"):
        models.load_task_model(ModelDir(pretrained))
    # The label count must fit the checkpoint's head.
    model, encoder = models.build_task_model(TINY_CONFIG, SPECS["classifier"])
    finetuned = str(tmp_path / "finetuned")
    ModelDir(finetuned).write(TINY_CONFIG, vocab, encoder, spec=SPECS["classifier"], model=model)
    models.TaskSpec("classifier", labels=["a", "b"]).to_json_file(
        os.path.join(finetuned, "task.json")
    )
    with pytest.raises(ModelDirError, match="does not fit"):
        models.load_task_model(ModelDir(finetuned))
    os.remove(os.path.join(finetuned, "bert_config.json"))
    with pytest.raises(ModelDirError, match="missing: bert_config.json"):
        models.load_task_model(ModelDir(finetuned))


# ----------------------------------------------------------------------------------------------
# The bilstm head and the feature-based approach (tasks.representations)
# ----------------------------------------------------------------------------------------------

LSTM_UNITS = 3


def np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_lstm(x, kernel, recurrent_kernel, bias, reverse=False):
    """An LSTM over one row's real tokens x [length, D] (gates input, forget, candidate, output,
    Keras' order): the hidden state after every token [length, units], in x's order."""
    units = recurrent_kernel.shape[0]
    h, c = np.zeros(units), np.zeros(units)
    outputs = np.zeros((len(x), units))
    for t in reversed(range(len(x))) if reverse else range(len(x)):
        i, f, candidate, o = np.split(x[t] @ kernel + h @ recurrent_kernel + bias, 4)
        c = np_sigmoid(f) * c + np_sigmoid(i) * np.tanh(candidate)
        h = np_sigmoid(o) * np.tanh(c)
        outputs[t] = h
    return outputs


def np_bilstm(model, x):
    """The model's two BiLSTM layers over one row's real tokens x [length, D]: [length, 2 * units]."""
    for name in ("bilstm_1", "bilstm_2"):
        layer = model.get_layer(name)
        forward = np_lstm(x, *layer.forward_layer.get_weights())
        backward = np_lstm(x, *layer.backward_layer.get_weights(), reverse=True)
        x = np.concatenate([forward, backward], axis=-1)
    return x


def bilstm_spec(kind, **fields):
    return dataclasses.replace(SPECS[kind], head="bilstm", lstm_units=LSTM_UNITS, **fields)


@pytest.mark.parametrize("kind", ["ner", "squad", "classifier", "regressor"])
def test_bilstm_heads_match_numpy_over_the_real_tokens(kind):
    model, encoder = models.build_task_model(TINY_CONFIG, bilstm_spec(kind))
    x = tiny_inputs()  # the second row has two padding positions: the BiLSTM must skip them
    out = {k: np.asarray(v) for k, v in model(x, training=False).items()}
    sequence = np.asarray(encoder(x, training=False)["sequence_output"], np.float64)
    head = [layer for layer in model.layers if layer.name.endswith("_head")][0]
    kernel, bias = head.get_weights()
    for row, length in enumerate(x["input_mask"].sum(-1)):
        per_token = np_bilstm(model, sequence[row, :length])
        if kind in ("ner", "squad"):
            logits = per_token @ kernel + bias
            got = (
                out["logits"][row]
                if kind == "ner"
                else np.stack([out["start_logits"][row], out["end_logits"][row]], -1)
            )
            np.testing.assert_allclose(got[:length], logits, rtol=1e-4, atol=1e-5)
        else:
            # The forward state at the last real token and the backward state at the first.
            summary = np.concatenate([per_token[-1, :LSTM_UNITS], per_token[0, LSTM_UNITS:]])
            logits = summary @ kernel + bias
            got = out["logits"][row] if kind == "classifier" else out["score"][row : row + 1]
            np.testing.assert_allclose(got, logits, rtol=1e-4, atol=1e-5)


def test_bilstm_multiple_choice_scores_each_choice_by_its_summary():
    spec = models.TaskSpec("multiple_choice", max_seq_length=7, head="bilstm", lstm_units=2)
    model, encoder = models.build_task_model(TINY_CONFIG, spec)
    rows = tiny_inputs(batch=4)  # two questions of two choices, the last choice padded
    x = {name: value.reshape(2, 2, 7) for name, value in rows.items()}
    logits = np.asarray(model(x, training=False)["logits"])
    sequence = np.asarray(encoder(rows, training=False)["sequence_output"], np.float64)
    kernel, bias = model.get_layer("choice_head").get_weights()
    for row, length in enumerate(rows["input_mask"].sum(-1)):
        per_token = np_bilstm(model, sequence[row, :length])
        summary = np.concatenate([per_token[-1, :2], per_token[0, 2:]])
        np.testing.assert_allclose(
            logits[row // 2, row % 2], (summary @ kernel + bias)[0], rtol=1e-4, atol=1e-5
        )


FEATURE_CONFIG = tiny_config(num_hidden_layers=5)  # enough layers for every choice


@pytest.mark.parametrize("features", [*representations.FEATURES, "layer_1", "layer_4"])
def test_feature_based_head_reads_exactly_the_layers_it_names(features):
    spec = bilstm_spec("ner", features=features)
    model, encoder = models.build_task_model(FEATURE_CONFIG, spec)
    selection = model.get_layer("encoder_features")
    if selection.weights:  # a scalar mix: weights unlike the initial equal ones, gamma not 1
        count = selection.mix_weights.shape[0]
        selection.set_weights([np.linspace(-1.0, 2.0, count, dtype=np.float32), np.float32(1.7)])
    x = tiny_inputs()
    got = keras.Model(model.inputs, selection.output)(x, training=True)  # inference mode inside
    weights = name_map.original_weights(encoder, FEATURE_CONFIG.num_hidden_layers, ())
    reference = NumpyBert(
        weights, google_config(FEATURE_CONFIG), *(x[n] for n in modeling.ENCODER_INPUTS)
    )
    layers = reference.layers
    mixes = {
        "sum_last_four": layers[-4:],
        "sum_all": layers,  # the paper's "Weighted Sum All 12 Layers": no embeddings
        "sum_all_with_embeddings": [reference.embedding_output, *layers],
    }
    if features in mixes:
        mixed = mixes[features]
        assert selection.mix_weights.shape[0] == len(mixed)
        mix_weights, gamma = selection.get_weights()
        softmax = np.exp(mix_weights) / np.exp(mix_weights).sum()
        expected = gamma * sum(w * layer for w, layer in zip(softmax, mixed))
    else:
        expected = {
            "embeddings": reference.embedding_output,
            "second_to_last": layers[-2],
            "last": layers[-1],
            "concat_last_four": np.concatenate(layers[-4:], axis=-1),
            "layer_1": layers[0],
            "layer_4": layers[3],
        }[features]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    # Only the head trains: the frozen encoder has no trainable variable.
    assert encoder.trainable_variables == []
    assert {v.path.split("/")[0] for v in model.trainable_variables} == {
        "bilstm_1",
        "bilstm_2",
        "ner_head",
        *(["encoder_features"] if selection.weights else []),
    }


def test_a_feature_choice_needs_enough_layers():
    with pytest.raises(io_utils.UsageError, match="sum_last_four needs .* at least 4 layers"):
        models.build_task_model(TINY_CONFIG, bilstm_spec("ner", features="sum_last_four"))
    layers = FEATURE_CONFIG.num_hidden_layers
    with pytest.raises(io_utils.UsageError, match=f"layer_{layers + 1} needs .* at least"):
        models.build_task_model(FEATURE_CONFIG, bilstm_spec("ner", features=f"layer_{layers + 1}"))
    for name in ("layer_0", "layer_x", "layer_01", "layers_2"):
        assert not representations.is_feature_choice(name)
        with pytest.raises(models.TaskSpecError, match="or layer_K"):
            bilstm_spec("ner", features=name)


def test_a_sum_all_model_written_with_embeddings_in_its_mix_loads_as_it_was_trained(tmp_path):
    # task.json says sum_all, the checkpoint holds a mix of 1 + num_hidden_layers weights: what
    # sum_all meant before it became the paper's mix of the transformer layers alone.
    spec = bilstm_spec("ner", features="sum_all_with_embeddings")
    model, encoder = models.build_task_model(FEATURE_CONFIG, spec)
    model.get_layer("encoder_features").set_weights(
        [
            np.linspace(-1.0, 2.0, FEATURE_CONFIG.num_hidden_layers + 1, dtype=np.float32),
            np.float32(1.3),
        ]
    )
    directory = ModelDir(str(tmp_path / "model"))
    directory.write(
        FEATURE_CONFIG, write_tiny_vocab(tmp_path / "vocab.txt"), encoder, spec=spec, model=model
    )
    values = json.load(open(directory.task_file))
    values["features"] = "sum_all"
    json.dump(values, open(directory.task_file, "w"))
    loaded, _, _, loaded_spec = models.load_task_model(directory)
    assert loaded_spec.features == "sum_all_with_embeddings"
    x = tiny_inputs()
    np.testing.assert_array_equal(
        loaded(x, training=False)["logits"], model(x, training=False)["logits"]
    )


@pytest.mark.parametrize("features", ["", "sum_all"])
def test_bilstm_model_dir_round_trip(tmp_path, features):
    spec = bilstm_spec("ner", features=features)
    model, encoder = models.build_task_model(FEATURE_CONFIG, spec)
    model_dir = str(tmp_path / "model")
    # round_trip: the spec reads back equal and the rebuilt model gives the same outputs.
    round_trip(
        model_dir,
        FEATURE_CONFIG,
        write_tiny_vocab(tmp_path / "vocab.txt"),
        encoder,
        spec=spec,
        model=model,
    )
    values = json.load(open(os.path.join(model_dir, "task.json")))
    assert (values["head"], values["lstm_units"], values["features"]) == (
        "bilstm",
        LSTM_UNITS,
        features,
    )
    assert not spec.same_head(dataclasses.replace(spec, head="dense", features=""))
    assert not spec.same_head(dataclasses.replace(spec, lstm_units=LSTM_UNITS + 1))
    assert spec.same_head(models.TaskSpec.from_dict(values))
