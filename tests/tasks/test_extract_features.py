"""python -m bert_tf.extract_features: the original JSON-lines layout, values against a NumPy BERT."""

import json
import os

import numpy as np
import pytest
from helpers import run_module_cli
from helpers_google import GOOGLE_TINY, NumpyBert, random_weights, write_google_dir

from bert_tf import extract_features
from bert_tf.checkpoints import conversion
from bert_tf.runtime import io_utils
from bert_tf.tasks import data_files, feature_extraction
from bert_tf.tokenization import python_tokenizer

SEQ = 10
# Google's vocab in write_google_dir: [PAD] [UNK] [CLS] [SEP] [MASK] w0..w17 -> ids 0..4, 5..22.
LINES = ["w1 w2 w3", "W4 w5 ||| w6 w7 w8", "w0 w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 ||| w11 w12 w13"]


def expected_packing():
    """(tokens, ids, mask, type ids) of LINES, packed and truncated by hand with the original rule."""
    rows = [
        (["w1", "w2", "w3"], None),
        (["w4", "w5"], ["w6", "w7", "w8"]),
        # 14 tokens for 7 slots: trim the longer segment first until both fit (a: 4, b: 3).
        (["w0", "w1", "w2", "w3"], ["w11", "w12", "w13"]),
    ]
    tokens, ids, mask, types = (
        [],
        np.zeros((3, SEQ), np.int32),
        np.zeros((3, SEQ), np.int32),
        np.zeros((3, SEQ), np.int32),
    )
    for row, (a, b) in enumerate(rows):
        line = ["[CLS]"] + a + ["[SEP]"] + (b + ["[SEP]"] if b else [])
        tokens.append(line)
        ids[row, : len(line)] = [{"[CLS]": 2, "[SEP]": 3}.get(t) or 5 + int(t[1:]) for t in line]
        mask[row, : len(line)] = 1
        if b:
            types[row, len(a) + 2 : len(line)] = 1
    return tokens, ids, mask, types


@pytest.fixture(scope="module")
def google(tmp_path_factory):
    """An original-layout checkpoint (with cls/ heads, which feature extraction ignores) and its weights."""
    root = tmp_path_factory.mktemp("google")
    weights = random_weights(GOOGLE_TINY, seed=5)
    prefix = write_google_dir(str(root / "google"), weights)
    input_file = root / "input.txt"
    input_file.write_text("\n".join(LINES) + "\n")
    return {
        "weights": weights,
        "prefix": prefix,
        "dir": os.path.dirname(prefix),
        "input_file": str(input_file),
    }


def read_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def check_against_numpy(lines, weights, layers):
    """Every token's values equal the NumPy BERT's layer activations (to the 6 written decimals);
    layer "embeddings" is its embedding layer's output."""
    tokens, ids, mask, types = expected_packing()
    bert = NumpyBert(weights, GOOGLE_TINY, ids, mask, types)
    np_layers = {"embeddings": bert.embedding_output, **dict(enumerate(bert.layers))}
    np_layers.update({i - len(bert.layers): layer for i, layer in enumerate(bert.layers)})
    assert [line["linex_index"] for line in lines] == [0, 1, 2]
    for row, line in enumerate(lines):
        assert [f["token"] for f in line["features"]] == tokens[row]
        for position, feature in enumerate(line["features"]):
            assert [layer["index"] for layer in feature["layers"]] == layers
            for layer in feature["layers"]:
                assert len(layer["values"]) == GOOGLE_TINY["hidden_size"]
                np.testing.assert_allclose(
                    layer["values"], np_layers[layer["index"]][row, position], atol=2e-5
                )


