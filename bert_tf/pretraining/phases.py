"""The paper's two pretraining phases as one run: most steps on short sequences, the rest on long ones.

The paper (Appendix A.2) trains 90% of its steps at length 128 and the last 10% at 512, where the
position embeddings beyond 128 learn; Google's README gives 90,000 + 10,000 steps as a recipe, on
records made twice, once for each length. Here one command runs both phases in one output directory:

    run_pretraining --input_file=len128/*.tfrecord --max_seq_length=128 \\
        --max_predictions_per_seq=20 --num_train_steps=90000 \\
        --phase2_input_file=len512/*.tfrecord --phase2_max_seq_length=512 \\
        --phase2_max_predictions_per_seq=80 --phase2_train_steps=10000 ...

Steps 1..N1 read phase 1's records, steps N1+1..N1+N2 phase 2's. The step count, the checkpoints
and TensorBoard's train/ run on across the boundary; which phase a resumed run is in follows from
its checkpoint's step, and each phase's input position is saved under its own checkpoint key.

The learning rate and the optimizer across the boundary (--phase2_recipe):
  continue  the paper's single schedule: one warm-up, one linear decay to 0 at N1+N2, Adam's moments
            kept. Google's scripts do the same when phase 2 reruns in the same --output_dir with
            --num_train_steps=N1+N2 (the Estimator restores the step and the moments), except that
            their phase 1 decayed towards 0 at N1.
  restart   NVIDIA's (DeepLearningExamples, PyTorch): phase 1's schedule decays to 0 at N1; phase 2
            warms up afresh to --phase2_learning_rate over --phase2_warmup_steps, then decays to 0 at
            N1+N2. The moments are kept, as NVIDIA loads LAMB's state, and the bias correction of
            LAMB (and of --adam_bias_correction's AdamW) starts over at N1, as NVIDIA's reset of
            the optimizer's step makes it. NVIDIA's LAMB schedule decays as (1 - progress) ** 0.5:
            --lr_decay_power=0.5 (PyTorch's PolyWarmUpScheduler, TensorFlow 2's PolynomialDecay).
            What still differs: NVIDIA's phases run at different global batch sizes (65,536 then
            32,768 sequences); here both phases take --train_batch_size.
Google's other route, a new --output_dir with --init_checkpoint, and NVIDIA's TensorFlow 2 scripts
restore the weights alone: the moments and the step start at 0. --init_checkpoint does that here.

The phase flags are recorded in the output directory (PHASES_FILE); a two-phase run resumed with
other values is refused, naming them, unless --overwrite. A run recorded without a phase 2 may
gain one (under continue its decay then ends at N1+N2, not N1: the rate jumps up if phase 1 had
decayed), and a one-phase run may change its steps or records as the original's may.
"""

import dataclasses
import json
import os

import tensorflow as tf
from absl import logging

from bert_tf.model.model_dir import ModelDir
from bert_tf.runtime import io_utils
from bert_tf.training import optimization, training_loop

PHASES_FILE = "pretraining_phases.json"
CONTINUE, RESTART = "continue", "restart"
RECIPES = (CONTINUE, RESTART)
# The flags that shape the phases: a resumed run must keep them.
PHASE_FLAGS = (
    "num_train_steps",
    "max_seq_length",
    "max_predictions_per_seq",
    "phase2_train_steps",
    "phase2_max_seq_length",
    "phase2_max_predictions_per_seq",
    "phase2_recipe",
    "phase2_learning_rate",
    "phase2_warmup_steps",
)
# What --phase2_warmup_steps is under the restart recipe when not given: a tenth of phase 2.
DEFAULT_RESTART_WARMUP_FRACTION = 0.1


