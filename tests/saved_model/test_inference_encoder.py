"""InferenceEncoder computes the Keras encoder's network: every output, every task head, bfloat16."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import tiny_config, tiny_inputs

from bert_tf.model import modeling
from bert_tf.saved_model import export, inference_encoder
from bert_tf.saved_model.inference_encoder import InferenceEncoder, with_inference_encoder
from bert_tf.saved_model.intra_op_limit import NO_LIMIT
from bert_tf.tasks import models, registry

# Uneven shapes (3 heads of 8, an intermediate size that is not a multiple of the hidden size) and
# weights large enough that attention is peaked: with the usual 0.02 every token attends almost
# evenly, and a wrong scale or a swapped query and key would hide under float rounding.
CONFIG = tiny_config(
    hidden_size=24, num_attention_heads=3, intermediate_size=40, initializer_range=0.5
)
TOLERANCE = dict(rtol=1e-5, atol=1e-5)
# The task kinds whose head reads the encoder's pooled_output alone.
SEQUENCE_KINDS = ("classifier", "regressor", "multiple_choice")


@pytest.fixture(params=["eigen", "onednn"])
def attention_kernels(request, monkeypatch):
    """Every attention takes Eigen's kernels (as small ones do) or oneDNN's (as large ones do)."""
    threshold = 10**9 if request.param == "eigen" else 0
    monkeypatch.setattr(inference_encoder, "SMALL_ATTENTION_SCORES", threshold)
    return request.param


def specs():
    """One TaskSpec of every task kind."""
    for kind in registry.KINDS:
        labels = ["O", "B-X", "I-X"] if registry.get(kind).labelled else []
        yield models.TaskSpec(kind, labels=labels)


def in_graph(model, inputs):
    """`model`'s outputs on `inputs`, traced as an export traces it."""
    return tf.function(lambda x: model(x, training=False))(inputs)


def as_float32(outputs):
    """A model's outputs dict with every tensor (and list of tensors) as float32 NumPy."""
    return tf.nest.map_structure(lambda x: np.asarray(tf.cast(x, tf.float32)), outputs)


def assert_same_encoder_outputs(got, want, num_layers):
    """Every output of two encoders' output dicts agrees within TOLERANCE."""
    assert sorted(got) == sorted(want)
    np.testing.assert_allclose(got["sequence_output"], want["sequence_output"], **TOLERANCE)
    np.testing.assert_allclose(got["pooled_output"], want["pooled_output"], **TOLERANCE)
    np.testing.assert_allclose(got["embedding_output"], want["embedding_output"], **TOLERANCE)
    assert len(got["encoder_outputs"]) == num_layers
    for layer, (g, w) in enumerate(zip(got["encoder_outputs"], want["encoder_outputs"])):
        np.testing.assert_allclose(g, w, err_msg=f"layer {layer}", **TOLERANCE)


@pytest.mark.parametrize("direction", modeling.ATTENTION_DIRECTIONS)
@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_exact", "relu"])
def test_every_encoder_output_matches_the_keras_encoder(hidden_act, direction, attention_kernels):
    tf.keras.utils.set_random_seed(1)
    config = tiny_config(
        hidden_size=24,
        num_attention_heads=3,
        initializer_range=0.5,
        hidden_act=hidden_act,
        attention_direction=direction,
    )
    encoder = modeling.build_encoder(config)
    # Rows padded by different amounts (a left_to_right pooler reads each one's last real token),
    # both segments, and a length that is not a multiple of anything.
    inputs = tiny_inputs(batch=3, seq=11, seed=2)
    inputs["input_mask"][1, 6:] = 0
    got = as_float32(in_graph(with_inference_encoder(encoder, config), inputs))
    assert_same_encoder_outputs(got, as_float32(in_graph(encoder, inputs)), 2)
    # Each layer's output is its own, not the last one's.
    assert np.abs(got["encoder_outputs"][0] - got["encoder_outputs"][-1]).max() > 0.1


