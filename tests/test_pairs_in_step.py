"""The pairs that must agree learn every setting together: a setting one side learns fails here.

Three pairs compute one thing twice: the Keras encoder (modeling.build_encoder) and the export's
InferenceEncoder, from one BertConfig; the Python tokenizers (FullTokenizer, CachedTokenizer) and
GraphTokenizer; the packers pack_segments and pack_inputs. Other tests compare their outputs at the
settings they pick, which says nothing of a setting added later. So each pair's settings are listed
here by introspection (the BertConfig dataclass's fields, the constructors' and functions' signatures),
never by hand, and each one must be taken by both sides or be declared, next to the code, as one
that changes no output (modeling.INFERENCE_INERT_FIELDS and WEIGHT_SHAPE_FIELDS,
tokenizer_rules.ONE_SIDED_TOKENIZER_OPTIONS, packing.ONE_SIDED_PACKER_OPTIONS):

- BertConfig: both forward passes are built and called with a config that records every field
  read from it (properties and methods run on the recording config, so their reads count), at the
  base config and at a changed value of each field; every field not declared must be read by both
  (a weight-shape field, by the Keras encoder).
- Tokenizers and packers: their options are parameters, whose reads cannot be recorded without
  changing the code under test, so every option must be in every side's signature, with one default.

Then the behaviour, which a read alone does not prove: each setting gets a value other than the
base's (a table below, which a new setting must join), both sides run with it and must agree, and
the value must change the output (so the comparison tests the setting); a declared setting's value
must change no output instead (a weight-shape field: a weight's shape).
"""

import copy
import dataclasses
import functools
import inspect

import numpy as np
import pytest
import tensorflow as tf
from helpers import SPECIAL_TOKENS, tiny_config, tiny_inputs

from bert_tf.model import modeling
from bert_tf.saved_model.inference_encoder import with_inference_encoder
from bert_tf.tasks import packing
from bert_tf.tokenization import tokenizer_rules
from bert_tf.tokenization.graph_tokenizer import GraphTokenizer
from bert_tf.tokenization.python_tokenizer import CachedTokenizer, FullTokenizer

# ----------------------------------------------------------------------------------------------
# The Keras encoder and the export's InferenceEncoder
# ----------------------------------------------------------------------------------------------

CONFIG_FIELDS = tuple(field.name for field in dataclasses.fields(modeling.BertConfig))
# Uneven shapes (3 heads of 8) and weights large enough for peaked attention, as
# test_inference_encoder's, so that a changed setting shows above float rounding.
BASE_CONFIG = tiny_config(
    hidden_size=24, num_attention_heads=3, intermediate_size=40, initializer_range=0.5
)
# A value other than BASE_CONFIG's for every BertConfig field: both passes run with it. A new
# field needs one here (test_config_field_changes_both_passes_alike says so).
CONFIG_ALTERNATIVES = {
    "vocab_size": 29,
    "hidden_size": 30,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "intermediate_size": 52,
    "hidden_act": "gelu_exact",
    "hidden_dropout_prob": 0.3,
    "attention_probs_dropout_prob": 0.2,
    "max_position_embeddings": 40,
    "type_vocab_size": 3,
    "initializer_range": 0.05,
    "do_lower_case": False,
    "attention_direction": modeling.LEFT_TO_RIGHT,
    "config_version": modeling.CONFIG_VERSION,
}
KERAS_SIDE = "the Keras encoder (modeling.build_encoder)"
INFERENCE_SIDE = "the export's InferenceEncoder (inference_encoder.with_inference_encoder)"
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def recording(config, reads):
    """`config` as an instance of a BertConfig subclass that adds each field read to `reads`.

    A subclass, not a wrapper: isinstance checks, properties (left_to_right reads
    attention_direction) and methods all run on it, so every read through them is seen too.
    """
    fields = set(CONFIG_FIELDS)

    class RecordingConfig(type(config)):
        def __getattribute__(self, name):
            if name in fields:
                reads.add(name)
            return super().__getattribute__(name)

    recorded = copy.copy(config)
    recorded.__class__ = RecordingConfig
    return recorded


