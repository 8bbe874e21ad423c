"""The Hugging Face side of bench_finetune_quality.py: one fine-tuning run in PyTorch, the usual recipe.

Run with a Python that has torch and transformers (not bert_tf's):

    /tmp/refvenv/bin/python benchmarks/hf_finetune_peer.py '{"task": "mc", ...}'

The recipe is what a Hugging Face user runs (the Trainer's defaults, written out as a loop): torch
AdamW (bias correction, epsilon 1e-8, weight decay 0.01 except biases and LayerNorm), the learning
rate warmed up over the first 10% of the steps and decayed linearly to 0, no gradient clipping,
randomly shuffled batches padded to their longest row. The tasks read the same files as bert_tf's
jobs: SWAG's CSV (multiple choice), a TSV of sentences or sentence pairs (classification), CoNLL
(NER), SQuAD v1.1 JSON (extractive QA: a span of at most MAX_ANSWER_PIECES pieces, the best sum of
start and end logits). The last line printed is a JSON object with the dev score, or for QA the
answers by question id, which the benchmark scores with bert_tf's port of the official script.

frozen_ner is the feature-based approach as a user writes it in PyTorch: the encoder frozen (no
dropout, no gradient), its last four hidden states concatenated into a 2-layer bidirectional LSTM
(PyTorch's initialisation, padding packed away) and a linear tagger, trained with plain Adam at a
constant rate: no warm-up or decay, no weight decay, no clipping, no dropout in the head.
"""

import csv
import json
import sys
import types

import torch
import transformers


def swag_rows(path):
    """(context, [four endings], label) per row of a SWAG-layout CSV, as bert_tf reads it."""
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            endings = [f"{row['sent2']} {row[f'ending{i}']}".strip() for i in range(4)]
            yield row["sent1"], endings, int(row["label"])


MAX_ANSWER_PIECES = 30  # run_squad's --max_answer_length default


def tsv_rows(path):
    """(text_a, text_b or None, label) per row of a classification TSV: (sentence1, sentence2,
    label) or (sentence, label) after the header."""
    with open(path) as f:
        rows = [line.rstrip("\n").split("\t") for line in f][1:]
    return [(*texts, None)[:2] + (int(y),) for *texts, y in rows]


def squad_questions(path):
    """(id, question, context, answer start, answer end) per question of a SQuAD v1.1 file: the
    first answer's character span."""
    with open(path) as f:
        articles = json.load(f)["data"]
    for article in articles:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                answer = qa["answers"][0]
                start = answer["answer_start"]
                yield (
                    qa["id"],
                    qa["question"],
                    paragraph["context"],
                    start,
                    start + len(answer["text"]),
                )


def conll_sentences(path):
    """(words, tags) per sentence of a CoNLL file: the first and last columns; a blank line ends a
    sentence."""
    sentences, words, tags = [], [], []
    with open(path) as f:
        for line in [*f, "\n"]:
            if line.strip():
                if line.startswith("-DOCSTART-"):
                    continue
                columns = line.split()
                words.append(columns[0])
                tags.append(columns[-1])
            elif words:
                sentences.append((words, tags))
                words, tags = [], []
    return sentences


def entities(tags):
    """The BIO chunks of a tag sequence as (type, start, end) triples (conlleval's rule)."""
    chunks, current = set(), None
    for i, tag in enumerate([*tags, "O"]):
        kind = tag[2:] if tag != "O" else None
        starts = tag.startswith("B-") or (
            tag.startswith("I-") and (not current or current[0] != kind)
        )
        if current and (tag == "O" or starts):
            chunks.add((current[0], current[1], i))
            current = None
        if starts:
            current = (kind, i)
    return chunks


class FrozenTagger(torch.nn.Module):
    """A frozen BERT's last four hidden states, concatenated, into a 2-layer BiLSTM and a tagger."""

    def __init__(self, model_dir, num_labels, units=256):
        super().__init__()
        self.bert = transformers.BertModel.from_pretrained(model_dir, add_pooling_layer=False)
        self.bert.requires_grad_(False)
        size = 4 * self.bert.config.hidden_size
        self.lstm = torch.nn.LSTM(size, units, num_layers=2, bidirectional=True, batch_first=True)
        self.tagger = torch.nn.Linear(2 * units, num_labels)

    def forward(self, input_ids, token_type_ids, attention_mask, labels=None):
        self.bert.eval()
        with torch.no_grad():
            states = self.bert(
                input_ids=input_ids,
                token_type_ids=token_type_ids,
                attention_mask=attention_mask,
                output_hidden_states=True,
            ).hidden_states
        features = torch.cat(states[-4:], dim=-1)
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            features, attention_mask.sum(1), batch_first=True, enforce_sorted=False
        )
        outputs, _ = self.lstm(packed)
        outputs, _ = torch.nn.utils.rnn.pad_packed_sequence(
            outputs, batch_first=True, total_length=features.shape[1]
        )
        logits = self.tagger(outputs)
        loss = None
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), labels.flatten(), ignore_index=-100
            )
        return types.SimpleNamespace(loss=loss, logits=logits)


