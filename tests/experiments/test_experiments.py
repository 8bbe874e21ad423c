"""python -m bert_tf.experiments: the paper's studies as real jobs, their tables, charts and resuming."""

import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from helpers import CLI_ENV, ROOT, run_module_cli, write_tiny_model_dir, write_vocab
from PIL import Image

from bert_tf.experiments import plan, report
from bert_tf.experiments.__main__ import ExperimentArgs
from bert_tf.runtime.io_utils import UsageError
from bert_tf.tasks import demo_datasets

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, english_lines):
    """A small corpus of real English (documents of 8 sentences) and a vocab covering it."""
    root = tmp_path_factory.mktemp("experiments")
    corpus_file = str(root / "corpus.txt")
    lines = english_lines[:1200]
    with open(corpus_file, "w") as f:
        for start in range(0, len(lines), 8):
            f.write("\n".join(lines[start : start + 8]) + "\n\n")
    return {
        "root": root,
        "corpus_file": corpus_file,
        "vocab_file": write_vocab(str(root / "vocab.txt"), lines),
    }


def png_size(path):
    """The (width, height) of a real PNG file."""
    with Image.open(path) as image:
        assert image.format == "PNG"
        return image.size


def score_rows(results_file):
    """The rows of RESULTS.md's first table, as lists of cells (the header and rule left out)."""
    rows = []
    for line in open(results_file).read().split("\n\n")[1].splitlines()[2:]:
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_tasks_study_is_table_5s_rows_with_the_real_jobs_flags(tmp_path):
    args = ExperimentArgs(study="tasks", output_dir=str(tmp_path), scale="tiny")
    steps = plan.plan(args)
    pretraining = {s.row: s for s in steps if s.kind == "pretraining"}
    assert list(pretraining) == ["BERT (MLM + NSP)", "No NSP", "LTR & No NSP"]
    assert "--nsp=false" in pretraining["No NSP"].flags
    assert {"--nsp=false", "--objective=ltr"} <= set(pretraining["LTR & No NSP"].flags)
    assert not any(
        f.startswith(("--nsp", "--objective")) for f in pretraining["BERT (MLM + NSP)"].flags
    )
    # BERT reads the original's records (B a random sentence half the time); the rows without
    # NSP read contiguous text (--random_next_prob=0).
    data = {s.name: s for s in steps if s.module == "create_pretraining_data"}
    assert "--random_next_prob=0.5" in data["records"].flags
    assert "--random_next_prob=0" in data["records_random_next_0"].flags
    records = f"{tmp_path}/data/records"
    assert f"--input_file={records}/*.tfrecord" in pretraining["BERT (MLM + NSP)"].flags
    for row in ("No NSP", "LTR & No NSP"):
        assert f"--input_file={records}_random_next_0/*.tfrecord" in pretraining[row].flags
    bilstm = [s for s in steps if s.row == "+ BiLSTM"]
    # The BiLSTM row fine-tunes the left-to-right model, one run per task (the demo's two).
    assert [s.task.name for s in bilstm] == ["sst2", "swag"]
    for step in bilstm:
        assert f"--init_checkpoint={tmp_path}/models/ltr" in step.flags
        assert "--head=bilstm" in step.flags and "--lstm_units=128" in step.flags
        # A BiLSTM starts from nothing: its runs train for the scale's bilstm_epochs.
        assert "--num_train_epochs=15" in step.flags
    # Data first, then every pretraining, then the fine-tuning runs (each evaluated per epoch).
    kinds = [s.kind for s in steps]
    assert kinds == sorted(kinds, key=["data", "pretraining", "finetuning"].index)
    assert all("--eval_every_epoch" in s.flags for s in steps if s.kind == "finetuning")
    # At the tiny scale's learning rate (1e-3) the runs fine-tune with standard AdamW.
    assert all("--adam_bias_correction=true" in s.flags for s in steps if s.kind == "finetuning")


