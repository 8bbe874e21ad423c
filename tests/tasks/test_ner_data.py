"""CoNLL-2003 reading, IOB1 -> BIO, first-piece labelling, conlleval entity scores, the prediction writer."""

import numpy as np
import pytest

from bert_tf.runtime import io_utils
from bert_tf.tasks import data_files, packing
from bert_tf.tasks.ner import data as ner
from bert_tf.tasks.ner import metrics as ner_metrics
from bert_tf.tokenization import python_tokenizer

# The start of CoNLL-2003's eng.train, in its original IOB1 tags (I- starts entities).
CONLL_IOB1 = """-DOCSTART- -X- O O

EU NNP I-NP I-ORG
rejects VBZ I-VP O
German JJ I-NP I-MISC
call NN I-NP O
to TO I-VP O
boycott VB I-VP O
British JJ I-NP I-MISC
lamb NN I-NP O
. . O O

Peter NNP I-NP I-PER
Blackburn NNP I-NP I-PER

-DOCSTART- -X- O O

In IN I-PP O
Paris NNP I-NP I-LOC
Lyon NNP I-NP B-LOC
Nice NNP I-NP I-LOC
"""


@pytest.fixture()
def conll_file(tmp_path):
    path = tmp_path / "eng.train"
    path.write_text(CONLL_IOB1)
    return str(path)


def test_read_conll_converts_iob1_to_bio(conll_file):
    sentences = ner.read_conll(conll_file)
    assert [s.words for s in sentences] == [
        ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."],
        ["Peter", "Blackburn"],
        ["In", "Paris", "Lyon", "Nice"],
    ]
    assert sentences[0].tags == ["B-ORG", "O", "B-MISC", "O", "O", "O", "B-MISC", "O", "O"]
    assert sentences[1].tags == ["B-PER", "I-PER"]
    # IOB1's B- marks a second LOC right after a first one: Paris | Lyon Nice.
    assert sentences[2].tags == ["O", "B-LOC", "B-LOC", "I-LOC"]
    assert sentences[1].source.endswith("eng.train:13")
    # Conversion keeps conlleval's entities exactly: compare with the raw IOB1 tags.
    blocks = [b for b in CONLL_IOB1.split("\n\n") if b.strip() and not b.startswith("-DOCSTART-")]
    raw_tags = [[line.split()[-1] for line in block.strip().splitlines()] for block in blocks]
    assert len(raw_tags) == len(sentences)
    for sentence, raw in zip(sentences, raw_tags):
        assert ner_metrics.get_entities(sentence.tags) == ner_metrics.get_entities(raw)


def test_bio_input_is_unchanged():
    tags = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC"]
    assert ner.to_bio(tags) == tags
    assert ner.to_bio(["I-PER", "I-LOC", "O", "I-LOC"]) == ["B-PER", "B-LOC", "O", "B-LOC"]


def test_bad_lines_name_file_and_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("EU B-ORG\nrejects\n")
    with pytest.raises(data_files.DataFormatError, match=r"bad\.txt:2: expected a token and a tag"):
        ner.read_conll(str(path))
    path.write_text("EU B-ORG\n\nPeter X-PER\n")
    with pytest.raises(
        data_files.DataFormatError, match=r"bad\.txt:3: tag 'X-PER' is not O, B-TYPE or I-TYPE"
    ):
        ner.read_conll(str(path))
    with pytest.raises(io_utils.UsageError, match="eng.testa"):
        ner.read_conll(str(tmp_path / "eng.testa"))


