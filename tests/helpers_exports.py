"""One SavedModel of every export kind, with random weights and the real vocabulary, built once a
test run and shared by the test workers (helpers.built_once): what the signature fuzzer calls.
"""

import json
import os

import keras
from helpers import built_once, tiny_config

from bert_tf.model import modeling
from bert_tf.model.model_dir import ModelDir
from bert_tf.saved_model import export
from bert_tf.tasks import models

CONFIG = tiny_config(vocab_size=30522)  # the real vocabulary's size
# Every task kind, and both input forms of a classifier (a single text, a pair).
SPECS = {
    "classifier": models.TaskSpec("classifier", labels=["no", "yes"], max_seq_length=16),
    "pair_classifier": models.TaskSpec(
        "classifier", labels=["a", "b", "c"], is_pair=True, max_seq_length=16
    ),
    "regressor": models.TaskSpec("regressor", is_pair=True, max_seq_length=16),
    "squad": models.TaskSpec(
        "squad", max_seq_length=32, max_query_length=8, doc_stride=8, version_2_with_negative=True
    ),
    "ner": models.TaskSpec("ner", labels=["O", "B-PER", "I-PER"], max_seq_length=16),
    "multiple_choice": models.TaskSpec("multiple_choice", max_seq_length=16),
}
# The pretrained model: its encoder with both pretraining heads (serving_default's int32 inputs,
# fill_mask and next_sentence), and the preprocessor beside it.
PRETRAINED = "pretrained"
PRETRAINED_SEQ_LENGTH = 24


def _build(root, vocab_file):
    """Writes every model directory and its export under `root`; returns {name: version dir}."""
    keras.utils.set_random_seed(3)
    paths = {}
    for name, spec in SPECS.items():
        model, encoder = models.build_task_model(CONFIG, spec)
        model_dir = os.path.join(root, "models", name)
        ModelDir(model_dir).write(CONFIG, vocab_file, encoder, spec=spec, model=model)
        paths[name], _ = export.export(model_dir, os.path.join(root, "export", name))
    pretraining_model, encoder = modeling.build_pretraining_model(CONFIG)
    model_dir = os.path.join(root, "models", PRETRAINED)
    ModelDir(model_dir).write(CONFIG, vocab_file, encoder, pretraining_model=pretraining_model)
    paths[PRETRAINED], _ = export.export(
        model_dir, os.path.join(root, "export", PRETRAINED), max_seq_length=PRETRAINED_SEQ_LENGTH
    )
    paths["preprocess"] = os.path.join(paths[PRETRAINED], export.PREPROCESS_SUBDIR)
    return paths


def shared_exports(tmp_path_factory, vocab_file):
    """{name: version dir} of every export kind, built once a test run (helpers.built_once)."""

    def build(root):
        (root / "paths.json").write_text(json.dumps(_build(str(root), vocab_file)))

    root = built_once(tmp_path_factory, "every_export", build)
    return json.loads((root / "paths.json").read_text())
