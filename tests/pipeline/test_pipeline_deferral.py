"""``otelgpu.step()`` / ``otelgpu.request()`` blocks of 2 ms or more finish on the deferred
thread (``otelgpu.runtime.deferral``): the same spans and metrics, built off the host's
thread; inline where that would keep a failure alive, outrun the thread, or escape a flush.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from fixtures.otel import InMemoryOtel
from fixtures.sim import sim_gpu  # noqa: F401 - fixture
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otelgpu
from otelgpu.otel.deferred import DeferredWork
from otelgpu.otel.stats import InternalStats
from otelgpu.runtime.deferral import BACKLOG_LIMIT, DEFER_MIN_NS, Finisher
from otelgpu.runtime.records import StepRecord

pytestmark = pytest.mark.usefixtures("reset_otel_globals")

STEP = "otelgpu.train.step"


class EndingThreads(SpanProcessor):
    """Which thread ended each span (the SDK calls ``on_end`` on the ending thread)."""

    def __init__(self) -> None:
        self.threads: dict[str, list[str]] = {}

    def on_end(self, span: ReadableSpan) -> None:
        self.threads.setdefault(span.name, []).append(threading.current_thread().name)


def _instrumented(**settings: Any) -> tuple[Any, InMemorySpanExporter, EndingThreads]:
    """``instrument()`` with otelgpu's own tracer provider, an in-memory exporter on it."""
    handle = otelgpu.instrument(exporters="none", frameworks="none", **settings)
    runtime = handle.runtime
    assert runtime is not None and runtime.pipeline is not None
    provider: Any = runtime.pipeline.tracer_provider
    exporter = InMemorySpanExporter()
    threads = EndingThreads()
    # The thread recorder first: the SDK calls processors in order, and a test that waits
    # for the exporter then reads the recorder.
    provider.add_span_processor(threads)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return handle, exporter, threads


