"""A model directory as a Hugging Face BERT directory, weight for weight, and the way back in.

    python -m bert_tf.convert_checkpoint --to=huggingface --model_dir=models/mrpc --output_dir=hf/mrpc
    python -m bert_tf.convert_checkpoint --format=huggingface --checkpoint=hf/mrpc --output_dir=models/back

OUT holds what transformers' `from_pretrained` and `AutoTokenizer.from_pretrained` read:

    config.json              model_type bert, the class in `architectures`, `hidden_act` naming the
                             function the weights were trained with (our "gelu", the tanh form, is
                             Hugging Face's "gelu_new"; our "gelu_exact" its "gelu"), the labels
                             (id2label, label2id) and problem_type from task.json, do_lower_case, and
                             `bert_tf_task`: task.json itself, so that importing OUT rebuilds the model
    model.safetensors        float32 weights under transformers' names (Linear weights [out, in])
    vocab.txt, tokenizer_config.json (do_lower_case), special_tokens_map.json
    tokenizer.json           the original's tokenizer as a `tokenizers` pipeline, with its limit of
                             200 characters a word, which AutoTokenizer loads (wordpiece_tokenizer
                             says where it still differs)

The class follows the model directory:

    no task.json: MLM and NSP heads     BertForPreTraining
                  the MLM head only     BertForMaskedLM
                  the NSP head only     BertForNextSentencePrediction
                  no heads              BertModel
    classifier, regressor               BertForSequenceClassification (problem_type
                                        single_label_classification / regression; num_labels 1)
    ner                                 BertForTokenClassification
    squad                               BertForQuestionAnswering
    multiple_choice                     BertForMultipleChoice

Each of our heads has its class's form (bert_tf/tasks/<task>/model.py beside transformers 5's
modeling_bert.py): the classifier and regressor are dropout(hidden_dropout_prob) and one Linear on
pooled_output, as `classifier` with classifier_dropout None; ner the same on sequence_output; squad a
Linear(H, 2) on sequence_output with no dropout, start logits first, as `qa_outputs`; multiple_choice
dropout and Linear(H, 1) on each choice's pooled_output, reshaped to [b, choices]. The MLM head's
decoder is tied to the word embeddings and its bias to cls.predictions.bias, as transformers ties them
(and leaves them out of the file). There is no head here whose form transformers lacks, so no
refusal for a head; a config setting beyond the original BERT's (name_map.unportable_settings)
is refused: a left_to_right model (attention_direction), for one, since BertModel attends both ways.

The names come from bert_tf.checkpoints' one map: the model's weights under the original names
(original_weights), each renamed by huggingface_name, which is checked against the importer's
huggingface_to_original_name. Before OUT appears, the written file is read back by the importer's
reader and compared, bit for bit, with the model's weights. transformers builds BertForMaskedLM,
BertForTokenClassification and BertForQuestionAnswering without a pooler; the pooler is written all
the same (transformers reports its two weights as unused) so that importing OUT gives back this
directory's pooler, not a fresh one. OUT appears whole or not at all (io_utils.atomic_directory),
with io_utils.OUTPUT_MARKER naming convert_checkpoint and the files it wrote: an existing OUT is
replaced only when it is empty or (with overwrite) that earlier output and nothing else.
"""

import dataclasses
import json
import os

import numpy as np
import tensorflow as tf
from absl import logging
from safetensors.numpy import save_file
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    normalizers,
    pre_tokenizers,
    processors,
)
from tokenizers.models import WordPiece

from bert_tf.checkpoints import huggingface, name_map
from bert_tf.model import modeling
from bert_tf.model.model_dir import (
    ALL_HEADS,
    MLM_HEAD,
    NSP_HEAD,
    ModelDir,
    describe_heads,
    pretraining_checkpoint_object,
)
from bert_tf.runtime import io_utils
from bert_tf.tasks import models
from bert_tf.tokenization import tokenizer_rules

# The class of a pretrained model directory, by the pretraining heads its checkpoint holds.
PRETRAINED_ARCHITECTURES = {
    ALL_HEADS: "BertForPreTraining",
    frozenset({MLM_HEAD}): "BertForMaskedLM",
    frozenset({NSP_HEAD}): "BertForNextSentencePrediction",
    frozenset(): "BertModel",
}
# The class of a fine-tuned one, by task.json's kind.
TASK_ARCHITECTURES = {
    "classifier": "BertForSequenceClassification",
    "regressor": "BertForSequenceClassification",
    "ner": "BertForTokenClassification",
    "squad": "BertForQuestionAnswering",
    "multiple_choice": "BertForMultipleChoice",
}
_PROBLEM_TYPES = {"classifier": "single_label_classification", "regressor": "regression"}
# config.json's copy of task.json, read back by task_model.
TASK_KEY = "bert_tf_task"
# The job the output markers name: an export replaces only a folder this job wrote.
OUTPUT_JOB = "convert_checkpoint"
WEIGHTS_FILE = "model.safetensors"
# transformers' BertTokenizer arguments for its special tokens, and their tokens.
SPECIAL_TOKENS = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}


