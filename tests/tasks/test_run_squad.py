"""python -m bert_tf.run_squad end to end on a small hand-written SQuAD file in the real format (v1.1 and v2.0)."""

import json
import os

import pytest
from helpers import run_module_cli, write_tiny_model_dir, write_vocab

from bert_tf import run_squad
from bert_tf.model.model_dir import ModelDir
from bert_tf.runtime import io_utils
from bert_tf.tasks import models
from bert_tf.tasks.squad import data as squad
from bert_tf.tasks.squad import metrics as squad_metrics
from bert_tf.tokenization import python_tokenizer

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

# Hand-written paragraphs and questions: (context, [(id, question, answer or None)]). A None
# answer is unanswerable (v2 only). The contexts are long enough to need several windows.
PARAGRAPHS = [
    (
        "The Amazon river flows through Brazil , Peru and Colombia . It carries more water than any other river "
        "on Earth . Its basin covers about seven million square kilometres , and the forest around it is home to "
        "millions of species .",
        [
            ("q1", "Which river carries the most water ?", "The Amazon river"),
            ("q2", "How large is the basin ?", "seven million square kilometres"),
            ("q3", "Who built the first bridge over the river ?", None),
        ],
    ),
    (
        "Marie Curie was born in Warsaw in 1867 . She moved to Paris to study physics and chemistry . She won the "
        "Nobel Prize twice , once in physics in 1903 and once in chemistry in 1911 .",
        [
            ("q4", "Where was Marie Curie born ?", "Warsaw"),
            ("q5", "When did she win the prize in chemistry ?", "1911"),
            ("q6", "What was her favourite food ?", None),
        ],
    ),
    (
        "The first telephone call was made by Alexander Graham Bell in 1876 . He spoke to his assistant Thomas "
        "Watson in the next room . The words were : Mr. Watson , come here , I want to see you .",
        [
            ("q7", "Who made the first telephone call ?", "Alexander Graham Bell"),
            ("q8", "Who was Bell's assistant ?", "Thomas Watson"),
            ("q9", "In which city did the call take place ?", None),
        ],
    ),
]
WRONG_OFFSET_ID = (
    "q10"  # its answer_start points at the wrong words: counted and skipped in training
)


def squad_json(version_2):
    """The SQuAD JSON dict: v1.1 leaves out the unanswerable questions, v2.0 marks them is_impossible."""
    paragraphs = []
    for context, questions in PARAGRAPHS:
        qas = []
        for qid, question, answer in questions:
            if answer is None and not version_2:
                continue
            qa = {
                "id": qid,
                "question": question,
                "answers": []
                if answer is None
                else [{"text": answer, "answer_start": context.index(answer)}],
            }
            if version_2:
                qa["is_impossible"] = answer is None
            qas.append(qa)
        paragraphs.append({"context": context, "qas": qas})
    paragraphs[0]["qas"].append(
        {
            "id": WRONG_OFFSET_ID,
            "question": "Which countries does it flow through ?",
            "answers": [{"text": "Brazil , Peru and Colombia", "answer_start": 3}],
            **({"is_impossible": False} if version_2 else {}),
        }
    )
    return {
        "version": "v2.0" if version_2 else "1.1",
        "data": [{"title": "Hand-written", "paragraphs": paragraphs}],
    }


@pytest.fixture(scope="module")
def squad_data(tmp_path_factory):
    """v1.1 and v2.0 files and a tiny model dir whose vocab covers them."""
    root = tmp_path_factory.mktemp("squad")
    files = {}
    for version_2 in (False, True):
        path = str(root / f"squad-{'v2' if version_2 else 'v1'}.json")
        io_utils.atomic_write_json(path, squad_json(version_2))
        files[version_2] = path
    texts = [c for c, _ in PARAGRAPHS] + [q for _, qs in PARAGRAPHS for _, q, _ in qs]
    vocab_file = write_vocab(
        str(root / "vocab.txt"), texts + ["Which countries does it flow through ?"]
    )
    return {
        "files": files,
        "model_dir": write_tiny_model_dir(root / "pretrained", vocab_file),
    }


WINDOWING = dict(max_seq_length=32, doc_stride=8, max_query_length=12)


