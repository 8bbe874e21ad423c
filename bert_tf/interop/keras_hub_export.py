"""A model directory as a keras-hub preset: BertBackbone and BertTokenizer, and BertTextClassifier for
a classifier.

    python -m bert_tf.convert_checkpoint --to=keras_hub --model_dir=models/sst2 --output_dir=presets/sst2

OUT is what keras-hub's own `save_to_preset` writes (config.json, model.weights.h5, metadata.json,
tokenizer.json, assets/tokenizer/vocabulary.txt; a classifier adds task.json, task.weights.h5 and
preprocessor.json): the keras-hub model is built, our weights are copied in through
bert_tf.checkpoints' one name map (keras-hub's BertBackbone names its layers as our encoder does,
which is built from keras-hub's layers), and keras-hub saves it. Before OUT appears, keras-hub loads
the preset back and its outputs are compared with this model's (within 1e-5, else it is a bug); OUT
appears whole or not at all (io_utils.atomic_directory).

What keras-hub's BERT can hold (keras-hub 0.32, read in keras_hub/src/models/bert/):
- BertBackbone fixes its activation. keras-hub 0.32 applies the tanh approximation of GELU
  (`keras_utils.gelu_approximate`), the form of our "gelu"; the form is measured on the backbone
  built here, not assumed. A model trained with the other form ("gelu_exact", e.g. one imported
  from Hugging Face's "gelu" models such as MiniLM) would compute something else in keras-hub: it
  is refused unless `allow_gelu_change`, and then the output difference measured is reported. A
  model with any other activation is refused.
- BertTextClassifier is dropout and Dense(num_classes) on pooled_output: our classifier head
  exactly, and the regressor's (num_classes 1: its logits [b, 1] are our score [b]). Its
  `compile()`, though, defaults to sparse categorical cross-entropy, which refuses real-valued
  labels: a regressor preset is fine-tuned further only when compiled with a regression loss.
  The preset's metadata.json says so (REGRESSOR_NOTE), and so does the export's result.
- keras-hub has no BERT task for a squad, ner or multiple_choice head: those are refused (their
  Hugging Face export keeps them).
- Its BertMaskedLM head applies the exact GELU behind a tanh-GELU backbone, a form none of our
  models has: a pretrained model's encoder is exported and its pretraining heads are left out
  (the result says so).
- BertBackbone always attends both ways and pools the first token: a left_to_right model
  (attention_direction in bert_config.json) is refused, naming the field and the model directory.
- Its tokenizer lower-cases with Unicode case folding and keeps control characters; ours (the
  original's) lower-cases with str.lower and drops them: ids differ on such text only.
"""

import dataclasses
import json
import os

import keras
import keras_hub
import numpy as np

from bert_tf.checkpoints import name_map
from bert_tf.interop import hf_export
from bert_tf.model import modeling
from bert_tf.model.model_dir import ModelDir, describe_heads
from bert_tf.runtime import io_utils
from bert_tf.tasks import models

# What a regressor preset's user must know: keras-hub has no regression task of its own.
REGRESSOR_NOTE = (
    "a regressor: BertTextClassifier(num_classes=1) holds its head, whose single logit is the "
    "score; compile() defaults to a classification loss that refuses real-valued labels, so "
    "fine-tune it with task.compile(loss=keras.losses.MeanSquaredError())"
)
# task.json kinds keras-hub's BertTextClassifier holds.
CLASSIFIER_KINDS = ("classifier", "regressor")
# How far keras-hub's outputs may be from ours when nothing was changed.
TOLERANCE = 1e-5
_GELU_FORMS = {"gelu": "tanh-approximation", "gelu_exact": "exact (erf)"}


@dataclasses.dataclass
class ExportResult:
    """What an export wrote and how close keras-hub's outputs are to ours."""

    output_dir: str
    classes: list  # the keras-hub classes whose from_preset loads it
    max_difference: float  # the largest output difference measured, over a few inputs
    gelu_changed: bool
    left_out: str  # what the preset does not hold ("" for nothing)
    note: str = ""  # what using the preset needs beyond from_preset (REGRESSOR_NOTE)


