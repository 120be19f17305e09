"""``otelgpu.step()`` / ``otelgpu.request()`` hand their finish (GPU context, sampling
decision, attributes, metrics, the span's end and encoding) to the runtime's
``otelgpu-deferred`` thread: the host's thread only queues it. Blocks that raised,
blocks shorter than ``HAND_OFF_MIN_NS`` and blocks that find the queue full or closed
finish at once; none is ever lost. Real SDK providers, in-memory exporter."""

from __future__ import annotations

import os
import threading
import time

import pytest
from fixtures.otel import InMemoryOtel, attributes_of, span_times
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.trace import StatusCode

import otelgpu
from otelgpu import _contexts, _runtime
from otelgpu.metrics import catalog
from otelgpu.otel.deferred import DeferredWork
from otelgpu.otel.stats import InternalStats

LONG_S = 2 * _contexts.HAND_OFF_MIN_NS / 1e9  # a block handed off


class EndingThreads(SpanProcessor):
    """The thread each span ended on (a span processor's ``on_end``)."""

    def __init__(self) -> None:
        self.by_name: dict[str, list[str]] = {}

    def on_end(self, span: ReadableSpan) -> None:
        self.by_name.setdefault(span.name, []).append(threading.current_thread().name)


@pytest.fixture
def app(otel_app: InMemoryOtel) -> InMemoryOtel:
    return otel_app


def _runtime_now() -> _runtime.Runtime:
    runtime = _runtime.current()
    assert runtime is not None
    return runtime


def _spans(app: InMemoryOtel) -> list[ReadableSpan]:
    """What the exporter holds now, nothing settled first."""
    return list(app.spans.get_finished_spans())


def test_a_long_step_and_request_finish_on_the_background_thread(app: InMemoryOtel) -> None:
    ending = EndingThreads()
    app.tracer_provider.add_span_processor(ending)
    runtime = _runtime_now()
    deferred = runtime.deferred
    # The background thread cannot run what waits while the test holds its run lock.
    with deferred._run_lock:
        with otelgpu.step(samples=8, tokens=64) as s:
            time.sleep(LONG_S)
        with otelgpu.request(model="m") as r:
            r.first_token()
            time.sleep(LONG_S)
            r.tokens(4)
        # The host's thread returned with its own figures; nothing finished yet.
        assert s.duration_s is not None and s.duration_s >= LONG_S
        assert r.duration_s is not None and r.ttft_s is not None
        assert _spans(app) == []
        assert runtime.step_duration.merged().count == 0
        assert deferred.pending == 2
    runtime.force_flush()
    step, request = _spans(app)
    assert step.name == catalog.STEP_SPAN and request.name == "chat m"
    # The span's times are the block's, whenever it finished.
    start, end = span_times(step)
    assert end - start == pytest.approx(s.duration_s * 1e9, abs=2_000)
    assert step.attributes is not None and step.attributes["otelgpu.train.tokens"] == 64
    assert request.attributes is not None
    assert request.attributes["gen_ai.usage.output_tokens"] == 4
    assert runtime.step_duration.merged().count == 1
    assert runtime.request_duration.merged().count == 1
    assert runtime.ttft.merged().count == 1
    # Either force_flush ran them on this thread or the background thread won the race
    # for them once the lock was free; a step left alone is the background thread's.
    assert {name: len(threads) for name, threads in ending.by_name.items()} == {
        catalog.STEP_SPAN: 1,
        "chat m": 1,
    }
    with otelgpu.step(samples=1):
        time.sleep(LONG_S)
    deadline = time.monotonic() + 10
    while len(_spans(app)) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ending.by_name[catalog.STEP_SPAN][-1] == "otelgpu-deferred"


