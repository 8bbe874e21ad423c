"""bench_inference's Hugging Face and ONNX Runtime peer: run by a Python with torch + transformers
(+ onnxruntime and onnx for the ONNX Runtime rows): `--torch_python`.

    TORCH_PYTHON benchmarks/hf_peer.py '{"task": ..., ...}'

It writes one JSON line (the versions of what it runs), then serves latency.serve_timed_calls
on stdin/stdout: one JSON list of texts in, the seconds its call took out, until stdin closes.
Tasks (the request's "task"), on the request's "threads" (default 2):
  - classifier: BertForSequenceClassification (MiniLM's weights, or BERT-base's shape at random),
    its fast tokenizer, dynamic padding, softmax;
  - ner, squad, multiple_choice: as the classifier, with BertForTokenClassification (argmax per
    token), BertForQuestionAnswering (argmax of the start and end logits) or BertForMultipleChoice
    (softmax), on the request task_requests.py makes from each text;
  - fill_mask_model: BertForMaskedLM from "hf_dir" called directly with its fast tokenizer
    (padding=True), the [MASK] positions' logits gathered, softmax, top 5;
  - with "runtime": "onnxruntime", the classifier, ner, squad, multiple_choice and fill_mask_model
    rows on ONNX Runtime instead: the same model (the attention's eager implementation, which
    ONNX Runtime's optimizer recognizes) exported with torch.onnx.export (dynamic batch and
    length), fused by onnxruntime.transformers.optimizer (model_type "bert": embedding and skip
    LayerNorms, attention with its mask, bias + GELU), checked within 1e-4 of PyTorch on two
    texts, run in an InferenceSession on "threads" intra-op threads (0: ONNX Runtime's default),
    the same fast tokenizer (NumPy tensors) and the same post-processing in NumPy;
  - fill_mask_pipeline: transformers.pipeline("fill-mask", model=hf_dir, top_k=5), a list of texts
    as one batch;
  - pretraining (bench_pretraining's peer; a number of steps in, not texts): BertForPreTraining of
    the request's "shape" at random, trained in eager mode on "batch" x "seq_length" random rows
    with "predictions" masked positions each and a random next-sentence label: torch AdamW (lr
    1e-4, weight decay 0.01), gradients clipped to norm 1; two warm-up steps before it answers;
  - prepare_fill_mask: not a peer. Writes "hf_dir", a BertForMaskedLM (MiniLM's encoder, or
    BERT-base's shape at random, with a randomly initialized MLM head, seeded) saved with
    save_pretrained (safetensors) and the tokenizer files, then writes the top-5 token ids of each
    of "check_texts" (one [MASK] each: [text][k], as the fill_mask_model row computes them), exits.
No TensorFlow here.
"""

import json
import os
import shutil
import sys

import numpy as np

TOP_K = 5
ORT = "onnxruntime"  # a request's "runtime" for the ONNX Runtime rows (default: PyTorch)
BASE_SHAPE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12)
# The texts a fused ONNX model is exported with and checked on against PyTorch.
CHECK_TEXTS = ["the quick brown fox jumps over the lazy dog .", "return the [MASK] of the module ."]


def main(request):
    # stdout carries the replies alone: whatever the libraries print goes to stderr.
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import torch
    import transformers

    # "threads" are ONNX Runtime's on its rows (0: its default); torch then only exports.
    torch.set_num_threads(2 if request.get("runtime") == ORT else request.get("threads", 2))
    task = request["task"]
    if task == "prepare_fill_mask":
        ids = prepare_fill_mask(request)
        print(json.dumps(ids), file=protocol, flush=True)
        return
    if request.get("runtime") == ORT:
        import onnxruntime

        versions = f"onnxruntime {onnxruntime.__version__}"
        call = {**{kind: ort_task_call for kind in TASK_MODELS}, "fill_mask_model": ort_fill_mask}
    else:
        versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
        call = {
            **{kind: task_call for kind in TASK_MODELS},
            "fill_mask_model": fill_mask_model,
            "fill_mask_pipeline": fill_mask_pipeline,
            "pretraining": pretraining,
        }
    call = call[task](request)
    from latency import serve_timed_calls

    print(json.dumps(versions), file=protocol, flush=True)
    serve_timed_calls(call, stdout=protocol)