def activation_form(activation):
    """ "gelu" (tanh approximation) or "gelu_exact" (erf) when `activation` computes that GELU, else None."""
    x = np.linspace(-6.0, 6.0, 121, dtype=np.float32)
    y = np.asarray(keras.ops.convert_to_numpy(activation(keras.ops.convert_to_tensor(x))))
    for name in _GELU_FORMS:
        want = keras.ops.convert_to_numpy(modeling.get_activation(name)(x))
        if np.allclose(y, want, rtol=0, atol=1e-6):
            return name
    return None


def build_backbone(config):
    """keras-hub's BertBackbone for `config` (float32), randomly initialized."""
    return keras_hub.models.BertBackbone(
        vocabulary_size=config.vocab_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        hidden_dim=config.hidden_size,
        intermediate_dim=config.intermediate_size,
        dropout=config.hidden_dropout_prob,
        max_sequence_length=config.max_position_embeddings,
        num_segments=config.type_vocab_size,
        dtype="float32",
    )


def check_activation(config, backbone, allow_gelu_change):
    """Whether the backbone changes the model's GELU form (allowed); refuses what it cannot hold."""
    theirs = activation_form(backbone.transformer_layers[0].activation)
    if theirs is None:
        raise RuntimeError(
            "keras-hub's BertBackbone applies an activation that is neither GELU form"
        )
    ours = activation_form(modeling.get_activation(config.hidden_act))
    if ours == theirs:
        return False
    if ours is None:
        raise io_utils.UsageError(
            f"hidden_act {config.hidden_act!r}: keras-hub's BertBackbone always applies the "
            f"{_GELU_FORMS[theirs]} GELU, so it cannot hold this model"
        )
    if not allow_gelu_change:
        raise io_utils.UsageError(
            f"this model was trained with the {_GELU_FORMS[ours]} GELU (hidden_act "
            f"{config.hidden_act!r}), but keras-hub's BertBackbone applies the {_GELU_FORMS[theirs]} "
            "form, so its outputs would differ from this model's; pass --allow_gelu_change to "
            "export it anyway (the difference measured is then printed), or export it to Hugging "
            "Face, which keeps the form"
        )
    return True


