"""The official SQuAD evaluation, with the official scripts' key names.

evaluate-v1.1.py's `exact_match` and `f1` (`evaluate_v1`), and evaluate-v2.0.py's `exact`, `f1`,
`total`, the `HasAns_*` / `NoAns_*` breakdowns and the best no-answer thresholds (`evaluate_v2`).
Both normalize answers alike; they differ where a gold answer normalizes to nothing (v2.0 drops it,
v1.1 keeps it, and its F1 of two empty answers is 0, not 1).
"""

import collections
import json
import math
import re
import string

from absl import logging

from bert_tf.runtime import io_utils

# ---------------------------------------------------------------------------------------------
# The official evaluation.
# ---------------------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text):
    """Lower-cases and removes punctuation, the articles a/an/the and extra whitespace."""
    text = "".join(c for c in text.lower() if c not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction, gold):
    """1 if the normalized answers are equal, else 0."""
    return int(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction, gold, both_empty=1.0):
    """Token-overlap F1 of the normalized answers (`both_empty` when both are empty, 0 when one is)."""
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        # v2.0 scores "no answer" against "no answer" as a match (1); v1.1 scores every empty side 0.
        return both_empty if pred_tokens == gold_tokens else 0.0
    common = sum((collections.Counter(pred_tokens) & collections.Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def gold_answers_from_json(path_or_data):
    """Question id -> gold answer texts from a SQuAD JSON file (or its parsed dict)."""
    data = path_or_data
    if isinstance(path_or_data, str):
        with io_utils.open_text(io_utils.require_file(path_or_data, "SQuAD")) as f:
            data = json.load(f)
    return {
        qa["id"]: [a["text"] for a in qa.get("answers", [])]
        for article in data["data"]
        for paragraph in article["paragraphs"]
        for qa in paragraph["qas"]
    }


def _best_threshold(predictions, scores, null_odds, has_answer):
    """(best score in %, its threshold): answering "" whenever null_odds exceeds the threshold."""
    score = best = sum(1 for q in scores if not has_answer[q])
    threshold = 0.0
    for qid in sorted(scores, key=lambda q: null_odds[q]):
        if has_answer[qid]:
            score += scores[qid]
        elif predictions.get(qid):
            score -= 1
        if score > best:
            best, threshold = score, null_odds[qid]
    return 100.0 * best / len(scores), threshold


def evaluate_v1(gold_answers, predictions):
    """The official SQuAD v1.1 evaluation (evaluate-v1.1.py): {"exact_match": %, "f1": %}.

    `gold_answers`: question id -> answer texts. A question with no prediction scores 0, as there.
    """
    exact_sum = f1_sum = 0.0
    missing = 0
    for qid, answers in gold_answers.items():
        if qid not in predictions:
            missing += 1
            continue
        # Every gold text counts, even one that normalizes to nothing (v2.0 drops those). The
        # script fails on a question without answers; here such a question scores 0.
        golds = answers or [""]
        exact_sum += max(exact_match(predictions[qid], g) for g in golds)
        f1_sum += max(f1(predictions[qid], g, both_empty=0.0) for g in golds)
    if missing:
        logging.warning(
            "%d of %d questions have no prediction; they score 0", missing, len(gold_answers)
        )
    total = len(gold_answers)
    return {
        "exact_match": 100.0 * exact_sum / total if total else 0.0,
        "f1": 100.0 * f1_sum / total if total else 0.0,
    }


def evaluate_v2(gold_answers, predictions, null_odds=None, null_odds_threshold=1.0):
    """The official SQuAD v2.0 evaluation (evaluate-v2.0.py), scores in %.

    `gold_answers`: question id -> answer texts ([]: no answer). A question with no prediction
    scores 0 (the script leaves it out of `total`, or fails). Returns exact, f1, total;
    HasAns_exact/f1/total when some question has an answer and NoAns_* when some has none; with
    `null_odds` (the script's na_prob file), the scores after `null_odds_threshold` and
    best_exact/best_f1 with their thresholds.
    """
    exact_scores, f1_scores, has_answer = {}, {}, {}
    missing = 0
    for qid, answers in gold_answers.items():
        # As the script: a question has an answer when its list is not empty, and it is scored
        # against the answers that do not normalize to nothing ("" when none is left).
        golds = [a for a in answers if normalize_answer(a)] or [""]
        has_answer[qid] = bool(answers)
        if qid not in predictions:
            missing += 1
            exact_scores[qid] = f1_scores[qid] = 0.0
            continue
        exact_scores[qid] = float(max(exact_match(predictions[qid], g) for g in golds))
        f1_scores[qid] = max(f1(predictions[qid], g) for g in golds)
    if missing:
        logging.warning(
            "%d of %d questions have no prediction; they score 0", missing, len(gold_answers)
        )
    raw_exact, raw_f1 = dict(exact_scores), dict(f1_scores)
    if null_odds is not None:
        # Questions whose null odds exceed the threshold are answered "" (right only without answer).
        for qid in exact_scores:
            if null_odds.get(qid, -math.inf) > null_odds_threshold:
                exact_scores[qid] = f1_scores[qid] = float(not has_answer[qid])

    def mean(scores, qids):
        return 100.0 * sum(scores[q] for q in qids) / len(qids) if qids else 0.0

    qids = list(gold_answers)
    result = collections.OrderedDict(
        exact=mean(exact_scores, qids), f1=mean(f1_scores, qids), total=len(qids)
    )
    has_ans = [q for q in qids if has_answer[q]]
    no_ans = [q for q in qids if not has_answer[q]]
    for prefix, subset in (("HasAns", has_ans), ("NoAns", no_ans)):
        if subset:  # each breakdown whenever it has questions, as the script
            result[f"{prefix}_exact"] = mean(exact_scores, subset)
            result[f"{prefix}_f1"] = mean(f1_scores, subset)
            result[f"{prefix}_total"] = len(subset)
    if null_odds is not None and qids:
        odds = {q: null_odds.get(q, 0.0) for q in qids}
        # The thresholds are searched on the raw scores, as the official script does.
        result["best_exact"], result["best_exact_thresh"] = _best_threshold(
            predictions, raw_exact, odds, has_answer
        )
        result["best_f1"], result["best_f1_thresh"] = _best_threshold(
            predictions, raw_f1, odds, has_answer
        )
    return dict(result)
