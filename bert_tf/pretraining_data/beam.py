"""The pretraining-data job on Apache Beam: the local path's work units, as a pipeline.

`python -m bert_tf.create_pretraining_data ... --runner=NAME` plans the run here exactly as the
local path does (plan.py: units, outputs, fingerprint, resume), then hands the units to Beam:

  Tokenize   a ParDo over the units left to tokenize: worker.tokenize_unit, the token files and
             their manifest written to the work directory (phase 1)
  Build      a ParDo over the units left to build, with every unit's phase-1 stats as a side input,
             which is the barrier: no unit is built before every unit is tokenized, since its
             random-next segments come from any unit. worker.build_part writes the part (phase 2)
  Assemble   the parts grouped by output file; each output is its parts concatenated in unit
             order, with plan.assemble_output, as the local path does

The same functions on the same units give the same bytes: the shards and summary.json (apart from
timings) are the local run's, on any runner and any number of workers.

Retries. Beam re-runs a failed bundle, and a bundle's outputs count only once it commits. Every file
a DoFn writes goes to a temporary name and is renamed, so a reader never sees a partial file under
its final name; every file is named by its unit or output, and its bytes depend only on the input
and the settings, so a retried bundle overwrites with the same bytes, never appends. The stats
that flow to Assemble are elements, counted once per committed bundle, and an Assemble retried after
its output was complete finds the output's manifest and keeps the file.

Where the files live. The work directory (OUTPUT_DIR/.PREFIX.work) must be one that every worker
reaches: a local one for DirectRunner (or a shared file system), gs:// for Dataflow. With a remote
work directory, a worker writes a unit's files on its own disk and uploads them (files.py), and
before building it copies every unit's token files, about the input's size, to its disk once, for
phase 2's random-next reads (a few hundred bytes each, with os.pread). The plan, the settings and
the vocabulary reach the workers as one file in the work directory (`job_file_path`), so that the
pipeline itself stays small however many units there are.

The workers import no TensorFlow, as on the local path (a tfds input is the exception: its units
read their slices with tensorflow-datasets on the workers).
"""

import dataclasses
import hashlib
import os
import pickle
import shutil
import tempfile

import apache_beam as beam
from apache_beam.metrics import Metrics, MetricsFilter
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

from bert_tf.pretraining_data import files, tokenized_corpus, worker
from bert_tf.pretraining_data import plan as planning
from bert_tf.runtime import child_reaper, io_utils

# What Dataflow needs from the command line before it can start anything.
DATAFLOW_REQUIRED = ("project", "region", "temp_location")
METRICS_NAMESPACE = "create_pretraining_data"

# ---------------------------------------------------------------------------------------------
# Options and checks, before anything starts
# ---------------------------------------------------------------------------------------------


def validate(args, pipeline_args, outputs, output_flag):
    """UsageErrors for a Beam run on a known runner that cannot start: an unknown pipeline option,
    Dataflow without its required options or with local paths."""
    pipeline_options(args.runner, pipeline_args)
    if args.runner == "DataflowRunner":
        paths = [(output_flag, outputs[0])]
        if args.input_file:
            paths.append(("--input_file", args.input_file.split(",")[0].strip()))
        for flag, path in paths:
            if not files.is_remote(path):
                raise io_utils.UsageError(
                    f"{flag}: Dataflow's workers cannot reach the local path {path}; give a "
                    "gs:// path"
                )


