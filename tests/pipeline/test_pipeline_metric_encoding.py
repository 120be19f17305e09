"""otelgpu's OTLP metric encoder (``otelgpu.otel.metric_protobuf``): the same request as the
SDK's encoder, byte for byte, on collections of otelgpu's shape and on generated data of
every kind, built in slices of bounded CPU time, and sent as it is
through the SDK's own OTLP gRPC and HTTP exporters to a live receiver
(``otelgpu.otel.metric_encoding``)."""

from __future__ import annotations

import functools
import random
import struct
import time
from typing import Any

import pytest
from fixtures.function_twins import twin_params, use_twin
from fixtures.generated_metrics import generated_metrics
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    InMemoryMetricReader,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.util.types import AttributeValue

from otelgpu.otel import metric_protobuf, slicing
from otelgpu.otel.exporters import GuardedMetricExporter, append_metrics, preferred_temporality
from otelgpu.otel.sketches import SketchRegistry
from otelgpu.otel.stats import InternalStats


def _collection(gpus: int = 8) -> MetricsData:
    """A collection shaped like otelgpu's: gauges and counters per GPU, histograms, an
    exponential histogram view, two scopes, and sketch histograms with many series."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(
        metric_readers=[reader],
        resource=Resource.create({"service.name": "enc", "host.name": "h"}),
        views=[
            View(instrument_name="lat.exp", aggregation=ExponentialBucketHistogramAggregation())
        ],
    )
    meter = provider.get_meter("otelgpu", "1.0")
    other = provider.get_meter("user.lib", schema_url="https://opentelemetry.io/schemas/1.21")

    def observe(i: int, _options: CallbackOptions) -> list[Observation]:
        return [
            _obs(float(g * i) + 0.5, {"gpu.index": g, "gpu.uuid": f"GPU-{g}", "ok": True})
            for g in range(gpus)
        ]

    for i in range(20):
        meter.create_observable_gauge(
            f"gpu.m{i}",
            callbacks=[functools.partial(observe, i)],
            unit="1",
            description=f"metric {i}",
        )
    counter = meter.create_counter("steps", unit="{step}")
    updown = other.create_up_down_counter("queue")
    hist = meter.create_histogram("lat", unit="s")
    exp = meter.create_histogram("lat.exp", unit="s")
    for j in range(40):
        attrs: dict[str, AttributeValue] = {"model": f"m{j % 5}", "rank": j % 3}
        counter.add(j + 1, attrs)
        updown.add(j - 20, attrs)
        hist.record(j / 7, attrs)
        exp.record(j / 11 + 1e-3, attrs)
    data = reader.get_metrics_data()
    assert data is not None
    provider.shutdown()
    registry = SketchRegistry(
        relative_accuracy=0.01, max_series=1000, quantiles=(0.5, 0.99), stats=InternalStats()
    )
    sketch = registry.get("otelgpu.request.duration", "s", "Request duration.")
    for k in range(2000):
        sketch.record(0.001 * (k % 97 + 1), {"model": f"m{k % 30}"})
    return append_metrics(data, registry.metrics(123_000_000_000))


def _obs(value: float, attrs: dict[str, Any]) -> Observation:
    return Observation(value, attrs)


class _EveryTick(slicing.Slicer):
    """Pauses at every tick and records the thread CPU time between two ticks."""

    def __init__(self) -> None:
        super().__init__()
        self.slices: list[float] = []
        self._last = time.thread_time()

    def tick(self) -> None:
        now = time.thread_time()
        self.slices.append(now - self._last)
        self._last = now


@pytest.fixture(
    params=twin_params(metric_protobuf.py_number_points, "otelgpu.otel._otlp_c", "number_points")
)
def number_twin(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``metric_protobuf`` with one twin of ``number_points`` in use (both where both exist)."""
    return use_twin(request, monkeypatch, metric_protobuf, "number_points")


