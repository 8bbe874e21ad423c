"""tf.data readers for the original BERT pretraining TFRecords, one input pipeline per worker.

The record schema (Google's create_pretraining_data.py; see docs/pretraining-records.md):
    input_ids, input_mask, segment_ids         int64 [max_seq_length]
    masked_lm_positions, masked_lm_ids         int64 [max_predictions_per_seq]
    masked_lm_weights                          float [max_predictions_per_seq]
    next_sentence_labels                       int64 [1]
Batches come out keyed by the model's input names (input_word_ids, input_mask, input_type_ids,
masked_lm_positions) plus the labels (masked_lm_ids, masked_lm_weights, next_sentence_labels),
int32 (TPUs have no int64 kernels) with static shapes (drop_remainder), as TPUs need.
"""

import concurrent.futures
import dataclasses
import random

import numpy as np
import tensorflow as tf
from absl import logging
from google.protobuf import message

from bert_tf.pretraining_data import schema
from bert_tf.runtime import io_utils, tf_data
from bert_tf.tokenization import tokenizer_rules

SEQUENCE_FEATURES = ("input_ids", "input_mask", "segment_ids")
PREDICTION_FEATURES = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
# Record feature name -> batch key (the model's input names for what goes into the model).
BATCH_KEYS = {
    "input_ids": "input_word_ids",
    "input_mask": "input_mask",
    "segment_ids": "input_type_ids",
    "masked_lm_positions": "masked_lm_positions",
    "masked_lm_ids": "masked_lm_ids",
    "masked_lm_weights": "masked_lm_weights",
    "next_sentence_labels": "next_sentence_labels",
}
SHUFFLE_BUFFER_RECORDS = 10000
MAX_PARALLEL_FILES = 8
# Opening a file on gs:// takes tens of milliseconds: the checks of many files overlap.
CHECK_THREADS = 8


class RecordFormatError(io_utils.UsageError):
    """Records that do not fit the flags (lengths) or the schema (a missing feature)."""


LENGTH_FLAGS = ("--max_seq_length", "--max_predictions_per_seq")


def check_record_lengths(
    input_file, max_seq_length, max_predictions_per_seq, length_flags=LENGTH_FLAGS
):
    """Reads the first record of `input_file`; a missing feature or a length unlike the flags is an error.

    `length_flags` name the two lengths in the message.

    Checked in Python before training, because a FixedLenFeature mismatch inside the graph only
    says "Can't parse serialized Example" after the model is built.
    """
    try:
        first = next(iter(tf.data.TFRecordDataset(input_file).take(1)), None)
        if first is None:
            raise EmptyRecordFileError(f"{input_file}: contains no records")
        example = tf.train.Example.FromString(first.numpy())
    except tf.errors.DataLossError as e:
        raise RecordFormatError(
            f"{input_file}: not a TFRecord file (its first record is corrupted)"
        ) from e
    except message.DecodeError as e:
        raise RecordFormatError(
            f"{input_file}: its first record is not a tf.train.Example ({e})"
        ) from e
    features = example.features.feature
    seq_flag, predictions_flag = length_flags
    expected = {name: (seq_flag, max_seq_length) for name in SEQUENCE_FEATURES}
    expected.update(
        {name: (predictions_flag, max_predictions_per_seq) for name in PREDICTION_FEATURES}
    )
    expected["next_sentence_labels"] = ("(one label)", 1)
    for name, (flag, want) in expected.items():
        if name not in features:
            raise RecordFormatError(
                f"{input_file}: record has no feature {name!r}; expected the original BERT pretraining "
                f"schema ({', '.join(expected)})"
            )
        feature = features[name]
        have = (
            len(feature.float_list.value)
            if name == "masked_lm_weights"
            else len(feature.int64_list.value)
        )
        if have != want:
            raise RecordFormatError(
                f"{input_file}: feature {name!r} has length {have} but {flag}={want}; "
                f"{flag} must match the value create_pretraining_data used ({have})"
            )


class EmptyRecordFileError(RecordFormatError):
    """A record file with no records at all (which check_input_files skips)."""