@dataclasses.dataclass(frozen=True)
class Phase:
    """One stretch of a pretraining run and the records it reads."""

    number: int
    input_flag: str  # the flag naming its records, for error messages
    input_file: str
    max_seq_length: int
    max_predictions_per_seq: int
    end_step: int  # the global step it trains to
    num_accumulation_steps: int
    accumulation_flag: str  # the flag that set num_accumulation_steps

    @property
    def iterator_name(self):
        """Its input iterator's key in the checkpoints."""
        return (
            training_loop.TRAIN_ITERATOR
            if self.number == 1
            else f"phase{self.number}_train_iterator"
        )

    @property
    def _flag_prefix(self):
        return "--" if self.number == 1 else f"--phase{self.number}_"

    @property
    def length_flags(self):
        """The flags of its two record lengths."""
        return (f"{self._flag_prefix}max_seq_length", f"{self._flag_prefix}max_predictions_per_seq")

    def describe(self):
        return (
            f"phase {self.number} (to step {self.end_step}, length {self.max_seq_length}, "
            f"{self.max_predictions_per_seq} predictions)"
        )


@dataclasses.dataclass(frozen=True)
class PhaseSettings:
    """The phase flags' values: phase 1 is the run's own length flags and --num_train_steps."""

    input_file: str
    max_seq_length: int
    max_predictions_per_seq: int
    num_train_steps: int
    num_accumulation_steps: int = 1
    phase2_input_file: str = ""
    phase2_max_seq_length: int = 512
    phase2_max_predictions_per_seq: int = 80
    phase2_train_steps: int = 0
    phase2_num_accumulation_steps: int | None = None  # None: num_accumulation_steps
    phase2_recipe: str = CONTINUE
    phase2_learning_rate: float | None = None  # None: the run's learning rate
    phase2_warmup_steps: int | None = None  # None: DEFAULT_RESTART_WARMUP_FRACTION of phase 2

    @property
    def has_phase2(self):
        return bool(self.phase2_input_file)

    @property
    def total_steps(self):
        return self.num_train_steps + (self.phase2_train_steps if self.has_phase2 else 0)

    def validate(self):
        """Usage errors among the phase-2 flags, each naming its flag."""
        given = [
            name
            for name in (
                "phase2_train_steps",
                "phase2_num_accumulation_steps",
                "phase2_learning_rate",
                "phase2_warmup_steps",
            )
            if getattr(self, name)
        ]
        if self.phase2_recipe != CONTINUE:
            given.append("phase2_recipe")
        if not self.has_phase2:
            if given:
                raise io_utils.UsageError(
                    f"--{given[0]} needs --phase2_input_file (the phase-2 records)"
                )
            return
        if self.phase2_recipe not in RECIPES:
            raise io_utils.UsageError(
                f"--phase2_recipe must be one of {', '.join(RECIPES)}, got {self.phase2_recipe!r}"
            )
        for name in (
            "phase2_train_steps",
            "phase2_max_seq_length",
            "phase2_max_predictions_per_seq",
        ):
            if getattr(self, name) <= 0:
                raise io_utils.UsageError(
                    f"--{name} must be positive with --phase2_input_file, got {getattr(self, name)}"
                )
        if self.phase2_recipe == CONTINUE:
            for name in ("phase2_learning_rate", "phase2_warmup_steps"):
                if getattr(self, name) is not None:
                    raise io_utils.UsageError(
                        f"--{name} applies to --phase2_recipe={RESTART}; under "
                        f"--phase2_recipe={CONTINUE} one schedule spans both phases"
                    )
        if self.phase2_learning_rate is not None and not self.phase2_learning_rate > 0:
            raise io_utils.UsageError(
                f"--phase2_learning_rate must be positive, got {self.phase2_learning_rate}"
            )
        if self.phase2_warmup_steps is not None and self.phase2_warmup_steps < 0:
            raise io_utils.UsageError(
                f"--phase2_warmup_steps must not be negative, got {self.phase2_warmup_steps}"
            )

    def phases(self):
        """The run's Phases, in order."""
        phases = [
            Phase(
                1,
                "--input_file",
                self.input_file,
                self.max_seq_length,
                self.max_predictions_per_seq,
                self.num_train_steps,
                self.num_accumulation_steps,
                "--num_accumulation_steps",
            )
        ]
        if self.has_phase2:
            if self.phase2_num_accumulation_steps is None:  # phase 1's
                accumulation = (self.num_accumulation_steps, "--num_accumulation_steps")
            else:
                accumulation = (
                    self.phase2_num_accumulation_steps,
                    "--phase2_num_accumulation_steps",
                )
            phases.append(
                Phase(
                    2,
                    "--phase2_input_file",
                    self.phase2_input_file,
                    self.phase2_max_seq_length,
                    self.phase2_max_predictions_per_seq,
                    self.total_steps,
                    *accumulation,
                )
            )
        return phases

    def schedule_restart(self, learning_rate):
        """The optimization.ScheduleRestart of the restart recipe; None under continue (or one phase)."""
        if not self.has_phase2 or self.phase2_recipe != RESTART:
            return None
        warmup = self.phase2_warmup_steps
        if warmup is None:
            warmup = int(DEFAULT_RESTART_WARMUP_FRACTION * self.phase2_train_steps)
        return optimization.ScheduleRestart(
            start_step=self.num_train_steps,
            peak_learning_rate=self.phase2_learning_rate or learning_rate,
            num_train_steps=self.phase2_train_steps,
            num_warmup_steps=warmup,
        )

    def recorded(self):
        """What PHASES_FILE keeps: the phase flags (phase 2's only when there is one)."""
        values = {name: getattr(self, name) for name in PHASE_FLAGS}
        if not self.has_phase2:
            values = {
                name: value for name, value in values.items() if not name.startswith("phase2")
            }
        return values


