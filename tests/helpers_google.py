"""Google's original checkpoint layout, and an independent NumPy BERT to check conversions against.

Shared by the tests that start from an original checkpoint (test_checkpoints, test_extract_features,
test_finetuning, test_initial_weights, test_run_pretraining).
"""

import json
import math
import os

import numpy as np
import tensorflow as tf
from helpers import TINY_CONFIG, write_tiny_vocab
from safetensors.numpy import save_file


def google_config(config):
    """`config` in bert_config.json's own terms, as Google's files hold it (no do_lower_case)."""
    values = config.to_dict()
    for name in ("do_lower_case", "config_version"):
        values.pop(name, None)
    return values


# The one tiny config (helpers.TINY_CONFIG) as Google's bert_config.json would hold it.
GOOGLE_TINY = google_config(TINY_CONFIG)


def original_shapes(c, with_heads=True):
    """Every variable of Google's bert_model.ckpt with its shape, written out from the BERT source."""
    h, i_size = c["hidden_size"], c["intermediate_size"]
    shapes = {
        "bert/embeddings/word_embeddings": (c["vocab_size"], h),
        "bert/embeddings/token_type_embeddings": (c["type_vocab_size"], h),
        "bert/embeddings/position_embeddings": (c["max_position_embeddings"], h),
        "bert/embeddings/LayerNorm/gamma": (h,),
        "bert/embeddings/LayerNorm/beta": (h,),
        "bert/pooler/dense/kernel": (h, h),
        "bert/pooler/dense/bias": (h,),
    }
    for n in range(c["num_hidden_layers"]):
        p = f"bert/encoder/layer_{n}"
        for part in (
            "attention/self/query",
            "attention/self/key",
            "attention/self/value",
            "attention/output/dense",
        ):
            shapes[f"{p}/{part}/kernel"], shapes[f"{p}/{part}/bias"] = (h, h), (h,)
        shapes[f"{p}/intermediate/dense/kernel"], shapes[f"{p}/intermediate/dense/bias"] = (
            (h, i_size),
            (i_size,),
        )
        shapes[f"{p}/output/dense/kernel"], shapes[f"{p}/output/dense/bias"] = (i_size, h), (h,)
        for ln in ("attention/output/LayerNorm", "output/LayerNorm"):
            shapes[f"{p}/{ln}/gamma"], shapes[f"{p}/{ln}/beta"] = (h,), (h,)
    if with_heads:
        shapes.update(
            {
                "cls/predictions/transform/dense/kernel": (h, h),
                "cls/predictions/transform/dense/bias": (h,),
                "cls/predictions/transform/LayerNorm/gamma": (h,),
                "cls/predictions/transform/LayerNorm/beta": (h,),
                "cls/predictions/output_bias": (c["vocab_size"],),
                "cls/seq_relationship/output_weights": (2, h),
                "cls/seq_relationship/output_bias": (2,),
            }
        )
    return shapes


def write_name_based_checkpoint(prefix, tensors):
    """Writes a TF1-style (name-based, tensor bundle V2) checkpoint, the format of bert_model.ckpt."""
    names = sorted(tensors)
    tf.raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=names,
        shape_and_slices=[""] * len(names),
        tensors=[tf.constant(tensors[n]) for n in names],
    )


def random_weights(c, seed=0, with_heads=True):
    """Random float32 weights under the original names; LayerNorm gammas near 1 like trained ones."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in original_shapes(c, with_heads).items():
        scale = 0.5 if "embeddings" in name else 0.3
        value = rng.normal(0, scale, size=shape)
        if name.endswith("gamma"):
            value = 1 + 0.1 * value
        weights[name] = value.astype(np.float32)
    return weights


# --- An independent NumPy forward pass of the original BERT (modeling.py of google-research/bert). ---


def np_gelu(x):
    # The original's `gelu` (google-research/bert modeling.py, since Feb 2019) is the tanh approximation:
    # cdf = 0.5 * (1.0 + tf.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * tf.pow(x, 3)))); return x * cdf.
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def np_gelu_exact(x):
    """The exact erf GELU: Hugging Face's "gelu", and not what a Google checkpoint was trained with."""
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def np_layer_norm(x, gamma, beta, eps=1e-12):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def np_activation(hidden_act):
    """The NumPy activation for a bert_config.json hidden_act in bert_tf's terms: "gelu" is Google's
    tanh approximation, "gelu_exact" the erf form (Hugging Face's "gelu")."""
    return {"gelu": np_gelu, "gelu_exact": np_gelu_exact, "relu": lambda x: np.maximum(x, 0)}[
        hidden_act
    ]


