"""Extractive question answering, SQuAD v1.1 and v2.0, as the original run_squad.py.

data.py reads the JSON into examples and windowed features; postprocess.py turns logits into
answers; metrics.py is the official evaluation; model.py the span head and its loss; serving.py
the exported graph (question and context in, the answer and its span out); job.py the task's
side of a fine-tuning run (run_squad's flow: questions in, answers and official metrics out).
"""
