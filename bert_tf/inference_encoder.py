"""The encoder's forward pass for exported models: the Keras encoder's network in 2-D matmuls.

Why not call the Keras encoder: keras-hub's attention computes each of the query, key, value and
output projections as an einsum with its own reshapes and transposes. Here the three input
projections are one [b*s, H] by [H, 3H] MatMul and every other projection a 2-D MatMul (a traced
MiniLM call runs 454 ops besides constants, against the Keras encoder's 640). Measured on the
2-core AVX2 machine of benchmarks/RESULTS.md (session 12), exports of the same classifier with
the Keras encoder and with this one, loaded in one process and called in alternation on 96 real
sentences: MiniLM at batch 1 took 0.81x to 0.82x the time (3 runs; 16.1 -> 13.2 ms in the last),
BERT-base 0.92x; at batch 32, 0.95x to 1.00x. Under XLA, which fuses either graph, the two were
within noise (1.03x at batch 1, 0.93x at batch 32). The arithmetic is the same, so the gain is
the kernels not run, which shows at small batches.

It is the same network: embeddings (word + position + segment) -> LayerNorm -> post-LN
transformer layers (attention, residual, LayerNorm; feedforward, residual, LayerNorm) -> pooled
tanh(dense(first token)); outputs match the Keras encoder's within float rounding (tests compare
every output). Inference only: there is no dropout, and the weights are copies of the encoder's in
this layout (the matmul kernels in the compute dtype), so training goes through bert_tf.modeling's
Keras encoder.
"""

import math

import keras
import numpy as np
import tensorflow as tf

from bert_tf import checkpoints, modeling

# The attention score of a padding key, as Keras' masked softmax sets it: exp() of it is 0.
_MASKED_SCORE = -1e9


def _layer_norm(x, gamma, beta):
    """LayerNorm over the last axis (eps 1e-12): Keras' own op, as its layer calls it (in float32)."""
    return keras.ops.layer_normalization(
        x, gamma, beta, axis=-1, epsilon=modeling.LAYER_NORM_EPSILON
    )