def test_label_list_and_unseen_dev_tag(conll_file, tmp_path):
    labels = ner.label_list(ner.read_conll(conll_file))
    assert labels == ["O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-PER"]
    dev = tmp_path / "eng.testa"
    # I-ORG after B-LOC starts an entity, so it becomes B-ORG: a tag training has.
    dev.write_text("Paris B-LOC\n\nMadrid B-LOC\nFC I-ORG\n")
    ner.check_labels(ner.read_conll(str(dev)), labels)
    # I-ORG continuing an ORG stays I-ORG, which training never had.
    dev.write_text("Paris B-LOC\n\nReal B-ORG\nMadrid I-ORG\n")
    with pytest.raises(
        data_files.DataFormatError, match=r"eng\.testa:3: tag 'I-ORG' .* never seen in training"
    ):
        ner.check_labels(ner.read_conll(str(dev)), labels)


@pytest.fixture(scope="module")
def tokenizer(real_vocab):
    return python_tokenizer.FullTokenizer(real_vocab, do_lower_case=True)


def test_first_piece_carries_the_label(tokenizer):
    sentence = ner.Sentence(
        ["Peter", "Blackburn", "visited", "Ouagadougou", "\u200b"],
        ["B-PER", "I-PER", "O", "B-LOC", "O"],
    )
    labels = ["O", "B-LOC", "B-PER", "I-PER"]
    features = ner.convert_sentences([sentence], tokenizer, 32, labels)
    ids = features.arrays["input_ids"][0]
    label_ids = features.arrays["label_ids"][0]
    pieces = [tokenizer.tokenize(w) or ["[UNK]"] for w in sentence.words]
    expected_tokens = ["[CLS]"] + [p for word in pieces for p in word] + ["[SEP]"]
    assert tokenizer.convert_ids_to_tokens(ids[: len(expected_tokens)]) == expected_tokens
    expected_labels = [ner.IGNORE_LABEL]
    for word_pieces, tag in zip(pieces, sentence.tags):
        expected_labels += [labels.index(tag)] + [ner.IGNORE_LABEL] * (len(word_pieces) - 1)
    expected_labels += [ner.IGNORE_LABEL] * (32 - len(expected_labels))
    assert label_ids.tolist() == expected_labels
    assert len(pieces[1]) > 1 or len(pieces[3]) > 1  # some word really splits into pieces
    assert features.arrays["input_mask"][0].sum() == len(expected_tokens)
    assert features.word_positions[0][0] == 1


def test_truncated_words_are_predicted_o(tokenizer):
    sentences = [
        ner.Sentence(
            ["EU", "rejects", "German", "call", "to", "boycott"],
            ["B-ORG", "O", "B-MISC", "O", "O", "O"],
        )
    ]
    labels = ["O", "B-MISC", "B-ORG"]
    features = ner.convert_sentences(sentences, tokenizer, 6, labels)  # room for 4 pieces
    assert features.truncated_words == 2
    # A model that predicts exactly the gold ids on the first pieces.
    predicted = np.where(features.arrays["label_ids"] >= 0, features.arrays["label_ids"], 0)
    words = ner.word_predictions(features, predicted, labels)
    assert words == [["B-ORG", "O", "B-MISC", "O"]]
    assert ner.pad_predictions(sentences, words) == [["B-ORG", "O", "B-MISC", "O", "O", "O"]]


def test_records_round_trip(tokenizer, tmp_path):
    sentences = [
        ner.Sentence(["Peter", "Blackburn"], ["B-PER", "I-PER"]),
        ner.Sentence(["Hi"], ["O"]),
    ]
    features = ner.convert_sentences(sentences, tokenizer, 8, ["O", "B-PER", "I-PER"])
    path = str(tmp_path / "ner.tf_record")
    assert ner.write_records(path, features) == 2
    batch = next(
        iter(packing.records_dataset(path, ner.feature_spec([8]), batch_size=2, is_training=False))
    )
    np.testing.assert_array_equal(batch["label_ids"], features.arrays["label_ids"])
    np.testing.assert_array_equal(batch["input_word_ids"], features.arrays["input_ids"])


