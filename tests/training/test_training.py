"""The custom loop: its update equals a plain Keras step, 2 mirrored replicas equal 1, NaN/overflow handling."""

import collections
import os
import re
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import NO_DROPOUT, ROOT, child_pythonpath, tiny_config, write_tiny_vocab
from helpers_records import write_real_text_records

from bert_tf.model import modeling
from bert_tf.model.model_dir import ModelDir
from bert_tf.pretraining import input_pipeline
from bert_tf.pretraining.masked_lm import PretrainingObjective
from bert_tf.runtime import io_utils
from bert_tf.tasks import models
from bert_tf.tasks.classification.model import ClassificationObjective
from bert_tf.training import finetuning, optimization, training_flags, training_loop

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

SEQ, PRED, BATCH = 32, 5, 8


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return write_real_text_records(str(tmp_path_factory.mktemp("records")), SEQ, PRED, num_files=2)


def no_dropout_config(vocab_file):
    """The tiny config with the test vocab; dropout off, since runs are compared number for number."""
    return tiny_config(vocab_file, **NO_DROPOUT)


def fixed_batches(files, n):
    """The first n eval-order batches (deterministic, no shuffle)."""
    return list(
        input_pipeline.pretraining_dataset(files, BATCH, SEQ, PRED, is_training=False).take(n)
    )


def iterate(batches):
    """A tf.data iterator over `batches` (the loop needs one: a Python iterator would be traced once)."""
    dataset = tf.data.Dataset.from_tensors(batches[0])
    for batch in batches[1:]:
        dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
    return iter(dataset)


def sgd():
    """Plain SGD for number-for-number comparisons. (Adam without bias correction divides float noise
    in near-zero gradients by sqrt(v) + 1e-6, which turns last-bit differences into visible ones.)"""
    return keras.optimizers.SGD(learning_rate=0.5)


def make_trainer(
    config,
    output_dir,
    strategy=None,
    make_optimizer=None,
    objective_class=PretrainingObjective,
    **loop,
):
    """A Trainer on the default strategy (or `strategy`) for a fresh seeded tiny model."""
    strategy = strategy or tf.distribute.get_strategy()
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model, encoder = modeling.build_pretraining_model(config)
        optimizer = (
            make_optimizer()
            if make_optimizer
            else optimization.create_optimizer("adamw", 1e-2, 100, 0)
        )
    trainer = training_loop.Trainer(
        strategy,
        objective_class(model),
        optimizer,
        {"encoder": encoder, "pretraining_model": model},
        str(output_dir),
        training_loop.LoopConfig(num_train_steps=loop.pop("num_train_steps", 2), **loop),
        BATCH,
    )
    return trainer, model


