"""The demo's labelled task data, written in the tasks' real file formats.

`make demo` and the tests fine-tune on these: a sentiment task in GLUE SST-2's layout
(train/dev/test.tsv) and a multiple choice task in SWAG's (train/val/test.csv), both templated
from small word lists and learnable by a tiny model in seconds; and, on a corpus's own sentences
(bert_tf.corpus's format: a sentence a line, a blank line between documents), a tagging task in
CoNLL-2003's layout (train/dev/test.txt: the standard library's module names (MOD) and the
built-in type names (TYPE) where the sentences use them), a sentence-pair task in GLUE MRPC's
layout (does the second sentence follow the first in its document?) and a span task in SQuAD
v1.1's (a sentence of the document with one word blanked out is the question; that word in the
document is the answer). The corpus tasks split by document: no document gives both training and
dev rows. All are deterministic for a seed (the tagging task for a seed and a Python version: the
module names are its standard library's).

`python -m bert_tf.demo_data` is its CLI.
"""

import csv
import io
import os
import random
import re
import sys

import numpy as np

from bert_tf.pretraining_data import documents as document_files
from bert_tf.runtime import io_utils
from bert_tf.tasks.multiple_choice import data as multiple_choice

# ---------------------------------------------------------------------------------------------
# Sentiment in GLUE SST-2's layout: the label follows the keyword.
# ---------------------------------------------------------------------------------------------

_SENTIMENT_POSITIVE = (
    "good",
    "great",
    "wonderful",
    "excellent",
    "pleasant",
    "delightful",
    "lovely",
    "brilliant",
)
_SENTIMENT_NEGATIVE = ("bad", "awful", "terrible", "boring", "dull", "horrible", "poor", "weak")
_SENTIMENT_SUBJECTS = (
    "the movie",
    "the film",
    "this story",
    "the acting",
    "the music",
    "the ending",
    "the plot",
    "the dialogue",
    "the cast",
    "the script",
    "the show",
    "this book",
)
_SENTIMENT_TEMPLATES = (
    "{subject} was {word} .",
    "i thought {subject} was really {word} .",
    "{subject} felt {word} from start to finish .",
    "honestly , {subject} is {word} .",
    "we all agreed that {subject} was {word} .",
    "my friend said {subject} seemed {word} to her .",
    "after an hour , {subject} still felt {word} .",
    "{subject} , in a word , was {word} .",
)


def demo_sentence(rng, label):
    """One templated demo sentence whose label (1 positive, 0 negative) is set by its keyword."""
    word = rng.choice(_SENTIMENT_POSITIVE if label else _SENTIMENT_NEGATIVE)
    return rng.choice(_SENTIMENT_TEMPLATES).format(
        subject=rng.choice(_SENTIMENT_SUBJECTS), word=word
    )


def write_demo_glue_dir(path, num_train=400, num_dev=100, num_test=100, seed=1234):
    """Writes a small learnable sentiment task in the GLUE SST-2 layout (train/dev/test.tsv) to `path`.

    Deterministic for a given seed; labels are balanced. Returns `path`.
    """
    rng = random.Random(seed)
    for split, count in (("train", num_train), ("dev", num_dev), ("test", num_test)):
        labels = [i % 2 for i in range(count)]
        rng.shuffle(labels)
        sentences = [demo_sentence(rng, label) for label in labels]
        if split == "test":
            header, rows = "index\tsentence", [f"{i}\t{s}" for i, s in enumerate(sentences)]
        else:
            header, rows = (
                "sentence\tlabel",
                [f"{s}\t{label}" for s, label in zip(sentences, labels)],
            )
        io_utils.atomic_write_text(
            os.path.join(path, f"{split}.tsv"), "\n".join([header] + rows) + "\n"
        )
    return path


# ---------------------------------------------------------------------------------------------
# Multiple choice in SWAG's layout: the right ending goes on with the context's topic, the wrong
# ones are absurd (a toy a tiny model learns in seconds; telling topics apart takes it far longer).
# ---------------------------------------------------------------------------------------------