@dataclasses.dataclass
class ExportResult:
    """What an export wrote: the directory, the transformers class, how many weights."""

    output_dir: str
    architecture: str
    num_weights: int
    description: str


def architecture(spec, heads):
    """The transformers class for a model directory with task.json `spec` (or None) and `heads`."""
    if spec is not None:
        return TASK_ARCHITECTURES[spec.kind]
    return PRETRAINED_ARCHITECTURES[frozenset(heads)]


def check_exportable(config, target, model_dir):
    """Refuses (UsageError) the config of `model_dir` with settings beyond the original BERT's:
    `target` lacks them (a left_to_right attention_direction: its BERT always attends both ways)."""
    settings = name_map.unportable_settings(config)
    if settings:
        raise io_utils.UsageError(
            f"model directory {model_dir} has {', '.join(settings)}: {target}'s BERT has no such "
            "setting, so the model cannot be exported exactly"
        )


def check_head_exportable(directory, target, model_dir):
    """Refuses (UsageError) a fine-tuned model whose head reads more than the encoder's outputs (a
    BiLSTM, a frozen encoder's chosen layers): `target` has no such head."""
    spec = models.read_task_spec(directory)
    if spec is not None and (spec.head != "dense" or spec.features):
        what = f"features={spec.features}" if spec.features else f"head={spec.head}"
        raise io_utils.UsageError(
            f"model directory {model_dir} has a {what} {spec.kind} head (task.json): {target} has "
            "only dense heads on the encoder, so the model cannot be exported"
        )


def check_apart(model_dir, output_dir):
    """Refuses an output directory that is the model directory or holds it."""
    if io_utils.is_remote(model_dir):
        return
    source, out = os.path.realpath(model_dir), os.path.realpath(output_dir)
    if source == out or source.startswith(out + os.sep):
        raise io_utils.UsageError(
            f"--output_dir={output_dir} would replace the model directory {model_dir}"
        )


def read_vocab(vocab_file):
    """The vocabulary (token -> id); one that lacks a special token BERT tokenizers need is refused."""
    try:
        vocab = tokenizer_rules.load_vocab(vocab_file)
    except tokenizer_rules.VocabError as e:  # a duplicated or empty line: the user's to fix
        raise io_utils.UsageError(str(e)) from e
    missing = [token for token in SPECIAL_TOKENS.values() if token not in vocab]
    if missing:
        raise io_utils.UsageError(
            f"{vocab_file} has no {', '.join(missing)}: a BERT tokenizer needs them"
        )
    return vocab


def load_model(directory):
    """(config, task spec or None, pretraining heads, the Keras model holding every exported weight)
    of a model directory: the task model, the pretraining model with the heads the checkpoint has,
    or the encoder. Errors name what the directory is missing."""
    prefix = directory.check()
    config = directory.read_config()
    spec = models.read_task_spec(directory)
    if spec is not None:
        model, _, config, spec = models.load_task_model(directory)
        return config, spec, frozenset(), model
    heads = directory.pretraining_heads(prefix)
    if not heads:
        encoder = modeling.build_encoder(config)
        directory.restore(prefix, encoder=encoder)
        return config, None, heads, encoder
    model, encoder = modeling.build_pretraining_model(config)
    directory.restore(
        prefix, encoder=encoder, pretraining_model=pretraining_checkpoint_object(model, heads)
    )
    return config, None, heads, model


def write_config_and_tokenizer(output_dir, config, spec, arch, vocab, vocab_file):
    """config.json (for `arch`), the tokenizer files and vocab.txt into `output_dir`: what
    transformers' AutoConfig and AutoTokenizer read beside the weights."""
    io_utils.atomic_write_json(
        os.path.join(output_dir, "config.json"), huggingface_config(config, spec, arch, vocab)
    )
    for name, values in tokenizer_files(config, vocab).items():
        io_utils.atomic_write_json(os.path.join(output_dir, name), values)
    tf.io.gfile.copy(vocab_file, os.path.join(output_dir, "vocab.txt"))


