"""Named-entity tagging on CoNLL-2003-format files.

data.py reads the files into sentences and features and writes predictions; metrics.py has
conlleval's entity scores; model.py the token head and its loss; serving.py the exported graph
(text in, entities with their character spans out); job.py is the task's side of a fine-tuning
run (run_ner's flow: files in, scores and tagged files out).
"""
