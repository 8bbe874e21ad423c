"""What every task's features go through: segments packed into BERT's input layout, their records and datasets.

Both packers follow the original BERT layout and truncation rule: `pack_segments` in Python over
FullTokenizer ids, `pack_inputs` in TensorFlow ops over GraphTokenizer ids inside a graph.

    [CLS] a [SEP] b [SEP]     segment ids 0 for [CLS], a and the first [SEP]; 1 for b and its [SEP]

While the segments are too long, one token is removed from the end of the longest segment (the
last of the longest on a tie; for two segments that is the original `_truncate_seq_pair`).
Padding is id 0 with mask 0 and segment id 0. bert_tf.training.finetuning writes the features with
`write_records` and reads them back with `records_dataset`.

Sentence (pair) tasks pass `drop_empty_b=True`: a pair whose b has no tokens (an empty string, or
text such as "\u200b" that tokenizes to nothing) is packed as the single sentence `[CLS] a [SEP]`,
with a's budget max_seq_length - 2, as the original convert_single_example's `if tokens_b:` has
it. SQuAD keeps `[CLS] query [SEP] doc [SEP]` whatever the query holds, as run_squad.py does.
"""

import dataclasses

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from bert_tf.runtime import io_utils
from bert_tf.runtime.tf_data import without_autotune

# Record feature name -> the model's input name (the TF Hub / Model Garden convention).
MODEL_INPUT_NAMES = {
    "input_ids": "input_word_ids",
    "input_mask": "input_mask",
    "segment_ids": "input_type_ids",
}

# pack_segments and pack_inputs take the same options (with the same defaults) and honour them
# alike, except those listed here, which one packer alone has and which change no packed value;
# tests/test_pairs_in_step.py holds the two to this. None so far.
ONE_SIDED_PACKER_OPTIONS = frozenset()

# Where every distinct shape is compiled (XLA: --jit_compile, in training and in exports), a
# dynamic-length batch is cut to its longest row rounded up to this many tokens: little padding,
# and at most max_seq_length / 16 shapes. TensorFlow's graph kernels take any shape at no extra
# cost, so without XLA a batch is cut to its exact longest row (length_multiple).
LENGTH_BUCKET = 16
# Training groups examples of similar length within windows of this many batches of the shuffled
# stream: wide enough that each batch spans a narrow band of lengths, narrow enough that a window
# is still a random sample of the data.
LENGTH_GROUP_BATCHES = 16


def truncated_lengths(lengths, max_total):
    """The segment lengths after the original rule: trim the end of the longest one (the last on ties).

    Computed in closed form: the rule leaves every segment at min(length, c) for the largest cap c
    that fits, and the leftover budget goes one token each to the first segments still above c.
    """
    lengths = [int(n) for n in lengths]
    if max_total < 0:
        raise ValueError(f"no room for any token: max_total={max_total}")
    if sum(lengths) <= max_total:
        return lengths
    low, high = 0, max(lengths)
    while low < high:  # the largest cap c with sum(min(n, c)) <= max_total
        cap = (low + high + 1) // 2
        if sum(min(n, cap) for n in lengths) <= max_total:
            low = cap
        else:
            high = cap - 1
    result = [min(n, low) for n in lengths]
    leftover = max_total - sum(result)
    for i, n in enumerate(lengths):
        if leftover and n > low:
            result[i] += 1
            leftover -= 1
    return result


def truncate_segments(segments, max_total):
    """Returns the segments (lists) cut to at most `max_total` items in all, by the original rule."""
    return [
        list(s[:n])
        for s, n in zip(segments, truncated_lengths([len(s) for s in segments], max_total))
    ]


