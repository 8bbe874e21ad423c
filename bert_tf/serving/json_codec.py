"""TF Serving's REST JSON <-> numpy arrays and tf.Examples, following util/json_tensor.cc."""

import base64
import binascii
import json

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2

from bert_tf.serving import errors

# Deeper than any tensor a signature takes; JSON nested further is rejected before it is walked.
MAX_TENSOR_RANK = 32
_BYTES_SUFFIX = "_bytes"


def parse_json_body(body):
    """Decodes a request body as a UTF-8 JSON object; anything else is a 400."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise errors.invalid_argument(f"request body is not valid UTF-8 (byte {e.start})") from e
    try:
        value = json.loads(text)
    except RecursionError as e:
        raise errors.invalid_argument("JSON Parse error: the document nests too deeply") from e
    except ValueError as e:  # JSONDecodeError, and int() refusing a number with >4300 digits.
        raise errors.invalid_argument(f"JSON Parse error: {str(e)[:200]}") from e
    if not isinstance(value, dict):
        raise errors.invalid_argument(f"JSON Value: {errors.short(value)} Is not object")
    return value


def _is_b64_object(value):
    """True for TF Serving's binary string encoding {"b64": "..."}."""
    return isinstance(value, dict) and len(value) == 1 and "b64" in value


def _decode_b64(value, where):
    """The bytes of a {"b64": ...} object, or a 400."""
    encoded = value["b64"]
    if not isinstance(encoded, str):
        raise errors.invalid_argument(
            f"{where}: 'b64' value must be a string, got {errors.short(encoded)}"
        )
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as e:
        raise errors.invalid_argument(
            f"{where}: unable to base64 decode {errors.short(encoded)}"
        ) from e


def _string_leaf(value, where):
    """A JSON value for a DT_STRING element: a string (UTF-8 encoded) or {"b64": ...}."""
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as e:  # A lone surrogate written as a \uD800 escape.
            raise errors.invalid_argument(
                f"{where}: string is not valid Unicode (lone surrogate)"
            ) from e
    if _is_b64_object(value):
        return _decode_b64(value, where)
    raise errors.invalid_argument(
        f'{where}: expected a string or {{"b64": ...}} for DT_STRING, got {errors.short(value)}'
    )


def _leaf_converter(dtype):
    """A function checking and converting one JSON leaf to an element of `dtype`."""
    if dtype == tf.string:
        return _string_leaf
    if dtype == tf.bool:

        def to_bool(value, where):
            if not isinstance(value, bool):
                raise errors.invalid_argument(
                    f"{where}: expected true or false for DT_BOOL, got {errors.short(value)}"
                )
            return value

        return to_bool
    if dtype.is_integer:
        low, high = dtype.min, dtype.max

        def to_int(value, where):
            if isinstance(value, bool) or not isinstance(value, int):
                raise errors.invalid_argument(
                    f"{where}: expected an integer for {_dtype_name(dtype)}, got {errors.short(value)}"
                )
            if not low <= value <= high:
                raise errors.invalid_argument(
                    f"{where}: {errors.short(value)} is out of range for {_dtype_name(dtype)}"
                )
            return value

        return to_int
    if dtype.is_floating:

        def to_float(value, where):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise errors.invalid_argument(
                    f"{where}: expected a number for {_dtype_name(dtype)}, got {errors.short(value)}"
                )
            return float(value)

        return to_float
    return None


def _dtype_name(dtype):
    """TF Serving's spelling of a dtype, e.g. DT_STRING."""
    return types_pb2.DataType.Name(dtype.as_datatype_enum)


