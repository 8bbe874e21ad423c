"""Optimizers and schedule against NumPy references written here from the original code and the paper."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import ROOT, child_pythonpath

from bert_tf.training import optimization

RNG = np.random.default_rng(0)
# Names chosen so the exclusion rule has to tell them apart: only the kernel is decayed.
INITIAL = {
    "encoder_kernel": RNG.normal(size=(4, 3)).astype(np.float32),
    "attention_layer_norm_gamma": (1.0 + 0.1 * RNG.normal(size=(3,))).astype(np.float32),
    "output_bias": (0.1 * RNG.normal(size=(3,))).astype(np.float32),
}
GRADIENTS = [
    {name: RNG.normal(size=value.shape).astype(np.float32) for name, value in INITIAL.items()}
    for _ in range(3)
]
DECAYED = {"encoder_kernel"}


def numpy_original_adamw(
    params,
    grads_per_step,
    lrs,
    wd=0.01,
    b1=0.9,
    b2=0.999,
    eps=1e-6,
    bias_correction=False,
    decayed=DECAYED,
):
    """The original AdamWeightDecayOptimizer.apply_gradients, transcribed to NumPy (plus optional correction)."""
    params = {k: v.astype(np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(x) for k, x in params.items()}
    for t, (grads, lr) in enumerate(zip(grads_per_step, lrs), start=1):
        for name in params:
            g = grads[name].astype(np.float64)
            m[name] = b1 * m[name] + (1 - b1) * g
            v[name] = b2 * v[name] + (1 - b2) * g * g
            m_used, v_used = m[name], v[name]
            if bias_correction:
                m_used, v_used = m_used / (1 - b1**t), v_used / (1 - b2**t)
            update = m_used / (np.sqrt(v_used) + eps)
            if name in decayed:
                update = update + wd * params[name]
            params[name] = params[name] - lr * update
    return params


def numpy_lamb(
    params, grads_per_step, lrs, wd=0.01, b1=0.9, b2=0.999, eps=1e-6, step_reset_at=None
):
    """LAMB, Algorithm 2 of You et al. (2019), phi = identity; excluded variables use ratio 1, no
    decay. `step_reset_at`: the update at which t starts again from 1, the moments kept (NVIDIA's
    phase 2 resets the optimizer's step)."""
    params = {k: v.astype(np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(x) for k, x in params.items()}
    for update, (grads, lr) in enumerate(zip(grads_per_step, lrs)):
        t = (
            update + 1
            if step_reset_at is None or update < step_reset_at
            else update - step_reset_at + 1
        )
        for name in params:
            g = grads[name].astype(np.float64)
            m[name] = b1 * m[name] + (1 - b1) * g
            v[name] = b2 * v[name] + (1 - b2) * g * g
            r = (m[name] / (1 - b1**t)) / (np.sqrt(v[name] / (1 - b2**t)) + eps)
            if name in DECAYED:
                u = r + wd * params[name]
                w_norm, u_norm = np.linalg.norm(params[name]), np.linalg.norm(u)
                ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            else:
                u, ratio = r, 1.0
            params[name] = params[name] - lr * ratio * u
    return params


def run_keras_optimizer(optimizer, num_steps):
    """Applies GRADIENTS[:num_steps] to fresh variables; returns their values."""
    variables = {name: keras.Variable(value, name=name) for name, value in INITIAL.items()}
    names = list(variables)
    for grads in GRADIENTS[:num_steps]:
        optimizer.apply([tf.constant(grads[n]) for n in names], [variables[n] for n in names])
    return {n: np.asarray(variables[n].numpy()) for n in names}


def schedule_values(num_steps, **schedule):
    """The schedule's learning rate at steps 0..num_steps-1, as the optimizer sees them."""
    return [float(optimization.warmup_linear_decay(step, **schedule)) for step in range(num_steps)]


SCHEDULE = dict(peak_learning_rate=0.1, num_train_steps=10, num_warmup_steps=2)


@pytest.mark.parametrize("num_steps", [1, 2, 3])
@pytest.mark.parametrize("bias_correction", [False, True])
def test_adamw_matches_the_original_update_rule(num_steps, bias_correction):
    optimizer = optimization.AdamWeightDecay(
        learning_rate=optimization.WarmupLinearDecay(**SCHEDULE), bias_correction=bias_correction
    )
    got = run_keras_optimizer(optimizer, num_steps)
    want = numpy_original_adamw(
        INITIAL,
        GRADIENTS[:num_steps],
        schedule_values(num_steps, **SCHEDULE),
        bias_correction=bias_correction,
    )
    for name in INITIAL:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_adamw_given_rows_matches_the_original_rule_on_the_table_they_sum_to():
    # An embedding lookup's gradient is rows (an IndexedSlices) when it reaches the optimizer
    # straight from a tape: repeated rows sum, untouched rows (4 and 5) still decay, as the
    # original's dense step does after tf.multiply turned the rows into a table.
    table = RNG.normal(size=(6, 3)).astype(np.float32)
    indices = np.array([0, 2, 0, 3, 2, 2], np.int64)
    steps = [RNG.normal(size=(len(indices), 3)).astype(np.float32) for _ in range(3)]
    variable = keras.Variable(table, name="word_embeddings")
    optimizer = optimization.AdamWeightDecay(learning_rate=0.1)
    optimizer.build([variable])

    @tf.function
    def step(values):
        rows = tf.IndexedSlices(values, tf.constant(indices), tf.constant(table.shape, tf.int64))
        optimizer.update_step(rows, variable, optimizer.learning_rate)

    for values in steps:
        step(tf.constant(values))
    dense = []
    for values in steps:
        summed = np.zeros_like(table)
        np.add.at(summed, indices, values)
        dense.append({"table": summed})
    want = numpy_original_adamw({"table": table}, dense, [0.1] * 3, decayed={"table"})
    np.testing.assert_allclose(variable.numpy(), want["table"], rtol=1e-5, atol=1e-6)
    assert not np.allclose(variable.numpy()[4:], table[4:])  # decayed without a gradient


MIRRORED_ADAMW_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    from bert_tf.runtime import distribution
    from bert_tf.training import optimization
    import test_optimization as t
    strategy = distribution.get_strategy("mirrored", num_cpu_replicas=2)
    with strategy.scope():
        variables = [tf.keras.Variable(value, name=name) for name, value in t.INITIAL.items()]
        optimizer = optimization.AdamWeightDecay(learning_rate=0.01)
        optimizer.build(variables)
        slot_copies = []
        for index, variable in enumerate(variables):
            for copy in strategy.experimental_local_results(variable.value):
                found = optimization._component_beside(optimizer._first_moments[index], copy)
                slot_copies.append(found is not None and found.device == copy.device)

    @tf.function
    def step(grads):
        # What bert_tf.training does after its all-reduce: update_step on each device's copy.
        def update(copy, grad):
            return optimizer.update_step(grad, copy, optimizer.learning_rate)

        for grad, variable in zip(grads, variables):
            strategy.extended.update(variable.value, update, args=(grad,), group=False)

    for grads in t.GRADIENTS[:2]:
        step([tf.constant(grads[name]) for name in t.INITIAL])
    copies = {
        name: [c.numpy().tolist() for c in strategy.experimental_local_results(v.value)]
        for name, v in zip(t.INITIAL, variables)
    }
    traces = optimization._adamw_update_in_place.experimental_get_tracing_count()
    json.dump({"copies": copies, "slot_copies": slot_copies, "traces": traces}, sys.stdout)
""")


@pytest.mark.slow
def test_adamw_on_two_mirrored_cpu_replicas_updates_each_copy_in_place():
    # Under a strategy update_step runs once per device copy and writes that device's copies of
    # the moments in place; both copies must follow the original's rule.
    env = dict(
        os.environ,
        PYTHONPATH=child_pythonpath(__file__),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    out = subprocess.run(
        [sys.executable, "-c", MIRRORED_ADAMW_SCRIPT],
        check=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        capture_output=True,
        text=True,
    )
    result = json.loads(out.stdout)
    assert result["slot_copies"] and all(result["slot_copies"])
    assert result["traces"] > 0  # the in-place update ran, not the fallback for TPU variables
    want = numpy_original_adamw(INITIAL, GRADIENTS[:2], [0.01, 0.01])
    for name in INITIAL:
        assert len(result["copies"][name]) == 2
        for copy in result["copies"][name]:
            np.testing.assert_allclose(copy, want[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_adamw_without_bias_correction_differs_from_keras_adamw():
    # Guards against accidentally shipping standard AdamW: the first update must be ~3.16x larger.
    ours = run_keras_optimizer(
        optimization.AdamWeightDecay(learning_rate=0.01, weight_decay_rate=0.0), 1
    )
    keras_adam = run_keras_optimizer(keras.optimizers.Adam(learning_rate=0.01, epsilon=1e-6), 1)
    step_ours = ours["encoder_kernel"] - INITIAL["encoder_kernel"]
    step_keras = keras_adam["encoder_kernel"] - INITIAL["encoder_kernel"]
    np.testing.assert_allclose(
        step_ours / step_keras, np.sqrt(1000.0) / 10.0 * np.ones_like(step_ours), rtol=1e-3
    )


@pytest.mark.parametrize("num_steps", [1, 2])
def test_lamb_matches_the_paper(num_steps):
    optimizer = optimization.Lamb(learning_rate=optimization.WarmupLinearDecay(**SCHEDULE))
    got = run_keras_optimizer(optimizer, num_steps)
    want = numpy_lamb(INITIAL, GRADIENTS[:num_steps], schedule_values(num_steps, **SCHEDULE))
    for name in INITIAL:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    # Warmup makes the step-0 rate 0; a constant rate too, so that the first step's trust ratio matters.
    got = run_keras_optimizer(optimization.Lamb(learning_rate=0.05), num_steps)
    want = numpy_lamb(INITIAL, GRADIENTS[:num_steps], [0.05] * num_steps)
    for name in INITIAL:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_lamb_restarts_its_bias_correction_where_the_schedule_restarts():
    # NVIDIA's phase 2: its step count starts again, so t in 1 - beta^t does; the moments stay.
    restart = optimization.ScheduleRestart(2, 0.05, 2, 0)
    optimizer = optimization.create_optimizer("lamb", 0.05, 3, 0, restart=restart)
    got = run_keras_optimizer(optimizer, 3)
    schedule = optimization.RestartedWarmupLinearDecay(0.05, 0, restart)
    rates = [float(schedule(step)) for step in range(3)]
    assert rates[2] > 0
    want = numpy_lamb(INITIAL, GRADIENTS[:3], rates, step_reset_at=2)
    unrestarted = numpy_lamb(INITIAL, GRADIENTS[:3], rates)
    for name in INITIAL:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    # The restart is visible: 100 times the tolerance above.
    assert max(np.abs(want[n] - unrestarted[n]).max() for n in INITIAL) > 1e-4
    restored = optimization.Lamb.from_config(optimizer.get_config())
    assert restored.bias_correction_restart == 2


def test_decay_power_bends_the_decay_and_keeps_the_warmup():
    schedule = optimization.WarmupLinearDecay(0.1, 10, 2, decay_power=0.5)
    rates = [float(schedule(step)) for step in range(11)]
    np.testing.assert_allclose(
        rates, [0.0, 0.05] + [0.1 * (1 - s / 10) ** 0.5 for s in range(2, 11)], atol=1e-7
    )
    clone = optimization.WarmupLinearDecay.from_config(schedule.get_config())
    assert float(clone(7)) == rates[7]
    restarted = optimization.RestartedWarmupLinearDecay(
        0.1, 2, optimization.ScheduleRestart(10, 0.2, 4, 0), decay_power=0.5
    )
    assert float(restarted(5)) == pytest.approx(0.1 * 0.5**0.5)
    assert float(restarted(11)) == pytest.approx(0.2 * 0.75**0.5)


def test_weight_decay_exclusion_uses_the_original_patterns():
    optimizer = optimization.AdamWeightDecay(learning_rate=0.01)
    variables = [keras.Variable(value, name=name) for name, value in INITIAL.items()]
    optimizer.build(variables)
    assert {v.name for v in variables if optimizer.decays_variable(v)} == DECAYED


def test_schedule_is_the_original_warmup_then_linear_decay():
    lrs = schedule_values(11, **SCHEDULE)
    # Warmup: 0, 0.05; then decay measured from step 0: 0.1 * (1 - step / 10).
    np.testing.assert_allclose(
        lrs, [0.0, 0.05] + [0.1 * (1 - s / 10) for s in range(2, 11)], atol=1e-7
    )
    assert float(optimization.warmup_linear_decay(25, 0.1, 10, 2)) == 0.0
    no_warmup = [float(optimization.warmup_linear_decay(s, 1.0, 4, 0)) for s in range(5)]
    np.testing.assert_allclose(no_warmup, [1.0, 0.75, 0.5, 0.25, 0.0])


def test_schedule_round_trips_through_keras_config():
    schedule = optimization.WarmupLinearDecay(**SCHEDULE)
    clone = optimization.WarmupLinearDecay.from_config(schedule.get_config())
    assert float(clone(5)) == pytest.approx(float(schedule(5)))
    optimizer = optimization.create_optimizer("lamb", 1e-3, 100, 10)
    assert isinstance(optimizer, optimization.Lamb)
    assert optimizer.get_config()["exclude_from_weight_decay"] == [
        "LayerNorm",
        "layer_norm",
        "bias",
    ]
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'"):
        optimization.create_optimizer("sgd", 1e-3, 100, 10)


@pytest.mark.parametrize(
    "name, bias_correction", [("adamw", False), ("adamw", True), ("lamb", False)]
)
def test_learning_rate_factors_scale_the_rate_of_the_variables_they_name(name, bias_correction):
    # run_pretraining --heads_learning_rate: the heads' variables step at a multiple of the rate.
    factors = {"output_bias": 10.0, "layer_norm": 0.5}
    optimizer = optimization.create_optimizer(
        name, 0.1, 10, 2, bias_correction=bias_correction, learning_rate_factors=factors.items()
    )
    got = run_keras_optimizer(optimizer, 3)
    rates = schedule_values(3, **SCHEDULE)
    for variable in INITIAL:
        factor = next((f for pattern, f in factors.items() if pattern in variable), 1.0)
        scaled = [rate * factor for rate in rates]
        if name == "lamb":
            want = numpy_lamb(INITIAL, GRADIENTS[:3], scaled)
        else:
            want = numpy_original_adamw(
                INITIAL, GRADIENTS[:3], scaled, bias_correction=bias_correction
            )
        np.testing.assert_allclose(
            got[variable], want[variable], rtol=1e-5, atol=1e-6, err_msg=variable
        )
    restored = type(optimizer).from_config(optimizer.get_config())
    assert restored.learning_rate_factors == tuple(factors.items())
