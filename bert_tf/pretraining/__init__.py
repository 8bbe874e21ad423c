"""Pretraining's training side: the objectives, the two phases, the records reader, the run.

    masked_lm.py         masked LM + next sentence: the losses, and asking a trained model
    left_to_right_lm.py  the left-to-right LM (the paper's "LTR & No NSP" ablation)
    phases.py            the paper's two phases as one run: short sequences, then long ones
    input_pipeline.py    tf.data readers for the pretraining TFRecords
    job.py               a run: PretrainingArgs -> checks -> TrainingJob -> phases -> evaluation
                         (python -m bert_tf.run_pretraining is its CLI)

The records themselves are made by bert_tf.pretraining_data.
"""
