"""Sentence (pair) classification and regression: GLUE and a user's own TSV/CSV.

data.py reads the files into examples and features; metrics.py has GLUE's metrics; model.py the
heads on pooled_output and their losses; serving.py the exported graph (text in, labels out);
job.py the task's side of a fine-tuning run (run_classifier's flow: splits in, metrics and
submission files out).
"""
