"""BERT's WordPiece tokenization, in Python and in the TensorFlow graph, by one set of rules.

tokenizer_rules.py   the vocabulary file, the special tokens, the character classes both follow
python_tokenizer.py  FullTokenizer, the original tokenizer in plain Python rule for rule, and
                     CachedTokenizer, the same tokens with each distinct word tokenized once
graph_tokenizer.py   GraphTokenizer: the same tokens as TensorFlow ops, for exports and tf.data
graph_cond.py        a tf.cond that runs only the branch it takes (the graph tokenizer's)
vocab_learner.py     a WordPiece vocab.txt learned from text files (python -m bert_tf.build_vocab)
__main__.py          `python -m bert_tf.tokenization`: the tokenizers compared on a file
"""
