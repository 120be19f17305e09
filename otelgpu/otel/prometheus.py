"""The sketch metrics on the Prometheus pull endpoint, as histograms Prometheus can aggregate.

The OpenTelemetry Prometheus exporter has no exponential histograms, so the sketches
would reach the pull endpoint only as their quantile gauges (cumulative since start: no
``rate``, no aggregation across ranks). :class:`SketchCollector` adds each sketch metric
as a classic Prometheus histogram (``<name>_bucket{le}``, ``_sum``, ``_count``) at the
fixed log-spaced bounds of :mod:`otelgpu.otel.histogram_rule` -- the same bounds in every
process, counts exact -- so ``histogram_quantile(0.99, sum by (le) (rate(…_bucket[5m])))``
works across ranks, replicas and ``error.type`` series. Names and labels follow the
OpenTelemetry exporter's rules (``gen_ai.server.request.duration`` in ``s`` becomes
``gen_ai_server_request_duration_seconds``), with the same ``otel_scope_*`` labels.
The quantile gauges stay (``<name>_quantile_<unit>{quantile}``).

Each family also carries the sketch's buckets as Prometheus native histograms
(``native_histograms``, :func:`otelgpu.otel.histogram_rule.native_histogram`), which
only the protobuf format writes (:mod:`otelgpu.otel.prometheus_protobuf`, served to a
scraper that negotiates it by :mod:`otelgpu.otel.pull_server`); the text formats
ignore them. A family carries them only if every point has a native form.

Collection runs on the scrape's thread, reads the sketches under their own locks, and
never raises (a failure is counted in ``otelgpu.internal.errors``).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.exporter.prometheus._mapping import (
    map_unit,
    sanitize_attribute,
    sanitize_full_name,
)
from opentelemetry.sdk.metrics.export import (
    ExponentialHistogram,
    Metric,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from otelgpu.otel import histogram_rule, host_work, slicing
from otelgpu.otel.exporters import SCOPE, append_metrics
from otelgpu.otel.metric_reader import slice_collection
from otelgpu.otel.prometheus_protobuf import LabelKey, label_key
from otelgpu.otel.stats import InternalStats


def _label_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_label_value(v) for v in value) + "]"
    return str(value)


class SketchHistogramFamily(HistogramMetricFamily):
    """A classic histogram family plus its series' native histograms, by :func:`label_key`."""

    native_histograms: dict[LabelKey, histogram_rule.NativeHistogram]


class SketchCollector(Collector):
    """A ``prometheus_client`` collector of the sketch metrics (see the module docstring)."""

    def __init__(self, sketch_metrics: Callable[[], Sequence[Metric]], stats: InternalStats):
        self._sketch_metrics = sketch_metrics
        self._stats = stats
        self._scope = {
            "otel_scope_name": SCOPE.name,
            "otel_scope_version": SCOPE.version or "",
            "otel_scope_schema_url": "",
        }

    def describe(self) -> list[Any]:
        # Nothing known ahead: no registration-time collect (sketches appear as recorded).
        return []

    def collect(self) -> Iterator[SketchHistogramFamily]:
        try:
            metrics = list(self._sketch_metrics())
        except Exception as exc:  # noqa: BLE001 - a scrape must not fail on us
            self._stats.report_error("prometheus sketches", exc)
            return
        for metric in metrics:
            _tick()
            try:
                family = self._family(metric)
            except Exception as exc:  # noqa: BLE001
                self._stats.report_error(f"prometheus {metric.name}", exc)
                continue
            if family is not None:
                yield family

    def _family(self, metric: Metric) -> SketchHistogramFamily | None:
        data = metric.data
        if not isinstance(data, ExponentialHistogram) or not data.data_points:
            return None
        unit = map_unit(metric.unit or "")
        rows = []
        native: list[tuple[LabelKey, Any]] = []
        keys: set[str] = set(self._scope)
        for point in data.data_points:
            labels = dict(self._scope)
            for key, value in (point.attributes or {}).items():
                labels[sanitize_attribute(key)] = _label_value(value)
            keys.update(labels)
            rows.append((labels, point))
        label_keys = sorted(keys)
        family = SketchHistogramFamily(
            sanitize_full_name(metric.name),
            metric.description or "",
            labels=label_keys,
            unit=unit,
        )
        for labels, point in rows:
            _tick()  # each series: its classic buckets, then its native histogram
            buckets = [
                (floatToGoString(le), float(count))  # type: ignore[no-untyped-call]
                for le, count in histogram_rule.classic_buckets(point, metric.unit or "")
            ]
            values = [labels.get(k, "") for k in label_keys]
            family.add_metric(values, buckets, sum_value=float(point.sum))
            native.append((label_key(dict(zip(label_keys, values, strict=True))), point))
        family.native_histograms = {}
        for series, point in native:
            histogram = histogram_rule.native_histogram(point)
            if histogram is None:  # all or none: a scraper types a family by one series
                family.native_histograms = {}
                break
            family.native_histograms[series] = histogram
        return family


def _tick() -> None:
    """:func:`slicing.tick` on a scrape served by otelgpu's endpoint (a background thread,
    ``otelgpu.otel.pull_server``); nothing where the host's own code collects the registry
    (its own server or push job: never paused for us)."""
    if host_work.is_background():
        slicing.tick()


