"""Optimizers for BERT: AdamW as the original has it, LAMB, and the warmup + linear decay schedule.

Both optimizers are ordinary `keras.optimizers.Optimizer` subclasses (they checkpoint with
`tf.train.Checkpoint`, create their slots under any tf.distribute strategy, and take a schedule).
Neither clips gradients: the training loop (bert_tf.training) clips once, after the all-reduce,
the gradient of the GLOBAL batch's loss, to a global norm of --clip_norm (default 1.0). That is
what the original's `tf.clip_by_global_norm(grads, 1.0)` does on one GPU or CPU, and ours does it
the same way for any number of replicas. On a TPU the original differs: each core takes the gradient of its own loss
(the mean over its share of the batch), clips that to norm 1.0 by itself, and CrossShardOptimizer
then SUMS the cores' clipped gradients (its 1/cores scaling lives in compute_gradients, which the
original bypasses with tf.gradients). So with N cores the original applies up to N times the
global-mean gradient, clipped core by core; Adam's normalization cancels most of that scale, not
the difference in what gets clipped. (Keras 3's own `global_clipnorm` also clips each replica's
local gradients before they are summed.)

Weight decay is decoupled (added to the update, scaled by the learning rate, never put into the
gradient or the Adam moments) and skipped for variables whose path contains "LayerNorm",
"layer_norm" or "bias", the original's exclusion list. It is implemented here rather than with
Keras' `weight_decay=` because Keras matches its exclusion patterns against the last name
component only ("gamma", "kernel"), which cannot tell a LayerNorm scale from anything else.
"""

import dataclasses

import keras
import tensorflow as tf

# The original's exclusion list, matched as substrings of `variable.path`
# (e.g. "transformer_layer_0/self_attention_layer_norm/gamma", "mlm_head/output_bias").
DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY = ("LayerNorm", "layer_norm", "bias")
OPTIMIZERS = ("adamw", "lamb")


def warmup_linear_decay(
    step, peak_learning_rate, num_train_steps, num_warmup_steps, decay_power=1.0
):
    """The original schedule: linear warmup from 0, then linear decay to 0 at num_train_steps.

    As in the original, the decay is measured from step 0 (not from the end of warmup): after
    warmup the rate is peak * (1 - step / num_train_steps) ** decay_power, the power 1 (a
    linear decay) as in the original; NVIDIA's LAMB recipes use 0.5. Works on Python numbers and
    tensors.
    """
    step = tf.cast(step, tf.float32)
    remaining = tf.maximum(0.0, 1.0 - step / float(max(num_train_steps, 1)))
    if decay_power != 1.0:
        remaining = tf.pow(remaining, float(decay_power))
    decayed = peak_learning_rate * remaining
    if num_warmup_steps <= 0:
        return decayed
    warming = peak_learning_rate * step / float(num_warmup_steps)
    return tf.where(step < num_warmup_steps, warming, decayed)


@keras.saving.register_keras_serializable(package="bert_tf")
class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """`warmup_linear_decay` as a Keras LearningRateSchedule, keyed on optimizer.iterations."""

    def __init__(self, peak_learning_rate, num_train_steps, num_warmup_steps, decay_power=1.0):
        self.peak_learning_rate = float(peak_learning_rate)
        self.num_train_steps = int(num_train_steps)
        self.num_warmup_steps = int(num_warmup_steps)
        self.decay_power = float(decay_power)

    def __call__(self, step):
        return warmup_linear_decay(
            step,
            self.peak_learning_rate,
            self.num_train_steps,
            self.num_warmup_steps,
            self.decay_power,
        )

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "num_train_steps": self.num_train_steps,
            "num_warmup_steps": self.num_warmup_steps,
            "decay_power": self.decay_power,
        }


@dataclasses.dataclass(frozen=True)
class ScheduleRestart:
    """A second warm-up and linear decay that takes over from the first schedule at `start_step`."""

    start_step: int
    peak_learning_rate: float
    num_train_steps: int  # counted from start_step
    num_warmup_steps: int


