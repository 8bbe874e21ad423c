"""CLI: convert Google's original or Hugging Face BERT weights into a bert_tf model directory, and a
model directory out to Hugging Face or keras-hub.

    python -m bert_tf.convert_checkpoint --format=google \
      --checkpoint=uncased_L-12_H-768_A-12/bert_model.ckpt --do_lower_case=true --output_dir=models/base
    python -m bert_tf.convert_checkpoint --format=huggingface --checkpoint=path/to/hf_dir \
      --output_dir=models/minilm

The pretraining heads the source has are kept, and only those: both from Google's bert_model.ckpt or a
Hugging Face BertForPreTraining, the MLM head from a BertForMaskedLM, none from a BertModel. The run
prints which; later, `bert_tf.model.model_dir.ModelDir(DIR).pretraining_heads()` says so from the directory.
A Hugging Face directory that --to=huggingface wrote for a fine-tuned model comes back as that model.

The other way, any model directory (pretrained or fine-tuned):

    python -m bert_tf.convert_checkpoint --to=huggingface --model_dir=models/mrpc --output_dir=hf/mrpc
    python -m bert_tf.convert_checkpoint --to=keras_hub --model_dir=models/sst2 --output_dir=presets/sst2
    python -m bert_tf.convert_checkpoint --to=onnx --model_dir=models/sst2 --output_dir=onnx/sst2

bert_tf.interop's hf_export, keras_hub_export and onnx_export say what each writes and what each refuses. Either
way the output directory appears only once complete, with bert_tf_output.json naming this job and
the files it wrote (an export's also holds the flags, which an imported model directory keeps in
convert_checkpoint.flags). It must be new or empty; --overwrite replaces one that holds this job's earlier
output and nothing else. A folder holding anything else is never replaced (a typo in --output_dir
must not cost its files): that is a usage error, exit 2. A gs:// --output_dir (importing only) is
written in place and must be new or empty.
"""

from bert_tf.runtime import job_process  # noqa: F401  (first: it sets the process up before TensorFlow loads)

# isort: split

import dataclasses

from absl import flags

from bert_tf.checkpoints import conversion
from bert_tf.interop import hf_export, keras_hub_export, onnx_export
from bert_tf.model.model_dir import ModelDir, describe_heads
from bert_tf.runtime import cli
from bert_tf.runtime.cli import arg
from bert_tf.runtime.io_utils import UsageError
from bert_tf.tasks import models

# --to's choices: bert_tf.interop's hf_export, keras_hub_export and onnx_export write them.
EXPORT_TARGETS = ("huggingface", "keras_hub", "onnx")
# The resolved flags, written into an imported model directory (reusable with --flagfile); an
# export keeps them in its bert_tf_output.json instead.
FLAGS_FILE = "convert_checkpoint.flags"
# The flags of each direction, refused in the other.
IMPORT_FLAGS = (
    "format",
    "checkpoint",
    "bert_config_file",
    "vocab_file",
    "do_lower_case",
    "google_gelu",
)
EXPORT_FLAGS = ("to", "model_dir", "allow_gelu_change")


@dataclasses.dataclass
class ConvertArgs:
    """A convert_checkpoint run: its fields are the CLI's flags."""

    format: str = arg(
        None,
        "The source format: 'google' for the original TF1 bert_model.ckpt, 'huggingface' for a "
        "directory with config.json and model.safetensors or pytorch_model.bin.",
        choices=conversion.FORMATS,
    )
    checkpoint: str = arg(
        None,
        "For google, the checkpoint prefix (e.g. .../bert_model.ckpt) or its directory; for "
        "huggingface, the directory holding config.json and the weights.",
    )
    bert_config_file: str = arg(
        None,
        "The config of the source model. Defaults to bert_config.json (google) or config.json "
        "(huggingface) beside the checkpoint.",
    )
    vocab_file: str = arg(
        None, "The WordPiece vocabulary. Defaults to vocab.txt beside the checkpoint."
    )
    do_lower_case: bool = arg(
        None,
        "Whether the model expects lower-cased input. Required unless the config (or Hugging "
        "Face tokenizer_config.json) records it; it is stored in the model directory. It must "
        "match the name of Google's released checkpoints (false for cased_L-12_H-768_A-12).",
    )
    google_gelu: str = arg(
        conversion.DEFAULT_GOOGLE_GELU,
        'With --format=google: the GELU a bert_config.json\'s "gelu" is read as. tanh is what '
        "Google's modeling.py computes today (since 2019-02), so the converted model gives the "
        "original code's numbers; erf is what it computed when its checkpoints were released "
        "(2018-10-31), and what Hugging Face reads them as. Recorded in bert_config.json.",
        choices=tuple(conversion.GOOGLE_GELU_FORMS),
    )
    output_dir: str = arg(
        None,
        "The model directory to write; with --to, the Hugging Face directory or keras-hub preset.",
    )
    to: str = arg(
        None,
        "Export instead of import: 'huggingface' writes --model_dir as a Hugging Face BERT "
        "directory (config.json, model.safetensors, tokenizer files), 'keras_hub' as a keras-hub "
        "preset (BertBackbone, BertTokenizer, BertTextClassifier for a classifier), 'onnx' as an "
        "ONNX model with ONNX Runtime's BERT fusions plus tokenizer.json.",
        choices=EXPORT_TARGETS,
    )
    model_dir: str = arg(None, "With --to: the model directory to export.")
    overwrite: bool = arg(
        False,
        "Replace a --output_dir that holds this job's earlier output (its bert_tf_output.json) and "
        "nothing else; a folder holding anything else is refused all the same.",
    )
    allow_gelu_change: bool = arg(
        False,
        "With --to=keras_hub: export a model trained with the GELU form keras-hub's BertBackbone "
        "does not apply (it applies the tanh approximation); the output difference measured is "
        "printed.",
    )


