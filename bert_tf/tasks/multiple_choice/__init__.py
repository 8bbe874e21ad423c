"""Multiple choice, the BERT paper's SWAG task: a context and n endings in, the likeliest ending out.

data.py reads SWAG's CSV files (and TFDS's SWAG-style `hellaswag`) into features [n, choices, seq];
model.py scores every (context, ending) pair with one dense unit on its pooled output and takes a
softmax over the choices; serving.py is the exported graph (context [b], endings [b, n] strings in);
job.py is the task's side of a fine-tuning run (run_multiple_choice's flow).
"""
