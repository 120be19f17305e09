"""Span processor and metric exporter shutdowns honour their deadlines."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
from fixtures.otel import RecordingMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otelgpu.otel.exporters import GuardedMetricExporter, preferred_temporality
from otelgpu.otel.metric_reader import ForkAwareMetricReader
from otelgpu.otel.processor import BoundedBatchSpanProcessor
from otelgpu.otel.stats import InternalStats

pytestmark = pytest.mark.usefixtures("reset_otel_globals")


# ------------------------------------------------------------------ bounded shutdown


class _SlowExporter(SpanExporter):
    """A collector that takes ``delay_s`` to answer every export (e.g. a hung one)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.exported = 0
        self.shut_down = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        time.sleep(self.delay_s)
        self.exported += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.shut_down = True


def test_pipeline_span_processor_shutdown_is_bounded_by_its_deadline() -> None:
    """shutdown() used to wait for the worker to drain the whole queue into a slow
    collector (and then some): 60 s at exit with a hung OTLP endpoint."""
    stats = InternalStats()
    exporter = _SlowExporter(0.4)
    processor = BoundedBatchSpanProcessor(
        exporter,
        stats=stats,
        max_queue_size=1000,
        max_export_batch_size=10,
        schedule_delay_s=0.01,
        shutdown_timeout_s=1.0,
    )
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    for i in range(100):  # ten batches: 4 s of exports
        tracer.start_span(f"s{i}").end()
    time.sleep(0.1)  # the worker is inside an export now
    started = time.monotonic()
    provider.shutdown()
    took = time.monotonic() - started
    assert took < 1.0 + 0.4 + 0.8  # the deadline plus at most one export, plus slack
    assert exporter.shut_down
    dropped = stats.dropped().get(("traces", "shutdown"), 0)
    assert 0 < dropped < 100
    assert exporter.exported + dropped == 100  # nothing lost without being counted


def test_pipeline_span_processor_shutdown_exports_everything_in_time() -> None:
    stats = InternalStats()
    exporter = _SlowExporter(0.0)
    processor = BoundedBatchSpanProcessor(
        exporter, stats=stats, max_export_batch_size=7, schedule_delay_s=3600
    )
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    for i in range(50):
        tracer.start_span(f"s{i}").end()
    provider.shutdown()
    provider.shutdown()  # idempotent
    assert exporter.exported == 50
    assert stats.dropped() == {}


def test_pipeline_guarded_metric_exporter_honours_the_shutdown_deadline() -> None:
    inner = RecordingMetricExporter()
    guarded = GuardedMetricExporter(inner, InternalStats(), temporality=preferred_temporality())
    provider = MeterProvider(
        metric_readers=[ForkAwareMetricReader(guarded, export_interval_millis=3_600_000)]
    )
    provider.shutdown(timeout_millis=2_000)
    (timeout,) = inner.shutdown_timeouts
    assert 0 <= timeout <= 2_000  # what was left of the provider's deadline, not 30 s