def pack_segments(segments, seq_length, cls_id, sep_id, drop_empty_b=False):
    """Packs lists of token ids into (input_ids, input_mask, segment_ids), int32 [seq_length] each.

    `[CLS] s0 [SEP] s1 [SEP] ...`, truncated by the original rule to fit, then zero-padded. With
    `drop_empty_b`, a pair whose second segment is empty is packed as its first segment alone.
    """
    if drop_empty_b and len(segments) == 2 and not len(segments[1]):
        segments = segments[:1]
    segments = truncate_segments(segments, seq_length - len(segments) - 1)
    input_ids = np.zeros(seq_length, np.int32)
    segment_ids = np.zeros(seq_length, np.int32)
    position = 1
    input_ids[0] = cls_id
    for type_id, segment in enumerate(segments):
        end = position + len(segment)
        input_ids[position:end] = segment
        input_ids[end] = sep_id
        segment_ids[position : end + 1] = type_id
        position = end + 1
    input_mask = (np.arange(seq_length) < position).astype(np.int32)
    return input_ids, input_mask, segment_ids


def pack_inputs(segments, seq_length, cls_id, sep_id, drop_empty_b=False):
    """The TensorFlow-ops twin of `pack_segments`, for a batch inside any graph.

    `segments`: a list of RaggedTensor ids [batch, (tokens)]. Returns a dict of int32
    [batch, seq_length] tensors: input_word_ids, input_mask, input_type_ids. `drop_empty_b` as
    in `pack_segments`, row by row.

    tensorflow_text's RoundRobinTrimmer is exact here: handing out the budget one token per
    segment in turn (skipping full ones) ends where trimming the last-longest segment ends.
    """
    segments = [tf.cast(s, tf.int32) for s in segments]
    if len(segments) > 1:
        # RoundRobinTrim crashes the process on segments of different row counts.
        rows = tf.stack([s.nrows(out_type=tf.int64) for s in segments])
        with tf.control_dependencies([assert_same_sizes(rows, "segments must have equal rows")]):
            segments = [tf.identity(s) for s in segments]
    if drop_empty_b and len(segments) == 2:
        # The trimmer takes one budget for the whole batch, and rows without b have a larger one
        # (no second [SEP]); so pack the batch both ways and pick each row's packing.
        has_b = (segments[1].row_lengths() > 0)[:, tf.newaxis]
        pair = _pack_ragged(segments, seq_length, cls_id, sep_id)
        single = _pack_ragged(segments[:1], seq_length, cls_id, sep_id)
        return {name: tf.where(has_b, pair[name], single[name]) for name in pair}
    return _pack_ragged(segments, seq_length, cls_id, sep_id)


def assert_same_sizes(sizes, what):
    """An assertion that each of `sizes` (int64 [n]) equals the first; it fails saying `what`."""
    message = tf.strings.format(f"{what}, got {{}}", sizes)
    return tf.debugging.Assert(tf.reduce_all(sizes == sizes[0]), [message])


def _pack_ragged(segments, seq_length, cls_id, sep_id):
    """`pack_inputs` without `drop_empty_b`: every segment gets its [SEP], empty or not."""
    trimmed = tf_text.RoundRobinTrimmer(seq_length - len(segments) - 1).trim(segments)
    ids, type_ids = tf_text.combine_segments(
        trimmed, start_of_sequence_id=cls_id, end_of_segment_id=sep_id
    )
    input_word_ids, input_mask = tf_text.pad_model_inputs(ids, max_seq_length=seq_length)
    input_type_ids, _ = tf_text.pad_model_inputs(type_ids, max_seq_length=seq_length)
    return {
        "input_word_ids": tf.cast(input_word_ids, tf.int32),
        "input_mask": tf.cast(input_mask, tf.int32),
        "input_type_ids": tf.cast(input_type_ids, tf.int32),
    }


def _feature(values):
    """One tf.train.Feature: int64 for integer arrays, float for the others."""
    values = np.asarray(values).reshape(-1)
    if np.issubdtype(values.dtype, np.integer) or values.dtype == np.bool_:
        return tf.train.Feature(
            int64_list=tf.train.Int64List(value=values.astype(np.int64).tolist())
        )
    return tf.train.Feature(float_list=tf.train.FloatList(value=values.astype(np.float32).tolist()))


