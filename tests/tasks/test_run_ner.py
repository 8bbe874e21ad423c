"""python -m bert_tf.run_ner end to end on small CoNLL files: learning, predictions, bad input."""

import os
import random

import numpy as np
import pytest
from helpers import checkpoint_values, run_module_cli, write_tiny_model_dir, write_vocab

from bert_tf import run_ner
from bert_tf.model.model_dir import ModelDir
from bert_tf.runtime import io_utils
from bert_tf.tasks import data_files, models
from bert_tf.tasks.ner import data as ner
from bert_tf.tasks.ner import metrics as ner_metrics

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

FIRST_NAMES = ["alice", "bob", "carol", "dave", "erin", "frank"]
LAST_NAMES = ["smith", "jones", "brown", "miller"]
CITIES = ["paris", "berlin", "tokyo", "lima", "oslo", "cairo"]
TEMPLATES = [
    "{per} lives in {loc} .",
    "yesterday {per} flew to {loc} with friends .",
    "in {loc} , {per} met the mayor .",
    "the weather in {loc} was nice .",
    "{per} said hello .",
]


def conll_sentence(rng):
    """(words, BIO tags) of one templated sentence: one- or two-word people, one-word places."""
    words, tags = [], []
    template = rng.choice(TEMPLATES)
    for slot in template.split():
        if slot == "{per}":
            name = [rng.choice(FIRST_NAMES)] + (
                [rng.choice(LAST_NAMES)] if rng.random() < 0.5 else []
            )
            words += name
            tags += ["B-PER"] + ["I-PER"] * (len(name) - 1)
        elif slot == "{loc}":
            words.append(rng.choice(CITIES))
            tags.append("B-LOC")
        else:
            words.append(slot)
            tags.append("O")
    return words, tags


def write_conll(path, sentences, iob1=False):
    """A CoNLL-2003 file: -DOCSTART-, then `word POS chunk tag` lines and blank lines between sentences."""
    lines = ["-DOCSTART- -X- -X- O", ""]
    for words, tags in sentences:
        if (
            iob1
        ):  # CoNLL-2003's own scheme: an entity starts with I- unless it follows one of its type
            tags = ["I-" + t[2:] if t.startswith("B-") else t for t in tags]
        lines += [f"{w} NN O {t}" for w, t in zip(words, tags)] + [""]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def conll(tmp_path_factory):
    """train.txt (BIO), dev.txt (IOB1), test.txt (one sentence longer than max_seq_length) and a model dir."""
    root = tmp_path_factory.mktemp("ner")
    rng = random.Random(7)
    data_dir = root / "data"
    data_dir.mkdir()
    write_conll(data_dir / "train.txt", [conll_sentence(rng) for _ in range(160)])
    write_conll(data_dir / "dev.txt", [conll_sentence(rng) for _ in range(40)], iob1=True)
    test = [conll_sentence(rng) for _ in range(9)]
    test.append((["bob"] + ["hello"] * 40 + ["oslo"], ["B-PER"] + ["O"] * 40 + ["B-LOC"]))
    write_conll(data_dir / "test.txt", test)
    words = (
        FIRST_NAMES
        + LAST_NAMES
        + CITIES
        + [w for t in TEMPLATES for w in t.split() if "{" not in w]
    )
    vocab_file = write_vocab(str(root / "vocab.txt"), [" ".join(words)])
    return {
        "data_dir": str(data_dir),
        "model_dir": write_tiny_model_dir(root / "pretrained", vocab_file),
    }


def read_conll_columns(path):
    """The `token gold predicted` rows of a predictions file, sentences as lists."""
    sentences, current = [], []
    for line in open(path):
        if line.strip():
            current.append(line.split())
        elif current:
            sentences.append(current)
            current = []
    return sentences


