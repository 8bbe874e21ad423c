"""The building blocks of an exported serving graph, shared by every task's serving module.

Text in: GraphTokenizer (FullTokenizer's ids) and the original packing, as training packs; the
assets every export carries; the module base whose `serve` is `serving_default`; and model calls
that run a batch in groups of similar length, or any number of rows in bounded chunks. Only
TensorFlow core and tensorflow_text ops.
"""

import functools
import inspect

import tensorflow as tf

from bert_tf.model.model_dir import ModelDir
from bert_tf.runtime import io_utils
from bert_tf.tasks.packing import (
    LENGTH_BUCKET,
    assert_same_sizes,
    bucketed_length,
    example_lengths,
    pack_inputs,
    trim_to_longest,
)
from bert_tf.tokenization.graph_tokenizer import GraphTokenizer


class Assets(tf.Module):
    """The files every export carries, and do_lower_case as a variable (the TF Hub convention)."""

    def __init__(self, model_dir, config):
        super().__init__()
        directory = ModelDir(model_dir)
        self.vocab_file = tf.saved_model.Asset(directory.vocab_file)
        self.bert_config_file = tf.saved_model.Asset(directory.config_file)
        if tf.io.gfile.exists(directory.task_file):
            self.task_file = tf.saved_model.Asset(directory.task_file)
        self.do_lower_case = tf.Variable(
            config.do_lower_case, trainable=False, name="do_lower_case"
        )


def text_spec(name):
    """The input signature entry of one text input: UTF-8 strings [batch]."""
    return tf.TensorSpec([None], tf.string, name=name)


# A feature no Example has: parsing for it only checks that the bytes are a tf.Example.
_PROBE_FEATURE = "bert_tf/probe"


def parse_examples(serialized, features, input_name="inputs"):
    """tf.io.parse_example, where a value that is not a serialized tf.Example fails naming the input and row.

    ParseExample's own error quotes the bytes it could not parse, and TensorFlow's Python cannot
    make an exception of a message that is not UTF-8: apps would get a UnicodeDecodeError instead of
    an InvalidArgumentError. So the batch is first parsed for a feature no Example has inside
    tf.data, whose ignore_errors is the one way a graph can see an op fail without failing; if
    that parse failed, the rows are parsed one by one to find the first bad one, and an assertion
    (InvalidArgumentError) with a message of ours stops the call. It costs about 0.2 ms a call.
    """
    rows = tf.size(serialized, out_type=tf.int64)
    probe_spec = {_PROBE_FEATURE: tf.io.FixedLenFeature([], tf.int64, default_value=0)}

    def probe(values):
        return tf.io.parse_example(values, probe_spec)[_PROBE_FEATURE]

    # The whole batch's probe survives ignore_errors only if every row parses; the zeros after it
    # make the count readable either way (get_single_element needs an element).
    survivors = (
        tf.data.Dataset.from_tensors(serialized)
        .map(probe)
        .ignore_errors()
        .concatenate(tf.data.Dataset.from_tensors(tf.zeros([rows], tf.int64)))
        .batch(2)
    )
    all_parse = tf.shape(survivors.get_single_element(), out_type=tf.int64)[0] == 2

    def first_bad_row():
        # The indices of the rows that parse, then `rows`: the first index missing is the bad row.
        good = (
            tf.data.Dataset.from_tensor_slices((tf.range(rows), serialized))
            .map(lambda index, value: (index, probe(value[tf.newaxis])))
            .ignore_errors()
            .map(lambda index, _: index)
            .concatenate(tf.data.Dataset.from_tensors(rows))
            .batch(rows + 1)
            .get_single_element()
        )
        return tf.argmax(good != tf.range(tf.size(good, out_type=tf.int64)), output_type=tf.int64)

    bad_row = tf.cond(all_parse, lambda: tf.constant(-1, tf.int64), first_bad_row)
    # No quotes: Assert prints its data escaped, and \' reads badly.
    message = tf.strings.format(f"{input_name}[{{}}] is not a serialized tf.Example", bad_row)
    with tf.control_dependencies([tf.debugging.Assert(all_parse, [message])]):
        return tf.io.parse_example(serialized, features)


