"""SQuAD post-processing, as the original run_squad.py's: logits -> answer texts.

The `n_best_size` best starts x ends, at most `max_answer_length` long, are mapped back to the
original text (`get_final_text`); v2 compares the best null score with the best span
(`null_score_diff_threshold`).
"""

import collections
import math
import os

import numpy as np

from bert_tf.runtime import io_utils
from bert_tf.tasks.squad.data import NO_SPAN_NULL_ODDS
from bert_tf.tokenization import python_tokenizer

# ---------------------------------------------------------------------------------------------
# Post-processing: logits -> answer texts.
# ---------------------------------------------------------------------------------------------


def _best_indexes(logits, n_best_size):
    """Indices of the `n_best_size` largest logits, best first (stable on ties)."""
    logits = np.asarray(logits)
    return list(np.argsort(-logits, kind="stable")[:n_best_size])


def _without_spaces(text):
    """(text without spaces, map from its character indices to those of `text`)."""
    chars, index_map = [], {}
    for i, char in enumerate(text):
        if char == " ":
            continue
        index_map[len(chars)] = i
        chars.append(char)
    return "".join(chars), index_map


def get_final_text(pred_text, orig_text, do_lower_case):
    """Projects a normalized, de-WordPieced prediction back onto the original text's span.

    `pred_text` is lower-cased and accent-stripped, `orig_text` the original doc tokens of the
    span ("Steve Smith's"); the answer is the part of `orig_text` that `pred_text` matches
    ("Steve Smith"). Characters are aligned through the BasicTokenizer output of `orig_text` with
    spaces removed; when the alignment fails, the whole `orig_text` is returned, as the original.
    """
    tokenized = " ".join(
        python_tokenizer.BasicTokenizer(do_lower_case=do_lower_case).tokenize(orig_text)
    )
    start = tokenized.find(pred_text)
    if start == -1:
        return orig_text
    end = start + len(pred_text) - 1
    orig_chars, orig_map = _without_spaces(orig_text)
    tok_chars, tok_map = _without_spaces(tokenized)
    if len(orig_chars) != len(
        tok_chars
    ):  # the tokenizer changed characters (e.g. stripped accents)
        return orig_text
    tok_to_stripped = {spaced: stripped for stripped, spaced in tok_map.items()}
    if start not in tok_to_stripped or end not in tok_to_stripped:
        return orig_text
    orig_start = orig_map.get(tok_to_stripped[start])
    orig_end = orig_map.get(tok_to_stripped[end])
    if orig_start is None or orig_end is None:
        return orig_text
    return orig_text[orig_start : orig_end + 1]


def _softmax(scores):
    """Softmax of a list of floats, computed stably."""
    if not scores:
        return []
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


