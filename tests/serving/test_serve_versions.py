"""Version policies, version labels and config reloads of bert_tf.serving, on real SavedModels over
REST (and gRPC for labels) on 127.0.0.1.

The references are TF Serving's sources: file_system_storage_path_source.cc (which versions a
policy serves), availability_preserving_policy.cc (load before unload), server_core.cc
(ReloadConfig, version labels and their errors), get_model_status_impl.cc and server.cc
(PollFilesystemAndReloadConfig).
"""

import http.client
import json
import logging
import os
import shutil
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from helpers_serve import LABELS, V2_LABELS, make_base, model_server
from tensorflow_serving.apis import (
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)
from tensorflow_serving.config import model_server_config_pb2

from bert_tf.serving import config, core, errors, methods, server, versions

# Minutes on CI's 2 cores: left out of `make test-fast` (see the Makefile).
pytestmark = pytest.mark.slow

TEXTS = ["a wonderful film", "the plot was dull and slow"]


def rest(port, method, path, body=None, connection=None):
    """One REST request; returns (status, parsed JSON reply)."""
    own = connection is None
    connection = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(method, path, body=None if body is None else json.dumps(body))
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        if own:
            connection.close()


def predict(port, path, connection=None):
    """POSTs TEXTS to a :predict path; returns (status, reply)."""
    return rest(port, "POST", path + ":predict", {"instances": TEXTS}, connection)


def predicted_labels(port, path):
    """The set of label names a :predict path answers with (LABELS: v1, V2_LABELS: v2)."""
    status, reply = predict(port, path)
    assert status == 200, reply
    return {p["label"] for p in reply["predictions"]}


def states(port, name, suffix=""):
    """{version: state} from GET /v1/models/NAME[suffix]."""
    status, reply = rest(port, "GET", f"/v1/models/{name}{suffix}")
    assert status == 200, reply
    return {int(s["version"]): s["state"] for s in reply["model_version_status"]}


def model(name, base_path, latest=None, all_versions=False, specific=(), labels=None):
    """A ModelConfig with the given version policy (none: TF Serving's default, latest 1)."""
    result = model_server_config_pb2.ModelConfig(
        name=name, base_path=base_path, model_platform="tensorflow"
    )
    policy = result.model_version_policy
    if latest is not None:
        policy.latest.num_versions = latest
    elif all_versions:
        policy.all.SetInParent()
    elif specific:
        policy.specific.versions.extend(specific)
    for label, version in (labels or {}).items():
        result.version_labels[label] = version
    return result


def server_config(*models):
    """A ModelServerConfig listing `models`."""
    result = model_server_config_pb2.ModelServerConfig()
    result.model_config_list.config.extend(models)
    return result


def wait_for(condition, seconds):
    """Polls `condition` every 50 ms for at most `seconds`; returns its last value."""
    deadline = time.monotonic() + seconds
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def add_version(base, version, export):
    """Copies an export in as BASE/<version> (file by file, not atomically)."""
    shutil.copytree(export, os.path.join(base, str(version)))


def base_in(directory, exports, versions):
    """make_base in a new directory of its own (several bases per test)."""
    directory.mkdir()
    return make_base(directory, exports, versions)


def broken_version(base, version):
    """Puts a version whose saved_model.pb is not a protobuf under base (atomically)."""
    staging = os.path.join(os.path.dirname(base), f"broken-{version}")
    os.makedirs(staging)
    with open(os.path.join(staging, "saved_model.pb"), "wb") as f:
        f.write(b"not a protobuf")
    os.rename(staging, os.path.join(base, str(version)))


@pytest.fixture(scope="module")
def three_versions(tmp_path_factory, exports):
    """A base path with versions 1 and 2 (v1's labels) and 3 (v2's upper-case labels)."""
    base = make_base(tmp_path_factory.mktemp("three"), exports, versions=(1, 2))
    add_version(base, 3, exports["v2"])
    return base


def policies_config(base):
    """Three models on one base path: latest {2}, all, and specific {1, 5} (5 does not exist)."""
    return server_config(
        model("latest2", base, latest=2),
        model("every", base, all_versions=True),
        model("pinned", base, specific=(1, 5)),
    )


@pytest.fixture(scope="module")
def policies(three_versions):
    """A server of policies_config, with gRPC."""
    with model_server(
        policies_config(three_versions), port=0, grpc_port=0, warmup=False
    ) as running:
        yield running


