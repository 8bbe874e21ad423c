"""A Google or Hugging Face BERT checkpoint converted into a model directory (convert_checkpoint's work).

`convert` writes the model directory's files; `convert_to_model_dir` is the whole job: the casing
checked against an original checkpoint's name, and a directory that appears only once complete.
"""

import os

import numpy as np
import tensorflow as tf
from absl import logging

from bert_tf.checkpoints.google_checkpoint import (
    read_google_checkpoint_shapes,
    resolve_google_checkpoint,
)
from bert_tf.checkpoints.huggingface import huggingface_config, read_huggingface_weights
from bert_tf.checkpoints.name_map import assign_original_weights, heads_in
from bert_tf.model import modeling
from bert_tf.model.model_dir import ModelDir, describe_heads
from bert_tf.runtime import io_utils
from bert_tf.runtime.io_utils import UsageError
from bert_tf.tokenization import python_tokenizer

# Hugging Face's BertForMaskedLM (and a BertModel built with add_pooling_layer=False) has no pooler.
_POOLER_NAMES = ("bert/pooler/dense/kernel", "bert/pooler/dense/bias")


def _fresh_pooler(config, source):
    """The pooler a checkpoint without one gets: the original's initialization (truncated normal
    kernel with stddev initializer_range, zero bias), seeded, so a conversion is reproducible."""
    logging.warning(
        "%s has no pooler (bert.pooler.dense): pooled_output comes from a freshly initialized "
        "pooler, as in Hugging Face's models built from such a checkpoint; fine-tune before using it",
        source,
    )
    h = config.hidden_size
    kernel = tf.random.stateless_truncated_normal(
        [h, h], seed=[0, 0], stddev=config.initializer_range
    )
    return {_POOLER_NAMES[0]: kernel.numpy(), _POOLER_NAMES[1]: np.zeros([h], np.float32)}


FORMATS = ("google", "huggingface")
# What a Google bert_config.json's "gelu" is read as: the tanh form Google's modeling.py computes
# today (since 2019-02, commit bee6030), or the erf form it computed when the checkpoints were
# released (2018-10-31), which Hugging Face reads. The default keeps the original code's numbers.
GOOGLE_GELU_FORMS = {"tanh": "gelu", "erf": "gelu_exact"}
DEFAULT_GOOGLE_GELU = "tanh"


def _lower_case_setting(values):
    """do_lower_case from a config dict (bert_config.json, tokenizer_config.json), or None if unset."""
    value = values.get("do_lower_case")
    return value if isinstance(value, bool) else None


