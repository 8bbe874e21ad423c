"""GLUE and TSV/CSV readers, feature packing (Python and TF ops), records, tfds, submissions, demo set."""

import gzip
import os
import random

import numpy as np
import pytest
import tensorflow as tf

from bert_tf.runtime import io_utils
from bert_tf.tasks import data_files, demo_datasets, packing
from bert_tf.tasks.classification import data as classification
from bert_tf.tasks.ner import data as ner
from bert_tf.tokenization import python_tokenizer
from bert_tf.tokenization.graph_tokenizer import GraphTokenizer


def write(path, lines):
    """Writes lines (lists are joined with tabs) to `path`."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(("\t".join(line) if isinstance(line, (list, tuple)) else line) + "\n")


MNLI_HEADER = [
    "index",
    "promptID",
    "pairID",
    "genre",
    "sentence1_binary_parse",
    "sentence2_binary_parse",
    "sentence1_parse",
    "sentence2_parse",
    "sentence1",
    "sentence2",
]

# task -> (train/dev lines, test lines, expected (text_a, text_b, label) of the first train row,
#          expected (guid, text_a, text_b) of the first test row). Rows as in the real GLUE files.
GLUE_FILES = {
    "cola": (
        [
            [
                "gj04",
                "1",
                "",
                "Our friends won't buy this analysis, let alone the next one we propose.",
            ],
            ["gj04", "0", "*", "They drank the pub."],
        ],
        [["index", "sentence"], ["0", "Bill whistled past the house."]],
        ("Our friends won't buy this analysis, let alone the next one we propose.", None, "1"),
        ("0", "Bill whistled past the house.", None),
    ),
    "sst2": (
        [["sentence", "label"], ["hide new secretions from the parental units ", "0"]],
        [["index", "sentence"], ["0", "uneasy mishmash of styles and genres ."]],
        ("hide new secretions from the parental units ", None, "0"),
        ("0", "uneasy mishmash of styles and genres .", None),
    ),
    "mrpc": (
        [
            ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
            [
                "1",
                "702876",
                "702977",
                'Amrozi accused his brother , whom he called " the witness " .',
                'Referring to him as only " the witness " , Amrozi accused his brother .',
            ],
        ],
        [
            ["index", "#1 ID", "#2 ID", "#1 String", "#2 String"],
            ["0", "1089874", "1089925", "PCCW 's chief", "Current Chief"],
        ],
        (
            'Amrozi accused his brother , whom he called " the witness " .',
            'Referring to him as only " the witness " , Amrozi accused his brother .',
            "1",
        ),
        ("0", "PCCW 's chief", "Current Chief"),
    ),
    "qqp": (
        [
            ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
            [
                "133273",
                "213221",
                "213222",
                "How is the life of a math student?",
                "Which level is enough?",
                "0",
            ],
        ],
        [["id", "question1", "question2"], ["0", "Would the idea work?", "What is it?"]],
        ("How is the life of a math student?", "Which level is enough?", "0"),
        ("0", "Would the idea work?", "What is it?"),
    ),
    "stsb": (
        [
            [
                "index",
                "genre",
                "filename",
                "year",
                "old_index",
                "source1",
                "source2",
                "sentence1",
                "sentence2",
                "score",
            ],
            [
                "0",
                "main-captions",
                "MSRvid",
                "2012test",
                "0001",
                "none",
                "none",
                "A plane is taking off.",
                "An air plane is taking off.",
                "5.000",
            ],
        ],
        [
            [
                "index",
                "genre",
                "filename",
                "year",
                "old_index",
                "source1",
                "source2",
                "sentence1",
                "sentence2",
            ],
            [
                "0",
                "main-news",
                "headlines",
                "2016",
                "0001",
                "none",
                "none",
                "Girl with a cat.",
                "A girl.",
            ],
        ],
        ("A plane is taking off.", "An air plane is taking off.", 5.0),
        ("0", "Girl with a cat.", "A girl."),
    ),
    "mnli": (
        [
            MNLI_HEADER + ["label1", "label2", "label3", "label4", "label5", "gold_label"],
            [
                "0",
                "63735",
                "63735n",
                "slate",
                "( ( The ... ) )",
                "( ( The ... ) )",
                "(ROOT ...)",
                "(ROOT ...)",
                "The new rights are nice enough",
                "Everyone really likes the newest benefits ",
                "neutral",
                "entailment",
                "neutral",
                "neutral",
                "neutral",
                "neutral",
            ],
        ],
        [
            MNLI_HEADER,
            [
                "0",
                "31193",
                "31193n",
                "government",
                "(...)",
                "(...)",
                "(ROOT ...)",
                "(ROOT ...)",
                "Conceptually cream skimming has two dimensions.",
                "Product and geography matter.",
            ],
        ],
        ("The new rights are nice enough", "Everyone really likes the newest benefits ", "neutral"),
        ("0", "Conceptually cream skimming has two dimensions.", "Product and geography matter."),
    ),
    "qnli": (
        [
            ["index", "question", "sentence", "label"],
            [
                "0",
                "What came into force after the new constitution?",
                "As of that day, the new constitution came into force.",
                "entailment",
            ],
        ],
        [
            ["index", "question", "sentence"],
            ["0", "What organization is devoted to Jihad?", "It is a group."],
        ],
        (
            "What came into force after the new constitution?",
            "As of that day, the new constitution came into force.",
            "entailment",
        ),
        ("0", "What organization is devoted to Jihad?", "It is a group."),
    ),
    "rte": (
        [
            ["index", "sentence1", "sentence2", "label"],
            [
                "0",
                "No Weapons of Mass Destruction Found in Iraq Yet.",
                "Weapons found in Iraq.",
                "not_entailment",
            ],
        ],
        [["index", "sentence1", "sentence2"], ["0", "Mangla was filled.", "It was filled."]],
        (
            "No Weapons of Mass Destruction Found in Iraq Yet.",
            "Weapons found in Iraq.",
            "not_entailment",
        ),
        ("0", "Mangla was filled.", "It was filled."),
    ),
    "wnli": (
        [
            ["index", "sentence1", "sentence2", "label"],
            ["0", "I stuck a pin through a carrot.", "The carrot had a hole.", "1"],
        ],
        [
            ["index", "sentence1", "sentence2"],
            ["0", "Maude and Dora had seen the trains.", "Dora had seen."],
        ],
        ("I stuck a pin through a carrot.", "The carrot had a hole.", "1"),
        ("0", "Maude and Dora had seen the trains.", "Dora had seen."),
    ),
}


def write_glue_dir(root, name):
    """Writes every split of `name` in its real file layout; returns the directory."""
    train_lines, test_lines, _, _ = GLUE_FILES[name]
    task = classification.get_task(name)
    data_dir = os.path.join(root, name)
    for split in ("train",) + task.eval_splits:
        write(os.path.join(data_dir, (task.files or {}).get(split, f"{split}.tsv")), train_lines)
    for split in task.test_splits:
        write(os.path.join(data_dir, (task.files or {}).get(split, f"{split}.tsv")), test_lines)
    return data_dir


@pytest.mark.parametrize("name", classification.GLUE_TASK_NAMES)
def test_glue_layouts(tmp_path, name):
    data_dir = write_glue_dir(str(tmp_path), name)
    task = classification.get_task(name)
    _, _, train_expected, test_expected = GLUE_FILES[name]
    train = classification.read_split(task, data_dir, "train")
    first = train.examples[0]
    assert (first.text_a, first.text_b, first.label) == train_expected
    assert first.source.endswith("train.tsv:2" if name != "cola" else "train.tsv:1")
    for split in task.eval_splits:
        assert (
            classification.read_split(task, data_dir, split).examples[0].label == train_expected[2]
        )
    for split in task.test_splits:
        test = classification.read_split(task, data_dir, split).examples[0]
        assert (test.guid, test.text_a, test.text_b, test.label) == test_expected + (None,)
    assert task.is_pair == (train_expected[1] is not None)


def test_label_lists_are_the_originals():
    assert classification.get_task("mnli").labels == ("contradiction", "entailment", "neutral")
    assert classification.get_task("rte").labels == ("entailment", "not_entailment")
    assert classification.get_task("cola").labels == ("0", "1")
    assert classification.label_list(classification.get_task("stsb"), []) is None
    assert classification.get_task("SST-2").name == "sst2"


def test_missing_split_file_names_it(tmp_path):
    task = classification.get_task("mnli")
    write(str(tmp_path / "train.tsv"), GLUE_FILES["mnli"][0])
    with pytest.raises(io_utils.UsageError, match="dev_mismatched.tsv"):
        classification.read_split(task, str(tmp_path), "dev_mismatched")
    with pytest.raises(io_utils.UsageError, match="unknown task"):
        classification.get_task("squad")


def test_malformed_row_names_file_and_line_or_is_skipped(tmp_path):
    train_lines = list(GLUE_FILES["qqp"][0])
    # A question with a line break: the row splits into two short lines (3 and 4 columns).
    train_lines += [
        ["7", "13", "14", "What is the"],
        ["best way?", "How do I?", "1"],
        ["8", "15", "16", "Is this fine?", "Is it ok?", "1"],
    ]
    write(str(tmp_path / "train.tsv"), train_lines)
    task = classification.get_task("qqp")
    with pytest.raises(
        data_files.DataFormatError, match=r"train\.tsv:3: 4 columns, expected at least 6"
    ):
        classification.read_split(task, str(tmp_path), "train")
    split = classification.read_split(task, str(tmp_path), "train", skip_bad_rows=True)
    assert split.skipped_rows == 2
    assert [e.label for e in split.examples] == ["0", "1"]


def test_a_row_wider_than_the_first_is_refused_naming_file_and_line(tmp_path):
    """Issue 34: a tab inside a text made a 3-column row in a 2-column TSV, read silently (its text cut,
    or a piece of text taken for the label); only a headerless tsv file read by indices may be ragged."""
    write(
        str(tmp_path / "sst2" / "train.tsv"),
        [["sentence", "label"], ["fine", "1"], ["a tab\there", "0"]],
    )
    with pytest.raises(
        data_files.DataFormatError, match=r"train\.tsv:3: 3 columns, but the file's first row has 2"
    ):
        classification.read_split(classification.get_task("sst2"), str(tmp_path / "sst2"), "train")
    skipped = classification.read_split(
        classification.get_task("sst2"), str(tmp_path / "sst2"), "train", skip_bad_rows=True
    )
    assert skipped.skipped_rows == 1 and [e.text_a for e in skipped.examples] == ["fine"]
    write(str(tmp_path / "user" / "train.tsv"), [["text", "label"], ["ok", "pos"], ["x\ty", "neg"]])
    named = classification.get_task("tsv", text_a_column="text", label_column="label")
    with pytest.raises(data_files.DataFormatError, match=r"train\.tsv:3: 3 columns"):
        classification.read_split(named, str(tmp_path / "user"), "train")
    write(str(tmp_path / "ragged" / "train.tsv"), [["pos", "ok"], ["neg", "x", "extra"]])
    indexed = classification.get_task("tsv", text_a_column="1", label_column="0")
    split = classification.read_split(indexed, str(tmp_path / "ragged"), "train")
    assert [(e.text_a, e.label) for e in split.examples] == [("ok", "pos"), ("x", "neg")]


def test_bad_labels_are_errors(tmp_path):
    write(str(tmp_path / "train.tsv"), [["sentence", "label"], ["fine", "1"], ["odd", "positive"]])
    with pytest.raises(
        data_files.DataFormatError, match=r"train\.tsv:3: label 'positive' is not one of 0, 1"
    ):
        classification.read_split(classification.get_task("sst2"), str(tmp_path), "train")
    stsb_lines = [GLUE_FILES["stsb"][0][0], ["0", "g", "f", "y", "1", "n", "n", "a", "b", "high"]]
    write(str(tmp_path / "stsb" / "train.tsv"), stsb_lines)
    with pytest.raises(
        data_files.DataFormatError, match=r"train\.tsv:2: score 'high' is not a number"
    ):
        classification.read_split(classification.get_task("stsb"), str(tmp_path / "stsb"), "train")


def test_user_csv_with_named_columns_and_unseen_dev_label(tmp_path):
    write(
        str(tmp_path / "train.csv"),
        [
            "id,review,topic,stars",
            '1,"Great, really great",books,pos',
            '2,"Meh. ""fine"", I guess",films,neg',
            "3,Loved it,books,pos",
        ],
    )
    write(
        str(tmp_path / "dev.csv"),
        ["id,review,topic,stars", "1,Nice,books,pos", "2,Hmm,films,mixed"],
    )
    task = classification.get_task(
        "tsv", text_a_column="review", text_b_column="topic", label_column="stars"
    )
    train = classification.read_split(task, str(tmp_path), "train")
    assert [(e.text_a, e.text_b, e.label) for e in train.examples] == [
        ("Great, really great", "books", "pos"),
        ('Meh. "fine", I guess', "films", "neg"),
        ("Loved it", "books", "pos"),
    ]
    labels = classification.label_list(task, train.examples)
    assert labels == ["neg", "pos"]
    dev = classification.read_split(task, str(tmp_path), "dev")
    with pytest.raises(
        data_files.DataFormatError, match=r"dev\.csv:3: label 'mixed' was never seen in training"
    ):
        classification.check_labels(dev, labels)


@pytest.mark.parametrize("suffix", [".tsv", ".csv"])
def test_a_utf8_byte_order_mark_is_skipped_as_utf_8_sig_does(tmp_path, suffix):
    # Editors on Windows start files with a BOM; it must not become part of the first column's name.
    separator = "," if suffix == ".csv" else "\t"
    text = (
        "\ufeff"
        + "\n".join(
            separator.join(row)
            for row in [["sentence", "label"], ["caf\u00e9 au lait", "pos"], ["bad", "neg"]]
        )
        + "\n"
    )
    path = tmp_path / f"train{suffix}"
    path.write_bytes(text.encode())
    task = classification.get_task("tsv", text_a_column="sentence", label_column="label")
    train = classification.read_split(task, str(tmp_path), "train")
    assert [(e.text_a, e.label) for e in train.examples] == [
        ("caf\u00e9 au lait", "pos"),
        ("bad", "neg"),
    ]


def test_user_tsv_with_column_indices_and_fixed_labels(tmp_path):
    write(str(tmp_path / "train.tsv"), [["b", "text one"], ["a", "text two"]])
    task = classification.get_task("tsv", text_a_column="1", label_column="0", labels="b,a")
    train = classification.read_split(task, str(tmp_path), "train")
    assert [(e.text_a, e.label) for e in train.examples] == [("text one", "b"), ("text two", "a")]
    assert classification.label_list(task, train.examples) == ["b", "a"]
    assert list(classification.label_values(train.examples, ["b", "a"])) == [0, 1]
    with pytest.raises(io_utils.UsageError, match=r"dev\.tsv or .*dev\.csv"):
        classification.read_split(task, str(tmp_path), "dev")


def original_truncate_seq_pair(tokens_a, tokens_b, max_length):
    """The original rule, written as the original loop: pop from the longer; b on a tie."""
    while len(tokens_a) + len(tokens_b) > max_length:
        if len(tokens_a) > len(tokens_b):
            tokens_a.pop()
        else:
            tokens_b.pop()


def test_truncation_equals_the_original_loop():
    rng = random.Random(0)
    for _ in range(500):
        a, b = list(range(rng.randint(0, 40))), list(range(100, 100 + rng.randint(0, 40)))
        budget = rng.randint(0, 50)
        expected_a, expected_b = list(a), list(b)
        original_truncate_seq_pair(expected_a, expected_b, budget)
        assert packing.truncate_segments([a, b], budget) == [expected_a, expected_b]


def test_truncation_of_three_segments_trims_the_last_longest():
    # Lengths 3, 4, 2 into 5: trim #2 (4->3), tie 3/3 -> trim the last (#2, 3->2), #1 (3->2),
    # tie 2/2/2 -> trim the last (#3, 2->1): 2, 2, 1.
    assert packing.truncated_lengths([3, 4, 2], 5) == [2, 2, 1]


def reference_features(example, tokenizer, max_seq_length):
    """convert_single_example as the original writes it, token by token."""
    tokens_a = tokenizer.tokenize(example.text_a)
    tokens_b = tokenizer.tokenize(example.text_b) if example.text_b else None
    if tokens_b:
        original_truncate_seq_pair(tokens_a, tokens_b, max_seq_length - 3)
    else:
        tokens_a = tokens_a[: max_seq_length - 2]
    tokens = ["[CLS]"] + tokens_a + ["[SEP]"]
    segment_ids = [0] * len(tokens)
    if tokens_b:
        tokens += tokens_b + ["[SEP]"]
        segment_ids += [1] * (len(tokens_b) + 1)
    input_ids = tokenizer.convert_tokens_to_ids(tokens)
    input_mask = [1] * len(input_ids)
    padding = [0] * (max_seq_length - len(input_ids))
    return input_ids + padding, input_mask + padding, segment_ids + padding


EXAMPLES = [
    classification.InputExample(
        "a", "The quick brown fox jumps over the lazy dog.", "A fox jumped.", "1"
    ),
    classification.InputExample(
        "b",
        "Short.",
        "An unusually long second sentence, which will surely need "
        "truncating before it fits into sixteen tokens.",
        "0",
    ),
    classification.InputExample(
        "c", "A single sentence with no partner at all, long enough to be cut.", None, "1"
    ),
    classification.InputExample("d", "Naïve café résumé — ÜBER straße 東京", "", "0"),
    classification.InputExample("e", "", "Only b has text.", "1"),
    # A text_b with no tokens (a zero-width space is dropped by cleaning): a single sentence, whose
    # a may use the slot of the second [SEP] (it is cut at 14 tokens, not 13).
    classification.InputExample(
        "f",
        "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen",
        "\u200b",
        "0",
    ),
]


@pytest.fixture(scope="module")
def tokenizer(real_vocab):
    return python_tokenizer.FullTokenizer(real_vocab, do_lower_case=True)


def test_convert_examples_matches_the_original(tokenizer):
    features = classification.convert_examples(EXAMPLES, tokenizer, 16, ["0", "1"])
    for i, example in enumerate(EXAMPLES):
        ids, mask, types = reference_features(example, tokenizer, 16)
        assert features["input_ids"][i].tolist() == ids
        assert features["input_mask"][i].tolist() == mask
        assert features["segment_ids"][i].tolist() == types
    assert features["label_ids"].tolist() == [1, 0, 1, 0, 1, 0]
    assert features["input_ids"].dtype == np.int32
    tokens = tokenizer.convert_ids_to_tokens(
        features["input_ids"][0][: features["input_mask"][0].sum()]
    )
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and tokens.count("[SEP]") == 2
    # The empty-b pair: [CLS] a [SEP] over all 16 positions, one [SEP], segment ids all 0.
    tokens = tokenizer.convert_ids_to_tokens(features["input_ids"][5])
    assert (
        tokens
        == ["[CLS]"]
        + "one two three four five six seven eight nine ten eleven twelve thirteen fourteen".split()
        + ["[SEP]"]
    )
    assert features["segment_ids"][5].tolist() == [0] * 16


def test_pack_inputs_in_tf_equals_python_on_random_lengths():
    rng = np.random.default_rng(5)
    seq_length = 12
    for num_segments in (1, 2, 3):
        batch = [
            [list(rng.integers(5, 50, rng.integers(0, 15))) for _ in range(num_segments)]
            for _ in range(40)
        ]
        segments = [
            tf.ragged.constant([row[s] for row in batch], dtype=tf.int32, ragged_rank=1)
            if any(len(row[s]) for row in batch)
            else tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.int32), [0] * len(batch))
            for s in range(num_segments)
        ]
        packed = packing.pack_inputs(segments, seq_length, cls_id=2, sep_id=3)
        for i, row in enumerate(batch):
            ids, mask, types = packing.pack_segments(row, seq_length, cls_id=2, sep_id=3)
            assert packed["input_word_ids"][i].numpy().tolist() == ids.tolist(), (num_segments, row)
            assert packed["input_mask"][i].numpy().tolist() == mask.tolist()
            assert packed["input_type_ids"][i].numpy().tolist() == types.tolist()


def test_pack_inputs_drops_an_empty_b_row_by_row_as_python_does():
    """With drop_empty_b, rows whose b is empty pack as `[CLS] a [SEP]` in a batch that also has pairs."""
    rng = np.random.default_rng(6)
    seq_length = 12
    batch = [
        [
            list(rng.integers(5, 50, rng.integers(0, 15))),
            list(rng.integers(5, 50, rng.integers(0, 3))),
        ]
        for _ in range(60)
    ]
    assert any(not b for _, b in batch) and any(b for _, b in batch)
    segments = [
        tf.ragged.constant([row[s] for row in batch], dtype=tf.int32, ragged_rank=1)
        for s in range(2)
    ]
    packed = packing.pack_inputs(segments, seq_length, cls_id=2, sep_id=3, drop_empty_b=True)
    for i, (a, b) in enumerate(batch):
        ids, mask, types = packing.pack_segments(
            [a, b], seq_length, cls_id=2, sep_id=3, drop_empty_b=True
        )
        if not b:
            # The original's single-sentence layout: a keeps up to seq_length - 2 tokens.
            kept = a[: seq_length - 2]
            assert ids.tolist() == [2] + kept + [3] + [0] * (seq_length - len(kept) - 2)
            assert types.tolist() == [0] * seq_length
        assert packed["input_word_ids"][i].numpy().tolist() == ids.tolist(), (a, b)
        assert packed["input_mask"][i].numpy().tolist() == mask.tolist()
        assert packed["input_type_ids"][i].numpy().tolist() == types.tolist()


def graph_inputs(graph_tokenizer, seq_length, texts_a, texts_b=None):
    """Model inputs for string tensors [batch], tokenized and packed in TensorFlow ops as an export
    packs them (export_graph's packer)."""
    cls_id = graph_tokenizer.special_ids["[CLS]"]
    sep_id = graph_tokenizer.special_ids["[SEP]"]
    segments = [graph_tokenizer.tokenize(texts_a)]
    if texts_b is not None:
        segments.append(graph_tokenizer.tokenize(texts_b))
    # Row by row, a text_b with no tokens packs as a single sentence, as in `convert_examples`.
    return packing.pack_inputs(segments, seq_length, cls_id, sep_id, drop_empty_b=True)


def convert_examples_in_graph(examples, graph_tokenizer, max_seq_length, labels, batch_size=512):
    """The features of `classification.convert_examples`, tokenized and packed in the graph
    (graph_inputs), in batches."""
    count = len(examples)
    features = {
        name: np.zeros((count, max_seq_length), np.int32) for name in packing.MODEL_INPUT_NAMES
    }
    # A missing text_b is an empty one: both pack as a single sentence.
    has_pairs = any(e.text_b is not None for e in examples)
    for start in range(0, count, batch_size):
        rows = examples[start : start + batch_size]
        texts_a = tf.constant([e.text_a for e in rows])
        texts_b = tf.constant([e.text_b or "" for e in rows]) if has_pairs else None
        packed = graph_inputs(graph_tokenizer, max_seq_length, texts_a, texts_b)
        for name, model_name in packing.MODEL_INPUT_NAMES.items():
            features[name][start : start + len(rows)] = packed[model_name].numpy()
    features["label_ids"] = classification.label_values(examples, labels)
    features["is_real_example"] = np.ones(count, np.int32)
    return features


@pytest.mark.slow
def test_graph_conversion_equals_python_conversion(real_vocab, tokenizer):
    graph_tokenizer = GraphTokenizer(real_vocab, do_lower_case=True)
    expected = classification.convert_examples(EXAMPLES, tokenizer, 16, ["0", "1"])
    actual = convert_examples_in_graph(EXAMPLES, graph_tokenizer, 16, ["0", "1"], batch_size=2)
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)


