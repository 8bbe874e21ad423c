"""The signature fuzzer: seeded random calls of every signature of exported SavedModels.

`make_calls` draws calls from a signature's input specs alone: row counts per input (0, 1, a few,
unequal, many), empty, huge and invalid-UTF-8 strings, thousands of [MASK]s, extreme top_k,
token ids out of range, wrong dtypes and ranks. Each call says what it must get:
- GOOD: an answer, one row per input row, finite numbers, each row the answer it gets alone;
- BAD: InvalidArgumentError (a TypeError or ValueError where the dtype or rank is wrong, which
  TensorFlow refuses before running), naming the inputs where their row counts differ;
- EITHER: an answer or InvalidArgumentError (invalid UTF-8: refused or replaced, both are clear).
Whatever it is, the process must live.

Run as a script, it calls the SavedModels directly with nothing but tensorflow and
tensorflow_text, as an app would, and prints one JSON line before each call and one after, so
the parent names the call a crash died in:

    python tests/signature_fuzz.py '{"name": "/path/to/export/1", ...}' SEED ROUNDS

A round is CALLS_PER_ROUND calls of each export: a seed and a round count name every call made,
whatever the machine's speed.
"""

import json
import sys

import numpy as np

GOOD, BAD, EITHER = "good", "bad", "either"
# How fill_mask refuses an answer past its bound: a refusal any call may get.
BOUND = "a call answers at most"
MASK = "[MASK]"
# Row counts a call draws from; LARGE rows skip the row-by-row comparison.
ROW_COUNTS = (0, 1, 1, 2, 3, 4)
LARGE = 64
HUGE_TEXT_WORDS = 60_000  # about 400 KB
MANY_MASKS = 3000
CALLS_PER_ROUND = 8


class Call:
    """One call: signature, inputs {name: np.ndarray}, what it must get and why."""

    def __init__(self, export, signature, inputs, expect, why):
        self.export, self.signature, self.inputs = export, signature, inputs
        self.expect, self.why = expect, why

    def describe(self):
        shapes = {
            name: [str(value.dtype), list(value.shape)] for name, value in self.inputs.items()
        }
        return {"export": self.export, "signature": self.signature, "inputs": shapes,
                "expect": self.expect, "why": self.why}  # fmt: skip


def _texts(rng, words, count, with_mask=False):
    """`count` texts of vocabulary words, now and then empty, huge, odd or full of [MASK]s."""
    texts = []
    for _ in range(count):
        kind = rng.choice(["words"] * 6 + ["empty", "huge", "odd", "masks"])
        if kind == "empty":
            text = ""
        elif kind == "huge":
            text = " ".join(rng.choice(words, HUGE_TEXT_WORDS))
        elif kind == "odd":
            text = rng.choice(
                ["\x00 \t\n", "中文 ＡＢＣ ﬁ", "😀" * 50, "[SEP] [CLS] [PAD]", " " * 300]
            )
        elif kind == "masks":
            text = " ".join([MASK] * MANY_MASKS)
        else:
            text = " ".join(rng.choice(words, rng.integers(0, 20)))
        if with_mask and MASK not in text:
            text = f"{text} {MASK} {' '.join(rng.choice(words, 2))}"
        texts.append(text)
    return texts


