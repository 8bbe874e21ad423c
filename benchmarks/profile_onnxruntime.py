"""Where ONNX Runtime's batch-1 time goes: bench_inference's ONNX Runtime row, profiled per op.

    TORCH_PYTHON benchmarks/profile_onnxruntime.py --minilm=MINILM_DIR [--size=minilm|base] \
        [--kind=classifier] [--calls=200]

Builds the ONNX Runtime row's model exactly as hf_peer.py does (exported, fused, checked against
PyTorch), at 2 threads with ONNX Runtime's profiler on, calls it on one real sentence, and prints
the time a call of session.run and of the fast tokenizer, then each op type's kernel time a call
(the profiler's `*_kernel_time` events), largest first. No TensorFlow here.
"""

import argparse
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_peer  # noqa: E402

SENTENCE = "Return True if the operand is finite; otherwise return False."
WARMUP_CALLS = 20


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="minilm", choices=("minilm", "base"))
    parser.add_argument("--kind", default="classifier", choices=tuple(hf_peer.TASK_MODELS))
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--minilm", required=True, help="MiniLM's Hugging Face directory")
    args = parser.parse_args()
    request = dict(
        task=args.kind,
        size=args.size,
        minilm=args.minilm,
        vocab=os.path.join(args.minilm, "vocab.txt"),
        shape=hf_peer.BASE_SHAPE,
        seq_length=512,
        runtime=hf_peer.ORT,
        threads=2,
        profile=True,
    )
    run, encoder = hf_peer.ort_task(request)
    inputs = encoder([SENTENCE])
    for _ in range(WARMUP_CALLS):
        run(inputs)
    start = time.perf_counter()
    for _ in range(args.calls):
        run(inputs)
    run_ms = (time.perf_counter() - start) / args.calls * 1e3
    start = time.perf_counter()
    for _ in range(args.calls):
        encoder([SENTENCE])
    tokenizer_ms = (time.perf_counter() - start) / args.calls * 1e3
    profile = run.session.end_profiling()
    with open(profile) as f:
        events = json.load(f)
    os.remove(profile)
    # The checks against PyTorch ran through the same session: count every call profiled.
    profiled = sum(1 for e in events if e.get("cat") == "Session" and e["name"] == "model_run")
    by_op = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"]
    print(
        f"{args.size} {args.kind}, {inputs['input_ids'].shape[-1]} tokens, 2 threads: session.run "
        f"{run_ms:.2f} ms, tokenizer {tokenizer_ms:.2f} ms, kernels "
        f"{sum(by_op.values()) / profiled / 1e3:.2f} ms a call"
    )
    for op, microseconds in by_op.most_common():
        print(f"  {op}: {microseconds / profiled / 1e3:.3f} ms")


if __name__ == "__main__":
    main()