# The Hugging Face class of each export kind, and its number of labels.
TASK_MODELS = {
    "classifier": ("BertForSequenceClassification", 2),
    "ner": ("BertForTokenClassification", 3),
    "squad": ("BertForQuestionAnswering", 2),
    "multiple_choice": ("BertForMultipleChoice", 2),
}


def task_model(request):
    """(model, tokenizer) of the request's kind: MiniLM's weights, or BERT-base's shape at random
    (seeded, so the ONNX Runtime rows run the very weights the PyTorch row does)."""
    import torch
    import transformers

    class_name, num_labels = TASK_MODELS[request["task"]]
    model_class = getattr(transformers, class_name)
    tokenizer = transformers.BertTokenizerFast(request["vocab"], do_lower_case=True)
    # ONNX Runtime's optimizer fuses attention only from the eager implementation's graph.
    options = dict(attn_implementation="eager") if request.get("runtime") == ORT else {}
    torch.manual_seed(0)
    if request["size"] == "minilm":
        model = model_class.from_pretrained(request["minilm"], num_labels=num_labels, **options)
    else:
        config = transformers.BertConfig(num_labels=num_labels, **request["shape"], **options)
        model = model_class(config)
    return model.eval(), tokenizer


def task_encoder(kind, tokenizer, seq_length, tensors):
    """texts -> the tokenizer's inputs for `kind` (`tensors`: "pt" or "np"), made from the request
    task_requests.py builds of each text, padded to the batch's longest."""
    from task_requests import request as task_request

    encode = dict(padding=True, max_length=seq_length, return_tensors=tensors)

    def encoder(texts):
        inputs = task_request(kind, texts)
        if kind == "squad":
            return tokenizer(
                inputs["question"], inputs["context"], truncation="only_second", **encode
            )
        if kind == "multiple_choice":
            pairs = [(c, e) for c, ends in zip(inputs["context"], inputs["endings"]) for e in ends]
            encoded = tokenizer(*zip(*pairs), truncation=True, **encode)
            choices = len(inputs["endings"][0])
            return {name: value.reshape(len(texts), choices, -1) for name, value in encoded.items()}
        return tokenizer(inputs["text"], truncation=True, **encode)

    return encoder


def task_answer(kind, outputs):
    """What each row computes from the task model's outputs {name: numpy array}."""
    if kind == "squad":
        return outputs["start_logits"].argmax(-1), outputs["end_logits"].argmax(-1)
    if kind == "ner":
        return outputs["logits"].argmax(-1)
    return softmax(outputs["logits"])


def softmax(logits):
    exp = np.exp(logits - logits.max(-1, keepdims=True))
    return exp / exp.sum(-1, keepdims=True)


def task_call(request):
    """The PyTorch row of an export kind."""
    import torch

    kind = request["task"]
    model, tokenizer = task_model(request)
    encoder = task_encoder(kind, tokenizer, request["seq_length"], "pt")

    def call(texts):
        with torch.inference_mode():
            outputs = model(**encoder(texts))
        return task_answer(kind, {name: value.numpy() for name, value in outputs.items()})

    return call


def ort_task(request):
    """(run, encoder) of the ONNX Runtime row of an export kind: the PyTorch row's model exported
    and fused (ort_session), and texts -> its inputs."""
    kind = request["task"]
    model, tokenizer = task_model(request)
    encoder = task_encoder(kind, tokenizer, request["seq_length"], "np")
    outputs = ("start_logits", "end_logits") if kind == "squad" else ("logits",)
    return ort_session(model, encoder, outputs, request), encoder


