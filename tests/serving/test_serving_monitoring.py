"""TF Serving's monitoring and batching config files, and the request metrics' Prometheus page."""

import threading

import pytest

from bert_tf.runtime.io_utils import UsageError
from bert_tf.serving import monitoring, protos

# TF Serving's latency buckets (Exponential(10, 1.8, 33) in microseconds) as its exporter writes
# them, then DBL_MAX as +Inf.
TF_SERVING_LATENCY_LE = (
    "10 18 32.4 58.32 104.976 188.957 340.122 612.22 1102 1983.59 3570.47 6426.84 11568.3 20823 "
    "37481.3 67466.4 121440 218591 393464 708235 1.27482e+06 2.29468e+06 4.13043e+06 7.43477e+06 "
    "1.33826e+07 2.40887e+07 4.33596e+07 7.80473e+07 1.40485e+08 2.52873e+08 4.55172e+08 "
    "8.19309e+08 1.47476e+09 +Inf"
).split()


def write(tmp_path, name, text):
    """Writes `text` to tmp_path/name and returns the path as a string."""
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_monitoring_config_as_tf_serving_docs_write_it(tmp_path):
    # The example of TF Serving's serving_config.md, trailing comma included.
    path = write(
        tmp_path,
        "monitoring.config",
        'prometheus_config {\n  enable: true,\n  path: "/monitoring/prometheus/metrics"\n}\n',
    )
    config = protos.parse_text_file(path, protos.MonitoringConfig, "monitoring_config_file")
    assert config.prometheus_config.enable
    assert config.prometheus_config.path == "/monitoring/prometheus/metrics"
    assert monitoring.prometheus_path(config) == "/monitoring/prometheus/metrics"


def test_prometheus_path_defaults_and_disabled():
    enabled_no_path = protos.MonitoringConfig()
    enabled_no_path.prometheus_config.enable = True
    assert monitoring.prometheus_path(enabled_no_path) == "/monitoring/prometheus/metrics"
    custom = protos.MonitoringConfig(
        prometheus_config=protos.PrometheusConfig(enable=True, path="/metrics")
    )
    assert monitoring.prometheus_path(custom) == "/metrics"
    disabled = protos.MonitoringConfig(prometheus_config=protos.PrometheusConfig(path="/metrics"))
    assert monitoring.prometheus_path(disabled) is None
    assert monitoring.prometheus_path(protos.MonitoringConfig()) is None
    assert monitoring.prometheus_path(None) is None


def test_batching_parameters_as_tf_serving_docs_write_them(tmp_path):
    path = write(
        tmp_path,
        "batching.config",
        "max_batch_size { value: 128 }\n"
        "batch_timeout_micros { value: 0 }\n"
        "max_enqueued_batches { value: 1000000 }\n"
        "num_batch_threads { value: 8 }\n"
        "allowed_batch_sizes: 8\n"
        "allowed_batch_sizes: 32\n"
        "allowed_batch_sizes: 128\n"
        "pad_variable_length_inputs: true\n",
    )
    params = protos.parse_text_file(path, protos.BatchingParameters, "--batching_parameters_file")
    assert params.max_batch_size.value == 128
    assert params.max_enqueued_batches.value == 1000000
    assert params.num_batch_threads.value == 8
    assert list(params.allowed_batch_sizes) == [8, 32, 128]
    assert params.pad_variable_length_inputs is True
    # The wrapper types tell "set to 0" from "not set", which TF Serving relies on for defaults.
    assert params.HasField("batch_timeout_micros") and params.batch_timeout_micros.value == 0
    assert not params.HasField("thread_pool_name")
    assert not params.HasField("enable_large_batch_splitting")
    assert not params.HasField("max_execution_batch_size")