class TextPacker:
    """GraphTokenizer plus the original packing: strings -> the encoder's int32 inputs.

    A plain object, not a tf.Module, so that saving does not track the tokenizer: the saved graphs
    capture what they use of it as constants, and its own tf.functions, which no serving signature
    needs, are not serialized (tracing them took most of the export time).
    """

    def __init__(
        self,
        model_dir,
        config,
        seq_length,
        dynamic_length=True,
        length_multiple=1,
        special_tokens=(),
    ):
        vocab_file = ModelDir(model_dir).vocab_file
        # `special_tokens`: literals kept whole in the text (fill-mask's [MASK]); none by default.
        self.tokenizer = GraphTokenizer(
            vocab_file, config.do_lower_case, special_tokens=special_tokens
        )
        missing = [t for t in ("[CLS]", "[SEP]") if t not in self.tokenizer.special_ids]
        if missing:
            raise io_utils.UsageError(f"{vocab_file} has no {' or '.join(missing)} token")
        self.seq_length = seq_length
        # Pad each batch to its longest input, not to seq_length, which stays the truncation
        # limit: short requests do not pay for the longest one allowed. The length is rounded up
        # to `length_multiple`: 1 for graph kernels, which take any shape (exact lengths take 5%
        # to 18% off a batch-1 call against multiples of 16: benchmarks/RESULTS.md, "Inference:
        # what each export choice buys"); LENGTH_BUCKET for XLA, which compiles each
        # (tasks.length_multiple).
        self.dynamic_length = dynamic_length
        self.length_multiple = length_multiple
        self.cls_id = self.tokenizer.special_ids["[CLS]"]
        self.sep_id = self.tokenizer.special_ids["[SEP]"]

    def pack(self, texts):
        """Tokenizes each tensor of `texts` (one per segment) and packs them to seq_length."""
        return self.pack_ids([self.tokenizer.tokenize(text) for text in texts])

    def pack_ids(self, segments):
        """Packs ragged token ids [b, (tokens)] (one per segment): truncated to seq_length, padded
        to the batch's longest row, rounded up (or to seq_length without dynamic_length)."""
        # A pair's b with no tokens packs as a single sentence, as fine-tuning packed it.
        packed = pack_inputs(segments, self.seq_length, self.cls_id, self.sep_id, drop_empty_b=True)
        return self.trim(packed)

    def trim(self, inputs):
        """Packed inputs [..., seq_length] cut to the batch's longest row, rounded up, when dynamic."""
        return trim_to_longest(inputs, self.length_multiple) if self.dynamic_length else inputs

    def call(self, model, inputs, token_outputs=()):
        """`model`'s outputs for packed `inputs`: in groups of similar length when dynamic."""
        if self.dynamic_length:
            return call_by_length(model, inputs, token_outputs, self.length_multiple)
        return model(inputs, training=False)

    def padded_length(self, row_lengths):
        """How many positions rows of these token counts are padded to: rounded up, or seq_length."""
        if self.dynamic_length:
            return bucketed_length(row_lengths, self.seq_length, self.length_multiple)
        return tf.constant(self.seq_length, tf.int32)


def serving_function(python_function, **options):
    """tf.function without AutoGraph, for the exported graphs' functions (their control flow is
    explicit); with an `input_signature`, each input is checked against its spec's shape first."""
    # The exported graphs branch and loop with tf.cond, tf.while_loop and tf.map_fn only, so
    # AutoGraph has nothing to convert, and its work on every trace is a fixed cost per export (about
    # half a tiny classifier's export time: benchmarks/RESULTS.md, "Inference: what each export
    # choice buys").
    signature = options.get("input_signature")
    if signature is not None:
        python_function = _checking_shapes(python_function, signature)
    return tf.function(python_function, autograph=False, **options)


def _checking_shapes(python_function, signature):
    """`python_function` after checking its inputs: each input's shape against its spec in
    `signature` (EnsureShape), then that the inputs agree on their rows (same_rows).

    Neither a signature call from Python nor a TF Serving session checks the shapes of the
    tensors it is given, and a graph runs on any shape its ops take: a [1, 2] batch of texts could
    come back answered, for a shape no client meant, instead of refused with INVALID_ARGUMENT
    naming the input.
    """

    parameters = inspect.signature(python_function)
    names = [getattr(spec, "name", None) or f"input {i}" for i, spec in enumerate(signature)]

    # Wrapped so that tf.function sees the function's own parameters: callers pass them by name.
    @functools.wraps(python_function)
    def checked(*args, **kwargs):
        values = parameters.bind(*args, **kwargs).args
        values = tf.nest.map_structure(
            lambda value, spec: tf.ensure_shape(value, spec.shape), list(values), list(signature)
        )
        return python_function(*same_rows(values, names))

    return checked


