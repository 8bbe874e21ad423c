"""python -m bert_tf.experiments: the paper's studies as real jobs, their tables, charts and resuming."""

import dataclasses
import io
import json
import math
import os
import re
import subprocess
import sys
import time

import pytest
from helpers import CLI_ENV, ROOT, run_module_cli, write_tiny_model_dir, write_vocab
from PIL import Image

from bert_tf.experiments import plan, report, runner
from bert_tf.experiments.__main__ import ExperimentArgs, study_settings
from bert_tf.experiments.__main__ import run as run_study
from bert_tf.model.model_dir import ModelDir
from bert_tf.runtime.io_utils import UsageError
from bert_tf.tasks import demo_datasets


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


def child_pids(pid):
    """The processes whose parent is `pid` (Linux /proc)."""
    children = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # ended meanwhile
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            children.append(int(entry))
    return children


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


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


def test_the_nsp_study_fine_tunes_both_models_on_every_task_kind_with_three_seeds(tmp_path):
    args = ExperimentArgs(study="nsp", output_dir=str(tmp_path), scale="tiny")
    steps = plan.plan(args)
    pretraining = {s.row: s for s in steps if s.kind == "pretraining"}
    assert list(pretraining) == ["BERT (MLM + NSP)", "No NSP"]
    assert "--nsp=false" in pretraining["No NSP"].flags
    assert f"--input_file={tmp_path}/data/records_random_next_0/*.tfrecord" in (
        pretraining["No NSP"].flags
    )
    (demo,) = [s for s in steps if s.module == "demo_data"]
    tasks_dir = f"{tmp_path}/data/tasks"
    for flag in ("glue_dir", "pair_dir", "swag_dir", "conll_dir", "squad_dir"):
        assert any(f.startswith(f"--{flag}={tasks_dir}/") for f in demo.flags), flag
    assert f"--corpus_file={tmp_path}/data/corpus.txt" in demo.flags
    runs = [s for s in steps if s.kind == "finetuning"]
    # Classification, sentence pairs, multiple choice, tagging and spans, each by its own job.
    jobs = {s.task.name: s.module for s in runs}
    assert jobs == {
        "sst2": "run_classifier",
        "mrpc": "run_classifier",
        "swag": "run_multiple_choice",
        "conll": "run_ner",
        "squad": "run_squad",
    }
    assert len(runs) == 2 * 5 * 3 and {s.seed for s in runs} == {12345, 12346, 12347}
    squad = next(s for s in runs if s.task.name == "squad")
    assert f"--train_file={tasks_dir}/squad/train.json" in squad.flags
    assert f"--predict_file={tasks_dir}/squad/dev.json" in squad.flags
    assert "--max_seq_length=64" in squad.flags and "--doc_stride=32" in squad.flags
    assert not any(f.startswith("--data_dir") for f in squad.flags)
    # The official script's F1 is in percent; the table puts every task on one scale, 0 to 1.
    assert squad.task.score_key == "f1" and squad.task.score({"f1": 62.5}) == 0.625


def test_the_corpus_pair_and_span_tasks_train_with_the_real_jobs(corpus, tmp_path):
    from bert_tf import run_classifier, run_squad

    pair_dir = demo_datasets.write_demo_pair_dir(
        str(tmp_path / "pair"), corpus["corpus_file"], num_train=64, num_dev=32, num_test=8
    )
    squad_dir = demo_datasets.write_demo_squad_dir(
        str(tmp_path / "squad"), corpus["corpus_file"], num_train=32, num_dev=16
    )
    model_dir = write_tiny_model_dir(tmp_path / "model", corpus["vocab_file"])
    common = dict(init_checkpoint=model_dir, do_train=True, do_eval=True, max_seq_length=64)
    pair = run_classifier.run(
        run_classifier.ClassifierArgs(
            task_name="mrpc", data_dir=pair_dir, output_dir=str(tmp_path / "p"), **common
        )
    )
    assert pair.eval_results["eval_examples"] == 32
    labels = [line.split("\t")[0] for line in open(f"{pair_dir}/dev.tsv").read().split("\n")[1:-1]]
    assert labels.count("1") == labels.count("0") == 16  # balanced: guessing scores 0.5
    spans = run_squad.run(
        run_squad.SquadArgs(
            train_file=f"{squad_dir}/train.json",
            predict_file=f"{squad_dir}/dev.json",
            output_dir=str(tmp_path / "s"),
            max_query_length=21,
            doc_stride=32,
            **common,
        )
    )
    assert 0.0 <= spans.eval_results["f1"] <= 100.0 and spans.step > 0
    # Every answer is its word, where the question blanks it out of its sentence.
    for paragraph in json.load(open(f"{squad_dir}/dev.json"))["data"][0]["paragraphs"]:
        (qa,) = paragraph["qas"]
        (answer,) = qa["answers"]
        start = answer["answer_start"]
        assert paragraph["context"][start : start + len(answer["text"])] == answer["text"]
        question, blank = qa["question"], rf"\b{demo_datasets.BLANK}\b"
        filled = [
            question[: m.start()] + answer["text"] + question[m.end() :]
            for m in re.finditer(blank, question)
        ]
        assert any(sentence in paragraph["context"] for sentence in filled), question