@pytest.mark.parametrize(
    "tags, entities",
    [
        (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 1), ("LOC", 3, 3)]),
        (["O", "I-PER", "I-PER"], [("PER", 1, 2)]),  # I- after O starts an entity
        (["B-PER", "I-LOC"], [("PER", 0, 0), ("LOC", 1, 1)]),  # I- of another type starts one
        (["I-ORG", "B-ORG", "I-ORG"], [("ORG", 0, 0), ("ORG", 1, 2)]),
        (["B-MISC", "B-MISC", "O"], [("MISC", 0, 0), ("MISC", 1, 1)]),
        (["O", "O"], []),
    ],
)
def test_get_entities_conlleval_rules(tags, entities):
    assert ner_metrics.get_entities(tags) == entities


def test_entity_scores_on_hand_made_case():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O", "O"]]
    predicted = [["B-PER", "O", "O", "B-LOC"], ["B-ORG", "O", "B-MISC"]]
    # Gold: PER 0-1, LOC 3, ORG 0 (3). Predicted: PER 0-0 (wrong end), LOC 3, ORG 0, MISC 2 (4).
    # Correct: LOC, ORG = 2. P = 2/4, R = 2/3, F1 = 2 * (1/2)(2/3) / (1/2 + 2/3) = (2/3) / (7/6) = 4/7.
    scores = ner_metrics.entity_scores(gold, predicted)
    assert scores["precision"] == pytest.approx(0.5)
    assert scores["recall"] == pytest.approx(2 / 3)
    assert scores["f1"] == pytest.approx(4 / 7)
    # Tokens: sentence 1 wrong at 1 (I-PER vs O), sentence 2 wrong at 2: 5 of 7 right.
    assert scores["accuracy"] == pytest.approx(5 / 7)
    assert (scores["gold_entities"], scores["predicted_entities"], scores["correct_entities"]) == (
        3,
        4,
        2,
    )
    assert scores["per_type"]["PER"]["f1"] == 0.0
    assert scores["per_type"]["LOC"]["f1"] == 1.0
    assert scores["per_type"]["MISC"] == {
        "precision": 0.0,
        "recall": 0.0,
        "f1": 0.0,
        "correct": 0,
        "predicted": 1,
        "gold": 0,
    }
    lines = ner_metrics.eval_result_lines(scores)
    assert "precision:  50.00%; recall:  66.67%; FB1:  57.14" in lines[1]


def test_entity_scores_follow_conlleval_chunk_starts():
    # A prediction in IOB1 style (I- after O) matches the BIO gold entity: conlleval counts it.
    assert (
        ner_metrics.entity_scores([["O", "B-PER", "I-PER"]], [["O", "I-PER", "I-PER"]])["f1"] == 1.0
    )
    # Entities never cross sentences: B-PER | I-PER are two entities in two sentences.
    scores = ner_metrics.entity_scores([["B-PER"], ["I-PER"]], [["B-PER"], ["I-PER"]])
    assert scores["gold_entities"] == 2 and scores["f1"] == 1.0
    # Nothing predicted, nothing gold: 0, not a division error.
    assert ner_metrics.entity_scores([["O"]], [["O"]])["f1"] == 0.0


def test_conll_prediction_writer(tmp_path):
    sentences = [
        ner.Sentence(["Peter", "Blackburn"], ["B-PER", "I-PER"]),
        ner.Sentence(["Hi"], ["O"]),
    ]
    path = ner.write_conll_predictions(
        str(tmp_path / "predictions.txt"), sentences, [["B-PER", "O"], ["B-LOC"]]
    )
    assert open(path).read() == "Peter B-PER B-PER\nBlackburn I-PER O\n\nHi O B-LOC\n\n"
    # The file reads back as CoNLL with the prediction as the tag column.
    assert [s.tags for s in ner.read_conll(path)] == [["B-PER", "O"], ["B-LOC"]]
    with pytest.raises(ValueError, match="2 words but 1 predicted"):
        ner.write_conll_predictions(str(tmp_path / "x.txt"), sentences[:1], [["O"]])
