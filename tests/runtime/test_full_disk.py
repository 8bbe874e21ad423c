"""A full disk under the jobs: a real tmpfs, mounted small, fills up under run_pretraining's
checkpoint save and under create_pretraining_data. Each job exits 1 naming the file it could not
write, leaves nothing half-written, and a rerun once there is space finishes the work."""

import errno
import glob
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf
from helpers import ROOT, tiny_config
from helpers_records import write_real_text_records

from bert_tf.runtime import distribution, io_utils

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

ENV = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
SEQ, PRED = 32, 5


def resize(disk, size):
    subprocess.run(["mount", "-o", f"remount,size={size}", str(disk)], check=True)


def fill(path):
    """Writes zeros to `path` until the disk is full (what a save killed midway can leave)."""
    with open(path, "wb", buffering=0) as f:  # unbuffered: nothing is left to fail at close
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    # The last block may have half-landed: leave a few KB free, no more.
    with open(path, "r+b") as f:
        f.truncate(max(0, os.path.getsize(path) - 8192))


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    directory = tmp_path_factory.mktemp("records")
    _, vocab_file = write_real_text_records(str(directory), SEQ, PRED, num_files=2)
    config_file = str(directory / "bert_config.json")
    tiny_config(vocab_file).to_json_file(config_file)  # its checkpoints are 5.3 MB
    return directory


