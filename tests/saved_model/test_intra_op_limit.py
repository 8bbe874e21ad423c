"""intra_op_limit runs a graph function with its kernels held to a number of intra-op threads."""

import json
import textwrap

import numpy as np
import tensorflow as tf
from helpers import run_python_script

from bert_tf.saved_model import intra_op_limit


def nested_function(inputs):
    """Outputs of several dtypes and ranks, in a dict holding a list, from a dict of inputs."""
    ids, values = inputs["ids"], inputs["values"]
    return {
        "sums": tf.reduce_sum(values, axis=-1),
        "layers": [values * 2.0, tf.matmul(values, values, transpose_b=True)],
        "ids": ids + 1,
    }


def test_outputs_are_the_functions_whatever_the_limit():
    inputs = {
        "ids": np.arange(6, dtype=np.int32).reshape(2, 3),
        "values": np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32),
    }
    want = nested_function(inputs)
    spec = {
        "ids": tf.TensorSpec([None, None], tf.int32),
        "values": tf.TensorSpec([None, None], tf.float32),
    }
    function = intra_op_limit.ThreadLimitedFunction(nested_function)
    for limit in (1, 2, intra_op_limit.NO_LIMIT):
        limited = tf.function(
            lambda x, limit=limit: function(x, tf.constant(limit)), input_signature=[spec]
        )
        got = limited(inputs)
        assert isinstance(got["layers"], list) and sorted(got) == sorted(want)
        tf.nest.map_structure(
            lambda g, w: np.testing.assert_array_equal(np.asarray(g), np.asarray(w)), got, want
        )
        # A batch of none goes through too.
        empty = limited({"ids": inputs["ids"][:0], "values": inputs["values"][:0]})
        assert empty["sums"].shape == (0,) and empty["layers"][1].shape == (0, 0)


def test_it_is_traced_once_for_every_graph_and_runs_as_is_eagerly():
    calls = []

    def record(x):
        calls.append(tf.executing_eagerly())
        return x + 1

    function = intra_op_limit.ThreadLimitedFunction(record)
    spec = tf.TensorSpec([None], tf.int32)
    for _ in range(2):  # two graphs, as an export's signatures call it
        graph_call = tf.function(lambda x: function(x, 1), input_signature=[spec])
        assert graph_call(tf.constant([1, 2])).numpy().tolist() == [2, 3]
    assert calls == [False]
    assert function(tf.constant(1), 1).numpy() == 2
    assert calls == [False, True]


def test_the_limit_reaches_the_kernels():
    """Under a limit of 1 a matmul runs on the inter-op thread that runs its op (TensorFlow names
    those threads tf_Compute); without one, on the intra-op pool's threads. Read from each thread's
    CPU time in /proc, so the machine's load does not change the answer."""
    script = textwrap.dedent(
        """
        import json, os
        # The Eigen kernels the limit is for: oneDNN's size their work by the pool itself.
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(2)
        tf.config.threading.set_inter_op_parallelism_threads(2)
        from bert_tf.saved_model import intra_op_limit

        def cpu_ticks():
            ticks = {}
            for tid in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{tid}/comm") as f:
                        name = f.read().strip()
                    with open(f"/proc/self/task/{tid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except FileNotFoundError:  # a thread that has just ended
                    continue
                ticks[tid] = (name, int(fields[11]) + int(fields[12]))
            return ticks

        weights = tf.random.stateless_normal([512, 512], seed=[1, 2]) / 23
        x = tf.random.stateless_normal([512, 512], seed=[3, 4])

        def chain(x):
            for _ in range(40):
                x = tf.matmul(x, weights)
            return x

        shares = {}
        for limit in (1, intra_op_limit.NO_LIMIT):
            f = tf.function(lambda x: intra_op_limit.ThreadLimitedFunction(chain)(x, limit))
            f(x)
            before = cpu_ticks()
            for _ in range(4):
                f(x).numpy()
            used = {
                tid: (name, ticks - before.get(tid, (name, 0))[1])
                for tid, (name, ticks) in cpu_ticks().items()
            }
            inter_op = sum(t for name, t in used.values() if name == "tf_Compute")
            shares[limit] = inter_op / sum(t for _, t in used.values())
        print(json.dumps(shares))
        """
    )
    result = run_python_script(script, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    shares = {int(k): v for k, v in json.loads(result.stdout.splitlines()[-1]).items()}
    assert shares[1] > 0.9, shares
    assert shares[intra_op_limit.NO_LIMIT] < 0.5, shares
