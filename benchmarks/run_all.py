"""Runs every benchmarks/bench_*.py in turn (`make bench`) and prints their tables.

Each script measures against a peer in the same run; a new run's table replaces its area's table
in RESULTS.md, with the peer, the machine, the date and the command. Pass --quick to run the
scripts that have a short variant in it (see QUICK_ARGS); the others run as usual. The scripts'
own flags differ, so no other flag is forwarded.
"""

import glob
import os
import subprocess
import sys

# Each script's own flags for its short variant (each script's docstring names them).
QUICK_ARGS = {
    "bench_serve.py": ["--quick"],
    "bench_pretraining_data.py": ["--sizes=10"],
    "bench_finetune_quality.py": ["--tasks=pair", "--seeds=1", "--num_train=300", "--num_dev=200"],
}


def main():
    """Runs the scripts one after another; exits 1 naming those that failed."""
    extra = sys.argv[1:]
    if extra not in ([], ["--quick"]):
        print(f"usage: {sys.argv[0]} [--quick]  (got {' '.join(extra)})", file=sys.stderr)
        sys.exit(2)
    here = os.path.dirname(os.path.abspath(__file__))
    failed = []
    for script in sorted(glob.glob(os.path.join(here, "bench_*.py"))):
        name = os.path.basename(script)
        args = QUICK_ARGS.get(name, []) if extra else []
        print(f"\n## {name} {' '.join(args)}\n", flush=True)
        result = subprocess.run([sys.executable, script, *args])
        if result.returncode != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
