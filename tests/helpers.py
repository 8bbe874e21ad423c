"""What several test files share: the CLI runner, the one tiny model, its round trip, tiny vocabularies
and model directories.

Test files import these from here or from a cohesive helpers_*.py beside it (helpers_google: Google's
checkpoint layout and a NumPy BERT; helpers_records: pretraining records; helpers_serve: the serving
tests' SavedModels), and fixtures come from conftest.py; never from each other.
"""

import contextlib
import dataclasses
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import threading
import time

import numpy as np
import tensorflow as tf

from bert_tf.model import modeling
from bert_tf.model.model_dir import ModelDir
from bert_tf.runtime import job_process
from bert_tf.tasks import models
from bert_tf.tokenization import python_tokenizer

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# 1e-3 for 10 epochs learns the demo set from random weights with every seed we tried (1..6);
# 5e-3 does not learn at all, so the quality test below can fail.
DEMO_TRAINING = dict(
    max_seq_length=24,
    train_batch_size=32,
    eval_batch_size=50,
    predict_batch_size=50,
    learning_rate=1e-3,
    num_train_epochs=10,
    warmup_proportion=0.1,
    steps_per_loop=25,
)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI_ENV = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")


def child_pythonpath(test_file):
    """PYTHONPATH for a child that imports the test module `test_file` (and these helpers) by name."""
    here = os.path.dirname(os.path.abspath(test_file))
    return os.pathsep.join([ROOT, os.path.dirname(os.path.abspath(__file__)), here])


def built_once(tmp_path_factory, name, build):
    """The directory `name` of this test run, filled by `build(directory)` for the first caller.

    Under pytest-xdist the workers share the run's temp directory (the parent of each worker's
    own), so the first worker builds and the others wait for it behind a file lock and reuse it.
    """
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    with open(f"{root}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (root / "built").exists():
            shutil.rmtree(root, ignore_errors=True)  # a build that failed midway
            root.mkdir()
            build(root)
            (root / "built").touch()
    return root


class CliZygote:
    """A child interpreter (tests/cli_zygote.py) that has imported TensorFlow and forks one process
    per `python -m` call: the job's own process, started in a fraction of a second instead of 3 to 8.

    `env` must set TF_CPP_MIN_LOG_LEVEL: TensorFlow reads it once, in the zygote, where a job's
    quiet set-up (bert_tf.runtime.quiet) would come too late to set it.
    """

    def __init__(self, env):
        assert "TF_CPP_MIN_LOG_LEVEL" in env
        self.log = tempfile.NamedTemporaryFile(prefix="cli_zygote_", suffix=".log")
        self.process = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "tests", "cli_zygote.py")],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            bufsize=0,  # unbuffered: select() sees every reply not yet read
        )
        self.lock = threading.Lock()  # one request at a time on the pipe
        self.onednn = self.reply(timeout=300)["onednn"]

    def reply(self, timeout=None):
        """The zygote's next reply; TimeoutError when none comes within `timeout` s."""
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError
        line = self.process.stdout.readline()
        if not line:
            with open(self.log.name) as log:
                raise RuntimeError(f"the CLI zygote died; its log ends:\n{log.read()[-3000:]}")
        return json.loads(line)

    def run(self, module, flags, timeout=300):
        """`python -m module flags...`, forked: a CompletedProcess with its text output. A timeout
        or any other interruption kills the child and closes the zygote (its pipe could hold a
        reply that no one reads)."""
        flags = [os.fspath(flag) for flag in flags]
        with self.lock, tempfile.TemporaryDirectory() as tmp:
            paths = [os.path.join(tmp, name) for name in ("stdout", "stderr")]
            request = dict(module=module, argv=flags, cwd=ROOT, stdout=paths[0], stderr=paths[1])
            pid = None
            try:
                self.process.stdin.write(json.dumps(request).encode() + b"\n")
                pid = self.reply(timeout=60)["pid"]
                returncode = self.reply(timeout)["returncode"]
            except BaseException as e:
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                self.close()
                if isinstance(e, TimeoutError) and pid is not None:
                    out, err = read_texts(paths)
                    raise subprocess.TimeoutExpired([module, *flags], timeout, out, err) from None
                raise
            command = [sys.executable, "-m", module, *flags]
            return subprocess.CompletedProcess(command, returncode, *read_texts(paths))

    def close(self):
        """Ends the zygote (and a child still running): its stdin closes."""
        self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_texts(paths):
    """The text of each file in `paths` (what a child wrote)."""
    texts = []
    for path in paths:
        with open(path) as f:
            texts.append(f.read())
    return texts


