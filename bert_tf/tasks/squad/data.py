"""SQuAD v1.1 and v2.0 data: examples and windowed features, as the original run_squad.py makes them.

- reading: the context is split on whitespace into doc tokens, with `char_to_word_offset` mapping
  each character to its token; a training answer must be found at its character offset (after
  whitespace clean-up), otherwise the question is counted and skipped;
- features: doc tokens are WordPiece-tokenized (`tok_to_orig_index`, `orig_to_tok_index`), the
  answer span is tightened to the tokenized answer text (`_improve_answer_span`), and the document
  is cut into windows of `max_seq_length - len(query) - 3` tokens every `doc_stride` tokens;
  `[CLS] query [SEP] window [SEP]`; a token belongs to the window where it has the most context;
  the labels point at [CLS] (0) for impossible questions and for windows that miss the answer.
Post-processing is in `postprocess.py`, the official evaluation in `metrics.py`.
"""

import collections
import dataclasses
import json

import numpy as np
import tensorflow as tf
from absl import logging

from bert_tf.runtime import io_utils
from bert_tf.tasks import data_files, packing

FIRST_UNIQUE_ID = 1000000000
# null_odds.json's value for a v2 question without any valid span (the original's sentinel size).
NO_SPAN_NULL_ODDS = 1e6


@dataclasses.dataclass
class SquadExample:
    """One question on one context, split into whitespace doc tokens.

    For training, `start_position`/`end_position` are doc-token indices of the answer (-1 when
    impossible). `answers` holds every gold answer text, for evaluation.
    """

    qas_id: str
    question_text: str
    doc_tokens: list
    orig_answer_text: str = ""
    start_position: int = -1
    end_position: int = -1
    is_impossible: bool = False
    answers: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class SquadFeature:
    """One window of one example, packed for the model, with the maps back to the doc tokens."""

    unique_id: int
    example_index: int
    doc_span_index: int
    tokens: list
    token_to_orig_map: dict  # feature token index -> doc token index (window tokens only)
    token_is_max_context: dict  # feature token index -> whether this window is its best
    input_ids: np.ndarray
    input_mask: np.ndarray
    segment_ids: np.ndarray
    start_position: int = 0
    end_position: int = 0
    is_impossible: bool = False


RawResult = collections.namedtuple("RawResult", ["unique_id", "start_logits", "end_logits"])


@dataclasses.dataclass
class ReadStats:
    """What reading skipped: answers not found at their offsets (training only)."""

    questions: int = 0
    skipped_answer_not_found: int = 0

    def summary(self):
        """One line for the log."""
        return (
            f"{self.questions} questions read, {self.skipped_answer_not_found} skipped because "
            "the answer text was not found at its offset"
        )


def is_whitespace(char):
    """The original's whitespace for doc tokens: space, tab, CR, LF and U+202F."""
    return char in " \t\r\n" or ord(char) == 0x202F


def split_doc_tokens(context):
    """(doc_tokens, char_to_word_offset): whitespace-split tokens and each character's token index."""
    doc_tokens, char_to_word_offset = [], []
    previous_is_whitespace = True
    for char in context:
        if is_whitespace(char):
            previous_is_whitespace = True
        else:
            if previous_is_whitespace:
                doc_tokens.append(char)
            else:
                doc_tokens[-1] += char
            previous_is_whitespace = False
        char_to_word_offset.append(len(doc_tokens) - 1)
    return doc_tokens, char_to_word_offset


def make_example(
    qas_id,
    question,
    context_tokens,
    char_to_word_offset,
    answers,
    is_impossible,
    is_training,
    stats,
    where,
):
    """A SquadExample, or None when a training answer is not found at its offset (counted in `stats`)."""
    stats.questions += 1
    example = SquadExample(
        qas_id=qas_id,
        question_text=question,
        doc_tokens=context_tokens,
        is_impossible=is_impossible,
        answers=[a["text"] for a in answers],
    )
    if not is_training or is_impossible:
        return example
    if not answers:
        raise data_files.DataFormatError(
            f"{where}: question {qas_id} has no answer and is not marked is_impossible"
        )
    # Training uses the first answer (SQuAD training questions have exactly one).
    answer_text, answer_start = answers[0]["text"], int(answers[0]["answer_start"])
    answer_end = answer_start + len(answer_text) - 1
    if answer_start < 0 or answer_end >= len(char_to_word_offset) or not answer_text:
        stats.skipped_answer_not_found += 1
        logging.warning("%s: answer of %s lies outside its context; skipped", where, qas_id)
        return None
    start, end = char_to_word_offset[answer_start], char_to_word_offset[answer_end]
    # The tokens at the offset must hold the answer (whitespace normalized); some SQuAD answers
    # are mis-aligned by annotation errors, and training on them would teach wrong spans.
    actual = " ".join(context_tokens[start : end + 1])
    expected = " ".join(answer_text.split())
    if expected not in actual:
        stats.skipped_answer_not_found += 1
        logging.warning(
            "%s: answer %r of %s not found at offset %d (found %r); skipped",
            where,
            answer_text,
            qas_id,
            answer_start,
            actual,
        )
        return None
    example.orig_answer_text, example.start_position, example.end_position = answer_text, start, end
    return example