def check_input_files(
    files, max_seq_length, max_predictions_per_seq, flag, length_flags=LENGTH_FLAGS
):
    """The files to read: each one's first record is checked, and files with no records are dropped.

    Every file, not only the first, because files of another --max_seq_length mixed into the glob
    otherwise fail in the first training loop with a parse error that names no file. An empty file
    (a shard that drew no instances) is harmless to skip; all of them empty is an error.
    """

    def check(path):
        try:
            check_record_lengths(path, max_seq_length, max_predictions_per_seq, length_flags)
        except EmptyRecordFileError:
            return False
        return True

    try:
        with concurrent.futures.ThreadPoolExecutor(min(CHECK_THREADS, len(files))) as pool:
            has_records = list(pool.map(check, files))
    except RecordFormatError as e:
        raise RecordFormatError(f"{flag}: {e}") from e
    for path, ok in zip(files, has_records):
        if not ok:
            logging.warning("%s: contains no records; skipped", path)
    kept = [path for path, ok in zip(files, has_records) if ok]
    if not kept:
        raise RecordFormatError(f"{flag}: all {len(files)} files contain no records")
    return kept


@dataclasses.dataclass(frozen=True)
class DynamicMasking:
    """RoBERTa-style re-masking of each batch: the rates of the original, applied on the fly."""

    vocab_size: int
    mask_id: int
    unmaskable_ids: tuple  # [CLS], [SEP], [PAD]: never predicted.
    selection_rate: float = 0.15
    mask_token_rate: float = 0.8
    random_token_rate: float = 0.1

    @classmethod
    def from_vocab_file(cls, vocab_file, vocab_size=None):
        """Reads the special-token ids from vocab.txt."""
        vocab = tokenizer_rules.load_vocab(vocab_file)
        missing = [t for t in ("[MASK]", "[CLS]", "[SEP]", "[PAD]") if t not in vocab]
        if missing:
            raise io_utils.UsageError(
                f"{vocab_file}: dynamic masking needs the token(s) {', '.join(missing)}"
            )
        return cls(
            vocab_size=vocab_size or len(vocab),
            mask_id=vocab["[MASK]"],
            unmaskable_ids=(vocab["[CLS]"], vocab["[SEP]"], vocab["[PAD]"]),
        )


def _unmasked_input_ids(batch):
    """The stored ids with the statically masked positions put back to their original tokens:
    masked_lm_ids at masked_lm_positions, where masked_lm_weights > 0."""
    ids = batch["input_word_ids"]
    positions = batch["masked_lm_positions"]
    real = batch["masked_lm_weights"] > 0
    rows = tf.broadcast_to(tf.range(tf.shape(ids)[0])[:, None], tf.shape(positions))
    indices = tf.stack([tf.boolean_mask(rows, real), tf.boolean_mask(positions, real)], axis=1)
    return tf.tensor_scatter_nd_update(ids, indices, tf.boolean_mask(batch["masked_lm_ids"], real))


def _stateless_mask_values_chooser(text, masking, seed):
    """tensorflow_text's MaskValuesChooser (80% [MASK], 10% random id, 10% kept) drawn from a fixed seed.

    tensorflow_text's own chooser and selector use stateful random ops, which a tf.data iterator
    cannot checkpoint ("RandomShuffle is stateful"): saving a --dynamic_masking run failed. Seeding
    every batch from its index makes the masks a function of the position in the data, so a resumed
    run draws exactly the masks an uninterrupted one would.
    """

    class StatelessMaskValuesChooser(text.MaskValuesChooser):
        def get_mask_values(self, masked_lm_ids):
            """The replacement values for the selected ids (a ragged [batch, (n)] tensor)."""
            ids = masked_lm_ids.flat_values
            fold = tf.random.experimental.stateless_fold_in
            draws = tf.random.stateless_uniform(tf.shape(ids), seed=fold(seed, 1))
            random_ids = tf.random.stateless_uniform(
                tf.shape(ids),
                seed=fold(seed, 2),
                minval=0,
                maxval=masking.vocab_size,
                dtype=ids.dtype,
            )
            values = tf.where(
                draws < masking.mask_token_rate,
                tf.cast(masking.mask_id, ids.dtype),
                tf.where(
                    draws < masking.mask_token_rate + masking.random_token_rate, random_ids, ids
                ),
            )
            return masked_lm_ids.with_flat_values(values)

    return StatelessMaskValuesChooser(
        masking.vocab_size,
        masking.mask_id,
        mask_token_rate=masking.mask_token_rate,
        random_token_rate=masking.random_token_rate,
    )