def _one_at_a_time(collect: Callable[[], Iterable[Any]]) -> Callable[[], list[Any]]:
    """``collect``, run to completion under a lock of its own on each call."""
    lock = threading.Lock()

    def collect_alone() -> list[Any]:
        with lock:
            return list(collect())

    return collect_alone


POINTS_PER_SLICE = 8
"""Data points of one metric translated between two GIL hand-backs at most (~17 µs each
warm; the GPU metrics have up to 72 points with eight GPUs)."""


def _pieces(metric: Metric) -> list[Metric]:
    """``metric`` cut into pieces of :data:`POINTS_PER_SLICE` points when all its points
    have the same attribute keys (the exporter makes a family's labels the union of its
    points' keys, so only then is a piece's family the whole metric's); else whole."""
    points = metric.data.data_points
    if len(points) <= POINTS_PER_SLICE:
        return [metric]
    keys = (points[0].attributes or {}).keys()
    if any((point.attributes or {}).keys() != keys for point in points):
        return [metric]
    try:
        return [
            dataclasses.replace(
                metric,
                data=dataclasses.replace(
                    metric.data,
                    data_points=points[i : i + POINTS_PER_SLICE],  # type: ignore[arg-type]
                ),
            )
            for i in range(0, len(points), POINTS_PER_SLICE)
        ]
    except (TypeError, ValueError):  # not the SDK's dataclasses: whole, as the exporter
        return [metric]


def _metric_by_metric(
    translate: Callable[[MetricsData, dict[str, Any]], None],
) -> Callable[[MetricsData, dict[str, Any]], None]:
    """The exporter's translation of a collection, one metric (or :func:`_pieces` of one)
    at a time with a :func:`slicing.tick` before each: the same families in the same
    order (it adds each call's points to the family dict it is given), with the GIL
    handed back between them."""

    def translate_metric_by_metric(metrics_data: MetricsData, families: dict[str, Any]) -> None:
        for rm in metrics_data.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    for piece in _pieces(metric):
                        _tick()
                        scope = ScopeMetrics(sm.scope, [piece], sm.schema_url)
                        translate(
                            MetricsData([ResourceMetrics(rm.resource, [scope], rm.schema_url)]),
                            families,
                        )

    return translate_metric_by_metric


class PullReader(PrometheusMetricReader):
    """The OpenTelemetry Prometheus reader, plus metrics otelgpu builds itself.

    ``extra_metrics`` (``otelgpu.metrics.direct``: the GPU metrics) are added to each
    collection in otelgpu's scope before the exporter's own translation, so they are named
    and labelled exactly as the SDK's instruments would be. Runs on the scrape's thread;
    a failure is counted in ``otelgpu.internal.errors`` and the scrape goes on.

    A scrape hands the GIL back to the host's threads as otelgpu's other background work
    does (``otelgpu.otel.slicing``): between instruments in the SDK's collection, between
    metrics in the exporter's translation, between sketch families and between written
    families, and its slices wait for a gap between the host's steps or requests. Whole,
    an 8-GPU scrape is 15-20 ms of Python: in one piece it held the GIL against a busy
    host for a switch interval (5 ms) at a time.

    Scrapes go through the exporter's collector one at a time: it queues its collection,
    then serves everything queued, so of two scrapes at once (each on its own server
    thread) one could serve both collections -- every series twice -- and the other none.

    :meth:`force_flush` collects nothing: a pull endpoint's data leaves when it is scraped,
    and each scrape collects afresh (the specification requires no flush of a pull
    reader). The exporter's own flush queued a collection that the next scrape served
    beside its own -- every series twice, the flush's values first, which Prometheus kept
    (dropping the newer ones as duplicates) -- and queued one more per flush while nobody
    scraped.
    """

    def __init__(
        self,
        extra_metrics: Callable[[], Sequence[Metric]] | None = None,
        stats: InternalStats | None = None,
    ) -> None:
        super().__init__()
        self._extra_metrics = extra_metrics
        self._stats = stats or InternalStats()
        collector = getattr(self, "_collector", None)
        if collector is not None:
            collector.collect = _one_at_a_time(collector.collect)
            translate = getattr(collector, "_translate_to_prometheus", None)
            if callable(translate):
                collector._translate_to_prometheus = _metric_by_metric(translate)

    # ``collect`` is marked final in the SDK (for type checkers only): this override only
    # prepares the storage, then runs the SDK's own collection unchanged.
    def collect(self, timeout_millis: float = 10_000) -> None:  # type: ignore[misc]
        """The SDK's collection, with each instrument's aggregation step beginning with a
        :func:`slicing.tick` (``metric_reader.slice_collection``)."""
        if host_work.is_background():  # a scrape of otelgpu's endpoint (see _tick)
            try:
                slice_collection(self, _tick)
            except Exception as exc:  # noqa: BLE001 - slicing is an optimisation only
                self._stats.report_error("prometheus collection slicing", exc)
            slicing.tick()
        super().collect(timeout_millis=timeout_millis)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Nothing to push: the next scrape collects (see the class docstring)."""
        return True

    def _receive_metrics(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> None:
        # The SDK calls this only with a collection (never ``None``).
        if self._extra_metrics is not None:
            try:
                metrics_data = append_metrics(metrics_data, self._extra_metrics())
            except Exception as exc:  # noqa: BLE001 - a scrape must not fail on us
                self._stats.report_error("prometheus direct metrics", exc)
        super()._receive_metrics(metrics_data, timeout_millis, **kwargs)
