"""Seeded fuzzing of bert_tf.serve over real HTTP: malformed requests get a 4xx JSON error, and good
requests interleaved with them keep succeeding.

Every malformed request is malformed by construction (a truncated object, an invalid UTF-8 byte,
a wrong type, an unknown name, ...), so the expected outcome never depends on chance.
"""

import base64
import http.client
import json
import random

import pytest
import tensorflow as tf
from helpers_serve import build_test_exports, make_base, model_server

SEED = 20240607
NUM_MALFORMED = 1000
GOOD_EVERY = 20
LIMIT = 256 << 10


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory, real_vocab):
    exports = build_test_exports(tmp_path_factory, real_vocab)
    base = make_base(tmp_path_factory.mktemp("fuzz"), exports)
    with model_server(
        {"clf": base}, port=0, poll_seconds=0, max_request_bytes=LIMIT, warmup=False
    ) as server:
        yield server, tf.saved_model.load(exports["v1"])


def _random_text(rng, max_len=30):
    alphabet = "abcdefghijklmnopqrstuvwxyz ÄéßЖ中😀!?.,'\"\\\t\n"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, max_len)))


def _json(value):
    return json.dumps(value).encode("utf-8")


def _deep(rng):
    depth = rng.choice([1000, 5000, 10000, 30000])  # All under the body limit.
    opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
    nested = opener * depth + "1" + closer * depth
    return rng.choice(
        [nested, '{"instances": [' + nested + "]}", '{"inputs": {"text": ' + nested + "}}"]
    )


def _good_body(rng):
    """A random valid predict body for serving_default and the texts it sends."""
    texts = [_random_text(rng) for _ in range(rng.randint(1, 4))]
    form = rng.choice(["instances", "objects", "inputs", "b64"])
    if form == "instances":
        return {"instances": texts}, texts
    if form == "objects":
        return {"instances": [{"text": t} for t in texts]}, texts
    if form == "b64":
        return {"instances": [{"b64": base64.b64encode(t.encode()).decode()} for t in texts]}, texts
    return {"inputs": {"text": texts}}, texts


WRONG_VALUES = [
    None,
    True,
    1,
    -3.5,
    1e308,
    "",
    "x",
    [],
    {},
    [[]],
    [None],
    [1, "a"],
    {"b64": 5},
    {"b64": "!!"},
    {"x": 1},
    [[1, 2], [3]],
    [{"text": 1}],
]