def run_job(module, *flags):
    """`python -m bert_tf.<module> flags...` to its end: the CompletedProcess, output captured."""
    return subprocess.run(
        [sys.executable, "-m", f"bert_tf.{module}", *flags],
        env=ENV,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def pretrain(records, output_dir, steps):
    return run_job(
        "run_pretraining",
        f"--input_file={records}/records-*.tfrecord",
        f"--output_dir={output_dir}",
        f"--vocab_file={records}/vocab.txt",
        f"--bert_config_file={records}/bert_config.json",
        "--do_train",
        "--train_batch_size=8",
        f"--max_seq_length={SEQ}",
        f"--max_predictions_per_seq={PRED}",
        f"--num_train_steps={steps}",
        "--steps_per_loop=1",
        "--save_checkpoints_steps=2",
    )


def test_a_checkpoint_save_on_a_full_disk_names_the_file_and_leaves_no_part_of_it(
    records, small_disk
):
    disk = small_disk("1m")
    output_dir = disk / "out"
    failed = pretrain(records, output_dir, steps=4)
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert (
        f"error: the checkpoint of step 2 was not saved, no space left on device writing "
        f"{output_dir}/ckpt-2_temp/part-00000-of-00001.data-00000-of-00001: free some space and "
        "rerun, which resumes from the start"
    ) in failed.stdout
    assert "Traceback" not in failed.stderr
    assert not glob.glob(f"{output_dir}/ckpt-*"), os.listdir(output_dir)
    resize(disk, "16m")
    rerun = pretrain(records, output_dir, steps=4)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert tf.train.latest_checkpoint(str(output_dir)) == f"{output_dir}/ckpt-4"


def test_a_rerun_removes_what_a_killed_save_left_before_it_writes_anything(records, small_disk):
    disk = small_disk("16m")
    output_dir = disk / "out"
    assert pretrain(records, output_dir, steps=2).returncode == 0
    # A save of step 4 killed midway left its _temp directory, which filled the disk.
    leftover = output_dir / "ckpt-4_temp"
    leftover.mkdir()
    fill(leftover / "part-00000-of-00001.data-00000-of-00001")
    rerun = pretrain(records, output_dir, steps=4)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    removed = rerun.stderr.index(f"removed {leftover}, left by a checkpoint save")
    assert removed < rerun.stderr.index("flags written to")
    assert tf.train.latest_checkpoint(str(output_dir)) == f"{output_dir}/ckpt-4"


@pytest.fixture(scope="module")
def text_files(tmp_path_factory):
    """The embedded corpus (real prose, about 3 MB) in 6 files: 6 work units."""
    directory = tmp_path_factory.mktemp("text")
    corpus = directory / "corpus.txt"
    subprocess.run(
        [sys.executable, "-m", "bert_tf.corpus", f"--output_file={corpus}"],
        env=ENV,
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    documents = corpus.read_text(encoding="utf-8").split("\n\n")
    for k in range(6):
        (directory / f"part{k}.txt").write_text("\n\n".join(documents[k::6]), encoding="utf-8")
    corpus.unlink()
    return directory


def create_data(text_files, vocab_file, output_dir, *flags):
    return run_job(
        "create_pretraining_data",
        f"--input_file={text_files}/part*.txt",
        f"--vocab_file={vocab_file}",
        f"--output_dir={output_dir}",
        "--max_seq_length=64",
        "--max_predictions_per_seq=10",
        "--num_shards=3",
        "--dupe_factor=2",
        "--num_workers=2",
        *flags,
    )


@pytest.mark.parametrize("runner", ["local", "beam"])
def test_create_pretraining_data_on_a_full_disk_names_the_file_and_leaves_no_partial_shard(
    records, text_files, small_disk, tmp_path, runner
):
    vocab_file = records / "vocab.txt"
    reference = create_data(text_files, vocab_file, tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr[-3000:]
    disk = small_disk("6m")  # room for the token files, not for the records (20 MB)
    output_dir = disk / "records"
    flags = ["--runner=DirectRunner", "--direct_num_workers=1"] if runner == "beam" else []
    failed = create_data(text_files, vocab_file, output_dir, *flags)
    assert failed.returncode == 1, failed.stderr[-3000:]
    if runner == "local":  # (Beam logs the traceback of each failed bundle itself)
        assert "Traceback" not in failed.stderr
    (line,) = [line for line in failed.stdout.splitlines() if line.startswith("error: ")]
    assert line.startswith(f"error: no space left on device writing {output_dir}/"), line
    assert "No partial output file is left; " in line and "a rerun resumes from" in line
    assert re.search(r"keeps \d+\.\d MB of finished work", line), line
    left = [
        os.path.relpath(os.path.join(d, name), output_dir)
        for d, _, names in os.walk(output_dir)
        for name in names
    ]
    assert not [name for name in left if name.endswith(".tmp") or name.endswith(".tfrecord")], left
    resize(disk, "40m")
    rerun = create_data(text_files, vocab_file, output_dir)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    for name in ("pretrain-00000-of-00003.tfrecord", "pretrain-00002-of-00003.tfrecord"):
        assert (output_dir / name).read_bytes() == (tmp_path / "reference" / name).read_bytes()


def test_full_disk_message_names_the_file_and_ignores_other_errors():
    assert (
        io_utils.full_disk_message(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/d/a.bin"))
        == "no space left on device writing /d/a.bin"
    )
    assert io_utils.full_disk_message(OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))) == (
        "disk quota exceeded"
    )
    # TensorFlow's message names the scratch file it was writing; the message names the real one.
    saved = tf.errors.ResourceExhaustedError(
        None, None, "/d/ckpt-2_temp/part.data-00000-of-00001.tempstate123; No space left on device"
    )
    assert io_utils.full_disk_message(saved) == (
        "no space left on device writing /d/ckpt-2_temp/part.data-00000-of-00001"
    )
    assert io_utils.full_disk_message(tf.errors.ResourceExhaustedError(None, None, "OOM")) is None
    assert io_utils.full_disk_message(OSError(errno.EACCES, "Permission denied", "/d")) is None
    assert io_utils.full_disk_message(ValueError("No space left on device")) is None


def test_a_full_disk_error_written_out_as_text_is_read_back():
    # How a Beam worker's OSError reaches the job: its text inside the runner's own error.
    for name in ("/d/plain.bin", "/d/it's.bin", '/d/back\\slash"quote.bin'):
        error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name)
        found = io_utils.full_disk_error_in(f"RuntimeError: Traceback\n  ...\n{error} [Build]")
        assert (found.errno, found.filename) == (errno.ENOSPC, name)
    quota = str(OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)))
    found = io_utils.full_disk_error_in(quota)
    assert (found.errno, found.filename) == (errno.EDQUOT, None)
    bytes_name = io_utils.full_disk_error_in(str(OSError(errno.ENOSPC, "x", b"/d/raw.bin")))
    assert bytes_name is None  # its reason is not the system's: not an OSError of this machine
    raw = f"[Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)}: b'/d/raw.bin'"
    assert io_utils.full_disk_error_in(raw).filename == "/d/raw.bin"
    # A name cut short or mangled on its way, and Beam's suffix after a nameless error.
    mangled = f"[Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)}: '/a\\x' [while running 'W']"
    assert io_utils.full_disk_error_in(mangled).filename is None
    nameless = io_utils.full_disk_error_in(f"{quota} [while running 'W']")
    assert io_utils.full_disk_message(nameless) == "disk quota exceeded"
    assert io_utils.full_disk_error_in("[Errno 13] Permission denied: '/d'") is None
    assert io_utils.full_disk_error_in("the pipeline failed") is None


def test_a_failed_write_through_atomic_path_names_the_file_and_removes_its_temp(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(OSError) as raised:
        with io_utils.atomic_path(str(target)) as tmp:
            with open(tmp, "wb") as f:
                f.write(b"x")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as write() raises it
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(target)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "tf_config, chief",
    [
        (None, True),
        ('{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}', True),
        ('{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}', False),
        ('{"cluster": {"chief": ["c:0"], "worker": ["a:1"]}, "task": {"type": "chief"}}', True),
        (
            '{"cluster": {"chief": ["c:0"], "worker": ["a:1"]}, '
            '"task": {"type": "worker", "index": 0}}',
            False,
        ),
        ("not json", False),
    ],
)
def test_only_the_chief_task_cleans_the_output_dir_before_the_strategy_exists(
    tf_config, chief, monkeypatch
):
    # A restarted worker must never remove a save the chief has under way.
    if tf_config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", tf_config)
    assert distribution.is_chief_task() is chief