def test_records_round_trip(tmp_path, tokenizer):
    features = classification.convert_examples(EXAMPLES, tokenizer, 16, ["0", "1"])
    path = str(tmp_path / "train.tf_record")
    assert classification.write_records(path, features) == len(EXAMPLES)
    batches = list(
        packing.records_dataset(
            path, classification.feature_spec([16]), batch_size=4, is_training=False
        )
    )
    assert [b["input_word_ids"].shape[0] for b in batches] == [
        4,
        2,
    ]  # the last, short batch is kept
    np.testing.assert_array_equal(
        np.concatenate([b["input_word_ids"] for b in batches]), features["input_ids"]
    )
    np.testing.assert_array_equal(
        np.concatenate([b["input_type_ids"] for b in batches]), features["segment_ids"]
    )
    np.testing.assert_array_equal(
        np.concatenate([b["label_ids"] for b in batches]), features["label_ids"]
    )
    assert batches[0]["input_mask"].dtype == tf.int32
    train = next(
        iter(
            packing.records_dataset(
                path, classification.feature_spec([16]), batch_size=4, is_training=True, seed=1
            )
        )
    )
    assert train["input_word_ids"].shape == (4, 16)
    in_memory = list(packing.features_dataset(features, batch_size=2))
    np.testing.assert_array_equal(
        np.concatenate([b["input_mask"] for b in in_memory]), features["input_mask"]
    )
    assert set(in_memory[0]) == {
        "input_word_ids",
        "input_mask",
        "input_type_ids",
        "label_ids",
        "is_real_example",
    }

    scores = [classification.InputExample(str(i), "x", "y", s) for i, s in enumerate([0.5, 4.25])]
    regression = classification.convert_examples(scores, tokenizer, 8, None)
    path = str(tmp_path / "stsb.tf_record")
    classification.write_records(path, regression)
    batch = next(
        iter(
            packing.records_dataset(
                path, classification.feature_spec([8], is_regression=True), 2, is_training=False
            )
        )
    )
    assert batch["label_ids"].numpy().tolist() == [0.5, 4.25]


