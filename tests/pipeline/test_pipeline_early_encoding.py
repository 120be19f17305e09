"""The batch processor encodes spans as they end (``otelgpu.otel.processor``): the queue
holds bytes, not SDK spans (nothing for the garbage collector to promote), the export
thread is not woken per span, and every span still reaches the collector -- over OTLP
gRPC, OTLP HTTP and the recording."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otelgpu._settings import Settings
from otelgpu.otel import processor as proc
from otelgpu.otel.exporters import GuardedSpanExporter, otlp_span_exporter
from otelgpu.otel.fast_export import EncodedSpanExporter
from otelgpu.otel.recording import RecordingFile, RecordingSpanExporter, read_recording
from otelgpu.otel.stats import InternalStats


def _exporter(kind: str, receiver: Any, tmp_path: Path) -> Any:
    if kind == "recording":
        rec = RecordingFile(tmp_path / "r.otlp.jsonl", max_bytes=1 << 24, backups=0)
        return RecordingSpanExporter(rec)
    endpoint = receiver.grpc_endpoint if kind == "grpc" else receiver.http_endpoint
    protocol = "grpc" if kind == "grpc" else "http/protobuf"
    return otlp_span_exporter(
        Settings(otlp_endpoint=endpoint, otlp_protocol=protocol, otlp_insecure=True)
    )


@pytest.mark.parametrize("kind", ["grpc", "http", "recording"])
def test_spans_are_encoded_as_they_end_and_all_delivered(
    otlp_receiver: Any, tmp_path: Path, kind: str
) -> None:
    stats = InternalStats()
    guarded = GuardedSpanExporter(
        EncodedSpanExporter(_exporter(kind, otlp_receiver, tmp_path)), stats
    )
    assert guarded.compact_encoding
    if kind == "grpc":  # otelgpu's bytes go out as they are (no parse, no re-serialisation)
        from otelgpu.otel import fast_export

        assert isinstance(guarded.inner.inner._client, fast_export._RawTraceStub)  # type: ignore[attr-defined]
    processor = proc.BoundedBatchSpanProcessor(
        guarded, stats=stats, schedule_delay_s=30.0, max_export_batch_size=10_000
    )
    tp = TracerProvider(resource=Resource.create({"service.name": "early"}), shutdown_on_exit=False)
    tp.add_span_processor(processor)
    tracer = tp.get_tracer("lib.a")
    other = tp.get_tracer("lib.b", "2.0")
    refs = []
    for i in range(300):
        with (tracer if i % 3 else other).start_as_current_span(f"s{i}", attributes={"i": i}) as s:
            pass
        refs.append(weakref.ref(s))
    del s
    assert not processor._queue  # encoded at once: no SDK span waits
    gc.collect()
    assert not any(r() is not None for r in refs)  # the processor keeps bytes, not spans
    assert processor.queued == 300  # nothing sent before the schedule delay
    assert processor.force_flush(10_000)
    assert processor.queued == 0
    if kind == "recording":
        requests = list(read_recording(tmp_path / "r.otlp.jsonl"))
    else:
        requests = otlp_receiver.requests("traces")
    names = [
        span.name
        for r in requests
        for rs in r.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]
    assert sorted(names) == sorted(f"s{i}" for i in range(300))
    scopes = {ss.scope.name for r in requests for rs in r.resource_spans for ss in rs.scope_spans}
    assert scopes == {"lib.a", "lib.b"}
    assert not stats.dropped()
    tp.shutdown()


def test_shutdown_counts_encoded_spans_it_could_not_send(tmp_path: Path) -> None:
    """Spans already encoded but not sent count as dropped when a shutdown gives up."""
    stats = InternalStats()
    rec = RecordingFile(tmp_path / "r.otlp.jsonl", max_bytes=1 << 24, backups=0)
    guarded = GuardedSpanExporter(EncodedSpanExporter(RecordingSpanExporter(rec)), stats)
    processor = proc.BoundedBatchSpanProcessor(guarded, stats=stats, schedule_delay_s=30.0)
    tp = TracerProvider(shutdown_on_exit=False)
    tp.add_span_processor(processor)
    for i in range(20):
        with tp.get_tracer("t").start_as_current_span(f"s{i}"):
            pass
    assert processor.queued == 20
    processor.abandon()
    assert stats.dropped() == {("traces", "shutdown_timeout"): 20}
    assert processor.queued == 0


def test_a_host_that_never_releases_the_gil_loses_no_spans(otlp_receiver: Any) -> None:
    """A host ending spans in a tight pure-Python loop leaves the export thread one turn
    per switch interval; span ends hand it the GIL while it falls behind, so the queue
    drains instead of dropping (``processor.HAND_OVER_EVERY``)."""
    stats = InternalStats()
    exporter = GuardedSpanExporter(
        EncodedSpanExporter(_exporter("grpc", otlp_receiver, Path("."))), stats
    )
    processor = proc.BoundedBatchSpanProcessor(
        exporter, stats=stats, schedule_delay_s=0.05, max_queue_size=256, max_export_batch_size=64
    )
    tp = TracerProvider(resource=Resource.create({"service.name": "busy"}), shutdown_on_exit=False)
    tp.add_span_processor(processor)
    tracer = tp.get_tracer("busy")
    attributes = {f"otelgpu.gpu.attribute_{k}": float(k) for k in range(16)}
    total = 3000
    for _ in range(total):
        with tracer.start_as_current_span("request", attributes=attributes):
            end = time.perf_counter() + 20e-6
            while time.perf_counter() < end:  # the host's own Python work, GIL held
                pass
    assert processor.force_flush(30_000)
    assert stats.dropped() == {}
    assert processor.host_hand_overs > 0
    delivered = sum(
        len(ss.spans)
        for r in otlp_receiver.requests("traces")
        for rs in r.resource_spans
        for ss in rs.scope_spans
    )
    assert delivered == total
    tp.shutdown()


def test_the_export_thread_sleeps_until_a_batch_or_the_schedule_delay(otlp_receiver: Any) -> None:
    """Spans ending at 100 per second for 1 s, schedule delay 30 s: the export thread is
    never woken (a thread that wakes takes the GIL from a host that runs Python), and a
    full batch wakes it to send at once."""
    stats = InternalStats()
    exporter = GuardedSpanExporter(
        EncodedSpanExporter(_exporter("grpc", otlp_receiver, Path("."))), stats
    )
    processor = proc.BoundedBatchSpanProcessor(
        exporter, stats=stats, schedule_delay_s=30.0, max_export_batch_size=200
    )
    cpu = time.pthread_getcpuclockid(processor._thread.ident or 0)
    # The thread's start-up done: it has run, and its CPU clock stood still for 5
    # readings in a row (one steady reading can come before a late start on a loaded
    # machine).
    idle, steady = time.clock_gettime_ns(cpu), 0
    for _ in range(250):
        time.sleep(0.02)
        now = time.clock_gettime_ns(cpu)
        steady = steady + 1 if now == idle and now > 0 else 0
        if steady >= 5:
            break
        idle = now
    assert steady >= 5
    tp = TracerProvider(shutdown_on_exit=False)
    tp.add_span_processor(processor)
    tracer = tp.get_tracer("t")
    before = time.clock_gettime_ns(cpu)
    for _ in range(100):
        with tracer.start_as_current_span("s", attributes={"a": 1.0}):
            pass
        time.sleep(0.01)
    assert processor.queued == 100
    assert time.clock_gettime_ns(cpu) == before  # not woken: no CPU at all
    for _ in range(100):  # the batch fills: sent without waiting for the delay
        with tracer.start_as_current_span("s"):
            pass

    def received() -> int:
        return sum(
            len(ss.spans)
            for r in otlp_receiver.requests("traces")
            for rs in r.resource_spans
            for ss in rs.scope_spans
        )

    # Wait for the receiver, not for the queue to empty: spans leave the queue before
    # they are encoded and sent.
    deadline = time.monotonic() + 10
    while received() < 200 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert received() == 200
    assert processor.queued == 0
    tp.shutdown()


class _GatedExporter(SpanExporter):
    """A real exporter behind a gate: records each request's span count and holds the
    first request until ``release`` is set (spans end meanwhile)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sizes: list[int] = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _hold(self, n: int) -> None:
        self.sizes.append(n)
        if len(self.sizes) == 1:
            self.entered.set()
            assert self.release.wait(10)

    def export(self, spans: Any) -> Any:
        self._hold(len(spans))
        return self.inner.export(spans)

    def export_encoded(self, spans: Any, payload: Any) -> Any:
        self._hold(len(spans))
        return self.inner.export_encoded(spans, payload)

    def shutdown(self) -> None:
        self.inner.shutdown()