def test_batching_parameters_fields_are_tf_serving_s():
    # tensorflow_serving/servables/tensorflow/session_bundle_config.proto, BatchingParameters.
    expected = {
        "max_batch_size": (1, "google.protobuf.Int64Value"),
        "batch_timeout_micros": (2, "google.protobuf.Int64Value"),
        "max_enqueued_batches": (3, "google.protobuf.Int64Value"),
        "num_batch_threads": (4, "google.protobuf.Int64Value"),
        "thread_pool_name": (5, "google.protobuf.StringValue"),
        "allowed_batch_sizes": (6, "repeated int64"),
        "pad_variable_length_inputs": (7, "bool"),
        "enable_large_batch_splitting": (8, "google.protobuf.BoolValue"),
        "max_execution_batch_size": (9, "google.protobuf.Int64Value"),
    }
    scalar_names = {3: "int64", 8: "bool"}  # FieldDescriptor.TYPE_INT64, TYPE_BOOL
    found = {}
    for field in protos.BatchingParameters.DESCRIPTOR.fields:
        type_name = field.message_type.full_name if field.message_type else scalar_names[field.type]
        found[field.name] = (
            field.number,
            f"repeated {type_name}" if field.is_repeated else type_name,
        )
    assert found == expected
    assert protos.BatchingParameters.DESCRIPTOR.full_name == "tensorflow.serving.BatchingParameters"
    assert protos.MonitoringConfig.DESCRIPTOR.full_name == "tensorflow.serving.MonitoringConfig"
    # Binary too: field 1, a nested Int64Value whose field 1 is 128.
    params = protos.BatchingParameters()
    params.max_batch_size.value = 128
    assert params.SerializeToString() == b"\x0a\x03\x08\x80\x01"


def test_every_batching_field_parses(tmp_path):
    path = write(
        tmp_path,
        "batching.config",
        'thread_pool_name { value: "bert_batch_threads" }\n'
        "enable_large_batch_splitting { value: true }\n"
        "max_execution_batch_size { value: 32 }\n",
    )
    params = protos.parse_text_file(path, protos.BatchingParameters, "batching_parameters_file")
    assert params.thread_pool_name.value == "bert_batch_threads"
    assert params.enable_large_batch_splitting.value is True
    assert params.max_execution_batch_size.value == 32


def test_unknown_field_names_flag_file_and_line(tmp_path):
    path = write(
        tmp_path,
        "monitoring.config",
        'prometheus_config {\n  enable: true\n  pth: "/metrics"\n}\n',
    )
    with pytest.raises(UsageError) as error:
        protos.parse_text_file(path, protos.MonitoringConfig, "monitoring_config_file")
    message = str(error.value)
    assert message.startswith(f"--monitoring_config_file={path}: line 3, column 3:")
    assert 'no field named "pth"' in message


def test_scalar_for_a_wrapper_field_names_its_line(tmp_path):
    # A common mistake: TF Serving's wrappers need `{ value: N }`, not a bare number.
    path = write(tmp_path, "batching.config", "num_batch_threads { value: 4 }\nmax_batch_size: 8\n")
    with pytest.raises(UsageError, match=r"--batching_parameters_file=.*batching.config: line 2"):
        protos.parse_text_file(path, protos.BatchingParameters, "batching_parameters_file")


def test_unreadable_file_is_a_usage_error(tmp_path):
    missing = str(tmp_path / "missing.config")
    with pytest.raises(UsageError, match=f"--monitoring_config_file={missing}: cannot read it"):
        protos.parse_text_file(missing, protos.MonitoringConfig, "monitoring_config_file")
    binary = tmp_path / "binary.config"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UsageError, match="not UTF-8"):
        protos.parse_text_file(str(binary), protos.MonitoringConfig, "monitoring_config_file")