def json_to_array(value, spec, where):
    """Converts a JSON (nested list) value to a numpy array for `spec`, or raises a 400 saying why.

    Walks the nesting level by level, without recursion, so a deep document cannot exhaust the
    stack; it must be rectangular and no deeper than the spec's rank.
    """
    convert = _leaf_converter(spec.dtype)
    if convert is None:
        raise errors.invalid_argument(
            f"{where}: inputs of type {_dtype_name(spec.dtype)} are not supported"
        )
    max_rank = spec.shape.rank if spec.shape.rank is not None else MAX_TENSOR_RANK
    shape, level = [], [value]
    while level and isinstance(level[0], list):
        if len(shape) == max_rank:
            raise errors.invalid_argument(
                f"{where}: nested deeper than the expected rank {max_rank} (shape {spec.shape})"
            )
        length = len(level[0])
        for item in level:
            if not isinstance(item, list) or len(item) != length:
                raise errors.invalid_argument(
                    f"{where}: expecting a rectangular tensor; lists at depth "
                    f"{len(shape) + 1} differ in length or type"
                )
        shape.append(length)
        level = [element for item in level for element in item]
    for element in level:
        if isinstance(element, list):
            raise errors.invalid_argument(
                f"{where}: expecting a rectangular tensor; mixed lists and values"
            )
    leaves = [convert(element, where) for element in level]
    if spec.dtype == tf.string:
        array = np.empty(len(leaves), dtype=object)
        array[:] = leaves
    else:
        array = np.array(leaves, dtype=spec.dtype.as_numpy_dtype)
    array = array.reshape(shape)
    if not tf.TensorShape(shape).is_compatible_with(spec.shape):
        raise errors.invalid_argument(
            f"{where}: shape {list(shape)} does not match the signature's {_shape_text(spec.shape)}"
        )
    return array


def _shape_text(shape):
    """A TensorShape as [-1, 3] (TF Serving's unknown size is -1)."""
    if shape.rank is None:
        return "<unknown rank>"
    return "[" + ", ".join("-1" if d is None else str(d) for d in shape.as_list()) + "]"


def predict_inputs(request, signature):
    """The signature's inputs as numpy arrays from a predict request; also says row or columnar."""
    has_instances, has_inputs = "instances" in request, "inputs" in request
    if has_instances and has_inputs:
        raise errors.invalid_argument("Not expecting both 'inputs' and 'instances' keys to exist")
    if not (has_instances or has_inputs):
        raise errors.invalid_argument("Missing 'inputs' or 'instances' key")
    names = sorted(signature.inputs)
    if has_instances:
        format_, value = "row", request["instances"]
        if not isinstance(value, list):
            raise errors.invalid_argument("Expecting 'instances' to be an list/array")
        if not value:
            raise errors.invalid_argument("'instances' is an empty list/array")
        named = [isinstance(i, dict) and not _is_b64_object(i) for i in value]
        if any(named) and not all(named):
            raise errors.invalid_argument(
                "'instances' mixes objects and values; use one form for every instance"
            )
        is_named = all(named)
        if is_named:
            columns = {name: [] for name in names}
            for index, instance in enumerate(value):
                if set(instance) != set(names):
                    raise errors.invalid_argument(
                        f"instance {index} has keys {errors.short(sorted(instance))}, expecting the "
                        f"signature's inputs {names}"
                    )
                for name in names:
                    columns[name].append(instance[name])
        unnamed_error = f"Expecting object in 'instances' list: the signature has inputs {names}"
    else:
        format_, value = "columnar", request["inputs"]
        is_named = isinstance(value, dict) and not _is_b64_object(value)
        if is_named:
            # As json_tensor.cc: each of the signature's inputs is looked up; other keys are
            # ignored.
            missing = sorted(set(names) - set(value))
            if missing:
                # TF Serving's wording, the name unquoted (it is the signature's, not the client's).
                raise errors.invalid_argument(
                    f"Missing named input: {missing[0]} in 'inputs' object."
                )
            columns = {name: value[name] for name in names}
        unnamed_error = f"Expecting 'inputs' to be an object with the signature's inputs {names}"
    if not is_named:  # A bare value (or list of values) feeds a signature with one input.
        if len(names) != 1:
            raise errors.invalid_argument(unnamed_error)
        columns = {names[0]: value}
    arrays = {
        name: json_to_array(columns[name], signature.inputs[name], f"input {name!r}")
        for name in names
    }
    return arrays, format_


class FloatText(str):
    """A float's JSON text, written as it is (a number, not a string) by `dumps`."""


