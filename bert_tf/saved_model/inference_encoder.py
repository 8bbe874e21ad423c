"""The encoder's forward pass for exported models: the Keras encoder's network in 2-D matmuls.

Why not call the Keras encoder: keras-hub's attention computes each of the query, key, value and
output projections as an einsum with its own reshapes and transposes. Here the three input
projections are one [b*s, H] by [H, 3H] MatMul (split by shard, below) and every other projection a
2-D MatMul (a MiniLM call in one part traces 449 ops besides constants and identities, the
Keras encoder's 640).
The arithmetic is the same, so the gain is the kernels not run, which shows at small batches: a
MiniLM export's batch-1 call takes about 0.8x the time (benchmarks/RESULTS.md, "Inference: what
each export choice buys"); under XLA, which fuses either graph, the two are within noise.

Each layer's attention is split by heads into SHARDS parts, each with its heads' query, key and
value columns and its rows of the attention output kernel, and its feedforward into parts of the
first kernel's columns and the second kernel's rows (feedforward_parts); the parts' outputs are
summed before each LayerNorm. A small batch's matmuls are bound by reading their weights, and the
parts, independent ops, can run side by side on TensorFlow's inter-op threads.

At TensorFlow's default threads, every oneDNN kernel that splits its work waits for the intra-op
threads, which costs more than a small batch's kernel itself: a MiniLM call with 19 tokens spent
a third of its time in such hand-offs (benchmarks/RESULTS.md, "Inference: TensorFlow's default
threads"). So the graph keeps a small batch's kernels on the thread that runs them: transposes go
through integers (Eigen's kernel, which runs small ones inline), a small attention takes Eigen's
batch matmul and log-softmax (SMALL_ATTENTION_SCORES), and the feedforward parts are made small
enough for oneDNN to run each on one thread (SINGLE_THREAD_KERNEL_BYTES). Where TensorFlow leaves
oneDNN off (AVX2 CPUs, for one), every matmul is Eigen's, which splits even a batch-1 product
over the intra-op threads while the parts already keep the cores busy: a small call runs its
kernels on one intra-op thread each (ONE_THREAD_CALL_MACS, through intra_op_limit).

It is the same network: embeddings (word + position + segment) -> LayerNorm -> post-LN
transformer layers (attention, residual, LayerNorm; feedforward, residual, LayerNorm) -> pooled
tanh(dense(first token)); a left_to_right config's attention sees each position and those before
it, and its pooler reads the last real token, as modeling.build_encoder's do. Outputs match the
Keras encoder's within float rounding (tests compare every output). Inference only: there is no
dropout, and the weights are copies of the encoder's in this layout (the matmul kernels in the
compute dtype), so training goes through bert_tf.model.modeling's Keras encoder.
"""

import math

import keras
import numpy as np
import tensorflow as tf

from bert_tf.checkpoints import name_map
from bert_tf.model import modeling
from bert_tf.saved_model import intra_op_limit

# How many parts each layer's heads are split into, and its feedforward columns at least (tensor
# parallelism, as Megatron-LM splits a layer across GPUs). TensorFlow's executor runs the parts'
# ops on its inter-op threads side by side, so a small batch's skinny matmuls, bound by reading the
# weights, read them on two cores at once (BERT-base's batch-1 call in 0.67x to 0.75x the time on 2
# cores, one intra-op thread). Figures: benchmarks/RESULTS.md, "Inference: what each export choice
# buys".
SHARDS = 2
# oneDNN runs a matmul on the calling thread when its operands fit the L2 cache (TensorFlow's
# ExecuteSingleThreadedGemm; 1 MB a core on these EPYCs): a feedforward is split in twice as many
# parts as the attention when that brings each part's kernel within this size, leaving room for a
# small batch's rows.
SINGLE_THREAD_KERNEL_BYTES = 640 * 1024
# The attention scores per head (batch x length x length) up to which a call takes Eigen's batch
# matmul and softmax, which run a small attention inline, instead of oneDNN's, which hand every
# call to the intra-op threads but are faster on large ones.
SMALL_ATTENTION_SCORES = 4096
# A call runs each kernel on one intra-op thread when its feedforward product (tokens x hidden x
# intermediate multiply-adds) is at most this: MiniLM's at 512 tokens, BERT-base's at 128. Without
# oneDNN on 2 cores, one thread took 0.66x to 0.96x the time of TensorFlow's threads for MiniLM
# texts of 12 to 512 tokens, and 0.81x to 1.01x for batches of 2 to 32 (benchmarks/RESULTS.md,
# "Inference: what each export choice buys"); larger calls keep the intra-op pool, for machines
# with more cores to give them.
ONE_THREAD_CALL_MACS = 512 * 384 * 1536
# The exact GELU of z is 0.5 * z * (1 + erf(z / sqrt(2))), which is (u + u * erf(u)) / sqrt(2)
# for u = z / sqrt(2): so the feedforward's first kernel and bias are stored times this scale, and
# its second kernel too, leaving GELU three kernels of Keras' five, and Erf where Keras runs Erfc,
# the slower kernel: a MiniLM encoder call in 0.94x (16 x 25 tokens) to 0.99x (1 x 3) the time
# (benchmarks/RESULTS.md, "Inference: what each export choice buys").
_GELU_EXACT_SCALE = 1 / math.sqrt(2)
# The compute dtypes that have CPU kernels for Eigen's BatchMatMulV3 (float16 has none; a cond
# needs kernels for both its branches, so float16 attention takes oneDNN's whatever its size).
_EIGEN_ATTENTION_DTYPES = ("float32", "bfloat16")