def read_squad_json(path, is_training, version_2_with_negative=False):
    """Reads a SQuAD JSON file into (examples, ReadStats); a broken structure names the field."""
    io_utils.require_file(path, "SQuAD")
    with io_utils.open_text(path) as f:
        try:
            data = json.load(f)["data"]
        except (ValueError, KeyError, TypeError) as e:  # bad JSON, or bytes that are not UTF-8
            raise data_files.DataFormatError(f"{path}: not a SQuAD JSON file ({e!r})") from None
    examples, stats = [], ReadStats()
    for a, article in enumerate(data):
        for p, paragraph in enumerate(article.get("paragraphs", [])):
            where = f"{path}: data[{a}].paragraphs[{p}]"
            try:
                context = paragraph["context"]
                qas = paragraph["qas"]
            except KeyError as e:
                raise data_files.DataFormatError(f"{where}: missing field {e}") from None
            doc_tokens, char_to_word_offset = split_doc_tokens(context)
            for q, qa in enumerate(qas):
                try:
                    qas_id, question, answers = qa["id"], qa["question"], qa.get("answers", [])
                except KeyError as e:
                    raise data_files.DataFormatError(
                        f"{where}.qas[{q}]: missing field {e}"
                    ) from None
                is_impossible = (
                    bool(qa.get("is_impossible", False)) if version_2_with_negative else False
                )
                example = make_example(
                    qas_id,
                    question,
                    doc_tokens,
                    char_to_word_offset,
                    answers,
                    is_impossible,
                    is_training,
                    stats,
                    f"{where}.qas[{q}]",
                )
                if example is not None:
                    examples.append(example)
    if stats.skipped_answer_not_found:
        logging.warning("%s: %s", path, stats.summary())
    return examples, stats


def read_tfds(name, split, is_training, data_dir=None):
    """Reads tfds squad/v1.1 or squad/v2.0 into (examples, ReadStats, gold answers by question id)."""
    import tensorflow_datasets as tfds  # imported here: loading it is slow, and only this path needs it

    version_2 = name.endswith("v2.0")
    split = split.replace("dev", "validation")
    examples, stats, gold = [], ReadStats(), {}
    contexts = {}
    for record in tfds.as_numpy(
        tfds.load(name, split=split, data_dir=data_dir, shuffle_files=False)
    ):
        context = record["context"].decode("utf-8")
        if context not in contexts:  # questions on one paragraph share its doc tokens
            contexts[context] = split_doc_tokens(context)
        doc_tokens, char_to_word_offset = contexts[context]
        answers = [
            {"text": t.decode("utf-8"), "answer_start": int(s)}
            for t, s in zip(record["answers"]["text"], record["answers"]["answer_start"])
        ]
        qas_id = record["id"].decode("utf-8")
        is_impossible = (
            bool(record["is_impossible"]) if version_2 and "is_impossible" in record else False
        )
        gold[qas_id] = [a["text"] for a in answers]
        example = make_example(
            qas_id,
            record["question"].decode("utf-8"),
            doc_tokens,
            char_to_word_offset,
            answers,
            is_impossible,
            is_training,
            stats,
            f"tfds:{name}:{split}",
        )
        if example is not None:
            examples.append(example)
    return examples, stats, gold


def _improve_answer_span(doc_tokens, start, end, tokenizer, answer_text):
    """The smallest sub-span of [start, end] whose WordPiece tokens equal the tokenized answer, if any.

    Character offsets name whole words ("(1895-1943)"), while the answer may be part of one ("1895").
    """
    answer_pieces = " ".join(tokenizer.tokenize(answer_text))
    for new_start in range(start, end + 1):
        for new_end in range(end, new_start - 1, -1):
            if " ".join(doc_tokens[new_start : new_end + 1]) == answer_pieces:
                return new_start, new_end
    return start, end


def _doc_spans(num_tokens, max_tokens_for_doc, doc_stride):
    """(start, length) windows over `num_tokens` tokens, `doc_stride` apart, the last one reaching the end."""
    spans, start = [], 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens_for_doc)
        spans.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, doc_stride)
    return spans


def _is_max_context(spans, span_index, position):
    """Whether window `span_index` gives token `position` the most context (min of left/right, then length)."""
    best_score, best_index = None, None
    for index, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_index = score, index
    return best_index == span_index