_SWAG_TOPICS = {
    "kitchen": ("chops the onions", "stirs the soup", "tastes the sauce", "washes the pan"),
    "garden": ("waters the roses", "digs a hole", "plants the seeds", "trims the hedge"),
    "pool": ("dives into the water", "swims a length", "floats on her back", "climbs the ladder"),
    "road": ("starts the engine", "checks the mirror", "turns the wheel", "parks the car"),
}
_SWAG_ABSURD = (
    "eats the ladder",
    "folds the ocean",
    "paints the wind",
    "sings to a spoon",
    "melts the moon",
    "marries a cloud",
    "swallows the road",
    "knits a river",
)
_SWAG_OPENINGS = (
    "someone is in the {topic} .",
    "a woman walks into the {topic} .",
    "a man stands in the {topic} .",
    "we see the {topic} .",
    "the camera shows the {topic} .",
)
SWAG_FIELDS = [
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


def write_demo_swag_dir(path, num_train=400, num_dev=100, num_test=100, seed=4321):
    """Writes train.csv, val.csv and test.csv in SWAG's layout (a learnable toy task); returns `path`."""
    rng = np.random.default_rng(seed)
    topics = sorted(_SWAG_TOPICS)
    for split, count in (("train", num_train), ("dev", num_dev), ("test", num_test)):
        rows = []
        for i in range(count):
            topic = topics[rng.integers(len(topics))]
            label = int(rng.integers(4))
            endings = [str(e) for e in rng.choice(_SWAG_ABSURD, size=4, replace=False)]
            endings[label] = _SWAG_TOPICS[topic][rng.integers(4)]
            sent1 = _SWAG_OPENINGS[rng.integers(len(_SWAG_OPENINGS))].format(topic=topic)
            row = [f"demo{i}", str(i), f"{sent1} then she", sent1, "then she", "gold", *endings]
            rows.append(row + ([str(label)] if split != "test" else []))
        fields = SWAG_FIELDS if split != "test" else SWAG_FIELDS[:-1]
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerows([fields] + rows)
        io_utils.atomic_write_text(
            os.path.join(path, multiple_choice.SPLIT_FILES[split]), buffer.getvalue()
        )
    return path


# ---------------------------------------------------------------------------------------------
# Tagging in CoNLL-2003's layout: code names in prose. A module name that is also a common English
# word ("string", "time") is left untagged, as is any name of three letters or fewer.
# ---------------------------------------------------------------------------------------------

_ENGLISH_MODULE_NAMES = frozenset(
    "abc array code copy queue random select signal site string test this time token types "
    "keyword numbers operator secrets struct symtable calendar glob math platform resource shelve "
    "socket stat wave warnings errno enum sched email html json uuid zipimport".split()
)
_TYPE_NAMES = frozenset("int str float bytes bytearray dict tuple frozenset bool".split())
CONLL_TAGS = ("O", "B-MOD", "B-TYPE")


def conll_words(sentence):
    """A sentence's words and punctuation marks, CoNLL's one token per line."""
    return re.findall(r"\w+|[^\w\s]", sentence)


def code_name_tags(words):
    """Each word's tag: B-MOD for a standard library module's name, B-TYPE for a built-in type's."""
    modules = set(sys.stdlib_module_names) - _ENGLISH_MODULE_NAMES
    return [
        "B-MOD"
        if word.lower() in modules and len(word) > 3
        else "B-TYPE"
        if word in _TYPE_NAMES
        else "O"
        for word in words
    ]


def code_name_sentences(sentences, count, rng):
    """`count` of `sentences` in a random order, two thirds of them naming a module or type."""
    unique = sorted(set(sentences))
    rng.shuffle(unique)
    tagged = [s for s in unique if set(code_name_tags(conll_words(s))) != {"O"}]
    tagged_set = set(tagged)
    wanted = count * 2 // 3
    if len(tagged) < wanted:
        raise io_utils.UsageError(
            f"the corpus has {len(tagged)} sentences naming a module or type; {wanted} are needed"
        )
    chosen = tagged[:wanted] + [s for s in unique if s not in tagged_set][: count - wanted]
    rng.shuffle(chosen)
    return chosen


def conll_text(sentences):
    """CoNLL-2003's layout: -DOCSTART-, then `word POS chunk tag` per line, a blank line after each
    sentence (the POS and chunk columns are placeholders: the tagger reads the last column)."""
    lines = ["-DOCSTART- -X- -X- O", ""]
    for sentence in sentences:
        words = conll_words(sentence)
        lines += [f"{w} NN O {t}" for w, t in zip(words, code_name_tags(words))] + [""]
    return "\n".join(lines) + "\n"


def write_demo_conll_dir(path, corpus_file, num_train=600, num_dev=200, num_test=100, seed=99):
    """Writes train.txt, dev.txt and test.txt tagging code names in `corpus_file`'s sentences (one
    per line, as bert_tf.corpus writes them); returns `path`."""
    with open(corpus_file, encoding="utf-8") as f:
        sentences = [line.strip() for line in f if 3 <= len(line.split()) <= 40]
    chosen = code_name_sentences(sentences, num_train + num_dev + num_test, random.Random(seed))
    splits = {
        "train": chosen[:num_train],
        "dev": chosen[num_train : num_train + num_dev],
        "test": chosen[num_train + num_dev :],
    }
    for split, rows in splits.items():
        io_utils.atomic_write_text(os.path.join(path, f"{split}.txt"), conll_text(rows))
    return path


# ---------------------------------------------------------------------------------------------
# Tasks made of a corpus's documents: sentence pairs (GLUE MRPC's layout) and spans (SQuAD v1.1's).
# ---------------------------------------------------------------------------------------------

MRPC_HEADER = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
# The question's stand-in for the word it asks about.
BLANK = "what"


def corpus_documents(corpus_file):
    """The documents of a corpus file, read as the pretraining data job reads them: lists of
    sentences (str)."""
    return [
        document for document in document_files.read_document_sentences(corpus_file) if document
    ]


def split_documents(documents, fractions, rng):
    """The documents shuffled and cut into len(fractions) + 1 consecutive groups."""
    order = list(documents)
    rng.shuffle(order)
    cuts = np.cumsum([round(f * len(order)) for f in fractions])
    return [order[a:b] for a, b in zip([0, *cuts], [*cuts, len(order)])]


def next_sentence_rows(documents, count, rng):
    """`count` (label, sentence, next) rows: half the next sentence of the same document (1), half a
    sentence of another document (0)."""
    pairs = [(d, i) for d in range(len(documents)) for i in range(len(documents[d]) - 1)]
    if len(pairs) < count or len(documents) < 2:
        raise io_utils.UsageError(f"the corpus has {len(pairs)} sentence pairs; {count} are needed")
    rows = []
    for turn, (d, i) in enumerate(rng.sample(pairs, count)):
        if turn % 2 == 0:
            rows.append((1, documents[d][i], documents[d][i + 1]))
            continue
        other = rng.randrange(len(documents) - 1)
        other += other >= d
        rows.append((0, documents[d][i], rng.choice(documents[other])))
    return rows


def write_demo_pair_dir(path, corpus_file, num_train=600, num_dev=200, num_test=100, seed=7):
    """Writes train.tsv, dev.tsv and test.tsv in GLUE MRPC's layout from `corpus_file`'s documents:
    label 1 where #2 is the sentence after #1, 0 where it comes from another document; returns
    `path`."""
    rng = random.Random(seed)
    groups = split_documents(corpus_documents(corpus_file), (0.6, 0.2), rng)
    for split, documents, count in zip(
        ("train", "dev", "test"), groups, (num_train, num_dev, num_test)
    ):
        rows = next_sentence_rows(documents, count, rng)
        lines = [MRPC_HEADER.replace("Quality", "index") if split == "test" else MRPC_HEADER]
        for i, (label, first, second) in enumerate(rows):
            first, second = (text.replace("\t", " ") for text in (first, second))
            lead = str(i) if split == "test" else str(label)
            lines.append(f"{lead}\t{2 * i}\t{2 * i + 1}\t{first}\t{second}")
        io_utils.atomic_write_text(os.path.join(path, f"{split}.tsv"), "\n".join(lines) + "\n")
    return path


def cloze_questions(documents, count, rng, max_context_words=120):
    """SQuAD v1.1 paragraphs: a document's first sentences (at most `max_context_words` words) as the
    context and, per paragraph, one of them with a word of 4+ letters that occurs once in the context
    replaced by BLANK as the question, that word's place in the context as the answer."""
    candidates = []
    for document in documents:
        context, words = [], 0
        for sentence in document:
            if words + len(sentence.split()) > max_context_words:
                break
            context.append(sentence)
            words += len(sentence.split())
        if len(context) >= 2:
            candidates.append(context)
    rng.shuffle(candidates)
    paragraphs = []
    for context_sentences in candidates:
        context = " ".join(context_sentences)
        index = rng.randrange(len(context_sentences))
        sentence = context_sentences[index]
        words = [
            w
            for w in sorted(set(re.findall(r"\b[A-Za-z]{4,}\b", sentence)))
            if len(re.findall(rf"\b{w}\b", context)) == 1
        ]
        if not words:
            continue
        word = rng.choice(words)
        offset = sum(len(s) + 1 for s in context_sentences[:index])
        start = offset + re.search(rf"\b{word}\b", sentence).start()
        question = re.sub(rf"\b{word}\b", BLANK, sentence, count=1)
        qid = f"cloze{len(paragraphs)}"
        answers = [{"text": word, "answer_start": start}]
        paragraphs.append(
            {"context": context, "qas": [{"id": qid, "question": question, "answers": answers}]}
        )
        if len(paragraphs) == count:
            return paragraphs
    raise io_utils.UsageError(
        f"the corpus gives {len(paragraphs)} span questions; {count} are needed"
    )


def write_demo_squad_dir(path, corpus_file, num_train=600, num_dev=200, seed=11):
    """Writes train.json and dev.json in SQuAD v1.1's layout (cloze_questions) from `corpus_file`'s
    documents; returns `path`."""
    rng = random.Random(seed)
    train_docs, dev_docs = split_documents(corpus_documents(corpus_file), (0.75,), rng)
    for split, documents, count in (("train", train_docs, num_train), ("dev", dev_docs, num_dev)):
        data = {
            "version": "1.1",
            "data": [{"title": "demo", "paragraphs": cloze_questions(documents, count, rng)}],
        }
        io_utils.atomic_write_json(os.path.join(path, f"{split}.json"), data)
    return path