def np_log_softmax(logits):
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


class NumpyBert:
    """The original BERT's forward pass on one batch, from weights under the original names.

    Follows google-research/bert: modeling.py for the encoder, run_pretraining.py's
    get_masked_lm_output and get_next_sentence_output for the heads. Everything is float64.
    `left_to_right` (the paper's LTR model): position i attends to real positions <= i only, and
    the pooler reads each row's last real token instead of [CLS].
    """

    def __init__(self, w, c, ids, mask, types, gelu=np_gelu, left_to_right=False):
        self.w = w = {k: v.astype(np.float64) for k, v in w.items()}
        self.gelu = gelu
        b, s = ids.shape
        h, heads = c["hidden_size"], c["num_attention_heads"]
        d = h // heads
        x = (
            w["bert/embeddings/word_embeddings"][ids]
            + w["bert/embeddings/token_type_embeddings"][types]
            + w["bert/embeddings/position_embeddings"][:s][None]
        )
        x = np_layer_norm(
            x, w["bert/embeddings/LayerNorm/gamma"], w["bert/embeddings/LayerNorm/beta"]
        )
        self.embedding_output = x
        allowed = np.broadcast_to(mask[:, None, None, :] > 0, (b, 1, s, s))
        if left_to_right:
            allowed = allowed & np.tril(np.ones((s, s), bool))
        adder = np.where(allowed, 0.0, -10000.0)
        self.layers = []
        for n in range(c["num_hidden_layers"]):
            p = f"bert/encoder/layer_{n}/"

            def dense(t, name):
                return t @ w[p + name + "/kernel"] + w[p + name + "/bias"]

            def split(t):
                return t.reshape(b, s, heads, d).transpose(0, 2, 1, 3)

            q, k, v = (
                split(dense(x, f"attention/self/{part}")) for part in ("query", "key", "value")
            )
            scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + adder
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            context = (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, h)
            attention = np_layer_norm(
                dense(context, "attention/output/dense") + x,
                w[p + "attention/output/LayerNorm/gamma"],
                w[p + "attention/output/LayerNorm/beta"],
            )
            ff = dense(gelu(dense(attention, "intermediate/dense")), "output/dense")
            x = np_layer_norm(
                ff + attention, w[p + "output/LayerNorm/gamma"], w[p + "output/LayerNorm/beta"]
            )
            self.layers.append(x)
        self.sequence_output = x
        # None without a pooler (Hugging Face's BertForMaskedLM has none).
        pooled_token = x[np.arange(b), (mask > 0).sum(1) - 1] if left_to_right else x[:, 0]
        self.pooled_output = (
            np.tanh(pooled_token @ w["bert/pooler/dense/kernel"] + w["bert/pooler/dense/bias"])
            if "bert/pooler/dense/kernel" in w
            else None
        )

    def mlm_logits(self, positions):
        """get_masked_lm_output's logits [b, P, vocab] at `positions` [b, P] only: gather, transform
        dense with the config's activation, LayerNorm (eps 1e-12), the word embeddings transposed
        (tied), plus cls/predictions/output_bias."""
        w = self.w
        gathered = np.take_along_axis(self.sequence_output, positions[:, :, None], axis=1)
        t = self.gelu(
            gathered @ w["cls/predictions/transform/dense/kernel"]
            + w["cls/predictions/transform/dense/bias"]
        )
        t = np_layer_norm(
            t,
            w["cls/predictions/transform/LayerNorm/gamma"],
            w["cls/predictions/transform/LayerNorm/beta"],
        )
        return t @ w["bert/embeddings/word_embeddings"].T + w["cls/predictions/output_bias"]

    def nsp_logits(self):
        """get_next_sentence_output's logits [b, 2] (label 0 is IsNext): the pooled output times
        output_weights [2, H] transposed, plus output_bias."""
        w = self.w
        return (
            self.pooled_output @ w["cls/seq_relationship/output_weights"].T
            + w["cls/seq_relationship/output_bias"]
        )


