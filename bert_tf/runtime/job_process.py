"""What a `python -m bert_tf.<job>` process sets up before TensorFlow loads.

Every CLI module imports this module first, above its other imports. It acts only when the module
that runs as the program (`__main__`) is a bert_tf job, so importing a job as a library changes
nothing:
- the output is quiet (bert_tf.runtime.quiet): TensorFlow's start-up notices go, warnings and errors stay;
- a training job turns TensorFlow's oneDNN kernels on where TensorFlow would leave them off.

On Linux TensorFlow turns oneDNN on by itself only where the CPU has AVX-512 VNNI or BF16, AVX-VNNI
or AMX (DefaultOneDnnPolicy in tensorflow/core/util/port.cc). On a 2-core AVX2 CPU a MiniLM training
step took 22% less time with it, so the training jobs turn it on there too; a user's own
TF_ENABLE_ONEDNN_OPTS still wins. Export and serving keep TensorFlow's choice: oneDNN brought
inference no dependable gain there (benchmarks/RESULTS.md).
"""

import os
import sys

from bert_tf.runtime import quiet

TRAINING_JOBS = (
    "bert_tf.run_classifier",
    "bert_tf.run_multiple_choice",
    "bert_tf.run_ner",
    "bert_tf.run_pretraining",
    "bert_tf.run_squad",
)


def main_module_name(modules=None):
    """The name of the module running as the program (`python -m NAME`), or None for a script or -c."""
    main = (sys.modules if modules is None else modules).get("__main__")
    spec = getattr(main, "__spec__", None)
    return getattr(spec, "name", None)


def set_up(job, environ=os.environ):
    """Sets the process up for `job` (a module name) if it is one of bert_tf's; returns whether it did."""
    if not (job or "").startswith("bert_tf."):
        return False
    quiet.install()
    turn_onednn_on(job, environ)
    return True


def turn_onednn_on(job, environ):
    """A training job turns TensorFlow's oneDNN on, unless the user chose (set before TensorFlow loads)."""
    if job in TRAINING_JOBS:
        environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")


set_up(main_module_name())