class Task:
    """Reads one task's split into model inputs and scores predictions."""

    def __init__(self, p, tokenizer):
        self.p, self.tokenizer = p, tokenizer
        self.labels = p.get("labels")
        self.num_labels = 2
        self.tags = p["task"] in ("ner", "frozen_ner")

    def model(self, model_dir):
        kind = self.p["task"]
        if kind == "mc":
            return transformers.BertForMultipleChoice.from_pretrained(model_dir)
        if kind == "pair":
            return transformers.BertForSequenceClassification.from_pretrained(
                model_dir, num_labels=self.num_labels
            )
        if kind == "qa":
            return transformers.BertForQuestionAnswering.from_pretrained(model_dir)
        if kind == "frozen_ner":
            return FrozenTagger(model_dir, len(self.labels))
        return transformers.BertForTokenClassification.from_pretrained(
            model_dir, num_labels=len(self.labels)
        )

    def examples(self, path):
        """A list of feature dicts (unpadded)."""
        tok, length = self.tokenizer, self.p["max_seq_length"]
        kind = self.p["task"]
        if kind == "mc":
            out = []
            for context, endings, label in swag_rows(path):
                enc = tok([context] * 4, endings, truncation="longest_first", max_length=length)
                out.append({**enc, "labels": label})
            return out
        if kind == "pair":
            rows = tsv_rows(path)
            self.num_labels = max(self.num_labels, 1 + max(y for _, _, y in rows))
            return [
                {**tok(a, b, truncation="longest_first", max_length=length), "labels": y}
                for a, b, y in rows
            ]
        if kind == "qa":
            return list(self.squad_examples(path))
        out = []
        for words, tags in conll_sentences(path):
            enc = tok(words, is_split_into_words=True, truncation=True, max_length=length)
            previous, labels = None, []
            for word in enc.word_ids():
                # The first piece of each word carries its tag, as bert_tf's NER does.
                labels.append(
                    -100 if word is None or word == previous else self.labels.index(tags[word])
                )
                previous = word
            out.append({**enc, "labels": labels, "tags": tags})
        return out

    def squad_examples(self, path):
        """One window per question (the benchmark's contexts fit), the answer's first and last
        pieces as its labels; a question whose answer was cut off is left out of training."""
        for qid, question, context, start, end in squad_questions(path):
            enc = self.tokenizer(
                question,
                context,
                truncation="only_second",
                max_length=self.p["max_seq_length"],
                return_offsets_mapping=True,
            )
            offsets = [
                span if part == 1 else None
                for span, part in zip(enc.pop("offset_mapping"), enc.sequence_ids())
            ]
            first = [i for i, o in enumerate(offsets) if o and o[0] <= start < o[1]]
            last = [i for i, o in enumerate(offsets) if o and o[0] < end <= o[1]]
            labels = (first[0], last[0]) if first and last else None
            if path == self.p["train"] and labels is None:
                continue
            yield {**enc, "labels": labels, "id": qid, "context": context, "offsets": offsets}

    def answers(self, model, dev):
        """{question id: answer text}: the context span with the best start + end logits."""
        answers = {}
        with torch.inference_mode():
            for i in range(0, len(dev), 32):
                batch = dev[i : i + 32]
                tensors = self.collate(batch)
                del tensors["start_positions"], tensors["end_positions"]
                output = model(**tensors)
                for ex, starts, ends in zip(batch, output.start_logits, output.end_logits):
                    n = len(ex["offsets"])
                    in_context = torch.tensor([o is not None for o in ex["offsets"]])
                    scores = starts[:n, None] + ends[None, :n]
                    allowed = torch.triu(torch.ones(n, n, dtype=torch.bool))
                    allowed &= ~torch.triu(allowed, diagonal=MAX_ANSWER_PIECES)
                    allowed &= in_context[:, None] & in_context[None, :]
                    best = int(scores.masked_fill(~allowed, float("-inf")).argmax())
                    first, last = ex["offsets"][best // n], ex["offsets"][best % n]
                    answers[ex["id"]] = ex["context"][first[0] : last[1]]
        return answers

    def collate(self, batch):
        """Pads a batch to its longest row."""
        kind = self.p["task"]
        keys = ("input_ids", "token_type_ids", "attention_mask")
        if kind == "mc":
            longest = max(len(ids) for ex in batch for ids in ex["input_ids"])
            tensors = {
                k: torch.tensor(
                    [[row + [0] * (longest - len(row)) for row in ex[k]] for ex in batch]
                )
                for k in keys
            }
            tensors["labels"] = torch.tensor([ex["labels"] for ex in batch])
            return tensors
        longest = max(len(ex["input_ids"]) for ex in batch)
        tensors = {
            k: torch.tensor([ex[k] + [0] * (longest - len(ex[k])) for ex in batch]) for k in keys
        }
        if kind == "pair":
            tensors["labels"] = torch.tensor([ex["labels"] for ex in batch])
        elif kind == "qa":
            spans = [ex["labels"] or (0, 0) for ex in batch]
            tensors["start_positions"] = torch.tensor([first for first, _ in spans])
            tensors["end_positions"] = torch.tensor([last for _, last in spans])
        else:
            tensors["labels"] = torch.tensor(
                [ex["labels"] + [-100] * (longest - len(ex["labels"])) for ex in batch]
            )
        return tensors

    def score(self, model, dev):
        """Dev accuracy (mc, pair) or entity F1 (ner, frozen_ner)."""
        correct = gold_count = predicted_count = 0
        with torch.inference_mode():
            for i in range(0, len(dev), 32):
                batch = dev[i : i + 32]
                tensors = self.collate(batch)
                labels = tensors.pop("labels")
                predicted = model(**tensors).logits.argmax(-1)
                if not self.tags:
                    correct += int((predicted == labels).sum())
                    continue
                for ex, row, gold_row in zip(batch, predicted.tolist(), labels.tolist()):
                    words = [self.labels[t] for t, g in zip(row, gold_row) if g != -100]
                    words += ["O"] * (len(ex["tags"]) - len(words))  # cut words are predicted O
                    gold, guess = entities(ex["tags"]), entities(words)
                    correct += len(gold & guess)
                    gold_count += len(gold)
                    predicted_count += len(guess)
        if not self.tags:
            return correct / len(dev)
        precision = correct / predicted_count if predicted_count else 0.0
        recall = correct / gold_count if gold_count else 0.0
        return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def main(p):
    torch.set_num_threads(p["threads"])
    torch.manual_seed(p["seed"])
    tokenizer = transformers.BertTokenizerFast(p["vocab_file"], do_lower_case=True)
    task = Task(p, tokenizer)
    train, dev = task.examples(p["train"]), task.examples(p["dev"])
    model = task.model(p["model_dir"])
    steps = max(1, int(len(train) / p["batch_size"] * p["epochs"]))
    no_decay = ("bias", "LayerNorm.weight")
    named = list(model.named_parameters())
    groups = [
        {
            "params": [w for n, w in named if not any(k in n for k in no_decay)],
            "weight_decay": 0.01,
        },
        {"params": [w for n, w in named if any(k in n for k in no_decay)], "weight_decay": 0.0},
    ]
    if p["task"] == "frozen_ner":
        trainable = [w for w in model.parameters() if w.requires_grad]
        optimizer = torch.optim.Adam(trainable, lr=p["learning_rate"])
        schedule = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0)
    else:
        optimizer = torch.optim.AdamW(groups, lr=p["learning_rate"], eps=1e-8)
        schedule = transformers.get_linear_schedule_with_warmup(optimizer, int(steps * 0.1), steps)
    generator = torch.Generator().manual_seed(p["seed"])
    loader = torch.utils.data.DataLoader(
        train,
        batch_size=p["batch_size"],
        shuffle=True,
        drop_last=True,
        collate_fn=task.collate,
        generator=generator,
    )
    model.train()
    step = 0
    while step < steps:
        for batch in loader:
            model(**batch).loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            step += 1
            if step == steps:
                break
    model.eval()
    if p["task"] == "qa":
        print(json.dumps({"predictions": task.answers(model, dev), "steps": steps}))
    else:
        print(json.dumps({"score": task.score(model, dev), "steps": steps}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
