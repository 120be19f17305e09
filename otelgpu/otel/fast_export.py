"""Send spans encoded by :mod:`otelgpu.otel.span_encoding` through the SDK's own exporters.

:class:`EncodedSpanExporter` wraps an OpenTelemetry SDK span exporter and exports a batch
whose OTLP bytes were already written (by the batch processor, in short slices):

* OTLP/gRPC (``opentelemetry.exporter.otlp.proto.grpc``): the request is handed to the
  exporter's own ``export`` -- its channel, credentials, headers, compression, timeout,
  retry and backoff -- in place of the SDK's encoding (the exporter's ``_translate_data``
  step receives the prepared request);
* OTLP/HTTP (``opentelemetry.exporter.otlp.proto.http``): the bytes go to the exporter's
  own HTTP client (session, headers, compression, certificates, timeout and retries),
  with the exporter's size limit;
* the local recording: written as its OTLP/JSON line;
* anything else (a user's exporter, a future SDK whose internals moved): the exporter's
  plain ``export(spans)``; :attr:`EncodedSpanExporter.accepts_encoded` is then False and
  nothing is encoded twice.

So every ``OTEL_EXPORTER_OTLP_*`` setting keeps applying; only the encoding is ours.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otelgpu.otel import span_encoding, span_json

_logger = logging.getLogger("otelgpu")


class _Prepared(list):  # type: ignore[type-arg]
    """The spans of a batch plus their already-built OTLP request (for the gRPC exporter,
    whose ``_count_data`` takes the spans and ``_translate_data`` the request)."""

    request: Any = None


def _serialize(request: Any) -> bytes:
    return request if isinstance(request, bytes) else request.SerializeToString()


def raw_stub(method: str, response: Any) -> type:
    """A client class for the OTLP gRPC service ``method`` (its full path) that takes a
    serialized request as bytes too, as the SDK's exporters make their clients
    (``stub(channel)``, then ``client.Export(request=..., metadata=..., timeout=...)``)."""

    class RawStub:
        def __init__(self, channel: Any) -> None:
            self.Export = channel.unary_unary(
                method, request_serializer=_serialize, response_deserializer=response.FromString
            )

    return RawStub


_RawTraceStub = raw_stub(
    "/opentelemetry.proto.collector.trace.v1.TraceService/Export", ExportTraceServiceResponse
)


def take_prepared(inner: Any, marker: type) -> None:
    """Make the SDK gRPC exporter ``inner`` send the ``request`` attribute of data of type
    ``marker`` (a request otelgpu built) instead of translating the data itself."""
    original = inner._translate_data

    def translate(data: Any) -> Any:
        if isinstance(data, marker):
            return data.request  # type: ignore[attr-defined]
        return original(data)

    inner._translate_data = translate


def _grpc_sender(inner: Any) -> Callable[[Sequence[ReadableSpan], bytes], SpanExportResult] | None:
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    except ImportError:
        return None
    if type(inner) is not OTLPSpanExporter or not callable(getattr(inner, "_translate_data", None)):
        return None
    take_prepared(inner, _Prepared)
    if getattr(inner, "_stub", None) is TraceServiceStub and getattr(inner, "_channel", None):
        # The exporter makes its client from ``_stub`` (again after a reconnect): ours
        # sends otelgpu's bytes as they are, sparing a parse and a re-serialisation (both
        # in C with the GIL held, ~1 ms per 100 kB).
        exporter: Any = inner
        exporter._stub = _RawTraceStub
        exporter._client = _RawTraceStub(exporter._channel)

    def send(spans: Sequence[ReadableSpan], payload: bytes) -> SpanExportResult:
        batch = _Prepared(spans)
        raw = isinstance(getattr(inner, "_client", None), _RawTraceStub)
        batch.request = payload if raw else ExportTraceServiceRequest.FromString(payload)
        return inner.export(batch)

    return send


def _http_sender(inner: Any) -> Callable[[Sequence[ReadableSpan], bytes], SpanExportResult] | None:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        return None
    client = getattr(inner, "_client", None)
    if type(inner) is not OTLPSpanExporter or not callable(getattr(client, "export", None)):
        return None

    def send(spans: Sequence[ReadableSpan], payload: bytes) -> SpanExportResult:
        if getattr(inner, "_shutdown", False):
            return SpanExportResult.FAILURE
        limit = getattr(inner, "_max_request_size", None)
        if isinstance(limit, int) and limit > 0 and len(payload) > limit:
            _logger.debug("otelgpu: span batch of %d bytes over the limit", len(payload))
            return SpanExportResult.FAILURE
        result = inner._client.export(payload)
        return SpanExportResult.SUCCESS if result.success else SpanExportResult.FAILURE

    return send


def _recording_sender(
    inner: Any,
) -> Callable[[Sequence[ReadableSpan], Any], SpanExportResult] | None:
    from otelgpu.otel.recording import RecordingSpanExporter

    if type(inner) is not RecordingSpanExporter:
        return None

    def send(spans: Sequence[ReadableSpan], line: Any) -> SpanExportResult:
        try:
            inner._recording.write_line(line)
        except (OSError, ValueError):
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    return send


class EncodedSpanExporter(SpanExporter):
    """An SDK span exporter that also takes pre-encoded batches (module docstring)."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self._send: Callable[[Sequence[ReadableSpan], Any], SpanExportResult] | None = None
        #: How one span is encoded and how encoded spans become one payload: OTLP
        #: protobuf (span_encoding), or OTLP/JSON for the recording (span_json).
        self.encode_span: Callable[[ReadableSpan], Any] = span_encoding.encode_span
        self.assemble: Callable[[Sequence[tuple[ReadableSpan, Any]]], Any] = span_encoding.assemble
        #: Whether one encoded span is bytes or text (not a structure of Python objects):
        #: the batch processor then encodes spans early (``otelgpu.otel.processor``).
        self.compact_encoding = True
        for make in (_grpc_sender, _http_sender, _recording_sender):
            try:
                self._send = make(inner)
            except Exception as exc:  # noqa: BLE001 - fall back to the plain exporter
                _logger.debug("otelgpu: no encoded path for %r: %r", inner, exc)
            if self._send is not None:
                if make is _recording_sender:
                    self.encode_span = span_json.span_text
                    self.assemble = span_json.request_line_text
                break

    @property
    def accepts_encoded(self) -> bool:
        """Whether :meth:`export_encoded` sends otelgpu's bytes (else it re-encodes)."""
        return self._send is not None

    def export_encoded(self, spans: Sequence[ReadableSpan], payload: Any) -> SpanExportResult:
        """Export ``spans`` whose request is ``payload`` (made by :attr:`assemble`)."""
        if self._send is None:
            return self.inner.export(spans)
        return self._send(spans, payload)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._send is None:
            return self.inner.export(spans)
        return self._send(spans, self.assemble([(s, self.encode_span(s)) for s in spans]))

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))
