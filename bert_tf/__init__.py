"""bert_tf: BERT end to end in TensorFlow/Keras: data, pretraining, fine-tuning, export, serving."""

__version__ = "0.1.0"