def format_float(value, dtype):
    """A float as TF Serving writes it (json_tensor.cc, WriteDecimal).

    Six significant digits (absl's StrCat) when they read back as the same value of `dtype`, else
    max_digits10 of it (9 for float32, 17 for float64); ".0" is added to a whole number not in
    exponent form, so that every float of a reply reads as a float. NaN and infinities are
    written as JSON's common extensions NaN, Infinity and -Infinity.
    """
    if value != value:
        return FloatText("NaN")
    if value in (float("inf"), float("-inf")):
        return FloatText("Infinity" if value > 0 else "-Infinity")
    text = "%.6g" % value
    if dtype(float(text)) != dtype(value):
        text = "%.*g" % (17 if dtype is np.float64 else 9, value)
    if "." not in text and "e" not in text:
        text += ".0"
    return FloatText(text)


def _floats_to_json(flat, dtype):
    """The JSON texts of a list of floats (float32 unless `dtype` is float64)."""
    dtype = np.float64 if dtype == np.float64 else np.float32
    return [format_float(value, dtype) for value in flat]


def dumps(value):
    """JSON text of a reply: dicts, lists, strings, ints, bools and FloatText (written as is)."""
    parts = []
    stack = [value]
    # An explicit stack instead of recursion: replies nest as deep as a model's outputs.
    while stack:
        item = stack.pop()
        if isinstance(item, FloatText):
            parts.append(item)
        elif isinstance(item, _Token):
            parts.append(item.text)
        elif isinstance(item, dict):
            stack.append(_Token("}"))
            entries = list(item.items())
            for index in range(len(entries) - 1, -1, -1):
                key, element = entries[index]
                stack.append(element)
                stack.append(_Token(("," if index else "") + json.dumps(str(key)) + ":"))
            stack.append(_Token("{"))
        elif isinstance(item, (list, tuple)):
            stack.append(_Token("]"))
            for index in range(len(item) - 1, -1, -1):
                stack.append(item[index])
                if index:
                    stack.append(_Token(","))
            stack.append(_Token("["))
        elif isinstance(item, float):
            parts.append(format_float(item, np.float64))
        else:
            parts.append(json.dumps(item))
    return "".join(parts)


class _Token:
    """Literal JSON punctuation on dumps's stack."""

    __slots__ = ("text",)

    def __init__(self, text):
        self.text = text


def array_to_json(array, name):
    """A numpy output as nested JSON lists; strings decode as UTF-8 unless the name ends in _bytes."""
    array = np.asarray(array)
    if array.dtype == object or array.dtype.kind in "SU":
        if name.endswith(_BYTES_SUFFIX):
            flat = [{"b64": base64.b64encode(v).decode("ascii")} for v in array.ravel().tolist()]
        else:
            flat = [
                v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)
                for v in array.ravel().tolist()
            ]
    elif array.dtype.kind == "f" or array.dtype == tf.bfloat16.as_numpy_dtype:
        wide = array if array.dtype == np.float64 else array.astype(np.float32)
        flat = _floats_to_json(wide.ravel().tolist(), wide.dtype)
    elif array.dtype.kind in "iub":
        flat = array.ravel().tolist()
    else:
        raise errors.internal(f"output {name!r} has dtype {array.dtype}, which JSON cannot carry")
    return _nest(flat, array.shape)


def _nest(flat, shape):
    """Rebuilds nested lists of `shape` from a flat list, without recursion."""
    if not shape:
        return flat[0]
    if 0 in shape:
        return np.zeros(shape, dtype=np.int8).tolist()  # Empty lists of the right nesting.
    for size in reversed(shape[1:]):
        flat = [flat[i : i + size] for i in range(0, len(flat), size)]
    return flat


