"""The network and where it lives: BertConfig, the Keras encoder and heads, the model directory.

modeling.py   BertConfig, the Keras functional encoder and the pretraining heads
model_dir.py  the model directory: config, vocab, checkpoint, task.json, which heads it holds
objective.py  what a training job plugs into the loop: its loss, statistics and metrics
"""