@dataclasses.dataclass
class TrainData:
    """A task's training set, as the fine-tuning driver writes it into train.tf_record."""

    features: dict  # record feature name -> array [n, ...] (write_records' input)
    num_examples: int  # what epochs count: examples (SQuAD: questions, not their windows)


def write_records(path, features):
    """Writes `features` (name -> array [n, ...]) as n tf.train.Examples to a TFRecord file, atomically.

    Integer arrays become int64 features and the others float features, as the original scripts
    wrote them. Returns n.
    """
    names = list(features)
    arrays = [np.asarray(features[name]) for name in names]
    count = len(arrays[0]) if arrays else 0
    for name, array in zip(names, arrays):
        if len(array) != count:
            raise ValueError(f"feature {name!r} has {len(array)} rows, expected {count}")
    with io_utils.atomic_path(path) as tmp:
        with tf.io.TFRecordWriter(tmp) as writer:
            for i in range(count):
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={name: _feature(array[i]) for name, array in zip(names, arrays)}
                    )
                )
                writer.write(example.SerializeToString())
    return count


def _to_model_batch(batch):
    """Casts int64 to int32 (TPUs have no int64 kernels) and renames inputs to the model's names."""
    out = {}
    for name, value in batch.items():
        if value.dtype == tf.int64:
            value = tf.cast(value, tf.int32)
        out[MODEL_INPUT_NAMES.get(name, name)] = value
    return out


def _row_ends(mask):
    """One past the last unmasked position of every row of `mask` [..., s] (0 for an empty row): [...]."""
    positions = tf.range(1, tf.shape(mask)[-1] + 1, dtype=tf.int32)
    # The last set position, not the mask's sum, so a mask with holes is never cut short.
    return tf.reduce_max(tf.where(tf.not_equal(mask, 0), positions, 0), axis=-1)


def length_multiple(jit_compile):
    """What a dynamic-length batch's length is rounded up to: LENGTH_BUCKET under XLA, else 1."""
    return LENGTH_BUCKET if jit_compile else 1