def test_the_masking_study_pretrains_one_model_per_masking_with_three_seeds_a_cell(tmp_path):
    args = ExperimentArgs(study="masking", output_dir=str(tmp_path), scale="tiny")
    steps = plan.plan(args)
    data = {s.name: s for s in steps if s.module == "create_pretraining_data"}
    pretraining = {s.row: s for s in steps if s.kind == "pretraining"}
    assert list(pretraining) == [m.row for m in plan.MASKINGS] and len(pretraining) == 8
    # Each row's records are masked as its row says; the first is the original's mix.
    for masking in plan.MASKINGS:
        records = data[f"records_{masking.name}"]
        assert set(masking.flags) <= set(records.flags)
        model = pretraining[masking.row]
        assert f"--input_file={tmp_path}/data/records_{masking.name}/*.tfrecord" in model.flags
    assert {"--masking=token", "--mask_token_prob=0", "--random_token_prob=1"} <= set(
        data["records_token_0_0_100"].flags
    )
    assert "--masking=span" in data["records_span_80_10_10"].flags
    # Every cell (sst2, conll, conll feature-based) runs 3 seeds; the tiny model's 2 layers are
    # too few for the paper's concatenated last four, so its frozen layers are mixed.
    runs = [s for s in steps if s.kind == "finetuning" and s.row == plan.MASKINGS[6].row]
    assert [s.name for s in runs] == [
        f"whole_word_80_10_10_{cell}_s{seed}"
        for cell in ("sst2", "conll", "features_conll")
        for seed in (12345, 12346, 12347)
    ]
    assert [f for s in runs for f in s.flags if f.startswith("--seed=")] == [
        f"--seed={seed}" for _ in range(3) for seed in (12345, 12346, 12347)
    ]
    assert all("--features=sum_all" in s.flags for s in runs if "features" in s.name)
    assert len({s.column for s in runs}) == 3
    # --finetune_seeds=1: one run a cell, named as the other studies' are.
    single = plan.plan(dataclasses.replace(args, finetune_seeds=1))
    assert "token_80_10_10_sst2" in {s.name for s in single}