def test_counts_every_request_and_times_ok_ones_only():
    metrics = monitoring.Metrics()
    metrics.record_request("bert", "Predict", "GRPC", "OK", 0.001, signature_name="serving_default")
    metrics.record_request("bert", "Predict", "GRPC", "OK", 0.002, signature_name="serving_default")
    metrics.record_request("bert", "predict", "REST", "OK", 0.0005, signature_name="tokens")
    metrics.record_request("bert", "predict", "REST", "INVALID_ARGUMENT", 0.0001)
    metrics.record_request("nope", "", "REST", "NOT_FOUND", 0.0001)

    assert metrics.value(monitoring.REQUEST_COUNT, "bert", "OK") == 3
    assert metrics.value(monitoring.REQUEST_COUNT, "bert", "INVALID_ARGUMENT") == 1
    assert metrics.value(monitoring.REQUEST_COUNT, "nope", "NOT_FOUND") == 1
    assert metrics.value(monitoring.REQUEST_COUNT, "nope", "OK") == 0

    grpc_latency = metrics.value(monitoring.REQUEST_LATENCY, "bert", "Predict", "GRPC")
    assert (grpc_latency.count, grpc_latency.sum) == (2, 3000)
    # 1000 us and 2000 us: in the buckets ending at 1102 and 3570.47 (indexes 8 and 10).
    assert grpc_latency.bucket_counts[8] == 1 and grpc_latency.bucket_counts[10] == 1
    rest_latency = metrics.value(monitoring.REQUEST_LATENCY, "bert", "predict", "REST")
    assert (rest_latency.count, rest_latency.sum) == (1, 500)
    assert metrics.value(monitoring.REQUEST_LATENCY, "nope", "", "REST") is None

    assert (
        metrics.value(
            monitoring.SIGNATURE_REQUEST_COUNT, "bert", "serving_default", "Predict", "GRPC", "OK"
        )
        == 2
    )
    assert (
        metrics.value(
            monitoring.SIGNATURE_REQUEST_COUNT, "bert", "", "predict", "REST", "INVALID_ARGUMENT"
        )
        == 1
    )
    tokens = metrics.value(
        monitoring.SIGNATURE_REQUEST_LATENCY, "bert", "tokens", "predict", "REST"
    )
    assert (tokens.count, tokens.sum) == (1, 500)


def test_grpc_apis_tf_serving_does_not_record_are_ours_only():
    # TF Serving's gRPC MultiInference, GetModelMetadata and GetModelStatus record nothing; its REST
    # handler records every request, GETs (api "") included.
    metrics = monitoring.Metrics()
    for api in ("MultiInference", "GetModelMetadata", "GetModelStatus"):
        metrics.record_request("bert", api, "GRPC", "OK", 0.001)
    metrics.record_request("bert", "", "REST", "OK", 0.001)
    assert metrics.value(monitoring.REQUEST_COUNT, "bert", "OK") == 1
    assert metrics.value(monitoring.REQUEST_LATENCY, "bert", "MultiInference", "GRPC") is None
    assert metrics.value(monitoring.REQUEST_LATENCY, "bert", "", "REST").count == 1
    for api in ("MultiInference", "GetModelMetadata", "GetModelStatus"):
        assert metrics.value(monitoring.SIGNATURE_REQUEST_COUNT, "bert", "", api, "GRPC", "OK") == 1
        assert (
            metrics.value(monitoring.SIGNATURE_REQUEST_LATENCY, "bert", "", api, "GRPC").count == 1
        )


def test_bucket_bounds_are_exclusive_as_in_tensorflow():
    # TensorFlow's Histogram::Add uses std::upper_bound: a sample equal to a bound goes one bucket
    # up, and a huge one into the last (+Inf) bucket.
    metrics = monitoring.Metrics()
    for latency_s in (0, 0.000009, 0.000010, 0.000018, 10_000.0):
        metrics.record_request("m", "Predict", "GRPC", "OK", latency_s)
    counts = metrics.value(monitoring.REQUEST_LATENCY, "m", "Predict", "GRPC").bucket_counts
    assert len(counts) == 34
    assert counts[:3] == (2, 1, 1) and counts[-1] == 1 and sum(counts) == 5