def alternative_config(field):
    """BASE_CONFIG with `field` at its CONFIG_ALTERNATIVES value."""
    value = CONFIG_ALTERNATIVES[field]
    config = dataclasses.replace(BASE_CONFIG, **{field: value})
    # __post_init__ derives config_version from attention_direction; set it after, so that the
    # passes see the value itself.
    config.__dict__[field] = value
    return config


def encoder_inputs():
    """Three rows padded by different amounts, both segments, ids of every vocabulary tried."""
    inputs = tiny_inputs(batch=3, seq=11, seed=2)
    inputs["input_mask"][1, 6:] = 0
    return inputs


def as_float32(outputs):
    """An encoder's outputs dict as float32 NumPy (encoder_outputs a list)."""
    return tf.nest.map_structure(lambda x: np.asarray(tf.cast(x, tf.float32)), outputs)


@dataclasses.dataclass
class EncoderRun:
    """Both passes built and called with one config: the fields each read, and their outputs."""

    keras_reads: set
    inference_reads: set
    weight_shapes: list
    weights: list
    keras_outputs: dict
    inference_outputs: dict


@functools.cache
def encoder_run(field=None):
    """Both passes with `field` at its alternative value (None: BASE_CONFIG). Where the weights'
    shapes are the base run's, the base run's weights are used, so outputs differ by the
    arithmetic alone."""
    config = BASE_CONFIG if field is None else alternative_config(field)
    keras_reads, inference_reads = set(), set()
    tf.keras.utils.set_random_seed(1)
    encoder = modeling.build_encoder(recording(config, keras_reads))
    shapes = [tuple(w.shape) for w in encoder.weights]
    if field is not None and shapes == encoder_run().weight_shapes:
        encoder.set_weights(encoder_run().weights)
    inference = with_inference_encoder(encoder, recording(config, inference_reads))
    inputs = encoder_inputs()
    # Eager calls: the ops of an export's traced graph (test_inference_encoder traces them),
    # without tracing each of 15 models (a fifth of the time).
    return EncoderRun(
        keras_reads,
        inference_reads,
        shapes,
        encoder.get_weights(),
        as_float32(encoder(inputs, training=False)),
        as_float32(inference(inputs, training=False)),
    )


def same_outputs(got, want, **tolerance):
    """Whether two encoders' output dicts agree (within `tolerance`; exactly without one)."""
    if sorted(got) != sorted(want) or len(got["encoder_outputs"]) != len(want["encoder_outputs"]):
        return False
    pairs = zip(tf.nest.flatten(got), tf.nest.flatten(want))
    if not tolerance:
        return all(np.array_equal(g, w) for g, w in pairs)
    return all(g.shape == w.shape and np.allclose(g, w, **tolerance) for g, w in pairs)


def test_declared_config_fields_are_fields():
    declared = modeling.INFERENCE_INERT_FIELDS | modeling.WEIGHT_SHAPE_FIELDS
    assert declared <= set(CONFIG_FIELDS), declared - set(CONFIG_FIELDS)
    assert not modeling.INFERENCE_INERT_FIELDS & modeling.WEIGHT_SHAPE_FIELDS


def test_every_config_field_is_read_by_both_forward_passes_or_declared():
    # Every run, so that a field read only under another field's value (left_to_right's) counts.
    runs = [encoder_run()] + [encoder_run(f) for f in CONFIG_FIELDS if f in CONFIG_ALTERNATIVES]
    keras_reads = set().union(*(run.keras_reads for run in runs))
    inference_reads = set().union(*(run.inference_reads for run in runs))
    problems = []
    for field in CONFIG_FIELDS:
        if field in modeling.INFERENCE_INERT_FIELDS:
            continue
        sides = [(KERAS_SIDE, keras_reads)]
        if field not in modeling.WEIGHT_SHAPE_FIELDS:  # those reach InferenceEncoder as shapes
            sides.append((INFERENCE_SIDE, inference_reads))
        missing = [side for side, reads in sides if field not in reads]
        if missing:
            readers = [side for side, reads in sides if field in reads] or ["neither pass"]
            problems.append(
                f"BertConfig.{field} is read by {readers[0]} but not by {' nor '.join(missing)}: "
                f"teach it the field, or declare the field in modeling.INFERENCE_INERT_FIELDS "
                f"(it changes no output at inference) or modeling.WEIGHT_SHAPE_FIELDS (it only "
                f"sizes a weight)"
            )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("field", CONFIG_FIELDS)