def same_rows(values, names):
    """`values` (tensors, or dicts of them) once every one of rank >= 1 has as many rows as the
    first, and every pair of them of rank >= 2 as many columns, and so on; else a call fails with
    InvalidArgumentError naming the inputs and their sizes.

    tensorflow_text's RoundRobinTrim crashes the process (or reads out of bounds) on segments of
    different row counts (docs/serving.md, "Inputs a signature refuses"), so no packing op may run
    before this check: the values come back behind it.
    """
    flat = [
        (name if key is None else key, tensor)
        for name, value in zip(names, values)
        for key, tensor in (sorted(value.items()) if isinstance(value, dict) else [(None, value)])
    ]
    checks = []
    for axis in range(max((t.shape.rank or 0 for _, t in flat), default=0)):
        sized = [(name, t) for name, t in flat if (t.shape.rank or 0) > axis]
        if len(sized) < 2:
            continue
        sizes = tf.stack([tf.shape(t, out_type=tf.int64)[axis] for _, t in sized])
        label = ", ".join(name for name, _ in sized)
        what = "rows" if axis == 0 else f"sizes along axis {axis}"
        checks.append(assert_same_sizes(sizes, f"inputs {label} must have equal {what}"))
    if not checks:
        return values
    with tf.control_dependencies(checks):
        return tf.nest.map_structure(tf.identity, values)


class ServingModule(tf.Module):
    """What every exported module shares: the assets, and `serve` as its `serving_default` signature."""

    def __init__(self, assets):
        super().__init__()
        self.assets = assets

    def signatures(self):
        """signature key -> (tf.function with an input signature, method name)."""
        return {"serving_default": (self.serve, tf.saved_model.PREDICT_METHOD_NAME)}


class CompiledModel(tf.Module):
    """A Keras model called through one XLA-compiled function (`bert_tf.export --jit_compile`).

    XLA compiles once per input shape, which the length buckets and groups keep few ([1..16,
    multiple of 16]); the warm-up requests compile batch 1 and the 16-row groups of every length
    while a server loads the version, the rest compile on first use. On 2 CPU cores it beats the
    graph export at batch 1 with TensorFlow's default threads and loses to it with one intra-op
    thread (benchmarks/RESULTS.md, "Inference: TensorFlow's default threads" and "Inference: XLA,
    padded exports and keras-hub"). Stock TF Serving runs such a graph only with
    --xla_cpu_compilation_enabled=true (or --xla_gpu_compilation_enabled=true).
    """

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.compiled_call = serving_function(self._call, jit_compile=True)

    def _call(self, inputs):
        return self.model(inputs, training=False)

    @property
    def output(self):
        """The Keras model's symbolic outputs (their dtypes, for callers that need them first)."""
        return self.model.output

    def __call__(self, inputs, training=False):
        """The model's outputs for `inputs` (inference only: `training` must be False)."""
        if training:
            raise ValueError("a CompiledModel is for inference only")
        return self.compiled_call(inputs)


# The most rows a group of one length band runs at once (call_by_length). Groups of rows that
# round up to the same LENGTH_BUCKET waste fewer than 16 positions a row; capping them bounds the
# memory of a call and the shapes an XLA export compiles ([1..16, length]). On real sentences a
# batch of 32 runs about 40% of the positions it would run padded to its longest row, and a cap of 16
# beats 8 (more calls) at batch 32 (benchmarks/RESULTS.md, "Inference: what each export choice
# buys").
LENGTH_GROUP_ROWS = 16
# How many length groups of a batch run at once. Each batch of 32 of the benchmark's real
# sentences makes 4 or 5 groups, each of small matmuls that leave cores idle between kernels;
# running them side by side fills those gaps, with bit-identical outputs (benchmarks/RESULTS.md,
# "Inference: what each export choice buys"). It also bounds a big batch's memory to this many
# groups' activations.
GROUPS_IN_FLIGHT = 4