@pytest.mark.parametrize("direction", modeling.ATTENTION_DIRECTIONS)
def test_masks_read_as_keras_reads_them(direction, attention_kernels):
    """A row with no real token attends to nothing, and any positive mask value marks a real token."""
    tf.keras.utils.set_random_seed(2)
    config = dataclasses.replace(CONFIG, attention_direction=direction)
    encoder = modeling.build_encoder(config)
    inputs = tiny_inputs(batch=3, seq=6, seed=3)
    inputs["input_mask"][0] = 0
    inputs["input_mask"][1, :3] = 2
    got = as_float32(in_graph(with_inference_encoder(encoder, config), inputs))
    assert_same_encoder_outputs(got, as_float32(in_graph(encoder, inputs)), 2)


@pytest.mark.parametrize("direction", modeling.ATTENTION_DIRECTIONS)
@pytest.mark.parametrize("spec", list(specs()), ids=lambda spec: spec.kind)
def test_every_task_model_gives_the_keras_models_outputs(spec, direction):
    tf.keras.utils.set_random_seed(3)
    config = dataclasses.replace(CONFIG, attention_direction=direction)
    model, encoder = models.build_task_model(config, spec)
    fast = with_inference_encoder(encoder, config, model)
    inputs = tiny_inputs(batch=4, seq=9, seed=4)
    if spec.kind == "multiple_choice":  # [b, choices, s]
        inputs = {name: value.reshape(2, 2, 9) for name, value in inputs.items()}
    want, got = in_graph(model, inputs), in_graph(fast, inputs)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
        np.testing.assert_allclose(got[name], want[name], err_msg=name, **TOLERANCE)
    # A sequence head reads pooled_output alone: the clone asks for nothing else.
    (node,) = fast.get_layer("inference_encoder")._inbound_nodes
    assert node.arguments.kwargs.get("pooled_only", False) == (spec.kind in SEQUENCE_KINDS)
    # The clone holds the head's weights and the inference encoder's, not the Keras encoder's.
    encoder_weights = {id(v) for v in encoder.weights}
    assert not encoder_weights & {id(v) for v in fast.weights}
    head = {id(v) for v in model.weights} - encoder_weights
    assert head and head <= {id(v) for v in fast.weights}


@pytest.mark.parametrize("direction", modeling.ATTENTION_DIRECTIONS)
def test_pooled_output_alone_is_the_whole_encoders(direction, attention_kernels):
    """With pooled_only the last layer runs at the pooled token only, to the same pooled_output:
    [CLS], or a left-to-right row's last real token (rows padded by different amounts, one row
    with no real token, one with a mask value above 1)."""
    tf.keras.utils.set_random_seed(12)
    config = dataclasses.replace(CONFIG, attention_direction=direction)
    encoder = modeling.build_encoder(config)
    inputs = tiny_inputs(batch=4, seq=10, seed=13)
    inputs["input_mask"][1, 4:] = 0
    inputs["input_mask"][2] = 0
    inputs["input_mask"][3, :5] = 2
    fast = InferenceEncoder(encoder, config)
    got = tf.function(lambda x: fast(x, pooled_only=True))(inputs)
    assert list(got) == ["pooled_output"]
    want = in_graph(encoder, inputs)["pooled_output"]
    np.testing.assert_allclose(got["pooled_output"], want, **TOLERANCE)


def test_only_a_model_that_reads_pooled_output_alone_skips_the_rest():
    """A model reading pooled_output and sequence_output gets every output computed, and the
    same outputs as the Keras model."""
    tf.keras.utils.set_random_seed(14)
    encoder = modeling.build_encoder(CONFIG)
    inputs = modeling.encoder_inputs()
    encoded = encoder(inputs)
    both = keras.Model(
        inputs,
        {
            "first": encoded["pooled_output"],
            "mean": keras.ops.mean(encoded["sequence_output"], axis=1),
        },
    )
    fast = with_inference_encoder(encoder, CONFIG, both)
    (node,) = fast.get_layer("inference_encoder")._inbound_nodes
    assert "pooled_only" not in node.arguments.kwargs
    values = tiny_inputs(batch=2, seq=6, seed=15)
    want, got = in_graph(both, values), in_graph(fast, values)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], err_msg=name, **TOLERANCE)


