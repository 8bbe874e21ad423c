"""The playground's views: each answers one JSON request from the page by calling the project's code.

Nothing here re-implements BERT. The views call:
  representation  python_tokenizer.CachedTokenizer and packing.pack_segments, as the fine-tuning jobs
                  tokenize, truncate and pack; with a model, the encoder's own embedding layers
  masking         pretraining.instances.InstanceBuilder.create_masked_lm_predictions (the 15%
                  selection, the 80/10/10 rule, the max_predictions_per_seq cap, whole-word
                  masking) with a NumPy generator seeded from the page's seed; with a model, the
                  pretraining model's MLM logits at the masked positions
  next sentence   pretraining.documents (the corpus reader) and InstanceBuilder.plan_document_pass
                  with pretraining.tokenized_corpus's random-next draw, seeded as the data job
                  seeds a block; with a model, masked_lm.MaskedLM.next_sentence
  fill-mask       masked_lm.MaskedLM.fill_mask
  records         pretraining.inspection (the record decoder of `inspect_records`)
  attention       the encoder's own transformer layers, called with return_attention_scores

A request that cannot be answered (empty text, a seed that is not a number, a view that needs a
model the playground was started without) is a ViewError: the server answers it with status 400
and the message, which the page shows. Every field is read by RequestFields, by its kind: text, a
whole number or a fraction in its range (a JSON number, or one in a string as a form sends it; one
longer than MAX_NUMBER_CHARS is refused by its length), a JSON true or false, one of a few words,
or a local file (a remote file system's path is refused); a bad one's message starts with its
name ("seed: ..."). Text with unpaired surrogates (what invalid UTF-8 becomes
on its way through the browser) has them replaced by U+FFFD, which the tokenizer drops, as
create_pretraining_data does with invalid UTF-8 bytes; the reply says so.
"""

import base64
import dataclasses
import json
import os
import random
import re
import threading

import numpy as np

from bert_tf.model import modeling
from bert_tf.model.model_dir import MLM_HEAD, NSP_HEAD, ModelDir
from bert_tf.pretraining import masked_lm
from bert_tf.pretraining_data import corpus as demo_corpus
from bert_tf.pretraining_data import documents, inspection, tokenized_corpus
from bert_tf.pretraining_data.instances import (
    MASKING_KINDS,
    BlockSegments,
    InstanceBuilder,
    VocabInfo,
)
from bert_tf.runtime import io_utils
from bert_tf.tasks import packing
from bert_tf.tokenization import python_tokenizer, tokenizer_rules

# The page's example texts (keyed by the ids of the page's fields): the first set whose words are
# all whole tokens of the vocabulary. English for a general vocabulary; docstring prose for one
# learned from the embedded corpus, as the demo's is (where "penguins" is pen ##g ##u ##in ##s).
EXAMPLES = (
    {
        "text-a": "the man went to the store . he bought a gallon of milk .",
        "text-b": "penguins are flightless birds .",
        "own-a": "he went to the store .",
        "own-b": "he bought a gallon of milk .",
        "fill-text": "the man went to the [MASK] . he bought a [MASK] of milk .",
    },
    {
        "text-a": "return the value of the attribute . the default is none .",
        "text-b": "raise an error if the file does not exist .",
        "own-a": "return the value of the attribute .",
        "own-b": "the default is none .",
        "fill-text": "return the [MASK] of the attribute . the default is [MASK] .",
    },
)

# How much of the corpus the next-sentence view reads: one block, the unit on which the data job
# shuffles documents and draws its pairs (documents.BLOCK_BYTES).
CORPUS_BYTES = documents.BLOCK_BYTES
PAIRS_PER_SAMPLE = 3
MAX_TOP_K = 50
MAX_RECORDS_PER_PAGE = 50
# The seed field takes what NumPy's default_rng takes: a non-negative integer; capped at 64 bits.
MAX_SEED = (1 << 64) - 1
# No field needs a longer number (2**64 has 20 digits); int() of thousands of digits is slow, and
# refused past 4,300.
MAX_NUMBER_CHARS = 40
# What a form's text field may hold for a number: digits, and for a real number a point and exponent.
_WHOLE_NUMBER = re.compile(r"[+-]?\d+")
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_SURROGATES = re.compile("[\ud800-\udfff]")
# The encoder's layer names (modeling.build_encoder): part of the checkpoint format, never renamed.
POSITION_LAYER, SEGMENT_LAYER = "position_embedding", "segment_embedding"
EMBEDDINGS_ADD_LAYER, EMBEDDINGS_NORM_LAYER = "embeddings_add", "embeddings_layer_norm"