def malformed_request(rng):
    """(method, path, body bytes or None, announced Content-Length or None, allowed statuses)."""
    kind = rng.randrange(14)
    predict = "/v1/models/clf:predict"
    valid = _json(_good_body(rng)[0])
    if kind == 0:  # Bad JSON: a strict prefix of a valid object, or junk.
        cut = rng.randrange(0, len(valid) - 1)
        junk = rng.choice(
            [
                valid[:cut],
                b"{'instances': ['a']}",
                b"nul",
                b'{"instances": [1,]}',
                b'{"instances" ["a"]}',
                b"\x00\x01",
                b"{" * 3,
                b'"just a string"',
                b"[]",
                b"42",
            ]
        )
        return "POST", predict, junk, None, {400}
    if kind == 1:  # Invalid UTF-8 somewhere in an otherwise valid body.
        position = rng.randrange(0, len(valid) + 1)
        bad = bytes([rng.choice([0x80, 0xBF, 0xC0, 0xC1, 0xF5, 0xFF, 0xE2])])
        if bad == b"\xe2":  # A truncated three-byte sequence.
            bad = b"\xe2\x82"
        body = valid[:position] + bad + valid[position:]
        return "POST", predict, body, None, {400}
    if kind == 2:  # Wrong types for the top-level keys and for instance values.
        key = rng.choice(["instances", "inputs", "signature_name"])
        value = rng.choice(WRONG_VALUES)
        if key == "signature_name":
            body = {
                "signature_name": value if not isinstance(value, str) else 7,
                "instances": ["a"],
            }
        elif key == "inputs":
            # (An empty list is a valid empty batch, so it is not among these.)
            body = {
                "inputs": {"text": rng.choice([v for v in WRONG_VALUES if v not in ("", "x", [])])}
            }
        else:
            body = {"instances": rng.choice([value, [value], [value, "ok"]])}
            if body["instances"] in ("", "x", ["", "ok"], ["x", "ok"], [""], ["x"]):
                body = {"instances": {"text": "not a list"}}
        return "POST", predict, _json(body), None, {400}
    if kind == 3:  # Missing keys.
        body = rng.choice(
            [{}, {"signature_name": "serving_default"}, {"instance": ["a"]}, {"input": ["a"]}]
        )
        return "POST", predict, _json(body), None, {400}
    if kind == 4:  # Both instances and inputs.
        return "POST", predict, _json({"instances": ["a"], "inputs": ["a"]}), None, {400}
    if kind == 5:  # Unknown signature, model, version, verb or path.
        return rng.choice(
            [
                (
                    "POST",
                    predict,
                    _json({"signature_name": _random_text(rng) + "#", "instances": ["a"]}),
                    None,
                    {400},
                ),
                ("POST", f"/v1/models/m{rng.randrange(1000)}:predict", valid, None, {404}),
                (
                    "POST",
                    f"/v1/models/clf/versions/{rng.randrange(2, 10**6)}:predict",
                    valid,
                    None,
                    {404},
                ),
                (
                    "POST",
                    "/v1/models/clf:" + rng.choice(["explain", "", "predict/x", "Predict"]),
                    valid,
                    None,
                    {400},
                ),
                (
                    "GET",
                    rng.choice(
                        [
                            "/",
                            "/v1",
                            "/v1/models",
                            "/v2/models/clf",
                            "/v1/models/clf/labels/",
                            "/static/../../etc/passwd",
                            "/v1/models/clf/versions/",
                            "/%ff%fe",
                        ]
                    ),
                    None,
                    None,
                    {400, 404},
                ),
            ]
        )
    if kind == 6:  # Bodies over the limit: announced (and partly sent), or really sent.
        if rng.random() < 0.5:
            return (
                "POST",
                predict,
                b'{"instances": ["' + b"a" * 1000,
                rng.randint(LIMIT + 1, 1 << 40),
                {413},
            )
        return "POST", predict, b" " * rng.randint(LIMIT + 1, LIMIT + 4096), None, {413}
    if kind == 7:  # Deep nesting.
        return "POST", predict, _deep(rng).encode(), None, {400}
    if kind == 8:  # Wrong input names.
        name = rng.choice(["txt", "Text", "text_a", "inputs", ""])
        body = rng.choice(
            [
                {"instances": [{name: "a"}]},
                {"inputs": {name: ["a"]}},
                {"instances": [{"text": "a", name: "b"}]},
            ]
        )
        return "POST", predict, _json(body), None, {400}
    if kind == 9:  # Wrong values for the numeric and pair signatures.
        body = rng.choice(
            [
                {
                    "signature_name": "scale",
                    "inputs": {"x": [[1, 2]], "n": [rng.choice([1.5, "1", True, None, 1 << 40])]},
                },
                {"signature_name": "scale", "inputs": {"x": [[1, 2, 3]], "n": [1]}},
                {"signature_name": "scale", "inputs": {"x": [[1, "2"]], "n": [1]}},
                {"signature_name": "scale", "inputs": {"x": [[1, 2]], "n": [-rng.randint(1, 9)]}},
                {"signature_name": "scale", "instances": [1, 2]},
                {"signature_name": "pair", "instances": ["a", "b"]},
                {"signature_name": "pair", "instances": [{"text_a": "a"}]},
            ]
        )
        return "POST", predict, _json(body), None, {400}
    if kind == 10:  # Malformed classify and regress requests.
        verb, signature = rng.choice([("classify", "classification"), ("regress", "regression")])
        body = rng.choice(
            [
                {"signature_name": signature},
                {"signature_name": signature, "examples": rng.choice([{}, "x", 1, None, []])},
                {"signature_name": signature, "examples": [rng.choice([1, "x", None, [], [{}]])]},
                {
                    "signature_name": signature,
                    "examples": [{"text": rng.choice([None, [[1]], {"a": 1}, [1, "a"], [1.5, 2]])}],
                },
                {
                    "signature_name": signature,
                    "context": rng.choice([[], "x", 3]),
                    "examples": [{"text": "a"}],
                },
                {
                    "signature_name": signature,
                    "context": {"text": "a"},
                    "examples": [{"text": "b"}],
                },
                {"signature_name": signature, "examples": [{"other": "a"}]},
                {"signature_name": "serving_default", "examples": [{"text": "a"}]},
                {"signature_name": signature, "examples": [{"text": {"b64": "%%%"}}]},
            ]
        )
        return "POST", f"/v1/models/clf:{verb}", _json(body), None, {400}
    if kind == 11:  # Numbers JSON or Python cannot take.
        body = rng.choice(
            [
                b'{"instances": [' + b"9" * 5000 + b"]}",
                b'{"signature_name": "scale", "inputs": {"x": [[1e999, 2]], "n": [1e999]}}',
                b'{"instances": [NaN]}',
                b'{"instances": ["\\ud83d"]}',
            ]
        )
        return "POST", predict, body, None, {400}
    if kind == 12:  # Wrong methods: "Malformed request", as TF Serving words it.
        return rng.choice(
            [
                ("PUT", predict, valid, None, {400}),
                ("DELETE", "/v1/models/clf", None, None, {400}),
                ("GET", predict, None, None, {400}),
                ("POST", "/v1/models/clf/metadata", valid, None, {400}),
                ("PATCH", "/v1/models/clf", b"{}", None, {400}),
            ]
        )
    # Random bytes that are not JSON at all (never start with '{', so never an object).
    junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 200)))
    return "POST", predict, b"x" + junk, None, {400}