def test_loss_is_the_global_weighted_mlm_mean_plus_mean_nsp(records, tmp_path):
    files, vocab_file = records
    _, model = make_trainer(no_dropout_config(vocab_file), tmp_path)
    task = PretrainingObjective(model)
    batch = fixed_batches(files, 1)[0]
    loss, stats = task.loss_and_stats(batch, task.denominators(batch), training=False)
    outputs = model(
        {
            k: batch[k]
            for k in ("input_word_ids", "input_mask", "input_type_ids", "masked_lm_positions")
        }
    )

    def xent(logits, labels):
        logits = np.asarray(logits, np.float64)
        log_probs = logits - logits.max(-1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
        return -np.take_along_axis(log_probs, np.asarray(labels)[..., None], -1)[..., 0]

    weights = batch["masked_lm_weights"].numpy()
    mlm = (xent(outputs["mlm_logits"], batch["masked_lm_ids"]) * weights).sum() / weights.sum()
    nsp = xent(outputs["nsp_logits"], batch["next_sentence_labels"]).mean()
    assert float(loss) == pytest.approx(mlm + nsp, rel=1e-5)
    assert float(stats["mlm_weight"]) == weights.sum() and 0 < weights.sum() < weights.size


def test_mlm_denominator_is_the_originals_weight_sum_plus_1e5(records, tmp_path):
    # With one real prediction, sum(w) + 1e-5 differs from sum(w) by 1e-5 relative: visible in float32.
    files, vocab_file = records
    _, model = make_trainer(no_dropout_config(vocab_file), tmp_path)
    task = PretrainingObjective(model)
    batch = fixed_batches(files, 1)[0]
    weights = np.zeros(batch["masked_lm_weights"].shape, np.float32)
    weights[0, 0] = 1.0
    batch = dict(batch, masked_lm_weights=tf.constant(weights))
    loss, _ = task.loss_and_stats(batch, task.denominators(batch), training=False)
    outputs = model(
        {
            k: batch[k]
            for k in ("input_word_ids", "input_mask", "input_type_ids", "masked_lm_positions")
        }
    )
    mlm_logits = np.asarray(outputs["mlm_logits"][0, 0], np.float64)
    log_probs = mlm_logits - mlm_logits.max() - np.log(np.exp(mlm_logits - mlm_logits.max()).sum())
    mlm = -log_probs[int(batch["masked_lm_ids"][0, 0])] / (1.0 + 1e-5)
    nsp_logits = np.asarray(outputs["nsp_logits"], np.float64)
    nsp_log_probs = nsp_logits - np.log(np.exp(nsp_logits).sum(-1, keepdims=True))
    nsp = -nsp_log_probs[np.arange(len(nsp_logits)), batch["next_sentence_labels"].numpy()].mean()
    assert float(loss) == pytest.approx(mlm + nsp, rel=1e-6)


def test_two_steps_equal_a_plain_keras_update_with_global_norm_clipping(records, tmp_path):
    files, vocab_file = records
    config = no_dropout_config(vocab_file)
    trainer, model = make_trainer(
        config,
        tmp_path / "a",
        make_optimizer=sgd,
        clip_norm=0.5,
        steps_per_loop=2,
        save_checkpoints_steps=100,
    )
    reference, _ = make_trainer(config, tmp_path / "b")
    reference_model = reference.objective.model
    reference_optimizer = sgd()
    batches = fixed_batches(files, 2)

    iterator = iterate(batches)
    trainer.restore_or_initialize(iterator)
    lines = []
    trainer.train(iterator, log_fn=lines.append)

    task = PretrainingObjective(reference_model)
    variables = reference_model.trainable_variables
    # The norms logged per part: the embeddings, each layer, the pooler and both heads.
    parts = {
        "embeddings": ("token_embedding/", "position_embedding/", "segment_embedding/",
                       "embeddings_layer_norm/"),
        "transformer_layer_0": ("transformer_layer_0/",),
        "transformer_layer_1": ("transformer_layer_1/",),
        "head": ("pooled_dense/", "mlm_head/", "nsp_head/"),
    }  # fmt: skip
    assert sorted(v.path for v in variables) == sorted(
        v.path for v in variables if v.path.startswith(sum(parts.values(), ()))
    )
    norms = collections.defaultdict(list)
    for batch in batches:
        with tf.GradientTape() as tape:
            loss, _ = task.loss_and_stats(batch, task.denominators(batch), training=True)
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]
        norms["gradient_norm"].append(float(tf.linalg.global_norm(grads)))
        for part, prefixes in parts.items():
            in_part = [g for g, v in zip(grads, variables) if v.path.startswith(prefixes)]
            norms[f"gradient_norm/{part}"].append(float(tf.linalg.global_norm(in_part)))
        grads, _ = tf.clip_by_global_norm(grads, 0.5)
        reference_optimizer.apply(grads, variables)
    assert int(trainer.step.numpy()) == 2
    # Before clipping, the mean of the loop's two steps; on the progress line too.
    assert trainer.norm_groups == list(parts)
    got = trainer.mean_gradient_norms()
    assert list(got) == list(norms)
    for name, values in norms.items():
        assert got[name] == pytest.approx(np.mean(values), rel=1e-5), name
    assert norms["gradient_norm"][0] > 0.5  # clipped: the logged norm is the one before
    assert f"grad_norm {got['gradient_norm']:.3g}  " in lines[-1]
    for got, want in zip(model.trainable_variables, reference_model.trainable_variables):
        np.testing.assert_allclose(
            got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6, err_msg=got.path
        )
    assert tf.train.latest_checkpoint(str(tmp_path / "a")).endswith("ckpt-2")