def np_bert(w, c, ids, mask, types, positions, gelu=np_gelu):
    """Returns sequence_output, pooled_output, all layer outputs, MLM logits, NSP logits (float64);
    a head whose weights `w` lacks gives None."""
    bert = NumpyBert(w, c, ids, mask, types, gelu)
    mlm = bert.mlm_logits(positions) if "cls/predictions/output_bias" in w else None
    nsp = bert.nsp_logits() if "cls/seq_relationship/output_bias" in w else None
    return bert.sequence_output, bert.pooled_output, bert.layers, mlm, nsp


def write_google_dir(path, weights, config=GOOGLE_TINY, extra_tensors=None):
    """A directory laid out like Google's release: bert_model.ckpt.*, bert_config.json, vocab.txt
    (write_tiny_vocab's tokens: [PAD] [UNK] [CLS] [SEP] [MASK] w0 w1 ...)."""
    os.makedirs(path, exist_ok=True)
    write_name_based_checkpoint(
        os.path.join(path, "bert_model.ckpt"), {**weights, **(extra_tensors or {})}
    )
    with open(os.path.join(path, "bert_config.json"), "w") as f:
        json.dump(config, f)
    write_tiny_vocab(os.path.join(path, "vocab.txt"), config["vocab_size"])
    return os.path.join(path, "bert_model.ckpt")


# --- Hugging Face checkpoints, written out as transformers' BertFor* state_dicts name them. ---

NSP_KEYS = ("cls/seq_relationship/output_weights", "cls/seq_relationship/output_bias")


def hf_state_dict(w, c, kind, old_layer_norm_names=False, tied_copies=True):
    """The state_dict of a transformers `kind` (BertForPreTraining, BertForMaskedLM or BertModel) whose
    weights are `w` (original names), spelled out from transformers' modeling_bert.py, not from the
    converter: Linear weights are [out, in], LayerNorm weight/bias (gamma/beta in files saved by old
    versions), BertModel's keys have no `bert.` prefix, BertForMaskedLM has no pooler
    (add_pooling_layer=False) and no NSP head. `tied_copies`: the decoder's weight and bias as the
    state_dict holds them (tied to the word embeddings and cls.predictions.bias); save_pretrained
    leaves them out of model.safetensors."""
    prefix = "" if kind == "BertModel" else "bert."
    ln = ("gamma", "beta") if old_layer_norm_names else ("weight", "bias")
    state = {
        f"{prefix}embeddings.word_embeddings.weight": w["bert/embeddings/word_embeddings"],
        f"{prefix}embeddings.position_embeddings.weight": w["bert/embeddings/position_embeddings"],
        f"{prefix}embeddings.token_type_embeddings.weight": w[
            "bert/embeddings/token_type_embeddings"
        ],
        f"{prefix}embeddings.LayerNorm.{ln[0]}": w["bert/embeddings/LayerNorm/gamma"],
        f"{prefix}embeddings.LayerNorm.{ln[1]}": w["bert/embeddings/LayerNorm/beta"],
    }
    for n in range(c["num_hidden_layers"]):
        src, dst = f"bert/encoder/layer_{n}", f"{prefix}encoder.layer.{n}"
        for ours, theirs in (
            ("attention/self/query", "attention.self.query"),
            ("attention/self/key", "attention.self.key"),
            ("attention/self/value", "attention.self.value"),
            ("attention/output/dense", "attention.output.dense"),
            ("intermediate/dense", "intermediate.dense"),
            ("output/dense", "output.dense"),
        ):
            state[f"{dst}.{theirs}.weight"] = w[f"{src}/{ours}/kernel"].T
            state[f"{dst}.{theirs}.bias"] = w[f"{src}/{ours}/bias"]
        for ours, theirs in (
            ("attention/output/LayerNorm", "attention.output.LayerNorm"),
            ("output/LayerNorm", "output.LayerNorm"),
        ):
            state[f"{dst}.{theirs}.{ln[0]}"] = w[f"{src}/{ours}/gamma"]
            state[f"{dst}.{theirs}.{ln[1]}"] = w[f"{src}/{ours}/beta"]
    if kind != "BertForMaskedLM":
        state[f"{prefix}pooler.dense.weight"] = w["bert/pooler/dense/kernel"].T
        state[f"{prefix}pooler.dense.bias"] = w["bert/pooler/dense/bias"]
    if kind in ("BertForPreTraining", "BertForMaskedLM"):
        state.update(
            {
                "cls.predictions.bias": w["cls/predictions/output_bias"],
                "cls.predictions.transform.dense.weight": w[
                    "cls/predictions/transform/dense/kernel"
                ].T,
                "cls.predictions.transform.dense.bias": w["cls/predictions/transform/dense/bias"],
                f"cls.predictions.transform.LayerNorm.{ln[0]}": w[
                    "cls/predictions/transform/LayerNorm/gamma"
                ],
                f"cls.predictions.transform.LayerNorm.{ln[1]}": w[
                    "cls/predictions/transform/LayerNorm/beta"
                ],
            }
        )
        if tied_copies:
            state["cls.predictions.decoder.weight"] = w["bert/embeddings/word_embeddings"]
            state["cls.predictions.decoder.bias"] = w["cls/predictions/output_bias"]
    if kind == "BertForPreTraining":
        state["cls.seq_relationship.weight"] = w["cls/seq_relationship/output_weights"]  # [2, H]
        state["cls.seq_relationship.bias"] = w["cls/seq_relationship/output_bias"]
    return {name: np.ascontiguousarray(value) for name, value in state.items()}


