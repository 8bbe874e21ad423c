"""What a job starts from: its config, its vocab and its initial weights.

Pretraining (bert_tf.pretraining.job), the fine-tuning CLIs and extract_features all call
`resolve` with their --init_checkpoint, --bert_config_file, --vocab_file and --do_lower_case, and
get a ModelSource; once the job has built its models, `ModelSource.load_weights` loads the weights
into them.
`resolve` hands each kind of source to its own resolver (`_from_model_dir`,
`_from_google_checkpoint`, `_from_flags` for random weights; a Hugging Face directory is refused
with the conversion command), then checks that the result fits (`_check_fits`).

--init_checkpoint is one of:
- nothing: the weights start random.
- a model directory (bert_tf.model.model_dir): its bert_config.json (a legacy "gelu" read as the erf form
  it was trained with), its vocab.txt, and, for a fine-tuned one, its task.json. --bert_config_file
  and --model_size are ignored, with a warning: casing and activation travel with the model. A
  --do_lower_case that contradicts its config is an error.
- one checkpoint of a model directory, MODEL_DIR/ckpt-N: the same, with that checkpoint's weights
  instead of the newest (a run's earlier steps, as the experiments' steps study fine-tunes them).
- an original Google checkpoint: a prefix (`.../bert_model.ckpt`) or the directory holding one.
  The config is --bert_config_file; Google's has no do_lower_case, so --do_lower_case gives it
  (default true), and it must not contradict the name of a Google release
  (python_tokenizer.validate_case_matches_checkpoint).
Hugging Face weights are converted into a model directory first (python -m bert_tf.convert_checkpoint
--format=huggingface); a Hugging Face directory given as --init_checkpoint is refused, saying so.

Without a model directory as --init_checkpoint the config is --bert_config_file, else --model_size
(pretraining), else that of the model directory --output_dir already holds (a rerun resuming it).
A --output_dir that holds a model must hold one with the same config.
"""

import dataclasses
import os
import re

import tensorflow as tf
from absl import logging

from bert_tf.checkpoints import google_checkpoint, name_map
from bert_tf.model import modeling
from bert_tf.model.model_dir import (
    ModelDir,
    checkpoint_root_children,
    describe_heads,
    is_object_checkpoint,
    model_pretraining_heads,
    pretraining_heads_to_restore,
)
from bert_tf.runtime import io_utils
from bert_tf.tasks import models
from bert_tf.tokenization import python_tokenizer, tokenizer_rules

HF_CONFIG_FILE = "config.json"  # what marks a Hugging Face model directory


def _load_vocab(vocab_file):
    """The vocab, with a missing, empty or malformed file as a usage error."""
    try:
        return tokenizer_rules.load_vocab(vocab_file)
    except tokenizer_rules.VocabError as e:
        raise io_utils.UsageError(f"--vocab_file: {e}") from e


def _check_casing(do_lower_case, config, source):
    """A --do_lower_case that contradicts a model directory's config is an error."""
    if do_lower_case is not None and bool(do_lower_case) != config.do_lower_case:
        raise io_utils.UsageError(
            f"--do_lower_case={do_lower_case} contradicts {source}'s bert_config.json "
            f"(do_lower_case={config.do_lower_case}); casing travels with the model, leave the flag out"
        )


