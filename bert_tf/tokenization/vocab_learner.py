"""Learns a WordPiece vocabulary (vocab.txt) from text files.

Words are counted with our own `BasicTokenizer`, the first half of `FullTokenizer`, so the vocabulary
is learned on exactly the words the tokenizer will later look up (tensorflow_text's
`bert_vocab_from_dataset` would split and normalize with its own, different rules). The learning is
tensorflow_text's WordPiece learner (`wordpiece_tokenizer_learner_lib.learn`): a binary search over a
frequency threshold for the vocabulary closest below `vocab_size`.

The vocabulary starts with the reserved tokens ([PAD] is id 0, then [UNK], [CLS], [SEP], [MASK]),
then every single character as a word start and as a `##` continuation, then the learned pieces by
decreasing frequency.

`python -m bert_tf.build_vocab` is its CLI.
"""

import collections
import contextlib
import multiprocessing
import os
import time

from absl import logging
from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as learner
from tqdm import tqdm

from bert_tf.runtime import io_utils, quiet
from bert_tf.tokenization.python_tokenizer import BasicTokenizer, decode_counting_invalid
from bert_tf.tokenization.tokenizer_rules import MAX_INPUT_CHARS_PER_WORD, SPECIAL_TOKENS

JOINER = "##"
# The learner's own limits: longer words are not learned from, rarer characters are left out.
MAX_TOKEN_LENGTH = 50
MAX_UNIQUE_CHARS = 1000
# Lines are counted in batches of about this many bytes, in worker processes when there are several.
CHUNK_BYTES = 1 << 20

CountStats = collections.namedtuple("CountStats", ["files", "lines", "bytes", "invalid_utf8"])


def _count_chunk(args):
    """Counts the words of a batch of raw lines; returns (Counter, invalid UTF-8 replacements, lines, bytes)."""
    lines, do_lower_case = args
    tokenizer = BasicTokenizer(do_lower_case=do_lower_case)
    counts = collections.Counter()
    invalid = 0
    num_bytes = 0
    for raw in lines:
        num_bytes += len(raw)
        text, replaced = decode_counting_invalid(raw)
        invalid += replaced
        counts.update(tokenizer.tokenize(text))
    return counts, invalid, len(lines), num_bytes


def _iter_chunks(files, do_lower_case):
    """Yields (batch of raw lines, do_lower_case) from `files`, a batch being about CHUNK_BYTES."""
    for path in files:
        batch, batch_bytes = [], 0
        with io_utils.open_text(path) as f:
            for raw in f:
                batch.append(raw)
                batch_bytes += len(raw)
                if batch_bytes >= CHUNK_BYTES:
                    yield batch, do_lower_case
                    batch, batch_bytes = [], 0
        if batch:
            yield batch, do_lower_case


def _total_bytes(files):
    """The bytes the progress bar will count, or None when unknown (compressed or remote files)."""
    if any(path.endswith(".gz") or "://" in path for path in files):
        return None
    return sum(os.path.getsize(path) for path in files)


def count_words(files, do_lower_case=True, num_workers=1, show_progress=True):
    """Counts the BasicTokenizer words of every line of `files`; returns (Counter, CountStats).

    Bytes that are not UTF-8 are replaced by U+FFFD (which the tokenizer then drops) and counted.
    The counts do not depend on `num_workers`.
    """
    counts = collections.Counter()
    lines = total_bytes = invalid = 0
    progress = tqdm(
        total=_total_bytes(files),
        unit="B",
        unit_scale=True,
        desc="counting words",
        disable=not (show_progress and quiet.stderr_is_terminal()),
        mininterval=0.5,
    )
    with progress, contextlib.ExitStack() as stack:
        chunks = _iter_chunks(files, do_lower_case)
        if num_workers > 1:
            # fork: the workers need no re-import of TensorFlow. imap reads ahead of the workers.
            pool = stack.enter_context(multiprocessing.get_context("fork").Pool(num_workers))
            results = pool.imap(_count_chunk, chunks)
        else:
            results = map(_count_chunk, chunks)
        for chunk_counts, chunk_invalid, chunk_lines, chunk_bytes in results:
            counts.update(chunk_counts)
            invalid += chunk_invalid
            lines += chunk_lines
            total_bytes += chunk_bytes
            progress.update(chunk_bytes)
    return counts, CountStats(len(files), lines, total_bytes, invalid)


def _threshold_bracket(word_counts, vocab_size, fixed_tokens):
    """Frequency thresholds (lower, upper) between which the learner's binary search must land.

    The learner searches every threshold from its lower bound up to the top word count, and each
    probe re-learns the whole vocabulary, so a tight bracket saves most of the time:
      * a word kept whole has at least its own count, so at any threshold that more than
        `vocab_size` words reach, the vocabulary is too big: the answer lies above it;
      * no piece's count exceeds the raw count of that substring, so at a threshold that at most
        `vocab_size - fixed_tokens` substrings reach, the vocabulary is small enough.
    """
    word_freqs = sorted((count for _, count in word_counts), reverse=True)
    lower = word_freqs[vocab_size] + 1 if len(word_freqs) > vocab_size else 1
    substring_counts = collections.Counter()
    for word, count in word_counts:
        for start in range(len(word)):
            for end in range(start + 1, len(word) + 1):
                piece = word[start:end] if start == 0 else JOINER + word[start:end]
                substring_counts[piece] += count
    budget = vocab_size - fixed_tokens
    piece_freqs = sorted(substring_counts.values(), reverse=True)
    upper = piece_freqs[budget] + 1 if 0 <= budget < len(piece_freqs) else 1
    return lower, max(lower, upper)