def _example(text_features, rng, words):
    """A serialized tf.train.Example with a text feature per name."""
    import tensorflow as tf

    feature = {
        name: tf.train.Feature(bytes_list=tf.train.BytesList(value=[text.encode("utf-8")]))
        for name, text in zip(text_features, _texts(rng, words, len(text_features)))
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _strings(values):
    return np.array([v.encode("utf-8") if isinstance(v, str) else v for v in values], dtype=object)


def _good_inputs(rng, signature, specs, rows, words, vocab_size, example_features):
    """Inputs every export must answer: `rows` rows of each batch input."""
    inputs = {}
    columns = int(rng.choice([2, 3, 4]))
    seq = int(rng.integers(1, 20))
    for name, (dtype, shape) in specs.items():
        if dtype == "int32" and not shape:  # fill_mask's top_k
            inputs[name] = np.array(rng.choice([1, 2, 5, vocab_size]), np.int32)
        elif dtype == "int32":  # the encoder's ids, mask and type ids
            high = {"input_word_ids": vocab_size}.get(name, 2)
            inputs[name] = rng.integers(0, high, [rows, seq]).astype(np.int32)
        elif name == "inputs":  # serialized tf.Examples
            inputs[name] = np.array(
                [_example(example_features, rng, words) for _ in range(rows)], dtype=object
            )
        elif len(shape) == 2:  # multiple choice's endings
            inputs[name] = _strings(_texts(rng, words, rows * columns)).reshape(rows, columns)
        else:
            inputs[name] = _strings(_texts(rng, words, rows, with_mask=signature == "fill_mask"))
    return inputs


def make_calls(rng, export, signatures, words, vocab_size, count):
    """`count` random calls of `signatures` ({name: {input: (dtype, shape)}}) of one export."""
    # A classifier's tf.Examples hold the texts its serving_default takes.
    example_features = sorted(signatures.get("serving_default", {}))
    calls = []
    names = sorted(signatures)
    for _ in range(count):
        signature = names[rng.integers(len(names))]
        specs = signatures[signature]
        batch_inputs = [n for n, (_, shape) in specs.items() if shape]
        rows = LARGE if rng.random() < 0.05 else int(rng.choice(ROW_COUNTS))
        inputs = _good_inputs(rng, signature, specs, rows, words, vocab_size, example_features)
        kinds = ["good"] * 4 + ["rank", "dtype", "invalid_utf8"]
        if len(batch_inputs) > 1:
            kinds += ["unequal_rows"] * 4
        if signature == "fill_mask":
            kinds += ["top_k", "no_mask"]
        if "input_word_ids" in specs:
            kinds += ["ids_out_of_range", "positions"]
        if signature in ("classification", "regression"):
            kinds += ["not_an_example"]
        kind = rng.choice(kinds)
        expect, why = GOOD, "well formed"
        name = batch_inputs[rng.integers(len(batch_inputs))]
        value = inputs[name]
        if kind == "unequal_rows":
            other = int(rng.choice([n for n in (0, 1, 2, 3, 5, LARGE) if n != rows]))
            # Drawn afresh, then cut or stretched to the other count: same columns as before.
            drawn = _good_inputs(
                rng, signature, specs, max(other, 1), words, vocab_size, example_features
            )
            inputs[name] = np.resize(drawn[name], (other,) + value.shape[1:])
            expect, why = BAD, f"{name} has {len(inputs[name])} rows, the others {rows}"
        elif kind == "rank":
            scalar = value.size and rng.random() < 0.5
            inputs[name] = value.ravel()[:1].reshape(()) if scalar else value[..., np.newaxis]
            expect, why = BAD, f"{name} of rank {inputs[name].ndim}"
        elif kind == "dtype":
            inputs[name] = (
                np.zeros(value.shape, np.float32)
                if value.dtype == object
                else _strings(["1"] * value.size).reshape(value.shape)
            )
            expect, why = BAD, f"{name} of dtype {inputs[name].dtype}"
        elif kind == "invalid_utf8" and value.dtype == object and value.size and name != "inputs":
            flat = value.ravel().copy()
            flat[int(rng.integers(flat.size))] = b"\xff\xfe " + MASK.encode() + b" \xc3"
            inputs[name] = flat.reshape(value.shape)
            expect, why = EITHER, f"invalid UTF-8 in {name}"
        elif kind == "top_k":
            top_k = int(rng.choice([0, -1, vocab_size + 1, 2**31 - 1, -(2**31)]))
            inputs["top_k"] = np.array(top_k, np.int32)
            expect, why = BAD, f"top_k {top_k}"
        elif kind == "no_mask" and rows:
            texts = inputs["text"].copy()
            texts[int(rng.integers(rows))] = b"no mask here"
            inputs["text"] = texts
            expect, why = BAD, "a row without [MASK]"
        elif kind == "ids_out_of_range" and value.size:
            ids = inputs["input_word_ids"].copy()
            ids.flat[int(rng.integers(ids.size))] = int(rng.choice([-1, vocab_size, 2**31 - 1]))
            inputs["input_word_ids"] = ids
            expect, why = BAD, "a token id outside the vocabulary"
        elif kind == "positions" and rows:
            long = int(rng.choice([0, 65, 513]))  # none, or past max_position_embeddings
            for n in ("input_word_ids", "input_mask", "input_type_ids"):
                inputs[n] = np.ones([rows, long], np.int32)
            expect, why = BAD, f"{long} positions"
        elif kind == "not_an_example" and rows:
            examples = inputs["inputs"].copy()
            examples[int(rng.integers(rows))] = bytes(rng.integers(0, 256, 20, dtype=np.uint8))
            inputs["inputs"] = examples
            expect, why = EITHER, "random bytes as a tf.Example"  # may parse by chance
        calls.append(Call(export, signature, inputs, expect, why))
    return calls


def signature_specs(function):
    """{input name: (dtype name, shape list)} of a loaded signature."""
    specs = function.structured_input_signature[1]
    return {name: (spec.dtype.name, spec.shape.as_list()) for name, spec in specs.items()}


def vocabulary_words(vocab_file):
    """The whole words of a vocab.txt (no ## pieces, no [special] tokens)."""
    with open(vocab_file, encoding="utf-8") as f:
        tokens = [line.rstrip("\n") for line in f]
    return np.array([t for t in tokens if t and not t.startswith(("##", "[")) and t.isalpha()])


def check(call, run, errors):
    """Runs `call` with `run(inputs) -> {name: np.ndarray}`; returns a failure message or None."""
    try:
        outputs = run(call.inputs)
    except errors as e:
        message = _message(e)
        if BOUND in message:
            return None
        if call.expect == GOOD:
            return f"a good call failed: {type(e).__name__}: {message[:300]}"
        invalid = type(e).__name__ in ("InvalidArgumentError", "TypeError", "ValueError")
        if not invalid:
            return f"not a clear error: {type(e).__name__}: {message[:300]}"
        if "rows" in call.why and "equal rows" not in str(e):
            return f"the error does not name the unequal rows: {message[:300]}"
        # TensorFlow's own dtype check, before the graph, names the input by position.
        named = [*call.inputs, "input #"] if "dtype" in call.why else list(call.inputs)
        if call.expect == BAD and not any(name in message for name in named):
            return f"the error names no input: {message[:300]}"
        return None
    if call.expect == BAD:
        return "a bad call was answered"
    rows = _rows(call.inputs)
    for name, value in outputs.items():
        if value.ndim and value.shape[0] != rows:
            return f"output {name} has {value.shape[0]} rows for {rows}"
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            return f"output {name} is not finite"
    if call.expect == GOOD and 2 <= rows <= max(ROW_COUNTS):
        for row in range(rows):
            alone = run({n: v if v.ndim == 0 else v[row : row + 1] for n, v in call.inputs.items()})
            for name, value in alone.items():
                # Only the numbers: ids and texts picked from near-equal scores may flip.
                if value.dtype.kind == "f" and not _same(value[0], outputs[name][row]):
                    return f"row {row} of {name} differs from its answer alone"
    return None


def _message(error):
    """An error's own words: TensorFlow's last line before the node and op it names."""
    lines = [line for line in str(error).splitlines() if line and not line[0].isspace()]
    lines = [line for line in lines if not line.startswith(("Detected at node", "Graph execution"))]
    return lines[-1] if lines else type(error).__name__


def _rows(inputs):
    return next(len(v) for v in inputs.values() if v.ndim)


def _same(alone, batched):
    """Whether a row's answer alone equals its row in the batch (which may pad it further)."""
    alone, batched = np.asarray(alone), np.asarray(batched)
    if alone.ndim:
        batched = batched[tuple(slice(0, size) for size in alone.shape)]
    return np.allclose(alone, batched, atol=1e-4)


def main(paths, seed, rounds):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the text ops, as an app does)

    rng = np.random.default_rng(seed)
    calls = failures = 0
    loaded = {name: tf.saved_model.load(path) for name, path in sorted(paths.items())}
    for _ in range(rounds):
        for name, model in loaded.items():
            vocab_file = model.assets.vocab_file.asset_path.numpy().decode()
            words = vocabulary_words(vocab_file)
            signatures = {k: signature_specs(f) for k, f in model.signatures.items()}
            vocab_size = len(open(vocab_file, encoding="utf-8").read().splitlines())
            for call in make_calls(rng, name, signatures, words, vocab_size, CALLS_PER_ROUND):
                print(json.dumps({"call": calls, **call.describe()}), flush=True)
                function = model.signatures[call.signature]

                def run(inputs, function=function):
                    # As tensors of their own dtype: TensorFlow would convert numpy's silently.
                    tensors = {k: tf.constant(v) for k, v in inputs.items()}
                    return {k: v.numpy() for k, v in function(**tensors).items()}

                failure = check(call, run, (tf.errors.OpError, TypeError, ValueError))
                print(json.dumps({"done": calls, "failure": failure}), flush=True)
                calls += 1
                failures += failure is not None
    print(json.dumps({"calls": calls, "failures": failures}), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