# ----------------------------------------------------------------------------------------------
# The rules on their own
# ----------------------------------------------------------------------------------------------


def test_policies_aspire_the_versions_tf_serving_does():
    on_disk = {1, 2, 3, 7}
    policy = model_server_config_pb2.ModelConfig().model_version_policy
    assert versions.aspired_versions(policy, on_disk) == {7}  # No policy: latest 1.
    policy.latest.num_versions = 0  # max(num_versions, 1)
    assert versions.aspired_versions(policy, on_disk) == {7}
    policy.latest.num_versions = 2
    assert versions.aspired_versions(policy, on_disk) == {3, 7}
    policy.latest.num_versions = 10
    assert versions.aspired_versions(policy, on_disk) == on_disk
    policy.all.SetInParent()
    assert versions.aspired_versions(policy, on_disk) == on_disk
    policy.specific.versions.extend([2, 7, 9])  # 9 is not on disk: only warned about.
    assert versions.aspired_versions(policy, on_disk) == {2, 7}
    assert versions.aspired_versions(policy, set()) == set()


def test_label_rules_are_tf_serving_s():
    config_ = model("clf", "/models/clf", labels={"stable": 1, "canary": 2})
    available_1 = {1: ("AVAILABLE", "OK", ""), 2: ("LOADING", "OK", "")}
    with pytest.raises(errors.ServingError) as refused:
        versions.version_label_map(config_, available_1, {})
    assert refused.value.code == "FAILED_PRECONDITION"
    assert refused.value.message == (
        "Request to assign label to version 2 of model clf, which is not currently available "
        "for inference"
    )
    both = {1: ("AVAILABLE", "OK", ""), 2: ("AVAILABLE", "OK", "")}
    assert versions.version_label_map(config_, both, {}) == {"stable": 1, "canary": 2}
    # --allow_version_labels_for_unavailable_models: new labels, or labels that keep their
    # version, may name any version; moving a label needs an available version.
    assert versions.version_label_map(config_, {}, {}, True) == {"stable": 1, "canary": 2}
    assert versions.version_label_map(config_, {}, {"canary": 2}, True)["canary"] == 2
    with pytest.raises(errors.ServingError, match="label to version 2 of model clf"):
        versions.version_label_map(config_, available_1, {"canary": 1}, True)


def test_first_config_labels_and_refused_reloads(tmp_path):
    base = str(tmp_path)
    labelled = server_config(model("clf", base, labels={"stable": 1}))
    # At startup no version is available, so TF Serving refuses any label without the flag.
    with pytest.raises(config.ModelConfigError, match="Request to assign label to version 1"):
        core.ServerCore(labelled, core.CoreOptions(warmup=False))
    options = core.CoreOptions(warmup=False, allow_version_labels_for_unavailable_models=True)
    server_core = core.ServerCore(labelled, options)
    with pytest.raises(errors.ServingError) as caught:
        server_core.servable("clf", label="stable")
    assert (caught.value.code, caught.value.message) == (
        "NOT_FOUND",
        "Servable not found for request: Specific(clf, 1)",
    )
    for name in ("clf", "unknown"):  # A label is resolved before the model is looked for.
        with pytest.raises(errors.ServingError) as caught:
            server_core.servable(name, label="nope")
        assert (caught.value.code, caught.value.message) == (
            "INVALID_ARGUMENT",
            "Unrecognized servable version label: nope",
        )
    # Refused reloads change nothing: moving the existing label to a version that is not
    # available (even with the flag), leaving model_config_list, a model listed twice.
    before = server_core.config
    custom = model_server_config_pb2.ModelServerConfig()
    custom.custom_model_config.SetInParent()
    refused = [
        ("FAILED_PRECONDITION", server_config(model("clf", base, labels={"stable": 2}))),
        ("FAILED_PRECONDITION", custom),
        ("FAILED_PRECONDITION", model_server_config_pb2.ModelServerConfig()),
        ("INVALID_ARGUMENT", server_config(model("clf", base), model("clf", base))),
    ]
    for code, new_config in refused:
        with pytest.raises(errors.ServingError) as caught:
            server_core.reload_config(new_config)
        assert caught.value.code == code, caught.value.message
        assert server_core.config == before
    assert "Illegal to list model clf multiple times in config list" in caught.value.message
    assert server_core.managers["clf"].labels == {"stable": 1}