def convert_examples(
    examples,
    tokenizer,
    max_seq_length=384,
    doc_stride=128,
    max_query_length=64,
    is_training=False,
    first_unique_id=FIRST_UNIQUE_ID,
):
    """Windows every example into SquadFeatures, as the original convert_examples_to_features."""
    cls_id, sep_id = tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"]
    features = []
    unique_id = first_unique_id
    for example_index, example in enumerate(examples):
        query_tokens = tokenizer.tokenize(example.question_text)[:max_query_length]
        tok_to_orig_index, orig_to_tok_index, all_doc_tokens = [], [], []
        for i, token in enumerate(example.doc_tokens):
            orig_to_tok_index.append(len(all_doc_tokens))
            for piece in tokenizer.tokenize(token):
                tok_to_orig_index.append(i)
                all_doc_tokens.append(piece)

        tok_start = tok_end = -1
        if is_training and not example.is_impossible:
            tok_start = orig_to_tok_index[example.start_position]
            if example.end_position < len(example.doc_tokens) - 1:
                tok_end = orig_to_tok_index[example.end_position + 1] - 1
            else:
                tok_end = len(all_doc_tokens) - 1
            tok_start, tok_end = _improve_answer_span(
                all_doc_tokens, tok_start, tok_end, tokenizer, example.orig_answer_text
            )

        max_tokens_for_doc = max_seq_length - len(query_tokens) - 3  # [CLS], [SEP], [SEP]
        if max_tokens_for_doc <= 0:
            raise io_utils.UsageError(
                f"max_seq_length={max_seq_length} leaves no room for the document after a query of "
                f"{len(query_tokens)} tokens; lower --max_query_length or raise --max_seq_length"
            )
        spans = _doc_spans(len(all_doc_tokens), max_tokens_for_doc, doc_stride)
        query_ids = tokenizer.convert_tokens_to_ids(query_tokens)
        doc_offset = len(query_tokens) + 2  # the window's first token follows [CLS] query [SEP]
        for span_index, (span_start, span_length) in enumerate(spans):
            window = all_doc_tokens[span_start : span_start + span_length]
            tokens = ["[CLS]"] + query_tokens + ["[SEP]"] + window + ["[SEP]"]
            token_to_orig_map, token_is_max_context = {}, {}
            for i in range(span_length):
                token_to_orig_map[doc_offset + i] = tok_to_orig_index[span_start + i]
                token_is_max_context[doc_offset + i] = _is_max_context(
                    spans, span_index, span_start + i
                )
            input_ids, input_mask, segment_ids = packing.pack_segments(
                [query_ids, tokenizer.convert_tokens_to_ids(window)], max_seq_length, cls_id, sep_id
            )

            start_position = end_position = 0  # [CLS]: no answer in this window
            if is_training and not example.is_impossible:
                span_end = span_start + span_length - 1
                if span_start <= tok_start and tok_end <= span_end:
                    start_position = tok_start - span_start + doc_offset
                    end_position = tok_end - span_start + doc_offset
            features.append(
                SquadFeature(
                    unique_id=unique_id,
                    example_index=example_index,
                    doc_span_index=span_index,
                    tokens=tokens,
                    token_to_orig_map=token_to_orig_map,
                    token_is_max_context=token_is_max_context,
                    input_ids=input_ids,
                    input_mask=input_mask,
                    segment_ids=segment_ids,
                    start_position=start_position,
                    end_position=end_position,
                    is_impossible=example.is_impossible,
                )
            )
            unique_id += 1
    return features


def feature_arrays(features, is_training):
    """The features as arrays for records or tf.data: unique_ids, input_ids, input_mask, segment_ids
    and, for training, start_positions, end_positions, is_impossible."""
    arrays = {
        "unique_ids": np.array([f.unique_id for f in features], np.int64),
        "input_ids": np.stack([f.input_ids for f in features])
        if features
        else np.zeros((0, 0), np.int32),
        "input_mask": np.stack([f.input_mask for f in features])
        if features
        else np.zeros((0, 0), np.int32),
        "segment_ids": np.stack([f.segment_ids for f in features])
        if features
        else np.zeros((0, 0), np.int32),
    }
    if is_training:
        arrays["start_positions"] = np.array([f.start_position for f in features], np.int32)
        arrays["end_positions"] = np.array([f.end_position for f in features], np.int32)
        arrays["is_impossible"] = np.array([int(f.is_impossible) for f in features], np.int32)
    return arrays


def feature_spec(input_shape, has_labels):
    """The tf.io.parse_example spec of SQuAD records (the original run_squad schema); `input_shape`
    is [max_seq_length], and `has_labels` adds start_positions, end_positions and is_impossible."""
    spec = {"unique_ids": tf.io.FixedLenFeature([], tf.int64)}
    spec.update(
        {
            name: tf.io.FixedLenFeature(list(input_shape), tf.int64)
            for name in packing.MODEL_INPUT_NAMES
        }
    )
    if has_labels:
        for name in ("start_positions", "end_positions", "is_impossible"):
            spec[name] = tf.io.FixedLenFeature([], tf.int64)
    return spec


def write_records(path, features, is_training):
    """Writes SquadFeatures to a TFRecord file atomically; returns the number of records."""
    return packing.write_records(path, feature_arrays(features, is_training))