def test_config_field_changes_both_passes_alike(field):
    if field not in CONFIG_ALTERNATIVES:
        pytest.fail(
            f"CONFIG_ALTERNATIVES (tests/test_pairs_in_step.py) has no value for BertConfig."
            f"{field}: give it one other than {getattr(BASE_CONFIG, field)!r}, so that both "
            f"forward passes run with it"
        )
    value = CONFIG_ALTERNATIVES[field]
    assert getattr(alternative_config(field), field) != getattr(BASE_CONFIG, field), field
    base, run = encoder_run(), encoder_run(field)
    setting = f"BertConfig.{field}={value!r}"
    if field in modeling.INFERENCE_INERT_FIELDS:
        for side, got, want in [
            (KERAS_SIDE, run.keras_outputs, base.keras_outputs),
            (INFERENCE_SIDE, run.inference_outputs, base.inference_outputs),
        ]:
            assert run.weight_shapes == base.weight_shapes and same_outputs(got, want), (
                f"{setting} changes the outputs of {side}, with the same weights, so it is not "
                f"inert: take it out of modeling.INFERENCE_INERT_FIELDS and teach both passes it"
            )
    elif field in modeling.WEIGHT_SHAPE_FIELDS:
        assert run.weight_shapes != base.weight_shapes, (
            f"{setting} changes no weight's shape: take it out of modeling.WEIGHT_SHAPE_FIELDS "
            f"and teach both passes it"
        )
    else:
        changed = run.weight_shapes != base.weight_shapes or not same_outputs(
            run.keras_outputs, base.keras_outputs, **TOLERANCE
        )
        assert changed, (
            f"{setting} changes neither the weights' shapes nor the outputs: give "
            f"CONFIG_ALTERNATIVES a value that does, or declare the field inert"
        )
    assert same_outputs(run.inference_outputs, run.keras_outputs, **TOLERANCE), (
        f"with {setting}, {INFERENCE_SIDE} and {KERAS_SIDE} give different outputs"
    )


# ----------------------------------------------------------------------------------------------
# The Python tokenizers and GraphTokenizer
# ----------------------------------------------------------------------------------------------

TOKENIZERS = (FullTokenizer, CachedTokenizer, GraphTokenizer)
# Cased and uncased forms, a stripped accent, a continuation, and the literals' pieces.
TOKENIZER_VOCAB = SPECIAL_TOKENS + (
    "hello Hello world WORLD ##s ##S naive na ##ïve x y [ ] mask MASK sep SEP".split()
)
# Text that every option's alternative value tokenizes otherwise.
TOKENIZER_TEXTS = ["Hello naïve WORLDS [MASK] x[SEP]y", "hello [mask] world", "", "Ｘ ý"]
# A value other than the default for every tokenizer option: each class that takes it runs with it.
# A new option needs one here.
TOKENIZER_ALTERNATIVES = {
    "do_lower_case": False,
    "special_tokens": ("[MASK]", "[SEP]"),
    "max_cached_words": 1,
    "name": "renamed_tokenizer",
}


def options(function, data_parameters):
    """{option: default} of a function's or class's parameters, less the data it is given."""
    return {
        name: parameter.default
        for name, parameter in inspect.signature(function).parameters.items()
        if name not in data_parameters
    }


def one_sided_problems(declared, options_by_side):
    """Why `declared` (options one side alone is said to have) is wrong, if it is: an option no
    side takes, or one every side takes."""
    unknown = declared - set().union(*options_by_side.values())
    shared = declared & set.intersection(*(set(taken) for taken in options_by_side.values()))
    return [f"no side takes {sorted(unknown)}"] * bool(unknown) + [
        f"every side takes {sorted(shared)}: not one-sided"
    ] * bool(shared)


