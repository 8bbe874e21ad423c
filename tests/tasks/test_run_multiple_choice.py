"""Multiple choice (SWAG): CSV reading and packing, learning the demo set, the CLI, and the export."""

import csv
import os

import numpy as np
import pytest
import tensorflow as tf
from helpers import DEMO_TRAINING, run_module_cli, write_tiny_model_dir, write_vocab

from bert_tf import run_multiple_choice
from bert_tf.model.model_dir import ModelDir
from bert_tf.runtime import io_utils
from bert_tf.saved_model import export
from bert_tf.tasks import data_files, demo_datasets, models
from bert_tf.tasks.multiple_choice import data as multiple_choice
from bert_tf.tokenization import python_tokenizer

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

SWAG_HEADER = [
    "video-id",
    "fold-ind",
    "startphrase",
    "sent1",
    "sent2",
    "gold-source",
    "ending0",
    "ending1",
    "ending2",
    "ending3",
    "label",
]


def write_csv(path, rows):
    """A CSV file with these rows (the first is the header)."""
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return str(path)


@pytest.fixture(scope="module")
def swag(tmp_path_factory):
    """The demo SWAG dir and a tiny random-weight model dir whose vocab covers it."""
    root = tmp_path_factory.mktemp("swag")
    data_dir = demo_datasets.write_demo_swag_dir(str(root / "swag"))
    texts = []
    for split in ("train", "dev", "test"):
        for example in multiple_choice.read_swag_csv(
            os.path.join(data_dir, multiple_choice.SPLIT_FILES[split])
        ):
            texts += [example.context] + example.endings
    vocab_file = write_vocab(str(root / "vocab.txt"), texts)
    return {
        "data_dir": data_dir,
        "vocab_file": vocab_file,
        "model_dir": write_tiny_model_dir(root / "pretrained", vocab_file),
    }


def test_swag_csv_rows_pack_as_cls_sent1_sep_sent2_ending_sep(tmp_path, swag):
    path = write_csv(
        tmp_path / "val.csv",
        [
            SWAG_HEADER,
            [
                "lsmdc1",
                "7",
                "someone is in the kitchen . then she",
                "someone is in the kitchen .",
                "then she",
                "gold",
                "chops the onions",
                "dives into the water",
                "parks the car",
                "plants the seeds",
                "0",
            ],
            [
                "lsmdc2",
                "8",
                "x",
                "we see the pool .",
                "",
                "gold",
                "swims a length",
                "",
                "washes the pan",
                "digs a hole",
                "3",
            ],
        ],
    )
    examples = multiple_choice.read_swag_csv(path)
    assert [(e.example_id, e.label) for e in examples] == [("lsmdc1-7", 0), ("lsmdc2-8", 3)]
    assert (
        examples[0].context == "someone is in the kitchen ."
        and examples[0].endings[0] == "then she chops the onions"
    )
    assert examples[1].endings[:2] == ["swims a length", ""]

    tokenizer = python_tokenizer.FullTokenizer(swag["vocab_file"])
    features = multiple_choice.convert_examples(examples, tokenizer, max_seq_length=16)
    assert features["input_ids"].shape == (2, 4, 16) and features["label_ids"].tolist() == [0, 3]
    vocab = tokenizer.vocab
    # Written out from the rule, independently of the packing helpers.
    expected = [
        "[CLS]",
        "someone",
        "is",
        "in",
        "the",
        "kitchen",
        ".",
        "[SEP]",
        "then",
        "she",
        "chops",
        "the",
        "onions",
        "[SEP]",
    ]
    row = features["input_ids"][0, 0]
    assert row.tolist() == [vocab[t] for t in expected] + [0, 0]
    assert features["segment_ids"][0, 0].tolist() == [0] * 8 + [1] * 6 + [0, 0]
    assert features["input_mask"][0, 0].tolist() == [1] * 14 + [0, 0]
    # An ending without tokens packs as the context alone, as a pair's empty second text does.
    assert features["input_mask"][1, 1].sum() == len(tokenizer.encode("we see the pool .")) + 2


def test_bad_swag_files_name_the_file_and_line(tmp_path):
    path = write_csv(tmp_path / "train.csv", [["sent1", "ending0"], ["a", "b"]])
    with pytest.raises(
        data_files.DataFormatError, match=r"train\.csv:1: a SWAG header needs sent1, sent2"
    ):
        multiple_choice.read_swag_csv(path)
    path = write_csv(
        tmp_path / "val.csv",
        [SWAG_HEADER, ["v", "1", "s", "a", "b", "g", "e0", "e1", "e2", "e3", "7"]],
    )
    with pytest.raises(
        data_files.DataFormatError, match=r"val\.csv:2: label '7' is not an ending number below 4"
    ):
        multiple_choice.read_swag_csv(path)
    with pytest.raises(io_utils.UsageError, match="test.csv"):
        multiple_choice.read_split(str(tmp_path), "test")