@dataclasses.dataclass
class ModelSource:
    """What a job starts from: the config, the vocab, and where the initial weights come from."""

    config: modeling.BertConfig
    vocab_file: str
    init_checkpoint: str = (
        ""  # as given: "" (random weights), a model directory or an original checkpoint
    )
    init_prefix: str = ""  # the checkpoint the weights are read from
    init_is_model_dir: bool = False
    init_spec: object = None  # the tasks.models.TaskSpec of a fine-tuned init model directory

    def tokenizer(self):
        """A tokenizer with the model's vocab and casing: FullTokenizer's tokens, cached per word."""
        return python_tokenizer.CachedTokenizer(
            self.vocab_file, do_lower_case=self.config.do_lower_case
        )

    def load_weights(self, encoder, pretraining_model=None, task_model=None, spec=None):
        """Loads the initial weights into the models the job built; returns the names of what was loaded.

        The encoder always; `pretraining_model`'s MLM and NSP heads where the source has them (else
        they stay fresh, with a warning); `task_model`'s head where the init model directory was
        fine-tuned for the same head as `spec` (kind and labels). Nothing without --init_checkpoint.
        """
        if not self.init_checkpoint:
            return []
        if self.init_is_model_dir:
            return self._load_from_model_dir(encoder, pretraining_model, task_model, spec)
        return self._load_from_google_checkpoint(encoder, pretraining_model)

    def _load_from_model_dir(self, encoder, pretraining_model, task_model, spec):
        """Restores from the init model directory's checkpoint (see load_weights)."""
        init, prefix = self.init_checkpoint, self.init_prefix
        # From the object graph: a head variable may be keyed under optimizer/ in a training checkpoint.
        roots = checkpoint_root_children(prefix)
        objects = {"encoder": encoder}
        if pretraining_model is not None:
            # The heads the directory has (both, the MLM head only, or none); it warns about the others.
            heads_object, _ = pretraining_heads_to_restore(prefix, pretraining_model)
            if heads_object is not None:
                objects["pretraining_model"] = heads_object
        if task_model is not None and self.init_spec is not None:
            if not self.init_spec.same_head(spec):
                logging.warning(
                    "%s was fine-tuned for another head (%s); only its encoder is used",
                    init,
                    self.init_spec.kind,
                )
            elif "model" not in roots:
                logging.warning(
                    "%s has no task model in its checkpoint; only its encoder is used", init
                )
            else:
                objects["model"] = task_model
        try:
            ModelDir(init).restore(prefix, **objects)
        except io_utils.UsageError as e:
            raise io_utils.UsageError(
                f"--init_checkpoint={init} does not fit the model config: {e}"
            ) from e
        logging.info("initialized %s from %s", " and ".join(objects), prefix)
        return list(objects)

    def _load_from_google_checkpoint(self, encoder, pretraining_model):
        """Assigns an original checkpoint's weights (see load_weights)."""
        prefix = self.init_prefix
        shapes, read = google_checkpoint.read_google_checkpoint_shapes(prefix)
        found = name_map.heads_in(shapes)
        model_heads = (
            model_pretraining_heads(pretraining_model)
            if pretraining_model is not None
            else frozenset()
        )
        with_heads = found & model_heads
        if with_heads != model_heads:
            logging.warning("%s has %s: the others start fresh", prefix, describe_heads(found))
        if not with_heads:
            # The encoder alone: pretraining heads (cls/) and any old task head are dropped.
            shapes = {name: shape for name, shape in shapes.items() if name.startswith("bert/")}
        else:
            # A model built without its NSP head takes the checkpoint's MLM head only.
            shapes = name_map.without_heads(shapes, found - with_heads)
        try:
            name_map.assign_original_weights(
                prefix,
                shapes,
                read,
                pretraining_model if with_heads else encoder,
                self.config.num_hidden_layers,
                with_heads,
            )
        except name_map.CheckpointMismatchError as e:
            raise io_utils.UsageError(f"--init_checkpoint: {e}") from e
        return ["encoder", "pretraining_model"] if with_heads else ["encoder"]


def resolve(
    init_checkpoint="",
    bert_config_file="",
    vocab_file="",
    do_lower_case=None,
    *,
    model_size=None,
    output_dir="",
    max_seq_length=None,
    model_size_attention_direction=modeling.BIDIRECTIONAL,
):
    """The ModelSource for a job's flags (see the module docstring); bad flags are UsageErrors naming them.

    `model_size` is None for jobs without a --model_size flag; a --model_size config gets
    `model_size_attention_direction` (pretraining's --objective=ltr: left_to_right). `output_dir` is the
    job's own model directory (a rerun resumes it); `max_seq_length` must fit
    max_position_embeddings.
    """
    init_dir = ModelDir(init_checkpoint)
    flags = (bert_config_file, vocab_file, do_lower_case, model_size)
    prefix = _checkpoint_of_model_dir(init_checkpoint)
    if init_dir.exists():
        source = _from_model_dir(init_dir, *flags)
    elif prefix is not None:
        parent = ModelDir(os.path.dirname(prefix))
        source = dataclasses.replace(_from_model_dir(parent, *flags), init_prefix=prefix)
    elif init_checkpoint:
        source = _from_google_checkpoint(
            init_checkpoint, *flags, output_dir, model_size_attention_direction
        )
    else:
        source = _from_flags(*flags, output_dir, model_size_attention_direction)
    _check_fits(source, max_seq_length, output_dir)
    return source


