"""The exported pretraining heads: `fill_mask` and `next_sentence` signatures, strings in.

bert_tf.export adds them to a pretrained model's export, beside the TF Hub encoder's
`serving_default`, when the model directory has the heads (`fill_mask` needs the MLM head,
`next_sentence` the NSP head):

- `fill_mask` takes `text` string [b] and `top_k` int32 [] (a SignatureDef default of 5, which TF
  Serving fills in when a request leaves it out) and returns, for the [MASK]s that survive
  truncation, `tokens` string [b, m, k], `token_ids` int32 [b, m, k], `probabilities` float32
  [b, m, k] and `mask_positions` int32 [b, m] (positions in the packed input), where m is the
  batch's largest number of such [MASK]s (padding: "", -1, 0 and -1), and `filled` string [b], the
  text with the best tokens put in (WordPiece `##` dropped; a [MASK] cut by truncation stays).
- `next_sentence` takes `text_a` and `text_b` string [b] and returns `is_next_probability`
  float32 [b] (the original's NSP label 0, IsNext).

A literal [MASK] or [SEP] in the text is that token, whatever the casing (GraphTokenizer's
special_tokens); texts are packed and cut as bert_tf.pretraining.masked_lm packs them, each batch padded to its
longest row. A row without a [MASK] fails the call (INVALID_ARGUMENT, naming the row), as Hugging
Face's pipeline refuses it, and so does a top_k outside [1, vocab size], and a call whose answer
would hold more than MAX_ANSWERS tokens (rows x surviving [MASK]s x top_k), refused before the
model runs: its outputs would grow with what a client asks, not with what it sends. A batch of 0
rows gives empty outputs.

Over gRPC and in `tf.saved_model.load`, `top_k` may be left out (5). TF Serving's REST API reads
every input of the signature from a request, defaults or not (json_tensor.cc,
FillTensorMapFromInputsMap and FillTensorMapFromInstancesList), so there a request without
`top_k` gets 400 "Missing named input: top_k in 'inputs' object.", and bert_tf.serve answers the
same. The MLM head gathers the masked positions before the vocabulary projection: a call
never computes [b, s, vocab] logits.
"""

import tensorflow as tf

from bert_tf.model.model_dir import MLM_HEAD, NSP_HEAD
from bert_tf.pretraining.masked_lm import DEFAULT_TOP_K, MASK_CASE_HINT, MASK_TOKEN
from bert_tf.tasks import export_graph
from bert_tf.tokenization.tokenizer_rules import load_vocab

# The most tokens one fill_mask call answers (rows x [MASK]s x top_k): about 40 MB of outputs.
MAX_ANSWERS = 1 << 20


def _ragged_positions(is_mask):
    """The column of every True of `is_mask` [b, s], per row: RaggedTensor int32 [b, (masks)]."""
    where = tf.cast(tf.where(is_mask), tf.int32)
    return tf.RaggedTensor.from_value_rowids(
        where[:, 1], where[:, 0], nrows=tf.shape(is_mask, out_type=tf.int32)[0]
    )


def fill_texts(texts, best_tokens, surviving):
    """`texts` [b] with their [MASK]s replaced in order by `best_tokens` [b, m] (`##` dropped), the
    first `surviving` [b] of them; the rest stay [MASK]."""
    parts = tf.strings.split(texts, sep=MASK_TOKEN)  # [b, (masks + 1)]
    after = parts[:, 1:]
    index = tf.ragged.range(tf.cast(after.row_lengths(), tf.int32))
    best = tf.strings.regex_replace(best_tokens, "^##", "")
    # Column m of the padded tokens is [MASK]: where a row's later [MASK]s (cut) point.
    padded = tf.pad(best, [[0, 0], [0, 1]], constant_values=MASK_TOKEN)
    rows = tf.cast(index.value_rowids(), tf.int32)
    kept = index.flat_values < tf.gather(tf.cast(surviving, tf.int32), rows)
    column = tf.where(kept, index.flat_values, tf.shape(best)[1])
    fills = index.with_flat_values(tf.gather_nd(padded, tf.stack([rows, column], axis=1)))
    pieces = tf.strings.join([fills, after])
    # Every row splits into at least one part: its first part starts the row.
    first = tf.gather(parts.flat_values, parts.row_starts())
    return tf.strings.join([first, tf.strings.reduce_join(pieces, axis=1)])


