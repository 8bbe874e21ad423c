"""Runs every benchmarks/bench_*.py in turn (`make bench`) and prints their tables.

Each script measures against a peer in the same run; copy the tables into RESULTS.md with the
machine and the command. Pass --quick to ask scripts that support it for their short variant.
"""

import glob
import os
import subprocess
import sys


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    extra = sys.argv[1:]
    failed = []
    for script in sorted(glob.glob(os.path.join(here, "bench_*.py"))):
        name = os.path.basename(script)
        print(f"\n## {name}\n", flush=True)
        result = subprocess.run([sys.executable, script, *extra])
        if result.returncode != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
