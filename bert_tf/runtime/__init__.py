"""What every job runs on, below everything else: the command line, files, processes, devices.

cli.py           flags made from a job's arguments, exit codes, flag logging
io_utils.py      atomic writes, input globs, the errors a job reports (UsageError, JobFailure)
quiet.py         quiet command lines: TensorFlow's start-up notices dropped
job_process.py   what a `python -m bert_tf.<job>` process sets up before TensorFlow loads
child_reaper.py  the processes a job starts die with it
distribution.py  --strategy -> a tf.distribute strategy
tf_data.py       the tf.data settings every input pipeline shares
"""