def test_the_steps_study_fine_tunes_five_checkpoints_of_a_masked_and_a_left_to_right_run(
    tmp_path,
):
    args = ExperimentArgs(study="steps", output_dir=str(tmp_path), pretraining_steps=1000)
    steps = plan.plan(args)
    pretraining = {s.row: s for s in steps if s.kind == "pretraining"}
    assert list(pretraining) == ["Masked LM", "Left-to-right"]
    for row, step in pretraining.items():
        # Both without NSP on the same contiguous text: the objective alone differs.
        assert "--nsp=false" in step.flags
        assert f"--input_file={tmp_path}/data/records_random_next_0/*.tfrecord" in step.flags
        # One value a flag: the row's checkpoints replace the recipe's.
        names = [f.split("=")[0] for f in step.flags]
        assert len(names) == len(set(names))
        assert {"--save_checkpoints_steps=200", "--keep_checkpoint_max=6"} <= set(step.flags)
        assert "--steps_per_loop=50" in step.flags and "--num_train_steps=1000" in step.flags
    assert "--objective=ltr" in pretraining["Left-to-right"].flags
    runs = [s for s in steps if s.kind == "finetuning"]
    assert len(runs) == 2 * 5 * 3  # two runs, five checkpoints, three seeds
    inits = sorted({f for s in runs for f in s.flags if f.startswith("--init_checkpoint=")})
    assert inits == sorted(
        f"--init_checkpoint={tmp_path}/models/{model}/ckpt-{step}"
        for model in ("mlm", "ltr")
        for step in (200, 400, 600, 800, 1000)
    )
    # By default the corpus's own sentence pairs, which the demo_data step writes.
    (demo,) = [s for s in steps if s.module == "demo_data"]
    assert f"--pair_dir={tmp_path}/data/tasks/pair" in demo.flags
    header, rows = report.study_table("steps", steps)
    assert header == [
        "Pretraining steps",
        "Masked LM: mrpc (accuracy)",
        "Left-to-right: mrpc (accuracy)",
    ]
    assert [r[0] for r in rows] == [200, 400, 600, 800, 1000]
    # The chart: score against steps, a line a model.
    for step in runs[:3]:
        os.makedirs(os.path.dirname(step.done_file))
        with open(step.done_file, "w") as f:
            f.write(f"eval_accuracy = {0.6 + (step.seed - 12345) / 100}\n")
    header, rows = report.study_table("steps", steps)
    assert str(rows[0][1]) == "0.610 ± 0.010 (3)"
    chart = str(tmp_path / "steps.png")
    report.line_chart(chart, report.TITLES["steps"], header, rows)
    assert png_size(chart)[0] > 300


def test_the_layers_study_probes_the_embeddings_and_every_layer_of_the_model(tmp_path):
    vocab = write_vocab(tmp_path / "vocab.txt", ["the cat sat"])
    model_dir = write_tiny_model_dir(tmp_path / "bert", vocab)
    os.makedirs(tmp_path / "conll")
    os.makedirs(tmp_path / "mrpc")
    args = ExperimentArgs(
        study="layers",
        output_dir=str(tmp_path / "study"),
        init_checkpoint=model_dir,
        tasks=[f"conll:{tmp_path / 'conll'}", f"mrpc:{tmp_path / 'mrpc'}"],
    )
    steps = plan.plan(args)
    assert {s.kind for s in steps} == {"finetuning"}  # the model given: nothing to pretrain
    layers = ModelDir(model_dir).load_config().num_hidden_layers
    want = ["embeddings", *(f"layer_{k}" for k in range(1, layers + 1))]
    for task, job in (("conll", "run_ner"), ("mrpc", "run_classifier")):
        runs = [s for s in steps if s.task.name == task]
        assert {s.module for s in runs} == {job}
        features = [f for s in runs for f in s.flags if f.startswith("--features=")]
        assert features == [f"--features={f}" for f in want for _ in range(3)]  # 3 seeds each
    assert all(f"--init_checkpoint={model_dir}" in s.flags for s in steps)
    # The small scales keep the recipe their figures were measured with; base takes the jobs'.
    pinned = {"--lr_decay_power=1", "--head_dropout=0.1"}
    assert all(pinned <= set(s.flags) for s in steps)
    base = plan.plan(dataclasses.replace(args, scale="base"))
    assert not any(pinned & set(s.flags) for s in base)
    header, rows = report.study_table("layers", steps)
    assert header == [
        "Layer (0: embeddings)",
        "conll frozen-feature probe (f1)",
        "mrpc frozen-feature probe (accuracy)",
    ]
    assert [r[0] for r in rows] == list(range(layers + 1))
    with pytest.raises(UsageError, match="--study=layers needs a conll:DIR entry"):
        plan.plan(dataclasses.replace(args, tasks=[f"mrpc:{tmp_path / 'mrpc'}"]))


