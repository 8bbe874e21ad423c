"""Training: the loop, the job around it, the flags every training job shares, fine-tuning, optimizers.

training_loop.py  the custom loop under any tf.distribute strategy, resumable
training_job.py   build under the strategy, resume or initialize, train
loop_flags.py     the training loop's flags (LoopArgs), which every training job's arguments extend
training_flags.py the flags every fine-tuning job shares, and the settings taken from them
finetuning.py     the fine-tuning driver every task shares
optimization.py   AdamW, LAMB, the warmup + linear decay schedule
"""
