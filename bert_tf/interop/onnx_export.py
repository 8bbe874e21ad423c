"""A model directory as an ONNX model with ONNX Runtime's BERT fusions, plus its tokenizer.json.

    python -m bert_tf.convert_checkpoint --to=onnx --model_dir=models/sst2 --output_dir=onnx/sst2

For people who serve with ONNX Runtime rather than TF Serving (benchmarks/RESULTS.md, "Inference:
every export kind against ONNX Runtime and HF", says when each is faster). OUT holds:

    model.onnx        the model, fused as onnxruntime.transformers.optimizer fuses a BERT
                      (EmbedLayerNormalization, Attention, SkipLayerNormalization, BiasGelu or
                      FastGelu: com.microsoft operators, so it runs in ONNX Runtime only)
    tokenizer.json    the original's tokenizer (hf_export.wordpiece_tokenizer), with vocab.txt,
                      tokenizer_config.json, special_tokens_map.json and config.json beside it, as
                      the Hugging Face export writes them

The graph is written from the weights directly, not traced: the same arithmetic as our encoder and
heads, in ONNX Runtime's fused operators. Its inputs are what tokenizer.json gives, int64
`input_ids`, `attention_mask` and `token_type_ids` [batch, sequence] ([batch, choices, sequence]
for multiple choice); any mask works, not only right padding (Attention reads the raw mask). Its
outputs, by kind, under Hugging Face's names:

    pretrained, no heads    last_hidden_state [b, s, h], pooler_output [b, h]
    MLM head (fill-mask)    logits [b, s, vocab] (and seq_relationship_logits [b, 2] with NSP)
    NSP head only           seq_relationship_logits [b, 2] (label 0 is IsNext, as the original's)
    classifier, regressor   logits [b, labels] ([b, 1] for a regressor)
    ner                     logits [b, s, labels]
    squad                   start_logits, end_logits [b, s]
    multiple_choice         logits [b, choices]

Before OUT appears, ONNX Runtime runs model.onnx on a few inputs and every output must be within
CHECK_TOLERANCE of our Keras model's on the same inputs. The same refusals as the Hugging Face
export apply (a left-to-right model, a BiLSTM or feature-based head), and GELU forms other than
ours ("gelu", the tanh form, and "gelu_exact") are refused.
"""

import dataclasses
import os

import numpy as np
import tensorflow as tf

from bert_tf.checkpoints import name_map
from bert_tf.interop import hf_export
from bert_tf.model import modeling
from bert_tf.model.model_dir import MLM_HEAD, NSP_HEAD, ModelDir, describe_heads
from bert_tf.runtime import io_utils

MODEL_FILE = "model.onnx"
OPSET = 17  # LayerNormalization is in the default domain from 17
# The onnx package writes its newest IR version by default; ONNX Runtime 1.31 reads up to 13, and
# opset 17 needs 8: 10 loads in every ONNX Runtime since 1.16.
IR_VERSION = 10
MS_DOMAIN = "com.microsoft"
CHECK_TOLERANCE = 1e-4
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# Our GELU forms -> ONNX Runtime's fused bias + GELU operator computing the same function.
GELU_OPERATORS = {"gelu": "FastGelu", "gelu_exact": "BiasGelu"}


@dataclasses.dataclass
class OnnxExportResult:
    output_dir: str
    outputs: list
    max_difference: float
    description: str


def _onnx():
    """The onnx and onnxruntime packages (imported when an export needs them: they are slow to
    import), or a usage error saying how to install them (requirements.txt pins both)."""
    try:
        import onnx
        import onnxruntime
    except ImportError as e:
        raise io_utils.UsageError(
            "--to=onnx needs the onnx and onnxruntime packages: pip install onnx onnxruntime"
        ) from e
    return onnx, onnxruntime


class _Graph:
    """An ONNX graph under construction: initializers, nodes and unique names."""

    def __init__(self, onnx):
        self.onnx, self.helper = onnx, onnx.helper
        self.nodes, self.initializers, self.count = [], [], 0

    def name(self, hint):
        self.count += 1
        return f"{hint}_{self.count}"

    def constant(self, hint, array):
        name = self.name(hint)
        self.initializers.append(self.onnx.numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op, inputs, hint=None, domain="", outputs=1, **attributes):
        names = [self.name(hint or op.lower()) for _ in range(outputs)]
        self.nodes.append(
            self.helper.make_node(op, inputs, names, domain=domain or None, **attributes)
        )
        return names[0] if outputs == 1 else names

    def dense(self, x, kernel, bias, hint):
        return self.node(
            "Add",
            [
                self.node("MatMul", [x, self.constant(hint + "_kernel", kernel)]),
                self.constant(hint + "_bias", bias),
            ],
            hint,
        )


