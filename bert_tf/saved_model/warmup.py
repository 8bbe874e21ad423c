"""TF Serving's SavedModel warm-up: requests an export carries, replayed by a server before it serves.

TF Serving reads `VERSION/assets.extra/tf_serving_warmup_requests`, a TFRecord file of
`tensorflow.serving.PredictionLog` protos (at most 1,000), and runs each request once while the
version loads, so the first real requests pay no graph instantiation, tracing or allocation. A
request that fails fails the load. `bert_tf.export` writes a batch-1 predict request for every
multiple of LENGTH_BUCKET up to max_seq_length: the lengths an XLA export pads to and compiles.
A graph export, which runs each batch at its exact length, also gets one for every length from
EXACT_LENGTHS_UP_TO down to 3. An XLA export also gets one request of LENGTH_GROUP_ROWS + 1 rows
per length, which compiles a full group and a group of 1 (other group sizes compile on first
use). `bert_tf.serve` replays the file as TF Serving does: predict, classify, regress and
multi-inference logs.
"""

import itertools
import os
import typing

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

from bert_tf.runtime import io_utils
from bert_tf.tasks.packing import LENGTH_BUCKET

ASSETS_EXTRA = "assets.extra"
REQUESTS_FILE = "tf_serving_warmup_requests"
# TF Serving refuses a warm-up file with more records than this (WarmupConsts::kMaxNumRecords).
MAX_RECORDS = 1000


def requests_path(version_dir):
    """VERSION_DIR/assets.extra/tf_serving_warmup_requests."""
    return os.path.join(version_dir, ASSETS_EXTRA, REQUESTS_FILE)


def filler_word(vocab_file):
    """A vocabulary entry that is one whole word, so that N of them make N tokens, cased or not.

    A plain lower-case word where the vocabulary has one; else any ASCII letters and digits that
    lower-casing leaves as they are (a converted checkpoint's vocabulary may hold no plain word).
    """
    with tf.io.gfile.GFile(vocab_file) as f:
        words = [line.strip() for line in f]
    candidates = [w for w in words if w.isascii() and w.isalnum() and w == w.lower()]
    plain = [w for w in candidates if w.isalpha()]
    if plain or candidates:
        return (plain or candidates)[0]
    raise io_utils.UsageError(
        f"{vocab_file} has no whole word (ASCII letters or digits) to build warm-up inputs"
    )


# A graph export is also warmed at every length up to this many tokens, the shortest last.
# oneDNN builds its kernels for each new shape on first use, and most requests are short: warmed
# this way, a MiniLM export's first calls at new lengths run about as fast as repeats
# (benchmarks/RESULTS.md, "Inference: what each export choice buys"). The cap bounds the load time
# and the file.
EXACT_LENGTHS_UP_TO = 64


def request_lengths(seq_length, dynamic_length, exact_lengths=False):
    """The warm-up lengths: seq_length alone without dynamic_length; else every LENGTH_BUCKET
    multiple and seq_length, then with `exact_lengths` every length from EXACT_LENGTHS_UP_TO
    (or seq_length) down to 3."""
    if not dynamic_length:
        return [seq_length]
    lengths = list(range(LENGTH_BUCKET, seq_length, LENGTH_BUCKET)) + [seq_length]
    if exact_lengths:
        lengths += range(min(seq_length, EXACT_LENGTHS_UP_TO), 2, -1)
    return lengths


def signature_inputs(input_specs, length, word, ids, mask_token=None):
    """One batch-1 input for every spec of a signature, about `length` tokens once packed.

    Strings [b] get words: one word each, and the last text input the rest of the token budget
    ([CLS] and [SEP]s take 3), so that consecutive lengths pack to consecutive lengths, its last
    word `mask_token` where one is given (fill-mask's [MASK]); strings [b, n] two such texts; int32
    [b, s] the encoder's ids, mask and type ids. Scalar inputs are left out: their signature
    defaults fill them in.
    """
    input_specs = {name: spec for name, spec in input_specs.items() if spec.shape.rank}
    texts = [name for name, spec in input_specs.items() if spec.dtype == tf.string]
    last_words = max(1, length - 3 - (len(texts) - 1))
    inputs = {}
    for name, spec in input_specs.items():
        if spec.dtype == tf.string:
            words = [word] * (last_words if name == texts[-1] else 1)
            if mask_token and name == texts[-1]:
                words[-1] = mask_token
            text = " ".join(words)
            inputs[name] = np.array([[text, text]] if spec.shape.rank == 2 else [text], object)
        elif name == "input_word_ids":
            inputs[name] = np.array([[ids["[CLS]"]] + [ids[word]] * (length - 2) + [ids["[SEP]"]]])
        elif name == "input_mask":
            inputs[name] = np.ones([1, length], spec.dtype.as_numpy_dtype)
        else:
            inputs[name] = np.zeros([1, length], spec.dtype.as_numpy_dtype)
    return {
        name: value.astype(input_specs[name].dtype.as_numpy_dtype) for name, value in inputs.items()
    }


