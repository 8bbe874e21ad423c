"""Weights in and out of checkpoints: other BERTs' checkpoints, a job's initial weights, a run's saves.

    name_map.py           the original BERT variable names <-> the Keras variables, validated
    google_checkpoint.py  Google's original TF1 checkpoints: finding one, reading its variables
    huggingface.py        Hugging Face BERT: config.json, weight names, activations, weight files
    pytorch_bin.py        pytorch_model.bin read without torch
    conversion.py         a Google or Hugging Face checkpoint -> a model directory
    initial_weights.py    what a job starts from: its config, vocab and initial weights
    saves.py              a run's own saves: where it resumes, suspect and interrupted saves

A checkpoint's step and heads, and the model directory around it: bert_tf.model.model_dir.
"""