def pipeline_options(runner, pipeline_args):
    """Beam's PipelineOptions from the arguments the CLI passed on; a UsageError names an option
    Beam does not know, or what Dataflow is missing."""
    for i, arg in enumerate(pipeline_args):
        follows_name = (
            i and pipeline_args[i - 1].startswith("--") and "=" not in pipeline_args[i - 1]
        )
        if not arg.startswith("-") and not follows_name:
            raise io_utils.UsageError(f"unexpected argument {arg!r}")
    if runner == "DaskRunner":
        # Its options (--dask_client_address, ...) are known once its module is imported.
        try:
            import distributed  # noqa: F401
            from apache_beam.runners.dask import dask_runner  # noqa: F401
        except ImportError as e:
            raise io_utils.UsageError(f"--runner=DaskRunner needs dask[distributed] ({e})") from e
    known = set(PipelineOptions([]).get_all_options())
    pipeline_args = list(pipeline_args)
    if not any(a.startswith("--default_sdk_harness_log_level") for a in pipeline_args):
        # The workers' INFO lines (about 20 each, relayed once more by the runner) say nothing a
        # user of this job needs; their warnings stay.
        pipeline_args.append("--default_sdk_harness_log_level=WARNING")
    if runner == "DaskRunner" and not any(
        a.startswith(("--dask_partition_size", "--dask_npartitions")) for a in pipeline_args
    ):
        # A work unit is about a MiB of text and seconds of work: one a partition, so that every
        # worker gets some (Beam's default puts up to 128 in one).
        pipeline_args.append("--dask_partition_size=1")
    options = PipelineOptions(pipeline_args, runner=runner)
    unknown = sorted(set(options.get_all_options(retain_unknown_options=True)) - known)
    if unknown:
        raise io_utils.UsageError(
            f"unknown flags {', '.join('--' + name for name in unknown)}: neither flags of "
            "create_pretraining_data nor Beam pipeline options"
        )
    if runner == "DataflowRunner":
        cloud = options.view_as(GoogleCloudOptions)
        for name in DATAFLOW_REQUIRED:
            if not getattr(cloud, name):
                raise io_utils.UsageError(f"--runner=DataflowRunner needs --{name}")
        files.check_remote(cloud.temp_location, "--temp_location")
    return options


def make_runner(name, options):
    """The Beam runner `name` (tests replace this function to run on another runner).

    Beam's DirectRunner first tries Prism, a Go binary it downloads at run time, and for a batch
    pipeline falls back to FnApiRunner, the Python engine that --direct_num_workers and
    --direct_running_mode configure. DirectRunner here is that engine, without the download.
    """
    if name == "DaskRunner":  # Beam knows it by its module path only
        from apache_beam.runners.dask.dask_runner import DaskRunner

        return DaskRunner()
    if name != "DirectRunner":
        return name
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    provision = beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)
    return fn_runner.FnApiRunner(provision_info=fn_runner.ExtendedProvisionInfo(provision))


# ---------------------------------------------------------------------------------------------
# The pipeline
# ---------------------------------------------------------------------------------------------


def run_units(runner, pipeline_args, config, plan, finished, after_step=None):
    """Runs the units left in `finished` as a Beam pipeline on `runner` with the options
    `pipeline_args`, and waits for it.

    `after_step(phase, key)`, when given, is called on the worker after each step has written its
    files and before it emits its result: phase "tokenize" or "build" with the unit's index, or
    "assemble" with the output's index. An exception it raises fails the step's bundle there, as
    a worker lost before its bundle commits would (tests inject failures this way); it must be
    picklable, as DoFns are.

    Returns (stats per output file, text bytes tokenized in this run), as the local path does.
    """
    if len(finished.outputs) == len(plan.outputs):
        return dict(finished.outputs), 0
    options = pipeline_options(runner, pipeline_args)
    job_file = write_job_file(plan, config)
    text_bytes = 0
    try:
        if runner == "DaskRunner" and finished.to_tokenize:
            # Beam 2.77's DaskRunner computes a side input's producers once more for its consumer
            # (every unit was tokenized twice): phase 1 runs as a pipeline of its own, and phase 2
            # reads its stats from the manifests, as a resumed run does.
            tokenized_now = [unit.index for unit in finished.to_tokenize]
            _run_pipeline(runner, options, lambda p: _tokenize(p, job_file, finished, after_step))
            finished = planning.find_finished(plan)
            # DaskRunner reports no metrics: the manifests say what this run tokenized.
            text_bytes = sum(finished.tokens.get(u, {}).get("text_bytes", 0) for u in tokenized_now)
        text_bytes += _run_pipeline(
            runner, options, lambda p: _all_phases(p, job_file, plan, finished, after_step)
        )
    finally:
        if runner == "DirectRunner":  # this machine's copies of a remote work directory
            shutil.rmtree(local_work_dir(plan), ignore_errors=True)
    files.remove(job_file)
    done = planning.find_finished(plan)
    missing = [plan.outputs[k] for k in range(len(plan.outputs)) if k not in done.outputs]
    if missing:
        raise io_utils.JobFailure(f"the Beam pipeline ended without writing {', '.join(missing)}")
    return done.outputs, text_bytes


