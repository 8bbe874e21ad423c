"""NER's side of a fine-tuning run: CoNLL-2003 files in, entity scores and tagged files out.

run_ner maps its flags onto a NerJob, which bert_tf.training.finetuning.run drives: `prepare` reads
the split files, settles the tags and returns the model's TaskSpec with the training features;
`evaluate_and_predict` tags the dev and test sentences word by word (words cut by max_seq_length
are tagged O), scores the dev tags by entity (conlleval's precision, recall and F1) and writes
eval_predictions.txt and test_predictions.txt in CoNLL's layout.
"""

import os

from bert_tf.tasks import data_files, heads, models, packing
from bert_tf.tasks.ner import data as ner
from bert_tf.tasks.ner import metrics as ner_metrics


def resolve_labels(train, source, output_dir):
    """The tags of the training data, or (without training) those of the fine-tuned model."""
    if train is not None:
        return ner.label_list(train)
    return models.finetuned_labels(
        "ner",
        source,
        output_dir,
        unknown="the tags are unknown without --do_train: give an --init_checkpoint or "
        "--output_dir fine-tuned for NER",
    )


class NerJob:
    """Tagging fine-tuned on `paths` ({split: CoNLL file} for the splits the run reads: train, dev,
    test); `head_fields` are the TaskSpec's head fields (a feature-based run's features too)."""

    eval_title = "Eval results"

    def __init__(self, paths, max_seq_length, head_fields):
        self.paths = dict(paths)
        self.max_seq_length = max_seq_length
        self.head_fields = dict(head_fields)

    def prepare(self, config, source):
        """Reads the split files and settles the tags; returns (TaskSpec, TrainData or None)."""
        self.config = config
        self.tokenizer = source.tokenizer()
        self.sentences = {}
        for split, path in self.paths.items():
            self.sentences[split] = ner.read_conll(path)
            print(f"{split}: {len(self.sentences[split])} sentences from {path}", flush=True)
            data_files.require_examples(self.sentences[split], path, split)
        self.labels = resolve_labels(self.sentences.get("train"), source, config.output_dir)
        if config.do_eval:
            ner.check_labels(self.sentences["dev"], self.labels)
        spec = models.TaskSpec(
            kind="ner",
            labels=self.labels,
            max_seq_length=self.max_seq_length,
            task_name="ner",
            **self.head_fields,
        )
        if not config.do_train:
            return spec, None
        train = self.sentences["train"]
        features = ner.convert_sentences(train, self.tokenizer, self.max_seq_length, self.labels)
        return spec, packing.TrainData(features.arrays, len(train))

    def selection_key(self):
        """The eval result that ranks restarts (--num_restarts); a usage error without --do_eval."""
        return data_files.dev_score("eval_f1", self.config.do_eval)

    def predict_tags(self, tuner, split, batch_size, has_labels):
        """(per-sentence word tags, model outputs) of a split; words cut by max_seq_length are tagged O."""
        sentences = self.sentences[split]
        # Test tags may be anything (or placeholders): they are written back, never mapped to ids.
        labels = self.labels if has_labels else None
        features = ner.convert_sentences(sentences, self.tokenizer, self.max_seq_length, labels)
        outputs = tuner.predict(features.arrays, batch_size, has_labels=has_labels)
        tags = ner.word_predictions(features, outputs["predicted_ids"], self.labels)
        return ner.pad_predictions(sentences, tags), outputs

    def write_tags(self, file_name, split, predicted):
        """The split's sentences with the predicted tags, in CoNLL's layout; returns the path."""
        return ner.write_conll_predictions(
            os.path.join(self.config.output_dir, file_name), self.sentences[split], predicted
        )

    def evaluate_and_predict(self, tuner, final=True):
        """The dev split's entity scores (and, when `final`, its tagged file) and the tagged test
        file; the chief writes the files."""
        config, eval_results, prediction_files = self.config, {}, []
        if config.do_eval:
            predicted, outputs = self.predict_tags(
                tuner, "dev", config.eval_batch_size, has_labels=True
            )
            scores = ner_metrics.entity_scores([s.tags for s in self.sentences["dev"]], predicted)
            eval_results = {
                f"eval_{name}": scores[name] for name in ("precision", "recall", "f1", "accuracy")
            }
            eval_results.update(
                eval_loss=heads.mean_loss(outputs),
                eval_gold_entities=scores["gold_entities"],
                eval_predicted_entities=scores["predicted_entities"],
                eval_correct_entities=scores["correct_entities"],
            )
            if tuner.is_chief and final:
                prediction_files.append(self.write_tags("eval_predictions.txt", "dev", predicted))
            print("\n".join(ner_metrics.eval_result_lines(scores)), flush=True)
        if config.do_predict and final:
            predicted, _ = self.predict_tags(
                tuner, "test", config.predict_batch_size, has_labels=False
            )
            if tuner.is_chief:
                prediction_files.append(self.write_tags("test_predictions.txt", "test", predicted))
            print(
                f"predictions written to {prediction_files[-1] if prediction_files else '(chief only)'}",
                flush=True,
            )
        return eval_results, prediction_files
