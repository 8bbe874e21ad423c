"""Named-entity tagging on CoNLL-2003-format files: reading, features, predictions.

Files: one token per line, whitespace-separated columns, the tag in the last column; blank lines
and `-DOCSTART-` lines end sentences. Tags are BIO (B-X starts an entity, I-X continues it) or
IOB1 (the CoNLL-2003 original: I-X starts an entity too, B-X only separates two adjacent entities
of one type); IOB1 is converted to BIO on reading, which keeps every entity as conlleval sees it.

Features: each word's first WordPiece carries its tag's id; the other pieces, [CLS], [SEP] and
padding carry IGNORE_LABEL, which the loss and the metrics skip. Words cut by max_seq_length are
predicted "O".

The entity metrics (conlleval's) are in `metrics.py`.
"""

import dataclasses

import numpy as np
import tensorflow as tf
from absl import logging

from bert_tf.runtime import io_utils
from bert_tf.tasks import data_files, packing
from bert_tf.tokenization import tokenizer_rules

# The label of the tokens no tag is predicted for ([CLS], [SEP], padding, a word's later pieces):
# the loss and the metrics skip them.
IGNORE_LABEL = -100
OUTSIDE = "O"


@dataclasses.dataclass
class Sentence:
    """The words and tags of one sentence, and where it starts (file:line)."""

    words: list
    tags: list
    source: str = ""


def _check_tag(tag, where):
    """A tag must be O, B-TYPE or I-TYPE."""
    if tag == OUTSIDE:
        return
    prefix, _, entity_type = tag.partition("-")
    if prefix not in ("B", "I") or not entity_type:
        raise data_files.DataFormatError(f"{where}: tag {tag!r} is not O, B-TYPE or I-TYPE")


def to_bio(tags):
    """Converts IOB1 (or BIO) tags to BIO: an I-X not following B-X/I-X becomes B-X."""
    converted, previous = [], OUTSIDE
    for tag in tags:
        if tag.startswith("I-") and (previous == OUTSIDE or previous[2:] != tag[2:]):
            tag = "B-" + tag[2:]
        converted.append(tag)
        previous = tag
    return converted


def read_conll(path):
    """Reads a CoNLL file into Sentences with BIO tags; a malformed line is an error naming file and line."""
    io_utils.require_file(path, "CoNLL")
    sentences, words, tags, start = [], [], [], None
    converted = 0

    def finish():
        nonlocal words, tags, converted
        if words:
            bio = to_bio(tags)
            converted += sum(a != b for a, b in zip(bio, tags))
            sentences.append(Sentence(words, bio, start))
        words, tags = [], []

    for line_number, line in data_files.decoded_lines(path):
        where = f"{path}:{line_number}"
        line = line.strip()
        if not line or line.startswith("-DOCSTART-"):
            finish()
            continue
        columns = line.split()
        if len(columns) < 2:
            raise data_files.DataFormatError(f"{where}: expected a token and a tag, got {line!r}")
        _check_tag(columns[-1], where)
        if not words:
            start = where
        words.append(columns[0])
        tags.append(columns[-1])
    finish()
    if converted:
        logging.info("%s: IOB1 tags converted to BIO (%d tags changed)", path, converted)
    return sentences


def label_list(sentences):
    """The tags of the training data: "O" first, then the others sorted."""
    found = {tag for s in sentences for tag in s.tags}
    return [OUTSIDE] + sorted(found - {OUTSIDE})


def check_labels(sentences, labels):
    """Raises a DataFormatError naming the sentence of the first tag not seen in training."""
    known = set(labels)
    for sentence in sentences:
        for tag in sentence.tags:
            if tag not in known:
                raise data_files.DataFormatError(
                    f"{sentence.source}: tag {tag!r} (in the sentence starting here) was never seen in "
                    f"training (training tags: {', '.join(labels)})"
                )


@dataclasses.dataclass
class NerFeatures:
    """Packed sentences: the model arrays plus, per sentence, the token position of each kept word."""

    arrays: dict
    word_positions: list  # per sentence: the first-piece position of each word kept in the window
    truncated_words: int = 0