def _layer_norm(x, gamma, beta):
    """LayerNorm over the last axis (eps 1e-12): Keras' own op, as its layer calls it (in float32)."""
    return keras.ops.layer_normalization(
        x, gamma, beta, axis=-1, epsilon=modeling.LAYER_NORM_EPSILON
    )


def _erf_gelu(u):
    """The exact GELU of z = sqrt(2) * u, times sqrt(2): u + u * erf(u) (_GELU_EXACT_SCALE)."""
    return u + u * tf.math.erf(u)


def _transpose(x, perm):
    """tf.transpose of x through the integer type of its width, which oneDNN does not take over."""
    integer = {2: tf.int16, 4: tf.int32}[x.dtype.size]
    return tf.bitcast(tf.transpose(tf.bitcast(x, integer), perm), x.dtype)


def _batch_matmul(x, y, inline, transpose_y=False):
    """x @ y (y transposed if `transpose_y`); `inline`: with Eigen's kernel (BatchMatMulV3, which
    oneDNN does not take over), else oneDNN's."""
    if inline:
        return tf.raw_ops.BatchMatMulV3(x=x, y=y, Tout=x.dtype, adj_y=transpose_y)
    return tf.matmul(x, y, transpose_b=transpose_y)


def _softmax(x, inline):
    """Softmax over the last axis; `inline`: as exp(log_softmax), Eigen's kernels."""
    if inline:
        return tf.exp(tf.nn.log_softmax(x))
    return tf.nn.softmax(x)


class _KeyMask:
    """Which keys each query attends to, with Keras' masked softmax's values: a padding key's
    score gets a large negative number added (exp() of it is 0), and its probability is set to 0
    after the softmax (a row without real keys attends to nothing). Made once a call (and once for
    the pooled token's row) as an additive bias and a 0/1 factor, which each attention applies
    with an add and a multiply instead of two selects (benchmarks/RESULTS.md, "Inference: what
    each export choice buys")."""

    def __init__(self, real, dtype):
        """`real`: bool, broadcastable to the scores [b, heads, queries, keys]."""
        # Keras' number (its Softmax layer's): finite in float16 too, so that a row without real
        # keys stays finite until it is zeroed.
        masked_score = -3e4 if tf.as_dtype(dtype) == tf.float16 else -1e9
        self.bias = tf.where(real, tf.zeros([], dtype), tf.constant(masked_score, dtype))
        self.keep = tf.cast(real, dtype)


def small_attention(batch, length):
    """Whether an attention of `batch` rows of `length` takes Eigen's kernels: bool []."""
    scores = tf.cast(batch, tf.int64) * tf.cast(length, tf.int64) ** 2
    return scores <= SMALL_ATTENTION_SCORES


def one_thread_tokens(config):
    """The most tokens (rows x length) a call of an encoder of `config` runs on one intra-op
    thread a kernel (ONE_THREAD_CALL_MACS)."""
    return ONE_THREAD_CALL_MACS // (config.hidden_size * config.intermediate_size)


