"""The pull endpoint's protobuf exposition and native histograms, read back by an
independent decoder: the ``protobuf`` runtime with ``io.prometheus.client`` messages
built at test time from the field definitions of ``prometheus/client_model``'s
``metrics.proto`` (not from otelgpu's writer). Both sketch twins (the sketches come from
``otelgpu.sketch.QuantileSketch``, whichever twin the process selected).

Checked: the native buckets hold exactly the values the sketch saw (the OTel index ``i``
-> Prometheus index ``i + 1`` shift, at ``1``, ``2`` and random values), the zero bucket,
negative buckets, downscaling from scales above 8, the refusal below -4; and over HTTP
from a real ``instrument(exporters="prometheus")`` endpoint: the protobuf answer holds
every series of the text answer with the same value, plus the native histograms.
"""

from __future__ import annotations

import io
import math
import random
import re
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fixtures.pull import instrument_pull_only, scrape, tiny_request
from google.protobuf import (  # type: ignore[import-untyped]  # no protobuf stubs in the test extras
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    proto,
)
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import otelgpu
from otelgpu.otel import histogram_rule, prometheus_protobuf
from otelgpu.otel.prometheus import SketchCollector
from otelgpu.otel.pull_server import wants_protobuf
from otelgpu.otel.stats import InternalStats
from otelgpu.runtime.records import StepRecord
from otelgpu.sketch import QuantileSketch

PROMETHEUS_ACCEPT = (
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
    "encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)

# The messages of prometheus/client_model's metrics.proto (proto2), field for field;
# deprecated and unused fields left out, the "type" of a family is the MetricType enum.
METRICS_PROTO = """
message LabelPair { optional string name = 1; optional string value = 2; }
message Gauge { optional double value = 1; }
message Counter { optional double value = 1; }
message Untyped { optional double value = 1; }
message Quantile { optional double quantile = 1; optional double value = 2; }
message Summary {
  optional uint64 sample_count = 1; optional double sample_sum = 2;
  repeated Quantile quantile = 3;
}
message Bucket {
  optional uint64 cumulative_count = 1; optional double upper_bound = 2;
  optional double cumulative_count_float = 4;
}
message BucketSpan { optional sint32 offset = 1; optional uint32 length = 2; }
message Histogram {
  optional uint64 sample_count = 1; optional double sample_sum = 2; repeated Bucket bucket = 3;
  optional double sample_count_float = 4; optional sint32 schema = 5;
  optional double zero_threshold = 6; optional uint64 zero_count = 7;
  optional double zero_count_float = 8;
  repeated BucketSpan negative_span = 9; repeated sint64 negative_delta = 10;
  repeated double negative_count = 11;
  repeated BucketSpan positive_span = 12; repeated sint64 positive_delta = 13;
  repeated double positive_count = 14;
}
message Metric {
  repeated LabelPair label = 1; optional Gauge gauge = 2; optional Counter counter = 3;
  optional Summary summary = 4; optional Untyped untyped = 5; optional int64 timestamp_ms = 6;
  optional Histogram histogram = 7;
}
message MetricFamily {
  optional string name = 1; optional string help = 2; optional MetricType type = 3;
  repeated Metric metric = 4; optional string unit = 5;
}
"""
_SCALARS = {"double", "int64", "sint32", "sint64", "string", "uint32", "uint64"}
_TYPE_NAMES = ["COUNTER", "GAUGE", "SUMMARY", "UNTYPED", "HISTOGRAM", "GAUGE_HISTOGRAM"]


def _metric_family_class() -> Any:
    """The ``MetricFamily`` class of :data:`METRICS_PROTO`, built by the protobuf runtime
    from a file descriptor written here (a field is ``label type name = number;``)."""
    package = "io.prometheus.client"
    fdp = descriptor_pb2.FileDescriptorProto(
        name="otelgpu_test_metrics.proto", package=package, syntax="proto2"
    )
    enum = fdp.enum_type.add(name="MetricType")
    for number, name in enumerate(_TYPE_NAMES):
        enum.value.add(name=name, number=number)
    F = descriptor_pb2.FieldDescriptorProto
    labels = {"optional": F.LABEL_OPTIONAL, "repeated": F.LABEL_REPEATED}
    for message, body in re.findall(r"message (\w+) \{([^}]*)\}", METRICS_PROTO):
        mdp = fdp.message_type.add(name=message)
        for label, ftype, name, number in re.findall(r"(\w+) (\w+) (\w+) = (\d+);", body):
            field = mdp.field.add(name=name, number=int(number), label=labels[label])
            if ftype in _SCALARS:
                field.type = getattr(F, f"TYPE_{ftype.upper()}")
                continue
            field.type = F.TYPE_ENUM if ftype == "MetricType" else F.TYPE_MESSAGE
            field.type_name = f".{package}.{ftype}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.MetricFamily"))