def _tokenize(pipeline, job_file, finished, after_step):
    """Phase 1's stage: the units left to tokenize; a PCollection of (unit, stats)."""
    return (
        pipeline
        | "UnitsToTokenize" >> beam.Create([unit.index for unit in finished.to_tokenize])
        | "SpreadTokenize" >> beam.Reshuffle()
        | "Tokenize" >> beam.ParDo(TokenizeUnit(job_file, after_step))
    )


def _all_phases(pipeline, job_file, plan, finished, after_step):
    """Tokenize, Build (every unit's token stats its side input: the barrier) and Assemble."""
    output_of_unit = planning.output_of_unit(plan)
    token_stats = (
        _tokenize(pipeline, job_file, finished, after_step),
        pipeline | "TokenizedBefore" >> beam.Create(sorted(finished.tokens.items())),
    ) | "AllTokenStats" >> beam.Flatten()
    built = (
        pipeline
        | "UnitsToBuild" >> beam.Create([unit.index for unit in finished.to_build])
        | "SpreadBuild" >> beam.Reshuffle()
        | "Build" >> beam.ParDo(BuildUnit(job_file, after_step), beam.pvalue.AsDict(token_stats))
    )
    built_before = [(output_of_unit[u], (u, stats)) for u, stats in sorted(finished.parts.items())]
    (
        (built, pipeline | "BuiltBefore" >> beam.Create(built_before))
        | "AllParts" >> beam.Flatten()
        | "PartsByOutput" >> beam.GroupByKey()
        | "Assemble" >> beam.ParDo(AssembleOutput(job_file, after_step))
    )


def _run_pipeline(runner, options, add_stages):
    """Runs a pipeline of `add_stages(pipeline)` on `runner` and waits for it; returns the text
    bytes it tokenized (0 where the runner reports no metrics)."""
    pipeline = beam.Pipeline(runner=make_runner(runner, options), options=options)
    add_stages(pipeline)
    try:
        # Beam's local workers are plain subprocesses: a SIGKILL of this job must take them too.
        with child_reaper.reaped_children():
            result = pipeline.run()
            try:
                result.wait_until_finish()
            finally:
                client = getattr(result, "client", None)  # DaskRunner's connection to its cluster
                if client is not None:
                    client.close()
    except Exception as e:
        full_disk = io_utils.full_disk_error_in(str(e))  # reported as the local path reports it
        if full_disk:
            raise full_disk from e
        raise io_utils.JobFailure(f"the Beam pipeline failed: {e}") from e
    return _counter_total(result, "text_bytes")


def _counter_total(result, name):
    """A Beam counter's committed total (its attempted one where the runner has no other); 0 where
    the runner reports no metrics (it only feeds summary.json's MB/s)."""
    total = 0
    try:
        query = result.metrics().query(
            MetricsFilter().with_namespace(METRICS_NAMESPACE).with_name(name)
        )
    except Exception:  # a runner without a metrics API
        return 0
    for counter in query["counters"]:
        try:
            value = counter.committed
        except Exception:  # some runners only report attempted values
            value = None
        total += counter.attempted if value is None else value
    return total


def job_file_path(plan):
    """The file that carries the plan, the settings and the vocabulary to the workers."""
    return os.path.join(plan.work_dir, "beam_job.pickle")


def write_job_file(plan, config):
    """Writes the job file (see job_file_path); returns its path."""
    with open(config.vocab_file, "rb") as f:
        vocab = f.read()
    path = job_file_path(plan)
    with files.atomic_path(path) as tmp, open(tmp, "wb") as f:
        pickle.dump({"plan": plan, "config": config, "vocab": vocab}, f)
    return path


def local_work_dir(plan):
    """This machine's directory for the files of a remote work directory: shared by the worker
    processes of a machine (files land there atomically, with the same bytes from any process)."""
    return os.path.join(tempfile.gettempdir(), f"bert_tf_beam-{plan.fingerprint[:16]}")


# Per worker process: job file path -> (plan, config with a local vocabulary), read once.
_JOBS = {}


def load_job(job_file):
    """The plan and the config of a job file, with the vocabulary in a local file."""
    if job_file not in _JOBS:
        with files.open_read(job_file) as f:
            content = pickle.loads(f.read())
        plan, vocab = content["plan"], content["vocab"]
        vocab_file = os.path.join(
            tempfile.gettempdir(), f"bert_tf_vocab-{hashlib.sha256(vocab).hexdigest()[:16]}.txt"
        )
        if not os.path.exists(vocab_file):
            with io_utils.atomic_path(vocab_file) as tmp, open(tmp, "wb") as f:
                f.write(vocab)
        _JOBS[job_file] = plan, dataclasses.replace(content["config"], vocab_file=vocab_file)
    return _JOBS[job_file]