def feedforward_parts(intermediate_kernel_bytes, shards):
    """How many parts a feedforward is split into: twice `shards` if that brings each part's
    kernel within SINGLE_THREAD_KERNEL_BYTES, else `shards` (BERT-base's 9 MB would need 15 parts;
    its batch-1 call ran slower in 8 or 12 than in 2)."""
    too_big = intermediate_kernel_bytes / shards > SINGLE_THREAD_KERNEL_BYTES
    if too_big and intermediate_kernel_bytes / (2 * shards) <= SINGLE_THREAD_KERNEL_BYTES:
        return 2 * shards
    return shards


# Each weight starts a row of this many bytes in its pack, so that splitting the pack gives views
# of its buffer (TensorFlow's SplitV shares the buffer when every part starts on Eigen's 64-byte
# alignment), not copies.
_PACK_ROW_BYTES = 64


class _WeightPacks:
    """A layer's weights stored in one variable per dtype, read back as views of it in a call.

    A graph function takes every variable it reads as an input, at a cost per input in each call
    of it and of the functions and dataset ops it passes them through: a signature called from
    Python (tf.saved_model.load) whose one op takes 150 variables took 0.45 ms more a call than one
    with none, and a MiniLM export's call 1.6 to 2.0 ms more with its 151 weights apart than packed
    (benchmarks/RESULTS.md, "Inference: what each export choice buys"). Packed, a call reads one
    variable per dtype and splits it (one SplitV, one Reshape a weight), with no copy. XLA
    compiles such slices as copies (a MiniLM classifier's --jit_compile export took 91.5 ms a call
    packed against 43.8 ms apart), so `together=False` keeps each weight a variable of its own.
    """

    def __init__(self, layer, values, dtype_of, together=True):
        """`values`: {name: NumPy array}, in a stable order; `dtype_of(name)`: its stored dtype;
        `together`: one pack per dtype, else one variable per weight."""

        def add(name, value, dtype):
            variable = layer.add_weight(
                name=name,
                shape=value.shape,
                dtype=dtype,
                initializer="zeros",
                trainable=False,
                autocast=False,
            )
            variable.assign(value)
            return variable

        self.apart = {}  # {name: its own variable, in its shape}
        self.packed = []  # (variable, [(name, rows, shape)])
        if not together:
            self.apart = {name: add(name, value, dtype_of(name)) for name, value in values.items()}
            return
        for dtype in sorted({dtype_of(name) for name in values}):
            names = [name for name in values if dtype_of(name) == dtype]
            width = _PACK_ROW_BYTES // tf.as_dtype(dtype).size
            rows = [-(-values[name].size // width) for name in names]
            flat = np.zeros(sum(rows) * width, np.float32)
            start = 0
            for name, count in zip(names, rows):
                flat[start * width : start * width + values[name].size] = values[name].reshape(-1)
                start += count
            variable = add(f"weights_{dtype}", flat.reshape(-1, width), dtype)
            self.packed.append(
                (variable, [(name, count, values[name].shape) for name, count in zip(names, rows)])
            )

    def views(self):
        """{name: the weight's value}, each a view of its pack's buffer (or its own variable's
        value), named after the weight."""
        views = {name: tf.identity(v, name=name) for name, v in self.apart.items()}
        for variable, entries in self.packed:
            parts = tf.split(tf.convert_to_tensor(variable), [count for _, count, _ in entries])
            for (name, _, shape), part in zip(entries, parts):
                flat = tf.reshape(part, [-1])
                size = int(np.prod(shape))
                if flat.shape[0] != size:  # the row's padding
                    flat = flat[:size]
                views[name] = tf.reshape(flat, shape, name=name)
        return views


class InferenceEncoder(keras.layers.Layer):
    """A Keras encoder's network (its inputs and outputs) in 2-D matmuls, for inference."""

    def __init__(self, encoder, config, shards=SHARDS, limit_threads=True, **kwargs):
        kwargs.setdefault("name", "inference_encoder")
        super().__init__(**kwargs)
        # `limit_threads`: small calls on one intra-op thread (ONE_THREAD_CALL_MACS); off where the
        # call is XLA-compiled, which takes no tf.data ops.
        self.limited_forward, self.limited_pooled_forward = (
            (
                intra_op_limit.ThreadLimitedFunction(self.forward),
                intra_op_limit.ThreadLimitedFunction(lambda inputs: self.forward(inputs, True)),
            )
            if limit_threads
            else (None, None)
        )
        self.one_thread_tokens = one_thread_tokens(config)
        self.hidden_size = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.left_to_right = config.left_to_right
        # The feedforward's kernels carry the exact GELU's scale (_GELU_EXACT_SCALE).
        erf_gelu = config.hidden_act.lower() == "gelu_exact"
        self.activation = _erf_gelu if erf_gelu else modeling.get_activation(config.hidden_act)
        gelu_scale = _GELU_EXACT_SCALE if erf_gelu else 1.0
        # The encoder's weights by the original's names, in the original's 2-D shapes (the
        # checkpoint converter's map, read backwards: each Keras layout is a reshape of those).
        source = {
            name: variable.numpy().reshape(shape)
            for name, (variable, shape, _) in name_map.original_name_map(
                encoder, config.num_hidden_layers, with_heads=False
            ).items()
        }

        # The weights by name: the attributes below hold names, and a call takes the values from
        # self.packs.
        values = {}

        def copy(name, value):
            """Registers a weight for packing (_WeightPacks); returns its name."""
            values[name] = np.asarray(value)
            return name

        embeddings = "bert/embeddings"
        self.word_embeddings = copy("word_embeddings", source[f"{embeddings}/word_embeddings"])
        self.position_embeddings = copy(
            "position_embeddings", source[f"{embeddings}/position_embeddings"]
        )
        self.segment_embeddings = copy(
            "segment_embeddings", source[f"{embeddings}/token_type_embeddings"]
        )
        self.embeddings_norm = [
            copy(f"embeddings_layer_norm_{part}", source[f"{embeddings}/LayerNorm/{part}"])
            for part in ("gamma", "beta")
        ]
        # Each layer's heads split in `shards` parts, its feedforward columns in
        # `feedforward_parts`: the parts of a layer depend on nothing but its input, so the graph
        # runs them side by side.
        if shards < 1:
            raise ValueError(f"shards must be at least 1, got {shards}")
        # No part without a head or a feedforward column: oneDNN aborts the process on a
        # zero-width matmul.
        self.shards = min(shards, self.num_heads)
        kernel_bytes = (
            config.hidden_size * config.intermediate_size * tf.as_dtype(self.compute_dtype).size
        )
        self.feedforward_parts = min(
            feedforward_parts(kernel_bytes, self.shards), config.intermediate_size
        )
        head_size = self.hidden_size // self.num_heads
        self.transformer_layers = []
        for i in range(config.num_hidden_layers):
            layer = f"bert/encoder/layer_{i}"
            attention = f"{layer}/attention/self"
            projections = [source[f"{attention}/{p}/kernel"] for p in ("query", "key", "value")]
            projection_biases = [source[f"{attention}/{p}/bias"] for p in ("query", "key", "value")]
            output_kernel = source[f"{layer}/attention/output/dense/kernel"]
            intermediate_kernel = source[f"{layer}/intermediate/dense/kernel"] * gelu_scale
            intermediate_bias = source[f"{layer}/intermediate/dense/bias"] * gelu_scale
            ffn_output_kernel = source[f"{layer}/output/dense/kernel"] * gelu_scale
            weights = {
                "output_bias": source[f"{layer}/attention/output/dense/bias"],
                "attention_norm_gamma": source[f"{layer}/attention/output/LayerNorm/gamma"],
                "attention_norm_beta": source[f"{layer}/attention/output/LayerNorm/beta"],
                "ffn_output_bias": source[f"{layer}/output/dense/bias"],
                "ffn_norm_gamma": source[f"{layer}/output/LayerNorm/gamma"],
                "ffn_norm_beta": source[f"{layer}/output/LayerNorm/beta"],
            }
            for shard, heads in enumerate(np.array_split(np.arange(self.num_heads), self.shards)):
                # This shard's heads' columns of the query, key and value projections.
                head_columns = np.arange(heads[0] * head_size, (heads[-1] + 1) * head_size)
                weights.update(
                    {
                        # [H, 3 * its heads' width]: its query, key and value projections side by
                        # side, heads inside each.
                        f"shard_{shard}_qkv_kernel": np.concatenate(
                            [kernel[:, head_columns] for kernel in projections], axis=1
                        ),
                        f"shard_{shard}_qkv_bias": np.concatenate(
                            [bias[head_columns] for bias in projection_biases]
                        ),
                        f"shard_{shard}_output_kernel": output_kernel[head_columns],
                    }
                )
            columns = np.array_split(np.arange(config.intermediate_size), self.feedforward_parts)
            for part, part_columns in enumerate(columns):
                weights.update(
                    {
                        f"feedforward_{part}_intermediate_kernel": intermediate_kernel[
                            :, part_columns
                        ],
                        f"feedforward_{part}_intermediate_bias": intermediate_bias[part_columns],
                        f"feedforward_{part}_output_kernel": ffn_output_kernel[part_columns],
                    }
                )
            self.transformer_layers.append(
                {
                    name: copy(f"transformer_layer_{i}_{name}", value)
                    for name, value in weights.items()
                }
            )
        self.pooler = [
            copy(f"pooler_{part}", source[f"bert/pooler/dense/{part}"])
            for part in ("kernel", "bias")
        ]
        # Matmul kernels in the compute dtype, cast once here: a cast of each float32 kernel on
        # every call would read and write the weights again (benchmarks/RESULTS.md, "Inference:
        # what each export choice buys"). The rest stays float32 (embeddings are summed and
        # LayerNorm runs in float32, as Keras does).
        self.packs = _WeightPacks(
            self,
            values,
            lambda name: self.compute_dtype if name.endswith("kernel") else "float32",
            together=limit_threads,  # off under XLA (_WeightPacks)
        )
        self.built = True

    def weight_value(self, name):
        """The stored value of the weight `name` (its dtype), as NumPy."""
        return self.packs.views()[name].numpy()

    def _dense(self, x, kernel, bias):
        """x [n, k] @ kernel [k, m] + bias, in the compute dtype."""
        dtype = self.compute_dtype
        return tf.nn.bias_add(tf.matmul(x, tf.cast(kernel, dtype)), tf.cast(bias, dtype))

    def _attention(self, x, layer, shard, keys, batch, length, small, query_index=None):
        """One shard's self-attention of x [b*s, H] over `keys` (_KeyMask, [b, 1, 1 or s, s]): its
        context, [b*s, the shard's heads times head_size].

        `small` (bool []): whether the scores are few enough for Eigen's kernels
        (SMALL_ATTENTION_SCORES). `query_index` (int32 [b]): if given, only that position of each
        row queries (keys then [b, 1, 1, s]), and the context is [b, its width].
        """
        head_size = self.hidden_size // self.num_heads
        kernel = layer[f"shard_{shard}_qkv_kernel"]
        width = kernel.shape[1] // 3  # this shard's heads times head_size
        qkv = self._dense(x, kernel, layer[f"shard_{shard}_qkv_bias"])
        # [3, b, heads, s, head_size]
        qkv = _transpose(
            tf.reshape(qkv, [batch, length, 3, width // head_size, head_size]), [2, 0, 3, 1, 4]
        )
        query, key, value = tf.unstack(qkv)
        if query_index is not None:  # [b, heads, 1, head_size]
            query = tf.gather(query, query_index[:, tf.newaxis], axis=2, batch_dims=1)
        # Keras scales the query before the product when it has attention dropout (every released
        # config); so do we, for the same rounding.
        query = query * tf.cast(1.0 / math.sqrt(head_size), query.dtype)

        def context(inline):  # [b, heads, s, head_size]
            products = _batch_matmul(query, key, inline, transpose_y=True)
            probabilities = _softmax(products + keys.bias, inline) * keys.keep
            return _batch_matmul(probabilities, value, inline)

        if self.compute_dtype in _EIGEN_ATTENTION_DTYPES:
            attended = tf.cond(small, lambda: context(True), lambda: context(False))
        else:
            attended = context(False)
        return tf.reshape(_transpose(attended, [0, 2, 1, 3]), [-1, width])

    def _project(self, x, kernel, bias=None):
        """x @ kernel (+ bias), in the compute dtype."""
        if bias is not None:
            return self._dense(x, kernel, bias)
        return tf.matmul(x, tf.cast(kernel, self.compute_dtype))

    def _add_and_norm(self, x, partials, gamma, beta):
        """LayerNorm(x + the shards' partial outputs), summed in float32 (as LayerNorm computes)."""
        total = tf.add_n([tf.cast(t, "float32") for t in [*partials, x]])
        return tf.cast(_layer_norm(total, gamma, beta), self.compute_dtype)

    def _transformer_layer(self, x, layer, keys, batch, length, small, query_index=None):
        """One post-LN transformer layer on x [b*s, H], part by part; with `query_index` (int32
        [b]), its output at that position of each row only, [b, H] (_attention's).

        Each shard's heads project their context onto the output with their rows of the output
        kernel, and each feedforward part's columns feed their rows of the second kernel: the
        parts' products add up to the whole layer's. The first part's products carry the
        attention output and feedforward output biases; the other biases are split with their
        columns.
        """
        attended = [
            self._project(
                self._attention(x, layer, shard, keys, batch, length, small, query_index),
                layer[f"shard_{shard}_output_kernel"],
                layer["output_bias"] if shard == 0 else None,
            )
            for shard in range(self.shards)
        ]
        if query_index is not None:
            x = tf.gather(
                tf.reshape(x, [batch, length, self.hidden_size]), query_index, batch_dims=1
            )
        x = self._add_and_norm(
            x, attended, layer["attention_norm_gamma"], layer["attention_norm_beta"]
        )
        transformed = [
            self._project(
                self.activation(
                    self._dense(
                        x,
                        layer[f"feedforward_{part}_intermediate_kernel"],
                        layer[f"feedforward_{part}_intermediate_bias"],
                    )
                ),
                layer[f"feedforward_{part}_output_kernel"],
                layer["ffn_output_bias"] if part == 0 else None,
            )
            for part in range(self.feedforward_parts)
        ]
        return self._add_and_norm(x, transformed, layer["ffn_norm_gamma"], layer["ffn_norm_beta"])

    def call(self, inputs, training=False, mask=None, pooled_only=False):
        """The three encoder inputs [b, s] -> the Keras encoder's outputs dict (`forward`'s; with
        `pooled_only`, {"pooled_output"} alone), a small call's kernels on one intra-op thread
        each."""
        # `training` and `mask` are what Keras passes when it reruns a functional graph; this is
        # inference only, and the padding comes from input_mask.
        inputs = {name: inputs[name] for name in modeling.ENCODER_INPUTS}
        limited = self.limited_pooled_forward if pooled_only else self.limited_forward
        if limited is None:
            return self.forward(inputs, pooled_only)
        return limited(inputs, self.intra_op_threads(inputs["input_word_ids"]))

    def intra_op_threads(self, word_ids):
        """The most intra-op threads each kernel of a call on `word_ids` takes: int32 [], 1 for a
        call of at most one_thread_tokens tokens, else intra_op_limit.NO_LIMIT."""
        small = tf.size(word_ids) <= self.one_thread_tokens
        return tf.where(small, 1, intra_op_limit.NO_LIMIT)

    def forward(self, inputs, pooled_only=False):
        """The three encoder inputs [b, s] -> the Keras encoder's outputs dict.

        `pooled_only`: {"pooled_output"} alone, for which the last layer runs only at the pooled
        token after its keys and values: a sequence head's model reads nothing else, and the rest
        of the last layer is a seventh of a MiniLM call's work per token.
        """
        dtype = self.compute_dtype
        weights = self.packs.views()
        transformer_layers = [
            {name: weights[weight] for name, weight in layer.items()}
            for layer in self.transformer_layers
        ]
        pooler = [weights[name] for name in self.pooler]
        word_ids = inputs["input_word_ids"]
        batch, length = tf.shape(word_ids)[0], tf.shape(word_ids)[1]
        embeddings = (
            tf.gather(weights[self.word_embeddings], word_ids)
            + weights[self.position_embeddings][tf.newaxis, :length]
            + tf.gather(weights[self.segment_embeddings], inputs["input_type_ids"])
        )
        embedding_output = _layer_norm(
            tf.cast(embeddings, dtype), *[weights[name] for name in self.embeddings_norm]
        )
        x = tf.reshape(embedding_output, [-1, self.hidden_size])
        # A key is real where its int32 mask is positive (Keras' masked softmax keeps mask > 0.5).
        real_keys = (inputs["input_mask"] > 0)[:, tf.newaxis, tf.newaxis, :]
        if self.left_to_right:  # [b, 1, s, s]: query i sees the real keys j <= i
            real_keys = tf.logical_and(
                real_keys, modeling.left_to_right_mask(1, length)[:, tf.newaxis]
            )
        keys = _KeyMask(real_keys, dtype)
        small = small_attention(batch, length)
        if self.left_to_right:
            pooled_index = modeling.pooled_token_index(inputs["input_mask"])
        else:
            pooled_index = tf.zeros([batch], tf.int32)  # [CLS]
        layers = transformer_layers[:-1] if pooled_only else transformer_layers
        encoder_outputs = []
        for layer in layers:
            x = self._transformer_layer(x, layer, keys, batch, length, small)
            encoder_outputs.append(tf.reshape(x, [batch, length, self.hidden_size]))
        if pooled_only:
            # The pooled token's keys: its row of the left-to-right mask.
            pooled_keys = _KeyMask(
                tf.gather(real_keys, pooled_index[:, tf.newaxis], axis=2, batch_dims=1), dtype
            )
            pooled_token = self._transformer_layer(
                x, transformer_layers[-1], pooled_keys, batch, length, small, pooled_index
            )
            return {"pooled_output": tf.tanh(self._dense(pooled_token, *pooler))}
        sequence_output = encoder_outputs[-1]
        pooled_token = tf.gather(sequence_output, pooled_index, batch_dims=1)
        pooled_output = tf.tanh(self._dense(pooled_token, *pooler))
        return {
            "sequence_output": sequence_output,
            "pooled_output": pooled_output,
            "encoder_outputs": encoder_outputs,
            "embedding_output": embedding_output,
        }

    def compute_output_spec(self, inputs, training=False, mask=None, pooled_only=False):
        """The outputs' shapes and dtypes, as the Keras encoder's (`call`'s)."""
        batch, length = inputs["input_word_ids"].shape
        pooled_output = keras.KerasTensor((batch, self.hidden_size), dtype=self.compute_dtype)
        if pooled_only:
            return {"pooled_output": pooled_output}
        encoder_outputs = [
            keras.KerasTensor((batch, length, self.hidden_size), dtype=self.compute_dtype)
            for _ in self.transformer_layers
        ]
        return {
            "sequence_output": encoder_outputs[-1],
            "pooled_output": pooled_output,
            "encoder_outputs": encoder_outputs,
            "embedding_output": keras.KerasTensor(
                (batch, length, self.hidden_size), dtype=self.compute_dtype
            ),
        }


def with_inference_encoder(encoder, config, model=None, shards=SHARDS, fast=None):
    """A task `model` on `encoder` (or, if None, the encoder) with InferenceEncoder in its place.

    `fast`: an InferenceEncoder of `encoder` to use, so that several models share one copy of its
    weights (the pretrained export's encoder and heads); else a new one.
    """
    # `shards`: how many parts each layer's attention is split into (SHARDS, above).
    fast = fast or InferenceEncoder(encoder, config, shards)
    if model is None:
        inputs = modeling.encoder_inputs()
        return keras.Model(inputs, fast(inputs), name=encoder.name)
    outputs = fast.compute_output_spec(modeling.encoder_inputs())
    paths = [path for path, _ in keras.tree.flatten_with_path(outputs)]
    pooled_only = read_outputs(model, encoder, paths) == {("pooled_output",)}

    def call(layer, *args, **kwargs):
        if layer is not fast or not pooled_only:
            return layer(*args, **kwargs)
        # The outputs in the encoder's flat order, as the clone maps them to the model's
        # tensors; none but pooled_output is read, so the others are not computed.
        pooled_output = fast(*args, **kwargs, pooled_only=True)["pooled_output"]
        return [pooled_output if path == ("pooled_output",) else None for path in paths]

    return keras.models.clone_model(
        model,
        clone_function=lambda layer: fast if layer is encoder else layer,
        call_function=call,
    )


def read_outputs(model, layer, paths):
    """The paths (of `paths`, `layer`'s flat outputs in order) of the outputs of `layer` that
    functional `model`'s other layers or outputs read."""
    # Keras' own clone_model walks the same graph (Functional._nodes_by_depth).
    nodes = [node for depth in model._nodes_by_depth.values() for node in depth]
    read = {id(t) for t in keras.tree.flatten(model.outputs)}
    read.update(id(t) for node in nodes if node.operation is not layer for t in node.input_tensors)
    return {
        path
        for node in nodes
        if node.operation is layer
        for path, tensor in zip(paths, node.outputs, strict=True)
        if id(tensor) in read
    }