def convert(
    format,
    checkpoint,
    output_dir,
    bert_config_file=None,
    vocab_file=None,
    do_lower_case=None,
    task_model=None,
    google_gelu=DEFAULT_GOOGLE_GELU,
):
    """Converts a Google or Hugging Face BERT checkpoint into a model directory; returns its ckpt path.

    Defaults: bert_config.json / config.json and vocab.txt beside the checkpoint. do_lower_case
    comes from the argument, else the config (or HF tokenizer_config.json); it is never guessed.
    The pretraining heads the checkpoint has (heads_in) are kept, and only those: the directory's
    `ModelDir.pretraining_heads()` says which. A Hugging Face checkpoint without a pooler (a
    BertForMaskedLM) gets a freshly initialized one, with a warning.

    `task_model(hf_config, config, source)`, for a Hugging Face source, returns (TaskSpec, task
    model, encoder) when config.json describes a fine-tuned model it can rebuild (bert_tf.interop.hf_export
    passes one that knows its own exports), else None; the directory then holds that task model and
    its task.json, and the head's weights are mapped like the rest.

    `google_gelu` (a GOOGLE_GELU_FORMS key) is the form a Google config's "gelu" becomes.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; expected one of {', '.join(FORMATS)}")
    if format == "google":
        prefix = resolve_google_checkpoint(checkpoint)
        source_dir = os.path.dirname(prefix)
        bert_config_file = bert_config_file or os.path.join(source_dir, "bert_config.json")
        values = modeling.read_json_object(bert_config_file)
        if do_lower_case is None:
            do_lower_case = _lower_case_setting(values)
        if do_lower_case is None:
            raise ValueError(
                f"{bert_config_file} has no do_lower_case: pass --do_lower_case=true|false "
                "(uncased models lower-case, cased and most multilingual ones do not)"
            )
        if google_gelu not in GOOGLE_GELU_FORMS:
            raise ValueError(
                f"google_gelu must be one of {', '.join(GOOGLE_GELU_FORMS)}, got {google_gelu!r}"
            )
        if values.get("hidden_act") == "gelu":
            values = dict(values, hidden_act=GOOGLE_GELU_FORMS[google_gelu])
        config = modeling.BertConfig.from_dict(
            dict(values, do_lower_case=do_lower_case), source=bert_config_file
        )
        shapes, read = read_google_checkpoint_shapes(prefix)
        source = prefix
    else:
        source_dir = checkpoint
        bert_config_file = bert_config_file or os.path.join(source_dir, "config.json")
        hf_config = modeling.read_json_object(bert_config_file)
        tokenizer_config = os.path.join(source_dir, "tokenizer_config.json")
        # The casing the files say: tokenizer_config.json's (what the tokenizer applies), else
        # config.json's. A --do_lower_case that contradicts it would read text the model never saw.
        said, said_by = _lower_case_setting(hf_config), bert_config_file
        if tf.io.gfile.exists(tokenizer_config):
            in_tokenizer = _lower_case_setting(modeling.read_json_object(tokenizer_config))
            if in_tokenizer is not None:
                said, said_by = in_tokenizer, tokenizer_config
        if do_lower_case is not None and said is not None and bool(do_lower_case) != said:
            raise ValueError(
                f"--do_lower_case={str(bool(do_lower_case)).lower()} contradicts {said_by} "
                f"(do_lower_case={str(said).lower()}); leave the flag out, casing travels with the model"
            )
        if do_lower_case is None:
            do_lower_case = said
        if do_lower_case is None:
            raise ValueError(
                f"neither {bert_config_file} nor tokenizer_config.json sets do_lower_case: "
                "pass --do_lower_case=true|false"
            )
        config = huggingface_config(hf_config, do_lower_case, source=bert_config_file)
        weights, source = read_huggingface_weights(checkpoint)
        if not any(name in weights for name in _POOLER_NAMES):
            weights.update(_fresh_pooler(config, source))
        shapes = {name: array.shape for name, array in weights.items()}
        read = weights.__getitem__
    vocab_file = vocab_file or os.path.join(source_dir, "vocab.txt")
    if not tf.io.gfile.exists(vocab_file):
        raise FileNotFoundError(f"vocab file {vocab_file} does not exist (pass --vocab_file)")

    task = None
    if format == "huggingface" and task_model is not None:
        task = task_model(hf_config, config, bert_config_file)
    if task is not None:
        spec, model, encoder = task
        assign_original_weights(
            source, shapes, read, model, config.num_hidden_layers, (), task_kind=spec.kind
        )
        path = ModelDir(output_dir).write(config, vocab_file, encoder, spec=spec, model=model)
        logging.info("wrote %s: a fine-tuned %s model", path, spec.kind)
        return path

    heads = heads_in(shapes)
    if heads:
        model, encoder = modeling.build_pretraining_model(config)
    else:
        encoder = modeling.build_encoder(config)
        model = None
    assign_original_weights(source, shapes, read, model or encoder, config.num_hidden_layers, heads)
    path = ModelDir(output_dir).write(
        config, vocab_file, encoder, pretraining_model=model, heads=heads
    )
    logging.info("wrote %s: the encoder and %s", path, describe_heads(heads))
    return path


def convert_to_model_dir(
    format,
    checkpoint,
    output_dir,
    output_job,
    bert_config_file=None,
    vocab_file=None,
    do_lower_case=None,
    task_model=None,
    overwrite=False,
    extra_files=None,
    google_gelu=DEFAULT_GOOGLE_GELU,
):
    """`convert` (which says what the middle arguments are) into `output_dir`, whole; returns the
    checkpoint path. Bad inputs are UsageErrors.

    A local `output_dir` appears only once complete (io_utils.atomic_directory, marked as
    `output_job`'s: with `overwrite`, one holding that job's earlier output alone is replaced); a
    gs:// one is written in place and must be new or empty. `extra_files` ({name: text}, such as
    the job's flags) are written beside. An original checkpoint's name must not contradict a
    given `do_lower_case`.
    """
    if format == "google" and do_lower_case is not None:
        try:
            prefix = resolve_google_checkpoint(checkpoint)
        except FileNotFoundError:
            prefix = None  # convert() names what is missing
        if prefix:
            python_tokenizer.validate_case_matches_checkpoint(
                do_lower_case, prefix, flag="--checkpoint"
            )
    extra_files = extra_files or {}

    def convert_into(directory):
        try:
            path = convert(
                format,
                checkpoint,
                directory,
                bert_config_file=bert_config_file,
                vocab_file=vocab_file,
                do_lower_case=do_lower_case,
                task_model=task_model,
                google_gelu=google_gelu,
            )
        except (FileNotFoundError, ValueError) as e:
            raise UsageError(str(e)) from e
        for name, text in extra_files.items():
            io_utils.atomic_write_text(os.path.join(directory, name), text)
        return path

    if io_utils.is_remote(output_dir):
        return _convert_in_place(convert_into, output_dir, overwrite, extra_files)
    with io_utils.atomic_directory(output_dir, output_job, overwrite=overwrite) as tmp:
        path = convert_into(tmp)
    return os.path.join(output_dir, os.path.basename(path))


def _convert_in_place(convert_into, output_dir, overwrite, extra_files):
    """`convert_into(output_dir)` for a remote directory, which cannot be renamed into place: it
    must be new or empty, and is removed again when the conversion is refused before writing
    anything but `extra_files`."""
    if overwrite:
        raise UsageError(f"--overwrite: only for a local --output_dir, not {output_dir}")
    created = not tf.io.gfile.exists(output_dir)
    if not created and tf.io.gfile.listdir(output_dir):
        raise UsageError(f"{output_dir} is not empty: a gs:// --output_dir must be new or empty")
    tf.io.gfile.makedirs(output_dir)
    try:
        return convert_into(output_dir)
    except UsageError:
        if created and set(tf.io.gfile.listdir(output_dir)) <= set(extra_files):
            tf.io.gfile.rmtree(output_dir)
        raise