def probe_inputs(config, seed=0):
    """A few encoder inputs (ours): three rows, one padded, both segments."""
    rng = np.random.default_rng(seed)
    seq = min(16, config.max_position_embeddings)
    ids = rng.integers(0, config.vocab_size, size=(3, seq)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, seq - seq // 4 :] = 0
    ids[1, seq - seq // 4 :] = 0
    types = np.zeros_like(ids)
    if config.type_vocab_size > 1:
        types[:, seq // 2 :] = 1
    return {"input_word_ids": ids, "input_mask": mask, "input_type_ids": types}


def keras_hub_inputs(x):
    """Our encoder inputs under keras-hub's names."""
    return {
        "token_ids": x["input_word_ids"],
        "segment_ids": x["input_type_ids"],
        "padding_mask": x["input_mask"],
    }


def _max_difference(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def _load(directory, allow_gelu_change):
    """(config, spec, our model, our encoder, heads left out, keras-hub backbone, gelu changed)."""
    prefix = directory.check()
    config = directory.read_config()
    spec = models.read_task_spec(directory)
    if spec is not None and spec.kind not in CLASSIFIER_KINDS:
        raise io_utils.UsageError(
            f"keras-hub has no BERT task for a {spec.kind} head (its BERT tasks are "
            "BertTextClassifier and BertMaskedLM), so this model cannot be exported exactly; "
            "export it with --to=huggingface"
        )
    backbone = build_backbone(config)
    gelu_changed = check_activation(config, backbone, allow_gelu_change)
    if spec is not None:
        model, encoder, config, spec = models.load_task_model(directory)
        left_out = ""
    else:
        encoder = directory.load_encoder()
        model = None
        heads = directory.pretraining_heads(prefix)
        reasons = {
            "mlm": "keras-hub's BertMaskedLM applies the exact GELU in its head behind a tanh-GELU "
            "backbone, a form no model here has",
            "nsp": "keras-hub's BERT has no NSP head",
        }
        left_out = (
            f"{describe_heads(heads)} ({'; '.join(reasons[h] for h in sorted(heads))})"
            if heads
            else ""
        )
    return config, spec, model, encoder, left_out, backbone, gelu_changed


def export(model_dir, output_dir, overwrite=False, allow_gelu_change=False, record=None):
    """Writes the model directory `model_dir` as the keras-hub preset `output_dir`.

    `record` (the CLI's flags) goes into its bert_tf_output.json, not into a file of its own. An
    existing `output_dir` that is not empty is replaced only when it is convert_checkpoint's own earlier
    output and `overwrite` (io_utils.check_replaceable). Returns an ExportResult.
    """
    directory = ModelDir(model_dir)
    directory.check()
    hf_export.check_exportable(directory.read_config(), "keras-hub", model_dir)
    hf_export.check_head_exportable(directory, "keras-hub", model_dir)
    hf_export.check_apart(model_dir, output_dir)
    vocab = hf_export.read_vocab(directory.vocab_file)
    with io_utils.atomic_directory(output_dir, hf_export.OUTPUT_JOB, overwrite, record) as tmp:
        config, spec, model, encoder, left_out, backbone, gelu_changed = _load(
            directory, allow_gelu_change
        )
        num_layers = config.num_hidden_layers
        # Through the one name map: ours -> original names -> keras-hub's (the same variable paths).
        weights = name_map.original_weights(encoder, num_layers, ())
        name_map.assign_original_weights(
            f"model directory {model_dir}",
            {name: array.shape for name, array in weights.items()},
            weights.__getitem__,
            backbone,
            num_layers,
            (),
        )
        tokenizer = keras_hub.models.BertTokenizer(
            vocabulary=list(vocab),
            lowercase=config.do_lower_case,
            strip_accents=config.do_lower_case,  # the original strips accents when it lower-cases
        )
        classes = ["BertBackbone", "BertTokenizer"]
        note = REGRESSOR_NOTE if spec is not None and spec.kind == "regressor" else ""
        if spec is None:
            backbone.save_to_preset(tmp)
            tokenizer.save_to_preset(tmp)
        else:
            head = name_map.original_weights(model, num_layers, (), task_kind=spec.kind)
            task = keras_hub.models.BertTextClassifier(
                backbone=backbone,
                num_classes=head["classifier/bias"].shape[0],
                preprocessor=keras_hub.models.BertTextClassifierPreprocessor(
                    tokenizer=tokenizer, sequence_length=spec.max_seq_length
                ),
                activation=None,
                dropout=config.hidden_dropout_prob,
            )
            logits = task.get_layer("logits")
            logits.kernel.assign(head["classifier/kernel"])
            logits.bias.assign(head["classifier/bias"])
            task.save_to_preset(tmp)
            if note:
                _add_metadata(tmp, {"bert_tf_task": spec.kind, "bert_tf_note": note})
            classes.append("BertTextClassifier")
        difference = _check_preset(tmp, config, spec, model, encoder)
        if difference > TOLERANCE and not gelu_changed:
            raise RuntimeError(
                f"bert_tf bug: keras-hub's outputs differ from this model's by {difference:.3g}"
            )
    return ExportResult(output_dir, classes, difference, gelu_changed, left_out, note)


def _add_metadata(preset, values):
    """Adds `values` to the preset's metadata.json (keras-hub reads only the keys it knows)."""
    path = os.path.join(preset, "metadata.json")
    with open(path) as f:
        metadata = json.load(f)
    io_utils.atomic_write_json(path, {**metadata, **values})


def _check_preset(preset, config, spec, model, encoder):
    """Loads `preset` with keras-hub; the largest difference between its outputs and ours."""
    x = probe_inputs(config)
    ours = encoder(x, training=False)
    theirs = keras_hub.models.BertBackbone.from_preset(preset)(keras_hub_inputs(x), training=False)
    difference = max(
        _max_difference(ours[name], theirs[name]) for name in ("sequence_output", "pooled_output")
    )
    keras_hub.models.BertTokenizer.from_preset(preset)(["a"])  # it loads and runs
    if spec is not None:
        task = keras_hub.models.BertTextClassifier.from_preset(preset)
        got = np.asarray(task(keras_hub_inputs(x), training=False))
        want = model(x, training=False)["logits" if spec.kind == "classifier" else "score"]
        difference = max(difference, _max_difference(got.reshape(np.shape(want)), want))
    return difference
