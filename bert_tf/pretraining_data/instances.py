"""The instance algorithm: the original BERT `create_pretraining_data.py`, rule for rule, on token ids.

Read this beside the original (google-research/bert, create_pretraining_data.py): the pieces keep its
names where they do the same thing.
  original                          here
  create_training_instances         create_training_instances (one block), iter_block_batches
  create_instances_from_document    InstanceBuilder.plan_document_pass (choosing A and B), then
                                    InstanceBuilder.make_batch (truncation, layout, masking)
  create_masked_lm_predictions      InstanceBuilder.create_masked_lm_predictions
  truncate_seq_pair                 truncate_seq_pair; truncation_trims, its vectorized form
  TrainingInstance                  instance_data.TrainingInstance (ids, not token strings) and
                                    instance_data.InstanceBatch
The original shuffles the documents of the whole corpus, runs dupe_factor passes and shuffles every
instance; here that runs on one block of about 1 MiB of text (documents.py) at a time, with
random-next segments drawn from the whole input all the same (tokenized_corpus.py), so memory does
not grow with the corpus. Instances are masked `INSTANCE_CHUNK` at a time.

The random generators, and why the distributions are the original's
  Each block uses two generators seeded from the same per-block seed:
  * a `random.Random` for the document-level decisions that are inherently sequential (the
    document shuffle, the target length, where A ends, random next or actual next, the random
    document and its start sentence). These run in a Python loop that handles only (start, end)
    offsets into the flat id array (a drawn random-next segment is appended to the block's ids).
    `randint(a, b)` is drawn as `a + int(random() * (b - a + 1))`:
    the same uniform distribution at a fraction of the cost.
  * a NumPy `Generator` for everything that is per token or per instance, vectorized over up to
    `INSTANCE_CHUNK` instances at once:
    - the instance shuffle is a uniform permutation (as `random.shuffle`);
    - truncation: which side loses each trimmed token does not depend on the coin flips (always
      the longer, B on ties), so each side's number of trims is computed directly, and how many of
      them come off the front is Binomial(trims, 1/2): exactly the distribution of the original's
      sequence of independent fair coin flips;
    - masked positions: each candidate position (not [CLS]/[SEP]) gets an independent random
      64-bit key and the `num_to_predict` smallest keys win: a uniformly random subset, as the
      original's full shuffle followed by taking the first ones;
    - with whole-word masking, each word group's key is its first piece's key, which orders the
      groups uniformly at random (the original's shuffle), then the original's greedy walk runs;
    - the 80/10/10 split uses one uniform per position ([MASK] below 0.8, kept below 0.9, else a
      uniform random vocabulary id): the same probabilities as the original's two coin flips.
      `mask_token_prob` and `random_token_prob` move the two thresholds (the paper's Table 8
      mixes); at 0.8 and 0.1 the records are the same bytes as without them.
  The order in which randomness is consumed differs from the original (so records differ for the
  same seed), but every distribution is the original's.

What the block design changes statistically, against the original's whole-corpus sampling
  * instances are shuffled within their block, and an output file is its units in input order, so
    the dupe_factor copies of a document stay within one block's run of records. Readers that
    interleave several files and shuffle (as `run_pretraining` does) mix them further;
  * every other rule (target lengths, segment choice, truncation, masking) is unchanged, and the
    per-instance distributions are the original's; a one-sentence document always gets a random
    next B, as in the original.

`random_next_prob` (create_pretraining_data --random_next_prob) replaces the original's 1/2 in the
is-random-next draw, drawn the same way, so the default 0.5 consumes the same random numbers and
writes the same records. At 0 every B is the text that follows A, for the paper's "No NSP" models
(see plan_document_pass for the one-sentence chunks, which the original always pairs with a
random B).
"""

import bisect
import collections
import contextlib
import dataclasses
import gc
import itertools

import numpy as np

from bert_tf.pretraining_data import tokenized_corpus
from bert_tf.pretraining_data.documents import Block
from bert_tf.pretraining_data.instance_data import InstanceBatch
from bert_tf.tokenization import tokenizer_rules