def test_bfloat16_computes_in_bfloat16_as_accurately_as_keras(attention_kernels):
    # Weights of a real model's scale: with CONFIG's, tanh saturates and rounding errors swing.
    config = dataclasses.replace(CONFIG, initializer_range=0.02)
    tf.keras.utils.set_random_seed(5)
    spec = models.TaskSpec("classifier", labels=["a", "b"])
    reference, _ = models.build_task_model(config, spec)  # float32
    with export.dtype_policy("mixed_bfloat16"):
        model, encoder = models.build_task_model(config, spec)
        model.set_weights(reference.get_weights())
        fast = with_inference_encoder(encoder, config, model)
        fast_encoder = with_inference_encoder(encoder, config)
    assert keras.mixed_precision.global_policy().name == "float32"  # restored
    # The matmul kernels are stored in bfloat16 (cast once, not on every call); the rest, and the
    # Keras head's own weights, stay float32.
    fast_layer = fast.get_layer("inference_encoder")
    packs = fast_layer.packs
    stored = {name: v.dtype for name, v in packs.apart.items()}
    stored.update({name: v.dtype for v, entries in packs.packed for name, _, _ in entries})
    kernels = {name for name in stored if name.endswith("kernel")}
    assert fast_layer.shards == fast_layer.feedforward_parts == 2
    per_layer = 2 * fast_layer.shards + 2 * fast_layer.feedforward_parts
    assert len(kernels) == per_layer * config.num_hidden_layers + 1
    assert all(
        dtype == ("bfloat16" if name in kernels else "float32") for name, dtype in stored.items()
    )
    assert sorted(v.dtype for v in fast_layer.weights) == ["bfloat16", "float32"]
    assert {
        v.dtype for v in fast.weights if v.path not in {w.path for w in fast_layer.weights}
    } == {"float32"}
    inputs = tiny_inputs(batch=8, seq=12, seed=6)
    encoded = in_graph(fast_encoder, inputs)
    assert encoded["sequence_output"].dtype == tf.bfloat16
    logits = in_graph(fast, inputs)["logits"]
    assert logits.dtype == tf.float32
    # Against float32, bfloat16 (8 bits of mantissa) errs by a few percent; ours rounds at other
    # places than Keras' bfloat16 model, so it may err a little more or less, not much more.
    exact = as_float32(in_graph(reference.get_layer("bert_encoder"), inputs))
    keras_bfloat16 = as_float32(in_graph(encoder, inputs))
    for name in ("sequence_output", "pooled_output"):
        ours_error = np.abs(as_float32(encoded[name]) - exact[name]).max()
        keras_error = np.abs(keras_bfloat16[name] - exact[name]).max()
        assert 0 < ours_error <= 2 * keras_error, name
    logits_error = np.abs(logits.numpy() - in_graph(reference, inputs)["logits"].numpy()).max()
    keras_logits_error = np.abs(
        in_graph(model, inputs)["logits"].numpy() - in_graph(reference, inputs)["logits"].numpy()
    ).max()
    assert logits_error <= 2 * keras_logits_error