def _checkpoint_of_model_dir(path):
    """`path` when it names one checkpoint of a model directory (MODEL_DIR/ckpt-N), else None; a
    ckpt-N that the model directory does not hold is a UsageError naming the ones it does."""
    path = (path or "").rstrip("/")
    parent = ModelDir(os.path.dirname(path))
    if not re.fullmatch(r"ckpt-\d+", os.path.basename(path)) or not parent.exists():
        return None
    if not tf.io.gfile.exists(path + ".index"):
        held = sorted(
            (
                os.path.basename(p)[: -len(".index")]
                for p in tf.io.gfile.glob(f"{parent.path}/ckpt-*.index")
            ),
            key=lambda name: int(name.split("-")[1]),
        )
        raise io_utils.UsageError(
            f"--init_checkpoint={path}: {parent.path} holds no {os.path.basename(path)} (it holds "
            f"{', '.join(held) or 'no checkpoint'})"
        )
    return path


def _from_model_dir(init_dir, bert_config_file, vocab_file, do_lower_case, model_size):
    """A model directory as --init_checkpoint: its config (casing included), vocab and task.json."""
    config = init_dir.load_config()
    _check_casing(do_lower_case, config, init_dir.path)
    for flag, value in (("--bert_config_file", bert_config_file), ("--model_size", model_size)):
        if value:
            logging.warning(
                "%s is ignored: %s carries its own bert_config.json", flag, init_dir.path
            )
    return ModelSource(
        config=config,
        vocab_file=vocab_file or init_dir.vocab_file,
        init_checkpoint=init_dir.path,
        init_prefix=init_dir.latest_checkpoint(),
        init_is_model_dir=True,
        init_spec=models.read_task_spec(init_dir),
    )


def _from_google_checkpoint(
    init, bert_config_file, vocab_file, do_lower_case, model_size, output_dir, direction
):
    """An original checkpoint as --init_checkpoint: its weights, with the config the flags give."""
    prefix, not_found = _find_google_checkpoint(init)
    config, vocab_file = _config_from_flags(
        bert_config_file, vocab_file, do_lower_case, model_size, output_dir, init, direction
    )
    if not_found is not None:
        raise io_utils.UsageError(
            f"--init_checkpoint: {not_found} (expected a model directory or an original checkpoint)"
        ) from not_found
    # The prefix, not the flag: a directory such as cased_L-12_H-768_A-12/ is checked too.
    python_tokenizer.validate_case_matches_checkpoint(config.do_lower_case, prefix)
    return ModelSource(
        config=config,
        vocab_file=_required_vocab(vocab_file),
        init_checkpoint=init,
        init_prefix=prefix,
    )


def _from_flags(bert_config_file, vocab_file, do_lower_case, model_size, output_dir, direction):
    """Random initial weights, with the config --bert_config_file, --model_size or a resumed
    OUTPUT_DIR gives."""
    config, vocab_file = _config_from_flags(
        bert_config_file, vocab_file, do_lower_case, model_size, output_dir, "", direction
    )
    return ModelSource(config=config, vocab_file=_required_vocab(vocab_file))


def _required_vocab(vocab_file):
    """`vocab_file`, which only a model directory as --init_checkpoint may leave out."""
    if not vocab_file:
        raise io_utils.UsageError(
            "--vocab_file is required unless --init_checkpoint is a model directory"
        )
    return vocab_file