def test_tfds_glue_with_mock_data():
    import tensorflow_datasets as tfds

    def as_dataset(self, split, *args, **kwargs):
        # tfds' mnli label order: 0 entailment, 1 neutral, 2 contradiction; test labels are -1.
        labels = [0, 2, 1] if split.startswith("validation") else [-1, -1, -1]
        return tf.data.Dataset.from_tensor_slices(
            {
                "premise": [b"P0", b"P1", b"P2"],
                "hypothesis": [b"H0", b"H1", b"H2"],
                "label": tf.constant(labels, tf.int64),
                "idx": tf.constant([0, 1, 2], tf.int32),
            }
        )

    task = classification.task_from_tfds_name("glue/mnli")
    with pytest.raises(io_utils.UsageError, match="glue/<task>"):
        classification.task_from_tfds_name("squad/v1.1")
    with tfds.testing.mock_data(as_dataset_fn=as_dataset):
        dev = classification.read_tfds_split(task, "dev_mismatched")
        test = classification.read_tfds_split(task, "test_matched")
    assert [(e.text_a, e.text_b, e.label) for e in dev.examples] == [
        ("P0", "H0", "entailment"),
        ("P1", "H1", "contradiction"),
        ("P2", "H2", "neutral"),
    ]
    assert [e.label for e in test.examples] == [None, None, None]
    assert dev.path == "tfds:glue/mnli:validation_mismatched"

    with tfds.testing.mock_data(num_examples=4):
        mrpc = classification.read_tfds_split(classification.get_task("mrpc"), "train")
    assert len(mrpc.examples) == 4
    assert all(e.label in ("0", "1") and e.text_b is not None for e in mrpc.examples)