@keras.saving.register_keras_serializable(package="bert_tf")
class RestartedWarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Two warm-up + linear decay schedules end to end: the first decays to 0 at restart.start_step,
    where the second warms up afresh (NVIDIA's pretraining phase 2, whose schedule restarts)."""

    def __init__(self, peak_learning_rate, num_warmup_steps, restart, decay_power=1.0):
        self.first = WarmupLinearDecay(
            peak_learning_rate, restart.start_step, num_warmup_steps, decay_power
        )
        self.restart = restart

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        restart = self.restart
        second = warmup_linear_decay(
            tf.maximum(step - restart.start_step, 0.0),
            restart.peak_learning_rate,
            restart.num_train_steps,
            restart.num_warmup_steps,
            self.first.decay_power,
        )
        return tf.where(step < restart.start_step, self.first(step), second)

    def get_config(self):
        return {
            "peak_learning_rate": self.first.peak_learning_rate,
            "num_warmup_steps": self.first.num_warmup_steps,
            "restart": dataclasses.asdict(self.restart),
            "decay_power": self.first.decay_power,
        }

    @classmethod
    def from_config(cls, config):
        return cls(
            config["peak_learning_rate"],
            config["num_warmup_steps"],
            ScheduleRestart(**config["restart"]),
            config.get("decay_power", 1.0),
        )


def _matches_any(path, patterns):
    """Whether any pattern is a substring of the variable path."""
    return any(pattern in path for pattern in patterns)


class _DecoupledWeightDecayOptimizer(keras.optimizers.Optimizer):
    """Shared by AdamW and LAMB: first/second moments and the per-variable weight-decay decision."""

    def __init__(
        self,
        learning_rate,
        weight_decay_rate,
        beta_1,
        beta_2,
        epsilon,
        exclude_from_weight_decay,
        name,
        bias_correction_restart=0,
        learning_rate_factors=(),
        **kwargs,
    ):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        # The update count from which bias correction starts over (0: never): NVIDIA's phase 2
        # resets the optimizer's step, so its bias correction begins again there.
        self.bias_correction_restart = int(bias_correction_restart)
        self.weight_decay_rate = float(weight_decay_rate)
        self.beta_1 = float(beta_1)
        self.beta_2 = float(beta_2)
        self.epsilon = float(epsilon)
        self.exclude_from_weight_decay = tuple(exclude_from_weight_decay or ())
        # (path pattern, factor) pairs: a variable whose path holds a pattern steps at that multiple
        # of the schedule's rate (the first pattern that matches); others at the rate itself.
        self.learning_rate_factors = tuple((str(p), float(f)) for p, f in learning_rate_factors)

    def build(self, var_list):
        """Creates the m and v slots and decides, once, which variables are excluded from decay."""
        if self.built:
            return
        super().build(var_list)
        self._first_moments = [self.add_variable_from_reference(v, "m") for v in var_list]
        self._second_moments = [self.add_variable_from_reference(v, "v") for v in var_list]
        # Decided from the Keras variable path here, because update_step receives the
        # underlying per-device tf.Variable whose name may carry a replica suffix.
        self._excluded = [_matches_any(v.path, self.exclude_from_weight_decay) for v in var_list]
        self._rate_factors = [self._rate_factor_of(v.path) for v in var_list]

    def _rate_factor_of(self, path):
        return next((f for p, f in self.learning_rate_factors if p in path), 1.0)

    def variable_learning_rate(self, learning_rate, variable):
        """The schedule's `learning_rate` for `variable`: times its factor where one applies."""
        factor = self._rate_factors[self._get_variable_index(variable)]
        return learning_rate if factor == 1.0 else learning_rate * factor

    def is_excluded(self, variable):
        """Whether `variable` (one this optimizer was built with) matches exclude_from_weight_decay."""
        return self._excluded[self._get_variable_index(variable)]

    def decays_variable(self, variable):
        """Whether `variable` (one this optimizer was built with) receives weight decay."""
        return self.weight_decay_rate > 0 and not self.is_excluded(variable)

    def bias_correction_step(self, dtype):
        """t of Adam's bias correction 1 - beta^t for this update: the updates since the last start."""
        iterations = tf.cast(self.iterations, dtype)
        if self.bias_correction_restart:
            restart = float(self.bias_correction_restart)
            iterations = tf.where(iterations >= restart, iterations - restart, iterations)
        return iterations + 1.0

    def _update_moments(self, gradient, variable):
        """m <- b1 m + (1-b1) g; v <- b2 v + (1-b2) g^2; returns the new (m, v) values."""
        index = self._get_variable_index(variable)
        m, v = self._first_moments[index], self._second_moments[index]
        gradient = tf.cast(tf.convert_to_tensor(gradient), variable.dtype)
        new_m = self.beta_1 * m + (1.0 - self.beta_1) * gradient
        new_v = self.beta_2 * v + (1.0 - self.beta_2) * tf.square(gradient)
        self.assign(m, new_m)
        self.assign(v, new_v)
        return new_m, new_v

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "weight_decay_rate": self.weight_decay_rate,
                "beta_1": self.beta_1,
                "beta_2": self.beta_2,
                "epsilon": self.epsilon,
                "exclude_from_weight_decay": list(self.exclude_from_weight_decay),
                "bias_correction_restart": self.bias_correction_restart,
                "learning_rate_factors": [list(pair) for pair in self.learning_rate_factors],
            }
        )
        return config