class HeadsModule(tf.Module):
    """The signatures of a pretraining model's heads; `signatures()` lists those it has."""

    def __init__(self, pretraining_model, heads, packer, vocab_file, vocab_size):
        super().__init__()
        self.model = pretraining_model
        self.heads = frozenset(heads)
        self.packer = packer  # its GraphTokenizer keeps [MASK] and [SEP] whole
        self.vocab_size = vocab_size
        self.mask_id = packer.tokenizer.special_ids[MASK_TOKEN]
        vocab = load_vocab(vocab_file)
        self.vocab_tokens = tf.constant(sorted(vocab, key=vocab.get))
        text = export_graph.text_spec("text")
        top_k = tf.TensorSpec([], tf.int32, name="top_k")
        if MLM_HEAD in self.heads:
            self.fill_mask = export_graph.serving_function(
                self._fill_mask, input_signature=[text, top_k]
            )
        if NSP_HEAD in self.heads:
            self.next_sentence = export_graph.serving_function(
                self._next_sentence,
                input_signature=[
                    export_graph.text_spec("text_a"),
                    export_graph.text_spec("text_b"),
                ],
            )

    def signatures(self):
        """signature key -> (tf.function with an input signature, method name)."""
        result = {}
        if MLM_HEAD in self.heads:
            result["fill_mask"] = (self.fill_mask, tf.saved_model.PREDICT_METHOD_NAME)
        if NSP_HEAD in self.heads:
            result["next_sentence"] = (self.next_sentence, tf.saved_model.PREDICT_METHOD_NAME)
        return result

    def _checks(self, ids, top_k):
        """Assertions: every row has a [MASK] (before truncation), top_k is in [1, vocab size]."""
        has_mask = tf.reduce_any(tf.equal(ids, self.mask_id), axis=1)
        # (An extra False keeps argmin defined on an empty batch, which passes the check.)
        first_without = tf.argmin(
            tf.concat([tf.cast(has_mask, tf.int32), [0]], 0), output_type=tf.int32
        )
        no_mask = tf.strings.format(
            f"text[{{}}] has no {MASK_TOKEN} {MASK_CASE_HINT}", first_without
        )
        top_k_range = tf.strings.format(f"top_k must be in [1, {self.vocab_size}], got {{}}", top_k)
        return [
            tf.debugging.Assert(tf.reduce_all(has_mask), [no_mask]),
            tf.debugging.Assert((top_k >= 1) & (top_k <= self.vocab_size), [top_k_range]),
        ]

    def _fill_mask(self, text, top_k=tf.constant(DEFAULT_TOP_K)):
        """text [b], top_k [] -> the top-k tokens of every [MASK] (see the module docstring)."""
        ids = self.packer.tokenizer.tokenize(text)
        with tf.control_dependencies(self._checks(ids, top_k)):
            inputs = self.packer.pack_ids([ids])
        positions = _ragged_positions(tf.equal(inputs["input_word_ids"], self.mask_id))
        surviving = positions.row_lengths()
        masks = tf.reduce_max(tf.concat([surviving, [0]], 0))  # (0 for an empty batch)
        width = tf.maximum(masks, 1)
        rows = positions.nrows(out_type=tf.int32)
        answers = tf.cast(rows, tf.int64) * tf.cast(masks, tf.int64) * tf.cast(top_k, tf.int64)
        too_many = tf.strings.format(
            f"the answer would hold {{}} rows x {{}} [MASK]s x top_k {{}} tokens; a call answers "
            f"at most {MAX_ANSWERS}: send fewer rows or [MASK]s, or a smaller top_k",
            [rows, masks, top_k],
        )
        # The inputs too wait for the check: the encoder never reads the positions.
        with tf.control_dependencies([tf.debugging.Assert(answers <= MAX_ANSWERS, [too_many])]):
            inputs = {name: tf.identity(value) for name, value in inputs.items()}
            positions = tf.identity(positions)
        model_positions = positions.to_tensor(default_value=0, shape=tf.stack([rows, width]))
        logits = self.model(dict(inputs, masked_lm_positions=model_positions), training=False)[
            "mlm_logits"
        ]
        probabilities, token_ids = tf.math.top_k(tf.nn.softmax(logits, axis=-1), k=top_k)
        valid = tf.sequence_mask(surviving, masks)[:, :, tf.newaxis]
        token_ids = tf.where(valid, token_ids[:, :masks], -1)
        tokens = tf.where(valid, tf.gather(self.vocab_tokens, tf.maximum(token_ids, 0)), "")
        return {
            "tokens": tokens,
            "token_ids": token_ids,
            "probabilities": tf.where(valid, probabilities[:, :masks], 0.0),
            "mask_positions": positions.to_tensor(default_value=-1, shape=tf.stack([rows, masks])),
            "filled": fill_texts(text, tokens[:, :, 0], surviving),
        }

    def _next_sentence(self, text_a, text_b):
        """text_a, text_b [b] -> is_next_probability [b]."""
        inputs = self.packer.pack([text_a, text_b])
        rows = tf.shape(inputs["input_word_ids"])[0]
        positions = tf.zeros([rows, 1], tf.int32)
        logits = self.model(dict(inputs, masked_lm_positions=positions), training=False)[
            "nsp_logits"
        ]
        return {"is_next_probability": tf.nn.softmax(logits, axis=-1)[:, 0]}
