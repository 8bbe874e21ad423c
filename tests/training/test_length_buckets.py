"""Dynamic-length fine-tuning batches: trim_to_longest, length-grouped training, and the padded twin.

Every batch is cut to its longest row rounded up to packing.LENGTH_BUCKET, and training groups examples
of similar length; the model must predict what it predicts on batches padded to max_seq_length.
"""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from helpers import ROOT, child_pythonpath

from bert_tf import run_classifier, run_multiple_choice, run_ner, run_squad
from bert_tf.runtime import cli
from bert_tf.tasks import models, packing
from bert_tf.tasks.classification import data as classification
from bert_tf.tasks.ner.data import IGNORE_LABEL
from bert_tf.training import finetuning, training_flags

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

SEQ = 48


def random_features(count, seq_length, vocab_size, seed=0, choices=None, mean_length=13):
    """Record-named features of `count` rows of 3 to seq_length tokens (mostly near `mean_length`).

    With `choices`, every row holds that many sequences ([count, choices, seq_length]).
    """
    rng = np.random.default_rng(seed)
    shape = (count, choices, seq_length) if choices else (count, seq_length)
    # Mostly short rows and a few long ones, as real sentences are.
    lengths = np.minimum(3 + rng.geometric(1 / (mean_length - 3), size=count), seq_length)
    if choices:  # the choices of a row share its context: lengths a few tokens apart
        lengths = np.maximum(lengths[:, None] - rng.integers(0, 3, size=(count, choices)), 3)
    mask = (np.arange(seq_length) < lengths[..., None]).astype(np.int32)
    ids = np.where(mask, rng.integers(5, vocab_size, size=shape), 0).astype(np.int32)
    segments = (np.arange(seq_length) >= lengths[..., None] // 2) * mask
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments.astype(np.int32)}


def padding_fraction(batches):
    """The fraction of the positions in `batches` that the mask leaves out."""
    masks = [np.asarray(batch["input_mask"]) for batch in batches]
    return 1.0 - sum(m.sum() for m in masks) / sum(m.size for m in masks)


# ----------------------------------------------------------------------------------------------
# trim_to_longest and the datasets
# ----------------------------------------------------------------------------------------------


def test_trim_cuts_every_sequence_tensor_to_the_longest_row_rounded_up():
    mask = np.zeros((3, 40), np.int32)
    mask[0, :5], mask[1, :17], mask[2, :2] = 1, 1, 1
    inputs = {
        "input_mask": tf.constant(mask),
        "input_word_ids": tf.constant(np.arange(120).reshape(3, 40), tf.int32),
        "label_ids": tf.constant([1, 2, 3]),
    }
    trimmed = packing.trim_to_longest(inputs, 16)
    assert trimmed["input_mask"].shape == (3, 32) and trimmed["input_word_ids"].shape == (3, 32)
    np.testing.assert_array_equal(trimmed["input_word_ids"], inputs["input_word_ids"][:, :32])
    assert trimmed["label_ids"].numpy().tolist() == [1, 2, 3]  # not a sequence: unchanged
    # Never longer than the input, a hole in a mask does not hide the tokens after it, and an
    # all-padding batch keeps one position.
    assert packing.trim_to_longest(inputs, 64)["input_mask"].shape == (3, 40)
    holey = np.zeros((1, 40), np.int32)
    holey[0, [0, 20]] = 1
    assert packing.trim_to_longest({"input_mask": tf.constant(holey)}, 8)["input_mask"].shape == (
        1,
        24,
    )
    empty = {"input_mask": tf.zeros((2, 40), tf.int32)}
    assert packing.trim_to_longest(empty, 1)["input_mask"].shape == (2, 1)
    # [b, choices, s]: the longest choice of any row.
    choices = np.zeros((2, 3, 40), np.int64)
    choices[1, 2, :20] = 1
    cut = packing.trim_to_longest(
        {"input_mask": tf.constant(choices), "y": tf.constant([0, 1])}, 16
    )
    assert cut["input_mask"].shape == (2, 3, 32) and cut["y"].shape == (2,)


