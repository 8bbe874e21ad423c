"""To and from other BERT libraries.

hf_export.py        a model directory as a Hugging Face BERT directory, and the way back in
keras_hub_export.py a model directory as a keras-hub preset
"""
