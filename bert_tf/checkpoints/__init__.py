"""Weights in and out of checkpoints: other BERTs' checkpoints and a job's initial weights.

name_map.py          Google's and Hugging Face's checkpoints: the original BERT variable
                     names <-> the Keras variables, reading them, converting to a model directory
initial_weights.py   what a job starts from: its config, vocab and initial weights
"""