@keras.saving.register_keras_serializable(package="bert_tf")
class AdamWeightDecay(_DecoupledWeightDecayOptimizer):
    """The original BERT `AdamWeightDecayOptimizer`: Adam, decoupled weight decay, NO bias correction.

    Per variable x with gradient g:  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
    u = m / (sqrt(v) + eps) (+ wd * x unless excluded);  x = x - lr * u.

    Bias correction is OFF by default because the original omits it, and every published BERT
    recipe (lr 1e-4 with 10k warmup steps; 2e-5..5e-5 for fine-tuning) was tuned without it: the
    warmup already keeps the first updates small, and keeping the same update rule means those
    hyperparameters behave as they did. (An original checkpoint's adam_m/adam_v slots are never
    loaded; the original's --init_checkpoint does not load them either, so the moments start at
    zero in both.) `bias_correction=True` gives standard AdamW (Loshchilov & Hutter) for users who
    want it.
    """

    def __init__(
        self,
        learning_rate=1e-4,
        weight_decay_rate=0.01,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-6,
        exclude_from_weight_decay=DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY,
        bias_correction=False,
        name="adam_weight_decay",
        **kwargs,
    ):
        super().__init__(
            learning_rate,
            weight_decay_rate,
            beta_1,
            beta_2,
            epsilon,
            exclude_from_weight_decay,
            name,
            **kwargs,
        )
        self.bias_correction = bool(bias_correction)

    def update_step(self, gradient, variable, learning_rate):
        """One AdamW update of `variable`."""
        learning_rate = self.variable_learning_rate(
            tf.cast(learning_rate, variable.dtype), variable
        )
        if not self.bias_correction:
            self._fused_update_step(gradient, variable, learning_rate)
            return
        m, v = self._update_moments(gradient, variable)
        t = self.bias_correction_step(variable.dtype)
        m = m / (1.0 - tf.pow(tf.cast(self.beta_1, variable.dtype), t))
        v = v / (1.0 - tf.pow(tf.cast(self.beta_2, variable.dtype), t))
        update = m / (tf.sqrt(v) + self.epsilon)
        if self.decays_variable(variable):
            update += self.weight_decay_rate * tf.convert_to_tensor(variable)
        self.assign_sub(variable, learning_rate * update)

    def _fused_update_step(self, gradient, variable, learning_rate):
        """The same update without bias correction, as one XLA-fused loop that writes in place.

        Written op by op, the update makes about 30 passes over the weights, moments and
        gradient; fused, it reads each once. It also writes the three variables in place: an XLA
        call that returned new m, v and x instead allocated three fresh buffers per variable and
        step, and on a CPU the page faults of those (47 MB each for a 30522 x 384 word embedding)
        made the whole update 3.4x slower (120 ms against 35 ms per step for all-MiniLM-L6-v2,
        bit-identical results). (TensorFlow's fused ResourceApplyAdam would be as fast, but it
        forms 1 - beta_2 in float32, 1.3e-5 off.)
        """
        index = self._get_variable_index(variable)
        gradient = tf.cast(tf.convert_to_tensor(gradient), variable.dtype)
        decay = self.weight_decay_rate if self.decays_variable(variable) else 0.0
        hyperparameters = (learning_rate, self.beta_1, self.beta_2, self.epsilon, decay)
        x = variable.value if isinstance(variable, keras.Variable) else variable
        m = _component_beside(self._first_moments[index], x)
        v = _component_beside(self._second_moments[index], x)
        if m is not None and v is not None and not isinstance(x, tf.distribute.DistributedValues):
            _adamw_update_in_place(gradient, m, v, x, *hyperparameters)
            return
        # No per-device copy to write (a TPU's replicated variable): the assigns go through the
        # distributed variables, which route them.
        m, v = self._first_moments[index], self._second_moments[index]
        new_m, new_v, new_x = _adamw_values(
            gradient,
            tf.convert_to_tensor(m),
            tf.convert_to_tensor(v),
            tf.convert_to_tensor(variable),
            *hyperparameters,
        )
        self.assign(m, new_m)
        self.assign(v, new_v)
        self.assign(variable, new_x)

    def get_config(self):
        config = super().get_config()
        config["bias_correction"] = self.bias_correction
        return config