def test_a_cell_of_several_seeds_shows_mean_std_and_count_and_charts_error_bars(tmp_path):
    args = ExperimentArgs(study="masking", output_dir=str(tmp_path), scale="tiny")
    steps = plan.plan(args)
    first = plan.MASKINGS[0]
    scores = {12345: 0.70, 12346: 0.80, 12347: 0.90}
    for step in steps:
        if step.name.startswith(f"{first.name}_sst2_s"):
            os.makedirs(os.path.dirname(step.done_file))
            with open(step.done_file, "w") as f:
                f.write(f"eval_accuracy = {scores[step.seed]}\n")
    header, rows = report.study_table("masking", steps)
    assert header[:4] == ["Masked", "MASK", "SAME", "RND"]
    row = rows[0]
    assert row[:4] == ["WordPieces", "80%", "10%", "10%"]
    assert [r[0] for r in rows[-2:]] == ["Whole words", "Spans of words"]
    sst2 = header.index("sst2 (accuracy)")
    assert str(row[sst2]) == "0.800 ± 0.100 (3)"
    assert row[sst2 + 1] is None  # conll: not run yet
    assert "| 0.800 ± 0.100 (3) |" in report.markdown_table(header, rows)
    # A score of 0 (an F1 at chance) is charted as a score, not left out as a dash is.
    assert report.is_scored(0.0) and not report.is_scored(None) and not report.is_scored("n/a")
    chart = str(tmp_path / "masking.png")
    report.bar_chart(chart, report.TITLES["masking"], header, rows, 4)
    assert png_size(chart)[0] > 300


@pytest.mark.parametrize(
    "values, message",
    [
        (dict(study="tasks", tasks=["sst2"]), "--tasks entry 'sst2': expected NAME:DIR"),
        (dict(study="tasks", tasks=["imdb:/tmp"]), "--tasks entry 'imdb:/tmp'"),
        (dict(study="sizes", model_sizes=["L2_H130_A4"]), "130 is not a multiple of 4"),
        (dict(study="sizes", model_sizes=["huge"]), "--model_sizes entry 'huge'"),
        (dict(study="sizes", model_sizes=["L2_H128_A0"]), "must each be at least 1"),
        (dict(study="sizes", model_sizes=["L0_H128_A2"]), "must each be at least 1"),
        (dict(study="tasks", init_checkpoint="/tmp"), "--init_checkpoint is for --study=features"),
        (dict(study="tasks", finetune_epochs=-1.0), "--finetune_epochs must not be negative"),
    ],
)
def test_bad_settings_are_usage_errors_naming_the_flag(tmp_path, values, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        ExperimentArgs(output_dir=str(tmp_path), **values).validate()


def test_a_second_runner_is_refused_while_the_first_or_a_job_it_started_lives(tmp_path):
    args = ExperimentArgs(study="tasks", output_dir=str(tmp_path / "study"))
    in_use = rf"in use by another bert_tf.experiments run \(pid {os.getpid()}\)"
    with runner.study_dir(args.output_dir, {}) as lock_fd:
        with pytest.raises(UsageError, match=in_use):
            run_study(args)
        job = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(120)"], pass_fds=[lock_fd]
        )
    try:
        # The runner is gone, its job is not: the directory is still the study's.
        with pytest.raises(UsageError, match=in_use):
            run_study(args)
    finally:
        job.kill()
        job.wait()
    with runner.study_dir(args.output_dir, {}):
        pass


@pytest.mark.parametrize("on_a_terminal", [True, False])
def test_the_running_jobs_step_and_eta_show_in_place_on_a_terminal_else_sparsely(
    tmp_path, on_a_terminal
):
    class Console(io.StringIO):
        def isatty(self):
            return on_a_terminal

    log_path = tmp_path / "job.log"
    log_path.write_text("")
    job = (
        "import time\n"
        "for i in (1, 2, 3):\n"
        "    print(f'step {i}/3  loss 1.0  ETA {3 - i}s', flush=True)\n"
        "    time.sleep(1.5)"
    )
    with open(log_path, "a") as log:
        process = subprocess.Popen([sys.executable, "-c", job], stdout=log)
        console, lines = Console(), []
        code = runner._wait_showing_progress(
            process, str(log_path), "[1/1] job", lines.append, console
        )
    assert code == 0
    if on_a_terminal:
        shown = [f"\r[1/1] job: step {i}/3, ETA {3 - i}s\x1b[K" for i in (1, 2, 3)]
        assert console.getvalue() == "".join(shown) + "\n" and lines == []
    else:  # the first progress line, then none for PROGRESS_INTERVAL_S
        assert console.getvalue() == "" and lines == ["[1/1] job: step 1/3, ETA 2s"]