def test_eval_batches_keep_file_order_and_are_trimmed(tmp_path):
    features = random_features(50, SEQ, 30)
    features["label_ids"] = np.arange(50, dtype=np.int32)
    features["is_real_example"] = np.ones(50, np.int32)
    path = str(tmp_path / "dev.tf_record")
    classification.write_records(path, features)
    padded = list(
        packing.records_dataset(path, classification.feature_spec([SEQ]), 8, is_training=False)
    )
    trimmed = list(
        packing.records_dataset(
            path, classification.feature_spec([SEQ]), 8, is_training=False, length_bucket=16
        )
    )
    assert [b["input_word_ids"].shape[0] for b in trimmed] == [8] * 6 + [2]
    for full, cut in zip(padded, trimmed):
        longest = int(np.max(np.sum(full["input_mask"], -1)))
        assert cut["input_mask"].shape[1] == min(-(-longest // 16) * 16, SEQ)
        for name in ("input_word_ids", "input_mask", "input_type_ids"):
            width = cut[name].shape[1]
            np.testing.assert_array_equal(cut[name], full[name][:, :width])
            assert not np.any(full[name][:, width:])  # only padding was cut
        np.testing.assert_array_equal(cut["label_ids"], full["label_ids"])
    assert padding_fraction(trimmed) < padding_fraction(padded)


@pytest.mark.parametrize("choices", [None, 3])
def test_training_batches_group_lengths_and_see_every_example_once_per_epoch(tmp_path, choices):
    batch_size, seq_length = 8, 128
    count = batch_size * packing.LENGTH_GROUP_BATCHES * 3  # three whole windows: one epoch
    features = random_features(count, seq_length, 30, seed=1, choices=choices, mean_length=25)
    features["label_ids"] = np.arange(count, dtype=np.int32)  # each example's id
    grouped = packing.features_dataset(
        features, batch_size, is_training=True, seed=4, length_bucket=16
    )
    # Dynamic lengths reach the training loop as one element spec: no retracing per length.
    assert grouped.element_spec["input_word_ids"].shape.as_list()[-1] is None
    assert grouped.element_spec["input_word_ids"].shape[0] == batch_size  # drop_remainder
    epoch = list(grouped.take(count // batch_size))
    ids = np.concatenate([b["label_ids"] for b in epoch])
    assert sorted(ids.tolist()) == list(range(count))
    # Far less padding than static batches, and than random batches that are only trimmed.
    static = packing.features_dataset(features, batch_size, is_training=True, seed=4)
    static_padding = padding_fraction(static.take(count // batch_size))
    trimmed_padding = padding_fraction(
        static.map(lambda batch: packing.trim_to_longest(batch)).take(count // batch_size)
    )
    assert padding_fraction(epoch) < 0.5 * static_padding, (padding_fraction(epoch), static_padding)
    assert padding_fraction(epoch) < 0.7 * trimmed_padding, (
        padding_fraction(epoch),
        trimmed_padding,
    )
    widths = [b["input_mask"].shape[-1] for b in epoch]
    assert len(set(widths)) > 1 and all(w % 16 == 0 for w in widths)
    # The batches of a window are not in length order, and the next epoch reshuffles.
    assert widths != sorted(widths)
    next_epoch = list(grouped.take(2 * count // batch_size))[count // batch_size :]
    assert sorted(np.concatenate([b["label_ids"] for b in next_epoch]).tolist()) == list(
        range(count)
    )
    assert not np.array_equal(np.concatenate([b["label_ids"] for b in next_epoch]), ids)


def test_group_by_length_off_gives_plain_shuffled_batches_cut_to_their_longest(tmp_path):
    batch_size, seq_length = 8, 128
    count = batch_size * packing.LENGTH_GROUP_BATCHES * 2
    features = random_features(count, seq_length, 30, seed=1, mean_length=25)
    features["label_ids"] = np.arange(count, dtype=np.int32)

    def epoch(group_by_length):
        dataset = packing.features_dataset(
            features, batch_size, True, seed=4, length_bucket=1, group_by_length=group_by_length
        )
        return list(dataset.take(count // batch_size))

    plain, grouped = epoch(False), epoch(True)
    # The same shuffled order as static batches, each only trimmed: no sorting by length.
    static = packing.features_dataset(features, batch_size, is_training=True, seed=4)
    expected = [b["label_ids"].numpy().tolist() for b in static.take(count // batch_size)]
    assert [b["label_ids"].numpy().tolist() for b in plain] == expected
    for batch in plain:
        assert batch["input_mask"].shape[-1] == int(batch["input_mask"].numpy().sum(-1).max())
    assert padding_fraction(grouped) < padding_fraction(plain)
    flags = training_flags.FinetuneArgs(output_dir="x", group_by_length=False).finetune_config()
    assert flags.group_by_length is False


# ----------------------------------------------------------------------------------------------
# The flag
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args_class",
    [
        run_classifier.ClassifierArgs,
        run_squad.SquadArgs,
        run_ner.NerArgs,
        run_multiple_choice.MultipleChoiceArgs,
    ],
)
def test_every_fine_tuning_cli_has_pad_to_max_seq_length(args_class):
    field = {f.name: f for f in cli.flag_fields(args_class)}["pad_to_max_seq_length"]
    assert field.default is False and field.type is bool


def test_pad_to_max_seq_length_and_tpu_keep_static_shapes(tmp_path):
    # Graph mode cuts to the longest row; XLA compiles per shape, so lengths come in buckets.
    def bucket(**flags):
        return training_flags.FinetuneArgs(**flags).finetune_config().length_bucket

    assert bucket() == 1
    assert bucket(jit_compile=True) == packing.LENGTH_BUCKET
    assert bucket(pad_to_max_seq_length=True) is None
    assert bucket(strategy="tpu") is None
    features = random_features(64, SEQ, 30)
    features["label_ids"] = np.zeros(64, np.int32)
    features["is_real_example"] = np.ones(64, np.int32)
    path = str(tmp_path / "train.tf_record")
    classification.write_records(path, features)
    for is_training in (True, False):
        dataset = packing.records_dataset(
            path,
            classification.feature_spec([SEQ]),
            8,
            is_training,
            length_bucket=bucket(pad_to_max_seq_length=True),
        )
        assert dataset.element_spec["input_word_ids"].shape == (8 if is_training else None, SEQ)
        assert next(iter(dataset))["input_mask"].shape == (8, SEQ)


# ----------------------------------------------------------------------------------------------
# The model sees the same thing: predictions and training
# ----------------------------------------------------------------------------------------------

SPECS = {
    "classifier": models.TaskSpec(kind="classifier", labels=["a", "b", "c"], max_seq_length=SEQ),
    "squad": models.TaskSpec(kind="squad", max_seq_length=SEQ, max_query_length=8),
    "ner": models.TaskSpec(kind="ner", labels=["O", "B-X", "I-X"], max_seq_length=SEQ),
    "multiple_choice": models.TaskSpec(kind="multiple_choice", max_seq_length=SEQ),
}


def labelled_features(kind, count, vocab_size, seed=0):
    """Random features with the labels `kind`'s objective reads."""
    rng = np.random.default_rng(seed + 10)
    features = random_features(
        count, SEQ, vocab_size, seed, choices=4 if kind == "multiple_choice" else None
    )
    lengths = features["input_mask"].sum(-1)
    if kind == "squad":
        features["start_positions"] = rng.integers(0, lengths).astype(np.int32)
        features["end_positions"] = np.minimum(features["start_positions"] + 2, lengths - 1)
    elif kind == "ner":
        labels = rng.integers(0, 3, size=(count, SEQ)).astype(np.int32)
        features["label_ids"] = np.where(features["input_mask"] == 1, labels, IGNORE_LABEL)
    else:
        features["label_ids"] = rng.integers(0, 3 if kind == "classifier" else 4, count)
    return features


def make_tuner(demo, tmp_path, kind, **overrides):
    """A Finetuner for `kind` on the demo's tiny model directory (the one-device strategy)."""
    values = dict(
        output_dir=str(tmp_path / kind),
        init_checkpoint=demo["model_dir"],
        do_train=True,
        max_seq_length=SEQ,
        train_batch_size=8,
        steps_per_loop=3,
        learning_rate=1e-3,
    )
    values.update(overrides)
    args = training_flags.FinetuneArgs(**values)
    source = args.model_source()
    config = args.finetune_config()
    return finetuning.Finetuner(config, tf.distribute.get_strategy(), source, SPECS[kind], 9)


def predict_both_ways(tuner, features, batch_size):
    """(trimmed, padded) outputs of Finetuner.predict with labels."""
    multiple = tuner.config.length_bucket
    outputs = []
    for pad in (False, True):
        length_bucket = None if pad else multiple
        tuner.config = dataclasses.replace(tuner.config, length_bucket=length_bucket)
        outputs.append(tuner.predict(features, batch_size, has_labels=True))
        if not pad:  # every length ran the same trace
            assert tuner._predict_fns[True].experimental_get_tracing_count() == 1
    return outputs


@pytest.mark.parametrize("kind", list(SPECS))
@pytest.mark.parametrize("jit_compile", [False, True])
def test_trimmed_batches_predict_what_padded_batches_predict(demo, tmp_path, kind, jit_compile):
    # (jit_compile only sets the rounding: prediction itself is not XLA-compiled.)
    tuner = make_tuner(demo, tmp_path, kind, do_train=False, do_eval=True, jit_compile=jit_compile)
    multiple = tuner.config.length_bucket
    tuner.start()
    vocab_size = tuner.source.config.vocab_size
    features = labelled_features(kind, 21, vocab_size)  # 3 batches, the last one padded
    trimmed, padded = predict_both_ways(tuner, features, 8)
    assert set(trimmed) == set(padded)
    real = features["input_mask"] == 1
    for name in trimmed:
        assert trimmed[name].shape == padded[name].shape, name
        if name in tuner.objective.token_outputs:
            # Positions past a row's end are not compared: the padded batch computed logits there.
            np.testing.assert_allclose(trimmed[name][real], padded[name][real], atol=1e-5)
            # Beyond its batch's longest row (rounded up), a row holds the objective's fill value.
            lengths = real.sum(-1)
            for start in range(0, len(lengths), 8):
                width = min(-(-lengths[start : start + 8].max() // multiple) * multiple, SEQ)
                fill = tuner.objective.token_outputs[name]
                assert np.all(trimmed[name][start : start + 8, width:] == fill)
        elif kind == "squad" and name == "example_loss":
            # The original span loss is a softmax over every position, padding included; a trimmed
            # batch has fewer padding positions, so its loss can only be lower.
            assert np.all(trimmed[name] <= padded[name] + 1e-5)
        else:
            np.testing.assert_allclose(trimmed[name], padded[name], atol=1e-5, err_msg=name)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_the_training_loop_traces_once_for_every_length(demo, tmp_path, jit_compile):
    tuner = make_tuner(demo, tmp_path, "ner", jit_compile=jit_compile)
    features = labelled_features("ner", 128, tuner.source.config.vocab_size)

    def make_train_dataset(batch_size, seed, input_context):
        return packing.features_dataset(
            features, batch_size, is_training=True, seed=seed, length_bucket=16
        )

    widths = {b["input_mask"].shape[1] for b in make_train_dataset(8, 0, None).take(9)}
    assert len(widths) > 1  # the 9 steps see several lengths
    tuner.start(make_train_dataset)
    metrics = tuner.train(log_fn=lambda line: None)
    assert tuner.step == 9 and np.isfinite(metrics["loss"])
    assert tuner.trainer._train_loop.experimental_get_tracing_count() == 1


# Fine-tunes on 2 logical CPUs with length-grouped batches (each replica gets its own batch, so the
# replicas of a step may see different lengths), then predicts trimmed and padded.
MIRRORED_SCRIPT = textwrap.dedent("""
    import sys, json
    import numpy as np
    from bert_tf.runtime import distribution
    from bert_tf.tasks import packing
    from bert_tf.training import finetuning, training_flags
    strategy = distribution.get_strategy("mirrored", num_cpu_replicas=2)
    import test_length_buckets as t
    args = training_flags.FinetuneArgs(output_dir=sys.argv[2], init_checkpoint=sys.argv[1], do_train=True,
                                   max_seq_length=t.SEQ, train_batch_size=8, steps_per_loop=3)
    source = args.model_source()
    tuner = finetuning.Finetuner(args.finetune_config(), strategy, source, t.SPECS["classifier"], 6)
    features = t.labelled_features("classifier", 96, source.config.vocab_size)
    tuner.start(lambda batch_size, seed, context: packing.features_dataset(
        features, batch_size, is_training=True, seed=seed, length_bucket=16))
    metrics = tuner.train(log_fn=lambda line: None)
    trimmed, padded = t.predict_both_ways(tuner, features, 8)
    print(json.dumps({
        "replicas": strategy.num_replicas_in_sync, "step": tuner.step, "loss": metrics["loss"],
        "traces": tuner.trainer._train_loop.experimental_get_tracing_count(),
        "difference": float(np.max(np.abs(trimmed["logits"] - padded["logits"]))),
        "rows": len(trimmed["logits"])}))
""")


@pytest.mark.slow
def test_two_mirrored_cpu_replicas_train_and_predict_with_dynamic_lengths(demo, tmp_path):
    env = dict(
        os.environ,
        PYTHONPATH=child_pythonpath(__file__),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    process = subprocess.run(
        [sys.executable, "-c", MIRRORED_SCRIPT, demo["model_dir"], str(tmp_path / "out")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert process.returncode == 0, process.stderr[-3000:]
    result = json.loads(process.stdout.strip().splitlines()[-1])
    assert result["replicas"] == 2 and result["step"] == 6 and result["traces"] == 1
    assert np.isfinite(result["loss"]) and result["rows"] == 96
    assert result["difference"] < 1e-5