def ort_task_call(request):
    """The ONNX Runtime row of an export kind."""
    run, encoder = ort_task(request)
    return lambda texts: task_answer(request["task"], run(encoder(texts)))


def ort_session(model, encoder, output_names, request):
    """inputs {name: numpy} -> {output name: numpy} of `model` exported to ONNX with dynamic batch
    and length (torch.onnx's TorchScript exporter), fused by onnxruntime.transformers' BERT
    optimizer, in an InferenceSession of the request's "threads" (0: ONNX Runtime's default),
    profiling its kernels when the request says "profile". Checks the fused model against `model`
    on a few texts first: more than 1e-4 apart is an error."""
    import tempfile

    import onnxruntime
    import torch
    from onnxruntime.transformers import optimizer

    example = encoder(CHECK_TEXTS)
    names = [name for name in ("input_ids", "attention_mask", "token_type_ids") if name in example]
    axes = {0: "batch", 1: "choices", 2: "sequence"} if example["input_ids"].ndim == 3 else None
    axes = axes or {0: "batch", 1: "sequence"}
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = request.get("threads", 2)
    options.enable_profiling = bool(request.get("profile"))
    options.profile_file_prefix = os.path.join(tempfile.gettempdir(), "onnxruntime_profile")
    with tempfile.TemporaryDirectory(prefix="ort_peer_") as work:
        exported, fused = os.path.join(work, "model.onnx"), os.path.join(work, "fused.onnx")
        torch.onnx.export(
            model,
            tuple(torch.from_numpy(example[name]) for name in names),
            exported,
            input_names=names,
            output_names=list(output_names),
            dynamic_axes={name: axes for name in names}
            | {name: {0: "batch"} for name in output_names},
            opset_version=17,
            dynamo=False,
        )
        optimized = optimizer.optimize_model(
            exported,
            model_type="bert",
            num_heads=model.config.num_attention_heads,
            hidden_size=model.config.hidden_size,
        )
        optimized.save_model_to_file(fused)
        fusions = {op: n for op, n in optimized.get_fused_operator_statistics().items() if n}
        session = onnxruntime.InferenceSession(fused, options, providers=["CPUExecutionProvider"])

    def run(inputs):
        values = session.run(list(output_names), {name: inputs[name] for name in names})
        return dict(zip(output_names, values))

    run.session = session  # profile_onnxruntime.py ends its profile

    with torch.inference_mode():
        expected = model(**{name: torch.from_numpy(example[name]) for name in names})
    difference = max(
        float(np.abs(run(example)[name] - expected[name].numpy()).max()) for name in output_names
    )
    fused_ops = ", ".join(f"{op} {n}" for op, n in fusions.items())
    print(
        f"ONNX Runtime {request['task']} {request.get('size', '')}: fused {fused_ops}; "
        f"max |ONNX Runtime - PyTorch| {difference:.1e}",
        file=sys.stderr,
    )
    if difference > 1e-4:
        raise SystemExit(f"the fused ONNX model is {difference:.1e} away from PyTorch's")
    return run


def masked_lm_encoder(tokenizer, max_length, tensors):
    """texts -> the fill-mask rows' inputs (`tensors`: "pt" or "np"), padded to the longest."""
    return lambda texts: tokenizer(
        texts, padding=True, truncation=True, max_length=max_length, return_tensors=tensors
    )


def masked_lm_call(model, tokenizer, max_length):
    """texts -> (top-k probabilities, top-k ids) [masks, k] of every [MASK], as numpy."""
    import torch

    encoder = masked_lm_encoder(tokenizer, max_length, "pt")

    def call(texts):
        encoded = encoder(texts)
        with torch.inference_mode():
            logits = model(**encoded).logits
            masked = logits[encoded["input_ids"] == tokenizer.mask_token_id]
            probabilities, ids = masked.softmax(-1).topk(TOP_K, dim=-1)
        return probabilities.numpy(), ids.numpy()

    return call


