"""bench_inference's Hugging Face peer: run by a Python with torch + transformers (`--torch_python`).

    TORCH_PYTHON benchmarks/hf_peer.py '{"task": ..., ...}'

It writes one JSON line (its torch and transformers versions), then serves latency.serve_timed_calls
on stdin/stdout: one JSON list of texts in, the seconds its call took out, until stdin closes.
Tasks (the request's "task"), on the request's "threads" (default 2):
  - classifier: BertForSequenceClassification (MiniLM's weights, or BERT-base's shape at random),
    its fast tokenizer, dynamic padding, softmax;
  - ner, squad, multiple_choice: as the classifier, with BertForTokenClassification (argmax per
    token), BertForQuestionAnswering (argmax of the start and end logits) or BertForMultipleChoice
    (softmax), on the request task_requests.py makes from each text;
  - fill_mask_model: BertForMaskedLM from "hf_dir" called directly with its fast tokenizer
    (padding=True), the [MASK] positions' logits gathered, softmax, top 5;
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

TOP_K = 5


def main(request):
    # stdout carries the replies alone: whatever the libraries print goes to stderr.
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import torch
    import transformers

    torch.set_num_threads(request.get("threads", 2))
    task = request["task"]
    if task == "prepare_fill_mask":
        ids = prepare_fill_mask(request)
        print(json.dumps(ids), file=protocol, flush=True)
        return
    call = {
        **{kind: task_model for kind in TASK_MODELS},
        "fill_mask_model": fill_mask_model,
        "fill_mask_pipeline": fill_mask_pipeline,
        "pretraining": pretraining,
    }[task](request)
    from latency import serve_timed_calls

    versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
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
    import torch
    import transformers
    from task_requests import request as task_request

    kind = request["task"]
    class_name, num_labels = TASK_MODELS[kind]
    model_class = getattr(transformers, class_name)
    tokenizer = transformers.BertTokenizerFast(request["vocab"], do_lower_case=True)
    if request["size"] == "minilm":
        model = model_class.from_pretrained(request["minilm"], num_labels=num_labels)
    else:
        model = model_class(transformers.BertConfig(num_labels=num_labels, **request["shape"]))
    model.eval()
    encode = dict(padding=True, max_length=request["seq_length"], return_tensors="pt")

    def call(texts):
        inputs = task_request(kind, texts)
        if kind == "squad":
            encoded = tokenizer(
                inputs["question"], inputs["context"], truncation="only_second", **encode
            )
        elif kind == "multiple_choice":
            pairs = [(c, e) for c, ends in zip(inputs["context"], inputs["endings"]) for e in ends]
            encoded = tokenizer(*zip(*pairs), truncation=True, **encode)
            choices = len(inputs["endings"][0])
            encoded = {name: value.view(len(texts), choices, -1) for name, value in encoded.items()}
        else:
            encoded = tokenizer(inputs["text"], truncation=True, **encode)
        with torch.inference_mode():
            outputs = model(**encoded)
        if kind == "squad":
            return outputs.start_logits.argmax(-1).numpy(), outputs.end_logits.argmax(-1).numpy()
        if kind == "ner":
            return outputs.logits.argmax(-1).numpy()
        return outputs.logits.softmax(-1).numpy()

    return call


def masked_lm_call(model, tokenizer, max_length):
    """texts -> (top-k probabilities, top-k ids) [masks, k] of every [MASK], as numpy."""
    import torch

    def call(texts):
        encoded = tokenizer(
            texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt"
        )
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
