"""SQuAD's side of a fine-tuning run: the JSON (or tfds) questions in, answers and official metrics out.

run_squad maps its flags onto a SquadJob, which bert_tf.training.finetuning.run drives: `prepare`
reads the predict questions first (a broken file fails before training), then the training ones,
summarizing the answers it had to skip, and cuts both into windows; `evaluate_and_predict` turns
the logits into answers (predictions.json, nbest_predictions.json and, for v2, null_odds.json) and,
when the predict data has answers, scores them with the official scripts' metrics.
"""

import dataclasses

from bert_tf.runtime import io_utils
from bert_tf.tasks import data_files, models, packing
from bert_tf.tasks.squad import data as squad
from bert_tf.tasks.squad import metrics as squad_metrics
from bert_tf.tasks.squad import postprocess as squad_postprocess


@dataclasses.dataclass(kw_only=True)
class SquadJob:
    """SQuAD fine-tuned on `train_file` and predicting `predict_file` (or both from `tfds`:
    squad/v1.1 or squad/v2.0), with the original's windowing and answer search (run_squad's flags
    of the same names say what each does); `head_fields` are the TaskSpec's head fields."""

    head_fields: dict
    train_file: str
    predict_file: str
    tfds: str
    tfds_data_dir: str
    version_2_with_negative: bool
    max_seq_length: int
    doc_stride: int
    max_query_length: int
    n_best_size: int
    max_answer_length: int
    null_score_diff_threshold: float

    eval_title = "Eval results (official SQuAD metrics)"

    def read_examples(self, is_training):
        """(examples, ReadStats, gold answers by question id) of the training or predict data."""
        if self.tfds:
            return squad.read_tfds(
                self.tfds,
                "train" if is_training else "dev",
                is_training,
                data_dir=self.tfds_data_dir or None,
            )
        path = self.train_file if is_training else self.predict_file
        examples, stats = squad.read_squad_json(path, is_training, self.version_2_with_negative)
        gold = None if is_training else squad_metrics.gold_answers_from_json(path)
        return examples, stats, gold

    def windows(self, examples, is_training):
        """The SquadFeatures of `examples`: each question with a window of its context."""
        return squad.convert_examples(
            examples,
            self.tokenizer,
            is_training=is_training,
            max_seq_length=self.max_seq_length,
            doc_stride=self.doc_stride,
            max_query_length=self.max_query_length,
        )

    def prepare(self, config, source):
        """Reads the questions `config` needs; returns (TaskSpec, TrainData or None)."""
        self.config = config
        self.tokenizer = source.tokenizer()
        self.do_lower_case = source.config.do_lower_case
        spec = models.TaskSpec(
            kind="squad",
            max_seq_length=self.max_seq_length,
            version_2_with_negative=bool(self.version_2_with_negative),
            task_name="squad",
            doc_stride=self.doc_stride,
            max_query_length=self.max_query_length,
            **self.head_fields,
        )
        self.predicting = config.do_predict or config.do_eval
        if self.predicting:  # read first: a broken predict file fails before training
            self.eval_examples, _, self.gold = self.read_examples(is_training=False)
            print(f"predict: {len(self.eval_examples)} questions", flush=True)
        if not config.do_train:
            return spec, None
        examples, stats, _ = self.read_examples(is_training=True)
        print(f"train: {stats.summary()}", flush=True)
        if not examples:
            raise io_utils.UsageError("no usable training question (see the summary above)")
        features = self.windows(examples, is_training=True)
        print(f"train: {len(features)} windows of {len(examples)} questions", flush=True)
        # The original counts steps in questions, not windows.
        return spec, packing.TrainData(
            squad.feature_arrays(features, is_training=True), len(examples)
        )

    def selection_key(self):
        """The official F1 on the predict file, which ranks restarts (--num_restarts): a usage error
        unless the run predicts a file with answers."""
        has_answers = self.predicting and bool(self.gold and any(self.gold.values()))
        return data_files.dev_score(
            "f1", has_answers, needs="--do_predict (or --do_eval) on a predict file with answers"
        )

    def evaluate_and_predict(self, tuner, final=True):
        """The answers to the predict questions (written by the chief when `final`) and, where the
        data has answers, the official metrics."""
        if not self.predicting:
            return {}, []
        features = self.windows(self.eval_examples, is_training=False)
        outputs = tuner.predict(
            squad.feature_arrays(features, is_training=False), self.config.predict_batch_size
        )
        results = [
            squad.RawResult(f.unique_id, start, end)
            for f, start, end in zip(features, outputs["start_logits"], outputs["end_logits"])
        ]
        predictions, nbest, null_odds = squad_postprocess.postprocess(
            self.eval_examples,
            features,
            results,
            n_best_size=self.n_best_size,
            max_answer_length=self.max_answer_length,
            do_lower_case=self.do_lower_case,
            version_2_with_negative=self.version_2_with_negative,
            null_score_diff_threshold=self.null_score_diff_threshold,
        )
        v2_odds = null_odds if self.version_2_with_negative else None
        prediction_files = []
        if tuner.is_chief and final:
            prediction_files = list(
                squad_postprocess.write_predictions(
                    self.config.output_dir, predictions, nbest, v2_odds
                ).values()
            )
            print("predictions written to " + ", ".join(prediction_files), flush=True)
        if not (self.gold and any(self.gold.values())):
            return {}, prediction_files
        # The official scripts' key names: v1.1 exact_match and f1; v2.0 exact, f1, total, HasAns_*...
        if self.version_2_with_negative:
            return squad_metrics.evaluate_v2(self.gold, predictions, v2_odds), prediction_files
        return squad_metrics.evaluate_v1(self.gold, predictions), prediction_files
