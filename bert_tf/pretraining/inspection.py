"""Pretraining records decoded back to text: what `inspect_records` prints and the playground shows.

A record of the original schema (schema.py) holds the *corrupted* input: the ids after masking,
the masked positions and the original ids there (the labels), the weights, the NSP label. Decoding
puts the two back side by side: each segment as text, and every masked position as what the model
sees there ([MASK], a random token or the token kept) beside the original token. It works on
records written here and on Google's (the same features), plain or gzip (told by the file's first
bytes, not its name), and checks each record's CRC as TensorFlow's reader does.

A random replacement that happened to draw the original token reads as "kept", and one that drew
[MASK] as "[MASK]": the record does not say which rule fired, only what the model sees.
No TensorFlow here: the CLI starts in a fraction of a second.
"""

import dataclasses
import gzip
import struct

from bert_tf import io_utils
from bert_tf.pretraining import example_codec, files, schema, tfrecord

MASK_TOKEN, CLS_TOKEN, SEP_TOKEN = "[MASK]", "[CLS]", "[SEP]"
_GZIP_MAGIC = b"\x1f\x8b"
# What the model sees at a masked position, as the 80/10/10 rule leaves it; REPLACED when no
# vocabulary says which id is [MASK].
AS_MASK, RANDOM, KEPT, REPLACED = "[MASK]", "random", "kept", "replaced"
# A pretraining record is kilobytes; a length field past this is damage, not data.
MAX_RECORD_BYTES = 1 << 30
_READ_PIECE_BYTES = 1 << 20


class RecordError(io_utils.UsageError):
    """A file that is not a pretraining record file, or is damaged; the message names the record."""


def iter_records(path, start=0):
    """Yields (index, bytes) of the records of a TFRecord file from record `start` on.

    Plain or gzip (seen from the magic bytes). Records before `start` are skipped without being
    read (plain files seek past them). A length or data CRC that does not match, a length the file
    cannot hold (or past MAX_RECORD_BYTES), or a file that ends inside a record, is a RecordError
    naming the record.
    """
    with files.open_read(path) as raw:
        is_gzip = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
        size = None if is_gzip else raw.seek(0, 2)
        raw.seek(0)
        stream = gzip.GzipFile(fileobj=raw, mode="rb") if is_gzip else raw
        index = 0
        while True:
            header = stream.read(12)
            if not header:
                return
            if len(header) < 12:
                raise RecordError(f"{path}: the file ends inside the header of record {index}")
            (length,) = struct.unpack("<Q", header[:8])
            if struct.unpack("<I", header[8:])[0] != tfrecord.masked_crc32c(header[:8]):
                raise RecordError(
                    f"{path}: record {index}'s length does not match its CRC: not a TFRecord "
                    "file, or a damaged one"
                )
            left = None if size is None else size - stream.tell()
            if length > MAX_RECORD_BYTES or (left is not None and length + 4 > left):
                raise RecordError(
                    f"{path}: record {index}'s length field says {length:,} bytes, "
                    + (
                        f"but only {left:,} bytes follow it"
                        if left is not None and left < MAX_RECORD_BYTES
                        else f"more than any record this reads ({MAX_RECORD_BYTES:,})"
                    )
                    + ": a damaged file"
                )
            if index < start:
                if is_gzip:
                    _read_at_most(stream, length + 4)
                else:
                    stream.seek(length + 4, 1)
                index += 1
                continue
            data = _read_at_most(stream, length)
            crc = stream.read(4)
            if len(data) < length or len(crc) < 4:
                raise RecordError(f"{path}: the file ends inside record {index}")
            if struct.unpack("<I", crc)[0] != tfrecord.masked_crc32c(data):
                raise RecordError(f"{path}: record {index}'s data does not match its CRC")
            yield index, data
            index += 1


def _read_at_most(stream, length):
    """Up to `length` bytes, read a piece at a time: a read(length) asks for all of it at once,
    however little the stream holds."""
    pieces = []
    while length > 0:
        piece = stream.read(min(length, _READ_PIECE_BYTES))
        if not piece:
            break
        pieces.append(piece)
        length -= len(piece)
    return b"".join(pieces)


@dataclasses.dataclass
class MaskedPosition:
    """One masked position: where, what the model sees there, the original token, and which rule."""

    position: int
    shown: str  # the token in the record's input_ids
    original: str  # the label (masked_lm_ids)
    kind: str  # AS_MASK, RANDOM, KEPT (or REPLACED, without a vocabulary)