class InferenceEncoder(keras.layers.Layer):
    """A Keras encoder's network (its inputs and outputs) in 2-D matmuls, for inference."""

    def __init__(self, encoder, config, **kwargs):
        kwargs.setdefault("name", "inference_encoder")
        super().__init__(**kwargs)
        self.hidden_size = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.activation = modeling.get_activation(config.hidden_act)
        # The encoder's weights by the original's names, in the original's 2-D shapes (the
        # checkpoint converter's map, read backwards: each Keras layout is a reshape of those).
        source = {
            name: variable.numpy().reshape(shape)
            for name, (variable, shape, _) in checkpoints.original_name_map(
                encoder, config.num_hidden_layers, with_heads=False
            ).items()
        }

        def copy(name, value):
            # Matmul kernels in the compute dtype, cast once here: under bfloat16 a cast of each
            # float32 kernel on every call read and wrote the weights again, and a MiniLM export
            # took 1.2x the time at batch 1 and 1.1x at batch 32 (same outputs; benchmarks/
            # RESULTS.md, session 13). The rest stays float32 (embeddings are summed and
            # LayerNorm runs in float32, as Keras does).
            weight = self.add_weight(
                name=name,
                shape=value.shape,
                dtype=self.compute_dtype if name.endswith("kernel") else "float32",
                initializer="zeros",
                trainable=False,
                autocast=False,
            )
            weight.assign(value)
            return weight

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
        self.transformer_layers = []
        for i in range(config.num_hidden_layers):
            layer = f"bert/encoder/layer_{i}"
            attention = f"{layer}/attention/self"
            weights = {
                # [H, 3H]: the query, key and value projections side by side, heads inside each.
                "qkv_kernel": np.concatenate(
                    [source[f"{attention}/{p}/kernel"] for p in ("query", "key", "value")], axis=1
                ),
                "qkv_bias": np.concatenate(
                    [source[f"{attention}/{p}/bias"] for p in ("query", "key", "value")]
                ),
                "output_kernel": source[f"{layer}/attention/output/dense/kernel"],
                "output_bias": source[f"{layer}/attention/output/dense/bias"],
                "attention_norm_gamma": source[f"{layer}/attention/output/LayerNorm/gamma"],
                "attention_norm_beta": source[f"{layer}/attention/output/LayerNorm/beta"],
                "intermediate_kernel": source[f"{layer}/intermediate/dense/kernel"],
                "intermediate_bias": source[f"{layer}/intermediate/dense/bias"],
                "ffn_output_kernel": source[f"{layer}/output/dense/kernel"],
                "ffn_output_bias": source[f"{layer}/output/dense/bias"],
                "ffn_norm_gamma": source[f"{layer}/output/LayerNorm/gamma"],
                "ffn_norm_beta": source[f"{layer}/output/LayerNorm/beta"],
            }
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
        self.built = True

    def _dense(self, x, kernel, bias):
        """x [n, k] @ kernel [k, m] + bias, in the compute dtype."""
        dtype = self.compute_dtype
        return tf.nn.bias_add(tf.matmul(x, tf.cast(kernel, dtype)), tf.cast(bias, dtype))

    def _attention(self, x, layer, keys, batch, length):
        """Self-attention of x [b*s, H] over `keys` (bool [b, 1, 1, s]): the context, [b*s, H]."""
        head_size = self.hidden_size // self.num_heads
        qkv = self._dense(x, layer["qkv_kernel"], layer["qkv_bias"])
        # [3, b, heads, s, head_size]
        qkv = tf.transpose(
            tf.reshape(qkv, [batch, length, 3, self.num_heads, head_size]), [2, 0, 3, 1, 4]
        )
        query, key, value = tf.unstack(qkv)
        # Keras scales the query before the product when it has attention dropout (every released
        # config); so do we, for the same rounding.
        query = query * tf.cast(1.0 / math.sqrt(head_size), query.dtype)
        products = tf.matmul(query, key, transpose_b=True)
        scores = tf.where(keys, products, tf.cast(_MASKED_SCORE, products.dtype))
        # Zeroed after the softmax too, as Keras does: a row without real keys attends to nothing.
        probabilities = tf.where(keys, tf.nn.softmax(scores), tf.zeros([], products.dtype))
        context = tf.matmul(probabilities, value)  # [b, heads, s, head_size]
        return tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [-1, self.hidden_size])

    def call(self, inputs, training=False, mask=None):
        """The three encoder inputs [b, s] -> the Keras encoder's outputs dict."""
        # `training` and `mask` are what Keras passes when it reruns a functional graph; this is
        # inference only, and the padding comes from input_mask.
        dtype = self.compute_dtype
        word_ids = inputs["input_word_ids"]
        batch, length = tf.shape(word_ids)[0], tf.shape(word_ids)[1]
        embeddings = (
            tf.gather(self.word_embeddings, word_ids)
            + self.position_embeddings[tf.newaxis, :length]
            + tf.gather(self.segment_embeddings, inputs["input_type_ids"])
        )
        x = _layer_norm(tf.cast(embeddings, dtype), *self.embeddings_norm)
        x = tf.reshape(x, [-1, self.hidden_size])
        # A key is real where its int32 mask is positive (Keras' masked softmax keeps mask > 0.5).
        keys = (inputs["input_mask"] > 0)[:, tf.newaxis, tf.newaxis, :]
        encoder_outputs = []
        for layer in self.transformer_layers:
            attended = self._attention(x, layer, keys, batch, length)
            attended = self._dense(attended, layer["output_kernel"], layer["output_bias"])
            x = _layer_norm(
                attended + x, layer["attention_norm_gamma"], layer["attention_norm_beta"]
            )
            hidden = self.activation(
                self._dense(x, layer["intermediate_kernel"], layer["intermediate_bias"])
            )
            hidden = self._dense(hidden, layer["ffn_output_kernel"], layer["ffn_output_bias"])
            x = _layer_norm(hidden + x, layer["ffn_norm_gamma"], layer["ffn_norm_beta"])
            encoder_outputs.append(tf.reshape(x, [batch, length, self.hidden_size]))
        sequence_output = encoder_outputs[-1]
        pooled_output = tf.tanh(self._dense(sequence_output[:, 0], *self.pooler))
        return {
            "sequence_output": sequence_output,
            "pooled_output": pooled_output,
            "encoder_outputs": encoder_outputs,
        }

    def compute_output_spec(self, inputs, training=False, mask=None):
        """The outputs' shapes and dtypes, as the Keras encoder's."""
        batch, length = inputs["input_word_ids"].shape
        encoder_outputs = [
            keras.KerasTensor((batch, length, self.hidden_size), dtype=self.compute_dtype)
            for _ in self.transformer_layers
        ]
        return {
            "sequence_output": encoder_outputs[-1],
            "pooled_output": keras.KerasTensor((batch, self.hidden_size), dtype=self.compute_dtype),
            "encoder_outputs": encoder_outputs,
        }


def with_inference_encoder(encoder, config, model=None):
    """A task `model` on `encoder` (or, if None, the encoder) with InferenceEncoder in its place."""
    fast = InferenceEncoder(encoder, config)
    if model is None:
        inputs = modeling.encoder_inputs()
        return keras.Model(inputs, fast(inputs), name=encoder.name)
    return keras.models.clone_model(
        model, clone_function=lambda layer: fast if layer is encoder else layer
    )