@pytest.mark.slow
def test_ner_learns_entities_and_writes_conll_predictions(conll, tmp_path):
    output_dir = str(tmp_path / "out")
    result = run_ner.run(
        run_ner.NerArgs(
            data_dir=conll["data_dir"],
            init_checkpoint=conll["model_dir"],
            output_dir=output_dir,
            do_train=True,
            do_eval=True,
            do_predict=True,
            max_seq_length=24,
            train_batch_size=16,
            eval_batch_size=16,
            predict_batch_size=8,
            learning_rate=2e-3,
            num_train_epochs=8,
            steps_per_loop=20,
            seed=3,
        )
    )
    assert result.step == 80
    scores = result.eval_results
    # Entity-level F1 (conlleval) on the IOB1 dev file: people of one or two words and places.
    assert scores["eval_f1"] >= 0.9, scores
    assert scores["eval_gold_entities"] > 40

    spec = models.read_task_spec(ModelDir(output_dir))
    assert (spec.kind, spec.labels, spec.max_seq_length) == (
        "ner",
        ["O", "B-LOC", "B-PER", "I-PER"],
        24,
    )
    with open(os.path.join(output_dir, "eval_results.txt")) as f:
        written = dict(line.strip().split(" = ") for line in f)
    assert float(written["eval_f1"]) == pytest.approx(scores["eval_f1"])

    dev = read_conll_columns(os.path.join(output_dir, "eval_predictions.txt"))
    gold = ner.read_conll(os.path.join(conll["data_dir"], "dev.txt"))
    assert len(dev) == len(gold) == 40
    assert [[row[1] for row in s] for s in dev] == [
        s.tags for s in gold
    ]  # gold in BIO after IOB1 reading
    predicted = [[row[2] for row in s] for s in dev]
    assert ner_metrics.entity_scores([s.tags for s in gold], predicted)["f1"] == pytest.approx(
        scores["eval_f1"]
    )

    test = read_conll_columns(os.path.join(output_dir, "test_predictions.txt"))
    assert len(test) == 10
    long_sentence = test[-1]
    assert (
        len(long_sentence) == 42
    )  # every word written back, the ones past max_seq_length tagged O
    assert long_sentence[0][2] == "B-PER" and long_sentence[-1][2] == "O"


def test_missing_dev_file_and_unseen_dev_tag_are_clear_errors(conll, tmp_path):
    base = dict(
        init_checkpoint=conll["model_dir"], output_dir=str(tmp_path / "out"), max_seq_length=24
    )
    with pytest.raises(io_utils.UsageError, match="split file not found: .*nowhere/dev.txt"):
        run_ner.run(run_ner.NerArgs(data_dir=str(tmp_path / "nowhere"), do_eval=True, **base))
    train = write_conll(tmp_path / "train.txt", [(["bob", "ran"], ["B-PER", "O"])])
    dev = write_conll(
        tmp_path / "dev.txt", [(["bob", "ran"], ["B-PER", "O"]), (["acme", "won"], ["B-ORG", "O"])]
    )
    with pytest.raises(
        data_files.DataFormatError, match=r"dev\.txt:6: tag 'B-ORG' .* never seen in training"
    ):
        run_ner.run(
            run_ner.NerArgs(
                train_file=str(train), dev_file=str(dev), do_train=True, do_eval=True, **base
            )
        )


def run_ner_cli(conll, output_dir, *flags):
    """One epoch of `python -m bert_tf.run_ner` on the test's CoNLL files (train, eval, predict)."""
    return run_module_cli(
        "bert_tf.run_ner",
        f"--data_dir={conll['data_dir']}",
        "--do_train",
        "--do_eval",
        "--do_predict",
        f"--init_checkpoint={conll['model_dir']}",
        "--max_seq_length=24",
        "--train_batch_size=16",
        "--num_train_epochs=1",
        f"--output_dir={output_dir}",
        *flags,
    )