# Instances masked and serialized together: big enough for NumPy to pay off, small enough that the
# byte matrices of one chunk stay at a few tens of MB. Does not change the output.
INSTANCE_CHUNK = 4096
REQUIRED_TOKENS = ("[CLS]", "[SEP]", "[MASK]")
# How masked positions are chosen: single WordPieces (the original), whole words (the original's
# --do_whole_word_mask), or spans of whole words (SpanBERT's, see InstanceBuilder._span_positions).
MASKING_KINDS = ("token", "whole_word", "span")
# SpanBERT's span lengths, in words: Geometric(p=0.2) truncated to 1..10 and renormalised, as its
# code does (mean 3.8 words, the figure its paper gives).
SPAN_GEOMETRIC_P = 0.2
MAX_SPAN_WORDS = 10


def span_length_probabilities(p=SPAN_GEOMETRIC_P, max_words=MAX_SPAN_WORDS):
    """P(span of k words) for k = 1..max_words: the truncated, renormalised geometric."""
    weights = p * (1.0 - p) ** np.arange(max_words)
    return weights / weights.sum()


def mean_span_words():
    """The mean span length in words (3.797 at SpanBERT's settings)."""
    probabilities = span_length_probabilities()
    return float(np.dot(np.arange(1, len(probabilities) + 1), probabilities))


# ---------------------------------------------------------------------------------------------
# Vocabulary facts the algorithm needs
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class VocabInfo:
    """The ids of the special tokens, the vocabulary size and which ids are `##` continuations."""

    tokens: tuple
    cls_id: int
    sep_id: int
    mask_id: int
    is_continuation: tuple

    @property
    def size(self):
        """Number of tokens in the vocabulary (random replacements draw from all of them)."""
        return len(self.tokens)

    @classmethod
    def from_file(cls, vocab_file):
        """Loads vocab.txt; a vocabulary without [CLS], [SEP] or [MASK] is a VocabError."""
        vocab = tokenizer_rules.load_vocab(vocab_file)
        missing = [t for t in REQUIRED_TOKENS if t not in vocab]
        if missing:
            raise tokenizer_rules.VocabError(
                f"{vocab_file}: the vocabulary has no {', '.join(missing)} token; pretraining data "
                f"needs {', '.join(REQUIRED_TOKENS)}"
            )
        return cls.from_tokens(tuple(vocab))

    @classmethod
    def from_tokens(cls, tokens):
        """VocabInfo of a vocabulary given as its tokens in id order."""
        vocab = {token: index for index, token in enumerate(tokens)}
        return cls(
            tokens=tokens,
            cls_id=vocab["[CLS]"],
            sep_id=vocab["[SEP]"],
            mask_id=vocab["[MASK]"],
            is_continuation=tuple(t.startswith("##") for t in tokens),
        )


# ---------------------------------------------------------------------------------------------
# create_training_instances: a block's documents -> shuffled, masked instances
# ---------------------------------------------------------------------------------------------


def create_training_instances(documents, builder, dupe_factor, rng):
    """All instances of a block (a Block, or documents as lists of id lists), as TrainingInstances;
    the block is the whole corpus, as the original's input is."""
    block = documents if isinstance(documents, Block) else Block.from_documents(documents)
    return [
        instance
        for batch in iter_block_batches(block, builder, dupe_factor, rng)
        for instance in batch.instances()
    ]


def iter_block_batches(
    block, builder, dupe_factor, rng, chunk=INSTANCE_CHUNK, corpus=None, stats=None
):
    """The original create_training_instances on one block, as InstanceBatches of up to `chunk`.

    Shuffle the documents, plan dupe_factor passes over every document, shuffle the instances,
    then truncate, lay out and mask them chunk by chunk. `rng` is a random.Random; the NumPy
    generator for the vectorized steps is seeded from it. Random-next segments come from `corpus`
    (the whole input in the data job), or, without one, from the block's own documents, the
    corpus of `create_training_instances`. `stats` (a Counter) gets `random_next_own_document`.
    """
    # The original: shuffle the documents, run dupe_factor passes over each, shuffle the instances.
    order = list(range(block.num_documents))
    rng.shuffle(order)
    index = block.index(order)
    if corpus is None:
        corpus = tokenized_corpus.MemoryCorpus(block, order)
    segments = BlockSegments(block, corpus)
    plan = []
    with paused_gc():
        for _ in range(dupe_factor):
            for document_index in range(len(order)):
                builder.plan_document_pass(index, document_index, rng, plan, segments.random_next)
    if stats is not None:
        stats["random_next_own_document"] += segments.own_document
    plan = np.array(plan, np.int64).reshape(-1, len(PLAN_COLUMNS))
    tokens = segments.tokens()
    del segments
    numpy_rng = np.random.default_rng(rng.getrandbits(64))
    plan = plan[numpy_rng.permutation(len(plan))]
    for start in range(0, len(plan), chunk):
        yield builder.make_batch(tokens, plan[start : start + chunk], numpy_rng)