def test_each_shard_holds_its_heads_and_feedforward_columns():
    tf.keras.utils.set_random_seed(7)
    encoder = modeling.build_encoder(CONFIG)
    fast = InferenceEncoder(encoder, CONFIG, shards=2)
    weights = {v.path: v.numpy() for v in encoder.weights}
    hidden = CONFIG.hidden_size
    assert (CONFIG.num_attention_heads, CONFIG.intermediate_size) == (3, 40)
    prefix = "transformer_layer_1/self_attention_layer"
    query, key, value = (
        weights[f"{prefix}/{name}/kernel"].reshape(hidden, hidden)
        for name in ("query", "key", "value")
    )
    output = weights[f"{prefix}/attention_output/kernel"].reshape(hidden, hidden)
    layer = fast.transformer_layers[1]
    # 3 heads of 8: the first shard has heads 0 and 1 (columns 0 to 15), the second head 2; the
    # feedforward's 40 columns split 20 and 20.
    for shard, columns, ffn_columns in (
        (0, slice(0, 16), slice(0, 20)),
        (1, slice(16, 24), slice(20, 40)),
    ):
        qkv = fast.weight_value(layer[f"shard_{shard}_qkv_kernel"])
        np.testing.assert_array_equal(
            qkv, np.concatenate([query[:, columns], key[:, columns], value[:, columns]], axis=1)
        )
        np.testing.assert_array_equal(
            fast.weight_value(layer[f"shard_{shard}_output_kernel"]), output[columns]
        )
        np.testing.assert_array_equal(
            fast.weight_value(layer[f"feedforward_{shard}_intermediate_kernel"]),
            weights["transformer_layer_1/feedforward_intermediate_dense/kernel"][:, ffn_columns],
        )
        np.testing.assert_array_equal(
            fast.weight_value(layer[f"feedforward_{shard}_output_kernel"]),
            weights["transformer_layer_1/feedforward_output_dense/kernel"][ffn_columns],
        )
    assert not any(v.trainable for v in fast.weights)
    # Copies: changing the Keras encoder afterwards does not change the inference encoder.
    before = fast.weight_value(layer["shard_1_qkv_kernel"])
    key_variable = {v.path: v for v in encoder.weights}[f"{prefix}/key/kernel"]
    key_variable.assign(key_variable + 1.0)
    np.testing.assert_array_equal(fast.weight_value(layer["shard_1_qkv_kernel"]), before)


@pytest.mark.parametrize("shards", [1, 2, 3, 5])
def test_any_number_of_shards_computes_the_same_network(shards):
    """One part, uneven parts (2 heads and 1), one head each, and more parts than heads (3)."""
    tf.keras.utils.set_random_seed(8)
    encoder = modeling.build_encoder(CONFIG)
    inputs = tiny_inputs(batch=3, seq=7, seed=9)
    fast = with_inference_encoder(encoder, CONFIG, shards=shards)
    assert fast.get_layer("inference_encoder").shards == min(shards, 3)
    got = as_float32(in_graph(fast, inputs))
    assert_same_encoder_outputs(got, as_float32(in_graph(encoder, inputs)), 2)


@pytest.mark.parametrize(
    "heads, intermediate, shards, feedforward_parts", [(3, 2, 3, 2), (1, 40, 1, 1)]
)
def test_no_part_is_left_without_a_head_or_a_feedforward_column(
    heads, intermediate, shards, feedforward_parts
):
    """Fewer feedforward columns, or heads, than shards asked for: as many parts as there are."""
    tf.keras.utils.set_random_seed(10)
    config = tiny_config(
        hidden_size=24,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        initializer_range=0.5,
    )
    encoder = modeling.build_encoder(config)
    fast = with_inference_encoder(encoder, config, shards=3)
    layer = fast.get_layer("inference_encoder")
    assert (layer.shards, layer.feedforward_parts) == (shards, feedforward_parts)
    inputs = tiny_inputs(batch=2, seq=5, seed=11)
    got = as_float32(in_graph(fast, inputs))
    assert_same_encoder_outputs(got, as_float32(in_graph(encoder, inputs)), 2)
    with pytest.raises(ValueError, match="shards must be at least 1, got 0"):
        InferenceEncoder(encoder, config, shards=0)


def test_an_empty_batch_gives_empty_outputs():
    encoder = modeling.build_encoder(CONFIG)
    empty = {name: np.zeros([0, 5], np.int32) for name in modeling.ENCODER_INPUTS}
    outputs = in_graph(with_inference_encoder(encoder, CONFIG), empty)
    assert outputs["sequence_output"].shape == (0, 5, CONFIG.hidden_size)
    assert outputs["pooled_output"].shape == (0, CONFIG.hidden_size)
    fast = InferenceEncoder(encoder, CONFIG)
    pooled = tf.function(lambda x: fast(x, pooled_only=True))(empty)["pooled_output"]
    assert pooled.shape == (0, CONFIG.hidden_size)


@pytest.mark.parametrize(
    "batch, length, small", [(1, 64, True), (1, 65, False), (4, 32, True), (5, 32, False)]
)
def test_attention_of_up_to_4096_scores_a_head_takes_eigen_kernels(batch, length, small):
    assert inference_encoder.SMALL_ATTENTION_SCORES == 4096
    assert bool(inference_encoder.small_attention(batch, length)) is small


