"""Span processor and metric exporter shutdowns honour their deadlines; the final
metric collection runs unpaced, and one that misses the deadline is reported."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from fixtures.otel import RecordingMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

import otelgpu
from otelgpu.otel import slicing
from otelgpu.otel.exporters import GuardedMetricExporter, preferred_temporality
from otelgpu.otel.metric_reader import ForkAwareMetricReader
from otelgpu.otel.processor import BoundedBatchSpanProcessor
from otelgpu.otel.recording_reader import read_recording
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


# ------------------------------------------------------------------ the final collection


def _many_series(models: int) -> None:
    for n in range(models):
        with otelgpu.request(model=f"model-{n}") as r:
            r.first_token()
            r.tokens(4)


def _request_metric_points(path: Path) -> dict[str, int]:
    points: dict[str, int] = {}
    for message in read_recording(path):
        for rm in getattr(message, "resource_metrics", ()):
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name.startswith("gen_ai.server.request.duration"):
                        data = getattr(metric, metric.WhichOneof("data"))
                        points[metric.name] = len(data.data_points)
    return points


def test_pipeline_shutdown_final_collection_is_not_paced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host waits for shutdown's flush, which ``shutdown_timeout_ms`` bounds: its
    collection reaches its slice ends but hands the GIL back at none of them (paced, a
    collection of thousands of series spent about twice its CPU time asleep and missed
    the 3 s bound on a loaded machine). Outside shutdown the same work is paced."""
    pauses: list[str] = []
    hand_overs: list[str] = []
    real_hand_over = slicing._hand_over

    def counted_pause() -> None:
        pauses.append(threading.current_thread().name)
        real_pause()

    def counted_hand_over() -> None:
        hand_overs.append(threading.current_thread().name)
        real_hand_over()

    real_pause = slicing.pause
    monkeypatch.setattr(slicing, "pause", counted_pause)
    monkeypatch.setattr(slicing, "_hand_over", counted_hand_over)
    handle = otelgpu.instrument(
        exporters="recording", recording_dir=str(tmp_path), gpu=False, frameworks="none"
    )
    runtime = handle.runtime
    assert runtime is not None and runtime.pipeline is not None
    assert runtime.pipeline.recording is not None
    path = runtime.pipeline.recording.path
    _many_series(300)
    handle.force_flush()
    assert hand_overs, "a collection outside shutdown hands the GIL back"
    _many_series(300)
    pauses.clear()
    hand_overs.clear()
    handle.shutdown()
    assert pauses, "shutdown's collection reached no slice end (nothing was sliced)"
    assert hand_overs == []
    assert slicing._draining == 0  # closed again: later background work is paced
    assert runtime.stats.dropped() == {}
    # the second 300 models' series are in the final export (one quantile point per
    # series and quantile)
    points = _request_metric_points(path)
    assert points["gen_ai.server.request.duration"] == 300
    assert points["gen_ai.server.request.duration.quantile"] % 300 == 0
    assert points["gen_ai.server.request.duration.quantile"] > 0


@pytest.mark.parametrize("timeout_ms", [0, 1], ids=["deadline-passed-at-once", "1ms"])
def test_pipeline_shutdown_says_when_the_final_collection_did_not_finish(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, timeout_ms: int
) -> None:
    """The SDK's reader stops waiting for its final collection at the deadline and
    returns as if done (and a provider reached after the deadline shuts no reader down:
    otelgpu stops it); otelgpu says so in one warning, and what that collection exports
    afterwards is counted as dropped (``shutdown_timeout``), not written."""
    handle = otelgpu.instrument(
        exporters="recording",
        recording_dir=str(tmp_path),
        gpu=False,
        frameworks="none",
        shutdown_timeout_ms=timeout_ms,
    )
    runtime = handle.runtime
    assert runtime is not None and runtime.pipeline is not None
    assert runtime.pipeline.recording is not None
    (reader,) = runtime.pipeline.metric_readers
    path = runtime.pipeline.recording.path
    _many_series(1000)
    with caplog.at_level(logging.WARNING, logger="otelgpu"):
        handle.shutdown()
    assert reader.running
    unfinished = [r for r in caplog.records if "final metric collection unfinished" in r.message]
    assert len(unfinished) == 1
    assert "OTELGPU_SHUTDOWN_TIMEOUT_MS" in unfinished[0].message
    # the SDK's refusal to start a reader's shutdown past the deadline is expected
    assert not [r for r in caplog.records if "error shutting down" in r.message]
    thread = reader._daemon_thread
    assert thread is not None
    thread.join(60)
    assert not reader.running
    assert runtime.stats.dropped().get(("metrics", "shutdown_timeout"), 0) >= 1000
    assert _request_metric_points(path) == {}