class ViewError(ValueError):
    """A request the page must show a message for (bad input, or a missing model); `field` names
    the request's field at fault, if one is."""

    def __init__(self, message, field=None):
        super().__init__(message)
        self.field = field


# ---------------------------------------------------------------------------------------------
# Reading a request
# ---------------------------------------------------------------------------------------------


class _LongNumber:
    """A number (or a string in a number's field) of more than MAX_NUMBER_CHARS characters, kept as
    its length only: never parsed, never matched."""

    def __init__(self, text):
        self.length = len(text)


def _bounded(parse):
    """A json.loads number hook: `parse`, but a number longer than any field needs stays text."""

    def parse_number(text):
        return _LongNumber(text) if len(text) > MAX_NUMBER_CHARS else parse(text)

    return parse_number


def _no_constant(name):
    raise ValueError(f"{name} is not a JSON value")


def parse_request(body):
    """The request object of a POST body (UTF-8 JSON); a ViewError when it is neither. A number
    too long for any field is kept aside, for the field that reads it to refuse by name."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ViewError(f"The request is not valid UTF-8 (byte {e.start}).") from None
    try:
        request = json.loads(
            text,
            parse_int=_bounded(int),
            parse_float=_bounded(float),
            parse_constant=_no_constant,
        )
    except (ValueError, RecursionError) as e:
        raise ViewError(f"The request is not JSON: {str(e)[:200]}") from None
    if not isinstance(request, dict):
        raise ViewError("The request must be a JSON object.")
    return request


def _shown(value):
    """A field's value as a message quotes it: bounded, whatever its type."""
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:40] + "..."


class RequestFields:
    """A request's fields, each read by its kind: a missing one takes its default, a bad one is a
    ViewError that names it ("seed: The seed must be ..."). Notices for the page gather in
    `notices`."""

    def __init__(self, request):
        if not isinstance(request, dict):
            raise ViewError("The request must be a JSON object.")
        self.request = request
        self.notices = []

    def refuse(self, name, message):
        return ViewError(f"{name}: {message}", field=name)

    def text(self, name, what, required=False):
        """Text, with unpaired surrogates replaced by U+FFFD (and a notice); "" when missing."""
        value = self.request.get(name)
        if value is None:
            value = ""
        if not isinstance(value, str):
            raise self.refuse(name, f"{what} must be text, got {_kind(value)}.")
        value, invalid = _SURROGATES.subn("\ufffd", value)
        if invalid:
            self.notices.append(
                f"{what} held {invalid} invalid UTF-8 sequence(s): each became U+FFFD, which the "
                "tokenizer drops, as create_pretraining_data does with invalid UTF-8."
            )
        if required and not value.strip():
            raise self.refuse(name, f"{what} is empty: type some text.")
        return value

    def integer(self, name, what, low, high, default=None):
        """A whole number in [low, high]: a JSON integer, or digits in a string (a form's value)."""
        return self._number(name, what, low, high, default, whole=True)

    def fraction(self, name, what, default=None):
        """A number in (0, 1]: a JSON number, or one in a string."""
        value = self._number(name, what, 0, 1, default, whole=False)
        if value == 0:
            raise self.refuse(name, f"{what} must be more than 0, got {_shown(value)}.")
        return float(value)

    def _number(self, name, what, low, high, default, whole):
        """A number in [low, high]. An int is compared exactly, never made a float (a huge one
        overflows); an overlong one is refused by its length, never parsed."""
        kind = "a whole number" if whole else "a number"
        value = self.request.get(name, default)
        if isinstance(value, str):
            text = value.strip()
            if len(text) > MAX_NUMBER_CHARS:
                value = _LongNumber(text)
            elif not (_WHOLE_NUMBER if whole else _NUMBER).fullmatch(text):
                raise self.refuse(name, f"{what} must be {kind}, got {_shown(value)}.")
            else:
                value = int(text) if whole else float(text)
        if isinstance(value, _LongNumber):
            raise self.refuse(
                name,
                f"{what} must be between {low} and {high}, got {value.length:,} characters.",
            )
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or (whole and isinstance(value, float))
        ):
            raise self.refuse(name, f"{what} must be {kind}, got {_shown(value)}.")
        if not low <= value <= high:  # NaN and the infinities fail this too
            raise self.refuse(
                name, f"{what} must be between {low} and {high}, got {_shown(value)}."
            )
        return value

    def probability(self, name, what, default=None):
        """A number in [0, 1]: a JSON number, or one in a string."""
        return float(self._number(name, what, 0, 1, default, whole=False))

    def boolean(self, name, what, default):
        """A JSON true or false; the text "false" is refused, not read as true."""
        value = self.request.get(name, default)
        if not isinstance(value, bool):
            raise self.refuse(name, f"{what} must be true or false, got {_shown(value)}.")
        return value

    def choice(self, name, what, choices, default):
        """One of `choices` (strings)."""
        value = self.request.get(name, default)
        if value not in choices or not isinstance(value, str):
            raise self.refuse(name, f"{what} must be {' or '.join(choices)}, got {_shown(value)}.")
        return value

    def local_file(self, name, what):
        """The path of an existing local file (~ expanded). A remote file system's path (gs://,
        http://, anything with a scheme that tf.io.gfile would reach) is refused: the page must
        not make the server fetch from elsewhere."""
        path = self.text(name, what, required=True).strip()
        if "://" in path:
            raise self.refuse(
                name,
                f"{what} must be a local path; remote file systems ({path.split('://')[0][:20]}://) "
                "are not read here.",
            )
        path = os.path.expanduser(path)
        if not os.path.isfile(path):
            raise self.refuse(name, f"No such file: {path[:300]}")
        return path