def test_a_rerun_with_other_flags_is_refused_naming_them(tmp_path):
    output_dir = str(tmp_path / "study")
    first = dict(study="features", finetune_epochs=1.0, tasks=["conll:/data"])
    with runner.study_dir(output_dir, first):
        runner.record_settings(output_dir, first)
    with runner.study_dir(output_dir, first):  # the same flags: resumed
        pass
    changed = dict(first, finetune_epochs=3.0, study="tasks")
    message = "--finetune_epochs was 1.0, now 3.0; --study was 'features', now 'tasks'"
    with pytest.raises(UsageError, match=re.escape(message)):
        with runner.study_dir(output_dir, changed):
            pass


def test_a_resume_may_name_the_same_directory_and_files_another_way(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conll").mkdir()
    first = ExperimentArgs(
        study="features", output_dir="study", input_file="corpus.txt", tasks=["conll:conll"]
    )
    again = ExperimentArgs(
        study="features",
        output_dir=f"{tmp_path}/study/",
        input_file=str(tmp_path / "corpus.txt"),
        tasks=[f"conll:{tmp_path}/conll"],
    )
    assert study_settings(first) == study_settings(again)
    assert "output_dir" not in study_settings(first)


def test_a_usage_error_before_any_step_leaves_no_directory(tmp_path):
    # Found by the plan, once the directory is the study's: no conll task for a features study.
    args = ExperimentArgs(
        study="features",
        output_dir=str(tmp_path / "study"),
        init_checkpoint=str(tmp_path),
        tasks=[f"sst2:{tmp_path}"],
    )
    with pytest.raises(UsageError, match="needs a conll:DIR entry"):
        run_study(args, on_start=lambda: open(f"{args.output_dir}/experiments.flags", "w").close())
    assert not os.path.exists(args.output_dir)


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
    # Kill the runner alone once the first run has finished and the next job has started: the
    # job dies with it.
    first = os.path.join(output_dir, "runs", "finetuned_conll", "eval_results.txt")
    process = subprocess.Popen(
        command, cwd=ROOT, env=CLI_ENV, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    jobs = []
    while process.poll() is None and time.monotonic() < deadline:
        jobs = [pid for pid in child_pids(process.pid) if b"bert_tf.run_ner" in cmdline(pid)]
        if os.path.exists(first) and jobs:
            break
        time.sleep(0.5)
    assert os.path.exists(first) and jobs, "the first fine-tuning run did not finish"
    process.kill()
    process.wait()
    deadline = time.monotonic() + 60
    while any(os.path.exists(f"/proc/{pid}") for pid in jobs) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in jobs), "the job outlived its runner"
    assert not os.path.exists(os.path.join(output_dir, "RESULTS.md"))

    result = subprocess.run(command, cwd=ROOT, env=CLI_ENV, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[1/7] finetuned_conll: done already" in result.stdout
    # Off a terminal, each job's first progress line shows, and the running step names its log.
    assert re.search(r"\[2/7\] \w+: running \(its log: .*/logs/\w+\.log\)", result.stdout)
    assert re.search(r"\[2/7\] \w+: step \d+/\d+, ETA \S+", result.stdout), result.stdout
    flags_file = os.path.join(output_dir, "experiments.flags")
    flags_text, results_text = open(flags_file).read(), open(f"{output_dir}/RESULTS.md").read()
    refused = subprocess.run(
        [*command, "--finetune_epochs=3"], cwd=ROOT, env=CLI_ENV, capture_output=True, text=True
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "--finetune_epochs was 1.0, now 3.0" in refused.stderr.splitlines()[-1]
    assert open(flags_file).read() == flags_text
    assert open(f"{output_dir}/RESULTS.md").read() == results_text
    # The model is the one given, not one the scale's recipe pretrained.
    assert f"the model studied is --init_checkpoint ({model_dir}), not pretrained" in results_text
    assert "models pretrained for" not in results_text
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
