"""tf.train.Example records of the pretraining schema (schema.py), encoded with NumPy; a small decoder.

Encoding: `ExampleSerializer` writes the protocol-buffer wire format directly, for a whole
InstanceBatch at once: every field of every record is laid out in a fixed-width byte matrix with a
mask of the bytes that exist (varints take 1-3 bytes), and `matrix[mask]` is the concatenation of
the records. The bytes are those tf.train.Example.SerializeToString() gives for the original's
features, in the original's order (the tests compare them).

Decoding: `parse_example` reads back enough protocol buffer to log the first records readably
(`example_to_text`), as the original logs its first instances. Neither side imports TensorFlow.
"""

import struct

import numpy as np

from bert_tf.pretraining_data import schema
from bert_tf.pretraining_data.instance_data import InstanceBatch

# ---------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------


def _varint_width(max_value):
    """Bytes of the longest protocol-buffer varint of values up to `max_value`."""
    width = 1
    while max_value >= 1 << (7 * width):
        width += 1
    return width


def _varints(values, width):
    """Varints of non-negative ints `values` [..]: (uint8 bytes [.., width], bool present [.., width]).

    Byte j holds bits 7j..7j+6, with the high bit set when another byte follows; byte j is present
    when the value has bits at or above 7j (byte 0 always).
    """
    shifted = np.asarray(values, np.int64)[..., None] >> (7 * np.arange(width))
    present = shifted > 0
    present[..., 0] = True
    follows = np.zeros_like(present)
    follows[..., :-1] = present[..., 1:]
    return ((shifted & 0x7F) | (follows.astype(np.int64) << 7)).astype(np.uint8), present


class ExampleSerializer:
    """Serializes InstanceBatches into tf.train.Example bytes of schema.FEATURES, padded to their lengths.

    The wire format is written directly: Example.features(1) -> Features.feature(1) map entries of
    key(1) and Feature(2); Feature.float_list(2) / int64_list(3); the lists pack their values(1).
    Each field of every record is a block of columns of a byte matrix, with a mask of the bytes
    that exist; the records are the masked bytes, row by row.
    """

    _INT64_LIST, _FLOAT_LIST = 0x1A, 0x12

    def __init__(self, vocab_size, max_seq_length, max_predictions_per_seq):
        self.vocab_size = vocab_size
        self.max_seq_length = max_seq_length
        self.max_predictions_per_seq = max_predictions_per_seq
        # Varints looked up rather than computed: of every id and position, and of every length a
        # part of a record can have (ids take at most 10 bytes each).
        self._id_table = self._word_table(vocab_size)
        self._position_table = self._word_table(max_seq_length)
        self._length_table = self._word_table(
            10 * (3 * max_seq_length + 3 * max_predictions_per_seq) + 1024
        )

    def serialize(self, instance):
        """The tf.train.Example bytes of one TrainingInstance."""
        batch = InstanceBatch.from_instances(
            [instance], self.max_seq_length, self.max_predictions_per_seq
        )
        blob, _ = self.serialize_batch(batch)
        return blob

    def serialize_batch(self, batch):
        """Returns (the records of `batch`, concatenated, as bytes; int64 [n] record lengths)."""
        n = len(batch)
        seq, predictions = self.max_seq_length, self.max_predictions_per_seq
        position = np.arange(seq)[None, :]
        chosen = np.arange(predictions)[None, :] < batch.num_masked[:, None]

        def varints(values, table):
            if int(values.max(initial=0)) >= len(table[0]):  # ids beyond the vocabulary: hand-made
                table = self._word_table(int(values.max()) + 1)
            return ("varints", values, table), np.take(table[3], values).sum(axis=1)

        def fixed(values):
            data = np.ascontiguousarray(values).view(np.uint8).reshape(n, -1)
            return ("bytes", data, None), np.full(n, data.shape[1])

        # Each feature's values, padded to the schema's lengths (the batch's arrays already are).
        payloads = {
            "input_ids": varints(batch.input_ids, self._id_table),
            "input_mask": fixed((position < batch.lengths[:, None]).astype(np.uint8)),
            "segment_ids": fixed(
                (
                    (position >= batch.a_lengths[:, None]) & (position < batch.lengths[:, None])
                ).astype(np.uint8)
            ),
            "masked_lm_positions": varints(batch.masked_positions, self._position_table),
            "masked_lm_ids": varints(batch.masked_ids, self._id_table),
            "masked_lm_weights": fixed(np.where(chosen, 1.0, 0.0).astype("<f4")),
            "next_sentence_labels": fixed(batch.is_random_next.astype(np.uint8)[:, None]),
        }
        # The record as a list of pieces, each a run of columns of one byte matrix; then the bytes.
        pieces = []
        features_length = np.zeros(n, np.int64)
        for feature in schema.FEATURES:
            list_tag = self._FLOAT_LIST if feature.dtype == "float32" else self._INT64_LIST
            features_length += self._entry_pieces(
                pieces, feature.name, list_tag, *payloads[feature.name]
            )
        pieces[:0] = [("bytes", b"\x0a", None), self._length(features_length)]
        return self._assemble(n, pieces)

    def _assemble(self, n, pieces):
        """Lays the pieces out in a byte matrix with a mask of the bytes that exist; returns the
        masked bytes row by row (the records, concatenated) and each row's count."""
        widths = []
        for kind, values, table in pieces:
            if kind == "varints":
                widths.append(values[0].size * table[0].itemsize if values.ndim > 1 else table[2])
            else:
                widths.append(len(values) if isinstance(values, bytes) else values.shape[1])
        data = np.empty((n, sum(widths)), np.uint8)
        present = np.ones((n, sum(widths)), bool)
        column = 0
        for (kind, values, table), width in zip(pieces, widths):
            columns = slice(column, column + width)
            column += width
            if kind == "bytes":
                data[:, columns] = (
                    np.frombuffer(values, np.uint8) if isinstance(values, bytes) else values
                )
                continue
            words, flags = np.take(table[0], values), np.take(table[1], values)
            # Payloads copy whole words (contiguous, fast; the unused bytes are masked out), a
            # length only its varint's bytes.
            word_width = words.itemsize if values.ndim > 1 else table[2]
            shape = (n, -1, word_width)
            # Column slices of the matrices, viewed as [n, values, width]: filled in place.
            data[:, columns].reshape(shape)[...] = words.view(np.uint8).reshape(
                n, -1, words.itemsize
            )[..., :word_width]
            present[:, columns].reshape(shape)[...] = flags.view(bool).reshape(
                n, -1, flags.itemsize
            )[..., :word_width]
        return data[present].tobytes(), present.sum(axis=1)

    @staticmethod
    def _word_table(size):
        """Varints of 0..size-1, each packed in one machine word, so that a lookup is a 1-D
        `np.take` (much faster than gathering rows of a byte matrix): (bytes, presence bytes,
        width, byte counts)."""
        width = _varint_width(max(size - 1, 0))
        word = np.dtype(np.uint8 if width == 1 else np.uint32 if width <= 4 else np.uint64)
        word = word.newbyteorder("<")
        data = np.zeros((size, word.itemsize), np.uint8)
        present = np.zeros((size, word.itemsize), bool)
        data[:, :width], present[:, :width] = _varints(np.arange(size), width)
        return (
            data.view(word).ravel(),
            present.view(np.uint8).view(word).ravel(),
            width,
            present.sum(axis=1),
        )

    def _length(self, values):
        """The piece holding the varint of a per-record length."""
        return "varints", values, self._length_table

    def _entry_pieces(self, pieces, name, list_tag, payload, payload_length):
        """Appends the pieces of one Features.feature map entry; returns each record's entry bytes.

        The entry: tag 0x0a, length, key (tag 0x0a, length, name), tag 0x12, Feature length,
        list tag, list length, tag 0x0a (packed values), values length, values.
        """
        key = b"\x0a" + bytes([len(name)]) + name.encode()
        varint_bytes = self._length_table[3].__getitem__
        list_length = 1 + varint_bytes(payload_length) + payload_length
        feature_length = 1 + varint_bytes(list_length) + list_length
        entry_length = len(key) + 1 + varint_bytes(feature_length) + feature_length
        pieces += [
            ("bytes", b"\x0a", None),
            self._length(entry_length),
            ("bytes", key + b"\x12", None),
            self._length(feature_length),
            ("bytes", bytes([list_tag]), None),
            self._length(list_length),
            ("bytes", b"\x0a", None),
            self._length(payload_length),
            payload,
        ]
        return 1 + varint_bytes(entry_length) + entry_length


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------