def squad_args(squad_data, output_dir, version_2, **overrides):
    """Training and predicting on the same file, windows of 32 tokens every 8."""
    values = dict(
        train_file=squad_data["files"][version_2],
        predict_file=squad_data["files"][version_2],
        init_checkpoint=squad_data["model_dir"],
        output_dir=str(output_dir),
        do_train=True,
        do_predict=True,
        version_2_with_negative=version_2,
        train_batch_size=8,
        predict_batch_size=8,
        learning_rate=2e-3,
        num_train_epochs=160,
        steps_per_loop=50,
        n_best_size=5,
        seed=2,
        **WINDOWING,
    )
    values.update(overrides)
    return run_squad.SquadArgs(**values)


def load_json(path):
    with open(path) as f:
        return json.load(f)


@pytest.mark.slow
def test_squad_v1_trains_predicts_and_evaluates(squad_data, tmp_path, capsys):
    output_dir = tmp_path / "v1"
    result = run_squad.run(squad_args(squad_data, output_dir, version_2=False))
    out = capsys.readouterr().out
    assert "7 questions read, 1 skipped because the answer text was not found at its offset" in out
    assert result.step == int(6 / 8 * 160)  # steps count the usable questions, as the original
    # The tiny model memorizes its training questions (the loss starts near ln(32) = 3.5).
    assert result.train_metrics["loss"] < 0.5

    predictions = load_json(output_dir / "predictions.json")
    ids = ["q1", "q2", "q4", "q5", "q7", "q8", WRONG_OFFSET_ID]
    assert sorted(predictions) == sorted(ids)
    nbest = load_json(output_dir / "nbest_predictions.json")
    for qid in ids:
        entries = nbest[qid]
        assert 1 <= len(entries) <= 5 and entries[0]["text"] == predictions[qid]
        assert set(entries[0]) == {"text", "probability", "start_logit", "end_logit"}
        assert sum(e["probability"] for e in entries) == pytest.approx(1.0, abs=1e-6)
    assert not os.path.exists(output_dir / "null_odds.json")

    # The official metrics, checked against predictions.json with the data side's evaluation.
    results = result.eval_results
    gold = squad_metrics.gold_answers_from_json(squad_data["files"][False])
    # evaluate-v1.1.py's keys: exact_match and f1 (plus the step).
    assert set(results) == {"exact_match", "f1", "global_step"}
    assert results["exact_match"] == pytest.approx(
        squad_metrics.evaluate_v1(gold, predictions)["exact_match"]
    )
    assert results["f1"] == pytest.approx(squad_metrics.evaluate_v1(gold, predictions)["f1"])
    assert results["global_step"] == result.step
    # Most trained questions are answered (q7 and q8, on one paragraph, are the hardest to tell apart).
    assert results["exact_match"] >= 100 * 4 / 7, predictions
    with open(output_dir / "eval_results.txt") as f:
        assert {line.split(" = ")[0] for line in f} == {"exact_match", "f1", "global_step"}
    assert "  exact_match = " in out  # printed under "Eval results (official SQuAD metrics)"


@pytest.mark.slow
def test_squad_v2_handles_windows_without_the_answer_and_writes_null_odds(squad_data, tmp_path):
    # With 32-token windows every 8 tokens most windows of an answerable question miss its answer:
    # those train towards [CLS], like the unanswerable questions.
    source_tokenizer = python_tokenizer.FullTokenizer(
        os.path.join(squad_data["model_dir"], "vocab.txt")
    )
    examples, _ = squad.read_squad_json(
        squad_data["files"][True], is_training=True, version_2_with_negative=True
    )
    features = squad.convert_examples(examples, source_tokenizer, is_training=True, **WINDOWING)
    answerable = {i for i, e in enumerate(examples) if not e.is_impossible}
    missing = [f for f in features if f.example_index in answerable and f.start_position == 0]
    assert missing and len(missing) < sum(f.example_index in answerable for f in features)

    output_dir = tmp_path / "v2"
    result = run_squad.run(squad_args(squad_data, output_dir, version_2=True))
    assert result.train_metrics["loss"] < 0.5
    predictions = load_json(output_dir / "predictions.json")
    null_odds = load_json(output_dir / "null_odds.json")
    ids = [qid for _, qs in PARAGRAPHS for qid, _, _ in qs] + [WRONG_OFFSET_ID]
    assert sorted(predictions) == sorted(null_odds) == sorted(ids)
    # "" is predicted exactly where the null score beats the best span by more than the threshold (0).
    for qid in ids:
        assert (predictions[qid] == "") == (null_odds[qid] > 0.0)
    results = result.eval_results
    # evaluate-v2.0.py's keys, with the best thresholds (it computes them from null_odds.json).
    assert set(results) == {
        "exact",
        "f1",
        "total",
        "HasAns_exact",
        "HasAns_f1",
        "HasAns_total",
        "NoAns_exact",
        "NoAns_f1",
        "NoAns_total",
        "best_exact",
        "best_exact_thresh",
        "best_f1",
        "best_f1_thresh",
        "global_step",
    }
    assert results["HasAns_total"] == 7 and results["NoAns_total"] == 3
    assert results["exact"] >= 50.0, (
        predictions
    )  # mostly memorized, "no answer" for q3, q6, q9 included

    spec = models.read_task_spec(ModelDir(str(output_dir)))
    assert (
        spec.kind,
        spec.version_2_with_negative,
        spec.doc_stride,
        spec.max_query_length,
        spec.max_seq_length,
    ) == ("squad", True, 8, 12, 32)