def bucketed_length(row_lengths, max_length, multiple=LENGTH_BUCKET):
    """The longest of `row_lengths` rounded up to `multiple`, at most `max_length` (at least 1).

    Exported graphs pad the rows they pack to this length (squad's windows too).
    """
    longest = tf.maximum(tf.cast(tf.reduce_max(row_lengths), tf.int32), 1)
    return tf.minimum(-(-longest // multiple) * multiple, tf.cast(max_length, tf.int32))


def trim_to_longest(inputs, multiple=LENGTH_BUCKET, mask_name="input_mask"):
    """`inputs` with the padding that no row needs cut off: a dict of tensors, cut on the last axis.

    Every tensor of the mask's rank ([b, s], or [b, choices, s]) is cut to the batch's longest row
    (its last unmasked position + 1), rounded up to `multiple` and at most s, so a model sees few
    distinct lengths (XLA compiles each once). Other tensors ([b] labels, positions) pass unchanged.
    Pure TensorFlow: it works in tf.data, tf.function and exported graphs alike.
    """
    mask = inputs[mask_name]
    # At least 1: an empty batch keeps [CLS].
    length = bucketed_length(_row_ends(mask), tf.shape(mask)[-1], multiple)
    rank = mask.shape.rank
    return {
        name: value[..., :length] if value.shape.rank == rank else value
        for name, value in inputs.items()
    }


def example_lengths(mask):
    """The length of every example in a batch: its row end, the longest choice's for [b, choices, s]."""
    ends = _row_ends(mask)
    return (
        tf.reduce_max(ends, axis=list(range(1, ends.shape.rank))) if ends.shape.rank > 1 else ends
    )


def _sort_window(index, window, batch_size, seed):
    """A window of examples [k * batch_size, ...] -> k batches of similar length [k, batch_size, ...].

    The examples are sorted by length (stably, so equal lengths keep their shuffled order) and cut
    into batches, which then come in a random order: a window's batches must not go from short to
    long, or the learning rate schedule would meet lengths in a pattern.
    """
    order = tf.argsort(example_lengths(window["input_mask"]), stable=True)
    order = tf.reshape(order, [-1, batch_size])
    batch_seed = tf.stack([tf.constant(seed or 0, tf.int64), index])
    shuffled = tf.argsort(tf.random.stateless_uniform([tf.shape(order)[0]], seed=batch_seed))
    order = tf.gather(order, shuffled)
    return {name: tf.gather(value, order) for name, value in window.items()}


def _batched(
    dataset, batch_size, is_training, drop_remainder, seed, length_bucket, parse, group_by_length
):
    """Batches of `dataset` through `parse`: static, or trimmed (and, for training with
    `group_by_length`, length-grouped)."""
    # The map functions hold no tensor-dependent Python control flow: AutoGraph's conversions of
    # them (15 per job) only delayed each job's first step, by 1.4 s under cProfile.
    no_autograph = tf.autograph.experimental.do_not_convert
    group = is_training and length_bucket and group_by_length
    window = batch_size * LENGTH_GROUP_BATCHES if group else batch_size
    dataset = dataset.batch(window, drop_remainder=drop_remainder or bool(group))
    # Parsing a batch at once is much faster than parsing records one by one.
    dataset = dataset.map(
        no_autograph(parse), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )
    if group:
        dataset = (
            dataset.enumerate()
            .map(no_autograph(lambda index, batch: _sort_window(index, batch, batch_size, seed)))
            .unbatch()
        )
    if length_bucket:
        dataset = dataset.map(no_autograph(lambda batch: trim_to_longest(batch, length_bucket)))
    return without_autotune(dataset).prefetch(tf.data.AUTOTUNE)


def records_dataset(
    files,
    spec,
    batch_size,
    is_training,
    seed=None,
    input_context=None,
    drop_remainder=None,
    length_bucket=None,
    group_by_length=True,
):
    """Batches of task records for one input pipeline, keyed by the model's input names.

    Training: sharded per pipeline, shuffled (deterministically with `seed`), repeated forever.
    Eval and predict: in file order, one pass, the last batch kept unless `drop_remainder`.
    `length_bucket` None keeps the records' padded length (static shapes, for TPUs); a number N
    cuts each batch with `trim_to_longest(batch, N)`, and for training first groups examples of
    similar length into batches, within windows of LENGTH_GROUP_BATCHES shuffled batches, unless
    `group_by_length` is off (plain shuffled batches).
    """
    files = [files] if isinstance(files, str) else list(files)
    for path in files:
        io_utils.require_file(path, "record")
    if drop_remainder is None:
        drop_remainder = is_training
    dataset = tf.data.TFRecordDataset(files)
    if input_context and input_context.num_input_pipelines > 1:
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    if is_training:
        dataset = dataset.shuffle(10000, seed=seed, reshuffle_each_iteration=True).repeat()
    return _batched(
        dataset,
        batch_size,
        is_training,
        drop_remainder,
        seed,
        length_bucket,
        lambda serialized: _to_model_batch(tf.io.parse_example(serialized, spec)),
        group_by_length,
    )


def features_dataset(
    features,
    batch_size,
    is_training=False,
    seed=None,
    drop_remainder=None,
    length_bucket=None,
    group_by_length=True,
):
    """The in-memory twin of `records_dataset`: batches of `features` (name -> array [n, ...])."""
    if drop_remainder is None:
        drop_remainder = is_training
    dataset = tf.data.Dataset.from_tensor_slices(
        {name: np.asarray(v) for name, v in features.items()}
    )
    if is_training:
        count = len(next(iter(features.values())))
        dataset = dataset.shuffle(count, seed=seed, reshuffle_each_iteration=True).repeat()
    return _batched(
        dataset,
        batch_size,
        is_training,
        drop_remainder,
        seed,
        length_bucket,
        _to_model_batch,
        group_by_length,
    )