@pytest.mark.parametrize(
    "hidden, intermediate, dtype, parts",
    [
        (384, 1536, "float32", 4),  # MiniLM: 2.25 MB, 576 KB in 4 parts
        (384, 1536, "bfloat16", 2),  # 576 KB in 2
        (768, 3072, "float32", 2),  # BERT-base: 9 MB, still 2.25 MB a part in 4
        (24, 40, "float32", 2),
    ],
)
def test_feedforward_parts_are_small_enough_for_one_thread(hidden, intermediate, dtype, parts):
    kernel_bytes = hidden * intermediate * tf.as_dtype(dtype).size
    assert inference_encoder.feedforward_parts(kernel_bytes, shards=2) == parts


def graph_ops(fn, spec):
    """Every op type in fn's graph for `spec` and in the functions it calls."""
    graph = tf.function(fn).get_concrete_function(spec).graph.as_graph_def()
    return {node.op for node in graph.node} | {
        node.op for f in graph.library.function for node in f.node_def
    }


def test_a_small_call_runs_each_kernel_on_one_intra_op_thread():
    """Up to one_thread_tokens tokens (MiniLM's 512, BERT-base's 128) a call runs the network
    under an intra-op limit of 1; above, with no limit; either way its outputs are the network's
    (within float rounding: grappler optimizes the network's own function apart)."""
    minilm = tiny_config(hidden_size=384, num_attention_heads=12, intermediate_size=1536)
    base = tiny_config(hidden_size=768, num_attention_heads=12, intermediate_size=3072)
    assert inference_encoder.one_thread_tokens(minilm) == 512
    assert inference_encoder.one_thread_tokens(base) == 128
    tf.keras.utils.set_random_seed(14)
    encoder = modeling.build_encoder(CONFIG)
    fast = InferenceEncoder(encoder, CONFIG)
    tokens = fast.one_thread_tokens
    assert int(fast.intra_op_threads(tf.zeros([2, tokens // 2], tf.int32))) == 1
    assert int(fast.intra_op_threads(tf.zeros([1, tokens + 1], tf.int32))) == NO_LIMIT
    spec = {name: tf.TensorSpec([None, None], tf.int32) for name in modeling.ENCODER_INPUTS}
    assert "MaxIntraOpParallelismDataset" in graph_ops(lambda x: fast(x), spec)
    unlimited = InferenceEncoder(encoder, CONFIG, limit_threads=False)
    assert "MaxIntraOpParallelismDataset" not in graph_ops(lambda x: unlimited(x), spec)
    inputs = tiny_inputs(batch=3, seq=7, seed=15)
    got = in_graph(fast, inputs)
    want = tf.function(fast.forward)(inputs)
    tf.nest.map_structure(lambda g, w: np.testing.assert_allclose(g, w, **TOLERANCE), got, want)


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_small_attention_runs_on_kernels_that_onednn_does_not_take_over(policy):
    """At TensorFlow's default threads each oneDNN kernel hands its work to the intra-op threads:
    the graph transposes integers, and its small-attention branch uses BatchMatMulV3 and
    LogSoftmax, which TensorFlow's oneDNN rewrite leaves to Eigen."""
    with export.dtype_policy(policy):
        fast = InferenceEncoder(modeling.build_encoder(CONFIG), CONFIG)
    spec = {name: tf.TensorSpec([None, None], tf.int32) for name in modeling.ENCODER_INPUTS}
    graph = tf.function(fast.forward).get_concrete_function(spec).graph.as_graph_def()
    functions = {f.signature.name: {node.op for node in f.node_def} for f in graph.library.function}
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    transposes = [node.attr["T"].type for node in nodes if node.op == "Transpose"]
    width = tf.int32 if policy == "float32" else tf.int16
    assert transposes and set(transposes) == {width.as_datatype_enum}
    conds = [node for node in nodes if node.op in ("If", "StatelessIf")]
    assert len(conds) == CONFIG.num_hidden_layers * fast.shards
    for cond in conds:
        small = functions[cond.attr["then_branch"].func.name]
        large = functions[cond.attr["else_branch"].func.name]
        assert {"BatchMatMulV3", "LogSoftmax"} <= small and not {"BatchMatMulV2", "Softmax"} & small
        assert {"BatchMatMulV2", "Softmax"} <= large


def test_a_float16_encoder_runs_on_kernels_that_have_float16():
    """Eigen's BatchMatMulV3 has no CPU float16 kernel: float16 attention takes oneDNN's. Padding
    keys are masked with a score float16 holds (Keras' -3e4): a row with no real token stays
    finite until it is zeroed, as in float32."""
    config = dataclasses.replace(CONFIG, initializer_range=0.02)
    tf.keras.utils.set_random_seed(12)
    reference = modeling.build_encoder(config)
    with export.dtype_policy("mixed_float16"):
        encoder = modeling.build_encoder(config)
        encoder.set_weights(reference.get_weights())
        fast = with_inference_encoder(encoder, config)
    inputs = tiny_inputs(batch=3, seq=5, seed=13)
    inputs["input_mask"][1, 3:] = 0
    inputs["input_mask"][2] = 0
    got = as_float32(in_graph(fast, inputs))["sequence_output"]
    want = as_float32(in_graph(reference, inputs))["sequence_output"]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=2e-2)


def _ancestors(op):
    """Every op `op` depends on, through data and control inputs."""
    seen, stack = set(), [op]
    while stack:
        current = stack.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen


def test_the_shards_of_a_layer_do_not_wait_for_each_other():
    """What lets TensorFlow run the shards side by side: no op of one needs an op of the other."""
    encoder = modeling.build_encoder(CONFIG)
    fast = InferenceEncoder(encoder, CONFIG, shards=2)
    spec = {name: tf.TensorSpec([None, None], tf.int32) for name in modeling.ENCODER_INPUTS}
    # The network itself: a call runs it as a function of its own (intra_op_limit).
    graph = tf.function(fast.forward).get_concrete_function(spec).graph
    layer = fast.transformer_layers[1]

    def readers(part, weights):
        """The ops that use layer 1's `weights` of `part` (its matmuls and bias adds): each
        weight's value is the op named after it (a view of its pack)."""
        views = [graph.get_operation_by_name(layer[f"{part}_{name}"]) for name in weights]
        return {op for view in views for op in view.outputs[0].consumers()}

    # The parts meet at each LayerNorm: inside the attention, and inside the feedforward, the
    # ops of one part need none of the other's.
    for first, second, weights in (
        ("shard_0", "shard_1", ["qkv_kernel", "qkv_bias", "output_kernel"]),
        (
            "feedforward_0",
            "feedforward_1",
            ["intermediate_kernel", "intermediate_bias", "output_kernel"],
        ),
    ):
        first, second = readers(first, weights), readers(second, weights)
        assert len(first) == len(second) == 3 and "MatMul" in {op.type for op in first}
        for op in first:
            assert not _ancestors(op) & second, op.name
        for op in second:
            assert not _ancestors(op) & first, op.name


def test_a_call_reads_one_variable_per_dtype():
    """The weights live in one pack per stored dtype, each at a row of 64 bytes (Eigen's
    alignment, which lets SplitV hand out views); the values read back are the weights'."""
    encoder = modeling.build_encoder(CONFIG)
    fast = InferenceEncoder(encoder, CONFIG)
    ((variable, entries),) = fast.packs.packed  # float32 only
    assert fast.weights == [variable] and variable.shape[1] * 4 == 64
    assert sum(rows for _, rows, _ in entries) == variable.shape[0]
    graph = (
        tf.function(fast.forward)
        .get_concrete_function(
            {name: tf.TensorSpec([None, None], tf.int32) for name in modeling.ENCODER_INPUTS}
        )
        .graph
    )
    assert [op.type for op in graph.get_operations()].count("ReadVariableOp") == 1
    position = {v.path: v.numpy() for v in encoder.weights}["position_embedding/embeddings"]
    np.testing.assert_array_equal(fast.weight_value("position_embeddings"), position)