def test_request_is_byte_identical_to_the_sdk_encoder(number_twin: Any) -> None:
    data = _collection()
    slicer = _EveryTick()
    encoded = metric_protobuf.encode_request(data, slicer)
    assert encoded == encode_metrics(data).SerializeToString()
    points = sum(
        len(m.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    )
    assert len(slicer.slices) >= points  # a chance to hand the GIL back before every point
    # again, with the attribute caches warm
    assert metric_protobuf.encode_request(data) == encode_metrics(data).SerializeToString()


def test_request_is_byte_identical_on_generated_data_of_every_kind(number_twin: Any) -> None:
    """300 generated collections: every data kind, ints and floats, NaN and infinities,
    empty histograms, exemplars with and without a span, buckets on both sides, negative
    scales, equal scopes, schema URLs."""
    rng = random.Random(20261205)
    for _ in range(300):
        data = generated_metrics(rng)
        assert metric_protobuf.encode_request(data) == encode_metrics(data).SerializeToString()


def test_direct_metrics_fixed_attributes_encode_as_the_sdk_encodes_them(number_twin: Any) -> None:
    """The GPU metrics built by ``otelgpu.metrics.direct`` carry ``FixedAttributes`` whose
    encoding is kept: the request is the SDK's, the first time and from the kept bytes."""
    from otelgpu.metrics.direct import DirectMetrics, Point
    from otelgpu.metrics.spec import Area, Kind, MetricSpec

    specs = [
        MetricSpec(f"direct.{kind.value}", kind, "1", "d", Area.GPU)
        for kind in (Kind.OBSERVABLE_GAUGE, Kind.OBSERVABLE_COUNTER)
    ]
    devices = [{"hw.id": f"GPU-{i}", "hw.type": "gpu", "idx": i, "ok": True} for i in range(4)]

    class Source:
        def collect_points(self) -> list[tuple[MetricSpec, list[Point]]]:
            return [(spec, [(i + 0.5, attrs) for i, attrs in enumerate(devices)]) for spec in specs]

    direct = DirectMetrics()
    direct.add_source(Source())
    reader = direct.reader()
    resource = Resource.create({"service.name": "enc"})
    for now in (10, 20):  # the second collection encodes from the kept bytes
        metrics = reader.collect(now)
        points = [p for m in metrics for p in m.data.data_points]
        assert points and all(
            isinstance(p.attributes, metric_protobuf.FixedAttributes) for p in points
        )
        data = append_metrics(MetricsData([ResourceMetrics(resource, [], "")]), metrics)
        assert metric_protobuf.encode_request(data) == encode_metrics(data).SerializeToString()
    assert all(p.attributes.encoded for p in points)  # type: ignore[union-attr]


def test_values_the_sdk_refuses_raise(number_twin: Any) -> None:
    from opentelemetry.sdk.metrics.export import Gauge, Metric, NumberDataPoint

    rm = _collection(gpus=1).resource_metrics[0]
    big = Metric("big", "", "", Gauge([NumberDataPoint({}, 0, 1, 1 << 64)]))
    data = MetricsData(
        [ResourceMetrics(rm.resource, [ScopeMetrics(rm.scope_metrics[0].scope, [big], "")], "")]
    )
    with pytest.raises(Exception):  # noqa: B017 - the SDK's is wrapped in EncodingException
        encode_metrics(data)
    with pytest.raises(ValueError, match="out of range"):
        metric_protobuf.encode_request(data)


def test_number_point_twins_agree_on_awkward_points(number_twin: Any) -> None:
    """Points the native writer hands to the twin (exemplars, int subclasses, float
    subclasses, times beyond int64, no start time) and those it writes itself (bools, the
    int64 limits, NaN, fixed attribute sets, non-plain attribute values): the SDK's bytes,
    and the SDK's refusals."""
    from enum import IntEnum

    from opentelemetry.sdk.metrics import Exemplar
    from opentelemetry.sdk.metrics.export import Gauge, Metric, NumberDataPoint

    class Level(IntEnum):
        HIGH = 3

    class Ratio(float):
        pass

    fixed = metric_protobuf.FixedAttributes({"hw.id": "GPU-0", "n": 1, "ok": True})
    values: list[Any] = [
        0, -1, (1 << 63) - 1, -(1 << 63), 0.0, -0.0, float("nan"), float("inf"), 1e300,
        Level.HIGH, Ratio(0.25),
    ]  # fmt: skip
    attribute_sets: list[Any] = [{}, {"a": "x"}, {"b": b"raw", "c": [1, 2]}, fixed, None]
    times = [(0, 0), (None, 5), (1, (1 << 63) + 7), (123, 456)]

    def points_of(values: list[Any]) -> list[Any]:
        return [
            NumberDataPoint(attrs, start, end, value)  # type: ignore[arg-type]
            for value in values
            for attrs in attribute_sets
            for start, end in times
        ]

    points = points_of(values)
    exemplar = Exemplar({"e": 1}, 2.5, 99, 0xABC, 0xDEF)
    points.append(NumberDataPoint({"x": 1}, 1, 2, 7, exemplars=[exemplar]))
    rm = _collection(gpus=1).resource_metrics[0]
    for monotonic in (True, False):
        metrics = [
            Metric("g", "", "", Gauge(points)),
            Metric("s", "d", "1", Sum(points, AggregationTemporality.CUMULATIVE, monotonic)),
        ]
        scope = ScopeMetrics(rm.scope_metrics[0].scope, metrics, "")
        data = MetricsData([ResourceMetrics(rm.resource, [scope], "")])
        assert metric_protobuf.encode_request(data) == encode_metrics(data).SerializeToString()
    assert fixed.encoded  # kept on the set, as the twin keeps it
    # Bools: the SDK's encoder refuses them (as_int "expected an int"); otelgpu writes
    # them as the ints they are -- the same bytes from both twins.
    bools = points_of([True, False])
    for start in (True, False):
        assert number_twin(bools, start, lambda: None) == metric_protobuf.py_number_points(
            bools, start, lambda: None
        )
    ticks: list[int] = []
    number_twin(points, True, lambda: ticks.append(1))
    assert len(ticks) == len(points)  # a chance to hand the GIL back before every point
    for bad in (NumberDataPoint({}, -1, 2, 1.0), NumberDataPoint({}, 1, 2, 1 << 64)):
        with pytest.raises((ValueError, struct.error)):
            number_twin([bad], True, lambda: None)


def test_grouping_quirks_match_the_sdk() -> None:
    """A resource or scope listed twice: first position, last contents (the SDK's dicts)."""
    data = _collection(gpus=2)
    rm = data.resource_metrics[0]
    s0, s1 = rm.scope_metrics[0], rm.scope_metrics[-1]
    other_resource = Resource.create({"service.name": "other"})
    tricky = MetricsData(
        [
            ResourceMetrics(rm.resource, [s0, s1, ScopeMetrics(s0.scope, s0.metrics[:3], "")], ""),
            ResourceMetrics(other_resource, [s1], "https://x"),
            ResourceMetrics(rm.resource, [s1, s0], rm.schema_url),
            ResourceMetrics(other_resource, [], ""),
        ]
    )
    expected = encode_metrics(tricky).SerializeToString()
    assert metric_protobuf.encode_request(tricky) == expected
    empty = MetricsData([])
    assert metric_protobuf.encode_request(empty) == b""


def test_longest_slice_is_bounded_in_thread_cpu_time() -> None:
    """No slice of the encoding holds the GIL long: thread CPU time between two chances to
    hand it back stays far below the whole encoding (load-robust: CPU, not wall time)."""
    data = _collection(gpus=8)
    encode_metrics(data)  # warm caches
    best_total = min(_cpu(lambda: encode_metrics(data)) for _ in range(3))
    longest = min(max(_slices(data)) for _ in range(3))
    assert longest < 0.002, f"longest slice {longest * 1e3:.2f} ms CPU"
    assert longest < best_total / 4, (longest, best_total)


def _cpu(fn: Any) -> float:
    t0 = time.thread_time()
    fn()
    return time.thread_time() - t0


def _slices(data: MetricsData) -> list[float]:
    slicer = _EveryTick()
    metric_protobuf.encode_request(data, slicer)
    slicer.tick()
    return slicer.slices


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_guarded_otlp_exporter_sends_otelgpus_request(otlp_receiver: Any, protocol: str) -> None:
    from otelgpu._settings import Settings
    from otelgpu.otel.exporters import otlp_metric_exporter

    endpoint = otlp_receiver.grpc_endpoint if protocol == "grpc" else otlp_receiver.http_endpoint
    settings = Settings(otlp_endpoint=endpoint, otlp_protocol=protocol, otlp_insecure=True)
    temporality = preferred_temporality({})
    inner = otlp_metric_exporter(settings, temporality)
    guarded = GuardedMetricExporter(inner, InternalStats(), temporality=temporality)
    assert guarded._send is not None  # otelgpu's encoder is used, not the SDK's
    data = _collection(gpus=4)
    assert guarded.export(data) is MetricExportResult.SUCCESS
    requests = otlp_receiver.requests("metrics")
    assert len(requests) == 1
    assert requests[0].SerializeToString() == encode_metrics(data).SerializeToString()
    guarded.shutdown()


def test_batch_size_setting_keeps_the_sdk_path(otlp_receiver: Any) -> None:
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    inner = OTLPMetricExporter(
        endpoint=otlp_receiver.grpc_endpoint, insecure=True, max_export_batch_size=50
    )
    guarded = GuardedMetricExporter(inner, InternalStats(), temporality=preferred_temporality({}))
    data = _collection(gpus=4)
    assert guarded.export(data) is MetricExportResult.SUCCESS
    requests = otlp_receiver.requests("metrics")
    assert len(requests) > 1  # split by the SDK, as configured
    sent = sum(
        len(getattr(m, m.WhichOneof("data")).data_points)
        for r in requests
        for rm in r.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    )
    assert sent == sum(
        len(m.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    )
    guarded.shutdown()


def test_recording_metrics_line_is_the_sdk_request_as_json() -> None:
    import json

    from otelgpu.otel.recording import metrics_json_line, to_json_line

    data = _collection(gpus=3)
    assert json.loads(metrics_json_line(data)) == json.loads(to_json_line(encode_metrics(data)))


def test_recording_metrics_line_is_built_one_data_point_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The JSON line of an 8-GPU collection (sketches with hundreds of buckets included)
    is the SDK request's JSON, character for character, and the recording hands the GIL
    back between data points: one chance per point (``otelgpu.otel.metric_json``)."""
    from otelgpu.otel import metric_json, recording

    data = _collection(gpus=8)
    points = sum(
        len(m.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    )
    made: list[_EveryTick] = []

    def every_tick() -> _EveryTick:
        made.append(_EveryTick())
        return made[-1]

    monkeypatch.setattr(metric_json, "Slicer", every_tick)
    line = recording.metrics_json_line(data)
    assert line == recording.to_json_line(encode_metrics(data))
    assert len(made) == 1
    assert len(made[0].slices) >= points  # one tick before each data point