def _adamw_values(gradient, m, v, x, learning_rate, beta_1, beta_2, epsilon, decay):
    """(m, v, x) after one AdamW step without bias correction (the hyperparameters are Python floats)."""
    new_m = beta_1 * m + (1.0 - beta_1) * gradient
    new_v = beta_2 * v + (1.0 - beta_2) * tf.square(gradient)
    update = new_m / (tf.sqrt(new_v) + epsilon)
    if decay:
        update += decay * x
    return new_m, new_v, x - learning_rate * update


# No AutoGraph: the function has no tensor control flow, and AutoGraph's work on each of its
# traces (one per variable shape and decay) made tracing a MiniLM's 105 updates 0.3 to 0.8 s
# longer (2.2 s in all).
@tf.function(jit_compile=True, autograph=False)
def _adamw_update_in_place(gradient, m, v, x, learning_rate, beta_1, beta_2, epsilon, decay):
    """One AdamW step without bias correction, written into the tf.Variables m, v and x."""
    new_m, new_v, new_x = _adamw_values(
        gradient, m, v, x, learning_rate, beta_1, beta_2, epsilon, decay
    )
    m.assign(new_m)
    v.assign(new_v)
    x.assign(new_x)


def _component_beside(slot, variable):
    """The tf.Variable of optimizer slot `slot` (a keras.Variable) on `variable`'s device, or None.

    Under a tf.distribute strategy a slot is a distributed variable with one tf.Variable per
    device, and update_step runs once per device on that device's copy of the model variable.
    """
    copies = tf.distribute.get_strategy().experimental_local_results(slot.value)
    beside = copies if len(copies) == 1 else [c for c in copies if c.device == variable.device]
    if len(beside) != 1 or isinstance(beside[0], tf.distribute.DistributedValues):
        return None
    return beside[0]