def huggingface_config(config, spec, arch, vocab):
    """config.json for transformers' `arch` holding a model of `config` (and task.json `spec`)."""
    values = {"architectures": [arch], "model_type": "bert"}
    values.update({name: getattr(config, name) for name in name_map.ORIGINAL_CONFIG_FIELDS})
    values.update(
        hidden_act=huggingface.huggingface_activation(config.hidden_act),
        layer_norm_eps=modeling.LAYER_NORM_EPSILON,
        position_embedding_type="absolute",
        pad_token_id=vocab["[PAD]"],
        classifier_dropout=None,  # the heads' dropout is hidden_dropout_prob, as ours
        tie_word_embeddings=True,
        is_decoder=False,
        do_lower_case=config.do_lower_case,
    )
    if spec is not None:
        labels = {"classifier": spec.labels, "ner": spec.labels, "regressor": ["LABEL_0"]}
        if (
            spec.kind in labels
        ):  # squad's two outputs and multiple choice's one are transformers' defaults
            values["id2label"] = {str(i): label for i, label in enumerate(labels[spec.kind])}
            values["label2id"] = {label: i for i, label in enumerate(labels[spec.kind])}
        if spec.kind in _PROBLEM_TYPES:
            values["problem_type"] = _PROBLEM_TYPES[spec.kind]
        values[TASK_KEY] = spec.to_dict()
    return values


# str.lower()'s Final_Sigma context: a cased letter before (case-ignorable ones between), none after.
_WORD_FINAL_CAPITAL_SIGMA = (
    r"(?<=\p{Cased}\p{Case_Ignorable}*)\u03a3(?!\p{Case_Ignorable}*\p{Cased})"
)
# One CJK ideograph by the original's ranges (`tokenizers`' BERT normalizer starts Extension E
# at U+2B920, the original at U+2B820).
_CJK_IDEOGRAPH = (
    "[" + "".join(f"{chr(low)}-{chr(high)}" for low, high in tokenizer_rules.CJK_RANGES) + "]"
)


def wordpiece_tokenizer(vocab, do_lower_case):
    """The original's tokenizer as a Hugging Face `tokenizers` pipeline: tokenizer.json's JSON object.

    transformers' BertTokenizer builds its pipeline from the vocabulary with WordPiece's limit of
    100 characters a word, the original's until 2018 (bert_tf.tokenization): a word of 101 to 200
    characters would become [UNK] there and wordpieces here. This one keeps the original's limit;
    tokenizer_files names the generic class that loads it as written. It also mends two rules
    where `tokenizers`' BERT parts differ from the original: a word-final capital sigma lower-cases
    to a final sigma (Python's str.lower()), and CJK ideographs are the original's ranges
    (tokenizer_rules.CJK_RANGES; `tokenizers`' own leave out U+2B820 to U+2B91F). Left different,
    one code point at a time against FullTokenizer: its normalizer drops private-use characters,
    which the original keeps, and about 500 code points (120 cased) are marks, punctuation or
    controls in one of `tokenizers`' Unicode tables and Python's but not the other.
    """
    tokenizer = Tokenizer(
        WordPiece(
            dict(vocab),
            unk_token=SPECIAL_TOKENS["unk_token"],
            max_input_chars_per_word=tokenizer_rules.MAX_INPUT_CHARS_PER_WORD,
        )
    )
    # The original's order: clean the text; then, uncased, each word lower-cased as str.lower()
    # does it (a capital sigma that ends a word becomes a final sigma), decomposed, and stripped
    # of its accents. CJK ideographs become words of their own in the pre-tokenizer.
    steps = [
        normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=False, strip_accents=False, lowercase=False
        )
    ]
    if do_lower_case:
        steps += [
            normalizers.Replace(Regex(_WORD_FINAL_CAPITAL_SIGMA), "\u03c2"),
            # Its accent stripping drops Mn only, as the original does (StripAccents drops Mc
            # and Me too).
            normalizers.BertNormalizer(
                clean_text=False, handle_chinese_chars=False, strip_accents=True, lowercase=True
            ),
        ]
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_CJK_IDEOGRAPH), behavior="isolated"),
            pre_tokenizers.BertPreTokenizer(),
        ]
    )
    cls, sep = SPECIAL_TOKENS["cls_token"], SPECIAL_TOKENS["sep_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])],
    )
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    # Literal special tokens in text stay whole, as transformers' BERT tokenizers keep them.
    tokenizer.add_special_tokens(
        [AddedToken(token, normalized=False, special=True) for token in SPECIAL_TOKENS.values()]
    )
    return json.loads(tokenizer.to_str())