def test_metrics_per_task():
    mrpc = classification.compute_metrics(
        classification.get_task("mrpc"), [1, 0, 1, 1], [1, 0, 0, 1]
    )
    assert mrpc == pytest.approx({"accuracy": 0.75, "f1": 0.8})  # TP 2, FN 1: 2*2/(2+3)
    assert set(classification.compute_metrics(classification.get_task("cola"), [1, 0], [1, 0])) == {
        "accuracy",
        "mcc",
    }
    stsb = classification.compute_metrics(
        classification.get_task("stsb"), [1.0, 2.0, 3.0], [1.0, 2.0, 4.0]
    )
    assert set(stsb) == {"pearson", "spearman"} and stsb["spearman"] == pytest.approx(1.0)


def test_glue_submission_files(tmp_path):
    mnli = classification.get_task("mnli")
    examples = [classification.InputExample(str(i), "a", "b") for i in range(3)]
    path = classification.write_submission(
        str(tmp_path), mnli, "test_mismatched", examples, [2, 0, 1], list(mnli.labels)
    )
    assert os.path.basename(path) == "MNLI-mm.tsv"
    assert open(path).read() == "index\tprediction\n0\tneutral\n1\tcontradiction\n2\tentailment\n"
    stsb = classification.get_task("stsb")
    path = classification.write_submission(
        str(tmp_path), stsb, "test", examples[:2], [4.12345, 0.5], None
    )
    assert open(path).read() == "index\tprediction\n0\t4.123\n1\t0.500\n"
    names = {
        classification.submission_file(classification.get_task(n), s)
        for n in classification.GLUE_TASK_NAMES
        for s in classification.get_task(n).test_splits
    }
    assert names == {
        "CoLA.tsv",
        "SST-2.tsv",
        "MRPC.tsv",
        "QQP.tsv",
        "STS-B.tsv",
        "MNLI-m.tsv",
        "MNLI-mm.tsv",
        "QNLI.tsv",
        "RTE.tsv",
        "WNLI.tsv",
    }


