"""Pretraining records decoded back to text: what `inspect_records` prints and the playground shows.

A record of the original schema (schema.py) holds the *corrupted* input: the ids after masking,
the masked positions and the original ids there (the labels), the weights, the NSP label. Decoding
puts the two back side by side: each segment as text, and every masked position as what the model
sees there ([MASK], a random token or the token kept) beside the original token. It works on
records written here and on Google's (the same features), plain or gzip (told by the file's first
bytes, not its name), and checks each record's CRC as TensorFlow's reader does. A damaged record
(a CRC that does not match, a length no record can have, a file cut short) ends what is read: the
good records before it are shown, then the damage is named by file, record and byte.

A random replacement that happened to draw the original token reads as "kept", and one that drew
[MASK] as "[MASK]": the record does not say which rule fired, only what the model sees.
No TensorFlow here: the CLI starts in a fraction of a second.
"""

import dataclasses
import gzip
import struct
import zlib

from bert_tf.pretraining_data import example_codec, files, schema, tfrecord
from bert_tf.runtime import io_utils

MASK_TOKEN, CLS_TOKEN, SEP_TOKEN = "[MASK]", "[CLS]", "[SEP]"
_GZIP_MAGIC = b"\x1f\x8b"
# What the model sees at a masked position, as the 80/10/10 rule leaves it; REPLACED when no
# vocabulary says which id is [MASK].
AS_MASK, RANDOM, KEPT, REPLACED = "[MASK]", "random", "kept", "replaced"


class RecordError(io_utils.UsageError):
    """A file that is not a pretraining record file, or is damaged; the message names the record."""


# No record can be longer: protobuf refuses to parse a message of 2 GiB or more (a tf.train.Example
# is one), so a larger length field is damage, read without allocating for it.
MAX_RECORD_BYTES = (1 << 31) - 1
# Records are read (and skipped, inside gzip) in pieces of at most this many bytes, so that a
# damaged length field costs no more memory than the bytes really there.
_READ_BYTES = 1 << 20


class _RecordStream:
    """The records of one open TFRecord file, in order, each checked as TensorFlow's reader checks
    it; a RecordError names the damaged record, its index and the byte it starts at."""

    def __init__(self, path, raw):
        self.path = path
        self.is_gzip = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
        if self.is_gzip:
            self.stream, self.size = gzip.GzipFile(fileobj=raw, mode="rb"), None
        else:
            self.stream, self.size = raw, raw.seek(0, 2)
            raw.seek(0)
        self.index = 0
        self.offset = 0  # where record `index` starts (in the decompressed stream, for gzip)

    def position(self):
        """Where record `index` starts, as the messages say it."""
        return f"byte {self.offset}" + (" of the decompressed stream" if self.is_gzip else "")

    def where(self):
        """Record `index` and where it starts, as the messages say them."""
        return f"record {self.index} ({self.position()})"

    def damaged(self, what):
        return RecordError(f"{self.path}: {self.where()} {what}")

    def more(self):
        """Whether any byte follows the records read so far."""
        if not self.is_gzip:
            return self.offset < self.size
        try:
            return bool(self.stream.peek(1))
        except (EOFError, gzip.BadGzipFile, zlib.error):
            return True  # damage follows, which reading on names

    def _read(self, count):
        """Up to `count` bytes, fewer only at the end of the file; read in pieces."""
        pieces = []
        try:
            while count > 0:
                piece = self.stream.read(min(count, _READ_BYTES))
                if not piece:
                    break
                pieces.append(piece)
                count -= len(piece)
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise self.damaged(f"is in a gzip stream that is damaged or cut short ({e})") from None
        return b"".join(pieces)

    def _header(self):
        """The length the next record's header gives, checked; None at the end of the file."""
        header = self._read(12)
        if not header:
            return None
        if len(header) < 12:
            raise self.damaged("is cut short inside its header: the file ends there")
        (length,) = struct.unpack("<Q", header[:8])
        if struct.unpack("<I", header[8:])[0] != tfrecord.masked_crc32c(header[:8]):
            raise self.damaged(
                "has a length that does not match its CRC: not a TFRecord file, or a damaged one"
            )
        if length > MAX_RECORD_BYTES:
            raise self.damaged(
                f"says it holds {length} bytes, more than any record can (2 GiB): the file is "
                "damaged"
            )
        if self.size is not None and self.offset + 12 + length + 4 > self.size:
            raise self.damaged(f"says it holds {length} bytes, but the file ends inside it")
        return length

    def _advance(self, length):
        self.index += 1
        self.offset += 12 + length + 4

    def read(self):
        """The data of the next record, its CRCs checked; None at the end of the file."""
        length = self._header()
        if length is None:
            return None
        data, crc = self._read(length), self._read(4)
        if len(data) < length or len(crc) < 4:
            raise self.damaged(f"says it holds {length} bytes, but the file ends inside it")
        if struct.unpack("<I", crc)[0] != tfrecord.masked_crc32c(data):
            raise self.damaged("has data that does not match its CRC")
        self._advance(length)
        return data

    def skip(self):
        """Moves past the next record, its header checked and its data unread (plain files seek);
        False at the end of the file."""
        length = self._header()
        if length is None:
            return False
        if self.is_gzip:
            if len(self._read(length + 4)) < length + 4:
                raise self.damaged(f"says it holds {length} bytes, but the file ends inside it")
        else:
            self.stream.seek(length + 4, 1)
        self._advance(length)
        return True


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


@dataclasses.dataclass
class RecordPage:
    """A page of a record file: its good records, whether more follow, and the damage that ended
    it early (None when the page is whole)."""

    instances: list  # DecodedInstances, in file order
    more: bool  # a record (good or not) follows the page
    damage: RecordError = None


def read_instances(path, tokens, start=0, limit=10):
    """A RecordPage of up to `limit` DecodedInstances from record `start` on.

    Plain or gzip (told by the magic bytes). Records before `start` are skipped unread (plain files
    seek past them), their headers checked. A damaged record (a CRC that does not match, a length
    no record can have, a file that ends inside it, bytes that are no tf.train.Example of the
    schema) ends the page: the records before it are kept, and the RecordError that names it (file,
    record, byte) is the page's `damage`. Only the page is read: whether more follow is told by the
    bytes after it, so damage beyond the page never hides the page.
    """
    instances = []
    with files.open_read(path) as raw:
        records = _RecordStream(path, raw)
        try:
            while records.index < start:
                if not records.skip():
                    return RecordPage(instances, False)
            while len(instances) < limit:
                index, where, position = records.index, records.where(), records.position()
                data = records.read()
                if data is None:
                    return RecordPage(instances, False)
                try:
                    values = example_codec.parse_example(data)
                except (ValueError, IndexError, KeyError, UnicodeDecodeError, struct.error) as e:
                    raise RecordError(f"{path}: {where} is not a tf.train.Example ({e})") from None
                try:
                    instances.append(decode_example(values, tokens, index))
                except RecordError as e:
                    raise RecordError(f"{path}: {e} ({position})") from None
        except RecordError as damage:
            return RecordPage(instances, False, damage)
        return RecordPage(instances, records.more())


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
