"""README's quickstart runs as pasted: its shell block, in a fresh directory with a stand-in TSV.

The block is read from README.md (between its quickstart markers) and run by bash with `-e`, so
a step that fails (a server not ready, a curl refused) fails the test. Two edits only: the
server's ports become free ones (the block's defaults, 8500 and 8501, may be taken on a shared
machine), and `source .venv/bin/activate` finds this interpreter's environment.
"""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest
from helpers import ROOT

from bert_tf.tasks import demo_datasets

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow


def quickstart_block():
    """The first sh block between README's quickstart markers."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme.split("[start:quickstart]", 1)[1].split("[end:quickstart]", 1)[0]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_quickstart_block_runs_as_pasted(tmp_path):
    block = quickstart_block()
    assert "--wait_seconds" in block and "kill $SERVER" in block
    grpc_port, rest_port = free_port(), free_port()
    block = block.replace("localhost:8500", f"localhost:{grpc_port}")
    block = block.replace("localhost:8501", f"localhost:{rest_port}")
    block = block.replace(
        "python -m bert_tf.serve ",
        f"python -m bert_tf.serve --port={grpc_port} --rest_api_port={rest_port} ",
    )
    os.symlink(sys.prefix, tmp_path / ".venv")
    demo_datasets.write_demo_glue_dir(str(tmp_path / "data"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # A session of its own: a step that fails ends bash before the block's `kill $SERVER`, and
    # the server it started must not outlive the test.
    shell = subprocess.Popen(
        ["bash", "-e", "-c", block],
        cwd=tmp_path,
        env=dict(env, PYTHONPATH=ROOT),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = shell.communicate(timeout=900)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()
    result = subprocess.CompletedProcess(shell.args, shell.returncode, stdout, stderr)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # The client's answer (gRPC), then curl's (REST), each a JSON line; the stand-in's labels are
    # 1 (positive) and 0, and the fine-tuned model tells them apart.
    grpc_reply, rest_reply = [json.loads(s) for s in result.stdout.splitlines() if s[:1] == "{"]
    assert grpc_reply["label"] == ["1"], result.stdout[-2000:]
    assert [row["label"] for row in rest_reply["predictions"]] == ["1", "0"], result.stdout[-2000:]
    assert (tmp_path / "export" / "sentiment" / "1" / "saved_model.pb").exists()