def length_groups(lengths, group_rows=LENGTH_GROUP_ROWS):
    """Rows grouped by length band: (order, starts, ends) of groups of the rows sorted by length.

    `order` sorts the rows by length; rows order[starts[i]:ends[i]] form group i: rows whose
    lengths round up to the same multiple of LENGTH_BUCKET, at most `group_rows` of them.
    """
    order = tf.argsort(lengths, stable=True)
    # In buckets, non-decreasing; an empty row counts as length 1, as trim_to_longest counts it.
    bucket = -(-tf.maximum(tf.gather(lengths, order), 1) // LENGTH_BUCKET)
    first_of_bucket = tf.searchsorted(bucket, bucket, side="left", out_type=tf.int32)
    rank_in_bucket = tf.range(tf.size(lengths), dtype=tf.int32) - first_of_bucket
    starts = tf.cast(tf.where(rank_in_bucket % group_rows == 0)[:, 0], tf.int32)
    ends = tf.concat([starts[1:], [tf.size(lengths)]], axis=0)
    return order, starts, ends


def call_by_length(
    model, inputs, token_outputs=(), length_multiple=1, group_rows=LENGTH_GROUP_ROWS
):
    """`model`'s outputs for a batch of packed rows, computed in groups of rows of similar length.

    A batch padded to its longest row makes every short row pay for it. Rows are sorted by length
    and run in groups (length_groups), GROUPS_IN_FLIGHT at a time, each cut to its own longest
    row rounded up to `length_multiple` (trim_to_longest); the outputs come back in the batch's
    order.
    `token_outputs` names the outputs that have a sequence axis (the mask's last axis): they are
    padded back to the batch's length with zeros. A batch of at most `group_rows` rows runs in
    one call. The model sees exactly the rows it would see in
    one call, less padding, so each row's outputs are the same up to float rounding.
    """
    mask = inputs["input_mask"]
    symbolic = model.output  # Keras' symbolic outputs: the dtypes and ranks the loop writes
    sequence_axis = mask.shape.rank - 1

    def whole_batch():
        return dict(model(inputs, training=False))

    def in_groups():
        order, starts, ends = length_groups(example_lengths(mask), group_rows)
        sorted_inputs = {name: tf.gather(value, order) for name, value in inputs.items()}
        length = tf.shape(mask)[-1]

        def run_group(i, arrays):
            group = {name: value[starts[i] : ends[i]] for name, value in sorted_inputs.items()}
            outputs = model(trim_to_longest(group, length_multiple), training=False)
            written = []
            for array, (name, value) in zip(arrays, sorted(outputs.items())):
                if name in token_outputs:
                    padding = [[0, 0]] * value.shape.rank
                    padding[sequence_axis] = [0, length - tf.shape(value)[sequence_axis]]
                    value = tf.pad(value, padding)
                written.append(array.write(i, value))
            return i + 1, written

        num_groups = tf.size(starts)
        arrays = [
            tf.TensorArray(
                symbolic[name].dtype,
                size=num_groups,
                infer_shape=False,
                element_shape=tf.TensorShape(symbolic[name].shape),
            )
            for name in sorted(symbolic)
        ]
        _, arrays = tf.while_loop(
            lambda i, _: i < num_groups,
            run_group,
            (tf.constant(0), arrays),
            parallel_iterations=GROUPS_IN_FLIGHT,
        )
        restore = tf.math.invert_permutation(order)
        return {
            name: tf.gather(array.concat(), restore)
            for name, array in zip(sorted(symbolic), arrays)
        }

    # Lowered (tf.cond), so that each of its ops is placed on its own device: an unlowered If
    # runs its branch on its own device alone, and the model may run on a GPU.
    return tf.cond(tf.shape(mask)[0] > group_rows, in_groups, whole_batch)


def run_in_chunks(model, inputs, output_names, max_rows):
    """Runs `model` on [n, s] inputs at most `max_rows` rows at a time (bounded memory for any n)."""
    rows = tf.shape(inputs["input_word_ids"])[0]
    num_chunks = tf.maximum((rows + max_rows - 1) // max_rows, 1)
    chunk = (rows + num_chunks - 1) // num_chunks  # pads at most num_chunks - 1 rows
    padded_rows = num_chunks * chunk

    def split(x):
        x = tf.pad(x, [[0, padded_rows - rows], [0, 0]])
        return tf.reshape(x, [num_chunks, chunk, tf.shape(x)[1]])

    chunks = {name: split(value) for name, value in inputs.items()}
    outputs = tf.map_fn(
        lambda batch: model(batch, training=False),
        chunks,
        parallel_iterations=1,
        fn_output_signature={name: tf.TensorSpec(None, tf.float32) for name in output_names},
    )
    return {
        name: tf.reshape(value, tf.concat([[padded_rows], tf.shape(value)[2:]], 0))[:rows]
        for name, value in outputs.items()
    }


def past_trailing_marks(texts, end_bytes):
    """End byte offsets moved past the combining marks right after them.

    With do_lower_case the tokenizer drops accents, so in decomposed (NFD) text such as "Cafe\u0301"
    the last token ends before the accent; the span must keep it, as the original's answer does.
    """
    rest = tf.strings.substr(
        texts, end_bytes, tf.cast(tf.strings.length(texts), end_bytes.dtype) - end_bytes
    )
    marks = tf.strings.length(rest) - tf.strings.length(
        tf.strings.regex_replace(rest, "^\\p{M}+", "")
    )
    return end_bytes + tf.cast(marks, end_bytes.dtype)


def char_offsets(texts, start_bytes, end_bytes):
    """Byte offsets [start, end) into `texts` -> the same spans as character (code point) offsets."""
    start_chars = tf.strings.length(
        tf.strings.substr(texts, tf.zeros_like(start_bytes), start_bytes), unit="UTF8_CHAR"
    )
    span_chars = tf.strings.length(
        tf.strings.substr(texts, start_bytes, end_bytes - start_bytes), unit="UTF8_CHAR"
    )
    return start_chars, start_chars + span_chars