def write_hf_dir(path, state, kind, hidden_act="gelu", c=GOOGLE_TINY):
    """A Hugging Face model directory: config.json, vocab.txt, tokenizer_config.json and
    model.safetensors (with transformers' {"format": "pt"} metadata)."""
    os.makedirs(path, exist_ok=True)
    config = {
        "architectures": [kind],
        "model_type": "bert",
        "hidden_act": hidden_act,
        "layer_norm_eps": 1e-12,
        "position_embedding_type": "absolute",
        "pad_token_id": 0,
        "tie_word_embeddings": True,
        **{k: v for k, v in c.items() if k != "hidden_act"},
    }
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"do_lower_case": True}, f)
    write_tiny_vocab(os.path.join(path, "vocab.txt"), c["vocab_size"])
    save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return str(path)


def hf_weights(kind, seed=0):
    """Random weights under the original names, with what a transformers `kind` holds."""
    w = random_weights(GOOGLE_TINY, seed=seed)
    if kind != "BertForPreTraining":
        for name in NSP_KEYS:
            del w[name]
    if kind == "BertModel":
        w = {k: v for k, v in w.items() if not k.startswith("cls/")}
    if kind == "BertForMaskedLM":
        del w["bert/pooler/dense/kernel"], w["bert/pooler/dense/bias"]
    return w


def original_masked_positions(tokens, masked_lm_prob, max_predictions_per_seq, rng, whole_word):
    """The positions the original create_masked_lm_predictions masks in `tokens` (strings, laid
    out as [CLS] A [SEP] B [SEP]), written from google-research/bert's code with its own
    random.Random calls: candidates are every token but [CLS] and [SEP], grouped with the `##`
    pieces after them when `whole_word`; the groups are shuffled; groups are taken in order until
    num_to_predict, skipping (not stopping at) a group that would overshoot it. Sorted."""
    groups = []
    for index, token in enumerate(tokens):
        if token in ("[CLS]", "[SEP]"):
            continue
        if whole_word and groups and token.startswith("##"):
            groups[-1].append(index)
        else:
            groups.append([index])
    rng.shuffle(groups)
    budget = min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))
    masked = []
    for group in groups:
        if len(masked) >= budget:
            break
        if len(masked) + len(group) > budget:
            continue
        masked.extend(group)
    return sorted(masked)
