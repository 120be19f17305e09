"""OTLP metric requests built in short slices, so the export thread never stalls the host.

The SDK's OTLP metric exporters turn a whole collection into protobuf objects in one
Python call (``encode_metrics``: 2-5 ms for one simulated GPU, more for eight) while
holding the GIL; an application thread that wants the GIL meanwhile waits up to the
interpreter's switch interval or longer. :func:`encode_metrics_sliced` builds the same
``ExportMetricsServiceRequest`` from the SDK's own encoder applied to at most
``POINTS_PER_SLICE`` data points at a time, merged into one request with protobuf's C
``MergeFrom`` (concatenates the data points of the same metric), handing the GIL back
(:func:`otelgpu.otel.slicing.pause`) between slices.

Contract: ``encode_metrics_sliced(data).SerializeToString()`` is byte-for-byte
``encode_metrics(data).SerializeToString()`` (same grouping quirks: a resource or scope
seen twice keeps its first position and its last contents, as the SDK's dictionaries do)
-- ``tests/pipeline/test_pipeline_metric_encoding.py`` checks it.

:func:`sliced_sender` hooks the encoder into the SDK's OTLP gRPC and HTTP metric
exporters (the exporters' channel, headers, compression, retries and size limits keep
applying); anything else keeps its own ``export``. Thread-safe: no shared state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import (
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource

from otelgpu.otel.slicing import Slicer

_logger = logging.getLogger("otelgpu")

#: Data points encoded per call of the SDK's encoder (10-60 µs each in Python).
POINTS_PER_SLICE = 8

#: The resource of the one-metric requests encoded per slice: only their metric is kept,
#: so an empty resource spares encoding the real one's attributes every time.
_NO_RESOURCE = Resource({})


def _layout(data: MetricsData) -> list[tuple[Any, list[Any]]]:
    """``[(ResourceMetrics, [ScopeMetrics, ...])]`` in the order and with the contents
    the SDK's ``encode_metrics`` keeps (its dict keyed by resource, then by scope)."""
    resources: dict[Any, tuple[Any, dict[Any, Any]]] = {}
    for rm in data.resource_metrics:
        scopes: dict[Any, Any] = {}
        resources[rm.resource] = (rm, scopes)
        for sm in rm.scope_metrics:
            scopes[sm.scope] = sm
    return [(rm, list(scopes.values())) for rm, scopes in resources.values()]


def _chunks(metric: Any) -> Iterator[Any]:
    """``metric`` with at most ``POINTS_PER_SLICE`` of its data points at a time (the
    whole metric when it has no more; one empty chunk when it has none)."""
    points = metric.data.data_points
    if len(points) <= POINTS_PER_SLICE:
        yield metric
        return
    for i in range(0, len(points), POINTS_PER_SLICE):
        part = points[i : i + POINTS_PER_SLICE]
        yield replace(metric, data=replace(metric.data, data_points=part))


def encode_metrics_sliced(data: MetricsData, slicer: Slicer | None = None) -> Any:
    """The ``ExportMetricsServiceRequest`` of ``data``, encoded a few points at a time.

    ``slicer`` decides when to hand the GIL back (default: every ``SLICE_S`` of CPU).
    Raises what ``encode_metrics`` raises for a metric it cannot encode.
    """
    slicer = slicer or Slicer()
    layout = _layout(data)
    skeleton = MetricsData(
        [
            ResourceMetrics(
                rm.resource,
                [ScopeMetrics(sm.scope, [], sm.schema_url) for sm in scopes],
                rm.schema_url,
            )
            for rm, scopes in layout
        ]
    )
    request = encode_metrics(skeleton)
    for (_rm, scopes), pb_rm in zip(layout, request.resource_metrics, strict=True):
        for sm, pb_sm in zip(scopes, pb_rm.scope_metrics, strict=True):
            for metric in sm.metrics:
                target = pb_sm.metrics.add()
                for chunk in _chunks(metric):
                    slicer.tick()
                    scope = ScopeMetrics(sm.scope, [chunk], "")
                    part = encode_metrics(MetricsData([ResourceMetrics(_NO_RESOURCE, [scope], "")]))
                    target.MergeFrom(part.resource_metrics[0].scope_metrics[0].metrics[0])
    return request


class _PreparedMetrics(MetricsData):
    """A collection plus its already-built request, for the gRPC exporter (whose
    ``_count_data`` reads the collection and ``_translate_data`` makes the request)."""

    request: Any = None


def _grpc_sender(inner: Any) -> Callable[[MetricsData], MetricExportResult] | None:
    try:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    except ImportError:
        return None
    if type(inner) is not OTLPMetricExporter or not callable(
        getattr(inner, "_translate_data", None)
    ):
        return None
    from otelgpu.otel.fast_export import take_prepared

    take_prepared(inner, _PreparedMetrics)

    def send(metrics_data: MetricsData) -> MetricExportResult:
        if getattr(inner, "_max_export_batch_size", None) is not None:
            return inner.export(metrics_data)
        prepared = _PreparedMetrics(metrics_data.resource_metrics)
        object.__setattr__(prepared, "request", encode_metrics_sliced(metrics_data))
        return inner._export(data=prepared)

    return send


def _http_sender(inner: Any) -> Callable[[MetricsData], MetricExportResult] | None:
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    except ImportError:
        return None
    if type(inner) is not OTLPMetricExporter or not callable(getattr(inner, "_export_batch", None)):
        return None

    def send(metrics_data: MetricsData) -> MetricExportResult:
        if getattr(inner, "_shutdown", False) or (
            getattr(inner, "_max_export_batch_size", None) is not None
        ):
            return inner.export(metrics_data)
        return inner._export_batch(encode_metrics_sliced(metrics_data))

    return send


def sliced_sender(inner: Any) -> Callable[[MetricsData], MetricExportResult] | None:
    """``export(metrics_data)`` for ``inner`` with the request encoded in slices, or
    ``None`` when ``inner`` is not one of the SDK's OTLP metric exporters (or a batch
    size is configured: the SDK's exporter then splits and encodes itself)."""
    for make in (_grpc_sender, _http_sender):
        try:
            send = make(inner)
        except Exception as exc:  # noqa: BLE001 - fall back to the exporter's own export
            _logger.debug("otelgpu: no sliced metric encoding for %r: %r", inner, exc)
            continue
        if send is not None:
            return send
    return None
