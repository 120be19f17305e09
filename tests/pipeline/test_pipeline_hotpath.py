"""The hot-path shortcuts of steps and requests give exactly what the plain paths give.

``SketchHistogram.record_many`` / ``record_frozen``, ``LocalCounter.add_frozen``, the
the request label cache and
unsampled spans -- each checked against the public, slower path on real SDK objects.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import INVALID_SPAN

import otelgpu
from otelgpu import _runtime
from otelgpu.metrics import catalog
from otelgpu.otel.counters import LocalCounter
from otelgpu.otel.sketches import SketchHistogram, freeze
from otelgpu.otel.stats import InternalStats
from otelgpu.runtime import requests
from otelgpu.runtime.records import RequestRecord
from otelgpu.sketch import QuantileSketch

pytestmark = pytest.mark.usefixtures("reset_otel_globals")

VALUES = [0.001, 0.5, 0.25, 3.0, 0.125, 7.5, 0.002, 0.75]


def _same_sketch(a: Any, b: Any) -> None:
    assert (a.count, a.rejected) == (b.count, b.rejected)
    assert a.sum == pytest.approx(b.sum)
    assert (a.min, a.max) == (b.min, b.max)
    assert a.quantiles([0.1, 0.5, 0.9, 0.99]) == b.quantiles([0.1, 0.5, 0.9, 0.99])


# ------------------------------------------------------------------ record_many


def test_pipeline_record_many_equals_record_per_value() -> None:
    attrs = {"gen_ai.request.model": "m", "n": 2}
    one, many = SketchHistogram("a", "s", ""), SketchHistogram("b", "s", "")
    for v in VALUES:
        one.record(v, attrs)
    many.record_many(VALUES[:3], attrs)
    many.record_many(np.array(VALUES[3:], dtype=np.float64), dict(attrs))  # a float64 buffer
    assert len(many.series()) == 1
    (got_attrs, got), (_, want) = many.series()[0], one.series()[0]
    assert dict(got_attrs) == attrs
    _same_sketch(got, want)
    reference = QuantileSketch(relative_accuracy=0.01)
    for v in VALUES:
        reference.add(v)
    _same_sketch(got, reference)


def test_pipeline_record_many_rejects_bad_values_like_record() -> None:
    one, many = SketchHistogram("a", "s", ""), SketchHistogram("b", "s", "")
    batch: list[Any] = [0.5, math.nan, "x", math.inf, 2.0]
    for v in batch:
        one.record(v)
    many.record_many(iter(batch))  # an iterator, no attributes
    _same_sketch(many.merged(), one.merged())
    assert many.merged().rejected == 3


def test_pipeline_record_many_empty_batch_creates_no_series() -> None:
    hist = SketchHistogram("a", "s", "")
    hist.record_many([], {"k": "v"})
    hist.record_many(iter(()), {"k": "v"})
    hist.record_many(np.array([], dtype=np.float64))
    assert hist.series() == []


def test_pipeline_record_many_never_raises() -> None:
    stats = InternalStats()
    hist = SketchHistogram("a", "s", "", stats=stats)
    hist.record_many(42, {"k": "v"})  # type: ignore[arg-type]  # not iterable
    hist.record_many(None)  # type: ignore[arg-type]
    assert stats.errors() == {"record a": 2}
    hist.record_many([1.0, 2.0], {"k": "v"})
    assert hist.merged().count == 2
    hist.disable()
    hist.record_many([3.0])
    assert hist.merged().count == 2


def test_pipeline_record_many_respects_the_series_cap() -> None:
    hist = SketchHistogram("a", "s", "", max_series=1)
    hist.record_many([1.0], {"k": "1"})
    hist.record_many([2.0, 3.0], {"k": "2"})
    series = {tuple(sorted(a.items())): s.count for a, s in hist.series()}
    assert series == {(("k", "1"),): 1, (("otel.metric.overflow", True),): 2}


# ------------------------------------------------------------------ frozen keys


def test_pipeline_record_frozen_and_add_frozen_equal_the_plain_calls() -> None:
    attrs = {"a": "x", "b": 1}
    plain, keyed = SketchHistogram("p", "s", ""), SketchHistogram("k", "s", "")
    for v in VALUES:
        plain.record(v, attrs)
        keyed.record_frozen(v, freeze(attrs), attrs)
    _same_sketch(keyed.series()[0][1], plain.series()[0][1])
    assert dict(keyed.series()[0][0]) == attrs
    assert freeze(None) == freeze({}) == frozenset()

    meter = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("t")
    stats = InternalStats()
    counter = LocalCounter(meter, "c", "1", "", stats=stats)
    counter.add(3, attrs)
    counter.add_frozen(4, freeze(attrs), attrs)
    counter.add_frozen(0.5, freeze(attrs), attrs)  # type: ignore[arg-type]  # add()'s checks
    counter.add_frozen(-1, freeze(attrs), attrs)  # rejected, reported, not raised
    counter.add_frozen(True, freeze(attrs), attrs)  # a bool is no amount
    assert counter.value(attrs) == 7.5
    assert stats.errors() == {"counter c": 2}


# ------------------------------------------------------------------ span attributes


@pytest.fixture
def unsampled() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    otelgpu.instrument(
        tracer_provider=provider, meter_provider=meter_provider, exporters="none", gpu=False
    )
    yield exporter
    otelgpu.shutdown()
    provider.shutdown()
    meter_provider.shutdown()


def test_pipeline_unsampled_spans_still_record_metrics(unsampled: InMemorySpanExporter) -> None:
    runtime = _runtime.current()
    assert runtime is not None
    with otelgpu.step(samples=8, tokens=100, attributes={"job": "j"}) as s:
        pass
    with otelgpu.request(model="m", queue_time_s=0.5) as r:
        r.first_token()
        r.tokens(3)
        r.input_tokens(7)
    assert s.duration_s is not None and r.duration_s is not None
    assert unsampled.get_finished_spans() == ()
    assert runtime.step_duration.merged().count == 1
    assert runtime.instrument(catalog.TRAIN_SAMPLES).value({"job": "j"}) == 8
    assert runtime.instrument(catalog.TRAIN_TOKENS).value({"job": "j"}) == 100
    base = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "_OTHER"}
    base["gen_ai.request.model"] = "m"
    assert runtime.ttft.merged().count == runtime.tpot.merged().count == 1
    assert runtime.queue_duration.merged().max == pytest.approx(0.5, rel=0.01)
    requests_ = runtime.instrument(catalog.REQUESTS)
    assert requests_.value({**base, "otelgpu.request.outcome": "ok"}) == 1
    tokens_ = runtime.instrument(catalog.OUTPUT_TOKENS)
    assert tokens_.value({**base, "gen_ai.token.type": "output"}) == 3
    assert tokens_.value({**base, "gen_ai.token.type": "input"}) == 7


def test_pipeline_request_label_cache_is_bounded_and_exact(reset_otel_globals: None) -> None:
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    tracer_provider = TracerProvider()
    otelgpu.instrument(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        exporters="none",
        gpu=False,
    )
    try:
        runtime = _runtime.current()
        assert runtime is not None
        models = [f"m{i}" for i in range(requests._LABEL_CACHE_SIZE + 44)]
        for _ in range(2):
            for model in models:
                runtime.record_request(
                    RequestRecord(
                        0, 2_000_000, model=model, output_tokens=2, first_token_ns=1_000_000
                    )
                )
        runtime.record_request(
            RequestRecord(0, 1_000_000, model="m0", outcome="timeout", error_type="timeout")
        )
        assert len(runtime.requests._label_cache) <= requests._LABEL_CACHE_SIZE
        base = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "_OTHER"}
        for model in ("m0", models[-1]):
            ok = {**base, "gen_ai.request.model": model, "otelgpu.request.outcome": "ok"}
            requests_ = runtime.instrument(catalog.REQUESTS)
            assert requests_.value(ok) == 2
        timeout = {**base, "gen_ai.request.model": "m0", "otelgpu.request.outcome": "timeout"}
        assert requests_.value(timeout) == 1
        durations = {
            (a.get("gen_ai.request.model"), a.get("error.type")): s.count
            for a, s in runtime.request_duration.series()
        }
        assert durations[("m0", None)] == 2
        assert durations[("m0", "timeout")] == 1
        assert len(durations) == len(models) + 1
        assert runtime.tpot.merged().count == 2 * len(models)
        # An attribute value the metrics cannot key is reported, never raised.
        span = runtime.record_request(
            RequestRecord(0, 1_000_000, model="m0", attributes={"bad": {"x": 1}})
        )
        assert span is not INVALID_SPAN
        assert runtime.stats.errors().get("counter otelgpu.inference.requests") == 1
    finally:
        otelgpu.shutdown()
        tracer_provider.shutdown()
        meter_provider.shutdown()


def test_pipeline_request_labels_follow_attribute_values(app_runtime: _runtime.Runtime) -> None:
    runtime = app_runtime
    tags = ["a"]
    attrs: dict[str, Any] = {"engine": "e0", "tags": tags}
    runtime.record_request(
        RequestRecord(0, 1_000_000, model="m", attributes=attrs, output_tokens=1)
    )
    tags.append("b")  # the caller mutates its list and dict: new values, new series
    attrs["engine"] = "e1"
    runtime.record_request(
        RequestRecord(0, 1_000_000, model="m", attributes=attrs, output_tokens=2)
    )
    runtime.record_request(
        RequestRecord(
            0,
            1_000_000,
            model="m",
            attributes={"engine": "e1", "tags": ["a", "b"]},
            output_tokens=4,
        )
    )
    runtime.record_request(
        RequestRecord(0, 1_000_000, model="m", attributes=attrs, outcome="timeout")
    )
    base = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "_OTHER"}
    base["gen_ai.request.model"] = "m"
    first = {**base, "engine": "e0", "tags": ["a"]}
    second = {**base, "engine": "e1", "tags": ["a", "b"]}
    tokens_ = runtime.instrument(catalog.OUTPUT_TOKENS)
    assert tokens_.value({**first, "gen_ai.token.type": "output"}) == 1
    assert tokens_.value({**second, "gen_ai.token.type": "output"}) == 6
    requests_ = runtime.instrument(catalog.REQUESTS)
    assert requests_.value({**second, "otelgpu.request.outcome": "timeout"}) == 1
    series = sorted(
        (dict(a).get("error.type") or "", tuple(a["tags"]), s.count)
        for a, s in runtime.request_duration.series()
    )
    assert series == [("", ("a",), 1), ("", ("a", "b"), 2), ("timeout", ("a", "b"), 1)]


@pytest.fixture
def app_runtime() -> Iterator[_runtime.Runtime]:
    tracer_provider = TracerProvider()
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    otelgpu.instrument(
        tracer_provider=tracer_provider, meter_provider=meter_provider, exporters="none", gpu=False
    )
    runtime = _runtime.current()
    assert runtime is not None
    yield runtime
    otelgpu.shutdown()
    tracer_provider.shutdown()
    meter_provider.shutdown()
