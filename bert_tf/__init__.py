"""bert_tf: BERT end to end in TensorFlow/Keras: data, pretraining, fine-tuning, export, serving.

Importing the package (or any library module of it) changes nothing in the process; a job's command
line sets its process up through bert_tf.runtime.job_process.
"""

__version__ = "0.1.0"
