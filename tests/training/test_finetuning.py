"""The shared fine-tuning driver: head losses against NumPy, ordered prediction, and a quality check."""

import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from helpers import DEMO_TRAINING, TINY_CONFIG, run_module_cli
from helpers_google import GOOGLE_TINY, random_weights, write_google_dir

from bert_tf import extract_features, run_classifier, run_ner, run_squad
from bert_tf.model import modeling
from bert_tf.model.model_dir import ModelDir
from bert_tf.runtime import io_utils
from bert_tf.tasks import heads, models, packing, registry
from bert_tf.tasks.ner import data as ner
from bert_tf.training import finetuning, training_flags


def np_xent(logits, labels):
    """Softmax cross-entropy per row, float64."""
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return -np.take_along_axis(log_probs, np.asarray(labels)[..., None], axis=-1)[..., 0]


@pytest.fixture(scope="module")
def tiny_batch():
    """Random encoder inputs for 5 rows of 7 tokens (some padding) and a tiny config."""
    rng = np.random.default_rng(3)
    config = TINY_CONFIG
    ids = rng.integers(5, config.vocab_size, size=(5, 7)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[2, 4:] = 0
    return config, {"input_word_ids": ids, "input_mask": mask, "input_type_ids": np.zeros_like(ids)}


def run_loss(task, batch):
    """(loss, stats, model outputs) of one single-replica step in inference mode."""
    batch = {k: tf.constant(v) for k, v in batch.items()}
    loss, stats = task.loss_and_stats(batch, task.denominators(batch), training=False)
    outputs = task.model({k: batch[k] for k in modeling.ENCODER_INPUTS}, training=False)
    return (
        float(loss),
        {k: float(v) for k, v in stats.items()},
        {k: v.numpy() for k, v in outputs.items()},
    )


def test_classification_loss_is_the_mean_cross_entropy_of_real_examples(tiny_batch):
    config, inputs = tiny_batch
    model, _ = models.build_task_model(
        config, models.TaskSpec(kind="classifier", labels=["a", "b", "c"])
    )
    labels = np.array([0, 2, 1, 1, 2], np.int32)
    real = np.array([1, 1, 1, 0, 1], np.int32)  # a padding row must not count
    loss, stats, outputs = run_loss(
        registry.get("classifier").objective(model),
        dict(inputs, label_ids=labels, is_real_example=real),
    )
    xent = np_xent(outputs["logits"], labels)
    assert loss == pytest.approx(xent[real == 1].mean(), rel=1e-5)
    assert stats["weight"] == 4
    hits = (outputs["logits"].argmax(-1) == labels)[real == 1].sum()
    assert stats["correct"] == hits


def test_regression_loss_is_the_mean_squared_error(tiny_batch):
    config, inputs = tiny_batch
    model, _ = models.build_task_model(config, models.TaskSpec(kind="regressor"))
    scores = np.array([0.5, 4.0, 2.5, 1.0, 3.0], np.float32)
    task = registry.get("regressor").objective(model)
    loss, _, outputs = run_loss(task, dict(inputs, label_ids=scores))
    assert loss == pytest.approx(
        np.mean((outputs["score"].astype(np.float64) - scores) ** 2), rel=1e-5
    )
    assert "accuracy" not in task.metrics(
        {"loss": 1.0, "loss_sum": 1.0, "weight": 1.0, "correct": 0.0}, 1
    )


def test_span_loss_is_the_mean_of_start_and_end_cross_entropy(tiny_batch):
    config, inputs = tiny_batch
    model, _ = models.build_task_model(
        config, models.TaskSpec(kind="squad", max_seq_length=7, max_query_length=2)
    )
    starts, ends = np.array([0, 3, 2, 5, 1], np.int32), np.array([0, 4, 2, 6, 3], np.int32)
    loss, _, outputs = run_loss(
        registry.get("squad").objective(model),
        dict(inputs, start_positions=starts, end_positions=ends),
    )
    expected = (
        np_xent(outputs["start_logits"], starts).mean()
        + np_xent(outputs["end_logits"], ends).mean()
    ) / 2
    assert loss == pytest.approx(expected, rel=1e-5)


def test_token_loss_ignores_ignore_label(tiny_batch):
    config, inputs = tiny_batch
    model, _ = models.build_task_model(
        config, models.TaskSpec(kind="ner", labels=["O", "B-X", "I-X"])
    )
    rng = np.random.default_rng(4)
    labels = rng.integers(0, 3, size=(5, 7)).astype(np.int32)
    labels[:, 0] = ner.IGNORE_LABEL
    labels[rng.random((5, 7)) < 0.3] = ner.IGNORE_LABEL
    task = registry.get("ner").objective(model)
    loss, stats, outputs = run_loss(task, dict(inputs, label_ids=labels))
    scored = labels != ner.IGNORE_LABEL
    xent = np_xent(outputs["logits"], np.where(scored, labels, 0))
    assert loss == pytest.approx(xent[scored].mean(), rel=1e-5)
    assert stats["weight"] == scored.sum()
    # The per-example sums used for eval_loss add up to the same mean.
    per_example = task.predict_step(
        {
            k: tf.constant(v)
            for k, v in dict(
                inputs, label_ids=labels, example_index=np.arange(5, dtype=np.int32)
            ).items()
        },
        has_labels=True,
    )
    np.testing.assert_allclose(
        per_example["example_loss"].numpy(), (xent * scored).sum(-1), rtol=1e-5
    )
    np.testing.assert_array_equal(
        per_example["predicted_ids"].numpy(), outputs["logits"].argmax(-1)
    )


# ----------------------------------------------------------------------------------------------
# The driver
# ----------------------------------------------------------------------------------------------


def test_predict_puts_padded_batches_back_in_row_order(demo, tmp_path):
    args = training_flags.FinetuneArgs(
        output_dir=str(tmp_path / "out"),
        init_checkpoint=demo["model_dir"],
        do_eval=True,
        max_seq_length=12,
    )
    source = args.model_source()
    spec = models.TaskSpec(kind="classifier", labels=["0", "1"], max_seq_length=12)
    tuner = finetuning.Finetuner(args.finetune_config(), tf.distribute.get_strategy(), source, spec)
    assert tuner.start() is None  # nothing to resume; the encoder comes from the model dir
    np.testing.assert_array_equal(
        tuner.encoder.weights[0].numpy(),
        ModelDir(demo["model_dir"]).load_encoder().weights[0].numpy(),
    )
    rng = np.random.default_rng(0)
    features = {
        "input_ids": rng.integers(5, 20, size=(7, 12)).astype(np.int32),
        "input_mask": np.ones((7, 12), np.int32),
        "segment_ids": np.zeros((7, 12), np.int32),
        "label_ids": rng.integers(0, 2, size=7).astype(np.int32),
    }
    outputs = tuner.predict(
        features, batch_size=4, has_labels=True
    )  # 2 batches, the second one padded
    direct = tuner.model(
        {
            "input_word_ids": features["input_ids"],
            "input_mask": features["input_mask"],
            "input_type_ids": features["segment_ids"],
        },
        training=False,
    )["logits"].numpy()
    np.testing.assert_allclose(outputs["logits"], direct, rtol=1e-5, atol=1e-6)
    assert heads.mean_loss(outputs) == pytest.approx(
        np_xent(direct, features["label_ids"]).mean(), rel=1e-5
    )
    # Without --do_train nothing is written: the output dir is not a half model directory.
    assert not os.path.exists(ModelDir(args.output_dir).task_file)


def test_fine_tuning_a_tiny_model_reaches_95_percent_dev_accuracy(demo, tmp_path, capsys):
    output_dir = str(tmp_path / "sst2")
    args = run_classifier.ClassifierArgs(
        task_name="sst2",
        data_dir=demo["glue_dir"],
        init_checkpoint=demo["model_dir"],
        output_dir=output_dir,
        do_train=True,
        do_eval=True,
        seed=1,
        **DEMO_TRAINING,
    )
    before = run_classifier.run(
        run_classifier.ClassifierArgs(
            **dict(vars(args), do_train=False, output_dir=str(tmp_path / "untrained"))
        )
    ).eval_results
    result = run_classifier.run(args)
    assert result.step == 125  # int(400 / 32 * 10)
    assert before["eval_accuracy"] < 0.8
    assert result.eval_results["eval_accuracy"] >= 0.95
    assert result.eval_results["eval_loss"] < before["eval_loss"]
    # The output directory is a fine-tuned model directory that loads on its own.
    model, _, _, spec = models.load_task_model(ModelDir(output_dir))
    assert (spec.kind, spec.labels, spec.max_seq_length, spec.is_pair, spec.task_name) == (
        "classifier",
        ["0", "1"],
        24,
        False,
        "sst2",
    )
    np.testing.assert_array_equal(
        model.get_layer("classifier_head").kernel.numpy(),
        result.finetuner.model.get_layer("classifier_head").kernel.numpy(),
    )
    # Rerunning the finished command resumes from its checkpoint: no step is trained again, and
    # the run says so rather than "training classifier for 125 steps".
    rerun = run_classifier.run(args)
    assert rerun.step == 125 and rerun.train_metrics == {}
    out = capsys.readouterr().out
    assert f"{output_dir} is already trained to step 125 of 125: nothing to train" in out
    assert rerun.eval_results == pytest.approx(result.eval_results)


def test_data_seed_orders_the_input_and_seed_alone_the_weights(demo, tmp_path, monkeypatch):
    seeds_seen = []
    records_dataset = packing.records_dataset

    def recording(*args, **kwargs):  # the real input pipeline, noting the seed it was given
        seeds_seen.append(kwargs["seed"])
        return records_dataset(*args, **kwargs)

    monkeypatch.setattr(packing, "records_dataset", recording)
    training = dict(DEMO_TRAINING, num_train_epochs=0.25, steps_per_loop=1)  # 3 steps

    def fine_tune(name, **seeds):
        args = run_classifier.ClassifierArgs(
            task_name="sst2",
            data_dir=demo["glue_dir"],
            init_checkpoint=demo["model_dir"],
            output_dir=str(tmp_path / name),
            do_train=True,
            do_eval=True,
            **seeds,
            **training,
        )
        seeds_seen.clear()
        run = run_classifier.run(args)
        return list(seeds_seen), run.finetuner.model.get_layer("classifier_head").kernel.numpy()

    plain_seeds, plain = fine_tune("plain", seed=1)
    assert plain_seeds == [1]  # without --data_seed, --seed orders the input, as before
    ordered_seeds, ordered = fine_tune("data_seed", seed=1, data_seed=5)
    assert ordered_seeds == [5]
    assert not np.array_equal(plain, ordered)  # the same first weights, trained on another order
    restarts_seeds, _ = fine_tune("restarts", seed=1, data_seed=5, num_restarts=2)
    assert restarts_seeds == [5, 5]  # the restarts vary the weights' seed, not the order


def test_eval_every_epoch_writes_the_learning_curve_and_trains_the_same_model(demo, tmp_path):
    values = dict(
        task_name="sst2",
        data_dir=demo["glue_dir"],
        init_checkpoint=demo["model_dir"],
        do_train=True,
        do_eval=True,
        seed=1,
        **dict(DEMO_TRAINING, num_train_epochs=2.5),
    )
    plain = run_classifier.run(
        run_classifier.ClassifierArgs(**values, output_dir=str(tmp_path / "plain"))
    )
    output_dir = str(tmp_path / "curve")
    curve = run_classifier.run(
        run_classifier.ClassifierArgs(**values, output_dir=output_dir, eval_every_epoch=True)
    )
    # 400 examples, batch 32, 2.5 epochs: 31 steps; the epochs end at 12, 25 and 31.
    assert finetuning.epoch_ends(31, 2.5) == [12, 25, 31]
    history = finetuning.read_eval_history(output_dir)
    assert [(e["epoch"], e["global_step"]) for e in history] == [(1, 12), (2, 25), (3, 31)]
    assert history[-1]["eval_accuracy"] == pytest.approx(curve.eval_results["eval_accuracy"])
    assert all(0.0 <= e["eval_accuracy"] <= 1.0 and e["eval_loss"] > 0 for e in history)
    # Stopping at the epochs' ends to evaluate changes nothing in what is trained; without the
    # flag the run neither stops there nor writes a curve.
    assert finetuning.read_eval_history(str(tmp_path / "plain")) == []
    assert [
        c.split("-")[-1]
        for c in tf.train.get_checkpoint_state(str(tmp_path / "plain")).all_model_checkpoint_paths
    ] == ["31"]
    for got, want in zip(curve.finetuner.model.weights, plain.finetuner.model.weights):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    assert curve.eval_results["eval_loss"] == pytest.approx(plain.eval_results["eval_loss"])


def test_eval_every_epoch_needs_training_and_eval(tmp_path):
    result = run_module_cli(
        "bert_tf.run_classifier",
        "--task_name=sst2",
        f"--output_dir={tmp_path}",
        "--do_train",
        "--eval_every_epoch",
    )
    assert result.returncode == 2
    assert "--eval_every_epoch needs --do_train and --do_eval" in result.stderr


# ----------------------------------------------------------------------------------------------
# Casing against the name of Google's checkpoints (the original's validate_case_matches_checkpoint)
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def google_releases(tmp_path_factory):
    """Tiny original-layout checkpoints under the names of a cased and an uncased release, and another name."""
    root = tmp_path_factory.mktemp("releases")
    weights = random_weights(GOOGLE_TINY)
    return {
        name: write_google_dir(str(root / name), weights)
        for name in ("cased_L-12_H-768_A-12", "uncased_L-12_H-768_A-12", "my_bert")
    }


def google_args(prefix, tmp_path, **overrides):
    """FinetuneArgs starting from the original checkpoint at `prefix` (its config and vocab beside it)."""
    directory = os.path.dirname(prefix)
    values = dict(
        output_dir=str(tmp_path / "out"),
        init_checkpoint=prefix,
        do_train=True,
        max_seq_length=12,
        bert_config_file=os.path.join(directory, "bert_config.json"),
        vocab_file=os.path.join(directory, "vocab.txt"),
    )
    values.update(overrides)
    return training_flags.FinetuneArgs(**values)


def test_casing_that_contradicts_a_google_checkpoints_name_is_refused(google_releases, tmp_path):
    cased, uncased, other = (
        google_releases[name]
        for name in ("cased_L-12_H-768_A-12", "uncased_L-12_H-768_A-12", "my_bert")
    )

    def casing(init, flag):
        return (google_args(init, tmp_path, do_lower_case=flag)).model_source().config.do_lower_case

    # --do_lower_case=true, given or by default, with a cased release.
    for flag in (True, None):
        with pytest.raises(io_utils.UsageError) as error:
            google_args(cased, tmp_path, do_lower_case=flag).model_source()
        message = str(error.value)
        assert message.startswith(f"--do_lower_case=true contradicts --init_checkpoint={cased}:")
        assert (
            "cased_L-12_H-768_A-12 is Google's cased model" in message
            and "--do_lower_case=false" in message
        )
    with pytest.raises(
        io_utils.UsageError,
        match=r"--do_lower_case=false contradicts --init_checkpoint=.*"
        r"uncased_L-12_H-768_A-12 is Google's lower-cased model",
    ):
        google_args(uncased, tmp_path, do_lower_case=False).model_source()
    # The matching casing, and any casing under a name that is not a release, are accepted.
    assert casing(cased, False) is False
    assert casing(uncased, True) is True and casing(uncased, None) is True
    assert casing(other, True) is True and casing(other, False) is False


def test_every_fine_tuning_job_refuses_a_casing_that_contradicts_the_checkpoint(
    google_releases, tmp_path
):
    cased = google_releases["cased_L-12_H-768_A-12"]
    directory = os.path.dirname(cased)
    flags = [
        f"--init_checkpoint={cased}",
        f"--bert_config_file={directory}/bert_config.json",
        f"--vocab_file={directory}/vocab.txt",
        "--max_seq_length=12",
    ]
    # The CLI: a usage error, exit code 2, before any data is read.
    result = run_module_cli(
        "bert_tf.run_classifier",
        "--task_name=sst2",
        f"--data_dir={tmp_path / 'none'}",
        f"--output_dir={tmp_path / 'classifier'}",
        "--do_train",
        *flags,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"--do_lower_case=true contradicts --init_checkpoint={cased}" in result.stderr
    # run_squad, run_ner and extract_features resolve the weights the same way.
    common = dict(
        init_checkpoint=cased,
        bert_config_file=f"{directory}/bert_config.json",
        vocab_file=f"{directory}/vocab.txt",
        max_seq_length=12,
    )
    jobs = [
        (
            run_squad.run,
            run_squad.SquadArgs(
                output_dir=str(tmp_path / "squad"),
                do_train=True,
                train_file=str(tmp_path / "train.json"),
                max_query_length=4,
                doc_stride=4,
                **common,
            ),
        ),
        (
            run_ner.run,
            run_ner.NerArgs(
                output_dir=str(tmp_path / "ner"),
                do_train=True,
                train_file=str(tmp_path / "train.txt"),
                **common,
            ),
        ),
        (
            extract_features.run,
            extract_features.ExtractArgs(
                input_file=str(tmp_path / "input.txt"),
                output_file=str(tmp_path / "features.jsonl"),
                layers="-1",
                **common,
            ),
        ),
    ]
    (tmp_path / "train.txt").write_text("w1 O\n")
    (tmp_path / "train.json").write_text('{"data": []}')
    (tmp_path / "input.txt").write_text("w1 w2 ||| W3\n")
    for run, args in jobs:
        with pytest.raises(
            io_utils.UsageError, match="--do_lower_case=true contradicts --init_checkpoint="
        ):
            run(args)
    # With the matching casing the cased checkpoint works: W3 keeps its capital (and is [UNK]).
    assert extract_features.run(dataclasses.replace(jobs[-1][1], do_lower_case=False)) == 1
    with open(tmp_path / "features.jsonl") as f:
        tokens = [feature["token"] for feature in json.loads(f.readline())["features"]]
    assert tokens == ["[CLS]", "w1", "w2", "[SEP]", "[UNK]", "[SEP]"]