# A fine-tuning batch with repeated tokens: the word embedding's rows and table norms differ.
CLIP_IDS = np.array(
    [
        [2, 7, 7, 8, 7, 3, 0, 0],
        [2, 8, 8, 3, 9, 9, 3, 0],
        [2, 7, 3, 0, 0, 0, 0, 0],
        [2, 9, 3, 9, 3, 0, 0, 0],
    ]
)
CLIP_BATCH = {
    "input_word_ids": CLIP_IDS.astype(np.int32),
    "input_mask": (CLIP_IDS > 0).astype(np.int32),
    "input_type_ids": ((CLIP_IDS > 0) & (np.arange(8) > 3)).astype(np.int32),
    "label_ids": np.array([0, 1, 1, 0], np.int32),
}
CLIP_NORM = 1e-3  # far under the gradient's norm: the clip factor decides the step


def seeded_classifier():
    """(model, encoder): a tiny classifier without dropout, the same weights on every call."""
    spec = models.TaskSpec("classifier", labels=["a", "b"], max_seq_length=8)
    keras.utils.set_random_seed(4)
    return models.build_task_model(tiny_config(**NO_DROPOUT), spec)


def classifier_trainer(output_dir, strategy=None, **loop):
    """A Trainer (SGD, clip_norm CLIP_NORM, one step) for a fresh seeded_classifier()."""
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        model, encoder = seeded_classifier()
    trainer = training_loop.Trainer(
        strategy,
        ClassificationObjective(model),
        sgd(),
        {"encoder": encoder, "model": model},
        str(output_dir),
        training_loop.LoopConfig(
            num_train_steps=1,
            steps_per_loop=1,
            save_checkpoints_steps=100,
            clip_norm=CLIP_NORM,
            **loop,
        ),
        len(CLIP_IDS),
    )
    return trainer, model


def clip_batches():
    """CLIP_BATCH, repeated, as a batched dataset (which a strategy can split)."""
    return tf.data.Dataset.from_tensor_slices(CLIP_BATCH).batch(len(CLIP_IDS)).repeat()


@pytest.mark.parametrize("loop", [{}, {"jit_compile": True}, {"loss_scaling": True}])
def test_clipping_takes_the_word_embeddings_norm_over_its_rows_as_the_original_does(tmp_path, loop):
    # The original fine-tunes on a GPU or CPU with tf.gather for the word embedding and a one-hot
    # matmul for the segment embedding, then calls tf.clip_by_global_norm on tf.gradients: the
    # word embedding's norm is over its rows (one per token, repeats not summed), the others'
    # over dense tables. The reference below makes exactly that call.
    trainer, model = classifier_trainer(tmp_path, **loop)
    iterator = iter(clip_batches())
    trainer.restore_or_initialize(iterator)
    trainer.train(iterator, log_fn=lambda line: None)

    reference, _ = seeded_classifier()
    objective = ClassificationObjective(reference)
    batch = {name: tf.constant(value) for name, value in CLIP_BATCH.items()}
    with tf.GradientTape() as tape:
        loss, _ = objective.loss_and_stats(batch, objective.denominators(batch), training=True)
    grads = tape.gradient(loss, reference.trainable_variables)
    word = [v.path for v in reference.trainable_variables].index("token_embedding/embeddings")
    assert isinstance(grads[word], tf.IndexedSlices)  # a gather's rows, as on the original's GPU
    as_original = [g if i == word else tf.convert_to_tensor(g) for i, g in enumerate(grads)]
    clipped, rows_norm = tf.clip_by_global_norm(as_original, CLIP_NORM)
    dense = [tf.convert_to_tensor(g) for g in grads]
    clipped_by_table, table_norm = tf.clip_by_global_norm(dense, CLIP_NORM)
    assert float(rows_norm) > float(table_norm) * 1.01  # repeats: the two norms differ

    def after_sgd(clipped_grads):
        """The reference weights after sgd()'s step with these gradients."""
        return [
            v.numpy() - 0.5 * tf.convert_to_tensor(g).numpy()
            for v, g in zip(reference.trainable_variables, clipped_grads)
        ]

    got = [v.numpy() for v in model.trainable_variables]
    for value, want, variable in zip(got, after_sgd(clipped), model.trainable_variables):
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-7, err_msg=variable.path)
    # ...and the test can tell: the table's norm would have moved the weights elsewhere.
    assert not all(
        np.allclose(value, want, rtol=1e-5, atol=1e-7)
        for value, want in zip(got, after_sgd(clipped_by_table))
    )