def _float(weights, name):
    return np.asarray(weights[name], np.float32)


def _encoder(graph, weights, config, input_ids, token_type_ids, attention_mask):
    """(the encoder's sequence output [b, s, h], the word embeddings' initializer name) from int32
    ids, types and mask [b, s]."""
    w = lambda name: _float(weights, name)  # noqa: E731
    word_embeddings = graph.constant("word_embeddings", w("bert/embeddings/word_embeddings"))
    # Its second output (a mask index for right padding) is left unused: Attention reads the raw mask.
    x, _ = graph.node(
        "EmbedLayerNormalization",
        [
            input_ids,
            token_type_ids,
            word_embeddings,
            graph.constant("position_embeddings", w("bert/embeddings/position_embeddings")),
            graph.constant("token_type_embeddings", w("bert/embeddings/token_type_embeddings")),
            graph.constant("embeddings_gamma", w("bert/embeddings/LayerNorm/gamma")),
            graph.constant("embeddings_beta", w("bert/embeddings/LayerNorm/beta")),
        ],
        "embeddings",
        domain=MS_DOMAIN,
        outputs=2,
        epsilon=modeling.LAYER_NORM_EPSILON,
    )
    for i in range(config.num_hidden_layers):
        scope = f"bert/encoder/layer_{i}"
        parts = ("query", "key", "value")
        qkv_kernel = np.concatenate([w(f"{scope}/attention/self/{p}/kernel") for p in parts], 1)
        qkv_bias = np.concatenate([w(f"{scope}/attention/self/{p}/bias") for p in parts])
        attended = graph.node(
            "Attention",
            [
                x,
                graph.constant("qkv_kernel", qkv_kernel),
                graph.constant("qkv_bias", qkv_bias),
                attention_mask,
            ],
            f"layer_{i}_attention",
            domain=MS_DOMAIN,
            num_heads=config.num_attention_heads,
        )
        x = _output_norm(graph, weights, attended, x, f"{scope}/attention/output")
        hidden = _dense_gelu(graph, weights, config, x, f"{scope}/intermediate/dense")
        x = _output_norm(graph, weights, hidden, x, f"{scope}/output")
    return x, word_embeddings


def _output_norm(graph, weights, x, residual, scope):
    """LayerNorm(x @ kernel + bias + residual) of the original's `scope` (.../output): one MatMul
    and a SkipLayerNormalization, which adds the bias and the residual."""
    projected = graph.node(
        "MatMul", [x, graph.constant("kernel", _float(weights, f"{scope}/dense/kernel"))]
    )
    return graph.node(
        "SkipLayerNormalization",
        [
            projected,
            residual,
            graph.constant("gamma", _float(weights, f"{scope}/LayerNorm/gamma")),
            graph.constant("beta", _float(weights, f"{scope}/LayerNorm/beta")),
            graph.constant("bias", _float(weights, f"{scope}/dense/bias")),
        ],
        domain=MS_DOMAIN,
        epsilon=modeling.LAYER_NORM_EPSILON,
    )


def _dense_gelu(graph, weights, config, x, scope):
    """GELU(x @ kernel + bias) of the original's dense `scope`, the bias inside the fused GELU."""
    return graph.node(
        GELU_OPERATORS[config.hidden_act],
        [
            graph.node("MatMul", [x, graph.constant("kernel", _float(weights, f"{scope}/kernel"))]),
            graph.constant("bias", _float(weights, f"{scope}/bias")),
        ],
        domain=MS_DOMAIN,
    )


def _pooled(graph, weights, sequence_output):
    first = graph.node("Gather", [sequence_output, graph.constant("zero", np.int64(0))], axis=1)
    dense = graph.dense(
        first,
        _float(weights, "bert/pooler/dense/kernel"),
        _float(weights, "bert/pooler/dense/bias"),
        "pooler",
    )
    return graph.node("Tanh", [dense], "pooler_output")


def _mlm_logits(graph, weights, config, sequence_output, word_embeddings):
    w = lambda name: _float(weights, name)  # noqa: E731
    hidden = _dense_gelu(graph, weights, config, sequence_output, "cls/predictions/transform/dense")
    normed = graph.node(
        "LayerNormalization",
        [
            hidden,
            graph.constant("mlm_gamma", w("cls/predictions/transform/LayerNorm/gamma")),
            graph.constant("mlm_beta", w("cls/predictions/transform/LayerNorm/beta")),
        ],
        axis=-1,
        epsilon=modeling.LAYER_NORM_EPSILON,
    )
    # The decoder is the word embeddings, transposed (ONNX Runtime folds the transpose at load).
    decoder = graph.node("Transpose", [word_embeddings], perm=[1, 0])
    return graph.node(
        "Add",
        [
            graph.node("MatMul", [normed, decoder]),
            graph.constant("mlm_output_bias", w("cls/predictions/output_bias")),
        ],
    )