def test_exposition_text_of_one_request():
    metrics = monitoring.Metrics()
    metrics.record_request("bert", "Predict", "GRPC", "OK", 0.000020, signature_name="sig")
    metrics.record_request("bert", "predict", "REST", "FAILED_PRECONDITION", 0.1)

    def histogram(name, labels, bucket_of_sample, sample):
        return (
            [f"# TYPE {name} histogram"]
            + [
                f'{name}_bucket{{{labels},le="{le}"}} {int(i >= bucket_of_sample)}'
                for i, le in enumerate(TF_SERVING_LATENCY_LE)
            ]
            + [f"{name}_sum{{{labels}}} {sample}", f"{name}_count{{{labels}}} 1"]
        )

    # 20 us is above the bound 18 and below 32.4: bucket index 2.
    expected = (
        [
            "# TYPE :bert_tf:serving:request_count counter",
            ':bert_tf:serving:request_count{model_name="bert",signature_name="",API="predict",'
            'entrypoint="REST",status="FAILED_PRECONDITION"} 1',
            ':bert_tf:serving:request_count{model_name="bert",signature_name="sig",API="Predict",'
            'entrypoint="GRPC",status="OK"} 1',
        ]
        + histogram(
            ":bert_tf:serving:request_latency",
            'model_name="bert",signature_name="sig",API="Predict",entrypoint="GRPC"',
            2,
            20,
        )
        + [
            "# TYPE :tensorflow:serving:request_count counter",
            ':tensorflow:serving:request_count{model_name="bert",status="FAILED_PRECONDITION"} 1',
            ':tensorflow:serving:request_count{model_name="bert",status="OK"} 1',
        ]
        + histogram(
            ":tensorflow:serving:request_latency",
            'model_name="bert",API="Predict",entrypoint="GRPC"',
            2,
            20,
        )
    )
    assert metrics.prometheus_text() == "\n".join(expected) + "\n"


def test_empty_page_has_type_lines_only():
    assert monitoring.Metrics().prometheus_text() == (
        "# TYPE :bert_tf:serving:request_count counter\n"
        "# TYPE :bert_tf:serving:request_latency histogram\n"
        "# TYPE :tensorflow:serving:request_count counter\n"
        "# TYPE :tensorflow:serving:request_latency histogram\n"
    )


def test_sum_is_written_as_tf_serving_writes_doubles():
    metrics = monitoring.Metrics()
    metrics.record_request("m", "Predict", "GRPC", "OK", 1.2345678)
    assert (
        ':tensorflow:serving:request_latency_sum{model_name="m",API="Predict",'
        + ('entrypoint="GRPC"} 1.23457e+06\n')
        in metrics.prometheus_text()
    )


def test_label_values_are_escaped():
    metrics = monitoring.Metrics()
    metrics.record_request('say "hi"\\now\nthen', "", "REST", "NOT_FOUND", 0.001)
    assert (
        ':tensorflow:serving:request_count{model_name="say \\"hi\\"\\\\now\\nthen",'
        'status="NOT_FOUND"} 1\n'
    ) in metrics.prometheus_text()


def test_concurrent_recording_gives_exact_totals():
    metrics = monitoring.Metrics()
    threads, per_thread = 16, 500
    start = threading.Barrier(threads + 1)

    def record(thread_index):
        start.wait()
        for i in range(per_thread):
            code = "OK" if i % 5 else "INVALID_ARGUMENT"
            metrics.record_request("bert", "Predict", "GRPC", code, 0.000100, "serving_default")
            if i % 50 == 0:
                metrics.prometheus_text()  # scrapes while others record must not disturb them

    workers = [threading.Thread(target=record, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    for worker in workers:
        worker.join()

    total_ok = threads * per_thread * 4 // 5
    total_bad = threads * per_thread // 5
    assert metrics.value(monitoring.REQUEST_COUNT, "bert", "OK") == total_ok
    assert metrics.value(monitoring.REQUEST_COUNT, "bert", "INVALID_ARGUMENT") == total_bad
    latency = metrics.value(monitoring.REQUEST_LATENCY, "bert", "Predict", "GRPC")
    assert (latency.count, latency.sum) == (total_ok, total_ok * 100)
    assert (
        metrics.value(
            monitoring.SIGNATURE_REQUEST_COUNT, "bert", "serving_default", "Predict", "GRPC", "OK"
        )
        == total_ok
    )
    assert f':tensorflow:serving:request_count{{model_name="bert",status="OK"}} {total_ok}\n' in (
        metrics.prometheus_text()
    )