def option_problems(kind, options_by_side, declared, declared_name, change):
    """For each option not `declared` one-sided: the sides that lack it, or defaults that differ.

    `declared_name` names the declaration, `change` what a one-sided option may not change."""
    problems = []
    for option in sorted(set().union(*options_by_side.values()) - declared):
        having = [side for side, taken in options_by_side.items() if option in taken]
        lacking = [side for side, taken in options_by_side.items() if option not in taken]
        if lacking:
            problems.append(
                f"{kind} option {option!r} is taken by {', '.join(having)} but not by "
                f"{', '.join(lacking)}: teach {'them' if len(lacking) > 1 else 'it'} the option, "
                f"or declare it in {declared_name} (it changes no {change})"
            )
            continue
        defaults = {side: taken[option] for side, taken in options_by_side.items()}
        if len(set(map(repr, defaults.values()))) > 1:
            problems.append(f"{kind} option {option!r} has different defaults: {defaults}")
    return problems


TOKENIZER_OPTIONS = {cls.__name__: options(cls, {"vocab_file"}) for cls in TOKENIZERS}
ALL_TOKENIZER_OPTIONS = sorted(set().union(*TOKENIZER_OPTIONS.values()))


@pytest.fixture(scope="module")
def tokenizer_vocab(tmp_path_factory):
    path = tmp_path_factory.mktemp("pairs") / "vocab.txt"
    path.write_text("\n".join(TOKENIZER_VOCAB) + "\n", encoding="utf-8")
    return str(path)


@functools.cache  # each test reuses the default settings' ids, and a GraphTokenizer takes seconds
def token_ids(cls, vocab_file, **settings):
    """The ids of TOKENIZER_TEXTS by a `cls` tokenizer with `settings`, one list a text (and, for
    CachedTokenizer, its bulk path's too, which must give the same)."""
    tokenizer = cls(vocab_file, **settings)
    if cls is GraphTokenizer:
        return tokenizer.tokenize(tf.constant(TOKENIZER_TEXTS)).to_list()
    ids = [tokenizer.encode(text) for text in TOKENIZER_TEXTS]
    if cls is CachedTokenizer:
        flat, splits = tokenizer.encode_lines(TOKENIZER_TEXTS)
        assert [flat[a:b].tolist() for a, b in zip(splits, splits[1:])] == ids
    return ids


def test_declared_tokenizer_options_are_one_sided_options():
    problems = one_sided_problems(tokenizer_rules.ONE_SIDED_TOKENIZER_OPTIONS, TOKENIZER_OPTIONS)
    assert not problems, problems


def test_every_tokenizer_option_is_every_tokenizers_or_declared():
    problems = option_problems(
        "tokenizer",
        TOKENIZER_OPTIONS,
        tokenizer_rules.ONE_SIDED_TOKENIZER_OPTIONS,
        "tokenizer_rules.ONE_SIDED_TOKENIZER_OPTIONS",
        "token",
    )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("option", ALL_TOKENIZER_OPTIONS)
def test_tokenizer_option_changes_every_tokenizer_alike(option, tokenizer_vocab):
    if option not in TOKENIZER_ALTERNATIVES:
        pytest.fail(
            f"TOKENIZER_ALTERNATIVES (tests/test_pairs_in_step.py) has no value for the "
            f"tokenizer option {option!r}: give it one other than the default, and "
            f"TOKENIZER_TEXTS a text it changes"
        )
    value = TOKENIZER_ALTERNATIVES[option]
    classes = [cls for cls in TOKENIZERS if option in TOKENIZER_OPTIONS[cls.__name__]]
    base = {cls.__name__: token_ids(cls, tokenizer_vocab) for cls in classes}
    got = {cls.__name__: token_ids(cls, tokenizer_vocab, **{option: value}) for cls in classes}
    setting = f"{option}={value!r}"
    if option in tokenizer_rules.ONE_SIDED_TOKENIZER_OPTIONS:
        for name in got:
            assert got[name] == base[name], (
                f"{setting} changes {name}'s ids, so it is not one-sided: take it out of "
                f"tokenizer_rules.ONE_SIDED_TOKENIZER_OPTIONS and teach every tokenizer it"
            )
        return
    reference = got["FullTokenizer"]
    for name, ids in got.items():
        assert ids == reference, f"with {setting}, {name} gives {ids}, FullTokenizer {reference}"
    assert reference != base["FullTokenizer"], (
        f"{setting} changes no id of TOKENIZER_TEXTS: give it a value or a text that does"
    )


