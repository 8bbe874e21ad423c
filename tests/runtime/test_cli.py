"""The CLI contract: flags made from a job's arguments dataclass, and the same exits for every job."""

import dataclasses

import pytest
from absl import flags
from helpers import run_module_cli

from bert_tf import (
    build_vocab,
    convert_checkpoint,
    corpus,
    export,
    extract_features,
    run_classifier,
    run_multiple_choice,
    run_ner,
    run_squad,
)
from bert_tf.pretraining import job as pretraining_job
from bert_tf.pretraining_data import job
from bert_tf.runtime import cli, io_utils
from bert_tf.serving import server_flags
from bert_tf.tokenization import __main__ as tokenization_cli

JOB_ARGS = [
    run_classifier.ClassifierArgs,
    run_squad.SquadArgs,
    run_ner.NerArgs,
    run_multiple_choice.MultipleChoiceArgs,
    pretraining_job.PretrainingArgs,
    extract_features.ExtractArgs,
    job.PretrainingDataArgs,
    build_vocab.BuildVocabArgs,
    convert_checkpoint.ConvertArgs,
    corpus.CorpusArgs,
    tokenization_cli.CompareArgs,
    export.ExportArgs,
    server_flags.ServeArgs,
]


@dataclasses.dataclass
class ToyArgs:
    name: str = cli.arg("x", "A name.")
    count: int = cli.arg(3, "A count.")
    rate: float = cli.arg(0.5, "A rate.")
    on: bool = cli.arg(None, "A switch (None: decided later).")
    mode: str = cli.arg("a", "A mode.", choices=("a", "b"))
    names: list = cli.arg(help="Names.", default_factory=lambda: ["p", "q"])
    internal: int = 7  # not a flag


def test_fields_become_typed_flags_and_flags_become_args():
    flag_values = flags.FlagValues()
    cli.define_flags(ToyArgs, flag_values=flag_values, count=4)
    assert {name for name in flag_values} == {"name", "count", "rate", "on", "mode", "names"}
    assert flag_values["count"].default == 4 and flag_values["name"].help == "A name."
    assert flag_values["names"].default == ["p", "q"]
    flag_values(["prog", "--name=y", "--count=5", "--rate=0.25", "--on", "--mode=b", "--names=a,b"])
    assert cli.args_from_flags(ToyArgs, flag_values) == ToyArgs("y", 5, 0.25, True, "b", ["a", "b"])
    with pytest.raises(flags.IllegalFlagValueError):
        flag_values(["prog", "--mode=c"])


@pytest.mark.parametrize("args_class", JOB_ARGS, ids=lambda c: c.__name__)
def test_every_job_field_is_a_flag_with_help_and_the_dataclass_default(args_class):
    flag_values = flags.FlagValues()
    cli.define_flags(args_class, flag_values=flag_values)
    defaults = args_class()
    for field in dataclasses.fields(args_class):
        assert field.name in flag_values, (
            field.name
        )  # every argument can be given on the command line
        assert flag_values[field.name].help, field.name
        assert flag_values[field.name].default == getattr(defaults, field.name), field.name


def test_job_main_refuses_stray_arguments_and_returns_nothing():
    flag_values = (
        flags.FlagValues()
    )  # not the process's FLAGS: parsing those sets absl's logging level
    cli.define_flags(ToyArgs, flag_values=flag_values)
    flag_values(["prog"])
    ran = []
    main = cli.job_main(
        ToyArgs,
        lambda args: ran.append(args) or "a result",
        "toy",
        required=("name",),
        flag_values=flag_values,
    )
    with pytest.raises(io_utils.UsageError, match="unexpected arguments: extra"):
        main(["prog", "extra"])
    assert main(["prog"]) is None and ran == [ToyArgs()]  # absl would print a result and exit 1


def test_a_failed_run_exits_1_and_a_usage_error_2_in_every_job():
    # run_pretraining's --help lists its flags (they belong to the job's module), and a missing
    # required flag is a usage error with one line.
    helped = run_module_cli("bert_tf.run_pretraining", "--help")
    assert "--max_loss_ratio" in helped.stdout and "--input_file" in helped.stdout
    missing = run_module_cli("bert_tf.run_pretraining", "--output_dir=/tmp/unused_cli_test")
    assert missing.returncode == 2 and "error: --input_file is required" in missing.stderr
    assert "Traceback" not in missing.stderr


@pytest.mark.parametrize(
    "module,flag",
    [
        ("bert_tf.build_vocab", "--input_file"),
        ("bert_tf.convert_checkpoint", "--format"),
        ("bert_tf.corpus", "--output_file"),
        ("bert_tf.tokenization", "--vocab_file"),
    ],
)
def test_a_missing_required_flag_exits_2_naming_it(module, flag):
    missing = run_module_cli(module)
    assert missing.returncode == 2 and f"error: {flag} is required" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_tokenization_cli_prints_both_tokenizers_side_by_side(real_vocab, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("\nHello, World!\nunaffable tokens\nnot read\n")
    result = run_module_cli(
        "bert_tf.tokenization",
        f"--vocab_file={real_vocab}",
        f"--input_file={text}",
        "--num_lines=2",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("GraphTokenizer agrees with FullTokenizer: yes") == 2
    assert "tokens: hello , world !" in result.stdout and "not read" not in result.stdout
