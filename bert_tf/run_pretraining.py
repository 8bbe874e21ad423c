"""python -m bert_tf.run_pretraining: masked-LM + next-sentence pretraining under any tf.distribute strategy.

    python -m bert_tf.run_pretraining --input_file='tfrecords/*.tfrecord' --output_dir=build/pretrain \\
      --model_size=mini --vocab_file=vocab.txt --do_train --do_eval \\
      --train_batch_size=256 --max_seq_length=128 --max_predictions_per_seq=20 \\
      --num_train_steps=100000 --num_warmup_steps=10000 --learning_rate=1e-4 --strategy=mirrored

Rerunning the same command resumes from the newest checkpoint in --output_dir. The output directory
is a model directory (bert_config.json, vocab.txt, ckpt-N) that fine-tuning and export read. The
loss is bert_tf.pretraining.masked_lm's; the run is bert_tf.pretraining.job's, through
bert_tf.training.training_job, as fine-tuning's is.

The paper's pretraining ablations (Table 5) read the same records:
    --nsp=false                       "No NSP": the masked LM alone; no NSP head is built or saved
    --objective=ltr --nsp=false       "LTR & No NSP": a left-to-right language model
                                      (bert_tf.pretraining.left_to_right_lm); the output's bert_config.json says
                                      attention_direction=left_to_right, so fine-tuning and export
                                      apply the same left-only attention mask

The paper's two phases (bert_tf.pretraining.phases) in one run and one output directory:
    --phase2_input_file=... --phase2_max_seq_length=512 --phase2_max_predictions_per_seq=80
    --phase2_train_steps=N2 [--phase2_recipe=continue|restart]
and the paper's batch on small hardware: --num_accumulation_steps=N sums N micro-batches'
gradients into each update (exactly one batch of --train_batch_size).
"""

from bert_tf.runtime import job_process  # noqa: F401  (first: it sets the process up before TensorFlow loads)

# isort: split

from bert_tf.checkpoints import saves
from bert_tf.pretraining import job
from bert_tf.runtime import cli

if __name__ == "__main__":
    cli.define_flags(job.PretrainingArgs, do_train=False)
    cli.run(
        cli.job_main(
            job.PretrainingArgs,
            job.run,
            "run_pretraining",
            required=("input_file", "output_dir"),
            clean_output_dir=saves.clean_output_dir,
        )
    )
