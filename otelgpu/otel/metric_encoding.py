"""OTLP metric export with otelgpu's encoder, through the SDK's own exporters.

The SDK's OTLP metric exporters turn a whole collection into protobuf objects in one
Python call (``encode_metrics``: 20-25 ms of CPU for eight simulated GPUs) while holding
the GIL; an application thread that wants the GIL meanwhile waits up to the interpreter's
switch interval or longer. :func:`sliced_sender` sends the bytes
:func:`otelgpu.otel.metric_protobuf.encode_request` writes instead -- the same request,
byte for byte, several times cheaper, with a chance to hand the GIL back
(:func:`otelgpu.otel.slicing.pause`) before every data point:

* OTLP/gRPC: the bytes go through the exporter's own ``_export`` (its channel,
  credentials, headers, compression, timeout, retry and backoff) with a client that sends
  them as they are (no parse and re-serialisation);
* OTLP/HTTP: the bytes go to the exporter's own HTTP client (session, headers,
  compression, certificates, timeout and retries), with the exporter's size limit.

Anything else keeps its own ``export``, and so does an exporter with a batch size set (it
then splits and encodes itself). Thread-safe: no shared state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc import (
    MetricsServiceStub,
)
from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData

from otelgpu.otel.metric_protobuf import encode_request

_logger = logging.getLogger("otelgpu")

_RawMetricsStub: type | None = None


def _raw_metrics_stub() -> type:
    global _RawMetricsStub
    if _RawMetricsStub is None:
        from otelgpu.otel.fast_export import raw_stub

        _RawMetricsStub = raw_stub(
            "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
            ExportMetricsServiceResponse,
        )
    return _RawMetricsStub


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
    stub = _raw_metrics_stub()
    if getattr(inner, "_stub", None) is MetricsServiceStub and getattr(inner, "_channel", None):
        # The exporter makes its client from ``_stub`` (again after a reconnect).
        inner._stub = stub
        inner._client = stub(inner._channel)

    def send(metrics_data: MetricsData) -> MetricExportResult:
        if getattr(inner, "_max_export_batch_size", None) is not None:
            return inner.export(metrics_data)
        prepared = _PreparedMetrics(metrics_data.resource_metrics)
        payload = encode_request(metrics_data)
        raw = isinstance(getattr(inner, "_client", None), stub)
        request = payload if raw else ExportMetricsServiceRequest.FromString(payload)
        object.__setattr__(prepared, "request", request)
        return inner._export(data=prepared)

    return send


def _http_sender(inner: Any) -> Callable[[MetricsData], MetricExportResult] | None:
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    except ImportError:
        return None
    client = getattr(inner, "_client", None)
    if type(inner) is not OTLPMetricExporter or not callable(getattr(client, "export", None)):
        return None

    def send(metrics_data: MetricsData) -> MetricExportResult:
        if getattr(inner, "_shutdown", False) or (
            getattr(inner, "_max_export_batch_size", None) is not None
        ):
            return inner.export(metrics_data)
        payload = encode_request(metrics_data)
        limit = getattr(inner, "_max_request_size", None)
        if isinstance(limit, int) and limit > 0 and len(payload) > limit:
            _logger.warning(
                "otelgpu: metrics request of %d bytes over max_request_size %d; dropped",
                len(payload),
                limit,
            )
            return MetricExportResult.FAILURE
        result = inner._client.export(payload)
        return MetricExportResult.SUCCESS if result.success else MetricExportResult.FAILURE

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