def learn_vocab(
    word_counts,
    vocab_size,
    reserved_tokens=SPECIAL_TOKENS,
    max_unique_chars=MAX_UNIQUE_CHARS,
    num_iterations=4,
):
    """Learns a WordPiece vocabulary of at most `vocab_size` tokens from a word->count mapping.

    Returns (tokens, info): the tokens in id order, reserved tokens first; `info` says how many
    characters were left out of the alphabet and how many learned pieces were cut to fit.
    """
    reserved_tokens = list(reserved_tokens)
    char_freqs = collections.Counter()
    for word, count in word_counts.items():
        if len(word) <= MAX_INPUT_CHARS_PER_WORD:
            for char in word:
                char_freqs[char] += count
    alphabet = [c for c, _ in sorted(char_freqs.items(), key=lambda cf: (-cf[1], cf[0]))]
    kept_chars = alphabet[:max_unique_chars]
    # The learner would pick its own alphabet from the shorter words only; words with a character
    # outside ours are dropped here instead, so that its characters are exactly `kept_chars` and
    # the reserved tokens plus both forms of each character fill exactly `fixed` slots below.
    kept_set = set(kept_chars)
    # A fixed order makes the learner's tie-breaking, and so the vocabulary, deterministic.
    learnable = sorted(
        (
            (w, c)
            for w, c in word_counts.items()
            if len(w) <= MAX_TOKEN_LENGTH and w not in reserved_tokens and kept_set.issuperset(w)
        ),
        key=lambda wc: (-wc[1], wc[0]),
    )
    if not learnable:
        raise ValueError("no words to learn a vocabulary from: the input has no text")
    fixed = len(reserved_tokens) + 2 * len(kept_chars)
    if fixed > vocab_size:
        raise ValueError(
            f"vocab_size {vocab_size} is too small: the {len(reserved_tokens)} reserved tokens and "
            f"{len(kept_chars)} characters (each also as ##char) alone need {fixed}"
        )
    lower, upper = _threshold_bracket(learnable, vocab_size, fixed)
    logging.info(
        "learning: %d distinct words, %d characters, frequency threshold in [%d, %d]",
        len(learnable),
        len(alphabet),
        lower,
        upper,
    )
    tokens = learner.learn(
        learnable,
        vocab_size,
        reserved_tokens,
        upper_thresh=upper,
        lower_thresh=lower,
        num_iterations=num_iterations,
        max_input_tokens=-1,
        max_token_length=MAX_TOKEN_LENGTH,
        max_unique_chars=max_unique_chars,
        include_joiner_token=True,
        joiner=JOINER,
    )
    # The learner only sees words up to MAX_TOKEN_LENGTH characters; characters found only in
    # longer words (which the tokenizer still splits, up to 200 characters) are added here so that
    # no character of the corpus's alphabet becomes [UNK].
    present = set(tokens)
    missing = [t for c in kept_chars for t in (c, JOINER + c) if t not in present]
    head = reserved_tokens + [
        t
        for t in tokens[len(reserved_tokens) :]
        if len(t) == 1 or (t.startswith(JOINER) and len(t) == len(JOINER) + 1)
    ]
    head_set = set(head)
    learned = [t for t in tokens if t not in head_set]
    # The binary search can end above the target when it runs out of thresholds: cut the rarest
    # learned pieces (they come last), never a reserved token or a character.
    room = vocab_size - len(head) - len(missing)
    cut = max(0, len(learned) - room)
    if cut:
        learned = learned[:room]
    info = {
        "chars_left_out": len(alphabet) - len(kept_chars),
        "pieces_cut": cut,
        "chars_added": len(missing),
    }
    return head + missing + learned, info


def write_vocab(tokens, output_file):
    """Writes one token per line (id = line number) atomically."""
    io_utils.atomic_write_text(output_file, "".join(t + "\n" for t in tokens))


def build_vocab(
    input_files, output_file, vocab_size, do_lower_case=True, num_workers=1, show_progress=True
):
    """Counts words, learns the vocabulary and writes it; returns a summary dict."""
    started = time.time()
    counts, stats = count_words(input_files, do_lower_case, num_workers, show_progress)
    counted = time.time()
    logging.info(
        "counted %d words (%d distinct) in %d lines, %.1f MB, %d files in %.1f s "
        "(%.2f MB/s); %d invalid UTF-8 sequences replaced",
        sum(counts.values()),
        len(counts),
        stats.lines,
        stats.bytes / 1e6,
        stats.files,
        counted - started,
        stats.bytes / 1e6 / max(counted - started, 1e-9),
        stats.invalid_utf8,
    )
    tokens, info = learn_vocab(counts, vocab_size)
    logging.debug("learned %d tokens in %.1f s", len(tokens), time.time() - counted)
    write_vocab(tokens, output_file)
    return {
        "output_file": output_file,
        "vocab_size": len(tokens),
        "requested_vocab_size": vocab_size,
        "files": stats.files,
        "lines": stats.lines,
        "bytes": stats.bytes,
        "words": sum(counts.values()),
        "distinct_words": len(counts),
        "invalid_utf8": stats.invalid_utf8,
        "seconds": round(time.time() - started, 1),
        **info,
    }
