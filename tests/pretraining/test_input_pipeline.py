"""tf.data readers against records written in the original pretraining schema by helpers_records."""

import numpy as np
import pytest
import tensorflow as tf
from helpers_records import write_numbered_records, write_real_text_records

from bert_tf.pretraining import input_pipeline
from bert_tf.tasks import packing
from bert_tf.tokenization import tokenizer_rules

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow


@pytest.fixture
def numbered_files(tmp_path):
    return [
        write_numbered_records(str(tmp_path / f"part-{i}.tfrecord"), 100 * i, 10) for i in range(4)
    ]


def first_ids(dataset, num_batches=None):
    """The record numbers (first input id) of a dataset's batches, flattened."""
    numbers = []
    for i, batch in enumerate(dataset):
        if num_batches is not None and i >= num_batches:
            break
        numbers.extend(batch["input_word_ids"][:, 0].numpy().tolist())
    return numbers


def test_batches_have_static_int32_shapes_and_the_written_values(numbered_files):
    dataset = input_pipeline.pretraining_dataset(numbered_files[:1], 4, 8, 3, is_training=False)
    specs = dataset.element_spec
    assert specs["input_word_ids"].shape.as_list() == [4, 8]
    assert specs["masked_lm_positions"].shape.as_list() == [4, 3]
    assert specs["next_sentence_labels"].shape.as_list() == [4]
    for key in (
        "input_word_ids",
        "input_mask",
        "input_type_ids",
        "masked_lm_positions",
        "masked_lm_ids",
        "next_sentence_labels",
    ):
        assert specs[key].dtype == tf.int32, key
    assert specs["masked_lm_weights"].dtype == tf.float32
    batches = list(dataset)
    assert len(batches) == 2  # 10 records, batch 4, drop_remainder.
    first = batches[0]
    np.testing.assert_array_equal(first["input_word_ids"][1], [1, 7, 7, 7, 7, 7, 7, 0])
    np.testing.assert_array_equal(first["input_mask"][1], [1, 1, 1, 1, 1, 1, 1, 0])
    np.testing.assert_array_equal(first["masked_lm_positions"][1], [1, 2, 0])
    np.testing.assert_array_equal(first["masked_lm_ids"][1], [8, 9, 0])
    np.testing.assert_array_equal(first["masked_lm_weights"][1], [1.0, 1.0, 0.0])
    np.testing.assert_array_equal(first["next_sentence_labels"], [0, 1, 0, 1])


def test_every_input_pipeline_runs_without_the_autotuner(numbered_files):
    # With it, deleting an iterator waited seconds for its thread (tf_data.without_autotune).
    mask = np.ones((8, 16), np.int32)
    features = {
        "input_ids": mask,
        "input_mask": mask,
        "segment_ids": 0 * mask,
        "label_ids": mask[:, 0],
    }
    datasets = [
        input_pipeline.pretraining_dataset(numbered_files, 4, 8, 3, is_training=training, seed=1)
        for training in (True, False)
    ] + [
        packing.features_dataset(features, 4, is_training=training, seed=1, length_bucket=bucket)
        for training in (True, False)
        for bucket in (None, 1)
    ]
    for dataset in datasets:
        assert dataset.options().autotune.enabled is False
        assert next(iter(dataset))["input_mask"].shape[0] == 4
    # The pretraining reader still sets its order's determinism: fixed with a seed or for eval.
    assert datasets[0].options().deterministic is True
    assert datasets[1].options().deterministic is True
    unseeded = input_pipeline.pretraining_dataset(numbered_files, 4, 8, 3, is_training=True)
    assert unseeded.options().deterministic is False