def _varint(data, position):
    """Decodes the protobuf varint at `position`; returns (value, next position)."""
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7


def _fields(data):
    """Yields (field number, wire type, value) of a protobuf message: ints for varints, bytes else."""
    position = 0
    while position < len(data):
        key, position = _varint(data, position)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, position = _varint(data, position)
        elif wire_type == 2:
            length, position = _varint(data, position)
            value, position = data[position : position + length], position + length
        elif wire_type in (1, 5):
            size = 8 if wire_type == 1 else 4
            value, position = data[position : position + size], position + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire_type}")
        yield number, wire_type, value


def parse_example(record):
    """Decodes a serialized tf.train.Example of int64 and float lists into {name: list of numbers}.

    Enough protobuf for logging records without TensorFlow: Example.features (1) -> Features.feature
    (1, map entries of key 1, value 2) -> Feature.float_list (2) or int64_list (3) -> value (1), packed
    or not. int64 values are read as unsigned varints, which is right for the non-negative ids here.
    """
    values = {}
    for _, _, features in _fields(record):
        for _, _, entry in _fields(features):
            fields = {number: value for number, _, value in _fields(entry)}
            name, numbers = fields[1].decode("utf-8"), []
            for kind, _, number_list in _fields(fields.get(2, b"")):
                for _, wire_type, value in _fields(number_list):
                    if kind == 2:  # float_list: packed little-endian floats, or one fixed32
                        numbers += struct.unpack(f"<{len(value) // 4}f", value)
                    elif wire_type == 2:  # packed int64 varints
                        position = 0
                        while position < len(value):
                            number, position = _varint(value, position)
                            numbers.append(number)
                    else:
                        numbers.append(value)
            values[name] = numbers
    return values


def example_to_text(example, tokens):
    """Readable lines for a log, as the original prints its first instances.

    `example` maps feature names to value lists (a parsed record); `tokens` is the vocabulary.
    """
    length = sum(example["input_mask"])
    num_masked = int(sum(example["masked_lm_weights"]))
    input_ids = [int(i) for i in example["input_ids"][:length]]
    positions = [int(p) for p in example["masked_lm_positions"][:num_masked]]
    labels = [int(i) for i in example["masked_lm_ids"][:num_masked]]
    return [
        "tokens: " + " ".join(tokens[i] for i in input_ids),
        "segment_ids: " + " ".join(str(int(s)) for s in example["segment_ids"][:length]),
        f"is_random_next: {bool(example['next_sentence_labels'][0])}",
        "masked_lm_positions: " + " ".join(map(str, positions)),
        "masked_lm_labels: " + " ".join(tokens[i] for i in labels),
    ]