def run(args, flags_text=""):
    """Converts the checkpoint of a `ConvertArgs` into a model directory; bad inputs are UsageErrors.

    `flags_text` (the resolved flags) is written into it as convert_checkpoint.flags. A local
    --output_dir appears whole (io_utils.atomic_directory); a gs:// one is written in place.
    """
    path = conversion.convert_to_model_dir(
        args.format,
        args.checkpoint,
        args.output_dir,
        output_job=hf_export.OUTPUT_JOB,
        overwrite=args.overwrite,
        extra_files={FLAGS_FILE: flags_text} if flags_text else None,
        bert_config_file=args.bert_config_file,
        vocab_file=args.vocab_file,
        do_lower_case=args.do_lower_case,
        task_model=hf_export.task_model,
        google_gelu=args.google_gelu,
    )
    spec = models.read_task_spec(ModelDir(args.output_dir))
    if spec is not None:
        print(
            f"wrote model directory {args.output_dir} (checkpoint {path}): a fine-tuned {spec.kind}"
        )
        return path
    heads = ModelDir(args.output_dir).pretraining_heads(path)
    print(
        f"wrote model directory {args.output_dir} (checkpoint {path}): the encoder and "
        f"{describe_heads(heads)}"
    )
    return path


def run_export(args, flags_text=""):
    """Exports --model_dir (a `ConvertArgs` with `to`) to --output_dir; bad inputs are UsageErrors.

    `flags_text` (the resolved flags) goes into the output's bert_tf_output.json as "flags", so that
    a Hugging Face directory or keras-hub preset holds no other file of ours.
    """
    record = {"flags": flags_text} if flags_text else None
    if args.to == "huggingface":
        result = hf_export.export(
            args.model_dir, args.output_dir, overwrite=args.overwrite, record=record
        )
        print(
            f"wrote {result.architecture} to {result.output_dir} ({result.num_weights} weights): "
            f"{result.description}"
        )
        return result
    if args.to == "onnx":
        result = onnx_export.export(
            args.model_dir, args.output_dir, overwrite=args.overwrite, record=record
        )
        print(
            f"wrote {result.output_dir}/{onnx_export.MODEL_FILE} ({result.description}; outputs "
            f"{', '.join(result.outputs)}): ONNX Runtime's outputs are within "
            f"{result.max_difference:.3g} of this model's"
        )
        return result
    result = keras_hub_export.export(
        args.model_dir,
        args.output_dir,
        overwrite=args.overwrite,
        allow_gelu_change=args.allow_gelu_change,
        record=record,
    )
    print(f"wrote keras-hub preset {result.output_dir}: loads as {', '.join(result.classes)}")
    if result.gelu_changed:
        print(
            "GELU form changed to keras-hub's: outputs differ from this model's by up to "
            f"{result.max_difference:.3g} (the largest |difference| of sequence_output, "
            "pooled_output and any logits, on a few random inputs)"
        )
    else:
        print(f"keras-hub's outputs are within {result.max_difference:.3g} of this model's")
    if result.left_out:
        print(f"not in the preset: {result.left_out}")
    if result.note:
        print(f"note: {result.note}")
    return result


def _given(name):
    """Whether flag --name was given on the command line."""
    return flags.FLAGS[name].present


def main(argv):
    """Imports (--format) or, with --to, exports; the flags of one direction are refused in the other."""
    if len(argv) > 1:
        raise UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    exporting = _given("to")
    stray = [f"--{name}" for name in (IMPORT_FLAGS if exporting else EXPORT_FLAGS) if _given(name)]
    if stray:
        only = "only when importing (without --to)" if exporting else "only with --to (exporting)"
        raise UsageError(f"{', '.join(stray)}: {only}")
    args = cli.args_from_flags(ConvertArgs)
    required = ("model_dir", "output_dir") if exporting else ("format", "checkpoint", "output_dir")
    for name in required:
        if not getattr(args, name):
            raise UsageError(f"--{name} is required")
    if _given("google_gelu") and args.format != "google":
        raise UsageError("--google_gelu: only with --format=google")
    if args.allow_gelu_change and args.to != "keras_hub":
        raise UsageError("--allow_gelu_change: only with --to=keras_hub")
    (run_export if exporting else run)(args, flags.FLAGS.flags_into_string())


if __name__ == "__main__":
    cli.define_flags(ConvertArgs)
    cli.run(main)