@pytest.mark.slow
def test_cli_learns_the_demo_set_and_its_export_answers_with_any_number_of_endings(swag, tmp_path):
    output_dir = str(tmp_path / "swag_model")
    flags = [f"--{name}={value}" for name, value in DEMO_TRAINING.items()]
    process = run_module_cli(
        "bert_tf.run_multiple_choice",
        "--task_name=swag",
        f"--data_dir={swag['data_dir']}",
        f"--init_checkpoint={swag['model_dir']}",
        f"--output_dir={output_dir}",
        "--do_train",
        "--do_eval",
        "--do_predict",
        "--seed=1",
        *flags,
    )
    assert process.returncode == 0, process.stderr[-3000:]
    with open(os.path.join(output_dir, "eval_results.txt")) as f:
        results = dict(line.rstrip("\n").split(" = ", 1) for line in f)
    assert results["eval_examples"] == "100" and float(results["eval_accuracy"]) >= 0.9, results
    probabilities = np.loadtxt(os.path.join(output_dir, "test_results.tsv"))
    assert probabilities.shape == (100, 4)
    with open(os.path.join(output_dir, "test_predictions.csv")) as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["example_id", "choice"] and len(rows) == 101
    assert [int(r[1]) for r in rows[1:]] == probabilities.argmax(1).tolist()
    spec = models.read_task_spec(ModelDir(output_dir))
    assert (spec.kind, spec.labels, spec.max_seq_length) == ("multiple_choice", [], 24)

    # The export: context [b] and endings [b, n] strings in; the same probabilities as the CLI's.
    path, kind = export.export(output_dir, str(tmp_path / "export"))
    assert kind == "multiple_choice"
    serving = tf.saved_model.load(path).signatures["serving_default"]
    test = multiple_choice.read_swag_csv(os.path.join(swag["data_dir"], "test.csv"))[:20]
    outputs = serving(
        context=tf.constant([e.context for e in test]),
        endings=tf.constant([e.endings for e in test]),
    )
    assert outputs["probabilities"].dtype == tf.float32 and outputs["choice"].dtype == tf.int32
    np.testing.assert_allclose(outputs["probabilities"].numpy(), probabilities[:20], atol=1e-5)
    two = serving(
        context=tf.constant([e.context for e in test]),
        endings=tf.constant([e.endings[:2] for e in test]),
    )
    assert two["probabilities"].shape == (20, 2)
    np.testing.assert_allclose(two["probabilities"].numpy().sum(1), 1.0, atol=1e-6)
    empty = serving(context=tf.zeros([0], tf.string), endings=tf.zeros([0, 4], tf.string))
    assert empty["probabilities"].shape == (0, 4) and empty["choice"].shape == (0,)


def test_cli_refuses_a_missing_data_dir_and_an_unknown_task(swag, tmp_path):
    with pytest.raises(io_utils.UsageError, match="--data_dir"):
        run_multiple_choice.run(
            run_multiple_choice.MultipleChoiceArgs(
                init_checkpoint=swag["model_dir"], output_dir=str(tmp_path / "a"), do_train=True
            )
        )
    with pytest.raises(io_utils.UsageError, match="--task_name=cola"):
        run_multiple_choice.run(
            run_multiple_choice.MultipleChoiceArgs(
                task_name="cola",
                data_dir=swag["data_dir"],
                init_checkpoint=swag["model_dir"],
                output_dir=str(tmp_path / "b"),
                do_train=True,
            )
        )


@pytest.mark.slow
def test_a_bilstm_head_trains_and_its_export_serves_the_same_probabilities(swag, tmp_path):
    output_dir = str(tmp_path / "bilstm")
    result = run_multiple_choice.run(
        run_multiple_choice.MultipleChoiceArgs(
            task_name="swag",
            data_dir=swag["data_dir"],
            init_checkpoint=swag["model_dir"],
            output_dir=output_dir,
            do_train=True,
            do_predict=True,
            head="bilstm",
            lstm_units=4,
            max_seq_length=24,
            num_train_epochs=0.5,
            predict_batch_size=50,
        )
    )
    assert result.step > 0
    spec = models.read_task_spec(ModelDir(output_dir))
    assert (spec.kind, spec.head, spec.lstm_units) == ("multiple_choice", "bilstm", 4)
    probabilities = np.loadtxt(os.path.join(output_dir, "test_results.tsv"))
    path, _ = export.export(output_dir, str(tmp_path / "export"))
    serving = tf.saved_model.load(path).signatures["serving_default"]
    test = multiple_choice.read_swag_csv(os.path.join(swag["data_dir"], "test.csv"))[:10]
    outputs = serving(
        context=tf.constant([e.context for e in test]),
        endings=tf.constant([e.endings for e in test]),
    )
    np.testing.assert_allclose(outputs["probabilities"].numpy(), probabilities[:10], atol=1e-5)


def test_restarts_rank_multiple_choice_runs_by_dev_accuracy(swag, tmp_path):
    output_dir = tmp_path / "restarts"
    result = run_multiple_choice.run(
        run_multiple_choice.MultipleChoiceArgs(
            task_name="swag",
            data_dir=swag["data_dir"],
            init_checkpoint=swag["model_dir"],
            output_dir=str(output_dir),
            do_train=True,
            do_eval=True,
            max_seq_length=24,
            num_train_epochs=0.5,
            num_restarts=2,
        )
    )
    scores = [result.eval_results[f"restart_{i}_eval_accuracy"] for i in (1, 2)]
    assert result.eval_results["eval_accuracy"] == max(scores)
    assert result.eval_results["restart_2_seed"] == result.eval_results["restart_1_seed"] + 1
    assert ModelDir(str(output_dir)).latest_step() == result.step