def test_float16_overflow_skips_the_step_and_halves_the_loss_scale(records, tmp_path):
    files, vocab_file = records
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        trainer, model = make_trainer(
            no_dropout_config(vocab_file),
            tmp_path,
            loss_scaling=True,
            steps_per_loop=2,
            num_train_steps=2,
        )
    finally:
        keras.mixed_precision.set_global_policy("float32")
    before = [v.numpy() for v in model.trainable_variables]
    # float16 tops out at 65504: the scaled backward pass overflows, twice (2^60, then 2^59).
    trainer.loss_scale.assign(2.0**60)
    trainer.restore_or_initialize()
    metrics = trainer.train(iterate(fixed_batches(files, 2)), log_fn=lambda line: None)
    assert float(trainer.loss_scale.numpy()) == 2.0**58
    assert int(trainer.step.numpy()) == 2 and int(trainer.optimizer.iterations.numpy()) == 0
    assert np.isfinite(metrics["loss"])
    for value, variable in zip(before, model.trainable_variables):
        np.testing.assert_array_equal(value, variable.numpy())
    # A scale float16 can carry: the next step applies.
    trainer.loss_scale.assign(2.0**8)
    trainer.config.num_train_steps = 3
    trainer.train(iterate(fixed_batches(files, 1)), log_fn=lambda line: None)
    assert int(trainer.optimizer.iterations.numpy()) == 1
    # The schedule runs on the steps taken, skipped ones included (Keras' own reading counts
    # applied updates only), so the learning rate agrees with the step that pretraining's
    # phases switch at.
    assert float(trainer.learning_rate()) == pytest.approx(1e-2 * (1 - 3 / 100))
    assert float(trainer.optimizer.learning_rate) == pytest.approx(1e-2 * (1 - 1 / 100))
    assert any(not np.array_equal(b, v.numpy()) for b, v in zip(before, model.trainable_variables))


def test_nan_loss_stops_without_updating_or_saving(records, tmp_path):
    files, vocab_file = records
    trainer, model = make_trainer(
        no_dropout_config(vocab_file), tmp_path, steps_per_loop=3, num_train_steps=3
    )
    good, bad = fixed_batches(files, 2)
    bad = dict(bad, masked_lm_weights=bad["masked_lm_weights"] * np.nan)
    trainer.restore_or_initialize()
    with pytest.raises(TypeError, match="tf.data or tf.distribute iterator"):
        trainer.train(iter([good]))
    with pytest.raises(training_loop.NonFiniteLossError, match="at step 2"):
        trainer.train(iterate([good, bad, good]), log_fn=lambda line: None)
    assert tf.train.latest_checkpoint(str(tmp_path)) is None
    assert all(np.isfinite(v.numpy()).all() for v in model.trainable_variables)


class BoostedObjective(PretrainingObjective):
    """The pretraining loss times each batch's "boost": a loss that explodes on cue, still finite."""

    def loss_and_stats(self, batch, global_denominators, training):
        """The usual loss and stats, with the loss multiplied by batch["boost"]."""
        loss, stats = super().loss_and_stats(batch, global_denominators, training)
        return loss * batch["boost"], stats


def boosted_batches(files, boosts):
    """Eval-order batches, one per boost."""
    return [
        dict(batch, boost=tf.constant(boost, tf.float32))
        for batch, boost in zip(fixed_batches(files, len(boosts)), boosts)
    ]