def _kind(value):
    """A JSON value's kind in words."""
    if isinstance(value, _LongNumber):
        return "a number"
    return {
        bool: "true or false",
        int: "a number",
        float: "a number",
        str: "text",
        list: "a list",
        dict: "an object",
        type(None): "null",
    }.get(type(value), type(value).__name__)


@dataclasses.dataclass
class PlaygroundSettings:
    """What the playground runs on: a model directory, or a vocabulary alone, and the data settings."""

    model_dir: str = ""
    vocab_file: str = ""
    do_lower_case: bool = True
    corpus: str = ""  # a text file in create_pretraining_data's format; "" for the embedded corpus
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    short_seq_prob: float = 0.1


# ---------------------------------------------------------------------------------------------
# The functions the views share with anyone who wants the same answers
# ---------------------------------------------------------------------------------------------


def mask_packed(builder, input_ids, segment_ids, seed):
    """Masks a packed input `[CLS] A [SEP] (B [SEP])` by the data job's rule; returns (corrupted ids,
    masked positions, their original ids), lists.

    The input is laid out as InstanceBuilder.make_batch lays out an instance (one row of
    max_seq_length, zero-padded; [CLS] and the [SEP]s are not candidates) and handed to
    builder.create_masked_lm_predictions with np.random.default_rng(seed).
    """
    length = len(input_ids)
    ids = np.zeros((1, builder.max_seq_length), np.int32)
    ids[0, :length] = input_ids
    is_token = np.zeros(ids.shape, bool)
    is_token[0, :length] = True
    is_token[0, 0] = False  # [CLS]
    segment_ids = np.asarray(segment_ids)
    a_end = int(np.count_nonzero(segment_ids == 0)) - 1
    is_token[0, a_end] = is_token[0, length - 1] = False  # the [SEP]s
    positions, labels, chosen = builder.create_masked_lm_predictions(
        ids, np.array([length]), is_token, np.random.default_rng(seed)
    )
    return ids[0, :length].tolist(), positions[0][chosen[0]].tolist(), labels[0][chosen[0]].tolist()


class _TracedCorpus(tokenized_corpus.MemoryCorpus):
    """The block's own documents as the random-next corpus, noting where each drawn B lies."""

    def __init__(self, block, order):
        super().__init__(block, order)
        self.draws = []  # (start, end) token offsets in the block, one per random-next draw

    def token_bytes(self, start, end):
        self.draws.append((start, end))
        return super().token_bytes(start, end)


def draw_pairs(block, builder, seed, is_random_next, count):
    """Up to `count` sentence pairs of the wanted kind, drawn as the data job draws them in a block.

    random.Random(seed) shuffles the documents and runs InstanceBuilder.plan_document_pass over
    them in that order (random-next B from the block's documents, tokenized_corpus's draw) until
    `count` pairs with the wanted label turn up. Returns dicts with token ranges in the block
    (`a`, `b`: (start, end)), `document` and `random_document` (in block order, -1 for an actual
    next) and `target_seq_length`.
    """
    rng = random.Random(seed)
    order = list(range(block.num_documents))
    rng.shuffle(order)
    index = block.index(order)
    corpus = _TracedCorpus(block, order)
    segments = BlockSegments(block, corpus)
    plan, pairs, draws = [], [], 0
    for document in range(len(order)):
        first = len(plan)
        builder.plan_document_pass(index, document, rng, plan, segments.random_next)
        for a_start, a_end, b_start, b_end, random_next, target, doc, random_doc in plan[first:]:
            if random_next:
                b_start, b_end = corpus.draws[draws]
                draws += 1
            if bool(random_next) != is_random_next:
                continue
            pairs.append(
                {
                    "a": (int(a_start), int(a_end)),
                    "b": (int(b_start), int(b_end)),
                    "document": order[doc],
                    "random_document": order[random_doc] if random_next else -1,
                    "target_seq_length": int(target),
                }
            )
        if len(pairs) >= count:
            break
    return pairs[:count]