class _PlanDoFn(beam.DoFn):
    """A DoFn that reads the job file once per instance (its setup), keeps a unit's files on this
    machine's disk when the work directory is remote, and calls `after_step` (see run_units) once
    a step's files are written."""

    def __init__(self, job_file, after_step=None):
        self.job_file = job_file
        self.after_step = after_step
        self.plan = self.config = None
        self.remote = False

    def setup(self):
        self.plan, self.config = load_job(self.job_file)
        self.remote = files.is_remote(self.plan.work_dir)
        if self.remote:
            os.makedirs(local_work_dir(self.plan), exist_ok=True)

    def local_unit(self, unit):
        """`unit` with its files on this machine's disk (itself, for a local work directory)."""
        if not self.remote:
            return unit
        path = os.path.join(local_work_dir(self.plan), os.path.basename(unit.output_path))
        return dataclasses.replace(unit, output_path=path)

    def step_done(self, phase, key):
        """Calls `after_step` (see run_units), if any."""
        if self.after_step is not None:
            self.after_step(phase, key)


class TokenizeUnit(_PlanDoFn):
    """Phase 1 of a unit: its token files and their manifest; emits (unit index, stats)."""

    def __init__(self, job_file, after_step=None):
        super().__init__(job_file, after_step)
        self.text_bytes = Metrics.counter(METRICS_NAMESPACE, "text_bytes")

    def process(self, index):
        unit = self.plan.units[index]
        local = self.local_unit(unit)
        stats = worker.tokenize_unit(self.config, local)
        if self.remote:
            for source, target in zip(
                tokenized_corpus.unit_files(local.tokens_prefix),
                tokenized_corpus.unit_files(unit.tokens_prefix),
            ):
                files.upload(source, target)
        planning.record_tokens(self.plan, unit, stats)
        self.text_bytes.inc(stats.get("text_bytes", 0))
        self.step_done("tokenize", index)
        yield index, stats


class BuildUnit(_PlanDoFn):
    """Phase 2 of a unit: its part file and manifest; emits (output index, (unit index, stats))."""

    def __init__(self, job_file, after_step=None):
        super().__init__(job_file, after_step)
        self.corpus = self.output_of_unit = None

    def setup(self):
        super().setup()
        self.output_of_unit = planning.output_of_unit(self.plan)

    def process(self, index, token_stats):
        unit = self.plan.units[index]
        local = self.local_unit(unit)
        stats = worker.build_part(self.config, local, self._corpus(token_stats))
        if self.remote:
            files.upload(local.output_path, unit.output_path)
            os.remove(local.output_path)
        unit_stats = planning.record_part(self.plan, unit, token_stats[index], stats)
        self.step_done("build", index)
        yield self.output_of_unit[index], (index, unit_stats)

    def _corpus(self, token_stats):
        """Every unit's token files as one FileCorpus (copied to this machine first when remote)."""
        if self.corpus is None:
            units = []
            for unit in self.plan.units:
                prefix = self.local_unit(unit).tokens_prefix
                if self.remote:
                    sources = tokenized_corpus.unit_files(unit.tokens_prefix)
                    for source, target in zip(sources, tokenized_corpus.unit_files(prefix)):
                        if not os.path.exists(target):  # this machine tokenized it, or has it
                            files.download(source, target)
                units.append((prefix, token_stats[unit.index]["originals"]))
            self.corpus = tokenized_corpus.FileCorpus(units)
        return self.corpus

    def teardown(self):
        if self.corpus is not None:
            self.corpus.close()


class AssembleOutput(_PlanDoFn):
    """An output file from its parts, in unit order; emits (output index, stats)."""

    def process(self, element):
        k, parts = element
        unit_stats = dict(parts)
        missing = set(self.plan.units_of_output[k]) - set(unit_stats)
        if missing:
            raise RuntimeError(f"output {k}: no part for units {sorted(missing)}")
        manifest = planning.read_json(planning.output_manifest_path(self.plan, k))
        if planning.completed(manifest, self.plan, self.plan.outputs[k]):
            stats = manifest["stats"]  # a retry of a bundle that had written this output
        else:
            stats = planning.assemble_output(self.plan, k, unit_stats)
        self.step_done("assemble", k)
        yield k, dict(stats)
