"""CLI: text (or a tensorflow-datasets split) -> masked-LM + next-sentence TFRecords, the original format.

  python -m bert_tf.create_pretraining_data --input_file=corpus/*.txt.gz --vocab_file=vocab.txt \\
      --output_dir=tfrecords --num_shards=8 --dupe_factor=5

The flags are the original script's, plus --output_dir/--num_shards/--output_prefix, --num_workers,
--compression, --overwrite, --input_tfds, --runner and --random_next_prob (the original's 0.5
chance of a random B; 0 for the paper's No NSP ablations).

  * output file k of N holds the k-th of N equal byte ranges of the input, cut into work units of
    about 1 MiB that --num_workers processes run (1: this process); the output is byte-identical
    whatever --num_workers is;
  * --runner=DirectRunner|DaskRunner|DataflowRunner|FlinkRunner|SparkRunner|PortableRunner runs the
    same units as an Apache Beam pipeline, with the same output bytes; every argument that is not a
    flag of this job is one of Beam's pipeline options (--direct_num_workers,
    --dask_client_address, --project, --region, --temp_location, --setup_file, --flink_master, ...)
    and goes to Beam unchanged;
  * OUTPUT_DIR/.PREFIX.work/ holds the run's settings, manifests, parts and token files: a rerun with
    the same flags and input resumes a killed run and keeps its finished files; a run with other
    settings at the same output paths is refused, unless --overwrite; a file at an output's name
    that no recorded run wrote is refused, --overwrite or not, and never removed;
  * summary.json (counts, label balance, truncations, invalid UTF-8, elapsed time) and
    create_pretraining_data.flags (reusable with --flagfile) are written beside the output, and the
    first records are logged readably, as the original does. Bad flags or input exit with code 2.

This module only reads the flags into a `job.PretrainingDataArgs` and calls
`job.run`; bert_tf/pretraining_data/ does the work (see its docstring).
"""

from bert_tf.runtime import job_process  # noqa: F401  (first: it sets the process up before TensorFlow loads)

# isort: split

from absl import flags

from bert_tf.pretraining_data import files, job
from bert_tf.runtime import cli

JOB_NAME = "create_pretraining_data"
FLAGS = flags.FLAGS
# The flags are the args dataclass's fields: names, defaults and help declared once there.
cli.define_flags(job.PretrainingDataArgs)


def pipeline_args(argv, runner, num_workers_given, num_workers):
    """Beam's pipeline options: the arguments that are not this job's flags (argv[1:]). Beam has
    its own --num_workers (Dataflow's worker count), which this job's flag of that name shadows:
    given on a Beam run, it goes to Beam too."""
    beam_args = list(argv[1:])
    if runner and num_workers_given:
        beam_args.append(f"--num_workers={num_workers}")
    return tuple(beam_args)


def flagfile_lines(beam_args):
    """Beam's options as --name=value lines for the flags file (`--name value` pairs joined)."""
    lines = []
    for arg in beam_args:
        if lines and not arg.startswith("-") and "=" not in lines[-1]:
            lines[-1] += f"={arg}"
        else:
            lines.append(arg)
    return lines


def main(argv):
    """Runs the job on the flags; the resolved flags go beside the output once it is this run's."""
    args = cli.args_from_flags(job.PretrainingDataArgs)
    beam_args = pipeline_args(argv, args.runner, FLAGS["num_workers"].present, args.num_workers)
    # The flags file goes beside the outputs only once the location is this run's (see run()).
    job.run(
        args,
        log_flags=lambda output_dir: cli.log_flags(
            output_dir, JOB_NAME, flagfile_lines(argv[1:]), write_text=files.write_text
        ),
        pipeline_args=beam_args,
    )


if __name__ == "__main__":
    cli.run(main, pass_unknown_flags=True)
