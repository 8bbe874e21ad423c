"""Running part of a graph with its kernels held to fewer intra-op threads than the process has.

Every kernel gets the process's intra-op pool, and Eigen's kernels (every matmul where TensorFlow
leaves oneDNN off) split their work over it by size alone, even where the handing off costs more
than it saves (benchmarks/RESULTS.md, "Inference: TensorFlow's default threads"). A SavedModel
cannot set the pool's size: TF Serving takes it from its flags, `tf.saved_model.load` from the
process. One control does reach a graph's kernels, call by call: the kernels of a tf.data function
that runs under MaxIntraOpParallelismDataset take its limit as their number of threads
(TensorFlow's per-thread max parallelism, which each kernel's Eigen device reads). So
`ThreadLimitedFunction` runs a function as the map of a one-element dataset under that limit;
the graph stays made of TensorFlow's own ops, which stock TF Serving runs. tf.data runs its
functions on the host's CPU, so where the graph runs on another device (a GPU) the function is
called as is, on the device the placer picks.
"""

import tensorflow as tf

# The per-thread limit TensorFlow gives every thread to begin with, which limits nothing.
NO_LIMIT = 1_000_000


class ThreadLimitedFunction:
    """fn, called with each of its kernels held to a number of intra-op threads given per call.

    fn takes a nest of tensors and returns one. It is traced once for all the graphs that call it
    with inputs of the same specs (an export's signatures share the trace). A plain object, not a
    tf.Module, so that saving does not serialize fn's functions apart from the graphs that call
    them.
    """

    def __init__(self, fn):
        self.fn = fn
        # fn as a function of its own, which grappler optimizes when its call op first runs.
        self.inner = tf.function(fn, autograph=False, experimental_attributes={"_noinline": True})
        # Each time tf.data makes an iterator of a multi-device map function, it checks every op
        # of that function and every captured input: a MiniLM classifier export's batch 1 took
        # 3.1 ms more than without the dataset, against 0.3 ms for a function marked
        # ints-on-device, which runs on one device (the CPU) and skips the check.
        self.map_function = tf.function(
            lambda inputs: tf.nest.flatten(self.inner(inputs)),
            autograph=False,
            experimental_attributes={"experimental_ints_on_device": True},
        )

    def __call__(self, inputs, max_threads):
        """fn(inputs) with each kernel on at most `max_threads` (int or int tensor) intra-op
        threads where the call runs on a CPU. In a graph only: eagerly, fn runs as is."""
        if tf.executing_eagerly():
            return self.fn(inputs)
        # 0 where this op runs on a CPU: its kernel reads the type of the device it is placed on.
        on_cpu = tf.raw_ops.DeviceIndex(device_names=["CPU"]) == 0
        return tf.cond(
            on_cpu, lambda: self.limited(inputs, max_threads), lambda: self.inner(inputs)
        )

    def limited(self, inputs, max_threads):
        """fn(inputs) run by tf.data under the limit (on the CPU)."""
        spec = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), inputs)
        mapped = self.map_function.get_concrete_function(spec)
        types = [t.dtype for t in mapped.outputs]
        shapes = [t.shape for t in mapped.outputs]
        flat_inputs = tf.nest.flatten(inputs)
        dataset = tf.raw_ops.TensorDataset(
            components=flat_inputs, output_shapes=[t.shape for t in flat_inputs]
        )
        dataset = tf.raw_ops.MapDataset(
            input_dataset=dataset,
            other_arguments=mapped.captured_inputs,
            f=mapped,
            output_types=types,
            output_shapes=shapes,
            # The map function is one call of `inner` (whose own ops still run side by side):
            # tf.data's single-threaded executor runs that call for less than the default
            # executor (benchmarks/RESULTS.md, "Inference: what each export choice buys").
            use_inter_op_parallelism=False,
            preserve_cardinality=True,
        )
        dataset = tf.raw_ops.MaxIntraOpParallelismDataset(
            input_dataset=dataset,
            max_intra_op_parallelism=tf.cast(max_threads, tf.int64),
            output_types=types,
            output_shapes=shapes,
        )
        flat_outputs = tf.raw_ops.DatasetToSingleElement(
            dataset=dataset, output_types=types, output_shapes=shapes
        )
        structure = self.inner.get_concrete_function(spec).structured_outputs
        return tf.nest.pack_sequence_as(structure, flat_outputs)