MetricFamily = _metric_family_class()


def decode(data: bytes) -> list[Any]:
    """The MetricFamily messages of a delimited stream (the protobuf runtime's own reader)."""
    stream = io.BytesIO(data)
    out = []
    while stream.tell() < len(data):
        out.append(proto.parse_length_prefixed(MetricFamily, stream))
    return out


def native_counts(spans: Any, deltas: Any) -> dict[int, int]:
    """Prometheus bucket index -> count, from spans and deltas as the format defines them."""
    out: dict[int, int] = {}
    index, count, i = 0, 0, 0
    for n, span in enumerate(spans):
        index = span.offset if n == 0 else index + span.offset
        for _ in range(span.length):
            count += deltas[i]
            i += 1
            if count:
                out[index] = count
            index += 1
    assert i == len(deltas)
    return out


def prometheus_index(value: float, schema: int) -> int:
    """The native bucket ``k`` with ``base**(k-1) < |value| <= base**k`` (exact powers of
    two by ``frexp``, others by logarithm: random values are never on a boundary)."""
    mantissa, exponent = math.frexp(abs(value))
    if mantissa == 0.5:  # |value| == 2 ** (exponent - 1): an upper bound at every schema
        # (floor division by 2**-schema for negative schemas: an arithmetic right shift)
        return (exponent - 1) << schema if schema >= 0 else (exponent - 1) >> -schema
    return math.ceil(math.log2(abs(value)) * 2.0**schema)


def _native_of(values: list[float], **sketch_args: Any) -> tuple[Any, Any]:
    sketch = QuantileSketch(**sketch_args)
    for v in values:
        sketch.add(v)
    point = sketch.to_data_point(0, 1)
    registry = CollectorRegistry()
    registry.register(SketchCollector(lambda: [_metric_of(point)], InternalStats()))
    return point, decode(prometheus_protobuf.encode(registry))


def _metric_of(point: Any) -> Any:
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        ExponentialHistogram,
        Metric,
    )

    return Metric(
        name="test.duration",
        description="d",
        unit="s",
        data=ExponentialHistogram(
            data_points=[point], aggregation_temporality=AggregationTemporality.CUMULATIVE
        ),
    )


def _expected(values: list[float], schema: int) -> tuple[dict[int, int], dict[int, int], int]:
    pos: dict[int, int] = {}
    neg: dict[int, int] = {}
    zeros = 0
    for v in values:
        if v == 0 or abs(v) <= histogram_rule.NATIVE_ZERO_THRESHOLD:
            zeros += 1
            continue
        side = pos if v > 0 else neg
        k = prometheus_index(v, schema)
        side[k] = side.get(k, 0) + 1
    return pos, neg, zeros


def _check(values: list[float], schema: int, **sketch_args: Any) -> Any:
    point, families = _native_of(values, **sketch_args)
    assert len(families) == 1
    family = families[0]
    assert family.name == "test_duration_seconds"
    assert family.type == 4  # HISTOGRAM
    (metric,) = family.metric
    h = metric.histogram
    pos, neg, zeros = _expected(values, schema)
    assert h.schema == schema
    assert h.zero_threshold == 2.0**-128
    assert h.zero_count == zeros
    assert native_counts(h.positive_span, h.positive_delta) == pos
    assert native_counts(h.negative_span, h.negative_delta) == neg
    assert h.sample_count == len(values) == point.count
    assert h.sample_sum == point.sum
    # The classic buckets travel in the same message, equal to histogram_rule's.
    classic = histogram_rule.classic_buckets(point, "s")
    assert [(b.upper_bound, b.cumulative_count) for b in h.bucket] == [(le, c) for le, c in classic]
    return h


def test_metrics_native_bucket_index_is_otel_index_plus_one() -> None:
    # 1.0 is the upper bound of Prometheus bucket 0 = OTel bucket -1; just above 1 is
    # Prometheus bucket 1; 2.0 closes Prometheus bucket 64 at schema 6.
    h = _check([1.0, 1.0 + 1e-9, 2.0, 2.0, 0.5], 6)
    assert native_counts(h.positive_span, h.positive_delta) == {0: 1, 1: 1, 64: 2, -64: 1}
    point, _ = _native_of([1.0])
    assert point.positive.offset == -1  # the OTel index of 1.0 at any scale


@pytest.mark.parametrize("scale", [0, 3, 6, 8, -4])
def test_metrics_native_buckets_equal_the_sketch(scale: int) -> None:
    rng = random.Random(scale)
    values = [rng.lognormvariate(-3, 2) for _ in range(3000)]
    values += [-rng.lognormvariate(0, 1) for _ in range(200)]
    values += [0.0] * 7
    _check(values, scale, scale=scale)