def test_an_exploding_loss_stops_like_a_nan_and_names_the_last_healthy_checkpoint(
    records, tmp_path
):
    # A finite loss of 1.5e15 used to be saved, and its checkpoint called "the last good checkpoint".
    files, vocab_file = records
    trainer, _ = make_trainer(
        no_dropout_config(vocab_file),
        tmp_path,
        objective_class=BoostedObjective,
        steps_per_loop=1,
        save_checkpoints_steps=1,
        num_train_steps=5,
        max_loss_ratio=100.0,
    )
    trainer.restore_or_initialize()
    with pytest.raises(training_loop.NonFiniteLossError) as failure:
        trainer.train(iterate(boosted_batches(files, [1, 1, 1, 1e6, 1])), log_fn=lambda line: None)
    message = str(failure.value)
    assert re.search(
        r"loss 8\.\d+e\+06 at step 4 is over 100 times the mean loss of the earlier steps "
        r"\(8\.\d+; --max_loss_ratio\)",
        message,
    ), message
    # ckpt-3 was saved after healthy losses, but its weights are the ones that gave step 4's loss.
    assert (
        f"the last checkpoint saved with a finite, non-exploding loss is {tmp_path}/ckpt-2 (step 2)"
        in message
    )
    assert f"{tmp_path}/ckpt-3 holds the weights that gave this loss" in message
    assert failure.value.last_checkpoint == f"{tmp_path}/ckpt-2"
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith(
        "ckpt-3"
    )  # Nothing saved after the explosion.
    assert (
        int(trainer.optimizer.iterations.numpy()) == 3
    )  # The exploding step (and the rest) applied nothing.
    # Off (0), the same loss trains on.
    trainer, _ = make_trainer(
        no_dropout_config(vocab_file),
        tmp_path / "off",
        objective_class=BoostedObjective,
        steps_per_loop=5,
        num_train_steps=5,
        max_loss_ratio=0.0,
    )
    trainer.restore_or_initialize()
    trainer.train(iterate(boosted_batches(files, [1, 1, 1, 1e6, 1])), log_fn=lambda line: None)
    assert int(trainer.optimizer.iterations.numpy()) == 5


def one_update(trainer, batch):
    """The trainable weights after `trainer` takes one step on `batch`."""
    iterator = iterate([batch])
    trainer.restore_or_initialize(iterator)
    trainer.train(iterator, log_fn=lambda line: None)
    return [v.numpy() for v in trainer.objective.model.trainable_variables]


@pytest.mark.parametrize(
    "loop",
    [{}, {"clip_norm": 1e-3}, {"jit_compile": True}, {"loss_scaling": True}],
    ids=["plain", "clipped", "xla", "loss_scaled"],
)
def test_accumulated_micro_batches_update_exactly_like_one_batch(records, tmp_path, loop):
    files, vocab_file = records
    config = no_dropout_config(vocab_file)
    (batch,) = fixed_batches(files, 1)
    weights = {}
    for count in (1, 4):
        trainer, _ = make_trainer(
            config,
            tmp_path / str(count),
            steps_per_loop=1,
            num_train_steps=1,
            make_optimizer=sgd,
            num_accumulation_steps=count,
            **loop,
        )
        weights[count] = one_update(trainer, batch)
        assert int(trainer.optimizer.iterations.numpy()) == 1
    initial, _ = make_trainer(config, tmp_path / "initial")
    moved = 0
    for whole, accumulated, start, variable in zip(
        weights[1], weights[4], initial.objective.model.trainable_variables, trainer._variables
    ):
        # SGD: a gradient off by any factor (a micro-batch's mean, not its share) would show.
        np.testing.assert_allclose(accumulated, whole, rtol=0, atol=1e-6, err_msg=variable.path)
        moved += not np.allclose(whole, start.numpy(), rtol=0, atol=1e-6)
    assert moved > len(weights[1]) // 2


def test_accumulation_must_split_the_batch_per_replica(records, tmp_path):
    files, vocab_file = records
    with pytest.raises(
        io_utils.UsageError,
        match=r"--num_accumulation_steps=3 does not divide the batch per replica, 8 "
        r"\(--train_batch_size=8 over 1 replica\)",
    ):
        make_trainer(no_dropout_config(vocab_file), tmp_path, num_accumulation_steps=3)
    with pytest.raises(io_utils.UsageError, match="--num_accumulation_steps must be positive"):
        training_flags.LoopArgs(num_accumulation_steps=0).validate()
    assert (
        training_flags.LoopArgs(num_accumulation_steps=4).loop_config(1).num_accumulation_steps == 4
    )