# ----------------------------------------------------------------------------------------------
# pack_segments and pack_inputs
# ----------------------------------------------------------------------------------------------

PACKERS = (packing.pack_segments, packing.pack_inputs)
PACKER_OPTIONS = {f.__name__: options(f, {"segments"}) for f in PACKERS}
ALL_PACKER_OPTIONS = sorted(set().union(*PACKER_OPTIONS.values()))
# The required options' values in every run, and the ones a run changes: a value other than the
# base for every packer option. A new option needs one here.
PACKER_BASE = dict(seq_length=10, cls_id=2, sep_id=3)
PACKER_ALTERNATIVES = dict(seq_length=7, cls_id=101, sep_id=102, drop_empty_b=True)
# Batches of rows of one to three segments: short, empty, over the budget, and a pair with an
# empty b.
PACKER_BATCHES = [
    [[[5, 6, 7]], [list(range(5, 20))], [[]]],
    [[[5, 6], [7, 8, 9]], [[5, 6, 7, 8], []], [list(range(5, 17)), [9, 10, 11]], [[], [5]]],
    [[[5], [6, 7], [8, 9, 10]], [list(range(5, 14)), [], [6, 7, 8, 9]]],
]


def packed(packer, **settings):
    """Each row of PACKER_BATCHES packed by `packer` with `settings`: a list of
    (input ids, input mask, segment ids) lists."""
    settings = {**PACKER_BASE, **settings}
    rows = []
    for batch in PACKER_BATCHES:
        if packer is packing.pack_segments:
            rows.extend(tuple(a.tolist() for a in packer(row, **settings)) for row in batch)
            continue
        segments = [
            tf.RaggedTensor.from_row_lengths(
                tf.constant([t for row in batch for t in row[s]], tf.int32),
                [len(row[s]) for row in batch],
            )
            for s in range(len(batch[0]))
        ]
        out = packer(segments, **settings)
        names = ("input_word_ids", "input_mask", "input_type_ids")
        rows.extend(zip(*(out[name].numpy().tolist() for name in names)))
    return rows


def test_declared_packer_options_are_one_sided_options():
    problems = one_sided_problems(packing.ONE_SIDED_PACKER_OPTIONS, PACKER_OPTIONS)
    assert not problems, problems


def test_every_packer_option_is_both_packers_or_declared():
    problems = option_problems(
        "packer",
        PACKER_OPTIONS,
        packing.ONE_SIDED_PACKER_OPTIONS,
        "packing.ONE_SIDED_PACKER_OPTIONS",
        "packed value",
    )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("option", [None, *ALL_PACKER_OPTIONS])
def test_packer_option_changes_both_packers_alike(option):
    if option is None:  # the base settings
        assert packed(packing.pack_inputs) == packed(packing.pack_segments)
        return
    if option not in PACKER_ALTERNATIVES:
        pytest.fail(
            f"PACKER_ALTERNATIVES (tests/test_pairs_in_step.py) has no value for the packer "
            f"option {option!r}: give it one other than the base, and PACKER_BATCHES a row it "
            f"changes"
        )
    value = PACKER_ALTERNATIVES[option]
    setting = f"{option}={value!r}"
    packers = [p for p in PACKERS if option in PACKER_OPTIONS[p.__name__]]
    base = {p.__name__: packed(p) for p in packers}
    got = {p.__name__: packed(p, **{option: value}) for p in packers}
    if option in packing.ONE_SIDED_PACKER_OPTIONS:
        for name in got:
            assert got[name] == base[name], (
                f"{setting} changes what {name} packs, so it is not one-sided: take it out of "
                f"packing.ONE_SIDED_PACKER_OPTIONS and teach both packers it"
            )
        return
    for row, (want, have) in enumerate(zip(got["pack_segments"], got["pack_inputs"])):
        assert have == want, f"with {setting}, row {row}: pack_inputs {have}, pack_segments {want}"
    assert got["pack_segments"] != base["pack_segments"], (
        f"{setting} changes no row of PACKER_BATCHES: give it a value or a row that does"
    )
