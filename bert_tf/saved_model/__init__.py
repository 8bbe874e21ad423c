"""SavedModel exports with tokenization baked in, and what a server needs to load them.

export.py             a model directory -> a versioned SavedModel (strings in, answers out)
inference_encoder.py  the encoder's forward pass for exports, in 2-D matmuls
intra_op_limit.py     part of a graph run with fewer intra-op threads
masked_lm_serving.py  the pretraining heads' `fill_mask` and `next_sentence` signatures
warmup.py             TF Serving's warm-up requests, written into an export
model_versions.py     TF Serving's BASE/<version>/ layout
"""