# Jobs that load no TensorFlow: forked from a zygote, they would accept its absl flags (which
# tests/runtime/test_entry_points.py checks, both ways), and they start fast anyway.
FRESH_JOBS = ("bert_tf.corpus", "bert_tf.create_pretraining_data", "bert_tf.inspect_records")
_zygotes = {}  # by their environment's TF_ENABLE_ONEDNN_OPTS


def pooled_zygote(env):
    """This test process's zygote for `env`'s oneDNN setting, started (again) when it has none."""
    key = env.get("TF_ENABLE_ONEDNN_OPTS")
    if key not in _zygotes or _zygotes[key].process.poll() is not None:
        _zygotes[key] = CliZygote(env)
    return _zygotes[key]


def zygote_for(module):
    """The zygote that starts `module` as a fresh interpreter would: a training job turns oneDNN
    on before TensorFlow loads, which the default zygote serves where TensorFlow does so itself."""
    env = dict(CLI_ENV)
    job_process.turn_onednn_on(module, env)
    default = pooled_zygote(CLI_ENV)
    return default if env == CLI_ENV or default.onednn else pooled_zygote(env)


def run_module_cli(module, *flags, timeout=300):
    """`python -m module flags...` in a process of its own; returns the CompletedProcess (text
    output), or raises subprocess.TimeoutExpired. The process is forked from a zygote that has
    imported TensorFlow (tests/cli_zygote.py), except for the FRESH_JOBS."""
    if module in FRESH_JOBS:
        return run_fresh_cli(module, *flags, timeout=timeout)
    return zygote_for(module).run(module, flags, timeout)