def _gated(kind: str, tmp_path: Path, stats: InternalStats) -> tuple[_GatedExporter, Any]:
    """The gated exporter and what reads back what it delivered (span names)."""
    if kind == "encoded":
        rec = RecordingFile(tmp_path / "r.otlp.jsonl", max_bytes=1 << 24, backups=0)
        inner = GuardedSpanExporter(EncodedSpanExporter(RecordingSpanExporter(rec)), stats)
        assert inner.compact_encoding

        def delivered() -> list[str]:
            return [
                span.name
                for r in read_recording(tmp_path / "r.otlp.jsonl")
                for rs in r.resource_spans
                for ss in rs.scope_spans
                for span in ss.spans
            ]

        return _GatedExporter(inner), delivered
    memory = InMemorySpanExporter()
    inner = GuardedSpanExporter(memory, stats)
    assert not getattr(inner, "accepts_encoded", False)
    return _GatedExporter(inner), lambda: [s.name for s in memory.get_finished_spans()]


@pytest.mark.parametrize("kind", ["encoded", "sdk"])
def test_a_wake_sends_what_waits_and_leaves_a_partial_tail_for_the_next(
    tmp_path: Path, kind: str
) -> None:
    """Spans that end while a request is being sent wait for the next wake unless a
    whole batch waits: chasing the tail turned two requests a second into dozens of
    small ones at 500 requests/s, each a GIL hand-over the host paid for."""
    stats = InternalStats()
    gate, delivered = _gated(kind, tmp_path, stats)
    processor = proc.BoundedBatchSpanProcessor(
        gate, stats=stats, schedule_delay_s=1.5, max_export_batch_size=8
    )
    tp = TracerProvider(shutdown_on_exit=False)
    tp.add_span_processor(processor)
    tracer = tp.get_tracer("t")

    def end(names: range) -> None:
        for i in names:
            with tracer.start_as_current_span(f"s{i}"):
                pass

    end(range(8))  # a full batch wakes the thread at once
    assert gate.entered.wait(10)
    end(range(8, 13))  # a partial tail ends during the send
    gate.release.set()
    time.sleep(0.4)  # the schedule delay (1.5 s) is not up: the tail waits
    assert gate.sizes == [8]
    assert processor.queued == 5
    deadline = time.monotonic() + 10
    # The next wake sends it. Wait for the export itself, not for the queue to empty: the
    # tail leaves the queue before it is encoded and handed to the exporter.
    while len(gate.sizes) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gate.sizes == [8, 5]
    assert processor.queued == 0
    # A whole batch waiting after a send is sent on at once (encoded spans: all that
    # wait, up to ENCODED_BATCH; SDK spans: a batch, the tail left again).
    gate.sizes.clear()
    gate.entered.clear()
    gate.release.clear()
    end(range(13, 21))
    assert gate.entered.wait(10)
    end(range(21, 32))  # 11 spans: a batch of 8 and a tail of 3
    gate.release.set()
    deadline = time.monotonic() + 10
    while len(gate.sizes) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gate.sizes[1] == (11 if kind == "encoded" else 8)
    assert processor.force_flush(10_000)
    assert sorted(delivered()) == sorted(f"s{i}" for i in range(32))
    assert stats.dropped() == {}
    tp.shutdown()