def _find_google_checkpoint(init):
    """(the prefix of the original checkpoint at `init`, None), or ("", the error saying why there is none).

    A directory that holds a bert_config.json beside a missing checkpoint or one of ours is a model
    directory that lacks files: the error names them. (Google's directory holds a bert_config.json
    too, beside a TF1 name-based checkpoint.) A Hugging Face directory is named as one.
    """
    init_dir = ModelDir(init)
    try:
        prefix = google_checkpoint.resolve_google_checkpoint(init)
    except FileNotFoundError as e:
        prefix, not_found = "", e
    else:
        not_found = None
    if tf.io.gfile.isdir(init):
        if tf.io.gfile.exists(init_dir.config_file) and (
            not prefix or is_object_checkpoint(prefix)
        ):
            init_dir.check()
        if not prefix and tf.io.gfile.exists(f"{init}/{HF_CONFIG_FILE}"):
            raise io_utils.UsageError(
                f"--init_checkpoint={init} is a Hugging Face model: convert it into a model "
                f"directory first (python -m bert_tf.convert_checkpoint --format=huggingface "
                f"--checkpoint={init} --output_dir=DIR), then give DIR"
            )
    return prefix, not_found


def _config_from_flags(
    bert_config_file, vocab_file, do_lower_case, model_size, output_dir, init, direction
):
    """(config, vocab file) from --bert_config_file, else --model_size (its attention direction
    `direction`), else a resumed OUTPUT_DIR."""
    casing = {} if do_lower_case is None else {"do_lower_case": bool(do_lower_case)}
    if bert_config_file:
        try:
            # Google's bert_config.json has no do_lower_case: the flag supplies it.
            return modeling.BertConfig.from_json_file(bert_config_file, **casing), vocab_file
        except (FileNotFoundError, ValueError) as e:
            raise io_utils.UsageError(f"--bert_config_file: {e}") from e
    if model_size:
        if not vocab_file:
            raise io_utils.UsageError("--model_size needs --vocab_file (its size sets vocab_size)")
        vocab_size = len(_load_vocab(vocab_file))
        config = modeling.BertConfig.from_size(
            model_size, vocab_size, attention_direction=direction, **casing
        )
        return config, vocab_file
    resume_dir = ModelDir(output_dir)
    if resume_dir.exists():
        config = resume_dir.load_config()
        _check_casing(do_lower_case, config, output_dir)
        return config, vocab_file or resume_dir.vocab_file
    sources = "--bert_config_file" + (" or --model_size" if model_size is not None else "")
    raise io_utils.UsageError(
        f"give {sources}, or a model directory as --init_checkpoint"
        + (f" ({init} is not one)" if init else "")
    )


def _check_fits(source, max_seq_length, output_dir):
    """The vocab fits the config, max_seq_length its positions, and a resumed OUTPUT_DIR holds the same config."""
    config = source.config
    vocab_size = len(_load_vocab(source.vocab_file))
    if vocab_size > config.vocab_size:
        raise io_utils.UsageError(
            f"--vocab_file: {source.vocab_file} has {vocab_size} tokens but the config's "
            f"vocab_size is {config.vocab_size}"
        )
    if max_seq_length is not None and max_seq_length > config.max_position_embeddings:
        raise io_utils.UsageError(
            f"--max_seq_length={max_seq_length} exceeds the model's "
            f"max_position_embeddings={config.max_position_embeddings}"
        )
    resume_dir = ModelDir(output_dir)
    if resume_dir.exists():
        previous = resume_dir.read_config()
        if previous != config:
            # Every field, attention_direction too (to_dict leaves a bidirectional one's out).
            requested = dataclasses.asdict(config)
            differences = {
                k: (v, requested[k])
                for k, v in dataclasses.asdict(previous).items()
                if requested[k] != v
            }
            raise io_utils.UsageError(
                f"--output_dir={output_dir} holds a run with a different model config "
                f"(field: (in output_dir, requested) = {differences}); use a new --output_dir"
            )