@dataclasses.dataclass
class DecodedInstance:
    """One record as text: tokens as the model sees them, segments, NSP label, masked positions."""

    index: int
    tokens: list  # the input tokens (after masking), [CLS] ... [SEP] ... [SEP]
    token_ids: list
    segment_ids: list
    original_tokens: list  # the input with every masked position's original token put back
    is_random_next: bool  # next_sentence_labels: 1, B is a random next ("NotNext")
    masked: list  # MaskedPosition, by position
    text_a: str  # segment A as text, original tokens
    text_b: str
    max_seq_length: int  # the record's lengths, which the file does not store elsewhere
    max_predictions_per_seq: int

    @property
    def label(self):
        """The NSP label in words."""
        return "NotNext" if self.is_random_next else "IsNext"


def detokenize(tokens):
    """WordPiece tokens as text: `##` pieces joined to the word before them, [CLS]/[SEP] dropped."""
    words = []
    for token in tokens:
        if token in (CLS_TOKEN, SEP_TOKEN):
            continue
        if token.startswith("##") and words:
            words[-1] += token[2:]
        else:
            words.append(token)
    return " ".join(words)


def decode_example(values, tokens, index=0):
    """A DecodedInstance from a parsed record ({feature: values}); `tokens` is the vocabulary in id
    order (ids beyond it read as `<id N>`). A record lacking a feature of the schema is a
    RecordError (a fine-tuning record file opened by mistake, say)."""
    missing = [name for name in schema.FEATURE_NAMES if not values.get(name)]
    if missing:
        raise RecordError(
            f"record {index} has no {', '.join(missing)}: not a create_pretraining_data record "
            f"(it has {', '.join(sorted(values)) or 'no features'})"
        )

    def token(i):
        return tokens[i] if 0 <= i < len(tokens) else f"<id {i}>"

    length = int(sum(values["input_mask"]))
    ids = [int(i) for i in values["input_ids"][:length]]
    segments = [int(s) for s in values["segment_ids"][:length]]
    count = sum(1 for w in values["masked_lm_weights"] if w > 0)
    positions = [int(p) for p in values["masked_lm_positions"][:count]]
    labels = [int(i) for i in values["masked_lm_ids"][:count]]
    shown = [token(i) for i in ids]
    original = list(shown)
    knows_mask = MASK_TOKEN in tokens
    masked = []
    for position, label in sorted(zip(positions, labels)):
        if not 0 <= position < length:
            raise RecordError(f"record {index}: masked position {position} is outside its input")
        seen = ids[position]
        if seen == label:
            kind = KEPT
        elif not knows_mask:
            kind = REPLACED
        else:
            kind = AS_MASK if shown[position] == MASK_TOKEN else RANDOM
        masked.append(MaskedPosition(position, shown[position], token(label), kind))
        original[position] = token(label)
    return DecodedInstance(
        index=index,
        tokens=shown,
        token_ids=ids,
        segment_ids=segments,
        original_tokens=original,
        is_random_next=bool(values["next_sentence_labels"][0]),
        masked=masked,
        text_a=detokenize(t for t, s in zip(original, segments) if s == 0),
        text_b=detokenize(t for t, s in zip(original, segments) if s == 1),
        max_seq_length=len(values["input_ids"]),
        max_predictions_per_seq=len(values["masked_lm_positions"]),
    )


def read_instances(path, tokens, start=0, limit=10):
    """(up to `limit` DecodedInstances from record `start` on, whether more records follow)."""
    instances = []
    for index, data in iter_records(path, start):
        if len(instances) == limit:
            return instances, True
        try:
            values = example_codec.parse_example(data)
            instances.append(decode_example(values, tokens, index))
        except (ValueError, IndexError, KeyError, UnicodeDecodeError, struct.error) as e:
            raise RecordError(f"{path}: record {index} is not a tf.train.Example ({e})") from None
    return instances, False


def instance_lines(instance):
    """Readable lines for one DecodedInstance (the CLI's output)."""
    lines = [
        f"record {instance.index}: {instance.label} "
        f"(next_sentence_labels={int(instance.is_random_next)}), {len(instance.tokens)} tokens, "
        f"{len(instance.masked)} masked",
        f"  A: {instance.text_a}",
        f"  B: {instance.text_b}",
        "  input: " + " ".join(instance.tokens),
    ]
    for m in instance.masked:
        lines.append(f"    {m.position:>4}  {m.kind:<8} {m.shown!r:<16} original {m.original!r}")
    return lines
