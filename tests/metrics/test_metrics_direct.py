"""Direct metrics against the SDK: the same observations through an SDK observable
instrument and through ``DirectMetrics`` export the same data, collection after collection.

The SDK side is the real SDK (``MeterProvider`` + ``InMemoryMetricReader``, cumulative or
delta preference); the direct side is what otelgpu's readers append. Compared: metric
name, description, unit, data kind, temporality, monotonicity, and every point's
attributes and value in order. Times are checked against their own contract (the SDK
stamps a new series a moment after the collection began, otelgpu at it).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from fixtures.otel import attributes_of, point_value
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import (
    MeterProvider,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    InMemoryMetricReader,
    Metric,
    Sum,
)

from otelgpu.metrics.direct import DirectMetrics, Point
from otelgpu.metrics.spec import Area, Kind, MetricSpec

C, D = AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA
KINDS = (Kind.OBSERVABLE_GAUGE, Kind.OBSERVABLE_COUNTER, Kind.OBSERVABLE_UP_DOWN_COUNTER)
PREFERENCES: dict[str, dict[type, AggregationTemporality]] = {
    "cumulative": dict.fromkeys((ObservableCounter, ObservableUpDownCounter, ObservableGauge), C),
    "delta": {ObservableCounter: D, ObservableUpDownCounter: C, ObservableGauge: C},
    "all-delta": dict.fromkeys((ObservableCounter, ObservableUpDownCounter, ObservableGauge), D),
}


def _spec(kind: Kind) -> MetricSpec:
    return MetricSpec(f"test.direct.{kind.value}", kind, "By", "A test metric.", Area.GPU)


class _Script:
    """Hands out one scripted collection's points per call (both sides read the same)."""

    def __init__(self, spec: MetricSpec, rounds: Sequence[Sequence[Point]]) -> None:
        self.spec = spec
        self.rounds = list(rounds)
        self.sdk_round = self.direct_round = 0

    def sdk_callback(self, _options: CallbackOptions) -> Iterable[Observation]:
        points = self.rounds[self.sdk_round]
        self.sdk_round += 1
        return [Observation(value, attributes) for value, attributes in points]

    def collect_points(self) -> list[tuple[MetricSpec, Sequence[Point]]]:
        points = self.rounds[self.direct_round]
        self.direct_round += 1
        return [(self.spec, points)]


def _sdk_side(
    script: _Script, temporality: dict[type, AggregationTemporality] | None = None
) -> tuple[InMemoryMetricReader, MeterProvider]:
    """The real SDK fed by ``script``: an observable instrument of its spec's kind."""
    reader = InMemoryMetricReader(preferred_temporality=temporality)
    provider = MeterProvider(metric_readers=[reader])
    meter = provider.get_meter("t")
    factory = {
        Kind.OBSERVABLE_GAUGE: meter.create_observable_gauge,
        Kind.OBSERVABLE_COUNTER: meter.create_observable_counter,
        Kind.OBSERVABLE_UP_DOWN_COUNTER: meter.create_observable_up_down_counter,
    }[script.spec.kind]
    spec = script.spec
    factory(
        spec.name, callbacks=[script.sdk_callback], unit=spec.unit, description=spec.description
    )
    return reader, provider


def _shape(metric: Metric | None) -> Any:
    if metric is None:
        return None
    data = metric.data
    kind = type(data).__name__
    extra = (data.aggregation_temporality, data.is_monotonic) if isinstance(data, Sum) else ()
    points = [(attributes_of(p), point_value(p), type(point_value(p))) for p in data.data_points]
    return (metric.name, metric.description, metric.unit, kind, extra, points)


def _generated_rounds(seed: int) -> list[list[Point]]:
    """Series that come, go and come back; duplicate attribute sets within a round;
    int and float values; attribute values 1, 1.0 and True (three series to the SDK)."""
    rng = random.Random(seed)
    pool: list[dict[str, Any]] = [
        {"hw.id": f"GPU-{i}", "hw.type": "gpu", "n": i} for i in range(5)
    ] + [{"k": 1}, {"k": 1.0}, {"k": True}, {}, {"k": "a", "l": ["x", "y"]}]
    rounds: list[list[Point]] = []
    for _ in range(8):
        chosen = rng.sample(pool, rng.randint(0, len(pool)))
        if chosen and rng.random() < 0.5:
            chosen.append(dict(rng.choice(chosen)))  # the same attribute set again
        points: list[Point] = []
        for attributes in chosen:
            value: float | int = rng.randint(0, 50)
            if rng.random() < 0.4:
                value = value + rng.random()
            points.append((value, attributes))
        rounds.append(points)
    return rounds