def run_fresh_cli(module, *flags, env=CLI_ENV, timeout=300):
    """`python -m module flags...` in a fresh interpreter; returns the CompletedProcess (text output)."""
    return subprocess.run(
        [sys.executable, "-m", module, *flags],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_python_script(script, timeout=120):
    """Runs `python -c script` in a fresh interpreter from the repository root (what a clean
    process imports, for one); returns the CompletedProcess (text output)."""
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=CLI_ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write_vocab(path, texts, extra_words=()):
    """A vocab.txt: the special tokens plus every word of `texts` as BasicTokenizer splits it (lower-cased)."""
    basic = python_tokenizer.BasicTokenizer(do_lower_case=True)
    words = {w for text in texts for w in basic.tokenize(text)} | set(extra_words)
    with open(path, "w") as f:
        f.write("\n".join(SPECIAL_TOKENS + sorted(words)) + "\n")
    return path


def hf_wordpiece_reference(vocab_file, lowercase=True):
    """Hugging Face `tokenizers`' BertWordPieceTokenizer, the independent reference of the
    original's tokenizer, set to the original's current word limit: its WordPiece keeps words up
    to 100 characters, google-research/bert's limit until commit 332a687 (2018-11-23), 200 since."""
    from tokenizers import BertWordPieceTokenizer

    reference = BertWordPieceTokenizer(vocab_file, lowercase=lowercase)
    assert reference._tokenizer.model.max_input_chars_per_word == 100
    reference._tokenizer.model.max_input_chars_per_word = 200
    return reference


# ----------------------------------------------------------------------------------------------
# The one tiny model
# ----------------------------------------------------------------------------------------------

# The one tiny BertConfig of the tests. Every test model is this config, sized to the test's
# vocabulary by tiny_config(vocab_file), or it with fields overridden where a test's assertions
# need another value (each such test says why). Two layers of width 32 learn the demo sets in
# seconds and build in a fraction of one.
TINY_CONFIG = modeling.BertConfig(
    vocab_size=23,  # write_tiny_vocab's: the special tokens (ids 0..4), then w0..w17 (ids 5..22)
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
)
# Dropout off, for tests that compare two runs number for number.
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# Masked positions in the two rows of tiny_inputs(), for comparing pretraining outputs.
TINY_POSITIONS = np.array([[1, 2], [0, 5]], np.int32)


def count_tokens(vocab_file):
    """The number of tokens in a vocab.txt (its non-empty lines)."""
    with open(vocab_file, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def tiny_config(vocab_file=None, **overrides):
    """TINY_CONFIG with `overrides` (BertConfig fields); with `vocab_file`, sized to that vocabulary."""
    if vocab_file is not None:
        overrides = dict(vocab_size=count_tokens(vocab_file), **overrides)
    return dataclasses.replace(TINY_CONFIG, **overrides)


def write_tiny_vocab(path, size=TINY_CONFIG.vocab_size):
    """A vocab.txt of `size` tokens: the special tokens, then w0, w1, ..."""
    tokens = SPECIAL_TOKENS + [f"w{i}" for i in range(size - len(SPECIAL_TOKENS))]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    return str(path)


def tiny_inputs(batch=2, seq=7, seed=0, vocab_size=TINY_CONFIG.vocab_size):
    """Random encoder inputs: the last row padded at its last two positions, the second half segment 1."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab_size, size=(batch, seq)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[-1, seq - 2 :] = 0
    ids[-1, seq - 2 :] = 0
    types = np.zeros_like(ids)
    types[:, seq // 2 :] = 1
    return {"input_word_ids": ids, "input_mask": mask, "input_type_ids": types}


def write_tiny_model_dir(path, vocab_file, seed=0, **config_overrides):
    """A tiny pretrained-layout model directory with random weights; returns its path."""
    tf.keras.utils.set_random_seed(seed)
    config = tiny_config(vocab_file, **config_overrides)
    ModelDir(str(path)).write(config, vocab_file, modeling.build_encoder(config))
    return str(path)


def assert_same_outputs(got, want, names):
    """Asserts that the named outputs of two models' output dicts are identical, value for value."""
    for name in names:
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]), err_msg=name)


def round_trip(
    path, config, vocab_file, encoder, pretraining_model=None, spec=None, model=None, inputs=None
):
    """Writes a model directory, loads it back and asserts that it rebuilds the same networks.

    The config (and task spec) must read back equal, and the loaded encoder, and the pretraining or
    task model when one is written, must give outputs identical to the originals' on `inputs`
    (tiny_inputs() by default; two rows, as the heads are compared at TINY_POSITIONS). Returns
    (the ModelDir, the checkpoint path written).
    """
    directory = ModelDir(str(path))
    prefix = directory.write(config, vocab_file, encoder, pretraining_model, spec=spec, model=model)
    x = tiny_inputs() if inputs is None else inputs
    assert directory.load_config() == config
    assert models.read_task_spec(directory) == spec
    assert_same_outputs(
        directory.load_encoder()(x), encoder(x), ("sequence_output", "pooled_output")
    )
    if pretraining_model is not None:
        loaded, _ = directory.load_pretraining_model()
        x_positions = {**x, "masked_lm_positions": TINY_POSITIONS}
        assert_same_outputs(
            loaded(x_positions), pretraining_model(x_positions), ("mlm_logits", "nsp_logits")
        )
    if spec is not None:
        loaded, _, loaded_config, loaded_spec = models.load_task_model(directory)
        assert (loaded_config, loaded_spec) == (config, spec)
        want = model(x, training=False)
        assert_same_outputs(loaded(x, training=False), want, want)
    return directory, prefix


def demo_texts(glue_dir):
    """The sentences of the demo set's train/dev/test files (last column of test, first of the others)."""
    texts = []
    for split in ("train", "dev", "test"):
        with open(os.path.join(glue_dir, f"{split}.tsv")) as f:
            rows = [line.rstrip("\n").split("\t") for line in f][1:]
        texts += [row[1] if split == "test" else row[0] for row in rows]
    return texts