def test_demo_glue_dir_is_deterministic_balanced_and_keyword_labelled(tmp_path):
    first = demo_datasets.write_demo_glue_dir(str(tmp_path / "a"))
    second = demo_datasets.write_demo_glue_dir(str(tmp_path / "b"))
    for split in ("train", "dev", "test"):
        assert (
            open(os.path.join(first, f"{split}.tsv")).read()
            == open(os.path.join(second, f"{split}.tsv")).read()
        )
    task = classification.get_task("sst2")
    train = classification.read_split(task, first, "train").examples
    dev = classification.read_split(task, first, "dev").examples
    test = classification.read_split(task, first, "test").examples
    assert (len(train), len(dev), len(test)) == (400, 100, 100)
    assert sum(e.label == "1" for e in train) == 200
    # The label is a function of the keyword: exactly one keyword, of the label's polarity.
    for example in train + dev:
        words = set(example.text_a.split())
        positive = words & set(demo_datasets._SENTIMENT_POSITIVE)
        negative = words & set(demo_datasets._SENTIMENT_NEGATIVE)
        assert len(positive | negative) == 1
        assert bool(positive) == (example.label == "1")
    assert len({e.text_a for e in train}) > 300  # varied, not a handful of repeated sentences


def test_text_readers_name_the_line_of_bad_utf8_and_read_gzip(tmp_path):
    bad = b"\xff\xfe broken\n"
    (tmp_path / "train.tsv").write_bytes(b"sentence\tlabel\ngood one\t1\n" + bad)
    with pytest.raises(data_files.DataFormatError, match=r"train\.tsv:3: not UTF-8"):
        classification.read_split(classification.get_task("sst2"), str(tmp_path), "train")
    (tmp_path / "train.txt").write_bytes(b"bob B-PER\n\n" + bad.replace(b"\n", b" O\n"))
    with pytest.raises(data_files.DataFormatError, match=r"train\.txt:3: not UTF-8"):
        ner.read_conll(str(tmp_path / "train.txt"))
    (tmp_path / "input.txt").write_bytes(b"a ||| b\n" + bad)
    with pytest.raises(data_files.DataFormatError, match=r"input\.txt:2: not UTF-8"):
        data_files.read_text_pairs(str(tmp_path / "input.txt"))

    # Gzipped files read like plain ones; line endings (CRLF too) are dropped.
    path = str(tmp_path / "lines.tsv.gz")
    with gzip.open(path, "wt", encoding="utf-8", newline="") as f:
        f.write("text\tlabel\r\ncafé au lait\t1\n")
    assert list(data_files.decoded_lines(path)) == [(1, "text\tlabel"), (2, "café au lait\t1")]
    assert list(classification.read_rows(path)) == [
        (1, ["text", "label"]),
        (2, ["café au lait", "1"]),
    ]


def test_gz_on_a_tensorflow_file_system_is_decompressed():
    # ram:// goes through tf.io.gfile as gs:// does; gzip.open alone cannot open such a path.
    path = "ram://decoded_lines/train.tsv.gz"
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(gzip.compress("text\tlabel\r\ncafé\t1\n".encode("utf-8")))
    assert list(data_files.decoded_lines(path)) == [(1, "text\tlabel"), (2, "café\t1")]