def tokenizer_files(config, vocab):
    """{file name: JSON object} of the tokenizer files beside vocab.txt."""
    tokenizer_config = dict(
        # The class that runs tokenizer.json as written: transformers 5's BertTokenizer rebuilds
        # the pipeline from the vocabulary, dropping its limit on a word's length.
        tokenizer_class="PreTrainedTokenizerFast",
        # BERT's inputs, which that class does not assume: segment ids for pairs.
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
        # BertTokenizer's own settings, for a user who loads that class by name (and for the
        # importer, which reads do_lower_case).
        do_lower_case=config.do_lower_case,
        do_basic_tokenize=True,
        never_split=None,
        tokenize_chinese_chars=True,
        strip_accents=None,  # as do_lower_case, like the original's
        model_max_length=config.max_position_embeddings,
        clean_up_tokenization_spaces=False,
        **SPECIAL_TOKENS,
    )
    return {
        "tokenizer.json": wordpiece_tokenizer(vocab, config.do_lower_case),
        "tokenizer_config.json": tokenizer_config,
        "special_tokens_map.json": dict(SPECIAL_TOKENS),
    }


def huggingface_state(weights, arch):
    """{transformers name: array} of `weights` ({original name: array}) for class `arch`."""
    prefix = "" if arch == "BertModel" else "bert."
    state = {}
    for original, array in weights.items():
        name, transpose = huggingface.huggingface_name(original, prefix)
        state[name] = np.ascontiguousarray(array.T if transpose else array)
    return state


def _check_written(path, weights):
    """Reads `path` back with the importer's reader; every weight must come back bit for bit."""
    written, _ = huggingface.read_huggingface_weights(path)
    if set(written) != set(weights):
        raise RuntimeError(
            f"bert_tf bug: {WEIGHTS_FILE} reads back as {sorted(set(written) ^ set(weights))}"
        )
    for name, array in weights.items():
        if written[name].dtype != array.dtype or not np.array_equal(written[name], array):
            raise RuntimeError(f"bert_tf bug: {name} does not read back from {WEIGHTS_FILE}")


def export(model_dir, output_dir, overwrite=False, record=None):
    """Writes the model directory `model_dir` as the Hugging Face directory `output_dir`.

    `record` (the CLI's flags) goes into its bert_tf_output.json, so that the directory holds
    nothing Hugging Face does not read but that one file. An existing
    `output_dir` that is not empty is replaced only when it is convert_checkpoint's own earlier
    output and `overwrite` (io_utils.check_replaceable). Returns an ExportResult.
    """
    directory = ModelDir(model_dir)
    directory.check()
    check_exportable(directory.read_config(), "Hugging Face", model_dir)
    check_head_exportable(directory, "Hugging Face", model_dir)
    check_apart(model_dir, output_dir)
    vocab = read_vocab(directory.vocab_file)
    with io_utils.atomic_directory(output_dir, OUTPUT_JOB, overwrite, record) as tmp:
        config, spec, heads, model = load_model(directory)
        arch = architecture(spec, heads)
        weights = name_map.original_weights(
            model, config.num_hidden_layers, heads, task_kind=spec.kind if spec else None
        )
        save_file(
            huggingface_state(weights, arch),
            os.path.join(tmp, WEIGHTS_FILE),
            metadata={"format": "pt"},
        )
        _check_written(tmp, weights)
        write_config_and_tokenizer(tmp, config, spec, arch, vocab, directory.vocab_file)
        description = (
            f"a fine-tuned {spec.kind}" if spec else f"the encoder and {describe_heads(heads)}"
        )
    logging.info("wrote %s (%s): %s", output_dir, arch, description)
    return ExportResult(output_dir, arch, len(weights), description)


def task_model(hf_config, config, source="config.json"):
    """conversion.convert's `task_model` hook: (TaskSpec, task model, encoder) for a config.json this
    module wrote for a fine-tuned model (its `bert_tf_task`), else None."""
    values = hf_config.get(TASK_KEY)
    if values is None:
        return None
    spec = models.TaskSpec.from_dict(values, source=f"{source} ({TASK_KEY})")
    want = TASK_ARCHITECTURES[spec.kind]
    if hf_config.get("architectures") != [want]:
        raise ValueError(
            f"{source}: {TASK_KEY} is a {spec.kind}, a {want}, but architectures is "
            f"{hf_config.get('architectures')!r}"
        )
    model, encoder = models.build_task_model(config, spec)
    return spec, model, encoder