def postprocess(
    examples,
    features,
    results,
    n_best_size=20,
    max_answer_length=30,
    do_lower_case=True,
    version_2_with_negative=False,
    null_score_diff_threshold=0.0,
):
    """(predictions, nbest, null_odds) from the model's logits, as the original write_predictions.

    `results`: RawResults (unique_id, start_logits, end_logits) for every feature. predictions maps
    question id -> answer text ("" for no answer in v2); nbest maps it to the n best
    {text, probability, start_logit, end_logit}; null_odds (v2 only) maps it to
    null score - best span score.
    """
    by_unique_id = {int(r.unique_id): r for r in results}
    features_by_example = collections.defaultdict(list)
    for feature in features:
        features_by_example[feature.example_index].append(feature)

    predictions, nbest_json, null_odds = {}, {}, {}
    for example_index, example in enumerate(examples):
        candidates = []  # (score, feature, start, end, start_logit, end_logit)
        null_score, null_feature, null_logits = None, None, (0.0, 0.0)
        for feature in features_by_example[example_index]:
            if feature.unique_id not in by_unique_id:
                raise ValueError(
                    f"no model output for feature {feature.unique_id} of question {example.qas_id}"
                )
            result = by_unique_id[feature.unique_id]
            start_logits, end_logits = (
                np.asarray(result.start_logits),
                np.asarray(result.end_logits),
            )
            if version_2_with_negative:
                feature_null = float(start_logits[0] + end_logits[0])
                if (
                    null_score is None or feature_null < null_score
                ):  # the original keeps the smallest
                    null_score, null_feature = feature_null, feature
                    null_logits = (float(start_logits[0]), float(end_logits[0]))
            for start in _best_indexes(start_logits, n_best_size):
                for end in _best_indexes(end_logits, n_best_size):
                    if start >= len(feature.tokens) or end >= len(feature.tokens):
                        continue
                    if (
                        start not in feature.token_to_orig_map
                        or end not in feature.token_to_orig_map
                    ):
                        continue
                    if not feature.token_is_max_context.get(start, False) or end < start:
                        continue
                    if end - start + 1 > max_answer_length:
                        continue
                    candidates.append(
                        (
                            float(start_logits[start] + end_logits[end]),
                            feature,
                            start,
                            end,
                            float(start_logits[start]),
                            float(end_logits[end]),
                        )
                    )
        if version_2_with_negative and null_feature is not None:
            candidates.append((null_logits[0] + null_logits[1], null_feature, 0, 0) + null_logits)
        # Stable sort: among equal scores the earlier candidate wins, as in the original.
        candidates.sort(key=lambda c: c[0], reverse=True)

        nbest, seen = [], set()
        for _, feature, start, end, start_logit, end_logit in candidates:
            if len(nbest) >= n_best_size:
                break
            if start > 0:
                pieces = " ".join(feature.tokens[start : end + 1])
                pred_text = " ".join(pieces.replace(" ##", "").replace("##", "").strip().split())
                orig_tokens = example.doc_tokens[
                    feature.token_to_orig_map[start] : feature.token_to_orig_map[end] + 1
                ]
                text = get_final_text(pred_text, " ".join(orig_tokens), do_lower_case)
            else:
                text = ""
            if text in seen:
                continue
            seen.add(text)
            nbest.append((text, start_logit, end_logit))
        if version_2_with_negative and "" not in seen:
            nbest.append(("", null_logits[0], null_logits[1]))
        if not nbest:  # no valid span at all; the original's placeholder keeps the file well-formed
            nbest.append(("empty", 0.0, 0.0))

        probabilities = _softmax([s + e for _, s, e in nbest])
        nbest_json[example.qas_id] = [
            {"text": text, "probability": p, "start_logit": s, "end_logit": e}
            for (text, s, e), p in zip(nbest, probabilities)
        ]
        best_non_null = next(((t, s, e) for t, s, e in nbest if t), None)
        if not version_2_with_negative:
            predictions[example.qas_id] = nbest[0][0]
            continue
        if best_non_null is None:  # no valid span in any window: certainly no answer
            null_odds[example.qas_id] = NO_SPAN_NULL_ODDS
            predictions[example.qas_id] = ""
            continue
        score_diff = null_score - best_non_null[1] - best_non_null[2]
        null_odds[example.qas_id] = score_diff
        predictions[example.qas_id] = (
            "" if score_diff > null_score_diff_threshold else best_non_null[0]
        )
    return predictions, nbest_json, null_odds


def write_predictions(output_dir, predictions, nbest, null_odds=None):
    """Writes predictions.json, nbest_predictions.json and (v2) null_odds.json atomically; returns the paths."""
    paths = {
        "predictions": os.path.join(output_dir, "predictions.json"),
        "nbest": os.path.join(output_dir, "nbest_predictions.json"),
    }
    io_utils.atomic_write_json(paths["predictions"], predictions)
    io_utils.atomic_write_json(paths["nbest"], nbest)
    if null_odds is not None:
        paths["null_odds"] = os.path.join(output_dir, "null_odds.json")
        io_utils.atomic_write_json(paths["null_odds"], null_odds)
    return paths