def build_model(weights, config, spec, heads):
    """The ONNX ModelProto of a model directory's weights ({original name: array}, name_map's)."""
    onnx, _ = _onnx()
    graph = _Graph(onnx)
    helper = onnx.helper
    choices = spec is not None and spec.kind == "multiple_choice"
    dims = ["batch", "choices", "sequence"] if choices else ["batch", "sequence"]
    graph_inputs = [
        helper.make_tensor_value_info(name, onnx.TensorProto.INT64, dims) for name in INPUTS
    ]
    flat = {}
    for name in INPUTS:
        value = name
        if choices:  # [b, c, s] -> [b * c, s]
            sequence = graph.node(
                "Gather", [graph.node("Shape", [name]), graph.constant("two", np.int64(2))]
            )
            shape = graph.node(
                "Concat",
                [
                    graph.constant("minus_one", np.array([-1], np.int64)),
                    graph.node(
                        "Unsqueeze", [sequence, graph.constant("axis0", np.array([0], np.int64))]
                    ),
                ],
                axis=0,
            )
            value = graph.node("Reshape", [name, shape])
        flat[name] = graph.node("Cast", [value], to=onnx.TensorProto.INT32)
    sequence_output, word_embeddings = _encoder(
        graph, weights, config, flat["input_ids"], flat["token_type_ids"], flat["attention_mask"]
    )
    outputs = {}
    kind = spec.kind if spec is not None else None
    if kind is None:
        if MLM_HEAD in heads:
            outputs["logits"] = _mlm_logits(
                graph, weights, config, sequence_output, word_embeddings
            )
        if NSP_HEAD in heads:
            outputs["seq_relationship_logits"] = graph.dense(
                _pooled(graph, weights, sequence_output),
                _float(weights, "cls/seq_relationship/output_weights").T,
                _float(weights, "cls/seq_relationship/output_bias"),
                "seq_relationship",
            )
        if not heads:
            outputs["last_hidden_state"] = sequence_output
            outputs["pooler_output"] = _pooled(graph, weights, sequence_output)
    else:
        scope = "qa_outputs" if kind == "squad" else "classifier"
        kernel, bias = _float(weights, f"{scope}/kernel"), _float(weights, f"{scope}/bias")
        if kind in ("classifier", "regressor"):
            outputs["logits"] = graph.dense(
                _pooled(graph, weights, sequence_output), kernel, bias, "head"
            )
        elif kind == "ner":
            outputs["logits"] = graph.dense(sequence_output, kernel, bias, "head")
        elif kind == "squad":
            both = graph.dense(sequence_output, kernel, bias, "head")
            start, end = graph.node(
                "Split",
                [both, graph.constant("halves", np.array([1, 1], np.int64))],
                outputs=2,
                axis=-1,
            )
            outputs["start_logits"] = graph.node(
                "Squeeze", [start, graph.constant("last", np.array([-1], np.int64))]
            )
            outputs["end_logits"] = graph.node(
                "Squeeze", [end, graph.constant("last", np.array([-1], np.int64))]
            )
        else:  # multiple_choice: a score per choice, back to [b, choices]
            scores = graph.dense(_pooled(graph, weights, sequence_output), kernel, bias, "head")
            batch_choices = graph.node(
                "Slice",
                [
                    graph.node("Shape", [INPUTS[0]]),
                    graph.constant("start", np.array([0], np.int64)),
                    graph.constant("end", np.array([2], np.int64)),
                ],
            )
            outputs["logits"] = graph.node("Reshape", [scores, batch_choices])
    # Name each output as Hugging Face does: an Identity from the internal name.
    graph_outputs = []
    for name, value in outputs.items():
        graph.nodes.append(helper.make_node("Identity", [value], [name]))
        graph_outputs.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    model = helper.make_model(
        helper.make_graph(graph.nodes, "bert_tf", graph_inputs, graph_outputs, graph.initializers),
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)],
        producer_name="bert_tf",
        ir_version=IR_VERSION,
    )
    return model, list(outputs)