def _wait_for(exporter: InMemorySpanExporter, name: str, count: int) -> list[ReadableSpan]:
    """The spans named ``name`` once ``count`` ended (no flush: the thread's own pace)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        spans = [s for s in exporter.get_finished_spans() if s.name == name]
        if len(spans) >= count:
            return spans
        time.sleep(0.01)
    raise AssertionError(f"{count} {name} spans never ended")


def test_deferral_rule() -> None:
    stats = InternalStats()
    # A thread that never runs the queue on its own within the test (it is drained at close).
    work = DeferredWork(stats, where="test", interval_s=60, batch=1 << 30)
    finished: list[StepRecord] = []
    finisher: Finisher[StepRecord] = Finisher(work, lambda span, record: finished.append(record))
    try:
        assert not finisher.deferrable(StepRecord(0, DEFER_MIN_NS - 1), failed=False)
        assert finisher.deferrable(StepRecord(0, DEFER_MIN_NS), failed=False)
        assert not finisher.deferrable(StepRecord(0, DEFER_MIN_NS), failed=True)
        inline_only: Finisher[StepRecord] = Finisher(None, lambda span, r: finished.append(r))
        assert not inline_only.deferrable(StepRecord(0, DEFER_MIN_NS), failed=False)
        for _ in range(BACKLOG_LIMIT):  # a backlog the thread did not run
            finisher.finish(None, StepRecord(0, DEFER_MIN_NS))  # type: ignore[arg-type]
        assert work.pending == BACKLOG_LIMIT and not finished
        finisher.finish(None, StepRecord(0, DEFER_MIN_NS, step=7))  # type: ignore[arg-type]
        assert [r.step for r in finished] == [7]  # inline: the backlog stays bounded
        assert work.pending == BACKLOG_LIMIT
    finally:
        work.close()
    assert len(finished) == BACKLOG_LIMIT + 1  # close() ran the queue: nothing dropped
    assert not finisher.deferrable(StepRecord(0, DEFER_MIN_NS), failed=False)  # stopped
    assert stats.dropped_total() == 0


@pytest.mark.usefixtures("sim_gpu")
def test_deferral_long_steps_finish_on_the_deferred_thread() -> None:
    handle, exporter, threads = _instrumented()
    try:
        with otelgpu.step(samples=8) as s:
            time.sleep(0.005)
        (span,) = _wait_for(exporter, STEP, 1)
        assert threads.threads[STEP] == ["otelgpu-deferred"]
        assert span.start_time == s._start_ns and span.end_time == s.end_ns
        attributes = span.attributes or {}
        assert attributes["otelgpu.train.samples"] == 8
        assert any(key.startswith("otelgpu.gpu.") for key in attributes)  # its GPU context
        with otelgpu.request(model="m") as r:
            r.first_token()
            time.sleep(0.005)
            r.tokens(3)
        (request,) = _wait_for(exporter, "chat m", 1)
        assert threads.threads["chat m"] == ["otelgpu-deferred"]
        assert (request.attributes or {})["gen_ai.usage.output_tokens"] == 3
        runtime = handle.runtime
        assert runtime.step_duration.merged().count == 1
        assert runtime.request_duration.merged().count == 1
    finally:
        handle.shutdown()


@pytest.mark.usefixtures("sim_gpu")
def test_deferral_a_failed_step_finishes_inline() -> None:
    handle, exporter, threads = _instrumented()
    try:
        with pytest.raises(ValueError), otelgpu.step():
            time.sleep(0.005)
            raise ValueError("boom")
        # inline: ended before the block's exit returned, on the host's thread
        (span,) = [s for s in exporter.get_finished_spans() if s.name == STEP]
        assert threads.threads[STEP] == [threading.current_thread().name]
        assert span.events[0].name == "exception"
    finally:
        handle.shutdown()


@pytest.mark.usefixtures("sim_gpu")
def test_deferral_copies_the_hosts_attributes() -> None:
    handle, exporter, _ = _instrumented()
    try:
        attributes = {"run": "first"}
        with otelgpu.step(attributes=attributes):
            time.sleep(0.005)
        attributes["run"] = "second"  # the host reuses its mapping for the next step
        handle.force_flush()
        (span,) = [s for s in exporter.get_finished_spans() if s.name == STEP]
        assert (span.attributes or {})["run"] == "first"
    finally:
        handle.shutdown()


@pytest.mark.usefixtures("sim_gpu")
def test_deferral_flush_and_shutdown_run_what_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    # The deferred thread waits a minute between runs: only the flush can run the finish.
    defaults = DeferredWork.__init__.__kwdefaults__
    assert defaults is not None
    monkeypatch.setitem(defaults, "interval_s", 60.0)
    monkeypatch.setitem(defaults, "batch", 1 << 30)
    handle, exporter, threads = _instrumented()
    with otelgpu.step():
        time.sleep(0.005)
    assert not exporter.get_finished_spans()
    handle.force_flush()
    assert len(exporter.get_finished_spans()) == 1
    with otelgpu.request(model="m"):
        time.sleep(0.005)
    handle.shutdown()
    assert [s.name for s in exporter.get_finished_spans()] == [STEP, "chat m"]
    assert threads.threads == {STEP: ["MainThread"], "chat m": ["MainThread"]}


@pytest.mark.usefixtures("sim_gpu")
def test_deferral_keeps_every_step_at_a_realistic_rate() -> None:
    """300 steps/s of 3 ms for 1 s: every span exported, nothing dropped."""
    handle, exporter, threads = _instrumented(step_spans_per_second=0)
    try:
        for i in range(300):
            with otelgpu.step(samples=1, step=i + 1):
                end = time.perf_counter() + 0.003
                while time.perf_counter() < end:  # a host that keeps the GIL
                    pass
        handle.force_flush()
        spans = [s for s in exporter.get_finished_spans() if s.name == STEP]
        numbers = [(s.attributes or {})["otelgpu.train.step"] for s in spans]
        assert sorted(numbers) == list(range(1, 301))  # type: ignore[type-var]
        assert "otelgpu-deferred" in threads.threads[STEP]  # most went there
        runtime = handle.runtime
        assert runtime.step_duration.merged().count == 300
        assert runtime.stats.dropped_total() == 0
    finally:
        handle.shutdown()


def test_deferral_attached_to_the_applications_provider_finishes_inline() -> None:
    app = InMemoryOtel()
    threads = EndingThreads()
    app.tracer_provider.add_span_processor(threads)
    otelgpu.instrument(
        tracer_provider=app.tracer_provider,
        meter_provider=app.meter_provider,
        exporters="none",
        gpu=False,
    )
    try:
        with otelgpu.step():
            time.sleep(0.005)
        # its force_flush() knows nothing of otelgpu's thread: ended before the exit returned
        assert len(app.finished(STEP)) == 1
        assert threads.threads[STEP] == [threading.current_thread().name]
    finally:
        otelgpu.shutdown()
        app.shutdown()


def test_deferral_thread_is_started_by_instrument() -> None:
    """Not by the first deferred finish, in the host's exit (a thread's start waits for
    it to run: up to a switch interval with other threads about)."""
    handle, _, _ = _instrumented()
    try:
        thread = handle.runtime.deferred._thread
        assert thread is not None and thread.name == "otelgpu-deferred" and thread.is_alive()
    finally:
        handle.shutdown()
    assert not thread.is_alive()  # shutdown() waits for it