def fill_mask_model(request):
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(request["hf_dir"])
    model = transformers.BertForMaskedLM.from_pretrained(request["hf_dir"]).eval()
    return masked_lm_call(model, tokenizer, request["seq_length"])


def ort_fill_mask(request):
    """The fill_mask_model row on ONNX Runtime: the same BertForMaskedLM exported and fused; the
    [MASK] positions' logits gathered, softmax and top 5 in NumPy."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(request["hf_dir"])
    model = transformers.BertForMaskedLM.from_pretrained(
        request["hf_dir"], attn_implementation="eager"
    ).eval()

    encoder = masked_lm_encoder(tokenizer, request["seq_length"], "np")
    run = ort_session(model, encoder, ("logits",), request)

    def call(texts):
        inputs = encoder(texts)
        masked = run(inputs)["logits"][inputs["input_ids"] == tokenizer.mask_token_id]
        ids = np.argpartition(-masked, TOP_K, axis=-1)[:, :TOP_K]
        probabilities = np.take_along_axis(softmax(masked), ids, -1)
        order = np.argsort(-probabilities, axis=-1)
        return np.take_along_axis(probabilities, order, -1), np.take_along_axis(ids, order, -1)

    return call


def fill_mask_pipeline(request):
    import transformers

    pipe = transformers.pipeline(
        "fill-mask",
        model=request["hf_dir"],
        top_k=TOP_K,
        device="cpu",
        tokenizer_kwargs=dict(truncation=True, max_length=request["seq_length"]),
    )
    return lambda texts: pipe(texts, batch_size=len(texts))


def pretraining(request):
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.BertForPreTraining(transformers.BertConfig(**request["shape"])).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    batch, seq, vocab = request["batch"], request["seq_length"], request["shape"]["vocab_size"]
    batches = [
        pretraining_batch(batch, seq, vocab, request["predictions"])
        for _ in range(request["distinct_batches"])
    ]
    state = {"step": 0}

    def train(steps):
        for _ in range(steps):
            inputs = batches[state["step"] % len(batches)]
            state["step"] += 1
            model(**inputs).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()

    train(2)
    return train


def pretraining_batch(batch, seq, vocab, predictions):
    """Random BertForPreTraining inputs: segments A then B, `predictions` labelled positions per
    row (never [CLS]'s), the other labels -100 (ignored), random next-sentence labels."""
    import torch

    labels = torch.full((batch, seq), -100)
    positions = torch.rand(batch, seq - 1).argsort(dim=1)[:, :predictions] + 1
    labels.scatter_(1, positions, torch.randint(5, vocab, (batch, predictions)))
    token_type_ids = torch.zeros(batch, seq, dtype=torch.long)
    token_type_ids[:, seq // 2 :] = 1
    return {
        "input_ids": torch.randint(5, vocab, (batch, seq)),
        "attention_mask": torch.ones(batch, seq, dtype=torch.long),
        "token_type_ids": token_type_ids,
        "labels": labels,
        "next_sentence_label": torch.randint(0, 2, (batch,)),
    }


def prepare_fill_mask(request):
    import torch
    import transformers

    torch.manual_seed(0)
    hf_dir, minilm = request["hf_dir"], request["minilm"]
    if request["size"] == "minilm":
        # MiniLM's checkpoint is a BertModel: its encoder loads, the MLM head is initialized.
        model = transformers.BertForMaskedLM.from_pretrained(minilm)
    else:
        model = transformers.BertForMaskedLM(transformers.BertConfig(**request["shape"]))
    model.eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm)
    model.save_pretrained(hf_dir, safe_serialization=True)
    tokenizer.save_pretrained(hf_dir)
    for name in ("vocab.txt", "tokenizer_config.json"):  # what bert_tf's converter reads
        if not os.path.exists(os.path.join(hf_dir, name)):
            shutil.copy(os.path.join(minilm, name), hf_dir)
    _, ids = masked_lm_call(model, tokenizer, 512)(request["check_texts"])
    return ids.tolist()  # one [MASK] per text: [text][k]


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