def convert_sentences(sentences, tokenizer, max_seq_length, labels):
    """NerFeatures for `sentences`: input_ids, input_mask, segment_ids, label_ids int32 [n, max_seq_length].

    label_ids holds the word's tag id on its first piece and IGNORE_LABEL elsewhere (test tags may
    be anything when `labels` is None: all IGNORE_LABEL).
    """
    cls_id, sep_id = tokenizer.vocab["[CLS]"], tokenizer.vocab["[SEP]"]
    unk_id = tokenizer.vocab[tokenizer_rules.UNK_TOKEN]
    label_index = {label: i for i, label in enumerate(labels)} if labels is not None else None
    count = len(sentences)
    arrays = {
        name: np.zeros((count, max_seq_length), np.int32)
        for name in ("input_ids", "input_mask", "segment_ids")
    }
    arrays["label_ids"] = np.full((count, max_seq_length), IGNORE_LABEL, np.int32)
    word_positions, truncated = [], 0
    budget = max_seq_length - 2
    for row, sentence in enumerate(sentences):
        piece_ids, piece_labels, positions = [], [], []
        for word, tag in zip(sentence.words, sentence.tags):
            # A word the tokenizer drops entirely (a lone control character) still needs a slot.
            ids = tokenizer.encode(word) or [unk_id]
            if len(piece_ids) + len(ids) > budget:
                break
            positions.append(1 + len(piece_ids))  # after [CLS]
            piece_ids.extend(ids)
            tag_id = label_index[tag] if label_index is not None else IGNORE_LABEL
            piece_labels.extend([tag_id] + [IGNORE_LABEL] * (len(ids) - 1))
        truncated += len(sentence.words) - len(positions)
        arrays["input_ids"][row], arrays["input_mask"][row], arrays["segment_ids"][row] = (
            packing.pack_segments([piece_ids], max_seq_length, cls_id, sep_id)
        )
        arrays["label_ids"][row, 1 : 1 + len(piece_labels)] = piece_labels
        word_positions.append(positions)
    if truncated:
        logging.warning(
            "%d words beyond max_seq_length=%d are not seen by the model and predicted O",
            truncated,
            max_seq_length,
        )
    return NerFeatures(arrays=arrays, word_positions=word_positions, truncated_words=truncated)


def feature_spec(input_shape):
    """The tf.io.parse_example spec of NER records; `input_shape` is [max_seq_length]."""
    names = tuple(packing.MODEL_INPUT_NAMES) + ("label_ids",)
    return {name: tf.io.FixedLenFeature(list(input_shape), tf.int64) for name in names}


def write_records(path, features):
    """Writes NerFeatures to a TFRecord file atomically; returns the number of records."""
    return packing.write_records(path, features.arrays)


def word_predictions(features, predicted_ids, labels):
    """Per-sentence word tags from per-token predicted label ids [n, seq] (cut words get "O")."""
    predicted_ids = np.asarray(predicted_ids)
    result = []
    for row, positions in enumerate(features.word_positions):
        result.append([labels[int(predicted_ids[row, p])] for p in positions])
    return result


def pad_predictions(sentences, predictions):
    """Pads each sentence's predicted tags with "O" for the words cut by max_seq_length."""
    return [list(p) + [OUTSIDE] * (len(s.words) - len(p)) for s, p in zip(sentences, predictions)]


def write_conll_predictions(path, sentences, predictions):
    """Writes `token gold predicted` lines, a blank line after each sentence (conlleval's input), atomically."""
    lines = []
    for sentence, predicted in zip(sentences, predictions):
        if len(predicted) != len(sentence.words):
            raise ValueError(
                f"{sentence.source}: {len(sentence.words)} words but {len(predicted)} predicted tags"
            )
        for word, gold, tag in zip(sentence.words, sentence.tags, predicted):
            lines.append(f"{word} {gold} {tag}")
        lines.append("")
    io_utils.atomic_write_text(path, "\n".join(lines) + ("\n" if lines else ""))
    return path