def add_batch_stats(stats, batch, builder):
    """Adds counts about an InstanceBatch to `stats` (a Counter) for summary.json."""
    stats["instances"] += len(batch)
    stats["instance_tokens"] += int(batch.lengths.sum())
    stats["masked_positions"] += int(batch.num_masked.sum())
    random_next = int(batch.is_random_next.sum())
    stats["random_next"] += random_next
    stats["actual_next"] += len(batch) - random_next
    stats["truncated_instances"] += int(np.count_nonzero(batch.num_truncated))
    stats["truncated_tokens"] += int(batch.num_truncated.sum())
    stats["short_target_instances"] += int((batch.target_seq_length < builder.max_num_tokens).sum())


class BlockSegments:
    """A block's tokens, plus the random-next segments drawn for it from `corpus`.

    A plan row's offsets index `tokens()`: the block's own tokens, then each drawn segment
    appended. The drawn segments of a block are a fraction of its tokens times dupe_factor.
    """

    def __init__(self, block, corpus):
        self.block = block
        self.corpus = corpus
        self.drawn = bytearray()  # int32 little-endian tokens of the segments drawn so far
        self.own_document = 0  # draws that fell back to A's own document (a corpus of one document)

    def random_next(self, random_, exclude, target_b_length):
        """Draws a B from the corpus (tokenized_corpus.draw_random_next); returns (start, end, document)."""
        base = len(self.block.tokens)
        start = base + len(self.drawn) // 4
        document = tokenized_corpus.draw_random_next(
            self.corpus, random_, exclude, target_b_length, self.drawn
        )
        self.own_document += document == exclude
        return start, base + len(self.drawn) // 4, document

    def tokens(self):
        """The block's tokens followed by every drawn segment (int32)."""
        drawn = np.frombuffer(self.drawn, tokenized_corpus.TOKEN_DTYPE).astype(np.int32)
        return np.concatenate([self.block.tokens.astype(np.int32, copy=False), drawn])


# ---------------------------------------------------------------------------------------------
# create_instances_from_document and create_masked_lm_predictions, vectorized per chunk
# ---------------------------------------------------------------------------------------------


# The columns of an instance plan, one row per instance, made by InstanceBuilder.plan_document_pass.
PLAN_COLUMNS = (
    "a_start",
    "a_end",
    "b_start",
    "b_end",
    "is_random_next",
    "target_seq_length",
    "document_index",
    "random_document_index",
)


