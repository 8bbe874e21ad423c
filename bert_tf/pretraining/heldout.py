"""What a pretrained model learned, asked on text it never saw: fill-mask and next-sentence accuracy.

The held-out text is a file in the pretraining format (one sentence a line, a blank line between
documents), such as the one `python -m bert_tf.corpus --heldout_file` writes beside the training
corpus. Both questions are drawn from it the same way on every call (fixed seeds): every model is
asked the same pairs, and models with the same vocabulary the same masked words.

- **fill-mask top-1 accuracy**: in each sentence, 15% of the words that hold a letter or a digit (at
  least one word) have every WordPiece replaced by [MASK], all in the same input, as fill_mask is
  asked. A word is right when the model's first choice at each of its pieces is that piece.
  Punctuation is never masked: it is easy to guess, and says little about what was learned.
- **next-sentence accuracy**: every pair of neighbouring sentences in a document, in turn paired
  as they are (IsNext) or with a sentence of another document (NotNext), so the set is balanced
  and guessing scores 0.5. A pair is right when the IsNext probability is above 0.5 exactly when
  the second sentence is the real next one.
"""

import dataclasses
import random

import numpy as np

from bert_tf.model.model_dir import NSP_HEAD
from bert_tf.pretraining_data import documents as document_files

MASKED_WORD_FRACTION = 0.15
DEFAULT_MAX_QUESTIONS = 1000
BATCH_SIZE = 64
SEED = 12345


@dataclasses.dataclass
class HeldoutScores:
    """The two accuracies and how many questions each was measured on; next_sentence_accuracy is
    None for a model without an NSP head (a Hugging Face BertForMaskedLM converted)."""

    fill_mask_accuracy: float
    masked_words: int
    sentences: int
    next_sentence_accuracy: float
    pairs: int

    def lines(self):
        """The two figures, a line each, in the words make demo prints."""
        nsp = (
            "n/a (the model has no NSP head)"
            if self.next_sentence_accuracy is None
            else f"{self.next_sentence_accuracy:.3f} ({self.pairs} pairs, half of them real "
            "next sentences)"
        )
        return [
            f"fill-mask top-1 accuracy on held-out sentences: {self.fill_mask_accuracy:.3f} "
            f"({self.masked_words} masked words in {self.sentences} sentences)",
            f"next-sentence accuracy on held-out pairs: {nsp}",
        ]


def read_documents(path):
    """The documents of a pretraining-format text file, as lists of sentences (str)."""
    return document_files.read_document_sentences(path)


def masked_word_questions(sentences, tokenizer, mask_id, max_length, rng):
    """Per sentence that has a word to mask: (ids with the chosen words' pieces masked, the true ids
    at those positions, the word each masked piece belongs to). Ids are cut to `max_length` pieces
    first, so every masked piece fits the model's input."""
    questions = []
    for sentence in sentences:
        words = [
            (word, tokenizer.wordpiece_tokenizer.tokenize_word(word))
            for word in tokenizer.basic_tokenizer.tokenize(sentence)
        ]
        ids, spans = [], []
        for word, pieces in words:
            if len(ids) + len(pieces) > max_length:
                break
            start = len(ids)
            ids.extend(tokenizer.convert_tokens_to_ids(pieces))
            if any(c.isalnum() for c in word) and "[UNK]" not in pieces:
                spans.append((start, len(ids)))
        if not spans:
            continue
        count = max(1, round(MASKED_WORD_FRACTION * len(spans)))
        chosen = sorted(rng.sample(range(len(spans)), count))
        masked, targets, word_of_piece = list(ids), [], []
        for word_index in chosen:
            start, end = spans[word_index]
            for position in range(start, end):
                targets.append(ids[position])
                word_of_piece.append(word_index)
                masked[position] = mask_id
        questions.append((masked, targets, word_of_piece))
    return questions


def fill_mask_accuracy(model, sentences, rng):
    """(accuracy, masked words, sentences asked) of `model` (a MaskedLM) on `sentences`."""
    # [CLS] and [SEP] take two of the model's positions.
    questions = masked_word_questions(
        sentences, model.tokenizer, model.mask_id, model.max_seq_length - 2, rng
    )
    right = total = 0
    for start in range(0, len(questions), BATCH_SIZE):
        batch = questions[start : start + BATCH_SIZE]
        best = model.best_masked_ids([masked for masked, _, _ in batch])
        for (_, targets, word_of_piece), predicted in zip(batch, best):
            hits = np.asarray(predicted) == np.asarray(targets)
            words = np.asarray(word_of_piece)
            for word in np.unique(words):
                right += bool(hits[words == word].all())
                total += 1
    return (right / total if total else 0.0), total, len(questions)


def next_sentence_pairs(documents, rng, max_pairs):
    """Balanced (text_a, text_b, is_next) triples from neighbouring sentences, at most `max_pairs`."""
    neighbours = [
        (index, document[i], document[i + 1])
        for index, document in enumerate(documents)
        for i in range(len(document) - 1)
    ]
    rng.shuffle(neighbours)
    neighbours = neighbours[:max_pairs]
    pairs = []
    for turn, (index, text_a, text_b) in enumerate(neighbours):
        if turn % 2 == 0:
            pairs.append((text_a, text_b, True))
            continue
        other = rng.randrange(len(documents) - 1)
        other += other >= index  # any document but this one
        pairs.append((text_a, rng.choice(documents[other]), False))
    return pairs


def next_sentence_accuracy(model, pairs):
    """The share of `pairs` whose IsNext probability is above 0.5 exactly when the pair is real."""
    right = 0
    for start in range(0, len(pairs), BATCH_SIZE):
        batch = pairs[start : start + BATCH_SIZE]
        probabilities = model.next_sentence([a for a, _, _ in batch], [b for _, b, _ in batch])
        right += sum((p > 0.5) == is_next for p, (_, _, is_next) in zip(probabilities, batch))
    return right / len(pairs) if pairs else 0.0


def evaluate(model, heldout_file, max_questions=DEFAULT_MAX_QUESTIONS):
    """HeldoutScores of `model` (a MaskedLM with an MLM head, and an NSP head for the pairs) on
    `heldout_file`.

    At most `max_questions` sentences are asked to fill masks, and as many pairs are scored; a file
    with fewer than two documents is a ValueError (NotNext pairs need another document)."""
    documents = [document for document in read_documents(heldout_file) if document]
    if len(documents) < 2:
        raise ValueError(f"{heldout_file} holds {len(documents)} documents; at least 2 are needed")
    rng = random.Random(SEED)
    sentences = [sentence for document in documents for sentence in document]
    sentences = rng.sample(sentences, min(max_questions, len(sentences)))
    accuracy, masked_words, asked = fill_mask_accuracy(model, sentences, rng)
    # A generator of its own: which words can be masked depends on the vocabulary, the pairs must not.
    pairs = next_sentence_pairs(documents, random.Random(SEED + 1), max_questions)
    has_nsp = NSP_HEAD in model.heads
    return HeldoutScores(
        fill_mask_accuracy=accuracy,
        masked_words=masked_words,
        sentences=asked,
        next_sentence_accuracy=next_sentence_accuracy(model, pairs) if has_nsp else None,
        pairs=len(pairs) if has_nsp else 0,
    )