def phase_at(phases, step):
    """The phase that trains step `step` + 1: the first not yet finished (the last when all are)."""
    for phase in phases:
        if step < phase.end_step:
            return phase
    return phases[-1]


def _phases_path(output_dir):
    return os.path.join(output_dir, PHASES_FILE)


def read_recorded(output_dir):
    """The phase flags recorded in `output_dir`, or None."""
    path = _phases_path(output_dir)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


def check_resumed(output_dir, settings, overwrite):
    """A usage error when a run with checkpoints in `output_dir` was started with other phase flags.

    Only runs with a phase 2 (recorded or asked for) are checked: a one-phase run may go on with
    another --num_train_steps or other records, as the original's does. Adding a phase 2 to a run
    recorded without one is allowed (it continues that run); any other change needs `overwrite`,
    which logs what changes.
    """
    recorded = read_recorded(output_dir)
    if recorded is None or not ModelDir(output_dir).latest_step():
        return
    current = settings.recorded()
    adds_phase2 = not any(name.startswith("phase2") for name in recorded)
    if adds_phase2 and not settings.has_phase2:
        return
    changed = [
        name
        for name in PHASE_FLAGS
        if (name in recorded or name in current)
        and recorded.get(name) != current.get(name)
        and not (adds_phase2 and name.startswith("phase2"))
    ]
    if not changed:
        return
    described = ", ".join(
        f"--{name}={_flag_value(current.get(name))} (the run has {_flag_value(recorded.get(name))})"
        for name in changed
    )
    if not overwrite:
        raise io_utils.UsageError(
            f"--output_dir={output_dir} holds a run started with other phase flags: {described}. "
            "Resume with the run's values, use a new --output_dir, or pass --overwrite to go on "
            "with these"
        )
    logging.warning("--overwrite: %s goes on with changed phase flags: %s", output_dir, described)


def _flag_value(value):
    return "(none)" if value is None else value


def record(output_dir, settings):
    """Writes the phase flags into `output_dir` (atomically), for check_resumed."""
    io_utils.atomic_write_json(_phases_path(output_dir), settings.recorded())
