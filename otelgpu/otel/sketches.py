"""Sketch-backed histograms: record into native sketches, export as OTLP exponential histograms.

A :class:`SketchHistogram` keeps one :class:`otelgpu.sketch.QuantileSketch` per attribute
set (at most ``max_series``; further sets fold into one series with
``otel.metric.overflow=true``, as the SDK's cardinality limit does). Export is lossless:
the sketch's buckets *are* the exponential-histogram buckets (``QuantileSketch.to_data_point``).

Temporality is cumulative: each series keeps the start time of its first record, so a
backend sees one monotonic series per attribute set. The quantile gauges
(``<name>.quantile{quantile=0.95}``) are cumulative too (over the whole run).

Export (:meth:`SketchHistogram.to_metric`, the quantile gauges) hands the GIL back between
series once its thread held it for a slice (:mod:`otelgpu.otel.slicing`), so converting
many series never stalls the host in one piece.

Hot path: :meth:`SketchHistogram.record` is a dict lookup plus ``sketch.add`` (the sketch
is thread-safe); the registry lock is taken only to create a series. It never raises.
:meth:`SketchHistogram.record_many` adds a batch for one attribute set (one lookup, one
``sketch.add_many``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    ExponentialHistogram,
    Metric,
)

from otelgpu.otel import histogram_rule, slicing
from otelgpu.otel.stats import InternalStats

OVERFLOW_ATTRIBUTES: Mapping[str, Any] = {"otel.metric.overflow": True}

#: The key of the series without attributes (shared: no frozenset built per record).
_EMPTY_KEY: frozenset[Any] = frozenset()


def freeze(attributes: Mapping[str, Any] | None) -> Any:
    """The series key of an attribute set (hashable, order-insensitive; ``None`` = empty)."""
    return _freeze(attributes) if attributes else _EMPTY_KEY


def _freeze(attributes: Mapping[str, Any]) -> Any:
    """A hashable key for an attribute set (order-insensitive)."""
    try:
        return frozenset(attributes.items())
    except TypeError:  # list-valued attributes
        return frozenset((k, tuple(v) if isinstance(v, list) else v) for k, v in attributes.items())


@dataclass
class _Series:
    attributes: Mapping[str, Any]
    sketch: Any  # QuantileSketch (native or pure twin)
    start_time_unix_nano: int


class SketchHistogram:
    """One metric (name, unit, description) recorded into per-attribute-set sketches."""

    def __init__(
        self,
        name: str,
        unit: str,
        description: str,
        *,
        relative_accuracy: float = 0.01,
        max_series: int = 1000,
        stats: InternalStats | None = None,
    ) -> None:
        from otelgpu.sketch import QuantileSketch

        self.name = name
        self.unit = unit
        self.description = description
        self._factory = QuantileSketch
        self._relative_accuracy = relative_accuracy
        self._max_series = max_series
        self._stats = stats or InternalStats()
        self._series: dict[Any, _Series] = {}
        self._lock = threading.Lock()
        self._enabled = True

    # ------------------------------------------------------------------ hot path
    def record(self, value: float, attributes: Mapping[str, Any] | None = None) -> None:
        """Add one measurement (in ``unit``) for ``attributes``. Never raises."""
        if not self._enabled:
            return
        try:
            key = _freeze(attributes) if attributes else _EMPTY_KEY
            series = self._series.get(key)
            if series is None:
                series = self._create(key, attributes or {})
            series.sketch.add(value)
        except Exception as exc:  # noqa: BLE001 - hot path: count, never raise
            self._stats.report_error(f"record {self.name}", exc)

    def record_frozen(self, value: float, key: Any, attributes: Mapping[str, Any]) -> None:
        """:meth:`record` with the attribute set's key already computed (``freeze(attributes)``).

        For callers that record the same attribute set many times and keep its key (the
        runtime's request metrics). ``key`` must equal ``freeze(attributes)``. Never raises.
        """
        if not self._enabled:
            return
        try:
            series = self._series.get(key)
            if series is None:
                series = self._create(key, attributes)
            series.sketch.add(value)
        except Exception as exc:  # noqa: BLE001 - hot path: count, never raise
            self._stats.report_error(f"record {self.name}", exc)

    def record_many(self, values: Any, attributes: Mapping[str, Any] | None = None) -> None:
        """Add every value of ``values`` (an iterable or float64 buffer) for ``attributes``.

        Same result as :meth:`record` for each value in order (non-numbers, NaN and
        infinities are counted as the sketch's rejected values), but the attribute set is
        looked up once and the sketch lock taken once. Never raises: a ``values`` that is
        not iterable is reported in ``otelgpu.internal.errors``. An empty batch creates no
        series.
        """
        if not self._enabled:
            return
        try:
            if isinstance(values, Sized) and not len(values):
                return
            key = _freeze(attributes) if attributes else _EMPTY_KEY
            series = self._series.get(key)
            if series is None:
                values = list(values)  # an iterator: do not create a series for nothing
                if not values:
                    return
                series = self._create(key, attributes or {})
            series.sketch.add_many(values)
        except Exception as exc:  # noqa: BLE001 - hot path: count, never raise
            self._stats.report_error(f"record {self.name}", exc)

    def _create(self, key: Any, attributes: Mapping[str, Any]) -> _Series:
        with self._lock:
            series = self._series.get(key)
            if series is not None:
                return series
            if len(self._series) >= self._max_series:
                key = _freeze(OVERFLOW_ATTRIBUTES)
                series = self._series.get(key)
                if series is not None:
                    return series
                attributes = OVERFLOW_ATTRIBUTES
            series = _Series(
                dict(attributes),
                self._factory(relative_accuracy=self._relative_accuracy),
                time.time_ns(),
            )
            self._series[key] = series
            return series

    # ------------------------------------------------------------------ reading
    def series(self) -> list[tuple[Mapping[str, Any], Any]]:
        """(attributes, sketch) pairs; the sketches are live, not copies."""
        with self._lock:
            return [(s.attributes, s.sketch) for s in self._series.values()]

    def merged(self) -> Any:
        """One sketch merging every series (a copy)."""
        out = self._factory(relative_accuracy=self._relative_accuracy)
        for _, sketch in self.series():
            out.merge(sketch)
        return out

    def to_metric(self, time_unix_nano: int) -> Metric | None:
        """The cumulative exponential histogram of all non-empty series, or ``None``."""
        with self._lock:
            all_series = list(self._series.values())
        points = []
        for s in all_series:
            # Many series are converted on the export thread: hand the GIL back between
            # them once a slice is used (otelgpu.otel.slicing).
            slicing.tick()
            if s.sketch.count:
                points.append(
                    s.sketch.to_data_point(
                        s.start_time_unix_nano, time_unix_nano, dict(s.attributes)
                    )
                )
        if not points:
            return None
        return Metric(
            name=self.name,
            description=self.description,
            unit=self.unit,
            data=ExponentialHistogram(
                data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE
            ),
        )

    def observe_quantiles(self, quantiles: Sequence[float]) -> Iterable[Observation]:
        """One observation per (series, quantile): the cumulative quantile estimate.

        By the rule the exported histogram implies (nearest rank, ``ceil(q * n)``-th value;
        :mod:`otelgpu.otel.histogram_rule`), so the gauge and a backend's
        ``histogram_quantile`` over the same data agree: with two values p95 and p99 are
        the larger one, with ten values p99 is the maximum.
        """
        for attributes, sketch in self.series():
            slicing.tick()  # one collection may convert many series (otelgpu.otel.slicing)
            if not sketch.count:
                continue
            point = sketch.to_data_point(0, 0)
            estimates = histogram_rule.quantiles(point, quantiles)
            for q, value in zip(quantiles, estimates, strict=True):
                if not math.isnan(value):
                    yield Observation(value, {**attributes, "quantile": q})

    def reset(self) -> None:
        """Drop every series (a forked child must not re-export the parent's data)."""
        with self._lock:
            self._series = {}

    def disable(self) -> None:
        """Make :meth:`record` a no-op (after shutdown)."""
        self._enabled = False

    def after_fork_in_child(self) -> None:
        """Forget every series and stop recording, without waiting for the lock.

        In a forked child only the forking thread exists: a lock another parent thread
        held at fork time (an export reading the series) would never be released, so it
        is replaced rather than acquired.
        """
        self._lock = threading.Lock()
        self._series = {}
        self._enabled = False


class SketchRegistry:
    """All sketch histograms of one runtime; builds their metrics for each export."""

    def __init__(
        self,
        *,
        relative_accuracy: float,
        max_series: int,
        quantiles: Sequence[float],
        stats: InternalStats,
    ) -> None:
        self._relative_accuracy = relative_accuracy
        self._max_series = max_series
        self.quantiles = tuple(quantiles)
        self._stats = stats
        self._lock = threading.Lock()
        self._histograms: dict[str, SketchHistogram] = {}
        self._meters: list[Meter] = []

    def get(self, name: str, unit: str, description: str) -> SketchHistogram:
        """The histogram ``name`` (created on first use; later calls return the same)."""
        with self._lock:
            hist = self._histograms.get(name)
            if hist is not None:
                return hist
            hist = SketchHistogram(
                name,
                unit,
                description,
                relative_accuracy=self._relative_accuracy,
                max_series=self._max_series,
                stats=self._stats,
            )
            self._histograms[name] = hist
            meters = list(self._meters)
        for meter in meters:
            self._register_gauge(meter, hist)
        return hist

    def add_meter(self, meter: Meter) -> None:
        """Publish the quantile gauges of every (present and future) histogram on ``meter``."""
        with self._lock:
            self._meters.append(meter)
            hists = list(self._histograms.values())
        for hist in hists:
            self._register_gauge(meter, hist)

    def _register_gauge(self, meter: Meter, hist: SketchHistogram) -> None:
        quantiles = self.quantiles
        stats = self._stats

        def callback(_options: CallbackOptions) -> Iterable[Observation]:
            try:
                return list(hist.observe_quantiles(quantiles))
            except Exception as exc:  # noqa: BLE001 - collection must go on
                stats.report_error(f"quantiles {hist.name}", exc)
                return []

        meter.create_observable_gauge(
            hist.name + ".quantile",
            callbacks=[callback],
            unit=hist.unit,
            description=f"Quantiles (attribute 'quantile') of {hist.name} since start.",
        )

    def histograms(self) -> list[SketchHistogram]:
        with self._lock:
            return list(self._histograms.values())

    def metrics(self, time_unix_nano: int | None = None) -> list[Metric]:
        """The exponential-histogram metrics of every non-empty histogram."""
        now = time.time_ns() if time_unix_nano is None else time_unix_nano
        out = []
        for hist in self.histograms():
            try:
                metric = hist.to_metric(now)
            except Exception as exc:  # noqa: BLE001 - one bad sketch must not stop export
                self._stats.report_error(f"export {hist.name}", exc)
                continue
            if metric is not None:
                out.append(metric)
        return out

    def reset(self) -> None:
        for hist in self.histograms():
            hist.reset()

    def disable(self) -> None:
        for hist in self.histograms():
            hist.disable()

    def after_fork_in_child(self) -> None:
        """Reset and disable every histogram without acquiring a lock (see
        :meth:`SketchHistogram.after_fork_in_child`)."""
        self._lock = threading.Lock()
        for hist in list(self._histograms.values()):
            hist.after_fork_in_child()