def remask_batch(batch, masking, max_predictions_per_seq, seed):
    """Replaces the static masks of a batch with fresh ones (tensorflow_text's masking, seeded by `seed`)."""
    import tensorflow_text as text  # Imported here: only --dynamic_masking needs it.

    original_ids = _unmasked_input_ids(batch)
    ragged_ids = tf.RaggedTensor.from_tensor(
        original_ids, lengths=tf.reduce_sum(batch["input_mask"], axis=1)
    )
    select_seed = tf.random.experimental.stateless_fold_in(seed, 0)

    def shuffle_row(row_positions):
        # The row's positions are flat batch indices, so their minimum tells rows apart.
        row_seed = tf.random.experimental.stateless_fold_in(
            select_seed, tf.reduce_min(row_positions)
        )
        return tf.random.experimental.stateless_shuffle(row_positions, seed=row_seed)

    selector = text.RandomItemSelector(
        max_selections_per_batch=max_predictions_per_seq,
        selection_rate=masking.selection_rate,
        unselectable_ids=list(masking.unmaskable_ids),
        shuffle_fn=shuffle_row,
    )
    chooser = _stateless_mask_values_chooser(text, masking, seed)
    masked_ids, positions, labels = text.mask_language_model(ragged_ids, selector, chooser)

    batch_size, seq_length = original_ids.shape

    def padded(ragged, width, dtype):
        """A ragged [batch, (n)] tensor zero-padded to a static [batch, width]."""
        dense = ragged.to_tensor(
            default_value=tf.zeros([], ragged.dtype), shape=[tf.shape(original_ids)[0], width]
        )
        return tf.ensure_shape(tf.cast(dense, dtype), [batch_size, width])

    out = dict(batch)
    out["input_word_ids"] = padded(masked_ids, seq_length, tf.int32)
    out["masked_lm_positions"] = padded(positions, max_predictions_per_seq, tf.int32)
    out["masked_lm_ids"] = padded(labels, max_predictions_per_seq, tf.int32)
    out["masked_lm_weights"] = padded(
        tf.ones_like(labels, dtype=tf.float32), max_predictions_per_seq, tf.float32
    )
    return out


def _parse_batch(serialized, spec):
    """Parses a batch of serialized Examples into int32/float32 tensors under the model's names."""
    parsed = tf.io.parse_example(serialized, spec)
    batch = {}
    for name, value in parsed.items():
        if value.dtype == tf.int64:
            value = tf.cast(value, tf.int32)
        batch[BATCH_KEYS[name]] = value
    batch["next_sentence_labels"] = tf.squeeze(batch["next_sentence_labels"], axis=1)
    return batch


# Enough records for a frequency table (about 2 million masked tokens at 15% of 128), read in
# file order so that the table depends on the records alone.
TOKEN_COUNT_RECORDS = 100_000


def masked_token_counts(files, max_seq_length, max_predictions_per_seq, vocab_size):
    """How often each token id is the answer at a real masked position, over the first
    TOKEN_COUNT_RECORDS records of `files` read in order: an int64 array of `vocab_size`."""
    spec = {
        name: feature
        for name, feature in schema.feature_spec(max_seq_length, max_predictions_per_seq).items()
        if name in ("masked_lm_ids", "masked_lm_weights")
    }
    records = tf.data.TFRecordDataset(list(files)).take(TOKEN_COUNT_RECORDS).batch(4096)
    counts = np.zeros(vocab_size, np.int64)
    for serialized in records:
        parsed = tf.io.parse_example(serialized, spec)
        ids = parsed["masked_lm_ids"].numpy()[parsed["masked_lm_weights"].numpy() > 0]
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise RecordFormatError(
                f"{', '.join(files)}: a masked token id of {ids.min()}..{ids.max()} is outside the "
                f"model's vocabulary of {vocab_size}: make the records with the model's vocab.txt"
            )
        counts += np.bincount(ids, minlength=vocab_size)
    return counts


