"""SQuAD: reading real-format JSON, windowed features, post-processing and the official evaluation."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from bert_tf.tasks import data_files, packing
from bert_tf.tasks.squad import data as squad
from bert_tf.tasks.squad import metrics as squad_metrics
from bert_tf.tasks.squad import postprocess as squad_postprocess
from bert_tf.tokenization import python_tokenizer

CONTEXT = (
    "The Norman conquest of England began in 1066. William (1028-1087) led it, and "
    "the Anglo-Saxon king Harold Godwinson died at Hastings on 14 October."
)


def squad_json(version_2=True):
    """A small SQuAD file in the real layout: answerable, impossible, and mis-aligned questions."""
    qas = [
        {
            "id": "q-year",
            "question": "When did the conquest begin?",
            "answers": [{"text": "1066", "answer_start": CONTEXT.index("1066")}],
            "is_impossible": False,
        },
        {
            "id": "q-born",
            "question": "When was William born?",
            "answers": [{"text": "1028", "answer_start": CONTEXT.index("1028")}],
            "is_impossible": False,
        },
        {
            "id": "q-bad",
            "question": "Who was king?",
            "answers": [{"text": "Harold", "answer_start": 3}],
            "is_impossible": False,
        },
        {
            "id": "q-none",
            "question": "Who won at Waterloo?",
            "answers": [],
            "plausible_answers": [{"text": "William", "answer_start": CONTEXT.index("William")}],
            "is_impossible": True,
        },
    ]
    if not version_2:
        qas = [dict(qa, is_impossible=False) for qa in qas if qa["answers"]]
    return {
        "version": "v2.0" if version_2 else "1.1",
        "data": [{"title": "Norman_conquest", "paragraphs": [{"context": CONTEXT, "qas": qas}]}],
    }


@pytest.fixture(scope="module")
def tokenizer(real_vocab):
    return python_tokenizer.FullTokenizer(real_vocab, do_lower_case=True)


@pytest.fixture()
def squad_file(tmp_path):
    path = str(tmp_path / "train-v2.0.json")
    with open(path, "w") as f:
        json.dump(squad_json(), f)
    return path


def test_doc_tokens_and_char_offsets():
    tokens, offsets = squad.split_doc_tokens("  Hi there\u202fyou\n")
    assert tokens == ["Hi", "there", "you"]
    # Whitespace maps to the token before it (-1 before the first one), as in the original.
    assert offsets == [-1, -1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2]


def test_read_training_file_skips_and_counts_misaligned_answers(squad_file):
    examples, stats = squad.read_squad_json(
        squad_file, is_training=True, version_2_with_negative=True
    )
    assert [e.qas_id for e in examples] == ["q-year", "q-born", "q-none"]
    assert stats.questions == 4 and stats.skipped_answer_not_found == 1
    assert "1 skipped" in stats.summary()
    year = examples[0]
    assert (
        year.doc_tokens[year.start_position] == "1066." and year.start_position == year.end_position
    )
    born = examples[1]
    assert born.doc_tokens[born.start_position] == "(1028-1087)"
    none = examples[2]
    assert none.is_impossible and none.start_position == -1 and none.answers == []


def test_read_for_prediction_keeps_every_question(squad_file):
    examples, stats = squad.read_squad_json(
        squad_file, is_training=False, version_2_with_negative=True
    )
    assert len(examples) == 4 and stats.skipped_answer_not_found == 0
    assert examples[2].answers == ["Harold"]


def test_missing_file_and_broken_json(tmp_path):
    from bert_tf.runtime import io_utils

    with pytest.raises(io_utils.UsageError, match="dev-v1.1.json"):
        squad.read_squad_json(str(tmp_path / "dev-v1.1.json"), is_training=False)
    path = tmp_path / "broken.json"
    path.write_text('{"data": [{"paragraphs": [{"qas": []}]}]}')
    with pytest.raises(
        data_files.DataFormatError, match=r"data\[0\]\.paragraphs\[0\]: missing field 'context'"
    ):
        squad.read_squad_json(str(path), is_training=True)
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(data_files.DataFormatError, match="not a SQuAD JSON file"):
        squad.read_squad_json(str(path), is_training=True)


def test_a_byte_order_mark_is_skipped(tmp_path):
    path = tmp_path / "train-v2.0.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(squad_json()).encode())
    examples, _ = squad.read_squad_json(str(path), is_training=False, version_2_with_negative=True)
    assert examples and set(squad_metrics.gold_answers_from_json(str(path))) == {
        e.qas_id for e in examples
    }


def test_training_windows_label_the_answer_or_cls(squad_file, tokenizer):
    examples, _ = squad.read_squad_json(squad_file, is_training=True, version_2_with_negative=True)
    # Short windows so that each example spans several; 24 - query - 3 tokens of document each.
    features = squad.convert_examples(
        examples, tokenizer, max_seq_length=24, doc_stride=5, max_query_length=8, is_training=True
    )
    cls_id = tokenizer.vocab["[CLS]"]
    by_example = {}
    for feature in features:
        by_example.setdefault(feature.example_index, []).append(feature)
        assert feature.input_ids[0] == cls_id
        assert len(feature.tokens) == feature.input_mask.sum()
        assert (
            tokenizer.convert_ids_to_tokens(feature.input_ids[: len(feature.tokens)])
            == feature.tokens
        )
    assert all(len(windows) > 2 for windows in by_example.values())

    for index, answer in ((0, "1066"), (1, "1028")):
        answer_pieces = tokenizer.tokenize(answer)
        windows = by_example[index]
        with_answer = [f for f in windows if f.start_position > 0]
        assert with_answer, "some window must hold the answer"
        for feature in windows:
            if feature.start_position > 0:
                # _improve_answer_span cut "1066." down to "1066", "(1028-1087)" down to "1028".
                assert (
                    feature.tokens[feature.start_position : feature.end_position + 1]
                    == answer_pieces
                )
            else:
                # A window that misses the answer points both labels at [CLS].
                assert feature.end_position == 0
                assert feature.tokens[0] == "[CLS]"

    impossible = by_example[2]
    assert all(
        f.start_position == 0 and f.end_position == 0 and f.is_impossible for f in impossible
    )

    # Every document piece is "max context" in exactly one window. Windows start every doc_stride
    # (5) pieces here, since each holds more than 5.
    for windows in by_example.values():
        owners = {}
        for feature in windows:
            first = feature.tokens.index("[SEP]") + 1
            for position in range(first, len(feature.tokens) - 1):
                piece = feature.doc_span_index * 5 + position - first
                owners[piece] = owners.get(piece, 0) + feature.token_is_max_context[position]
        assert set(owners.values()) == {1}


def test_window_positions_follow_doc_stride():
    assert squad._doc_spans(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
    assert squad._doc_spans(3, 4, 3) == [(0, 3)]
    # Windows 0-5, 2-7, 4-9. Score = min(left, right) + 0.01 * length:
    # token 4: 0-5 -> min(4, 1) = 1; 2-7 -> min(2, 3) = 2 (best); 4-9 -> 0.
    # token 3: 0-5 -> min(3, 2) = 2 (best); 2-7 -> min(1, 4) = 1.
    # token 6: 2-7 -> min(4, 1) = 1; 4-9 -> min(2, 3) = 2 (best).
    spans = squad._doc_spans(10, 6, 2)
    assert spans == [(0, 6), (2, 6), (4, 6)]
    assert [squad._is_max_context(spans, i, 4) for i in range(3)] == [False, True, False]
    assert [squad._is_max_context(spans, i, 3) for i in range(2)] == [True, False]
    assert [squad._is_max_context(spans, i, 6) for i in (1, 2)] == [False, True]
    # A tie goes to the earlier window: token 3 of windows 0-3 and 3-6 scores 0 in both.
    assert squad._is_max_context([(0, 4), (3, 4)], 0, 3)


def test_get_final_text():
    assert squad_postprocess.get_final_text("steve smith", "Steve Smith's", True) == "Steve Smith"
    assert squad_postprocess.get_final_text("1066", "1066.", True) == "1066"
    assert squad_postprocess.get_final_text("cafe", "Café", True) == "Café"
    # When the prediction is not found in the tokenized span, the whole span is the answer.
    assert squad_postprocess.get_final_text("zzz", "Hastings", True) == "Hastings"


def logits_for(feature, start, end, span_score=5.0, null_score=0.0):
    """Logits that put `span_score` on (start, end) of one feature and `null_score` on [CLS]."""
    start_logits = np.full(len(feature.input_ids), -10.0)
    end_logits = np.full(len(feature.input_ids), -10.0)
    start_logits[0] = end_logits[0] = null_score / 2
    if start is not None:
        start_logits[start] = end_logits[end] = span_score / 2
    return squad.RawResult(feature.unique_id, start_logits, end_logits)


def test_postprocess_maps_logits_back_to_the_original_text(squad_file, tokenizer, tmp_path):
    examples, _ = squad.read_squad_json(squad_file, is_training=False, version_2_with_negative=True)
    examples = examples[:2] + examples[3:]  # q-year, q-born, q-none
    features = squad.convert_examples(
        examples, tokenizer, max_seq_length=24, doc_stride=5, max_query_length=8
    )
    results = []
    # q-born is answered wrongly on purpose; q-none gets a span too, but a stronger null score.
    targets = {0: tokenizer.tokenize("1066")[0], 1: "william", 2: "william"}
    for feature in features:
        target = targets.get(feature.example_index)
        position = None
        # The target's piece inside the window (not in the query), where the window is its best.
        for position_in_window, token in enumerate(feature.tokens):
            if token == target and feature.token_is_max_context.get(position_in_window):
                position = position_in_window
        # q-none: every window prefers [CLS] (null 6 > span 5).
        null = 6.0 if feature.example_index == 2 else -4.0
        width = len(tokenizer.tokenize("1066")) if feature.example_index == 0 else 1  # 106 ##6
        end = position + width - 1 if position is not None else None
        if end is not None and end >= len(feature.tokens) - 1:
            position = end = None  # the answer's pieces straddle this window's end
        results.append(logits_for(feature, position, end, null_score=null))

    predictions, nbest, null_odds = squad_postprocess.postprocess(
        examples, features, results, n_best_size=5, version_2_with_negative=True
    )
    assert predictions == {"q-year": "1066", "q-born": "William", "q-none": ""}
    # The null score kept is the smallest over windows (-4), the best span 5: odds -9.
    assert null_odds["q-year"] == pytest.approx(-9.0)
    assert null_odds["q-none"] == pytest.approx(6.0 - 5.0)
    for entries in nbest.values():
        assert sum(e["probability"] for e in entries) == pytest.approx(1.0)
        assert len(entries) <= 6
    assert nbest["q-year"][0]["text"] == "1066"

    # A threshold above the null odds of q-year still answers it; below, answers "".
    strict, _, _ = squad_postprocess.postprocess(
        examples, features, results, version_2_with_negative=True, null_score_diff_threshold=-10.0
    )
    assert strict["q-year"] == ""

    v1, _, v1_odds = squad_postprocess.postprocess(
        examples[:2],
        features[: sum(f.example_index < 2 for f in features)],
        results,
        version_2_with_negative=False,
    )
    assert v1 == {"q-year": "1066", "q-born": "William"} and v1_odds == {}

    paths = squad_postprocess.write_predictions(str(tmp_path), predictions, nbest, null_odds)
    assert sorted(os.listdir(tmp_path)) == sorted(
        [
            "null_odds.json",
            "nbest_predictions.json",
            "predictions.json",
            os.path.basename(squad_file),
        ]
    )
    with open(paths["predictions"]) as f:
        assert json.load(f) == predictions


def test_features_round_trip_through_records(squad_file, tokenizer, tmp_path):
    examples, _ = squad.read_squad_json(squad_file, is_training=True, version_2_with_negative=True)
    features = squad.convert_examples(
        examples, tokenizer, max_seq_length=32, doc_stride=8, is_training=True
    )
    path = str(tmp_path / "train.tf_record")
    assert squad.write_records(path, features, is_training=True) == len(features)
    batch = next(
        iter(
            packing.records_dataset(
                path,
                squad.feature_spec([32], has_labels=True),
                batch_size=len(features),
                is_training=False,
            )
        )
    )
    np.testing.assert_array_equal(
        batch["input_word_ids"], np.stack([f.input_ids for f in features])
    )
    assert batch["start_positions"].numpy().tolist() == [f.start_position for f in features]
    assert batch["unique_ids"].numpy().tolist() == [f.unique_id for f in features]


def test_normalize_answer():
    assert squad_metrics.normalize_answer("The  Quick, brown-fox!") == "quick brownfox"
    assert squad_metrics.normalize_answer("an apple a day") == "apple day"
    assert squad_metrics.normalize_answer("Theater") == "theater"  # articles only as whole words


def test_official_evaluation_on_hand_made_predictions():
    gold = {
        "q1": ["Denver Broncos", "The Denver Broncos"],
        "q2": ["Carolina Panthers"],
        "q3": ["Santa Clara, California"],
        "q4": [],
        "q5": [],
    }
    predictions = {
        "q1": "denver broncos!",
        "q2": "the Panthers",
        "q3": "Levi's Stadium in Santa Clara",
        "q4": "",
        "q5": "something",
    }
    # q1: normalized equal to both golds: EM 1, F1 1.
    # q2: "panthers" vs "carolina panthers": EM 0; common 1, P 1/1, R 1/2 -> F1 2/3.
    # q3: "levis stadium in santa clara" (5) vs "santa clara california" (3): common 2,
    #     P 2/5, R 2/3 -> F1 = 2 * (4/15) / (16/15) = 1/2.
    # q4: no answer, predicted "": EM 1, F1 1.   q5: no answer, predicted text: 0, 0.
    result = squad_metrics.evaluate_v2(gold, predictions)
    assert result["total"] == 5
    assert result["exact"] == pytest.approx(100 * 2 / 5)
    assert result["f1"] == pytest.approx(100 * (1 + 2 / 3 + 1 / 2 + 1 + 0) / 5)
    assert result["HasAns_exact"] == pytest.approx(100 / 3)
    assert result["HasAns_f1"] == pytest.approx(100 * (1 + 2 / 3 + 1 / 2) / 3)
    assert result["HasAns_total"] == 3 and result["NoAns_total"] == 2
    assert result["NoAns_exact"] == pytest.approx(50.0) and result["NoAns_f1"] == pytest.approx(
        50.0
    )

    null_odds = {"q1": -5.0, "q2": -1.0, "q3": 2.0, "q4": 3.0, "q5": 0.5}
    result = squad_metrics.evaluate_v2(
        gold, predictions, null_odds=null_odds, null_odds_threshold=1.0
    )
    # Above the threshold (q3, q4) the answer becomes "": q3 F1 1/2 -> 0, q4 stays 1.
    assert result["exact"] == pytest.approx(40.0)
    assert result["f1"] == pytest.approx(100 * (1 + 2 / 3 + 0 + 1 + 0) / 5)
    # Best thresholds: start with every question answered "" (2 right: q4, q5), then answer them in
    # order of null odds q1 (-5), q2 (-1), q5 (0.5), q3 (2), q4 (3):
    #   exact: 2 -> q1 +1 = 3 (best, -5) -> q2 +0 -> q5 -1 -> q3 +0 -> q4 +0: 3/5 at -5.
    #   f1:    2 -> q1 +1 = 3 -> q2 +2/3 = 3.667 (best, -1) -> q5 -1 -> q3 +1/2 -> q4 +0: 3.667/5 at -1.
    assert result["best_exact"] == pytest.approx(60.0) and result["best_exact_thresh"] == -5.0
    assert (
        result["best_f1"] == pytest.approx(100 * (3 + 2 / 3) / 5)
        and result["best_f1_thresh"] == -1.0
    )


def test_v1_evaluation_counts_missing_predictions_as_wrong():
    gold = {"a": ["Paris"], "b": ["the Seine", "Seine river"]}
    # a: EM 1, F1 1.  b: missing -> 0, 0.
    result = squad_metrics.evaluate_v1(gold, {"a": "paris."})
    assert result == pytest.approx(
        {"exact_match": 50.0, "f1": 50.0}
    )  # evaluate-v1.1.py's keys, no more


def test_v2_breakdowns_appear_whenever_their_questions_do():
    """evaluate-v2.0.py prints HasAns_* whenever a question has an answer and NoAns_* whenever one has none."""
    answerable = squad_metrics.evaluate_v2(
        {"a": ["Paris"], "b": ["Seine"]}, {"a": "Paris", "b": "Loire"}
    )
    assert answerable == pytest.approx(
        {
            "exact": 50.0,
            "f1": 50.0,
            "total": 2,
            "HasAns_exact": 50.0,
            "HasAns_f1": 50.0,
            "HasAns_total": 2,
        }
    )
    assert list(answerable) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total"]
    unanswerable = squad_metrics.evaluate_v2({"a": [], "b": []}, {"a": "", "b": "Loire"})
    assert unanswerable == pytest.approx(
        {
            "exact": 50.0,
            "f1": 50.0,
            "total": 2,
            "NoAns_exact": 50.0,
            "NoAns_f1": 50.0,
            "NoAns_total": 2,
        }
    )


def test_v1_and_v2_differ_where_a_gold_answer_normalizes_to_nothing():
    # Gold "The" normalizes to "". v1.1 keeps it: "" matches exactly, but its F1 of two empty answers
    # is 0. v2.0 scores against "" instead, with F1 1, and still counts the question as answerable.
    gold, predictions = {"q": ["The"]}, {"q": "a"}
    assert squad_metrics.evaluate_v1(gold, predictions) == pytest.approx(
        {"exact_match": 100.0, "f1": 0.0}
    )
    assert squad_metrics.evaluate_v2(gold, predictions) == pytest.approx(
        {
            "exact": 100.0,
            "f1": 100.0,
            "total": 1,
            "HasAns_exact": 100.0,
            "HasAns_f1": 100.0,
            "HasAns_total": 1,
        }
    )


def test_gold_answers_from_json(squad_file):
    gold = squad_metrics.gold_answers_from_json(squad_file)
    assert gold["q-year"] == ["1066"] and gold["q-none"] == []


def test_tfds_squad_with_mock_data(tokenizer):
    import tensorflow_datasets as tfds

    def as_dataset(self, split, *args, **kwargs):
        contexts = [CONTEXT.encode(), CONTEXT.encode()]
        return tf.data.Dataset.from_tensor_slices(
            {
                "id": [b"t1", b"t2"],
                "title": [b"Norman", b"Norman"],
                "context": contexts,
                "question": [b"When did it begin?", b"Who died?"],
                "answers": {
                    "text": tf.ragged.constant([[b"1066"], [b"Harold Godwinson", b"Harold"]]),
                    "answer_start": tf.ragged.constant(
                        [[CONTEXT.index("1066")], [CONTEXT.index("Harold")] * 2]
                    ),
                },
            }
        ).map(lambda x: dict(x, answers={k: v for k, v in x["answers"].items()}))

    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        examples, stats, gold = squad.read_tfds("squad/v1.1", "train", is_training=True)
    assert [e.qas_id for e in examples] == ["t1", "t2"] and stats.skipped_answer_not_found == 0
    assert gold == {"t1": ["1066"], "t2": ["Harold Godwinson", "Harold"]}
    assert examples[1].orig_answer_text == "Harold Godwinson"
    assert examples[0].doc_tokens is examples[1].doc_tokens  # one paragraph, tokenized once