def quantize(matrix):
    """A [n, n] matrix of values in [0, 1] as base64 of its uint8 levels (the overview's thumbnails)."""
    levels = np.clip(np.rint(np.asarray(matrix) * 255), 0, 255).astype(np.uint8)
    return base64.b64encode(levels.tobytes()).decode("ascii")


# ---------------------------------------------------------------------------------------------
# The playground
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Packed:
    """A typed input packed as the fine-tuning jobs pack it."""

    ids: list
    segment_ids: list
    tokens: list
    a_tokens: int  # before truncation
    b_tokens: int
    kept_a: int
    kept_b: int


class Playground:
    """The views over one vocabulary (and model directory, when there is one); thread-safe."""

    def __init__(self, settings):
        self.settings = settings
        self._lock = threading.RLock()
        self.directory = ModelDir(settings.model_dir) if settings.model_dir else None
        self.config = None
        self.heads = frozenset()
        if self.directory is not None:
            self.config = self.directory.load_config()  # a ModelDirError names what is missing
            self.heads = self.directory.pretraining_heads()
            vocab_file, do_lower_case = self.directory.vocab_file, self.config.do_lower_case
        elif settings.vocab_file:
            vocab_file, do_lower_case = settings.vocab_file, settings.do_lower_case
        else:
            raise io_utils.UsageError("give --model_dir, or --vocab_file to run without a model")
        self.vocab_file, self.do_lower_case = vocab_file, do_lower_case
        self.max_seq_length = settings.max_seq_length
        if self.config is not None:
            self.max_seq_length = min(self.max_seq_length, self.config.max_position_embeddings)
        if not 5 <= self.max_seq_length:
            raise io_utils.UsageError(
                f"--max_seq_length must be at least 5, got {self.max_seq_length}"
            )
        if not 1 <= settings.max_predictions_per_seq <= self.max_seq_length:
            raise io_utils.UsageError(
                f"--max_predictions_per_seq must be between 1 and --max_seq_length "
                f"({self.max_seq_length}), got {settings.max_predictions_per_seq}"
            )
        if settings.corpus and not os.path.isfile(settings.corpus):
            raise io_utils.UsageError(f"--corpus: no such file: {settings.corpus}")
        try:
            self.vocab = VocabInfo.from_file(vocab_file)
        except (OSError, tokenizer_rules.VocabError) as e:
            raise io_utils.UsageError(str(e)) from e
        # What the fine-tuning jobs and create_pretraining_data tokenize with (FullTokenizer's ids).
        self.tokenizer = python_tokenizer.CachedTokenizer(vocab_file, do_lower_case)
        self._encoder = self._pretraining_model = self._masked_lm = None
        self._corpus = None
        self._trace_cache = (None, None)

    # -- what the page asks first ---------------------------------------------------------------

    def info(self, request=None):
        """The settings, and what each view can do with them (the messages the page shows)."""
        config = self.config
        return {
            "vocab_file": self.vocab_file,
            "vocab_size": self.vocab.size,
            "do_lower_case": self.do_lower_case,
            "model_dir": self.settings.model_dir,
            "heads": sorted(self.heads),
            "layers": config.num_hidden_layers if config else 0,
            "attention_heads": config.num_attention_heads if config else 0,
            "hidden_size": config.hidden_size if config else 0,
            "max_seq_length": self.max_seq_length,
            "max_predictions_per_seq": self.settings.max_predictions_per_seq,
            "masked_lm_prob": 0.15,
            "corpus": self.settings.corpus or "the embedded demo corpus (bert_tf.corpus)",
            "examples": self.examples(),
            "missing": {
                "model": self._missing_model(),
                "mlm": self._missing_head(MLM_HEAD),
                "nsp": self._missing_head(NSP_HEAD),
            },
        }

    def examples(self):
        """The first EXAMPLES set whose words the vocabulary holds whole (else the first)."""

        def whole_words(texts):
            pieces = [p for t in texts for p in self.tokenizer.tokenize(t.replace("[MASK]", ""))]
            return not any(p.startswith("##") or p == "[UNK]" for p in pieces)

        return next((texts for texts in EXAMPLES if whole_words(texts.values())), EXAMPLES[0])

    def _missing_model(self):
        if self.directory is not None:
            return ""
        return (
            "No model: these views need one. Start the playground with --model_dir=DIR, a model "
            "directory written by run_pretraining or convert_checkpoint."
        )

    def _missing_head(self, head):
        missing = self._missing_model()
        if missing or head in self.heads:
            return missing
        name = {MLM_HEAD: "MLM (masked-LM)", NSP_HEAD: "NSP (next-sentence)"}[head]
        return (
            f"The model directory {self.settings.model_dir} has no {name} head (an encoder-only "
            f"or fine-tuned model): this needs a model directory with pretraining heads."
        )

    def _require(self, missing):
        if missing:
            raise ViewError(missing)

    def _pack(self, fields):
        """Sentence A (and B) packed as the fine-tuning jobs pack them, truncation included."""
        notices = fields.notices
        text_a = fields.text("text_a", "Sentence A", required=True)
        text_b = fields.text("text_b", "Sentence B")
        a, b = self.tokenizer.encode(text_a), self.tokenizer.encode(text_b)
        if not a:
            raise ViewError("Sentence A has no tokens (only spaces, controls or U+FFFD).")
        if text_b.strip() and not b:
            notices.append("Sentence B has no tokens: the input is sentence A alone.")
        ids, mask, segments = packing.pack_segments(
            [a, b],
            self.max_seq_length,
            self.vocab.cls_id,
            self.vocab.sep_id,
            drop_empty_b=True,
        )
        length = int(mask.sum())
        ids, segments = ids[:length].tolist(), segments[:length].tolist()
        kept_a = segments.count(0) - 2
        kept_b = segments.count(1) - 1 if b else 0
        if kept_a < len(a) or kept_b < len(b):
            notices.append(
                f"The input is cut to max_seq_length={self.max_seq_length} as the fine-tuning jobs "
                f"cut it (the end of the longer sentence first): A keeps {kept_a:,} of its "
                f"{len(a):,} tokens" + (f", B {kept_b:,} of {len(b):,}." if b else ".")
            )
        tokens = [self.vocab.tokens[i] for i in ids]
        return _Packed(ids, segments, tokens, len(a), len(b), kept_a, kept_b)

    # -- 1. input representation ---------------------------------------------------------------

    def represent(self, request):
        """The packed input: index, token, id, segment, position of every token."""
        fields = RequestFields(request)
        packed = self._pack(fields)
        return {
            "rows": [
                {"index": i, "token": t, "id": token_id, "segment": s, "position": i}
                for i, (t, token_id, s) in enumerate(
                    zip(packed.tokens, packed.ids, packed.segment_ids)
                )
            ],
            "a_tokens": packed.a_tokens,
            "b_tokens": packed.b_tokens,
            "notices": fields.notices,
            "missing": self._missing_model(),
        }

    def embeddings(self, request):
        """One token's token, segment and position embeddings, their sum and the LayerNorm'd vector."""
        fields = RequestFields(request)
        packed = self._pack(fields)
        self._require(self._missing_model())
        index = fields.integer("index", "The token index", 0, len(packed.ids) - 1)
        trace = self._trace(packed)
        vectors = {
            name: np.asarray(trace[name][index], np.float64).round(6).tolist()
            for name in ("token", "segment", "position", "sum", "layer_norm")
        }
        return {
            "index": index,
            "token": packed.tokens[index],
            "id": packed.ids[index],
            "segment": packed.segment_ids[index],
            "vectors": vectors,
            "notices": fields.notices,
        }

    # -- the encoder, layer by layer -----------------------------------------------------------

    def _load_models(self):
        """The encoder (and, with an MLM head, the pretraining model), loaded once."""
        with self._lock:
            if self._encoder is None:
                self._require(self._missing_model())
                if MLM_HEAD in self.heads:
                    self._pretraining_model, self._encoder = self.directory.load_pretraining_model(
                        require=(MLM_HEAD,)
                    )
                else:
                    self._encoder = self.directory.load_encoder()
            return self._encoder

    def _trace(self, packed):
        """The encoder run layer by layer on one input: its embedding layers' outputs and every
        transformer layer's attention probabilities [layers, heads, n, n]; cached for one input."""
        key = (tuple(packed.ids), tuple(packed.segment_ids))
        if self._trace_cache[0] == key:
            return self._trace_cache[1]
        encoder = self._load_models()
        ids = np.array([packed.ids], np.int32)
        segments = np.array([packed.segment_ids], np.int32)
        token = encoder.get_layer(modeling.WORD_EMBEDDING_LAYER)(ids)
        position = encoder.get_layer(POSITION_LAYER)(token)
        segment = encoder.get_layer(SEGMENT_LAYER)(segments)
        total = encoder.get_layer(EMBEDDINGS_ADD_LAYER)([token, position, segment])
        hidden = encoder.get_layer(EMBEDDINGS_NORM_LAYER)(total)
        layer_norm = hidden
        attention = []
        mask = np.ones_like(ids)
        for i in range(self.config.num_hidden_layers):
            layer = encoder.get_layer(f"transformer_layer_{i}")
            hidden, scores = layer(
                hidden, padding_mask=mask, return_attention_scores=True, training=False
            )
            attention.append(np.asarray(scores)[0])
        trace = {
            "token": np.asarray(token)[0],
            "position": np.asarray(position)[0],
            "segment": np.asarray(segment)[0],
            "sum": np.asarray(total)[0],
            "layer_norm": np.asarray(layer_norm)[0],
            "attention": np.stack(attention),
            "sequence_output": np.asarray(hidden)[0],
        }
        self._trace_cache = (key, trace)
        return trace

    # -- 2. MLM masking ------------------------------------------------------------------------

    def mask(self, request):
        """The packed input masked by the data job's rule, for a seed, a mask rate and whole-word
        masking; with a model, its top 5 at every masked position."""
        fields = RequestFields(request)
        packed = self._pack(fields)
        seed = fields.integer("seed", "The seed", 0, MAX_SEED, default=12345)
        rate = fields.fraction("rate", "The mask rate", default=0.15)
        whole_word = fields.boolean("whole_word", "Whole-word masking", default=False)
        masking = fields.choice(
            "masking", "The masking", MASKING_KINDS, "whole_word" if whole_word else "token"
        )
        if whole_word and masking != "whole_word":
            raise fields.refuse("masking", f"whole_word is true but masking is {masking}.")
        as_mask = fields.probability("mask_token_prob", "The [MASK] share", default=0.8)
        as_random = fields.probability("random_token_prob", "The random-token share", default=0.1)
        if as_mask + as_random > 1 + 1e-9:
            raise fields.refuse(
                "random_token_prob",
                f"The [MASK] and random-token shares add up to more than 1 "
                f"({as_mask:g} + {as_random:g}).",
            )
        builder = InstanceBuilder(
            self.vocab,
            max_seq_length=self.max_seq_length,
            max_predictions_per_seq=self.settings.max_predictions_per_seq,
            masked_lm_prob=rate,
            masking=masking,
            mask_token_prob=as_mask,
            random_token_prob=as_random,
        )
        corrupted, positions, labels = mask_packed(builder, packed.ids, packed.segment_ids, seed)
        top = self._masked_top_k(corrupted, packed.segment_ids, positions)
        masked = dict(zip(positions, labels))
        rows = []
        for i, (token_id, shown_id) in enumerate(zip(packed.ids, corrupted)):
            row = {
                "index": i,
                "original": packed.tokens[i],
                "input": self.vocab.tokens[shown_id],
                "segment": packed.segment_ids[i],
                "label": "",
                "rule": "",
                "top": [],
            }
            if i in masked:
                row["label"] = self.vocab.tokens[masked[i]]
                row["rule"] = (
                    inspection.KEPT
                    if shown_id == token_id
                    else inspection.AS_MASK
                    if shown_id == self.vocab.mask_id
                    else inspection.RANDOM
                )
                row["top"] = top.get(i, [])
            rows.append(row)
        length = len(packed.ids)
        return {
            "rows": rows,
            "positions": positions,
            "seed": seed,
            "rate": rate,
            "whole_word": masking == "whole_word",
            "masking": masking,
            "mask_token_prob": as_mask,
            "random_token_prob": as_random,
            "length": length,
            "wanted": max(1, int(round(length * rate))),
            "cap": self.settings.max_predictions_per_seq,
            "masked": len(positions),
            "notices": fields.notices,
            "missing": self._missing_head(MLM_HEAD),
        }

    def _masked_top_k(self, corrupted, segment_ids, positions, k=5):
        """{position: [{token, id, probability}] * k}: the MLM head on the corrupted input, as in
        pretraining; {} without a model with an MLM head."""
        if self._missing_head(MLM_HEAD) or not positions:
            return {}
        self._load_models()
        inputs = {
            "input_word_ids": np.array([corrupted], np.int32),
            "input_mask": np.ones((1, len(corrupted)), np.int32),
            "input_type_ids": np.array([segment_ids], np.int32),
            "masked_lm_positions": np.array([positions], np.int32),
        }
        logits = np.asarray(self._pretraining_model(inputs, training=False)["mlm_logits"])[0]
        logits = logits - logits.max(axis=-1, keepdims=True)
        probabilities = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
        result = {}
        for row, position in enumerate(positions):
            best = np.argsort(-probabilities[row], kind="stable")[:k]
            result[position] = [
                {
                    "token": self.vocab.tokens[i],
                    "id": int(i),
                    "probability": float(probabilities[row, i]),
                }
                for i in best
            ]
        return result

    # -- 3. next sentence ----------------------------------------------------------------------

    def _load_corpus(self):
        """The corpus's first block: (Block, sentence texts in block order, document count)."""
        with self._lock:
            if self._corpus is None:
                if self.settings.corpus:
                    pieces = documents.iter_file_documents(self.settings.corpus)
                else:
                    pieces = (
                        [(sentence + "\n").encode("utf-8") for sentence in document]
                        for document in demo_corpus.iter_default_documents()
                    )
                token_ids, texts, size = [], [], 0
                for document in pieces:
                    kept = []
                    for line in document:
                        text = line.decode("utf-8", errors="replace").strip()
                        ids = self.tokenizer.encode(text)
                        if ids:  # as the data job, lines without tokens are dropped
                            kept.append((text, ids))
                        size += len(line)
                    if kept:
                        texts.extend(text for text, _ in kept)
                        token_ids.append([ids for _, ids in kept])
                    if size >= CORPUS_BYTES:
                        break
                if not token_ids:
                    raise ViewError(f"The corpus {self.settings.corpus} has no text with tokens.")
                block = documents.Block.from_documents(token_ids)
                self._corpus = (block, texts)
            return self._corpus

    def pairs(self, request):
        """Sentence pairs drawn from the corpus by the data job's pair construction, IsNext or
        NotNext, with where A and B came from; with a model, its IsNext probability."""
        fields = RequestFields(request)
        notices = fields.notices
        seed = fields.integer("seed", "The seed", 0, MAX_SEED, default=12345)
        label = fields.choice("label", "The label", ("IsNext", "NotNext"), default="IsNext")
        block, texts = self._load_corpus()
        builder = InstanceBuilder(
            self.vocab,
            max_seq_length=self.max_seq_length,
            max_predictions_per_seq=self.settings.max_predictions_per_seq,
            short_seq_prob=self.settings.short_seq_prob,
        )
        drawn = draw_pairs(block, builder, seed, label == "NotNext", PAIRS_PER_SAMPLE)
        if len(drawn) < PAIRS_PER_SAMPLE:
            notices.append(
                f"Only {len(drawn)} {label} pair(s) in the corpus's first block for this seed."
            )
        sentence_starts = block.sentence_starts
        document_starts = block.document_starts

        def where(start, end):
            first = int(np.searchsorted(sentence_starts, start, side="right")) - 1
            last = int(np.searchsorted(sentence_starts, end, side="left")) - 1
            document = int(np.searchsorted(document_starts, first, side="right")) - 1
            base = int(document_starts[document])
            return {
                "document": document + 1,
                "first": first - base + 1,
                "last": last - base + 1,
                "sentences": int(document_starts[document + 1]) - base,
                "text": " ".join(texts[first : last + 1]),
                "tokens": int(end - start),
            }

        pairs = []
        for pair in drawn:
            a, b = where(*pair["a"]), where(*pair["b"])
            pairs.append(
                {
                    "a": a,
                    "b": b,
                    "label": label,
                    "next_sentence_label": int(label == "NotNext"),
                    "target_seq_length": pair["target_seq_length"],
                    "probability": None,
                }
            )
        missing = self._missing_head(NSP_HEAD)
        if pairs and not missing:
            probabilities = self._masked_lm_model().next_sentence(
                [p["a"]["text"] for p in pairs], [p["b"]["text"] for p in pairs]
            )
            for pair, p in zip(pairs, probabilities.tolist()):
                pair["probability"] = p
        return {
            "pairs": pairs,
            "seed": seed,
            "label": label,
            "corpus": self.settings.corpus or "the embedded demo corpus",
            "documents": block.num_documents,
            "notices": notices,
            "missing": missing,
        }

    def score_pair(self, request):
        """The model's IsNext probability for a typed pair."""
        fields = RequestFields(request)
        text_a = fields.text("text_a", "Sentence A", required=True)
        text_b = fields.text("text_b", "Sentence B", required=True)
        self._require(self._missing_head(NSP_HEAD))
        probability = float(self._masked_lm_model().next_sentence([text_a], [text_b])[0])
        return {"probability": probability, "notices": fields.notices}

    def _masked_lm_model(self):
        """masked_lm.MaskedLM on the model directory (fill-mask and next-sentence), made once."""
        with self._lock:
            if self._masked_lm is None:
                self._masked_lm = masked_lm.MaskedLM(self.settings.model_dir, self.max_seq_length)
            return self._masked_lm

    # -- 4. fill-mask --------------------------------------------------------------------------

    def fill_mask(self, request):
        """MaskedLM.fill_mask on the typed text: the top k for every [MASK]."""
        fields = RequestFields(request)
        notices = fields.notices
        text = fields.text("text", "The text", required=True)
        top_k = fields.integer("top_k", "top k", 1, min(MAX_TOP_K, self.vocab.size), default=5)
        self._require(self._missing_head(MLM_HEAD))
        try:
            (result,) = self._masked_lm_model().fill_mask([text], top_k)
        except masked_lm.NoMaskError:
            raise ViewError(
                "The text has no [MASK]: write [MASK] where a word should go."
            ) from None
        if result.cut_masks:
            notices.append(
                f"{result.cut_masks} [MASK](s) past max_seq_length={self.max_seq_length} were "
                "cut off with the text: no prediction for them."
            )
        return {
            "masks": [dataclasses.asdict(mask) for mask in result.masks],
            "filled": result.filled,
            "cut_masks": result.cut_masks,
            "notices": notices,
        }

    # -- 5. records ----------------------------------------------------------------------------

    def records(self, request):
        """A page of a create_pretraining_data record file, decoded back to text."""
        fields = RequestFields(request)
        notices = fields.notices
        path = fields.local_file("path", "The record file")
        start = fields.integer("start", "The first record", 0, 1 << 62, default=0)
        limit = fields.integer("limit", "Records per page", 1, MAX_RECORDS_PER_PAGE, default=5)
        try:
            page = inspection.read_instances(path, self.vocab.tokens, start, limit)
        except OSError as e:
            raise ViewError(f"Cannot read {path}: {e.strerror or e}") from None
        instances, more = page.instances, page.more
        if page.damage is not None and not instances:
            raise ViewError(str(page.damage))
        if page.damage is not None:
            notices.append(f"The records shown are the good ones before the damage: {page.damage}")
        if any(i >= self.vocab.size for x in instances for i in x.token_ids):
            notices.append(
                f"Some ids are beyond this vocabulary's {self.vocab.size} tokens: were the records "
                "made with another vocab.txt?"
            )
        if not instances:
            notices.append(f"No records from record {start} on.")
        return {
            "path": path,
            "start": start,
            "more": more,
            "damage": "" if page.damage is None else str(page.damage),
            "instances": [dataclasses.asdict(x) | {"label": x.label} for x in instances],
            "notices": notices,
        }

    # -- 6. attention --------------------------------------------------------------------------

    def attention(self, request):
        """One layer and head's attention probabilities over the typed input, and every head's
        as a thumbnail."""
        fields = RequestFields(request)
        packed = self._pack(fields)
        self._require(self._missing_model())
        layer = fields.integer(
            "layer", "The layer", 0, self.config.num_hidden_layers - 1, default=0
        )
        head = fields.integer("head", "The head", 0, self.config.num_attention_heads - 1, default=0)
        attention = self._trace(packed)["attention"]
        return {
            "tokens": packed.tokens,
            "layer": layer,
            "head": head,
            "layers": int(attention.shape[0]),
            "heads": int(attention.shape[1]),
            "matrix": np.asarray(attention[layer, head], np.float64).round(6).tolist(),
            "overview": [[quantize(m) for m in heads] for heads in attention],
            "notices": fields.notices,
        }

    # -- dispatch ------------------------------------------------------------------------------

    VIEWS = (
        "info",
        "represent",
        "embeddings",
        "mask",
        "pairs",
        "score_pair",
        "fill_mask",
        "records",
        "attention",
    )

    def handle(self, view, request):
        """Answers `request` (a dict) for the view named `view`; ViewError for bad input."""
        if view not in self.VIEWS:
            raise KeyError(view)
        if not isinstance(request, dict):
            raise ViewError("The request must be a JSON object.")
        with self._lock:  # one model call at a time: TensorFlow's own threads do the rest
            return getattr(self, view)(request)