def test_missing_predict_file_is_a_usage_error_naming_it(squad_data, tmp_path):
    with pytest.raises(io_utils.UsageError, match=r"--predict_file file not found: .*nope\.json"):
        run_squad.run(
            squad_args(
                squad_data, tmp_path / "out", False, predict_file=str(tmp_path / "nope.json")
            )
        )


def test_head_dropout_is_refused_where_no_dropout_reads_the_output(squad_data, tmp_path):
    with pytest.raises(io_utils.UsageError, match="--head_dropout: run_squad's output layer"):
        squad_args(squad_data, tmp_path / "out", False, head_dropout=0.1).validate()


@pytest.mark.slow
def test_cli_flags_reach_the_run_and_a_missing_file_exits_2(squad_data, tmp_path):
    # The real command line: every flag below must map onto SquadArgs (a typo'd flag name or a flag
    # of the wrong type fails here, not in the in-process tests above).
    output_dir = tmp_path / "cli"
    common = [
        f"--predict_file={squad_data['files'][True]}",
        f"--init_checkpoint={squad_data['model_dir']}",
        "--version_2_with_negative=true",
        "--max_seq_length=32",
        "--doc_stride=8",
        "--max_query_length=12",
        "--n_best_size=3",
        "--predict_batch_size=8",
    ]
    result = run_module_cli(
        "bert_tf.run_squad",
        f"--train_file={squad_data['files'][True]}",
        "--do_train",
        "--do_predict",
        "--num_train_epochs=2",
        "--train_batch_size=8",
        f"--output_dir={output_dir}",
        *common,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    predictions, null_odds = (
        load_json(output_dir / "predictions.json"),
        load_json(output_dir / "null_odds.json"),
    )
    assert sorted(predictions) == sorted(null_odds) and len(predictions) == 10
    # n_best_size spans, plus the null answer when it did not make the n best (v2, as the original)
    assert all(
        len(entries) <= 4 for entries in load_json(output_dir / "nbest_predictions.json").values()
    )
    assert models.read_task_spec(ModelDir(str(output_dir))).doc_stride == 8
    assert "--doc_stride=8" in open(output_dir / "run_squad.flags").read()

    missing = run_module_cli(
        "bert_tf.run_squad",
        "--do_predict",
        f"--output_dir={tmp_path / 'bad'}",
        f"--predict_file={tmp_path / 'nope.json'}",
        f"--init_checkpoint={squad_data['model_dir']}",
    )
    assert missing.returncode == 2 and "nope.json" in missing.stderr + missing.stdout


def test_restarts_rank_squad_runs_by_the_official_f1(squad_data, tmp_path):
    output_dir = tmp_path / "restarts"
    args = squad_args(squad_data, output_dir, False, num_train_epochs=2, num_restarts=2)
    with pytest.raises(io_utils.UsageError, match="it needs --do_predict"):
        run_squad.run(squad_args(squad_data, output_dir, False, num_restarts=2, do_predict=False))
    result = run_squad.run(args)
    scores = [result.eval_results[f"restart_{i}_f1"] for i in (1, 2)]
    assert result.eval_results["f1"] == max(scores)
    assert (output_dir / "predictions.json").exists()