class InstanceBuilder:
    """The original create_instances_from_document / create_masked_lm_predictions, on token ids.

    Instance *assembly* (chunks of sentences, A and B: `plan_document_pass`) runs in Python on
    (start, end) token offsets; truncation, layout and masking (`make_batch`) then run in NumPy for
    many instances at once. The constructor's arguments are the original's flags of the same names.
    """

    def __init__(
        self,
        vocab,
        max_seq_length=128,
        max_predictions_per_seq=20,
        masked_lm_prob=0.15,
        short_seq_prob=0.1,
        do_whole_word_mask=False,
        random_next_prob=0.5,
        mask_token_prob=0.8,
        random_token_prob=0.1,
        masking=None,
    ):
        if masking is None:
            masking = "whole_word" if do_whole_word_mask else "token"
        if masking not in MASKING_KINDS:
            raise ValueError(f"masking must be one of {', '.join(MASKING_KINDS)}, got {masking!r}")
        if do_whole_word_mask and masking != "whole_word":
            raise ValueError(f"do_whole_word_mask contradicts masking={masking!r}")
        if not (0 <= mask_token_prob <= 1 and 0 <= random_token_prob <= 1):
            raise ValueError("mask_token_prob and random_token_prob must be in [0, 1]")
        if mask_token_prob + random_token_prob > 1 + 1e-9:
            raise ValueError(
                f"mask_token_prob + random_token_prob must be at most 1, got "
                f"{mask_token_prob} + {random_token_prob}"
            )
        if max_seq_length < 5:
            raise ValueError(f"max_seq_length must be at least 5, got {max_seq_length}")
        if max_predictions_per_seq > max_seq_length:
            raise ValueError(
                f"max_predictions_per_seq ({max_predictions_per_seq}) cannot exceed "
                f"max_seq_length ({max_seq_length})"
            )
        self.vocab = vocab
        self.max_seq_length = max_seq_length
        self.max_num_tokens = max_seq_length - 3
        self.max_predictions_per_seq = max_predictions_per_seq
        self.masked_lm_prob = masked_lm_prob
        self.short_seq_prob = short_seq_prob
        self.masking = masking
        self.do_whole_word_mask = masking == "whole_word"
        # Of the chosen positions: [MASK] below mask_token_prob, a random id from
        # 1 - random_token_prob up, the token kept between (the original's 0.8 and 0.1).
        self.mask_token_prob = mask_token_prob
        self.random_token_prob = random_token_prob
        self._span_cdf = np.cumsum(span_length_probabilities())
        # The original's hard-coded 0.5: the chance that B is a random segment (label 1).
        self.random_next_prob = random_next_prob
        self._is_continuation = np.asarray(vocab.is_continuation, dtype=bool)
        # How the masked positions were filled, for summary.json: [MASK], kept, random token.
        self.replacement_counts = collections.Counter()

    def plan_document_pass(self, index, document_index, rng, plan, random_next):
        """Appends one pass over a document to `plan`: a row of PLAN_COLUMNS per instance.

        `index` is Block.index(). The original's rules, on sentence indices and token offsets.
        `random_next(random_, exclude, target_b_length)` draws a random-next B from the corpus
        (see BlockSegments) and returns its (start, end) token offsets and the document drawn.
        """
        sentence_lengths, sentence_starts, document_first, document_end, originals = index
        random_ = rng.random
        max_num_tokens = self.max_num_tokens  # max_seq_length less [CLS], [SEP], [SEP]
        # As in the original, the target is drawn once per document pass: usually the full length,
        # sometimes shorter, to reduce the mismatch with fine-tuning's short sequences.
        target = max_num_tokens
        if random_() < self.short_seq_prob:
            target = 2 + int(random_() * (max_num_tokens - 1))  # randint(2, max_num_tokens)
        # The original's loop: sentences gather into a chunk until the target length or the
        # document's end; the chunk (`chunk_first` to `i`) then makes one instance.
        end = document_end[document_index]
        chunk_first = i = document_first[document_index]
        chunk_length = 0
        while i < end:
            chunk_length += sentence_lengths[i]
            if i == end - 1 or chunk_length >= target:
                chunk_size = i + 1 - chunk_first
                # A takes the chunk's first randint(1, chunk_size - 1) sentences.
                a_end = chunk_first + 1
                if chunk_size >= 2:
                    a_end += int(random_() * (chunk_size - 1))
                a_start_token, a_end_token = sentence_starts[chunk_first], sentence_starts[a_end]
                if chunk_size == 1 and self.random_next_prob == 0:
                    # The original gives a one-sentence chunk a random B. With no random next at
                    # all, B is instead the sentence's own tail: cut at a uniform token boundary,
                    # B stays the text that follows A (a one-token sentence makes no instance).
                    length = a_end_token - a_start_token
                    if length >= 2:
                        cut = a_start_token + 1 + int(random_() * (length - 1))
                        row = (a_start_token, cut, cut, a_end_token, 0, target, document_index, -1)
                        plan.append(row)
                # Random next: always for a one-sentence chunk, else with random_next_prob (the
                # original's 1/2 by default, drawn the same way).
                elif chunk_size == 1 or random_() < self.random_next_prob:
                    target_b_length = target - (a_end_token - a_start_token)
                    b_start_token, b_end_token, random_document = random_next(
                        random_, originals[document_index], target_b_length
                    )
                    plan.append(
                        (
                            a_start_token,
                            a_end_token,
                            b_start_token,
                            b_end_token,
                            1,
                            target,
                            document_index,
                            random_document,
                        )
                    )
                    # The chunk's sentences after A were not used: put them back.
                    i = a_end - 1
                else:  # actual next: B is the rest of the chunk
                    plan.append(
                        (
                            a_start_token,
                            a_end_token,
                            a_end_token,
                            sentence_starts[i + 1],
                            0,
                            target,
                            document_index,
                            -1,
                        )
                    )
                chunk_first = i + 1
                chunk_length = 0
            i += 1

    def make_batch(self, tokens, plan, rng):
        """Truncates, lays out and masks the planned instances (int64 [n, 8] rows) with `rng`.

        The rest of the original's create_instances_from_document, for many instances at once:
        truncate_seq_pair, `[CLS] A [SEP] B [SEP]` with segment ids, create_masked_lm_predictions.
        """
        n = len(plan)
        seq = self.max_seq_length
        a_start, a_end, b_start, b_end = plan[:, 0], plan[:, 1], plan[:, 2], plan[:, 3]
        # truncate_seq_pair: how many tokens each side loses does not depend on the coin flips.
        trims_a, trims_b = truncation_trims(a_end - a_start, b_end - b_start, self.max_num_tokens)
        a_lengths = a_end - a_start - trims_a
        b_lengths = b_end - b_start - trims_b
        # Each trim is a fair coin flip between front and back: the front's share is binomial.
        a_start = a_start + rng.binomial(trims_a, 0.5)
        b_start = b_start + rng.binomial(trims_b, 0.5)
        lengths = a_lengths + b_lengths + 3

        # [CLS] A [SEP] B [SEP], then padding.
        position = np.arange(seq)[None, :]
        a_column, length_column = a_lengths[:, None], lengths[:, None]
        in_a = (position >= 1) & (position <= a_column)
        is_token = in_a | ((position >= a_column + 2) & (position < length_column - 1))
        source = np.where(
            in_a, a_start[:, None] + position - 1, b_start[:, None] + position - a_column - 2
        )
        input_ids = np.where(is_token, tokens[np.where(is_token, source, 0)], 0).astype(np.int32)
        rows = np.arange(n)
        input_ids[:, 0] = self.vocab.cls_id
        input_ids[rows, a_lengths + 1] = self.vocab.sep_id
        input_ids[rows, lengths - 1] = self.vocab.sep_id

        positions, labels, chosen = self.create_masked_lm_predictions(
            input_ids, lengths, is_token, rng
        )
        return InstanceBatch(
            input_ids=input_ids,
            lengths=lengths,
            a_lengths=a_lengths + 2,
            masked_positions=positions,
            masked_ids=labels,
            num_masked=chosen.sum(axis=1),
            is_random_next=plan[:, 4].astype(bool),
            document_index=plan[:, 6],
            random_document_index=plan[:, 7],
            target_seq_length=plan[:, 5],
            num_truncated=trims_a + trims_b,
        )

    def create_masked_lm_predictions(self, input_ids, lengths, is_token, rng):
        """The original's create_masked_lm_predictions for laid-out instances [n, max_seq_length].

        Masks `input_ids` in place; returns (positions, labels, chosen), [n, max_predictions_per_seq]
        each. `is_token` marks the candidates (every token but [CLS] and [SEP]); `chosen` marks the
        predictions that exist, ascending by position in each row, as the original sorts them.
        """
        n, seq = input_ids.shape
        rows = np.arange(n)
        position = np.arange(seq)[None, :]
        # The original: min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob)))),
        # with round half to even as Python's round. It also stops when out of candidates.
        num_to_predict = np.minimum(
            self.max_predictions_per_seq,
            np.maximum(1, np.round(lengths * self.masked_lm_prob).astype(np.int64)),
        )
        num_to_predict = np.minimum(num_to_predict, lengths - 3)
        span_first = None
        if self.masking == "span":
            positions, chosen, span_first = self._span_positions(
                input_ids, lengths, is_token, num_to_predict, rng
            )
        else:
            # The original shuffles the candidates and takes them in order: here the candidates
            # with the smallest random keys. The low bits of a key are its position, so keys never
            # tie.
            position_bits = max(int(seq - 1).bit_length(), 1)
            keys = rng.integers(0, 1 << (62 - position_bits), size=(n, seq), dtype=np.int64)
            keys = np.where(is_token, (keys << position_bits) | position, np.iinfo(np.int64).max)
            if self.masking == "whole_word":
                positions, chosen = self._whole_word_positions(
                    input_ids, lengths, keys, num_to_predict
                )
            else:
                positions, chosen = self._token_positions(keys, num_to_predict, position_bits)

        # 80% [MASK], 10% the original token, 10% a random vocabulary id: one uniform per position
        # (per span with span masking, as SpanBERT decides them).
        labels = np.where(chosen, input_ids[rows[:, None], positions], 0)
        uniform = rng.random(positions.shape)
        random_ids = rng.integers(0, self.vocab.size, size=positions.shape)
        if span_first is not None:
            uniform = np.take_along_axis(uniform, span_first, axis=1)
        as_mask = chosen & (uniform < self.mask_token_prob)
        as_random = chosen & ~as_mask & (uniform >= 1.0 - self.random_token_prob)
        changed = as_mask | as_random
        input_ids[np.nonzero(changed)[0], positions[changed]] = np.where(
            as_mask, self.vocab.mask_id, random_ids
        )[changed]
        counts = self.replacement_counts
        counts["masked_as_mask"] += int(as_mask.sum())
        counts["masked_random"] += int(as_random.sum())
        counts["masked_kept"] += int(chosen.sum() - changed.sum())
        return positions, labels, chosen

    def _token_positions(self, keys, num_to_predict, position_bits):
        """The num_to_predict candidates with the smallest keys, ascending, 0-padded; and the mask."""
        predictions = self.max_predictions_per_seq
        smallest = (
            keys if predictions == keys.shape[1] else np.partition(keys, predictions - 1, axis=1)
        )
        smallest = np.sort(smallest[:, :predictions], axis=1)
        chosen = np.arange(predictions)[None, :] < num_to_predict[:, None]
        positions = np.where(chosen, smallest & ((1 << position_bits) - 1), keys.shape[1])
        positions.sort(axis=1)
        return np.where(chosen, positions, 0), chosen

    def _whole_word_positions(self, input_ids, lengths, keys, num_to_predict):
        """Whole-word masking: word groups in random order (their first piece's key), then the
        original's greedy walk, which skips a word that would overshoot and goes on."""
        n, predictions = len(lengths), self.max_predictions_per_seq
        positions = np.zeros((n, predictions), np.int64)
        chosen = np.zeros((n, predictions), bool)
        cls_id, sep_id = self.vocab.cls_id, self.vocab.sep_id
        continuation = self._is_continuation[input_ids].tolist()
        for row in range(n):
            ids, is_piece, row_keys = input_ids[row].tolist(), continuation[row], keys[row].tolist()
            groups = []
            for index in range(int(lengths[row])):
                token = ids[index]
                if token == cls_id or token == sep_id:
                    continue
                # As in the original, a `##` piece right after [SEP] joins the group before it.
                if groups and is_piece[index]:
                    groups[-1].append(index)
                else:
                    groups.append([index])
            groups.sort(key=lambda group: row_keys[group[0]])
            limit = int(num_to_predict[row])
            masked = []
            for group in groups:
                if len(masked) >= limit:
                    break
                if len(masked) + len(group) > limit:
                    continue
                masked.extend(group)
            masked.sort()
            positions[row, : len(masked)] = masked
            chosen[row, : len(masked)] = True
        return positions, chosen

    def _span_positions(self, input_ids, lengths, is_token, num_to_predict, rng):
        """Span masking, SpanBERT's rule on whole words: returns (positions, chosen, span_first).

        Until num_to_predict tokens are chosen: an anchor token is drawn uniformly from the unchosen
        tokens whose word still fits the budget (SpanBERT draws from every token and redraws a
        chosen one: the same law); a length of k words is drawn from span_length_probabilities();
        the span takes the anchor's word and the words after it, up to k, stopping before a chosen
        word, the end of the segment, or a word that would overshoot the budget. Unlike SpanBERT,
        which cuts the last word at the budget, no word is ever partly masked, as with whole-word
        masking. `span_first[r, j]` is the column of the first position of the span holding
        `positions[r, j]`, so that a span is replaced as one.
        """
        n, predictions = len(lengths), self.max_predictions_per_seq
        positions = np.zeros((n, predictions), np.int64)
        chosen = np.zeros((n, predictions), bool)
        span_first = np.zeros((n, predictions), np.int64)
        continuation = self._is_continuation[input_ids].tolist()
        candidates = is_token.tolist()
        cdf = self._span_cdf.tolist()
        # Each span masks a token at least and takes two uniforms (anchor, length): drawn for the
        # whole chunk at once, since one NumPy call per draw cost more than the rest of the loop.
        draws = rng.random((n, 2 * predictions)).tolist()
        for row in range(n):
            is_piece, candidate, uniforms = continuation[row], candidates[row], iter(draws[row])
            # Words as [first, end) ranges of candidate tokens, and their segment: a token that is
            # no candidate ([CLS], [SEP]) ends one, and a `##` piece after it starts a word.
            starts, ends, segments = [], [], []
            segment = 0
            for index in range(int(lengths[row])):
                if not candidate[index]:
                    segment += 1
                elif ends and is_piece[index] and ends[-1] == index:
                    ends[-1] = index + 1
                else:
                    starts.append(index)
                    ends.append(index + 1)
                    segments.append(segment)
            sizes = [end - start for start, end in zip(starts, ends)]
            taken = [False] * len(starts)
            budget = int(num_to_predict[row])
            spans = []
            while budget > 0:
                eligible = [w for w, size in enumerate(sizes) if not taken[w] and size <= budget]
                if not eligible:
                    break
                # A uniform token of the eligible words: a word by its number of pieces.
                weights = list(itertools.accumulate(sizes[w] for w in eligible))
                word = eligible[bisect.bisect_right(weights, next(uniforms) * weights[-1])]
                length = bisect.bisect_right(cdf, next(uniforms) * cdf[-1]) + 1
                span = []
                for w in range(word, min(word + length, len(starts))):
                    if taken[w] or segments[w] != segments[word] or sizes[w] > budget:
                        break
                    taken[w] = True
                    budget -= sizes[w]
                    span.extend(range(starts[w], ends[w]))
                spans.append(span)
            first_of = {p: span[0] for span in spans for p in span}
            masked = sorted(first_of)
            column = {p: j for j, p in enumerate(masked)}
            positions[row, : len(masked)] = masked
            chosen[row, : len(masked)] = True
            span_first[row, : len(masked)] = [column[first_of[p]] for p in masked]
        return positions, chosen, span_first

    def create_instances_from_document(self, block, document_index, rng):
        """All instances of one pass over `block`'s document `document_index` (TrainingInstances),
        with random-next segments from the block's documents."""
        plan = []
        segments = BlockSegments(block, tokenized_corpus.MemoryCorpus(block))
        self.plan_document_pass(block.index(), document_index, rng, plan, segments.random_next)
        batch = self.make_batch(
            segments.tokens(),
            np.array(plan, np.int64).reshape(-1, len(PLAN_COLUMNS)),
            np.random.default_rng(rng.getrandbits(64)),
        )
        return batch.instances()