def test_metrics_native_zero_bucket_folds_buckets_below_its_threshold() -> None:
    # 2**-128 itself and anything smaller belong to the zero bucket [-2**-128, 2**-128];
    # the next bucket up does not (a range the sketch holds without collapsing buckets).
    tiny = 2.0**-128
    values = [0.0, 0.0, tiny, tiny / 3, -tiny / 1.5, tiny * 1.01, tiny * 4, -tiny * 2]
    h = _check(values, 6)
    assert h.zero_count == 5
    assert sum(native_counts(h.positive_span, h.positive_delta).values()) == 2


@pytest.mark.parametrize("scale", [9, 12])
def test_metrics_native_downscales_to_schema_8(scale: int) -> None:
    rng = random.Random(scale)
    values = [rng.lognormvariate(0, 0.5) for _ in range(2000)] + [1.0, 2.0, -4.0]
    _check(values, 8, scale=scale, max_buckets=1 << 16)  # no collapsed buckets


def test_metrics_native_spans_and_gaps() -> None:
    # Buckets 1, 3 and 6 (gaps of one and two empty buckets: one span), then 10 (a gap
    # of three: a new span starting 3 after the first ends).
    values = [2.0 ** ((k - 0.5) / 64) for k in (1, 3, 3, 6, 10)]
    h = _check(values, 6)
    assert [(s.offset, s.length) for s in h.positive_span] == [(1, 6), (3, 1)]
    assert list(h.positive_delta) == [1, -1, 2, -2, 0, 1, -1 + 1]


def test_metrics_native_refused_below_schema_minus_4() -> None:
    point, families = _native_of([1.0, 5.0], scale=-5)
    assert histogram_rule.native_histogram(point) is None
    (metric,) = families[0].metric
    h = metric.histogram
    assert not h.HasField("schema") and not h.positive_span  # classic only
    assert h.sample_count == 2 and len(h.bucket) > 1


def test_metrics_native_empty_sketch_is_still_native() -> None:
    point = QuantileSketch().to_data_point(0, 1)
    native = histogram_rule.native_histogram(point)
    assert native is not None
    assert native.zero_threshold > 0  # what marks an empty histogram as native
    assert native.positive_spans == () and native.sample_count == 0


def test_metrics_accept_negotiation() -> None:
    assert wants_protobuf(PROMETHEUS_ACCEPT)
    assert not wants_protobuf("text/plain;version=0.0.4")
    assert not wants_protobuf("")
    assert not wants_protobuf("*/*")
    assert not wants_protobuf(  # OpenMetrics preferred
        "application/openmetrics-text;version=1.0.0;q=0.9,"
        "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
        "encoding=delimited;q=0.5"
    )
    assert not wants_protobuf(  # a protobuf flavour not written here
        "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text"
    )


# ----------------------------------------------------------------------------- over HTTP
@pytest.fixture
def endpoint(reset_otel_globals: None) -> Iterator[tuple[str, list[float]]]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    handle = instrument_pull_only(port)
    try:
        runtime = handle.runtime
        assert runtime is not None
        rng = random.Random(3)
        t0 = time.time_ns()
        durations = []
        for i in range(500):
            d = rng.lognormvariate(math.log(0.3), 0.7)
            durations.append(d)
            failed = i % 10 == 0
            runtime.record_request(tiny_request(t0, d, failed))
            runtime.record_step(StepRecord(t0, t0 + int(d * 1e8)))
        yield f"http://127.0.0.1:{port}/metrics", durations
    finally:
        otelgpu.shutdown()