@keras.saving.register_keras_serializable(package="bert_tf")
class Lamb(_DecoupledWeightDecayOptimizer):
    """LAMB (You et al. 2019, Algorithm 2): bias-corrected Adam direction, layer-wise trust ratio.

    r = m_hat / (sqrt(v_hat) + eps);  u = r + wd * x;  x = x - lr * (||x|| / ||u||) * u, with the
    ratio 1 when either norm is 0; m_hat and v_hat are bias-corrected, with t counted from
    `bias_correction_restart` after it. Variables excluded from weight decay (LayerNorm, biases)
    also get ratio 1: TF-Addons' LAMB does this by default (exclude_from_layer_adaptation falls
    back to exclude_from_weight_decay), as does NVIDIA's PyTorch BERT (apex's FusedLAMB skips
    the ratio for parameter groups without weight decay unless use_nvlamb). NVIDIA's TensorFlow 2
    BERT does not: it passes exclude_from_layer_adaptation=['None'], a pattern no variable
    name matches, so every variable, LayerNorm and biases included, gets the ratio. Ours keeps
    the exclusion: the norm of a LayerNorm scale or a bias says nothing about a layer's scale.
    """

    def __init__(
        self,
        learning_rate=1e-3,
        weight_decay_rate=0.01,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-6,
        exclude_from_weight_decay=DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY,
        name="lamb",
        **kwargs,
    ):
        super().__init__(
            learning_rate,
            weight_decay_rate,
            beta_1,
            beta_2,
            epsilon,
            exclude_from_weight_decay,
            name,
            **kwargs,
        )

    def update_step(self, gradient, variable, learning_rate):
        """One LAMB update of `variable`."""
        learning_rate = self.variable_learning_rate(
            tf.cast(learning_rate, variable.dtype), variable
        )
        m, v = self._update_moments(gradient, variable)
        t = self.bias_correction_step(variable.dtype)
        m_hat = m / (1.0 - tf.pow(tf.cast(self.beta_1, variable.dtype), t))
        v_hat = v / (1.0 - tf.pow(tf.cast(self.beta_2, variable.dtype), t))
        update = m_hat / (tf.sqrt(v_hat) + self.epsilon)
        value = tf.convert_to_tensor(variable)
        if self.decays_variable(variable):
            update += self.weight_decay_rate * value
        if not self.is_excluded(variable):
            weight_norm = tf.norm(value)
            update_norm = tf.norm(update)
            ratio = tf.where(
                (weight_norm > 0) & (update_norm > 0),
                weight_norm / tf.maximum(update_norm, 1e-30),
                1.0,
            )
            update = ratio * update
        self.assign_sub(variable, learning_rate * update)


DEFAULT_EPSILON = 1e-6  # the original's
DEFAULT_DECAY_POWER = 1.0  # the original's linear decay after warm-up


def create_optimizer(
    name,
    learning_rate,
    num_train_steps,
    num_warmup_steps,
    weight_decay_rate=0.01,
    epsilon=DEFAULT_EPSILON,
    bias_correction=False,
    restart=None,
    decay_power=1.0,
    learning_rate_factors=(),
):
    """`adamw` (the original's, or with `bias_correction` standard AdamW) or `lamb`, on the warmup +
    decay schedule, linear or of `decay_power` (with a ScheduleRestart `restart`: that schedule to
    restart.start_step, then the restart's, where bias correction starts over as in NVIDIA's phase
    2; num_train_steps is then unused). `learning_rate_factors`: (path pattern, factor) pairs, the
    variables whose path holds a pattern stepping at that multiple of the schedule's rate."""
    if restart is None:
        schedule = WarmupLinearDecay(learning_rate, num_train_steps, num_warmup_steps, decay_power)
    else:
        schedule = RestartedWarmupLinearDecay(learning_rate, num_warmup_steps, restart, decay_power)
    restart_step = restart.start_step if restart is not None else 0
    common = dict(
        learning_rate=schedule,
        weight_decay_rate=weight_decay_rate,
        epsilon=epsilon,
        bias_correction_restart=restart_step,
        learning_rate_factors=learning_rate_factors,
    )
    if name == "adamw":
        return AdamWeightDecay(bias_correction=bias_correction, **common)
    if name == "lamb":
        if bias_correction:
            raise ValueError("bias_correction applies to adamw, not lamb")
        return Lamb(**common)
    raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