def _send(connection, method, path, body, announced):
    """Sends one request on a keep-alive connection; returns (status, headers, raw body)."""
    if announced is None:
        connection.request(method, path, body=body)
    else:
        connection.putrequest(method, path)
        connection.putheader("Content-Length", str(announced))
        connection.endheaders()
        connection.send(body)
    response = connection.getresponse()
    return response.status, response.getheader("Content-Type"), response.read()


@pytest.mark.slow
def test_malformed_requests_get_4xx_json_and_good_ones_keep_working(fuzz_server):
    server, direct = fuzz_server
    rng = random.Random(SEED)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    seen_statuses, good = {}, 0
    try:
        for index in range(NUM_MALFORMED):
            method, path, body, announced, allowed = malformed_request(rng)
            status, content_type, raw = _send(connection, method, path, body, announced)
            context = f"request {index}: {method} {path} {(body or b'')[:120]!r} -> {status} {raw[:200]!r}"
            assert status in allowed, context
            assert content_type == "application/json", context
            reply = json.loads(raw)
            assert (
                list(reply) == ["error"] and isinstance(reply["error"], str) and reply["error"]
            ), context
            assert "Traceback" not in reply["error"], context
            seen_statuses[status] = seen_statuses.get(status, 0) + 1
            if status == 413:  # The server closed this connection; http.client reconnects.
                connection.close()
            if index % GOOD_EVERY == 0:
                request, texts = _good_body(rng)
                status, _, raw = _send(
                    connection, "POST", "/v1/models/clf:predict", _json(request), None
                )
                assert status == 200, (index, raw[:300])
                reply = json.loads(raw)
                rows = (
                    reply["predictions"]
                    if "predictions" in reply
                    else [
                        dict(zip(reply["outputs"], values))
                        for values in zip(*reply["outputs"].values())
                    ]
                )
                expected = direct.signatures["serving_default"](text=tf.constant(texts))[
                    "label"
                ].numpy()
                assert [row["label"] for row in rows] == [label.decode() for label in expected]
                good += 1
    finally:
        connection.close()
    assert sum(seen_statuses.values()) == NUM_MALFORMED
    assert set(seen_statuses) == {400, 404, 413}, seen_statuses
    assert good >= NUM_MALFORMED // GOOD_EVERY