def predict_response(outputs, format_):
    """TF Serving's predict reply: {"predictions": ...} for row requests, {"outputs": ...} for columnar."""
    names = sorted(outputs)
    if format_ == "columnar":
        if len(names) == 1:
            return {"outputs": array_to_json(outputs[names[0]], names[0])}
        return {"outputs": {name: array_to_json(outputs[name], name) for name in names}}
    batch = None
    for name in names:
        shape = np.shape(outputs[name])
        if not shape:
            raise errors.invalid_argument(
                f"Tensor name: {name} has no shape information; use the 'inputs' (columnar) format"
            )
        if shape[0] < 1:
            raise errors.invalid_argument(f"Tensor name: {name} has invalid batch size: {shape[0]}")
        if batch is not None and shape[0] != batch:
            raise errors.invalid_argument(
                f"Tensor name: {name} has inconsistent batch size: {shape[0]} expecting: {batch}"
            )
        batch = shape[0]
    columns = {name: array_to_json(outputs[name], name) for name in names}
    if len(names) == 1:
        return {"predictions": columns[names[0]]}
    return {"predictions": [{name: columns[name][row] for name in names} for row in range(batch)]}


def _feature_from_json(value, name):
    """A tf.train.Feature from a JSON value or list: strings -> bytes, ints/bools -> int64, floats -> float."""
    values = value if isinstance(value, list) else [value]
    kind, items, where = None, [], f"Feature: {name}"
    for element in values:
        if isinstance(element, bool):
            element_kind, item = "int64", int(element)
        elif isinstance(element, int):
            if not -(1 << 63) <= element < (1 << 63):
                raise errors.invalid_argument(
                    f"{where} has element {errors.short(element)} out of int64 range"
                )
            element_kind, item = "int64", element
        elif isinstance(element, float):
            element_kind, item = "float", element
        elif isinstance(element, str) or _is_b64_object(element):
            element_kind, item = "bytes", _string_leaf(element, where)
        else:
            raise errors.invalid_argument(
                f"{where} has element with unexpected JSON type: {errors.short(element)}"
            )
        if kind is not None and element_kind != kind:
            raise errors.invalid_argument(
                f"Unexpected element type in feature: {name} expecting type: {kind}"
            )
        kind = element_kind
        items.append(item)
    if kind == "bytes":
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=items))
    if kind == "int64":
        return tf.train.Feature(int64_list=tf.train.Int64List(value=items))
    if kind == "float":
        return tf.train.Feature(float_list=tf.train.FloatList(value=items))
    return tf.train.Feature()


def examples_from_request(request):
    """Serialized tf.Examples from a classify/regress request, each with the context features
    merged in."""
    context = request.get("context", {})
    if not isinstance(context, dict):
        raise errors.invalid_argument(
            f"Example must be JSON object but got JSON {errors.short(context)}"
        )
    context_features = {name: _feature_from_json(value, name) for name, value in context.items()}
    if "examples" not in request:
        raise errors.invalid_argument("key 'examples' is expected and was not found")
    examples = request["examples"]
    if not isinstance(examples, list):
        raise errors.invalid_argument("Expecting 'examples' value to be an list/array")
    if not examples:
        raise errors.invalid_argument("'examples' value is an empty array")
    serialized = []
    for index, example in enumerate(examples):
        if not isinstance(example, dict):
            raise errors.invalid_argument(
                f"Example {index} must be JSON object but got JSON {errors.short(example)}"
            )
        both = sorted(set(example) & set(context_features))
        if both:
            raise errors.invalid_argument(
                f"Example {index}: feature(s) {errors.short(both)} also appear in 'context'"
            )
        features = dict(context_features)
        features.update({name: _feature_from_json(value, name) for name, value in example.items()})
        serialized.append(
            tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()
        )
    return serialized


def classify_response(classes, scores):
    """TF Serving's classify reply: {"results": [[[label, score], ...], ...]}."""
    reference = classes if classes is not None else scores
    batch, num_classes = np.shape(reference)
    results = []
    for row in range(batch):
        labels = (
            [c.decode("utf-8", errors="replace") for c in classes[row].tolist()]
            if classes is not None
            else [""] * num_classes
        )
        values = (
            _floats_to_json(scores[row].tolist(), np.float32)
            if scores is not None
            else [FloatText("0.0")] * num_classes
        )
        results.append([[label, score] for label, score in zip(labels, values)])
    return {"results": results}


def regress_response(values):
    """TF Serving's regress reply: {"results": [v, ...]}."""
    return {"results": _floats_to_json(values.tolist(), np.float32)}
