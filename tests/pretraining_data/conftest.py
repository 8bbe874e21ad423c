"""Fixtures of the pretraining-data tests: a small real corpus and the local run's records."""

import email
import json
import os

import pytest
from helpers_beam import make_args, run_small_units

from bert_tf.pretraining_data import corpus


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    """About 70 KB of real prose (stdlib docstrings), in the original input format."""
    path = str(tmp_path_factory.mktemp("corpus") / "corpus.txt")
    corpus.write_default_corpus(path, roots=[os.path.dirname(m.__file__) for m in (json, email)])
    return path


@pytest.fixture(scope="module")
def reference(corpus_file, tmp_path_factory):
    """The local path's run, one process: (output directory, summary)."""
    directory = str(tmp_path_factory.mktemp("local"))
    summary = run_small_units(make_args(corpus_file, directory))
    assert summary["units"] >= 4  # several units per output file
    return directory, summary