def check_activation(config, model_dir):
    if config.hidden_act not in GELU_OPERATORS:
        raise io_utils.UsageError(
            f"model directory {model_dir} has hidden_act={config.hidden_act}: the ONNX export "
            f"writes {', '.join(GELU_OPERATORS)} only"
        )


def sample_inputs(config, spec, rng):
    """A few int64 inputs for the check: two rows, the second right-padded."""
    length = min(config.max_position_embeddings, 12)
    ids = rng.integers(5, config.vocab_size, (2, length)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, length // 2 :] = 0
    types = np.zeros_like(ids)
    types[:, length // 3 : length // 2] = 1
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    if spec is not None and spec.kind == "multiple_choice":
        inputs = {name: np.stack([value, value[::-1]]) for name, value in inputs.items()}
    return inputs


def keras_outputs(model, spec, heads, inputs):
    """Our Keras model's outputs on `inputs` ({INPUTS name: int64}), under the ONNX outputs' names."""
    feed = {
        "input_word_ids": inputs["input_ids"],
        "input_mask": inputs["attention_mask"],
        "input_type_ids": inputs["token_type_ids"],
    }
    feed = {name: tf.constant(value, tf.int32) for name, value in feed.items()}
    if spec is None and heads:
        positions = np.tile(
            np.arange(feed["input_word_ids"].shape[1]), (feed["input_word_ids"].shape[0], 1)
        )
        feed["masked_lm_positions"] = tf.constant(positions, tf.int32)
        out = model(feed, training=False)
        result = {}
        if "mlm_logits" in out:
            result["logits"] = np.asarray(out["mlm_logits"])
        if "nsp_logits" in out:
            result["seq_relationship_logits"] = np.asarray(out["nsp_logits"])
        return result
    out = model(feed, training=False)
    if spec is None:
        return {
            "last_hidden_state": np.asarray(out["sequence_output"]),
            "pooler_output": np.asarray(out["pooled_output"]),
        }
    if spec.kind == "squad":
        return {name: np.asarray(out[name]) for name in ("start_logits", "end_logits")}
    if spec.kind == "regressor":  # Hugging Face's regression logits are [b, 1]
        return {"logits": np.asarray(out["score"]).reshape(-1, 1)}
    return {"logits": np.asarray(out["logits"])}


def largest_difference(path, expected, inputs):
    """The largest |difference| between ONNX Runtime's outputs of `path` and `expected`."""
    _, onnxruntime = _onnx()
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))
    worst = 0.0
    for name, value in expected.items():
        if got[name].shape != value.shape:
            raise RuntimeError(
                f"bert_tf bug: ONNX output {name} is {got[name].shape}, ours {value.shape}"
            )
        worst = max(worst, float(np.max(np.abs(got[name] - value))))
    return worst


def export(model_dir, output_dir, overwrite=False, record=None):
    """Writes the model directory `model_dir` as an ONNX model and tokenizer in `output_dir`,
    checked in ONNX Runtime against our model before it appears; returns an OnnxExportResult."""
    directory = ModelDir(model_dir)
    directory.check()
    config = directory.read_config()
    hf_export.check_exportable(config, "ONNX", model_dir)
    hf_export.check_head_exportable(directory, "ONNX", model_dir)
    check_activation(config, model_dir)
    hf_export.check_apart(model_dir, output_dir)
    vocab = hf_export.read_vocab(directory.vocab_file)
    onnx, _ = _onnx()
    with io_utils.atomic_directory(output_dir, hf_export.OUTPUT_JOB, overwrite, record) as tmp:
        config, spec, heads, model = hf_export.load_model(directory)
        weights = name_map.original_weights(
            model, config.num_hidden_layers, heads, task_kind=spec.kind if spec else None
        )
        proto, outputs = build_model(weights, config, spec, heads)
        path = os.path.join(tmp, MODEL_FILE)
        onnx.save_model(proto, path)
        inputs = sample_inputs(config, spec, np.random.default_rng(0))
        difference = largest_difference(path, keras_outputs(model, spec, heads, inputs), inputs)
        if difference > CHECK_TOLERANCE:
            raise RuntimeError(
                f"bert_tf bug: the ONNX model differs from {model_dir}'s by {difference:.3g} "
                f"(more than {CHECK_TOLERANCE})"
            )
        arch = hf_export.architecture(spec, heads)
        hf_export.write_config_and_tokenizer(tmp, config, spec, arch, vocab, directory.vocab_file)
    description = (
        f"a fine-tuned {spec.kind}" if spec else f"the encoder and {describe_heads(heads)}"
    )
    return OnnxExportResult(output_dir, outputs, difference, description)