@pytest.mark.slow
def test_cli_flags_reach_the_run_and_a_missing_split_exits_2(conll, tmp_path):
    # The real command line, so that every flag below must map onto NerArgs.
    output_dir = tmp_path / "cli"
    result = run_ner_cli(conll, output_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert os.path.exists(output_dir / "eval_results.txt")
    predicted = read_conll_columns(output_dir / "test_predictions.txt")
    assert len(predicted) == 10 and all(len(row) == 3 for sentence in predicted for row in sentence)

    missing = run_module_cli(
        "bert_tf.run_ner",
        f"--data_dir={tmp_path / 'nowhere'}",
        "--do_eval",
        f"--init_checkpoint={conll['model_dir']}",
        f"--output_dir={tmp_path / 'bad'}",
    )
    assert missing.returncode == 2 and "nowhere/dev.txt" in missing.stderr + missing.stdout


@pytest.mark.slow
def test_cli_feature_based_trains_a_bilstm_on_a_frozen_encoder(conll, tmp_path):
    """--feature_based: the encoder comes out bit for bit as it went in, under heavy weight decay."""
    output_dir = tmp_path / "features"
    result = run_ner_cli(
        conll,
        output_dir,
        "--feature_based",
        "--features=sum_all",
        "--lstm_units=8",
        "--weight_decay=0.5",
        "--learning_rate=1e-2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    spec = models.read_task_spec(ModelDir(str(output_dir)))
    assert (spec.head, spec.lstm_units, spec.features) == ("bilstm", 8, "sum_all")
    for name in ("eval_results.txt", "eval_predictions.txt", "test_predictions.txt"):
        assert os.path.exists(output_dir / name), name
    before = checkpoint_values(conll["model_dir"], "encoder")
    after = checkpoint_values(str(output_dir), "encoder")
    assert len(before) > 20 and set(after) == set(before)
    for key, value in before.items():
        np.testing.assert_array_equal(after[key], value, err_msg=key)
    # The head did train: the scalar mix moved off its initial equal weights.
    model, *_ = models.load_task_model(ModelDir(str(output_dir)))
    mix_weights = model.get_layer("encoder_features").mix_weights.numpy()
    # sum_all mixes the 2 transformer layers (the paper's row), not the embeddings.
    assert mix_weights.shape == (2,) and np.abs(mix_weights).max() > 1e-3

    unknown = run_module_cli(
        "bert_tf.run_ner",
        f"--data_dir={conll['data_dir']}",
        "--do_eval",
        "--feature_based",
        "--features=middle",
        f"--output_dir={tmp_path / 'bad'}",
    )
    assert unknown.returncode == 2 and "--features" in unknown.stderr + unknown.stdout


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(feature_based=True), "--feature_based needs --features"),
        (dict(features="last"), "--features applies to --feature_based only"),
        (dict(feature_based=True, features="middle"), "--features=middle is not one of"),
        (dict(feature_based=True, features="last", head="dense"), "--head=dense contradicts"),
        (dict(head="crf"), "--head=crf is not one of dense, bilstm"),
        (dict(lstm_units=0), "--lstm_units must be positive, got 0"),
        (dict(lstm_units=64), "--lstm_units sizes a BiLSTM: it needs --head=bilstm or --feature"),
    ],
)
def test_head_and_feature_flags_are_checked(fields, message):
    args = run_ner.NerArgs(output_dir="out", do_eval=True, **fields)
    with pytest.raises(io_utils.UsageError, match=message):
        args.validate()


def test_feature_based_implies_the_bilstm_head():
    args = run_ner.NerArgs(feature_based=True, features="last", lstm_units=4)
    assert args.head_fields() == dict(head="bilstm", lstm_units=4, features="last")
    # An explicit --head=bilstm agrees with --feature_based.
    run_ner.NerArgs(
        output_dir="out", do_eval=True, feature_based=True, features="last", head="bilstm"
    ).validate()
    assert run_ner.NerArgs(head="bilstm").head_fields() == dict(head="bilstm", lstm_units=768)
    assert run_ner.NerArgs().head_fields() == dict(head="dense", lstm_units=768)


def test_feature_based_defaults_hold_the_rate_and_drop_out_nothing_before_the_output_layer():
    frozen = dict(output_dir="out", do_train=True, feature_based=True, features="last")
    config = run_ner.NerArgs(**frozen).finetune_config()
    assert (config.lr_decay_power, config.head_dropout) == (0.0, 0.0)
    given = run_ner.NerArgs(**frozen, lr_decay_power=1.0, head_dropout=0.1).finetune_config()
    assert (given.lr_decay_power, given.head_dropout) == (1.0, 0.1)
    # Fine-tuning keeps the original's linear decay and the config's dropout (None).
    tuned = run_ner.NerArgs(output_dir="out", do_train=True, head="bilstm").finetune_config()
    assert (tuned.lr_decay_power, tuned.head_dropout) == (1.0, None)
    with pytest.raises(io_utils.UsageError, match="--lr_decay_power must be at least 0"):
        run_ner.NerArgs(**frozen, lr_decay_power=-1.0).validate()


def test_restarts_rank_tagging_runs_by_entity_f1(conll, tmp_path):
    output_dir = tmp_path / "restarts"
    base = dict(
        data_dir=conll["data_dir"],
        init_checkpoint=conll["model_dir"],
        output_dir=str(output_dir),
        do_train=True,
        max_seq_length=24,
        train_batch_size=16,
        num_train_epochs=0.5,
        num_restarts=2,
    )
    with pytest.raises(io_utils.UsageError, match="it needs --do_eval"):
        run_ner.run(run_ner.NerArgs(**base))
    result = run_ner.run(run_ner.NerArgs(do_eval=True, **base))
    scores = [result.eval_results[f"restart_{i}_eval_f1"] for i in (1, 2)]
    assert result.eval_results["eval_f1"] == max(scores)
    assert (output_dir / "eval_predictions.txt").exists()