@pytest.mark.slow
def test_cli_from_an_original_checkpoint_matches_numpy_bert(google, tmp_path):
    output_file = tmp_path / "features.jsonl"
    process = run_module_cli(
        "bert_tf.extract_features",
        f"--input_file={google['input_file']}",
        f"--output_file={output_file}",
        f"--init_checkpoint={google['prefix']}",
        f"--bert_config_file={google['dir']}/bert_config.json",
        f"--vocab_file={google['dir']}/vocab.txt",
        f"--max_seq_length={SEQ}",
        "--layers=-1,-2",
        "--batch_size=2",
    )
    assert process.returncode == 0, process.stderr[-3000:]
    lines = read_lines(output_file)
    assert set(lines[0]) == {"linex_index", "features"}
    assert set(lines[0]["features"][0]) == {"token", "layers"}
    assert set(lines[0]["features"][0]["layers"][0]) == {"index", "values"}
    check_against_numpy(lines, google["weights"], [-1, -2])


def test_a_model_directory_gives_the_same_features(google, tmp_path):
    model_dir = str(tmp_path / "model")
    conversion.convert("google", google["prefix"], model_dir, do_lower_case=True)
    output_file = str(tmp_path / "features.jsonl")
    count = extract_features.run(
        extract_features.ExtractArgs(
            input_file=google["input_file"],
            output_file=output_file,
            init_checkpoint=model_dir,
            max_seq_length=SEQ,
            layers="0,-1,embeddings",
        )
    )
    assert count == 3
    check_against_numpy(read_lines(output_file), google["weights"], [0, -1, "embeddings"])


def test_bad_layers_and_missing_input_are_usage_errors(google, tmp_path):
    base = dict(
        output_file=str(tmp_path / "out.jsonl"),
        init_checkpoint=google["prefix"],
        bert_config_file=os.path.join(google["dir"], "bert_config.json"),
        vocab_file=os.path.join(google["dir"], "vocab.txt"),
        max_seq_length=SEQ,
    )
    with pytest.raises(
        io_utils.UsageError, match="--layers: -3 is out of range for a model with 2 layers"
    ):
        extract_features.run(
            extract_features.ExtractArgs(input_file=google["input_file"], layers="-1,-3", **base)
        )
    with pytest.raises(io_utils.UsageError, match="--layers=-1,embedding: expected"):
        extract_features.run(
            extract_features.ExtractArgs(
                input_file=google["input_file"], layers="-1,embedding", **base
            )
        )
    with pytest.raises(io_utils.UsageError, match="--input_file file not found"):
        extract_features.run(
            extract_features.ExtractArgs(input_file=str(tmp_path / "none.txt"), **base)
        )
    assert not os.path.exists(base["output_file"])


def test_pairs_split_at_the_last_spaced_separator_as_the_original(tmp_path):
    # The original matches r"^(.*) \|\|\| (.*)$": spaces around "|||" required, greedy first part.
    path = tmp_path / "input.txt"
    path.write_text("a|||b\nx ||| y ||| z\n  p ||| q  \n\n||| r\n")
    assert data_files.read_text_pairs(str(path)) == [
        ("a|||b", None),
        ("x ||| y", "z"),
        ("p", "q"),
        ("", None),
        ("||| r", None),
    ]


def test_a_b_without_tokens_gives_a_single_sentence_input(google):
    """`a ||| \u200b`: b tokenizes to nothing, so the input is `[CLS] a [SEP]` (the original's `if tokens_b:`)."""
    tokenizer = python_tokenizer.FullTokenizer(
        os.path.join(google["dir"], "vocab.txt"), do_lower_case=True
    )
    features, tokens = feature_extraction.pack(
        [("w1 w2 w3 w4 w5 w6 w7 w8", "\u200b"), ("w1", "w2")], tokenizer, SEQ
    )
    # The single sentence keeps SEQ - 2 = 8 tokens; as a pair it would have kept 7, then two [SEP]s.
    assert tokens[0] == ["[CLS]", "w1", "w2", "w3", "w4", "w5", "w6", "w7", "w8", "[SEP]"]
    assert features["input_ids"][0].tolist() == [2, 6, 7, 8, 9, 10, 11, 12, 13, 3]
    assert features["segment_ids"][0].tolist() == [0] * SEQ
    assert tokens[1] == ["[CLS]", "w1", "[SEP]", "w2", "[SEP]"]
