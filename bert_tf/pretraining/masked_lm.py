"""BERT's two pretraining tasks: the losses a pretraining run optimizes, and asking a trained model.

`PretrainingObjective` is what run_pretraining trains. `MaskedLM` asks a model directory with
pretraining heads (pretrained here, or converted from Google's or Hugging Face's checkpoints) the
two questions it was trained on:

    model = MaskedLM("models/bert-base")
    model.fill_mask(["the capital of france is [MASK] ."], top_k=5)   # a FillMaskResult per text
    model.next_sentence(["he went to the store ."], ["he bought milk ."])  # IsNext probabilities

A literal [MASK] (and [SEP]) in the text is that token, with any casing setting. The MLM head runs
at the masked positions only: it gathers them before the vocabulary projection, so a call never
computes [b, s, vocab] logits. Probabilities are the softmax of the logits, as Hugging Face's
fill-mask pipeline gives them; in the original's NSP, label 0 is IsNext. A left-to-right model
(run_pretraining --objective=ltr) answers no fill-mask: its head predicts the next token.

The loss is the original's formula taken over the GLOBAL batch: the masked-LM cross-entropy
averaged over the real (weight 1) predictions, sum(weight * xent) / (sum(weight) + 1e-5), both
sums taken over all replicas (every replica divides its own sum by the all-reduced weight count,
so the per-replica shares add up to the global figure whatever the replicas' mask counts), plus
the NSP cross-entropy averaged over the global batch with tf.nn.compute_average_loss. So any number
of replicas trains as the original does on one device. On a TPU the original computes the loss
per core, over that core's share of the batch, and sums the cores' gradients, each clipped on
its own (see bert_tf.training.optimization). Without NSP (run_pretraining --nsp=false) the loss is the
masked-LM term alone; the left-to-right objective is bert_tf.pretraining.left_to_right_lm's.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from bert_tf.model import modeling
from bert_tf.model.model_dir import MLM_HEAD, NSP_HEAD, ModelDir, ModelDirError, describe_heads
from bert_tf.model.objective import Objective
from bert_tf.pretraining import input_pipeline
from bert_tf.tasks import packing
from bert_tf.tokenization import python_tokenizer

MODEL_INPUTS = modeling.ENCODER_INPUTS + ("masked_lm_positions",)
MLM_LOSS_EPSILON = 1e-5
MASK_TOKEN = "[MASK]"
# Said with every "has no [MASK]": a lower-case [mask] is text to the tokenizer, not the token.
MASK_CASE_HINT = f"(the token is {MASK_TOKEN}, in capitals)"
# The literal tokens a fill-mask text may hold, as Hugging Face's tokenizers keep them whole.
TEXT_SPECIAL_TOKENS = ("[MASK]", "[SEP]")
DEFAULT_TOP_K = 5
_NEEDS = {MLM_HEAD: "fill-mask needs its MLM head", NSP_HEAD: "next-sentence needs its NSP head"}


class PretrainingObjective(Objective):
    """MLM + NSP losses and their metrics, for training_loop.Trainer; the MLM's alone without `nsp`
    (the paper's "No NSP" ablation: `model` then has no NSP head, and nothing of NSP is reported)."""

    MLM_STATS = ("loss", "mlm_loss_sum", "mlm_correct", "mlm_weight")
    NSP_STATS = ("nsp_loss_sum", "nsp_correct", "examples")
    stat_names = MLM_STATS + NSP_STATS

    def __init__(self, model, nsp=True):
        self.model = model
        self.nsp = nsp
        self.stat_names = self.MLM_STATS + (self.NSP_STATS if nsp else ())

    def denominators(self, batch):
        """This replica's count of real masked positions (and, with NSP, of examples)."""
        counts = {"mlm_weight": tf.reduce_sum(batch["masked_lm_weights"])}
        if self.nsp:
            counts["examples"] = tf.cast(tf.shape(batch["next_sentence_labels"])[0], tf.float32)
        return counts

    def loss_and_stats(self, batch, global_denominators, training):
        """This replica's share of the global loss, and its sums for the metrics."""
        outputs = self.model({name: batch[name] for name in MODEL_INPUTS}, training=training)
        mlm_logits = tf.cast(outputs["mlm_logits"], tf.float32)
        weights = batch["masked_lm_weights"]
        mlm_xent = tf.nn.sparse_softmax_cross_entropy_with_logits(
            batch["masked_lm_ids"], mlm_logits
        )
        mlm_loss_sum = tf.reduce_sum(weights * mlm_xent)
        # The original's denominator: sum(weights) + 1e-5 (here the global sum over replicas).
        mlm_loss = mlm_loss_sum / (global_denominators["mlm_weight"] + MLM_LOSS_EPSILON)
        mlm_hits = tf.cast(
            tf.equal(tf.argmax(mlm_logits, -1, output_type=tf.int32), batch["masked_lm_ids"]),
            tf.float32,
        )
        # The local denominators (mlm_weight, examples) are also the metrics' local sums.
        stats = dict(
            self.denominators(batch),
            mlm_loss_sum=mlm_loss_sum,
            mlm_correct=tf.reduce_sum(weights * mlm_hits),
        )
        if not self.nsp:
            return mlm_loss, stats
        nsp_logits = tf.cast(outputs["nsp_logits"], tf.float32)
        nsp_labels = batch["next_sentence_labels"]
        nsp_xent = tf.nn.sparse_softmax_cross_entropy_with_logits(nsp_labels, nsp_logits)
        nsp_loss = tf.nn.compute_average_loss(
            nsp_xent, global_batch_size=tf.cast(global_denominators["examples"], tf.int32)
        )
        nsp_hits = tf.cast(
            tf.equal(tf.argmax(nsp_logits, -1, output_type=tf.int32), nsp_labels), tf.float32
        )
        stats.update(nsp_loss_sum=tf.reduce_sum(nsp_xent), nsp_correct=tf.reduce_sum(nsp_hits))
        return mlm_loss + nsp_loss, stats

    def metrics(self, sums, num_steps):
        """The original's eval metric names, pooled over the steps."""

        def ratio(a, b):
            return float(sums[a] / sums[b]) if sums[b] else 0.0

        metrics = {
            "loss": float(sums["loss"] / max(num_steps, 1)),
            "masked_lm_loss": ratio("mlm_loss_sum", "mlm_weight"),
            "masked_lm_accuracy": ratio("mlm_correct", "mlm_weight"),
        }
        if self.nsp:
            metrics["next_sentence_loss"] = ratio("nsp_loss_sum", "examples")
            metrics["next_sentence_accuracy"] = ratio("nsp_correct", "examples")
        return metrics


def set_output_bias_to_token_frequencies(
    pretraining_model, files, max_seq_length, max_predictions_per_seq
):
    """Sets the MLM head's output bias to the log frequency of each token among the masked tokens
    of the records `files` (input_pipeline.masked_token_counts), add-one smoothed so that every
    token keeps a finite bias: with the rest of a new head near zero, its first guesses are then
    the answers' frequencies instead of uniform. Returns the number of masked tokens counted."""
    (bias,) = [
        v for v in pretraining_model.get_layer("mlm_head").weights if v.path.endswith("output_bias")
    ]
    counts = input_pipeline.masked_token_counts(
        files, max_seq_length, max_predictions_per_seq, bias.shape[0]
    )
    smoothed = counts + 1.0
    bias.assign(np.log(smoothed / smoothed.sum()).astype(bias.dtype))
    return int(counts.sum())


# ----------------------------------------------------------------------------------------------
# Asking a trained model
# ----------------------------------------------------------------------------------------------


class NoMaskError(ValueError):
    """A fill-mask text without a [MASK]; the message names its row."""


@dataclasses.dataclass
class MaskPrediction:
    """The top-k tokens for one [MASK]: its position in the packed input, the tokens, ids, probabilities."""

    position: int
    tokens: list
    token_ids: list
    probabilities: list


@dataclasses.dataclass
class FillMaskResult:
    """One text's answer: a MaskPrediction for every [MASK] that fits, the best tokens put in, and how
    many [MASK]s truncation cut off (they get no prediction)."""

    text: str
    masks: list
    filled: str
    cut_masks: int = 0


def fill_text(text, best_tokens):
    """`text` with its [MASK]s replaced, in order, by `best_tokens` (WordPiece `##` dropped); [MASK]s
    beyond the tokens stay as they are."""
    parts = text.split(MASK_TOKEN)
    pieces = [parts[0]]
    for index, part in enumerate(parts[1:]):
        token = best_tokens[index] if index < len(best_tokens) else MASK_TOKEN
        pieces.append((token[2:] if token.startswith("##") else token) + part)
    return "".join(pieces)


class MaskedLM:
    """A model directory's pretraining heads, asked in Python: fill-mask and next-sentence.

    `max_seq_length` (default: the model's max_position_embeddings) is where texts are cut, by the
    original's rule. A directory without the head a call needs is refused when the call is made,
    naming the head (ModelDirError, a usage error).

    Examples:
        >>> from bert_tf.pretraining.masked_lm import MaskedLM
        >>> model = MaskedLM("build/demo/pretrained")  # what make demo pretrains: both heads
        >>> (result,) = model.fill_mask(["the [MASK] of the module is returned ."], top_k=3)
        >>> len(result.masks), len(result.masks[0].tokens), len(result.masks[0].probabilities)
        (1, 3, 3)
        >>> result.filled  # the best token in place of the [MASK]
        'the ... of the module is returned .'
        >>> model.next_sentence(["return the value of the attribute ."], ["the default is none ."])
        array([0...], dtype=float32)
    """

    def __init__(self, model_dir, max_seq_length=None):
        self.directory = ModelDir(model_dir)
        self.config = self.directory.load_config()
        self.heads = self.directory.pretraining_heads()
        self.max_seq_length = max_seq_length or self.config.max_position_embeddings
        if not 3 <= self.max_seq_length <= self.config.max_position_embeddings:
            raise ValueError(
                f"max_seq_length must be in [3, {self.config.max_position_embeddings}], "
                f"got {self.max_seq_length}"
            )
        self.tokenizer = python_tokenizer.FullTokenizer(
            self.directory.vocab_file,
            do_lower_case=self.config.do_lower_case,
            special_tokens=TEXT_SPECIAL_TOKENS,
        )
        self.cls_id, self.sep_id = self.tokenizer.vocab["[CLS]"], self.tokenizer.vocab["[SEP]"]
        self.mask_id = self.tokenizer.vocab[MASK_TOKEN]
        self._model = None

    def _pretraining_model(self, head):
        """The pretraining model (loaded once), refusing a directory that lacks `head`, and the MLM
        head of a left-to-right model, which was trained to predict the next token."""
        if head == MLM_HEAD and self.config.left_to_right:
            raise ModelDirError(
                f"{self.directory.path} is a left-to-right language model (its bert_config.json "
                f"has attention_direction={modeling.LEFT_TO_RIGHT}): its LM head predicts the "
                "next token, not a [MASK], so fill-mask means nothing for it"
            )
        if head not in self.heads:
            raise ModelDirError(
                f"{self.directory.path} has {describe_heads(self.heads)}; {_NEEDS[head]}"
            )
        if self._model is None:
            self._model, _ = self.directory.load_pretraining_model(require=(head,))
            self._mlm_logits = tf.function(
                lambda inputs: self._model(inputs, training=False)["mlm_logits"],
                reduce_retracing=True,
            )
            self._nsp_logits = tf.function(
                lambda inputs: self._model(inputs, training=False)["nsp_logits"],
                reduce_retracing=True,
            )
        return self._model

    def _pack(self, segments):
        """Inputs for token-id segments: [CLS] s0 [SEP] (s1 [SEP]), cut by the original rule, at the
        batch's longest length; an empty s1 packs as s0 alone, as fine-tuning and exports pack it."""
        packed = [
            packing.pack_segments(
                ids, self.max_seq_length, self.cls_id, self.sep_id, drop_empty_b=True
            )
            for ids in segments
        ]
        length = max(int(mask.sum()) for _, mask, _ in packed)
        return {
            name: np.stack([row[index][:length] for row in packed]).astype(np.int32)
            for index, name in enumerate(modeling.ENCODER_INPUTS)
        }

    def _masked_logits(self, ids):
        """Token-id rows packed and asked: the [MASK] positions of each row that fit, and the MLM
        logits [rows, most masks in a row, vocab] at them."""
        self._pretraining_model(MLM_HEAD)
        inputs = self._pack([[row_ids] for row_ids in ids])
        positions = [
            np.flatnonzero(row == self.mask_id).tolist() for row in inputs["input_word_ids"]
        ]
        width = max(1, max(len(p) for p in positions))
        inputs["masked_lm_positions"] = np.array(
            [p + [0] * (width - len(p)) for p in positions], np.int32
        )
        return positions, self._mlm_logits(inputs)

    def best_masked_ids(self, ids):
        """For token-id rows holding [MASK] ids, the model's first choice at each [MASK] that fits
        max_seq_length: a list of ids per row, in position order."""
        if not ids:
            return []
        positions, logits = self._masked_logits(ids)
        best = tf.argmax(logits, axis=-1, output_type=tf.int32).numpy()
        return [best[row, : len(p)].tolist() for row, p in enumerate(positions)]

    def fill_mask(self, texts, top_k=DEFAULT_TOP_K):
        """For every [MASK] of every text, the top_k tokens; a FillMaskResult per text.

        A text without a [MASK] is a NoMaskError naming its row, as Hugging Face's pipeline refuses
        it; top_k must be in [1, vocab size].
        """
        if not 1 <= top_k <= self.config.vocab_size:
            raise ValueError(f"top_k must be in [1, {self.config.vocab_size}], got {top_k}")
        ids = [self.tokenizer.encode(text) for text in texts]
        for row, row_ids in enumerate(ids):
            if self.mask_id not in row_ids:
                raise NoMaskError(
                    f"row {row} has no {MASK_TOKEN} {MASK_CASE_HINT}: {texts[row][:80]!r}"
                )
        if not texts:
            return []
        positions, logits = self._masked_logits(ids)
        probabilities, best = tf.math.top_k(tf.nn.softmax(logits, axis=-1), k=top_k)
        probabilities, best = probabilities.numpy(), best.numpy()
        results = []
        for row, text in enumerate(texts):
            masks = [
                MaskPrediction(
                    position=position,
                    tokens=self.tokenizer.convert_ids_to_tokens(best[row, index].tolist()),
                    token_ids=best[row, index].tolist(),
                    probabilities=probabilities[row, index].tolist(),
                )
                for index, position in enumerate(positions[row])
            ]
            results.append(
                FillMaskResult(
                    text=text,
                    masks=masks,
                    filled=fill_text(text, [m.tokens[0] for m in masks]),
                    cut_masks=ids[row].count(self.mask_id) - len(masks),
                )
            )
        return results

    def next_sentence(self, texts_a, texts_b):
        """The IsNext probability of each pair (text_a, text_b): float32 [n]."""
        if len(texts_a) != len(texts_b):
            raise ValueError(f"{len(texts_a)} first texts but {len(texts_b)} second ones")
        if not len(texts_a):
            return np.zeros([0], np.float32)
        self._pretraining_model(NSP_HEAD)
        encode = self.tokenizer.encode
        segments = [[encode(a), encode(b)] for a, b in zip(texts_a, texts_b)]
        inputs = self._pack(segments)
        inputs["masked_lm_positions"] = np.zeros([len(segments), 1], np.int32)
        # Label 0 is IsNext, as in the original's create_pretraining_data.
        return tf.nn.softmax(self._nsp_logits(inputs), axis=-1).numpy()[:, 0]