# ----------------------------------------------------------------------------------------------
# Policies and labels on a running server
# ----------------------------------------------------------------------------------------------


def test_each_policy_serves_its_versions(policies):
    port = policies.port
    expected = {"latest2": [3, 2], "every": [3, 2, 1], "pinned": [1]}
    for name, served in expected.items():
        assert states(port, name) == dict.fromkeys(served, "AVAILABLE"), name
        for version in served:
            path = f"/v1/models/{name}/versions/{version}"
            assert predicted_labels(port, path) <= set(V2_LABELS if version == 3 else LABELS)
            status, reply = rest(port, "GET", path + "/metadata")
            assert status == 200 and reply["model_spec"]["version"] == str(version)
        assert states(port, name, f"/versions/{served[0]}") == {served[0]: "AVAILABLE"}
    # Latest is the highest available version.
    assert predicted_labels(port, "/v1/models/pinned") <= set(LABELS)
    assert predicted_labels(port, "/v1/models/every") <= set(V2_LABELS)
    status, reply = predict(port, "/v1/models/latest2/versions/1")
    assert status == 404
    assert reply["error"] == "Servable not found for request: Specific(latest2, 1)"
    status, reply = rest(port, "GET", "/v1/models/pinned/versions/5")
    assert status == 404 and reply["error"] == "Could not find version 5 of model pinned"


