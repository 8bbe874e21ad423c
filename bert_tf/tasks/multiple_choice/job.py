"""Multiple choice's side of a fine-tuning run: SWAG-layout splits in, accuracy and choices out.

run_multiple_choice reads the splits first (`read_splits`: before TensorFlow starts, a missing or
unlabelled split fails at once) and maps its flags onto a MultipleChoiceJob, which
bert_tf.training.finetuning.run drives: `prepare` returns the model's TaskSpec with the training
features; `evaluate_and_predict` scores the dev split's accuracy and writes the test split's
choice probabilities.
"""

import tensorflow as tf

from bert_tf.tasks import data_files, heads, models, packing
from bert_tf.tasks.multiple_choice import data as multiple_choice


def read_splits(splits, data_dir="", tfds="", tfds_data_dir=""):
    """{split: examples} from `data_dir` (SWAG's CSV files) or, with `tfds`, TensorFlow Datasets; a
    missing or empty train/dev split, or one with an unlabelled row, is a UsageError."""
    result = {}
    for split in splits:
        if tfds:
            examples, source = multiple_choice.read_tfds_split(tfds, split, tfds_data_dir or None)
        else:
            examples, source = multiple_choice.read_split(data_dir, split)
        print(f"{split}: {len(examples)} examples from {source}", flush=True)
        result[split] = data_files.require_examples(examples, source, split)
        if split != "test" and any(example.label is None for example in examples):
            raise data_files.DataFormatError(
                f"{source}: the {split} split needs a label in every row"
            )
    return result


class MultipleChoiceJob:
    """A multiple choice task (`task_name`) fine-tuned on `splits` (read_splits' result);
    `head_fields` are the TaskSpec's head fields."""

    eval_title = "Eval results"

    def __init__(self, task_name, splits, max_seq_length, head_fields):
        self.task_name = task_name
        self.splits = splits
        self.max_seq_length = max_seq_length
        self.head_fields = dict(head_fields)

    def prepare(self, config, source):
        """Returns (TaskSpec, TrainData or None) of the splits read."""
        self.config = config
        self.tokenizer = source.tokenizer()
        spec = models.TaskSpec(
            kind="multiple_choice",
            max_seq_length=self.max_seq_length,
            is_pair=True,
            task_name=self.task_name,
            **self.head_fields,
        )
        if not config.do_train:
            return spec, None
        return spec, packing.TrainData(self.features_of("train"), len(self.splits["train"]))

    def selection_key(self):
        """The eval result that ranks restarts (--num_restarts); a usage error without --do_eval."""
        return data_files.dev_score("eval_accuracy", self.config.do_eval)

    def features_of(self, split):
        return multiple_choice.convert_examples(
            self.splits[split], self.tokenizer, self.max_seq_length
        )

    def evaluate_and_predict(self, tuner, final=True):
        """The dev split's accuracy and loss; when `final`, the test split's choice probabilities,
        written by the chief."""
        config, eval_results, prediction_files = self.config, {}, []
        if config.do_eval:
            outputs = tuner.predict(
                self.features_of("dev"), config.eval_batch_size, has_labels=True
            )
            eval_results = {
                "eval_accuracy": multiple_choice.accuracy(
                    self.splits["dev"], outputs["logits"].argmax(-1)
                ),
                "eval_loss": heads.mean_loss(outputs),
                "eval_examples": len(self.splits["dev"]),
            }
        if config.do_predict and final:
            outputs = tuner.predict(self.features_of("test"), config.predict_batch_size)
            if tuner.is_chief:
                probabilities = tf.nn.softmax(outputs["logits"], axis=-1).numpy()
                prediction_files = multiple_choice.write_predictions(
                    config.output_dir, "test", self.splits["test"], probabilities
                )
            print("predictions written to " + ", ".join(prediction_files), flush=True)
        return eval_results, prediction_files