def _text_series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def _protobuf_series(families: list[Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The series a Prometheus scrape makes of the messages (classic histogram view)."""
    out = {}
    for f in families:
        for m in f.metric:
            labels = tuple(sorted((lp.name, lp.value) for lp in m.label))
            kind = _TYPE_NAMES[f.type]
            if kind in ("HISTOGRAM", "GAUGE_HISTOGRAM"):
                h = m.histogram
                out[(f.name + "_count", labels)] = float(h.sample_count)
                out[(f.name + "_sum", labels)] = h.sample_sum
                for b in h.bucket:
                    le = "+Inf" if math.isinf(b.upper_bound) else _go_float(b.upper_bound)
                    key = tuple(sorted((*labels, ("le", le))))
                    out[(f.name + "_bucket", key)] = float(b.cumulative_count)
            elif kind == "SUMMARY":
                s = m.summary
                out[(f.name + "_count", labels)] = float(s.sample_count)
                out[(f.name + "_sum", labels)] = s.sample_sum
                for q in s.quantile:
                    key = tuple(sorted((*labels, ("quantile", _go_float(q.quantile)))))
                    out[(f.name, key)] = q.value
            else:
                value = getattr(m, {"COUNTER": "counter", "GAUGE": "gauge"}.get(kind, "untyped"))
                out[(f.name, labels)] = value.value
    return out


def _go_float(x: float) -> str:
    from prometheus_client.utils import floatToGoString

    return str(floatToGoString(x))  # type: ignore[no-untyped-call]


def test_metrics_endpoint_protobuf_equals_text_plus_native(
    endpoint: tuple[str, list[float]],
) -> None:
    url, durations = endpoint
    text_type, text = scrape(url, None)
    assert text_type.startswith("text/plain")
    content_type, body = scrape(url, PROMETHEUS_ACCEPT, gzip_ok=True)
    assert content_type == prometheus_protobuf.CONTENT_TYPE
    families = decode(body)
    text_series = _text_series(text.decode())
    proto_series = _protobuf_series(families)
    # The counter's text name is the family name; the parser strips "_total" -- compare
    # by the sample names of both sides, which are the series Prometheus stores.
    assert set(proto_series) == set(text_series)
    moving = ("process_", "python_gc_")  # the process collector reads /proc per scrape
    for key, value in text_series.items():
        if key[0].startswith(moving):
            continue
        assert proto_series[key] == value or (
            math.isnan(value) and math.isnan(proto_series[key])
        ), key

    by_name = {f.name: f for f in families}
    requests = by_name["gen_ai_server_request_duration_seconds"]
    assert _TYPE_NAMES[requests.type] == "HISTOGRAM"
    total = 0
    for m in requests.metric:
        h = m.histogram
        assert h.schema == 6 and h.zero_threshold == 2.0**-128
        counts = native_counts(h.positive_span, h.positive_delta)
        assert sum(counts.values()) + h.zero_count == h.sample_count
        total += h.sample_count
        # native and classic agree: every classic bound is a native bucket boundary
        # (schema 6 nests in schema 1), so the classic cumulative counts follow exactly.
        for b in h.bucket:
            if math.isinf(b.upper_bound):
                assert b.cumulative_count == h.sample_count
                continue
            bound_index = round(math.log2(b.upper_bound) * 64)  # a boundary: 2 ** (j / 2)
            below = sum(c for k, c in counts.items() if k <= bound_index) + h.zero_count
            assert b.cumulative_count == below, b.upper_bound
    assert total == len(durations)
    assert len(requests.metric) == 2  # ok and error_type="timeout"
    assert "otelgpu_train_step_duration_seconds" in by_name
    assert _TYPE_NAMES[by_name["otelgpu_train_steps_total"].type] == "COUNTER"


def test_metrics_endpoint_text_unchanged_for_other_scrapers(
    endpoint: tuple[str, list[float]],
) -> None:
    """Without a protobuf Accept the answer is prometheus_client's own text exposition."""
    from prometheus_client import REGISTRY, generate_latest

    url, _ = endpoint
    _, text = scrape(url, "text/plain;version=0.0.4")
    assert b"gen_ai_server_request_duration_seconds_bucket{" in text
    mine = {k for k in _text_series(text.decode()) if not k[0].startswith(("process_", "python_"))}
    ref = _text_series(generate_latest(REGISTRY).decode())
    assert mine == {k for k in ref if not k[0].startswith(("process_", "python_"))}
    content_type, _ = scrape(url, "application/openmetrics-text;version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")


def test_metrics_endpoint_name_selection(endpoint: tuple[str, list[float]]) -> None:
    """``name[]`` selects the samples so named, a histogram whole (its message carries
    buckets, sum, count and native histogram together). prometheus_client's text answer
    only searches collectors that describe their names -- none of otelgpu's -- so the
    full text answer, filtered here, is the reference."""
    url, durations = endpoint
    hist = "gen_ai_server_request_duration_seconds"
    steps = "otelgpu_train_step_duration_seconds"
    _, text = scrape(url, None)
    reference = _text_series(text.decode())
    for selected, families_expected in (
        ({hist, "otelgpu_train_steps_total"}, [hist, "otelgpu_train_steps_total"]),
        ({steps + "_count"}, [steps]),
    ):
        query = "?" + "&".join(f"name[]={n}" for n in sorted(selected))
        _, body = scrape(url + query, PROMETHEUS_ACCEPT)
        families = decode(body)
        assert sorted(f.name for f in families) == families_expected
        # the series of the selected families, as the full text answer has them
        assert set(_protobuf_series(families)) == {
            key
            for key in reference
            if any(key[0] == f or key[0].startswith(f + "_") for f in families_expected)
        }
        for f in families:
            if f.type == 4:
                assert all(m.histogram.HasField("schema") and m.histogram.bucket for m in f.metric)
    by_name = {f.name: f for f in decode(scrape(url + f"?name[]={hist}", PROMETHEUS_ACCEPT)[1])}
    assert sum(m.histogram.sample_count for m in by_name[hist].metric) == len(durations)
