"""Bad configs are usage errors (exit 2, one line naming the file or field), never tracebacks (issue 34, item 8)."""

import json
import os
import shutil

from helpers import run_module_cli


def copy_model_dir(demo, tmp_path):
    """A copy of the demo's tiny model directory, to break."""
    model_dir = str(tmp_path / "model")
    shutil.copytree(demo["model_dir"], model_dir)
    return model_dir


def test_a_duplicated_vocab_line_makes_export_exit_2_naming_file_and_line(demo, tmp_path):
    model_dir = copy_model_dir(demo, tmp_path)
    vocab_file = os.path.join(model_dir, "vocab.txt")
    with open(vocab_file, encoding="utf-8") as f:
        tokens = f.read().split("\n")
    tokens[-2] = tokens[-3]  # the last token replaced by a copy of the one before: same size
    with open(vocab_file, "w", encoding="utf-8") as f:
        f.write("\n".join(tokens))
    process = run_module_cli(
        "bert_tf.export", f"--model_dir={model_dir}", f"--export_dir={tmp_path / 'export'}"
    )
    assert process.returncode == 2, process.stderr[-3000:]
    assert f"{vocab_file}:{len(tokens) - 1}: duplicate token" in process.stderr
    assert "Traceback" not in process.stderr
    assert not os.path.exists(tmp_path / "export") or not os.listdir(tmp_path / "export")


def break_heads(model_dir):
    """Sets num_attention_heads to 3 in MODEL_DIR's bert_config.json (hidden_size 32 is no multiple)."""
    path = os.path.join(model_dir, "bert_config.json")
    with open(path) as f:
        values = json.load(f)
    values["num_attention_heads"] = 3
    with open(path, "w") as f:
        json.dump(values, f)


def test_hidden_size_not_divisible_by_heads_is_a_usage_error_in_export(demo, tmp_path):
    model_dir = copy_model_dir(demo, tmp_path)
    break_heads(model_dir)
    process = run_module_cli(
        "bert_tf.export", f"--model_dir={model_dir}", f"--export_dir={tmp_path / 'export'}"
    )
    assert process.returncode == 2, process.stderr[-3000:]
    assert "num_attention_heads" in process.stderr and "Traceback" not in process.stderr


def test_hidden_size_not_divisible_by_heads_is_a_usage_error_in_run_classifier(demo, tmp_path):
    model_dir = copy_model_dir(demo, tmp_path)
    break_heads(model_dir)
    output_dir = tmp_path / "out"
    process = run_module_cli(
        "bert_tf.run_classifier",
        "--task_name=sst2",
        f"--data_dir={demo['glue_dir']}",
        f"--init_checkpoint={model_dir}",
        f"--output_dir={output_dir}",
        "--do_train",
        "--max_seq_length=24",
    )
    assert process.returncode == 2, process.stderr[-3000:]
    assert "num_attention_heads" in process.stderr and "Traceback" not in process.stderr
    assert not output_dir.exists()  # no run_classifier.flags left behind
