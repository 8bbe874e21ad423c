"""Request metrics, and their Prometheus page (TF Serving's --monitoring_config_file).

TF Serving counts requests and times the successful ones in two TensorFlow monitoring
metrics, and its Prometheus exporter writes TensorFlow's whole metric registry as Prometheus text.
This module keeps the same two metrics, under the same names, labels and buckets, and writes them
the way TF Serving's exporter does, so dashboards and alerts built on TF Serving's page work here:

  /tensorflow/serving/request_count    counter, labels model_name, status
      (servables/tensorflow/util.cc: `model_request_status_count_total`, bumped by
      `RecordModelRequestCount` for every REST request and every gRPC Predict, Classify and
      Regress)
  /tensorflow/serving/request_latency  histogram, labels model_name, API, entrypoint, in
      microseconds, buckets Exponential(10, 1.8, 33) (util.cc: `request_latency`, fed by
      `RecordRequestLatency` for OK requests only)

Ours, not TF Serving's (TF Serving's labels cannot tell one signature of a model from another):

  /bert_tf/serving/request_count       counter, labels model_name, signature_name, API,
      entrypoint, status: every request; signature_name is the one the client named when a
      served version has it, else empty (made-up names must not grow the page without bound)
  /bert_tf/serving/request_latency     histogram, labels model_name, signature_name, API,
      entrypoint: OK requests, in microseconds, with TF Serving's buckets

On the page, '/' in a name becomes ':' (`GetPrometheusMetricName` in util/prometheus_exporter.cc),
e.g. `:tensorflow:serving:request_count`.
"""

import bisect
import dataclasses
import re
import sys
import threading

# TF Serving's metrics (tensorflow_serving/servables/tensorflow/util.cc).
REQUEST_COUNT = "/tensorflow/serving/request_count"
REQUEST_LATENCY = "/tensorflow/serving/request_latency"
# Ours: the same, split by signature as well.
SIGNATURE_REQUEST_COUNT = "/bert_tf/serving/request_count"
SIGNATURE_REQUEST_LATENCY = "/bert_tf/serving/request_latency"

# The gRPC methods TF Serving records in its two metrics (model_servers/prediction_service_impl.cc):
# MultiInference, GetModelMetadata and ModelService's calls are neither counted nor timed there, so
# they stay out of the TF Serving-named metrics here too (ours count them). Its REST handler records
# every request (http_server.cc, RestApiRequestDispatcher::ProcessRequest).
_GRPC_APIS_TF_SERVING_RECORDS = frozenset({"Predict", "Classify", "Regress"})

# PrometheusExporter::kPrometheusPath (util/prometheus_exporter.cc): the page's path when the
# MonitoringConfig names none.
DEFAULT_PROMETHEUS_PATH = "/monitoring/prometheus/metrics"


def _exponential_bounds(scale, growth_factor, bucket_count):
    """TensorFlow's monitoring::Buckets::Exponential: scale * growth_factor**i, by repeated
    multiplication as TensorFlow computes them (so the doubles match bit for bit), plus DBL_MAX."""
    bounds, bound = [], float(scale)
    for _ in range(bucket_count):
        bounds.append(bound)
        bound *= growth_factor
    # TensorFlow's ExplicitBuckets appends DBL_MAX so every value falls in a bucket; the exporter
    # writes that last bucket as le="+Inf".
    bounds.append(sys.float_info.max)
    return tuple(bounds)


# util.cc: "Scale of 10, power of 1.8 with bucket count 33 (~20 minutes)", in microseconds.
LATENCY_BUCKET_BOUNDS = _exponential_bounds(10, 1.8, 33)


class _Counter:
    """A cumulative int64 metric: one value per tuple of label values."""

    kind = "counter"

    def __init__(self, name, label_names):
        self.name = name
        self.label_names = label_names
        self.cells = {}

    def add(self, label_values, amount=1):
        """Adds `amount` to the cell of `label_values` (the caller holds the registry's lock)."""
        self.cells[label_values] = self.cells.get(label_values, 0) + amount

    def snapshot(self):
        """{label values: count}."""
        return dict(self.cells)


class _Histogram:
    """A sampler metric: per tuple of label values, per-bucket counts and the sum of samples."""

    kind = "histogram"

    def __init__(self, name, label_names, bounds):
        self.name = name
        self.label_names = label_names
        self.bounds = bounds
        self.cells = {}

    def add(self, label_values, value):
        """Files one sample (the caller holds the registry's lock)."""
        cell = self.cells.get(label_values)
        if cell is None:
            cell = self.cells[label_values] = [[0] * len(self.bounds), 0.0]
        # TensorFlow's Histogram::Add takes std::upper_bound: a bucket holds the values from the
        # previous bound up to, but excluding, its own; a value equal to a bound goes one up.
        index = min(bisect.bisect_right(self.bounds, value), len(self.bounds) - 1)
        cell[0][index] += 1
        cell[1] += value

    def snapshot(self):
        """{label values: HistogramValue}."""
        return {
            labels: HistogramValue(tuple(counts), total, sum(counts))
            for labels, (counts, total) in self.cells.items()
        }


@dataclasses.dataclass(frozen=True)
class HistogramValue:
    """One histogram cell: per-bucket (not cumulative) counts, the sum and count of samples."""

    bucket_counts: tuple
    sum: float
    count: int