def predict_logs(
    signature_name, input_specs, lengths, vocab_file, batch_sizes=(1,), mask_token=None
):
    """A serialized PredictionLog per batch size and length for one signature (the batch-1 ones
    first), its inputs from `signature_inputs`."""
    word = filler_word(vocab_file)
    with tf.io.gfile.GFile(vocab_file) as f:
        ids = {line.rstrip("\n"): i for i, line in enumerate(f)}
    records = []
    for batch_size, length in itertools.product(batch_sizes, lengths):
        request = predict_pb2.PredictRequest()
        request.model_spec.signature_name = signature_name
        inputs = signature_inputs(input_specs, length, word, ids, mask_token)
        for name, value in inputs.items():
            request.inputs[name].CopyFrom(tf.make_tensor_proto(np.repeat(value, batch_size, 0)))
        log = prediction_log_pb2.PredictionLog()
        log.predict_log.request.CopyFrom(request)
        records.append(log.SerializeToString())
    return records


def write_records(version_dir, records):
    """Writes serialized PredictionLogs as VERSION_DIR's warm-up file, at most MAX_RECORDS of them
    (the first); returns the count."""
    records = records[:MAX_RECORDS]
    path = requests_path(version_dir)
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    return len(records)


class Request(typing.NamedTuple):
    """One warm-up request, by the PredictionLog's log type (`kind`).

    predict_log: `signature_name` and `inputs` {name: ndarray}; classify_log and regress_log:
    `signature_name` and `examples` (serialized tf.Examples); multi_inference_log: `tasks` (its
    InferenceTask protos) and `examples`.
    """

    kind: str
    signature_name: str = ""
    inputs: typing.Optional[dict] = None
    examples: typing.Optional[list] = None
    tasks: tuple = ()
    record: int = 0  # its record's number in the file, from 1 (empty logs count too)


def input_examples(input_proto):
    """The serialized tf.Examples of a tensorflow.serving Input proto ([] when it has none).

    Concatenated serialized protos parse as one merged message, so context + example bytes give
    each example the context's features, the example's own winning on a shared name.
    """
    kind = input_proto.WhichOneof("kind")
    if kind == "example_list":
        return [e.SerializeToString() for e in input_proto.example_list.examples]
    if kind == "example_list_with_context":
        listed = input_proto.example_list_with_context
        context = listed.context.SerializeToString()
        return [context + e.SerializeToString() for e in listed.examples]
    return []


def _log_request(log):
    """The Request of one PredictionLog; None for a log with nothing in it (TF Serving skips it)."""
    kind = log.WhichOneof("log_type")
    if kind is None:
        return None
    if kind == "predict_log":
        request = log.predict_log.request
        inputs = {name: tf.make_ndarray(proto) for name, proto in request.inputs.items()}
        return Request(kind, request.model_spec.signature_name, inputs=inputs)
    if kind in ("classify_log", "regress_log"):
        request = getattr(log, kind).request
        examples = input_examples(request.input)
        return Request(kind, request.model_spec.signature_name, examples=examples)
    if kind == "multi_inference_log":
        request = log.multi_inference_log.request
        return Request(kind, examples=input_examples(request.input), tasks=tuple(request.tasks))
    # TF Serving's saved_model_warmup.cc answers Unimplemented for the others (session_run,
    # predict_streamed), which fails the load.
    raise ValueError(f"unsupported log_type for warm-up: {kind}")


def read_requests(version_dir):
    """The Requests of VERSION_DIR's warm-up file, one per record: predict, classify, regress and
    multi-inference logs, the ones TF Serving replays (a log with nothing set is skipped, as there).
    No file gives []. A record that is not a PredictionLog, a log TF Serving cannot replay (session_run,
    predict_streamed) and more than MAX_RECORDS records are ValueErrors naming the file and
    record, as TF Serving then fails the load.
    """
    path = requests_path(version_dir)
    if not tf.io.gfile.exists(path):
        return []
    requests = []
    for number, record in enumerate(tf.data.TFRecordDataset(path).as_numpy_iterator(), 1):
        if number > MAX_RECORDS:
            raise ValueError(f"{path}: more than {MAX_RECORDS} warm-up records")
        log = prediction_log_pb2.PredictionLog()
        try:
            log.ParseFromString(record)
        except Exception as e:  # protobuf's DecodeError, whose module differs between versions
            raise ValueError(f"{path}: record {number} is not a PredictionLog ({e})") from None
        try:
            request = _log_request(log)
        except ValueError as e:
            raise ValueError(f"{path}: record {number}: {e}") from None
        if request is not None:
            requests.append(request._replace(record=number))
    return requests
