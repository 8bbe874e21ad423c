"""Damaged record files under inspect_records and the playground's Records view: every good record is
shown, then the damage is named (file, record, byte), with a non-zero exit or a notice; never a
traceback.

The files are written by TensorFlow's own TFRecordWriter and then cut or patched by hand, so the
damage is what a real disk or a killed copy leaves.
"""

import struct

import google_crc32c
import pytest
import tensorflow as tf
from helpers import run_module_cli, write_tiny_vocab
from helpers_records import make_example

from bert_tf.playground import views

NUM_RECORDS = 10
CUT_RECORD = 6


def masked_crc(data):
    """The masked CRC-32C a TFRecord stores (tensorflow/core/lib/hash/crc32c.h's Mask)."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def example_bytes(index):
    """A record in Google's schema whose first token after [CLS] tells its index (w<index>)."""
    tokens = [2, 5 + index, 6, 3, 7, 8, 3]
    return make_example(
        tokens, [0, 0, 0, 0, 1, 1, 1], [2], [9], index % 2, 8, 2
    ).SerializeToString()


def write_records(path, count, options=None):
    """`count` records through TensorFlow's writer; returns each record's starting byte."""
    offsets, offset = [], 0
    with tf.io.TFRecordWriter(str(path), options) as writer:
        for index in range(count):
            data = example_bytes(index)
            writer.write(data)
            offsets.append(offset)
            offset += 12 + len(data) + 4
    return offsets


def run_cli(path, *flags):
    return run_module_cli("bert_tf.inspect_records", str(path), *flags)


def shown_records(stdout):
    """The indices of the records printed."""
    return [
        int(line.split(":")[0].split()[1])
        for line in stdout.splitlines()
        if line.startswith("record ")
    ]


@pytest.fixture
def cut_file(tmp_path):
    """A plain record file cut in the middle of record 6's data; (path, record 6's first byte)."""
    path = tmp_path / "cut.tfrecord"
    offsets = write_records(path, NUM_RECORDS)
    data = path.read_bytes()
    path.write_bytes(data[: offsets[CUT_RECORD] + 12 + 20])
    return path, offsets[CUT_RECORD]


def test_a_file_cut_inside_record_6_shows_the_good_records_then_names_the_damage(cut_file):
    path, offset = cut_file
    done = run_cli(path, "--limit=50")
    assert done.returncode == 2, done.stderr
    assert shown_records(done.stdout) == list(range(CUT_RECORD))
    assert "Traceback" not in done.stderr
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert str(path) in error and f"record {CUT_RECORD}" in error and f"byte {offset}" in error
    # The page that ends on the last good record is whole; the next page names the damage.
    done = run_cli(path, "--start=5", "--limit=1")
    assert done.returncode == 0, done.stderr
    assert shown_records(done.stdout) == [5] and "--start=6" in done.stdout
    for start in (CUT_RECORD, CUT_RECORD + 1):  # skipping past the damage does not hide it
        done = run_cli(path, f"--start={start}")
        assert done.returncode == 2 and f"record {CUT_RECORD}" in done.stderr, done.stderr
        assert f"byte {offset}" in done.stderr and "Traceback" not in done.stderr


def test_a_gzip_file_cut_short_names_the_record(tmp_path):
    path = tmp_path / "cut.tfrecord.gz"
    write_records(path, NUM_RECORDS, "GZIP")
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) - 60])  # the trailer and the last records' deflate data
    done = run_cli(path, "--limit=50")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    good = len(shown_records(done.stdout))
    assert 0 < good < NUM_RECORDS and shown_records(done.stdout) == list(range(good))
    assert f"{path}: record {good} (byte " in done.stderr and "cut short" in done.stderr


@pytest.mark.parametrize("length", [1 << 40, 1 << 63])
def test_a_length_field_beyond_the_file_with_a_valid_crc_is_named(tmp_path, length):
    path = tmp_path / "huge.tfrecord"
    write_records(path, 2)
    end = path.stat().st_size
    header = struct.pack("<Q", length)
    with open(path, "ab") as f:
        f.write(header + struct.pack("<I", masked_crc(header)) + b"x" * 40)
    for flags in (["--limit=50"], ["--start=3"]):
        done = run_cli(path, *flags)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and "Error" not in done.stderr
        assert str(path) in done.stderr and "record 2" in done.stderr
        assert f"byte {end}" in done.stderr and str(length) in done.stderr
    assert shown_records(run_cli(path, "--limit=50").stdout) == [0, 1]


def test_the_playground_records_view_shows_the_good_records_then_the_damage(cut_file, tmp_path):
    path, offset = cut_file
    vocab = write_tiny_vocab(tmp_path / "vocab.txt")
    playground = views.Playground(views.PlaygroundSettings(vocab_file=vocab))
    reply = playground.records({"path": str(path), "limit": 50})
    assert [x["index"] for x in reply["instances"]] == list(range(CUT_RECORD))
    assert reply["instances"][5]["tokens"][1] == "w5"
    assert f"record {CUT_RECORD}" in reply["damage"] and f"byte {offset}" in reply["damage"]
    assert any(reply["damage"] in notice for notice in reply["notices"])
    page = playground.records({"path": str(path), "start": 5, "limit": 1})
    assert [x["index"] for x in page["instances"]] == [5] and page["more"] and not page["damage"]
    with pytest.raises(views.ViewError, match=f"record {CUT_RECORD}.*byte {offset}"):
        playground.records({"path": str(path), "start": CUT_RECORD})