@pytest.mark.parametrize(
    "values, message",
    [
        (dict(study="tasks", tasks=["sst2"]), "--tasks entry 'sst2': expected NAME:DIR"),
        (dict(study="tasks", tasks=["imdb:/tmp"]), "--tasks entry 'imdb:/tmp'"),
        (dict(study="sizes", model_sizes=["L2_H130_A4"]), "130 is not a multiple of 4"),
        (dict(study="sizes", model_sizes=["huge"]), "--model_sizes entry 'huge'"),
        (dict(study="tasks", init_checkpoint="/tmp"), "--init_checkpoint is for --study=features"),
        (dict(study="tasks", finetune_epochs=-1.0), "--finetune_epochs must not be negative"),
    ],
)
def test_bad_settings_are_usage_errors_naming_the_flag(tmp_path, values, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        ExperimentArgs(output_dir=str(tmp_path), **values).validate()


def test_the_cli_exits_2_without_a_study(tmp_path):
    result = run_module_cli("bert_tf.experiments", f"--output_dir={tmp_path}")
    assert result.returncode == 2 and "--study is required" in result.stderr


@pytest.mark.slow
def test_the_sizes_study_pretrains_fine_tunes_and_reports_perplexity(corpus, demo, tmp_path):
    output_dir = str(tmp_path / "sizes")
    result = run_module_cli(
        "bert_tf.experiments",
        "--study=sizes",
        f"--output_dir={output_dir}",
        f"--input_file={corpus['corpus_file']}",
        f"--vocab_file={corpus['vocab_file']}",
        f"--tasks=sst2:{demo['glue_dir']}",
        "--model_sizes=L1_H32_A2",
        "--pretraining_steps=6",
        "--dupe_factor=1",
        "--max_eval_steps=2",
        "--finetune_epochs=2",
        "--finetune_seq_length=24",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # The custom size became a bert_config.json of that shape.
    config = report.plan.modeling.BertConfig.from_json_file(f"{output_dir}/configs/L1_H32_A2.json")
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (1, 32, 2)
    [row] = score_rows(f"{output_dir}/RESULTS.md")
    pretrained = report.read_key_values(f"{output_dir}/models/L1_H32_A2/eval_results.txt")
    finetuned = report.read_key_values(f"{output_dir}/runs/L1_H32_A2_sst2/eval_results.txt")
    assert row[:3] == ["1", "32", "2"]
    assert float(row[3]) == pytest.approx(math.exp(pretrained["masked_lm_loss"]), rel=1e-3)
    assert float(row[4]) == pytest.approx(finetuned["eval_accuracy"], abs=5e-4)
    # The learning curves: the pretraining loss by step, the dev accuracy after each of 2 epochs.
    key, points = report.lm_loss_curve(f"{output_dir}/models/L1_H32_A2")
    assert key == "masked_lm_loss" and [step for step, _ in points][-1] == 6
    _, curves = report.finetuning_results(plan.plan(ExperimentArgs(
        study="sizes", output_dir=output_dir, model_sizes=["L1_H32_A2"],
        tasks=[f"sst2:{demo['glue_dir']}"], input_file=corpus["corpus_file"],
        vocab_file=corpus["vocab_file"],
    )))  # fmt: skip
    assert [epoch for epoch, _ in curves["L1_H32_A2_sst2"][1]] == [1, 2]
    for name in (
        "sizes.png",
        "curves.png",
        "curves/pretrain_L1_H32_A2.png",
        "curves/L1_H32_A2_sst2.png",
    ):
        width, height = png_size(os.path.join(output_dir, name))
        assert width > 300 and height > 200


@pytest.mark.slow
def test_the_features_study_resumes_after_a_kill_and_fills_table_7(corpus, tmp_path):
    conll_dir = demo_datasets.write_demo_conll_dir(
        str(tmp_path / "conll"), corpus["corpus_file"], num_train=60, num_dev=30, num_test=0
    )
    model_dir = write_tiny_model_dir(tmp_path / "bert", corpus["vocab_file"])
    output_dir = str(tmp_path / "features")
    command = [
        sys.executable,
        "-m",
        "bert_tf.experiments",
        "--study=features",
        f"--output_dir={output_dir}",
        f"--init_checkpoint={model_dir}",
        f"--tasks=conll:{conll_dir}",
        "--finetune_epochs=1",
        "--bilstm_epochs=2",
        "--finetune_seq_length=32",
        "--lstm_units=8",
    ]
    # Kill the whole study (the runner and its job) once the first run has finished.
    first = os.path.join(output_dir, "runs", "finetuned_conll", "eval_results.txt")
    process = subprocess.Popen(
        command, cwd=ROOT, env=CLI_ENV, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not os.path.exists(first) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert os.path.exists(first), "the first fine-tuning run did not finish"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not os.path.exists(os.path.join(output_dir, "RESULTS.md"))

    result = subprocess.run(command, cwd=ROOT, env=CLI_ENV, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[1/7] finetuned_conll: done already" in result.stdout
    rows = score_rows(os.path.join(output_dir, "RESULTS.md"))
    assert [r[0] for r in rows] == [
        "Fine-tuning approach",
        "Feature-based approach (frozen encoder, two-layer BiLSTM on):",
        *(name for _, name in plan.FEATURE_CHOICES),
    ]
    # The tiny model has 2 layers: the choices of the last four are rows saying so, not runs.
    assert "[6/7] features_concat_last_four: skipped" in result.stdout
    for (choice, _), row in zip(plan.FEATURE_CHOICES, rows[2:]):
        run_dir = os.path.join(output_dir, "runs", f"features_{choice}")
        if choice in ("sum_last_four", "concat_last_four"):
            assert row[1] == "n/a: needs 4 layers, the model has 2"
            assert not os.path.exists(run_dir)
            continue
        assert float(row[1]) == pytest.approx(
            report.read_key_values(f"{run_dir}/eval_results.txt")["eval_f1"], abs=5e-4
        )
        assert f"--features={choice}" in open(f"{run_dir}/run_ner.flags").read()
    assert png_size(os.path.join(output_dir, "features.png"))[0] > 300
