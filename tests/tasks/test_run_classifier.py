"""python -m bert_tf.run_classifier end to end: a real subprocess on 2 mirrored CPUs, GLUE layouts, bad input."""

import dataclasses
import glob
import os
import re
import signal
import sys

import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    CLI_ENV,
    DEMO_TRAINING,
    checkpoint_values,
    run_module_cli,
    write_tiny_model_dir,
    write_vocab,
)

from bert_tf import run_classifier
from bert_tf.model.model_dir import ModelDir
from bert_tf.runtime import io_utils
from bert_tf.runtime.local_cluster import Task
from bert_tf.saved_model import export
from bert_tf.tasks import data_files, models

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow


def run_cli(*flags):
    """Runs the classifier CLI in a subprocess; returns the CompletedProcess (text output)."""
    return run_module_cli("bert_tf.run_classifier", *flags)


def read_key_values(path):
    """{key: value string} from `key = value` lines."""
    with open(path) as f:
        return dict(line.rstrip("\n").split(" = ", 1) for line in f)


def event_tags(log_dir):
    """The scalar tags written to the TensorBoard event files of log_dir."""
    tags = set()
    for path in glob.glob(os.path.join(log_dir, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(value.tag for value in event.summary.value)
    return tags


@pytest.mark.slow
def test_cli_on_two_mirrored_cpus_writes_results_submission_and_an_exportable_model_dir(
    demo, tmp_path
):
    output_dir = str(tmp_path / "sst2")
    flags = [f"--{name}={value}" for name, value in DEMO_TRAINING.items()]
    process = run_cli(
        "--task_name=sst2",
        f"--data_dir={demo['glue_dir']}",
        f"--init_checkpoint={demo['model_dir']}",
        f"--output_dir={output_dir}",
        "--do_train",
        "--do_eval",
        "--do_predict",
        "--seed=1",
        "--strategy=mirrored",
        "--num_cpu_replicas=2",
        "--num_accumulation_steps=2",  # each replica's 16 rows in 2 micro-batches
        *flags,
    )
    assert process.returncode == 0, process.stderr[-3000:]
    assert "training classifier for 125 steps (global batch 32, 2 replicas)" in process.stdout
    assert "step 125/125  loss" in process.stdout  # the Trainer's progress line

    results = read_key_values(os.path.join(output_dir, "eval_results.txt"))
    assert set(results) == {"eval_accuracy", "eval_loss", "eval_examples", "global_step"}
    assert results["global_step"] == "125" and results["eval_examples"] == "100"
    assert float(results["eval_accuracy"]) >= 0.95

    # The GLUE submission file: a header, then the test file's index and a label, in file order.
    with open(os.path.join(output_dir, "SST-2.tsv")) as f:
        rows = [line.rstrip("\n").split("\t") for line in f]
    assert rows[0] == ["index", "prediction"] and len(rows) == 101
    assert [r[0] for r in rows[1:]] == [str(i) for i in range(100)]
    assert {r[1] for r in rows[1:]} == {"0", "1"}
    probabilities = np.loadtxt(os.path.join(output_dir, "test_results.tsv"))
    assert probabilities.shape == (100, 2)
    np.testing.assert_allclose(probabilities.sum(1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(probabilities.argmax(1).astype(str), [r[1] for r in rows[1:]])

    assert {"loss", "accuracy", "learning_rate"} <= event_tags(os.path.join(output_dir, "train"))
    assert {"eval_accuracy", "eval_loss"} <= event_tags(os.path.join(output_dir, "eval"))
    assert os.path.exists(os.path.join(output_dir, "run_classifier.flags"))

    # A model directory with task.json that bert_tf.export turns into a SavedModel with no extra
    # flags, and whose exported graph (its own tokenizer) predicts what run_classifier predicted.
    spec = models.read_task_spec(ModelDir(output_dir))
    assert (spec.kind, spec.labels, spec.max_seq_length, spec.task_name) == (
        "classifier",
        ["0", "1"],
        24,
        "sst2",
    )
    path, kind = export.export(output_dir, str(tmp_path / "export"))
    assert kind == "classifier"
    with open(os.path.join(demo["glue_dir"], "test.tsv")) as f:
        sentences = [line.rstrip("\n").split("\t")[1] for line in f][1:]
    serving = tf.saved_model.load(path).signatures["serving_default"]
    labels = serving(text=tf.constant(sentences[:20]))["label"].numpy().astype(str)
    np.testing.assert_array_equal(labels, [r[1] for r in rows[1:21]])


def test_sigterm_on_two_mirrored_cpus_saves_the_step_reached_and_the_rerun_goes_on_from_it(
    demo, tmp_path
):
    output_dir = str(tmp_path / "sst2")
    flags = [
        "--task_name=sst2",
        f"--data_dir={demo['glue_dir']}",
        f"--init_checkpoint={demo['model_dir']}",
        f"--output_dir={output_dir}",
        "--do_train",
        "--strategy=mirrored",
        "--num_cpu_replicas=2",
        *[f"--{name}={value}" for name, value in dict(DEMO_TRAINING, steps_per_loop=5).items()],
    ]
    job = Task([sys.executable, "-m", "bert_tf.run_classifier", *flags], CLI_ENV)
    job.wait_for_line(r"^step 5/125", timeout=240)
    job.process.send_signal(signal.SIGTERM)
    assert job.wait(120) == 0, job.output[-3000:]
    (said,) = [line for line in job.lines if line.startswith("preempted:")]
    step = int(re.search(r"stopped at step (\d+)/125", said)[1])
    assert 5 <= step < 125 and step % 5 == 0
    assert said == (
        f"preempted: SIGTERM: saved {output_dir}/ckpt-{step} and stopped at step {step}/125; "
        "run the same command again (on every worker) to resume from it"
    )
    assert tf.train.latest_checkpoint(output_dir).endswith(f"ckpt-{step}")
    rerun = run_cli(*flags)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resumed from {output_dir}/ckpt-{step} at step {step}" in rerun.stderr
    assert "step 125/125  loss" in rerun.stdout
    assert tf.train.latest_checkpoint(output_dir).endswith("ckpt-125")


def demo_sst2(demo, output_dir):
    """ClassifierArgs fields of a short training run on the demo's sst2 from its tiny model."""
    return dict(
        task_name="sst2",
        data_dir=demo["glue_dir"],
        init_checkpoint=demo["model_dir"],
        output_dir=output_dir,
        max_seq_length=24,
        do_train=True,
    )


@pytest.mark.slow
def test_cli_head_bilstm_is_recorded_and_a_rerun_with_another_head_is_refused(demo, tmp_path):
    output_dir = str(tmp_path / "bilstm")
    common = demo_sst2(demo, output_dir)
    process = run_cli(
        *(f"--{name}={value}" for name, value in common.items() if name != "do_train"),
        "--do_train",
        "--do_eval",
        "--head=bilstm",
        "--lstm_units=8",
        "--num_train_epochs=1",
    )
    assert process.returncode == 0, process.stderr[-3000:]
    assert "eval_accuracy" in read_key_values(os.path.join(output_dir, "eval_results.txt"))
    spec = models.read_task_spec(ModelDir(output_dir))
    assert (spec.kind, spec.head, spec.lstm_units, spec.features) == ("classifier", "bilstm", 8, "")
    model, *_ = models.load_task_model(ModelDir(output_dir))
    assert model.get_layer("bilstm_2").forward_layer.units == 8
    # The checkpoints hold a BiLSTM head: resuming them as a dense head would mix two models.
    with pytest.raises(io_utils.UsageError, match="bilstm head .*, not a classifier with labels"):
        run_classifier.run(run_classifier.ClassifierArgs(head="dense", **common))


def test_feature_based_classification_trains_a_bilstm_on_one_frozen_layer(demo, tmp_path):
    output_dir = str(tmp_path / "features")
    args = run_classifier.ClassifierArgs(
        **demo_sst2(demo, output_dir),
        do_eval=True,
        feature_based=True,
        features="layer_1",
        lstm_units=8,
        num_train_epochs=1,
        weight_decay=0.5,
    )
    run_classifier.run(args)
    assert "eval_accuracy" in read_key_values(os.path.join(output_dir, "eval_results.txt"))
    spec = models.read_task_spec(ModelDir(output_dir))
    assert (spec.kind, spec.head, spec.features) == ("classifier", "bilstm", "layer_1")
    # The encoder stays as it came, under heavy weight decay.
    before = checkpoint_values(demo["model_dir"], "encoder")
    after = checkpoint_values(output_dir, "encoder")
    assert len(before) > 20 and set(after) == set(before)
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)
    with pytest.raises(io_utils.UsageError, match="--features applies to --feature_based only"):
        dataclasses.replace(args, feature_based=False, lstm_units=None).validate()


def test_cli_missing_split_file_exits_2_naming_it(demo, tmp_path):
    data_dir = tmp_path / "glue"
    data_dir.mkdir()
    (data_dir / "train.tsv").write_text(open(os.path.join(demo["glue_dir"], "train.tsv")).read())
    process = run_cli(
        "--task_name=sst2",
        f"--data_dir={data_dir}",
        f"--init_checkpoint={demo['model_dir']}",
        f"--output_dir={tmp_path / 'out'}",
        "--do_train",
        "--do_eval",
        "--max_seq_length=24",
    )
    assert process.returncode == 2
    assert f"split file not found: {data_dir / 'dev.tsv'}" in process.stderr
    assert not os.path.exists(tmp_path / "out" / "checkpoint")


@pytest.mark.parametrize("split,content", [("train", ""), ("dev", "sentence\tlabel\n")])
def test_an_empty_train_or_dev_set_exits_2_naming_it_and_leaves_nothing(
    demo, tmp_path, split, content
):
    # An empty training set stopped training at its first step with a traceback and left a model
    # directory without a checkpoint; an empty dev set reported an accuracy of 0 over 0 examples.
    data_dir = tmp_path / "glue"
    data_dir.mkdir()
    for name in ("train", "dev"):
        (data_dir / f"{name}.tsv").write_text(
            open(os.path.join(demo["glue_dir"], f"{name}.tsv")).read()
        )
    (data_dir / f"{split}.tsv").write_text(content)
    output_dir = tmp_path / "out"
    process = run_cli(
        "--task_name=sst2",
        f"--data_dir={data_dir}",
        f"--init_checkpoint={demo['model_dir']}",
        f"--output_dir={output_dir}",
        "--do_train",
        "--do_eval",
        "--max_seq_length=24",
    )
    assert process.returncode == 2, process.stderr[-2000:]
    flag = "--do_train" if split == "train" else "--do_eval"
    assert f"{flag}: {data_dir / f'{split}.tsv'} has no examples" in process.stderr
    assert "Traceback" not in process.stderr and not output_dir.exists()


def test_a_dev_label_never_seen_in_training_is_a_clear_error(demo, tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "train.csv").write_text(
        "text,label\nthe movie was good .,pos\nthe film was bad .,neg\n"
    )
    (data_dir / "dev.csv").write_text(
        "text,label\nthe plot was dull .,neg\nthe cast was great .,neutral\n"
    )
    args = run_classifier.ClassifierArgs(
        task_name="tsv",
        text_a_column="text",
        label_column="label",
        data_dir=str(data_dir),
        init_checkpoint=demo["model_dir"],
        output_dir=str(tmp_path / "out"),
        do_train=True,
        do_eval=True,
        max_seq_length=16,
    )
    with pytest.raises(
        data_files.DataFormatError, match=r"dev\.csv:3: label 'neutral' was never seen in training"
    ):
        run_classifier.run(args)


def test_a_missing_data_dir_flag_and_no_action_are_usage_errors(demo, tmp_path):
    base = dict(
        init_checkpoint=demo["model_dir"], output_dir=str(tmp_path / "out"), max_seq_length=16
    )
    with pytest.raises(io_utils.UsageError, match="--data_dir"):
        run_classifier.run(run_classifier.ClassifierArgs(task_name="sst2", do_train=True, **base))
    with pytest.raises(io_utils.UsageError, match="--do_train, --do_eval and --do_predict"):
        run_classifier.run(run_classifier.ClassifierArgs(task_name="sst2", data_dir="x", **base))
    with pytest.raises(
        io_utils.UsageError,
        match=r"--num_accumulation_steps=3 does not divide the batch per replica, 32 ",
    ):
        run_classifier.run(
            run_classifier.ClassifierArgs(
                task_name="sst2",
                data_dir=demo["glue_dir"],
                do_train=True,
                num_accumulation_steps=3,
                **base,
            )
        )


def write_mnli_like(data_dir, rng, words):
    """MNLI's layout: a header, premise in column 8, hypothesis in 9, the label last."""
    labels = ("contradiction", "entailment", "neutral")
    header = "\t".join(
        [
            "index",
            "promptID",
            "pairID",
            "genre",
            "s1b",
            "s2b",
            "s1p",
            "s2p",
            "sentence1",
            "sentence2",
            "label1",
            "gold_label",
        ]
    )
    for split, count in (("dev_matched", 6), ("dev_mismatched", 5)):
        rows = [header]
        for i in range(count):
            premise = " ".join(rng.choice(words, 5))
            hypothesis = " ".join(rng.choice(words, 3))
            label = labels[i % 3]
            rows.append(
                "\t".join(
                    [str(i), "0", "0", "fiction", "", "", "", "", premise, hypothesis, label, label]
                )
            )
        (data_dir / f"{split}.tsv").write_text("\n".join(rows) + "\n")


def test_mnli_reports_matched_and_mismatched_separately_and_stsb_correlations(tmp_path):
    rng = np.random.default_rng(0)
    words = [f"word{i}" for i in range(20)]
    vocab_file = write_vocab(str(tmp_path / "vocab.txt"), words)
    model_dir = write_tiny_model_dir(tmp_path / "pretrained", vocab_file)
    data_dir = tmp_path / "mnli"
    data_dir.mkdir()
    write_mnli_like(data_dir, rng, words)
    result = run_classifier.run(
        run_classifier.ClassifierArgs(
            task_name="mnli",
            data_dir=str(data_dir),
            init_checkpoint=model_dir,
            output_dir=str(tmp_path / "out"),
            do_eval=True,
            max_seq_length=16,
            eval_batch_size=4,
        )
    )
    assert set(result.eval_results) == {
        "eval_matched_accuracy",
        "eval_matched_loss",
        "eval_matched_examples",
        "eval_mismatched_accuracy",
        "eval_mismatched_loss",
        "eval_mismatched_examples",
        "global_step",
    }
    assert (
        result.eval_results["eval_matched_examples"],
        result.eval_results["eval_mismatched_examples"],
    ) == (6, 5)
    written = read_key_values(str(tmp_path / "out" / "eval_results.txt"))
    assert float(written["eval_mismatched_accuracy"]) == pytest.approx(
        result.eval_results["eval_mismatched_accuracy"]
    )

    # STS-B: a regressor head, evaluated with Pearson and Spearman (columns 7, 8, score 9).
    stsb = tmp_path / "stsb"
    stsb.mkdir()
    rows = [
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    ]
    rows += [
        f"{i}\tmain\tf\t2012\t{i}\ts\ts\t{' '.join(rng.choice(words, 4))}\t{' '.join(rng.choice(words, 4))}"
        f"\t{i * 0.5:.1f}"
        for i in range(8)
    ]
    (stsb / "dev.tsv").write_text("\n".join(rows) + "\n")
    result = run_classifier.run(
        run_classifier.ClassifierArgs(
            task_name="stsb",
            data_dir=str(stsb),
            init_checkpoint=model_dir,
            output_dir=str(tmp_path / "stsb_out"),
            do_eval=True,
            max_seq_length=16,
            eval_batch_size=4,
        )
    )
    assert set(result.eval_results) == {
        "eval_pearson",
        "eval_spearman",
        "eval_loss",
        "eval_examples",
        "global_step",
    }
    assert -1.0 <= result.eval_results["eval_pearson"] <= 1.0


def test_tfds_glue_data_with_mock_data(demo, tmp_path):
    import tensorflow_datasets as tfds

    splits = {}
    for split, tfds_split in (("train", "train"), ("dev", "validation"), ("test", "test")):
        with open(os.path.join(demo["glue_dir"], f"{split}.tsv")) as f:
            rows = [line.rstrip("\n").split("\t") for line in f][1:]
        sentences = [r[1] if split == "test" else r[0] for r in rows]
        labels = [-1] * len(rows) if split == "test" else [int(r[1]) for r in rows]
        splits[tfds_split] = {
            "sentence": [s.encode() for s in sentences],
            "label": labels,
            "idx": list(range(100, 100 + len(rows))),
        }

    def as_dataset(self, split, *args, **kwargs):
        data = splits[split]
        return tf.data.Dataset.from_tensor_slices(
            {
                "sentence": data["sentence"],
                "label": tf.constant(data["label"], tf.int64),
                "idx": tf.constant(data["idx"], tf.int32),
            }
        )

    output_dir = tmp_path / "out"
    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        result = run_classifier.run(
            run_classifier.ClassifierArgs(
                tfds="glue/sst2",
                init_checkpoint=demo["model_dir"],
                output_dir=str(output_dir),
                do_train=True,
                do_eval=True,
                do_predict=True,
                **dict(DEMO_TRAINING, num_train_epochs=1),
            )
        )
    assert result.step == 12 and result.eval_results["eval_examples"] == 100
    with open(output_dir / "SST-2.tsv") as f:
        assert [line.split("\t")[0] for line in f][1:] == [str(i) for i in range(100, 200)]
