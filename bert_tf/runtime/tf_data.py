"""The tf.data settings every input pipeline shares (pretraining's and the fine-tuning tasks')."""

import tensorflow as tf


def without_autotune(dataset, deterministic=None):
    """`dataset` with tf.data's autotuning off (and `deterministic` set where given).

    With autotuning on, TF 2.21 makes the deletion of an iterator wait for the autotuner's
    background thread, for longer the longer the iterator has run: seconds after a finished eval
    pass, and at exit (benchmarks/RESULTS.md, "Fine-tuning: what each choice buys"). Our pipelines
    parse (and re-mask) batches at a small fraction of a model step's cost, so they take AUTOTUNE's
    fixed defaults instead (parallelism min(16, cores)): fine-tuning's steady training speed is
    unchanged within noise, and no deletion waits.
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    if deterministic is not None:
        options.deterministic = deterministic
    return dataset.with_options(options)
