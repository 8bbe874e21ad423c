"""The paper's studies (Tables 5, 6 and 7) run with the real jobs: `python -m bert_tf.experiments`."""