def test_each_worker_reads_its_own_files(numbered_files):
    seen = []
    for worker in range(2):
        context = tf.distribute.InputContext(
            num_input_pipelines=2, input_pipeline_id=worker, num_replicas_in_sync=2
        )
        dataset = input_pipeline.pretraining_dataset(
            numbered_files, 5, 8, 3, is_training=True, input_context=context, seed=1
        )
        numbers = first_ids(dataset, num_batches=8)  # 40 draws from this worker's 20 records.
        seen.append({n // 100 for n in numbers})
        assert len(seen[-1]) == 2
        assert set(numbers) <= {n for f in seen[-1] for n in range(100 * f, 100 * f + 10)}
        assert len(set(numbers)) >= 15
    assert seen[0].isdisjoint(seen[1]) and seen[0] | seen[1] == {0, 1, 2, 3}


def test_fewer_files_than_workers_splits_records(tmp_path):
    path = write_numbered_records(str(tmp_path / "one.tfrecord"), 0, 12)
    halves = []
    for worker in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=worker)
        halves.append(
            set(
                first_ids(
                    input_pipeline.pretraining_dataset(
                        [path], 2, 8, 3, False, input_context=context
                    )
                )
            )
        )
    assert halves[0].isdisjoint(halves[1]) and halves[0] | halves[1] == set(range(12))


def test_training_order_is_shuffled_repeated_and_deterministic_with_a_seed(numbered_files):
    def order(seed):
        return first_ids(
            input_pipeline.pretraining_dataset(numbered_files, 4, 8, 3, True, seed=seed), 20
        )

    first = order(7)
    assert first == order(7)
    assert first != order(8)
    assert first[:40] != sorted(first[:40])
    # Repeated before the record shuffle (as the original), so epochs blend; 80 draws see most records.
    assert set(first) <= {100 * f + i for f in range(4) for i in range(10)}
    assert len(set(first)) >= 30


def test_length_mismatch_names_both_values(numbered_files):
    with pytest.raises(
        input_pipeline.RecordFormatError, match=r"'input_ids' has length 8 but --max_seq_length=128"
    ):
        input_pipeline.check_record_lengths(numbered_files[0], 128, 3)
    with pytest.raises(
        input_pipeline.RecordFormatError,
        match=r"'masked_lm_positions' has length 3 but --max_predictions_per_seq=20",
    ):
        input_pipeline.check_record_lengths(numbered_files[0], 8, 20)
    input_pipeline.check_record_lengths(numbered_files[0], 8, 3)


def test_missing_feature_and_empty_file_are_named(tmp_path):
    path = str(tmp_path / "other.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        feature = tf.train.Feature(int64_list=tf.train.Int64List(value=[1, 2]))
        writer.write(
            tf.train.Example(
                features=tf.train.Features(feature={"input_ids": feature})
            ).SerializeToString()
        )
    with pytest.raises(input_pipeline.RecordFormatError, match="no feature 'input_mask'"):
        input_pipeline.check_record_lengths(path, 2, 3)
    empty = str(tmp_path / "empty.tfrecord")
    with tf.io.TFRecordWriter(empty):
        pass
    with pytest.raises(input_pipeline.RecordFormatError, match="contains no records"):
        input_pipeline.check_record_lengths(empty, 2, 3)
    text = tmp_path / "notes.txt"
    text.write_text("plain text, not records\n" * 4)
    with pytest.raises(input_pipeline.RecordFormatError, match="notes.txt: not a TFRecord file"):
        input_pipeline.check_record_lengths(str(text), 2, 3)
    garbage = str(tmp_path / "garbage.tfrecord")
    with tf.io.TFRecordWriter(garbage) as writer:
        writer.write(b"\xff\xfe not a proto")
    with pytest.raises(
        input_pipeline.RecordFormatError,
        match="garbage.tfrecord: its first record is not a tf.train.Example",
    ):
        input_pipeline.check_record_lengths(garbage, 2, 3)


def test_every_files_first_record_is_checked_and_empty_files_are_skipped(tmp_path, caplog):
    # Only the first file used to be checked: a seq-16 file after a seq-8 one died in the first loop.
    short = write_numbered_records(str(tmp_path / "a-short.tfrecord"), 0, 4, max_seq_length=8)
    long = write_numbered_records(str(tmp_path / "b-long.tfrecord"), 0, 4, max_seq_length=16)
    with pytest.raises(
        input_pipeline.RecordFormatError,
        match=r"--input_file: .*b-long.tfrecord: feature 'input_ids' has length 16 but --max_seq_length=8",
    ):
        input_pipeline.check_input_files([short, long], 8, 3, "--input_file")
    # An empty file is skipped with a warning (it was refused), and only when all are empty is it an error.
    empty = str(tmp_path / "0-empty.tfrecord")
    with tf.io.TFRecordWriter(empty):
        pass
    with caplog.at_level("WARNING"):
        assert input_pipeline.check_input_files([empty, short], 8, 3, "--input_file") == [short]
    assert "0-empty.tfrecord: contains no records; skipped" in caplog.text
    with pytest.raises(
        input_pipeline.RecordFormatError, match=r"--eval_input_file: all 2 files contain no records"
    ):
        input_pipeline.check_input_files([empty, empty], 8, 3, "--eval_input_file")


def test_dynamic_masking_remasks_real_records(tmp_path):
    files, vocab_file = write_real_text_records(
        str(tmp_path), max_seq_length=32, max_predictions_per_seq=5, num_files=1
    )
    masking = input_pipeline.DynamicMasking.from_vocab_file(vocab_file)
    static = input_pipeline.pretraining_dataset(files, 16, 32, 5, is_training=False)
    dynamic = input_pipeline.pretraining_dataset(
        files, 16, 32, 5, is_training=False, dynamic_masking=masking
    )
    assert dynamic.element_spec["input_word_ids"].shape.as_list() == [16, 32]
    total_selected = total_candidates = 0
    changed = False
    for before, after in zip(static.take(4), dynamic.take(4)):
        original = input_pipeline._unmasked_input_ids(before).numpy()
        ids, positions = after["input_word_ids"].numpy(), after["masked_lm_positions"].numpy()
        labels, weights = after["masked_lm_ids"].numpy(), after["masked_lm_weights"].numpy()
        mask = before["input_mask"].numpy()
        np.testing.assert_array_equal(after["input_mask"], mask)
        for row in range(ids.shape[0]):
            real = weights[row] > 0
            chosen = positions[row][real]
            assert len(chosen) <= 5 and len(set(chosen)) == len(chosen)
            np.testing.assert_array_equal(
                labels[row][real], original[row][chosen]
            )  # Labels are the true ids.
            assert not set(original[row][chosen]) & set(masking.unmaskable_ids)
            untouched = np.ones(32, bool)
            untouched[chosen] = False
            np.testing.assert_array_equal(ids[row][untouched], original[row][untouched])
            total_selected += len(chosen)
            total_candidates += int(mask[row].sum()) - 3
        changed |= not np.array_equal(positions, before["masked_lm_positions"].numpy())
    assert changed
    # About 15% of the maskable tokens (ceil, capped at max_predictions_per_seq).
    assert 0.1 < total_selected / total_candidates < 0.25


def test_real_text_records_round_trip(tmp_path):
    files, vocab_file = write_real_text_records(str(tmp_path), num_files=2)
    vocab = tokenizer_rules.load_vocab(vocab_file)
    inverse = {i: t for t, i in vocab.items()}
    batch = next(iter(input_pipeline.pretraining_dataset(files, 8, 32, 5, is_training=False)))
    for row in range(8):
        tokens = [
            inverse[i]
            for i, m in zip(batch["input_word_ids"][row].numpy(), batch["input_mask"][row].numpy())
            if m
        ]
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and tokens.count("[SEP]") == 2
    assert len(vocab) < 6000


def test_dynamic_masking_iterator_checkpoints_and_resumes_to_the_same_masks(tmp_path):
    # tensorflow_text's stateful masking made saving the iterator fail ("RandomShuffle is stateful"),
    # so a --dynamic_masking run crashed at its first checkpoint.
    files, vocab_file = write_real_text_records(
        str(tmp_path), max_seq_length=32, max_predictions_per_seq=5, num_files=1
    )
    masking = input_pipeline.DynamicMasking.from_vocab_file(vocab_file)

    def make_iterator():
        return iter(
            input_pipeline.pretraining_dataset(
                files, 4, 32, 5, is_training=True, seed=7, dynamic_masking=masking
            )
        )

    straight = make_iterator()
    next(straight)
    next(straight)
    prefix = tf.train.Checkpoint(iterator=straight).write(str(tmp_path / "iterator"))
    expected = next(straight)
    resumed = make_iterator()
    tf.train.Checkpoint(iterator=resumed).read(prefix).assert_consumed()
    got = next(resumed)
    for key in expected:
        np.testing.assert_array_equal(got[key].numpy(), expected[key].numpy(), err_msg=key)
    # Different batches still get different masks.
    assert not np.array_equal(
        next(resumed)["masked_lm_positions"].numpy(), got["masked_lm_positions"].numpy()
    )


def test_masked_token_counts_count_the_weighted_answers_and_refuse_ids_outside_the_vocabulary(
    numbered_files,
):
    # write_numbered_records masks positions 1 and 2 with the answers 8 and 9, weight 1 each.
    counts = input_pipeline.masked_token_counts(numbered_files, 8, 3, vocab_size=12)
    np.testing.assert_array_equal(counts, [0] * 8 + [40, 40, 0, 0])
    with pytest.raises(input_pipeline.RecordFormatError, match=r"part-0.*9\b.*vocabulary of 9"):
        input_pipeline.masked_token_counts(numbered_files, 8, 3, vocab_size=9)