MIRRORED_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    from bert_tf.runtime import distribution
    strategy = distribution.get_strategy(sys.argv[1], num_cpu_replicas=2)
    import test_training as t
    files = sys.argv[3].split(",")
    config = t.no_dropout_config(sys.argv[4])
    trainer, model = t.make_trainer(config, sys.argv[2], strategy=strategy, make_optimizer=t.sgd,
                                    steps_per_loop=3, num_train_steps=3,
                                    num_accumulation_steps=int(sys.argv[5]))
    dataset = strategy.distribute_datasets_from_function(lambda ctx: t.input_pipeline.pretraining_dataset(
        files, ctx.get_per_replica_batch_size(t.BATCH), t.SEQ, t.PRED, is_training=False))
    trainer.restore_or_initialize()
    metrics = trainer.train(iter(dataset), log_fn=lambda line: None)
    np.savez(sys.argv[2] + "/weights.npz", *[v.numpy() for v in model.trainable_variables],
             loss=metrics["loss"], replicas=strategy.num_replicas_in_sync)
    # Fine-tuning: the word embedding's norm over rows, whose squares are summed over replicas.
    trainer, model = t.classifier_trainer(sys.argv[2] + "/classifier", strategy=strategy,
                                          num_accumulation_steps=int(sys.argv[5]))
    trainer.restore_or_initialize()
    trainer.train(iter(strategy.experimental_distribute_dataset(t.clip_batches())),
                  log_fn=lambda line: None)
    np.savez(sys.argv[2] + "/classifier.npz", *[v.numpy() for v in model.trainable_variables])
