"""bert_tf: BERT end to end in TensorFlow/Keras: data, pretraining, fine-tuning, export, serving."""

import os
import sys

__version__ = "0.1.0"

# On Linux TensorFlow turns its oneDNN kernels on by itself only where the CPU has AVX-512 VNNI or
# BF16, AVX-VNNI or AMX (DefaultOneDnnPolicy in tensorflow/core/util/port.cc). On a 2-core AVX2
# CPU a MiniLM training step (batch 32 x 24 tokens) took 22% less time with them than with the
# default Eigen kernels, so the training jobs turn them on there too; a user's own
# TF_ENABLE_ONEDNN_OPTS still wins. Export and serving keep TensorFlow's choice: on that CPU
# oneDNN made BERT-base inference slower (benchmarks/RESULTS.md).
TRAINING_JOBS = (
    "bert_tf.run_classifier",
    "bert_tf.run_multiple_choice",
    "bert_tf.run_ner",
    "bert_tf.run_pretraining",
    "bert_tf.run_squad",
)


def job_module(orig_argv):
    """The module a `python -m MODULE ...` command line runs, from sys.orig_argv; None otherwise."""
    args = iter(orig_argv[1:])
    for arg in args:
        if arg == "-m":
            return next(args, None)
        if arg.startswith("-m"):
            return arg[2:]
        if arg in ("-W", "-X"):
            next(args, None)  # the option's value
        elif not arg.startswith("-"):
            return None  # a script path: no -m
    return None


# `python -m bert_tf.<job>`: Python sets sys.argv[0] to "-m" while it imports this package, before
# the job imports TensorFlow, which reads TF_ENABLE_ONEDNN_OPTS when it loads. A command line is
# quiet by default (see bert_tf.quiet); a library import changes nothing.
if sys.argv[:1] == ["-m"]:
    from bert_tf import quiet

    quiet.install()
    if job_module(sys.orig_argv) in TRAINING_JOBS:
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