def test_a_failed_or_short_block_finishes_at_once(
    app: InMemoryOtel, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = _runtime_now()
    with pytest.raises(MemoryError), otelgpu.step(samples=1):
        time.sleep(LONG_S)
        raise MemoryError("out of memory")
    # At once: the record holds the exception, whose traceback holds the block's frames.
    (failed,) = _spans(app)
    assert failed.status.status_code is StatusCode.ERROR
    assert runtime.deferred.pending == 0
    # Shorter than HAND_OFF_MIN_NS (a loop this fast would keep the queue full): the
    # threshold raised rather than a block timed under it, which a loaded machine may not.
    monkeypatch.setattr(_contexts, "HAND_OFF_MIN_NS", 10**10)
    with otelgpu.request(model="m"):
        time.sleep(LONG_S)
    assert [s.name for s in _spans(app)] == [catalog.STEP_SPAN, "chat m"]
    assert runtime.deferred.pending == 0


def test_a_full_queue_finishes_the_rest_at_once_and_loses_none(app: InMemoryOtel) -> None:
    runtime = _runtime_now()
    deferred = runtime.deferred
    deferred.offer_limit = 2
    # The background thread cannot run what waits while the test holds its run lock.
    with deferred._run_lock:
        for _ in range(5):
            with otelgpu.step(samples=1):
                time.sleep(LONG_S)
        assert deferred.pending == 2
        assert len(_spans(app)) == 3  # the three that found the queue full
    runtime.force_flush()
    spans = _spans(app)
    assert len(spans) == 5
    numbers = sorted(attributes_of(s)["otelgpu.train.step"] for s in spans)
    assert numbers == [1, 2, 3, 4, 5]
    assert runtime.step_duration.merged().count == 5
    assert runtime.stats.dropped() == {}


def test_the_attributes_are_the_blocks_not_a_later_mutation(app: InMemoryOtel) -> None:
    runtime = _runtime_now()
    attributes = {"run": "a"}
    with runtime.deferred._run_lock:  # the finishes wait until the dict changed
        with otelgpu.step(samples=1, attributes=attributes):
            time.sleep(LONG_S)
        with otelgpu.request(model="m", attributes=attributes):
            time.sleep(LONG_S)
        attributes["run"] = "b"  # the caller reuses its dict before the finish ran
    runtime.force_flush()
    assert [attributes_of(s)["run"] for s in _spans(app)] == ["a", "a"]


def test_a_block_ending_after_shutdown_still_finishes(app: InMemoryOtel) -> None:
    step = otelgpu.step(samples=1)
    step.__enter__()
    runtime = _runtime_now()
    time.sleep(LONG_S)
    runtime.deferred.close()  # what shutdown does first: the queue takes nothing more
    step.__exit__(None, None, None)
    (span,) = _spans(app)
    assert span.name == catalog.STEP_SPAN


# ------------------------------------------------------------------ DeferredWork


def test_offer_says_no_when_full_or_stopped_and_counts_nothing() -> None:
    stats = InternalStats()
    work = DeferredWork(stats, where="t", interval_s=3600.0, batch=64)
    assert work.offer_limit == 256
    work.offer_limit = 2
    done: list[int] = []
    assert work.offer(done.append, 1) and work.offer(done.append, 2)
    assert not work.offer(done.append, 3)  # full: the caller runs it
    assert stats.dropped() == {}
    work.submit(done.append, 4)  # submit keeps its own, larger limit
    assert work.pending == 3
    work.drain()
    assert done == [1, 2, 4]
    work.close()
    assert not work.offer(done.append, 5)
    work.submit(done.append, 6)  # stopped: neither queued nor counted as a drop
    assert done == [1, 2, 4] and stats.dropped() == {}


def test_submit_past_its_limit_drops_and_counts() -> None:
    stats = InternalStats()
    work = DeferredWork(stats, where="t", limit=2, interval_s=3600.0)
    done: list[int] = []
    for i in range(4):
        work.submit(done.append, i)
    work.drain()
    assert done == [0, 1]
    assert stats.dropped() == {("traces", "deferred_queue_full"): 2}
    work.close()


def test_the_thread_runs_what_waits_in_order_and_reports_failures() -> None:
    stats = InternalStats()
    work = DeferredWork(stats, where="t", interval_s=0.01)
    done: list[int] = []

    def fail() -> None:
        raise RuntimeError("broken finish")

    work.offer(done.append, 1)
    work.offer(fail)
    work.offer(done.append, 2)
    deadline = time.monotonic() + 10
    while work.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    work.close()
    assert done == [1, 2]
    assert stats.errors() == {"t": 1}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_a_forked_child_runs_its_own_first_offer_not_the_parents_queue() -> None:
    work = DeferredWork(InternalStats(), where="t", interval_s=3600.0)
    done: list[str] = []
    work.offer(done.append, "parent")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's queue is not its own; its first offer counts
        try:
            work.offer(done.append, "child")
            work.drain()
            os.write(write, ",".join(done).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child_saw = pipe.read().decode()
    os.waitpid(pid, 0)
    assert child_saw == "child"
    work.drain()
    work.close()
    assert done == ["parent"]