@pytest.mark.parametrize("preference", sorted(PREFERENCES))
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
@pytest.mark.parametrize("seed", range(6))
def test_direct_metrics_export_what_the_sdk_exports(kind: Kind, preference: str, seed: int) -> None:
    spec = _spec(kind)
    temporality = PREFERENCES[preference]
    script = _Script(spec, _generated_rounds(seed))
    sdk_reader, provider = _sdk_side(script, temporality)
    direct = DirectMetrics()
    direct.add_source(script)
    reader = direct.reader(temporality)
    previous_time: dict[Any, int] = {}
    try:
        for round_no in range(len(script.rounds)):
            data = sdk_reader.get_metrics_data()
            sdk_metrics = (
                [m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]
                if data is not None
                else []
            )
            now = 1_000_000_000 * (round_no + 1)
            ours = reader.collect(now)
            assert len(ours) <= 1 and len(sdk_metrics) <= 1
            assert _shape(ours[0] if ours else None) == _shape(
                sdk_metrics[0] if sdk_metrics else None
            ), f"round {round_no}"
            for point in ours[0].data.data_points if ours else ():
                assert point.time_unix_nano == now
                key = frozenset((k, type(v), str(v)) for k, v in attributes_of(point).items())
                if isinstance(ours[0].data, Gauge):
                    assert point.start_time_unix_nano is None
                elif ours[0].data.aggregation_temporality is D:
                    # Since the series' previous point (its first: its first collection).
                    assert point.start_time_unix_nano == previous_time.get(key, now)
                else:
                    assert point.start_time_unix_nano <= now
                previous_time[key] = now
    finally:
        provider.shutdown()


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_past_the_cardinality_limit_new_series_overflow_as_in_the_sdk(kind: Kind) -> None:
    from otelgpu.metrics.direct import CARDINALITY_LIMIT

    spec = _spec(kind)
    first = [(1, {"i": i}) for i in range(CARDINALITY_LIMIT - 3)]
    second = [(2, {"i": i}) for i in range(CARDINALITY_LIMIT + 7)]
    script = _Script(spec, [first, second, second])
    sdk_reader, provider = _sdk_side(script)
    direct = DirectMetrics()
    direct.add_source(script)
    reader = direct.reader()
    try:
        for now in (1, 2, 3):
            data = sdk_reader.get_metrics_data()
            assert data is not None
            (sdk_metric,) = [
                m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
            ]
            (ours,) = reader.collect(now)
            assert _shape(ours) == _shape(sdk_metric)
        points = ours.data.data_points
        assert len(points) == CARDINALITY_LIMIT + 1
        assert attributes_of(points[-1]) == {"otel.metric.overflow": True}
    finally:
        provider.shutdown()


def test_a_failing_source_is_counted_and_the_others_still_export() -> None:
    class Broken:
        def collect_points(self) -> list[tuple[MetricSpec, Sequence[Point]]]:
            raise RuntimeError("sampler gone")

    spec = _spec(Kind.OBSERVABLE_GAUGE)
    direct = DirectMetrics()
    direct.add_source(Broken())
    direct.add_source(_Script(spec, [[(1, {"a": "b"})]]))
    (metric,) = direct.reader().collect(5)
    assert metric.name == spec.name and [point_value(p) for p in metric.data.data_points] == [1]
    assert direct.stats.errors() == {"direct metrics": 1}


def test_removed_sources_stop_exporting_and_readers_keep_their_own_series() -> None:
    spec = _spec(Kind.OBSERVABLE_COUNTER)
    script = _Script(spec, [[(5, {"a": "b"})], [(7, {"a": "b"})], [(9, {"a": "b"})]])
    direct = DirectMetrics()
    direct.add_source(script)
    direct.add_source(script)  # idempotent
    delta = direct.reader({ObservableCounter: D})
    (first,) = delta.collect(10)
    (second,) = delta.collect(20)
    assert [(point_value(p), p.start_time_unix_nano) for p in first.data.data_points] == [(5, 10)]
    assert [(point_value(p), p.start_time_unix_nano) for p in second.data.data_points] == [(2, 10)]
    cumulative = direct.reader()  # a second consumer: its own series, from its first look
    (third,) = cumulative.collect(30)
    assert [(point_value(p), p.start_time_unix_nano) for p in third.data.data_points] == [(9, 30)]
    direct.remove_source(script)
    assert delta.collect(40) == [] and cumulative.collect(40) == []