class Metrics:
    """The server's request metrics; safe to record from any number of threads at once."""

    def __init__(self):
        # One lock for all metrics: a request's four updates land together, so a page never shows
        # a request counted in one metric and missing from another.
        self._lock = threading.Lock()
        metrics = [
            _Counter(REQUEST_COUNT, ("model_name", "status")),
            _Histogram(REQUEST_LATENCY, ("model_name", "API", "entrypoint"), LATENCY_BUCKET_BOUNDS),
            _Counter(
                SIGNATURE_REQUEST_COUNT,
                ("model_name", "signature_name", "API", "entrypoint", "status"),
            ),
            _Histogram(
                SIGNATURE_REQUEST_LATENCY,
                ("model_name", "signature_name", "API", "entrypoint"),
                LATENCY_BUCKET_BOUNDS,
            ),
        ]
        self._metrics = {metric.name: metric for metric in metrics}

    def record_request(self, model_name, api, entrypoint, code, latency_s, signature_name=""):
        """Counts one finished request and, if its code is "OK", files its latency (microseconds)."""
        # TF Serving records NowMicros() differences: whole microseconds.
        latency_us = max(0, round(latency_s * 1_000_000))
        tf_serving_records = entrypoint != "GRPC" or api in _GRPC_APIS_TF_SERVING_RECORDS
        with self._lock:
            self._metrics[SIGNATURE_REQUEST_COUNT].add(
                (model_name, signature_name, api, entrypoint, code)
            )
            if tf_serving_records:
                self._metrics[REQUEST_COUNT].add((model_name, code))
            # TF Serving times successful requests only (http_server.cc, prediction_service_impl.cc):
            # a rejection's latency would drag the distribution of real work down.
            if code == "OK":
                self._metrics[SIGNATURE_REQUEST_LATENCY].add(
                    (model_name, signature_name, api, entrypoint), latency_us
                )
                if tf_serving_records:
                    self._metrics[REQUEST_LATENCY].add((model_name, api, entrypoint), latency_us)

    def value(self, metric_name, *label_values):
        """A counter's count (0 if never bumped) or a histogram's HistogramValue (None if empty)."""
        metric = self._metrics[metric_name]
        with self._lock:
            cells = metric.snapshot()
        if metric.kind == "counter":
            return cells.get(tuple(label_values), 0)
        return cells.get(tuple(label_values))

    def prometheus_text(self):
        """The metrics as Prometheus text (format 0.0.4), written as TF Serving's exporter does."""
        with self._lock:
            snapshots = [(metric, metric.snapshot()) for metric in self._metrics.values()]
        lines = []
        # TensorFlow's CollectionRegistry keeps metrics in a std::map by name, and each metric its
        # cells in a std::map by label values: the page lists both in sorted order.
        for metric, cells in sorted(snapshots, key=lambda pair: pair[0].name):
            name = _prometheus_metric_name(metric.name)
            # As TF Serving: a TYPE line, even for a metric with no cells yet, and no HELP line.
            lines.append(f"# TYPE {name} {metric.kind}")
            for label_values in sorted(cells):
                labels = ",".join(
                    f'{_prometheus_label_name(label)}="{_escape_label_value(value)}"'
                    for label, value in zip(metric.label_names, label_values)
                )
                if metric.kind == "counter":
                    lines.append(f"{name}{{{labels}}} {cells[label_values]}")
                else:
                    lines.extend(_histogram_lines(name, labels, metric.bounds, cells[label_values]))
        return "\n".join(lines) + "\n"


def _histogram_lines(name, labels, bounds, cell):
    """A cell's cumulative NAME_bucket{...,le="b"} lines (last le="+Inf"), NAME_sum, NAME_count."""
    prefix = f"{name}_bucket{{{labels}," if labels else f"{name}_bucket{{"
    lines, cumulative = [], 0
    for i, (bound, count) in enumerate(zip(bounds, cell.bucket_counts)):
        cumulative += count
        le = "+Inf" if i == len(bounds) - 1 else _format_double(bound)
        lines.append(f'{prefix}le="{le}"}} {cumulative}')
    lines.append(f"{name}_sum{{{labels}}} {_format_double(cell.sum)}")
    lines.append(f"{name}_count{{{labels}}} {cumulative}")
    return lines


def _format_double(value):
    """A double as absl::StrCat writes it (printf's %.6g), which is how the exporter writes bucket
    bounds and sums: e.g. 104.976, 1.27482e+06."""
    return f"{value:.6g}"


def _prometheus_metric_name(name):
    """TF Serving's GetPrometheusMetricName: characters outside [a-zA-Z0-9_] become ':', and a
    leading digit gets a '_' before it."""
    name = re.sub(r"[^a-zA-Z0-9_]", ":", name)
    return f"_{name}" if name[:1].isdigit() else name


def _prometheus_label_name(name):
    """TF Serving's SanatizeLabelName: characters outside [a-zA-Z0-9] become '_', and a leading
    digit gets a '_' before it."""
    name = re.sub(r"[^a-zA-Z0-9]", "_", name)
    return f"_{name}" if name[:1].isdigit() else name


def _escape_label_value(value):
    """A label value escaped for the text format: backslash, double quote and newline."""
    # TF Serving's SanitizeLabelValue escapes the first two only. Model names come from clients (a
    # gRPC ModelSpec.name can be any string), and a raw newline would split a sample line and break
    # the whole page, so it is escaped too, as the text format 0.0.4 specifies.
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_path(config):
    """The path of the Prometheus page a MonitoringConfig asks for, or None if it asks for none."""
    if config is None or not config.prometheus_config.enable:
        return None
    return config.prometheus_config.path or DEFAULT_PROMETHEUS_PATH