""")


@pytest.mark.slow
def test_two_mirrored_cpu_replicas_train_exactly_like_one(records, tmp_path):
    files, vocab_file = records
    results = {}
    env = dict(
        os.environ,
        PYTHONPATH=child_pythonpath(__file__),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    # (output, strategy, micro-batches per replica's batch)
    for name, strategy, accumulation in (
        ("mirrored", "mirrored", 1),
        ("default", "default", 1),
        ("accumulated", "mirrored", 2),
    ):
        out = tmp_path / name
        out.mkdir()
        subprocess.run(
            [sys.executable, "-c", MIRRORED_SCRIPT, strategy, str(out), ",".join(files), vocab_file]
            + [str(accumulation)],
            check=True,
            env=env,
            cwd=ROOT,
            timeout=300,
            capture_output=True,
        )
        results[name] = np.load(out / "weights.npz")
    assert int(results["mirrored"]["replicas"]) == 2 and int(results["default"]["replicas"]) == 1
    # Gradient accumulation under the mirrored strategy: each replica's 4 rows in 2 micro-batches.
    assert float(results["accumulated"]["loss"]) == pytest.approx(
        float(results["default"]["loss"]), rel=1e-5
    )
    # Each replica saw half the global batch with a different number of masked tokens; the
    # all-reduced denominators make the summed update identical to one replica on the whole batch.
    assert float(results["mirrored"]["loss"]) == pytest.approx(
        float(results["default"]["loss"]), rel=1e-5
    )
    names = [k for k in results["default"].files if k.startswith("arr_")]
    for name in names:
        for run in ("mirrored", "accumulated"):
            np.testing.assert_allclose(
                results[run][name], results["default"][name], rtol=1e-4, atol=1e-6
            )
    # The clipped fine-tuning step too (the norm of the rows of both replicas, then the clip).
    # (Accumulated: each replica's 2 rows one at a time, their rows' norms summed too.)
    classifiers = {name: np.load(tmp_path / name / "classifier.npz") for name in results}
    default = classifiers.pop("default")
    assert len(default.files) > 30
    for run, weights in classifiers.items():
        for name in default.files:
            np.testing.assert_allclose(
                weights[name], default[name], rtol=1e-5, atol=1e-7, err_msg=f"{run} {name}"
            )


def test_progress_helpers_and_eval_results_format(tmp_path):
    assert training_loop.format_duration(5) == "5s"
    assert training_loop.format_duration(185) == "3m05s"
    assert training_loop.format_duration(3725) == "1h02m"
    assert training_loop.format_duration(float("inf")) == "?"
    path = tmp_path / "eval_results.txt"
    training_loop.write_eval_results(
        str(path), {"masked_lm_accuracy": 0.5, "global_step": 10, "loss": 1.25}
    )
    assert path.read_text() == "global_step = 10\nloss = 1.25\nmasked_lm_accuracy = 0.5\n"


def test_checkpoint_step_of_a_converted_model_dir_is_0(tmp_path):
    # A model directory from convert_checkpoint has no step: run_pretraining may continue from it.
    config = tiny_config()
    vocab = write_tiny_vocab(tmp_path / "vocab.txt")
    ModelDir(str(tmp_path / "model")).write(config, vocab, modeling.build_encoder(config))
    assert ModelDir(str(tmp_path / "model")).latest_step() == 0
    assert ModelDir(str(tmp_path / "empty")).latest_step() == 0
    step = tf.Variable(42, dtype=tf.int64)
    tf.train.CheckpointManager(
        tf.train.Checkpoint(step=step), str(tmp_path / "run"), 1, checkpoint_name="ckpt"
    ).save()
    assert ModelDir(str(tmp_path / "run")).latest_step() == 42


def test_loop_flags_become_the_loop_config():
    args = training_flags.LoopArgs(
        steps_per_loop=7, keep_checkpoint_max=2, mixed_precision="float16", jit_compile=True
    )
    loop = args.loop_config(30, checkpoint_iterator=False)
    assert (loop.num_train_steps, loop.steps_per_loop, loop.max_checkpoints_to_keep) == (30, 7, 2)
    assert loop.loss_scaling and loop.jit_compile and not loop.checkpoint_iterator
    assert not training_flags.LoopArgs(mixed_precision="bfloat16").loop_config(1).loss_scaling
    assert args.loop_config(1).max_loss_ratio == training_flags.LoopArgs().max_loss_ratio > 1
    for ratio in (-1.0, 0.5, 1.0):
        with pytest.raises(
            io_utils.UsageError, match="--max_loss_ratio must be 0 .off. or above 1"
        ):
            training_flags.LoopArgs(max_loss_ratio=ratio).validate()
    training_flags.LoopArgs(max_loss_ratio=0.0).validate()


def test_optimizer_flags_reach_the_optimizer_and_contradictions_exit_2(demo, tmp_path):
    args = training_flags.FinetuneArgs(
        output_dir=str(tmp_path / "out"),
        init_checkpoint=demo["model_dir"],
        do_train=True,
        adam_bias_correction=True,
        adam_epsilon=1e-8,
        head_initializer_range=0.0,
        head_dropout=0.0,
        lr_decay_power=0.0,
        max_seq_length=8,
    )
    args.validate()
    config = args.finetune_config()
    assert (config.optimizer, config.adam_epsilon, config.adam_bias_correction) == (
        "adamw",
        1e-8,
        True,
    )
    spec = models.TaskSpec("classifier", labels=["a", "b"], max_seq_length=8)
    tuner = finetuning.Finetuner(config, tf.distribute.get_strategy(), args.model_source(), spec, 4)
    assert tuner.optimizer.bias_correction and tuner.optimizer.epsilon == 1e-8
    assert not np.any(tuner.model.get_layer("classifier_head").get_weights()[0])
    assert tuner.model.get_layer("head_dropout").rate == 0.0
    # Power 0: after the warm-up (20% of 4 steps: none) the rate stays at its peak to the end.
    rates = []
    for step in (0, 2, 4):
        tuner.optimizer.iterations.assign(step)
        rates.append(float(tuner.optimizer.learning_rate))
    assert rates == pytest.approx([5e-5] * 3)
    # The optimizer's defaults are the original's: no bias correction, epsilon 1e-6; LAMB has none
    # to add. The warm-up is twice the original's, the flag's default and the library's alike.
    default = training_flags.FinetuneArgs(output_dir="x", do_train=True).finetune_config()
    assert (default.adam_epsilon, default.adam_bias_correction) == (1e-6, False)
    assert default.warmup_proportion == finetuning.FinetuneConfig("x").warmup_proportion == 0.2
    assert training_flags.LoopArgs().adam_bias_correction_value() is False
    assert training_flags.FinetuneArgs(optimizer="lamb").adam_bias_correction_value() is False
    for flags, message in (
        (dict(optimizer="lamb", adam_bias_correction=False), "applies to --optimizer=adamw"),
        (dict(adam_epsilon=0.0), "--adam_epsilon must be positive"),
        (dict(optimizer="sgd"), "--optimizer=sgd is not one of"),
        (dict(head_initializer_range=-0.02), "--head_initializer_range must be at least 0"),
        (dict(lr_decay_power=-1.0), "--lr_decay_power must be at least 0"),
        (dict(head_dropout=1.0), "--head_dropout must be in .0, 1."),
        (dict(head_dropout=-0.1), "--head_dropout must be in .0, 1."),
        (dict(warmup_proportion=1.0), "--warmup_proportion must be in .0, 1."),
    ):
        with pytest.raises(io_utils.UsageError, match=message):
            training_flags.FinetuneArgs(output_dir="x", do_train=True, **flags).validate()