def pretraining_dataset(
    files,
    batch_size,
    max_seq_length,
    max_predictions_per_seq,
    is_training,
    input_context=None,
    seed=None,
    dynamic_masking=None,
    restore_masked_tokens=False,
):
    """Batches of pretraining records for ONE input pipeline (one worker) of `batch_size` examples.

    Training: each worker takes every n-th file (fewer files than workers: every n-th record),
    files are shuffled and read `MAX_PARALLEL_FILES` at a time, records shuffled, repeated forever.
    Eval: files in order, one pass. With `seed`, the order is deterministic (so a run resumed from
    a checkpointed iterator sees exactly the batches an uninterrupted run would). With
    `restore_masked_tokens`, input_word_ids are the text's own tokens, the masked ones put back:
    what a left-to-right language model reads.
    """
    files = list(files)
    num_pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    deterministic = seed is not None or not is_training
    shard_records = num_pipelines > 1 and len(files) < num_pipelines

    dataset = tf.data.Dataset.from_tensor_slices(tf.constant(files, tf.string))
    if num_pipelines > 1 and not shard_records:
        dataset = dataset.shard(num_pipelines, pipeline_id)
    if is_training:
        dataset = dataset.shuffle(len(files), seed=seed, reshuffle_each_iteration=True).repeat()
    dataset = dataset.interleave(
        tf.data.TFRecordDataset,
        cycle_length=min(len(files), MAX_PARALLEL_FILES),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic,
    )
    if shard_records:
        dataset = dataset.shard(num_pipelines, pipeline_id)
    if is_training:
        dataset = dataset.shuffle(SHUFFLE_BUFFER_RECORDS, seed=seed, reshuffle_each_iteration=True)
    # Parsing whole batches is several times faster than parsing records one by one.
    dataset = dataset.batch(batch_size, drop_remainder=True)
    spec = schema.feature_spec(max_seq_length, max_predictions_per_seq)
    dataset = dataset.map(
        lambda serialized: _parse_batch(serialized, spec),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic,
    )
    if restore_masked_tokens:
        dataset = dataset.map(
            lambda batch: dict(batch, input_word_ids=_unmasked_input_ids(batch)),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=deterministic,
        )
    if dynamic_masking is not None:
        # Each batch's masks come from (seed, pipeline, batch number): stateless, so checkpointable.
        base_seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
        dataset = dataset.enumerate().map(
            lambda index, batch: remask_batch(
                batch,
                dynamic_masking,
                max_predictions_per_seq,
                tf.stack([tf.constant(base_seed, tf.int64) * 1024 + pipeline_id, index]),
            ),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=deterministic,
        )
    return tf_data.without_autotune(dataset, deterministic).prefetch(tf.data.AUTOTUNE)


def distributed_pretraining_dataset(
    strategy,
    files,
    global_batch_size,
    max_seq_length,
    max_predictions_per_seq,
    is_training,
    seed=None,
    dynamic_masking=None,
    restore_masked_tokens=False,
):
    """The strategy's distributed dataset: each worker builds its own pipeline of per-replica batches
    (the arguments are pretraining_dataset's, with the global batch size)."""
    if global_batch_size % strategy.num_replicas_in_sync:
        raise io_utils.UsageError(
            f"the global batch size {global_batch_size} is not divisible by the "
            f"{strategy.num_replicas_in_sync} replicas"
        )

    def dataset_fn(input_context):
        return pretraining_dataset(
            files,
            input_context.get_per_replica_batch_size(global_batch_size),
            max_seq_length,
            max_predictions_per_seq,
            is_training,
            input_context=input_context,
            seed=seed,
            dynamic_masking=dynamic_masking,
            restore_masked_tokens=restore_masked_tokens,
        )

    return strategy.distribute_datasets_from_function(dataset_fn)