# ----------------------------------------------------------------------------------------------
# Model directories written by the code before bert_tf.model.model_dir (tests/fixtures/make_old_model_dirs.py,
# at commit fdc5913), packed in a tarball with the outputs those models gave.
# ----------------------------------------------------------------------------------------------

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
OLD_MODEL_DIRS = os.path.join(FIXTURES, "old_model_dirs.tar.gz")
OLD_MODEL_DIRS_REFERENCE = os.path.join(FIXTURES, "old_model_dirs_reference.npz")
# The task.json of the old classifier directory.
OLD_CLASSIFIER_SPEC = models.TaskSpec(
    "classifier", labels=["neg", "pos"], max_seq_length=7, task_name="demo"
)


# The reference outputs were computed on a CPU with AVX-512; on an AVX2-only CPU oneDNN runs other
# kernels, whose float32 rounding differs by a few ulps (4.8e-7 seen on an AMD EPYC). Weights in the
# wrong place or the other GELU form move these outputs by 1e-5 or more (test_model_dir checks the
# GELU case), so this bound still tells a faithful load from a wrong one on any CPU.
REFERENCE_ATOL = 2e-6


def assert_matches_reference(actual, desired):
    """`actual` equals the reference outputs `desired` up to CPU-kernel rounding (REFERENCE_ATOL)."""
    np.testing.assert_allclose(actual, desired, rtol=0, atol=REFERENCE_ATOL)


def old_model_dir(name, tmp_path):
    """A fresh copy of the old model directory `name` (pretrained, pretraining_run, classifier,
    legacy_gelu) under tmp_path; returns its path."""
    with tarfile.open(OLD_MODEL_DIRS) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(name + "/")]
        tar.extractall(tmp_path, members=members, filter="data")
    return os.path.join(str(tmp_path), name)


def reference_inputs(reference):
    """(encoder inputs, masked_lm_positions) of the old directories' reference outputs."""
    x = {name: reference[f"inputs/{name}"] for name in modeling.ENCODER_INPUTS}
    return x, reference["inputs/masked_lm_positions"]


def session_outputs(path, signature, feeds):
    """A signature run as TF Serving runs it: the SavedModel loaded into a TF1 session, its
    variables restored by the saver (not TF2's object graph)."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
        signature_def = meta_graph.signature_def[signature]
        fetches = {name: info.name for name, info in signature_def.outputs.items()}
        feed = {signature_def.inputs[name].name: value for name, value in feeds.items()}
        return session.run(fetches, feed)


def saved_model_ops_script(export_dir):
    """Python source that reads EXPORT_DIR/saved_model.pb into `ops` (every op type of its graph and
    functions), `core` (TensorFlow core's and the graph's own functions) and `text` (those that
    only importing tensorflow_text registers); a test's script goes on from there."""
    return textwrap.dedent(
        f"""
        import json
        import tensorflow as tf
        from tensorflow.core.protobuf import saved_model_pb2
        from tensorflow.python.framework import op_def_registry
        proto = saved_model_pb2.SavedModel()
        proto.ParseFromString(open({export_dir!r} + "/saved_model.pb", "rb").read())
        graph = proto.meta_graphs[0].graph_def
        ops = {{n.op for n in graph.node}}
        for f in graph.library.function:
            ops |= {{n.op for n in f.node_def}}
        functions = {{f.signature.name for f in graph.library.function}}
        core = {{op for op in ops if op in functions or op_def_registry.get(op) is not None}}
        import tensorflow_text
        text = {{op for op in ops - core if op_def_registry.get(op) is not None}}
        """
    )


def wait_for(condition, seconds=10):
    """Polls `condition()` until it holds or `seconds` pass; returns its last value."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def checkpoint_values(directory, prefix):
    """{checkpoint key: value} of the variables under root object `prefix` in DIRECTORY's newest ckpt."""
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(directory))
    return {
        key: reader.get_tensor(key)
        for key in reader.get_variable_to_shape_map()
        if key.startswith(prefix + "/") and key.endswith(".ATTRIBUTES/VARIABLE_VALUE")
    }