# ---------------------------------------------------------------------------------------------
# truncate_seq_pair
# ---------------------------------------------------------------------------------------------


def truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
    """Trims the longer list one token at a time, from the front or back at random; returns the count.

    The original's rule, coin flip for coin flip, on lists (the pipeline uses the vectorized
    `truncation_trims` plus binomial front counts, which has the same distribution).
    """
    a_start, a_end, b_start, b_end = 0, len(tokens_a), 0, len(tokens_b)
    trimmed = 0
    while (a_end - a_start) + (b_end - b_start) > max_num_tokens:
        trimmed += 1
        if a_end - a_start > b_end - b_start:
            if rng.random() < 0.5:
                a_start += 1
            else:
                a_end -= 1
        else:
            if rng.random() < 0.5:
                b_start += 1
            else:
                b_end -= 1
    if trimmed:
        tokens_a[:] = tokens_a[a_start:a_end]
        tokens_b[:] = tokens_b[b_start:b_end]
    return trimmed


def truncation_trims(a_lengths, b_lengths, max_num_tokens):
    """How many tokens the original's truncation takes from A and from B (arrays in, arrays out).

    It always trims the longer side (B on ties), so the counts do not depend on the coin flips:
    first the longer side down towards the other, then alternately, B first.
    """
    a_lengths, b_lengths = np.asarray(a_lengths), np.asarray(b_lengths)
    excess = np.maximum(a_lengths + b_lengths - max_num_tokens, 0)
    difference = a_lengths - b_lengths
    trims_a = np.minimum(excess, np.maximum(difference, 0))
    trims_b = np.minimum(excess, np.maximum(-difference, 0))
    rest = excess - trims_a - trims_b
    return trims_a + rest // 2, trims_b + (rest + 1) // 2


@contextlib.contextmanager
def paused_gc():
    """Pauses the cyclic garbage collector: planning a block allocates ~10^5 tuples and no cycles.

    Otherwise its collections rescan the growing plan again and again.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