def test_labels_on_rest_and_grpc(policies, three_versions):
    port, server_core = policies.port, policies.core
    labelled = policies_config(three_versions)
    labelled.model_config_list.config[1].version_labels.update({"stable": 1, "canary": 3})
    server_core.reload_config(labelled)
    try:
        assert predicted_labels(port, "/v1/models/every/labels/stable") <= set(LABELS)
        assert predicted_labels(port, "/v1/models/every/labels/canary") <= set(V2_LABELS)
        status, reply = rest(port, "GET", "/v1/models/every/labels/canary/metadata")
        assert status == 200 and reply["model_spec"]["version"] == "3"
        # GetModelStatus does not look at a label: every version of the model.
        assert states(port, "every", "/labels/canary") == states(port, "every")
        status, reply = predict(port, "/v1/models/every/labels/nope")
        assert status == 400
        assert reply["error"] == "Unrecognized servable version label: nope"

        with grpc.insecure_channel(f"127.0.0.1:{policies.grpc_port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "every"
            request.model_spec.version_label = "stable"
            request.inputs["text"].CopyFrom(tf.make_tensor_proto(np.array([b"fine"])))
            response = stub.Predict(request, timeout=60)
            assert response.model_spec.version.value == 1
            assert response.outputs["label"].string_val[0].decode() in LABELS
            request.model_spec.version_label = "nope"
            with pytest.raises(grpc.RpcError) as caught:
                stub.Predict(request, timeout=60)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert caught.value.details() == "Unrecognized servable version label: nope"

        # A label naming a version that is not available is refused, and nothing changes; the
        # gRPC reload answers with the same code and message.
        refused = policies_config(three_versions)
        refused.model_config_list.config[0].version_labels["old"] = 1
        message = (
            "Request to assign label to version 1 of model latest2, which is not currently "
            "available for inference"
        )
        with pytest.raises(errors.ServingError) as caught:
            server_core.reload_config(refused)
        assert (caught.value.code, caught.value.message) == ("FAILED_PRECONDITION", message)
        with grpc.insecure_channel(f"127.0.0.1:{policies.grpc_port}") as channel:
            stub = model_service_pb2_grpc.ModelServiceStub(channel)
            request = model_management_pb2.ReloadConfigRequest(config=refused)
            with pytest.raises(grpc.RpcError) as caught:
                stub.HandleReloadConfigRequest(request, timeout=60)
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert caught.value.details() == message
        assert server_core.config == labelled
        assert predicted_labels(port, "/v1/models/every/labels/canary") <= set(V2_LABELS)
    finally:
        server_core.reload_config(policies_config(three_versions))
    assert predict(port, "/v1/models/every/labels/canary")[0] == 400


# ----------------------------------------------------------------------------------------------
# Reloading the config
# ----------------------------------------------------------------------------------------------


def test_reload_adds_removes_and_reversions_models(tmp_path, exports):
    base = base_in(tmp_path / "a", exports, versions=(1, 2))
    other_base = base_in(tmp_path / "b", exports, versions=(7,))
    loaded = []
    with model_server(
        server_config(model("clf", base, specific=(1,))),
        port=0,
        warmup=False,
        on_loaded=lambda name, version: loaded.append((name, version)),
    ) as running:
        port, server_core = running.port, running.core
        old = server_core.servable("clf")
        # Re-versioned and added.
        server_core.reload_config(
            server_config(model("clf", base, specific=(2,)), model("other", base))
        )
        assert sorted(loaded) == [("clf", 1), ("clf", 2), ("other", 2)]
        assert states(port, "clf") == {2: "AVAILABLE", 1: "END"}
        assert states(port, "other") == {2: "AVAILABLE"}
        assert predict(port, "/v1/models/clf/versions/1")[0] == 404
        # A request that had version 1 finishes on it after it is unloaded.
        signature = methods.predict_signature(old, "serving_default")
        outputs = methods.predict(
            old, signature, {"text": np.array([b"still here"], dtype=object)}, core.CoreOptions()
        )
        assert outputs["label"][0].decode() in LABELS

        # Removed: later requests are NOT_FOUND; its versions' states stay readable.
        server_core.reload_config(server_config(model("other", base)))
        status, reply = predict(port, "/v1/models/clf")
        assert status == 404 and reply["error"] == "Servable not found for request: Latest(clf)"
        assert states(port, "clf") == {2: "END", 1: "END"}
        assert predict(port, "/v1/models/other")[0] == 200

        # Added back from another base path.
        server_core.reload_config(server_config(model("other", base), model("clf", other_base)))
        assert states(port, "clf") == {7: "AVAILABLE", 2: "END", 1: "END"}
        assert predict(port, "/v1/models/clf")[0] == 200

        # A new model none of whose versions loads: the config is applied, and the reload says
        # so as TF Serving's WaitUntilModelsAvailable does.
        broken_base = str(tmp_path / "broken")
        os.makedirs(broken_base)
        broken_version(broken_base, 3)
        with_broken = server_config(
            model("other", base), model("clf", other_base), model("broken", broken_base)
        )
        with pytest.raises(errors.ServingError) as caught:
            server_core.reload_config(with_broken)
        assert caught.value.code == "UNKNOWN"
        assert caught.value.message.startswith(
            "1 model(s) did not become available: {{{name: broken version: 3} due to error: "
            "UNKNOWN: "
        )
        assert server_core.config == with_broken
        assert (
            rest(port, "GET", "/v1/models/broken")[1]["model_version_status"][0]["status"][
                "error_code"
            ]
            == "UNKNOWN"
        )
        assert predict(port, "/v1/models/clf")[0] == 200


def test_config_file_poll_applies_edits_and_ignores_broken_files(tmp_path, exports, caplog):
    caplog.set_level(logging.INFO)
    base = make_base(tmp_path, exports, versions=(1, 2))
    path = tmp_path / "models.config"

    def write(text, whole=False):
        # Atomically, so a poll never reads half a file.
        staging = tmp_path / "models.config.new"
        staging.write_text(text if whole else f"model_config_list {{\n{text}\n}}\n")
        os.replace(staging, path)

    write(f'config {{ name: "clf" base_path: "{base}" model_platform: "tensorflow" }}')
    options = server.ServerOptions(
        rest_api_port=0,
        file_system_poll_wait_seconds=0,
        model_config_file=str(path),
        model_config_file_poll_wait_seconds=0.1,
    )
    with server.ModelServer(
        config.read_model_config_file(str(path)), options, core.CoreOptions(warmup=False)
    ) as running:
        port = running.port
        assert states(port, "clf") == {2: "AVAILABLE"}
        write(
            f'config {{ name: "clf" base_path: "{base}" model_platform: "tensorflow"\n'
            "  model_version_policy { all {} }\n"
            '  version_labels { key: "stable" value: 2 } }'
        )
        assert wait_for(lambda: states(port, "clf") == {2: "AVAILABLE", 1: "AVAILABLE"}, 30)
        assert predict(port, "/v1/models/clf/labels/stable")[0] == 200
        applied = running.core.config

        # A file that does not parse is logged, and the served config stays.
        write('model_config_list { config { name: "clf" base_path: ', whole=True)
        assert wait_for(
            lambda: any(
                "Failed to read ModelServerConfig" in r.getMessage() for r in caplog.records
            ),
            10,
        )
        # So does a config ServerCore refuses (a label naming no available version).
        write(
            f'config {{ name: "clf" base_path: "{base}" model_platform: "tensorflow"\n'
            '  version_labels { key: "next" value: 9 } }'
        )
        assert wait_for(
            lambda: any(
                "Request to assign label to version 9 of model clf" in r.getMessage()
                for r in caplog.records
            ),
            10,
        )
        assert running.core.config == applied
        assert predict(port, "/v1/models/clf/versions/1")[0] == 200

        # A model added, the label gone, the policy back to latest.
        write(
            f'config {{ name: "clf" base_path: "{base}" model_platform: "tensorflow" }}\n'
            f'config {{ name: "again" base_path: "{base}" model_platform: "tensorflow" }}'
        )
        assert wait_for(lambda: predict(port, "/v1/models/again")[0] == 200, 30)
        assert wait_for(lambda: states(port, "clf") == {2: "AVAILABLE", 1: "END"}, 10)
        assert predict(port, "/v1/models/clf/labels/stable")[0] == 400


# ----------------------------------------------------------------------------------------------
# No request fails while the config and the versions change underneath
# ----------------------------------------------------------------------------------------------


def test_no_request_fails_while_versions_and_config_change(tmp_path, exports):
    base = base_in(tmp_path / "a", exports, versions=(1,))
    other_base = base_in(tmp_path / "b", exports, versions=(1,))
    with model_server(
        server_config(model("clf", base)), port=0, poll_seconds=0.1, warmup=False
    ) as running:
        port, server_core = running.port, running.core
        stop, replies, failures = threading.Event(), [], []

        def client():
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            while not stop.is_set():
                try:
                    status, reply = predict(port, "/v1/models/clf", connection)
                    if status == 200 and len(reply["predictions"]) == len(TEXTS):
                        replies.append({p["label"] for p in reply["predictions"]})
                    else:
                        failures.append(reply)
                except Exception as e:  # A dropped connection is a failure too.
                    failures.append(repr(e))
                    connection.close()
                    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                time.sleep(0.02)  # Leave some CPU to the versions being loaded.
            connection.close()

        # Four clients keep requests in flight through every change; more only slowed the loads
        # they wait for (118 s with 16 on CI's 2 cores).
        clients = [threading.Thread(target=client) for _ in range(4)]
        for thread in clients:
            thread.start()
        try:
            # A new version copied in: it loads, then the old one unloads.
            add_version(base, 2, exports["v2"])
            # Loads here compete with the clients and, under xdist, another test file for 2 cores:
            # the waits are generous (they end as soon as the state is reached).
            assert wait_for(lambda: states(port, "clf") == {2: "AVAILABLE", 1: "END"}, 120)
            # All versions, and a second model.
            server_core.reload_config(
                server_config(model("clf", base, all_versions=True), model("other", other_base))
            )
            assert states(port, "clf") == {2: "AVAILABLE", 1: "AVAILABLE"}
            # Pinned to version 1, the second model removed.
            server_core.reload_config(server_config(model("clf", base, specific=(1,))))
            assert states(port, "clf") == {2: "END", 1: "AVAILABLE"}
            assert predict(port, "/v1/models/other")[0] == 404
            # Back to latest: version 2 loads before version 1 unloads.
            server_core.reload_config(server_config(model("clf", base)))
            assert states(port, "clf") == {2: "AVAILABLE", 1: "END"}
            # The served version's directory deleted: version 1 takes over.
            shutil.rmtree(os.path.join(base, "2"))
            assert wait_for(lambda: states(port, "clf") == {2: "END", 1: "AVAILABLE"}, 120), states(
                port, "clf"
            )
            time.sleep(0.3)  # Some requests on the last version.
        finally:
            stop.set()
            for thread in clients:
                thread.join(timeout=60)
    assert not failures, failures[:3]
    assert len(replies) > 100
    assert replies[-1] <= set(LABELS) and any(labels <= set(V2_LABELS) for labels in replies)
