"""Spans built ahead of their start (``SpanStarter.prepare``, off the host's thread).

A step's entry, after a long step, pays for every object it touches with cold caches; most
of it was building the span. otelgpu's deferred thread now builds the next spans after a
finish, for the name, kind and parent of the latest start, and the entry only starts one:
the same span (ids, parent, sampling, start time) as built on the spot, never one built for
another parent, sampler or process.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider, sampling
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

import otelgpu
from otelgpu.otel import span_start
from otelgpu.otel.compact_span import CompactSpan
from otelgpu.otel.recording import read_recording
from otelgpu.otel.span_start import SpanStarter
from otelgpu.report.live.provider import SpanRing

pytestmark = pytest.mark.usefixtures("reset_otel_globals")


def _starter(sampler: Any = None) -> tuple[SpanStarter, SpanRing, Any]:
    """A starter over an SDK tracer whose only processor is otelgpu's (``SpanRing``)."""
    ring = SpanRing()
    provider = TracerProvider(sampler=sampler, shutdown_on_exit=False)
    provider.add_span_processor(ring)
    tracer = provider.get_tracer("otelgpu")
    return SpanStarter(tracer), ring, tracer


def _start(starter: SpanStarter, start: int, name: str = "otelgpu.train.step") -> Any:
    return starter.start(name, context=None, start_time=start, attributes=None)


def test_the_next_start_takes_the_span_prepared_for_it() -> None:
    starter, ring, _ = _starter()
    first = _start(starter, 1_000)
    starter.prepare()
    (ready,) = [item[-1][0] for item in list(starter._ready)[:1]]
    assert len(starter._ready) == span_start.PREPARE_AT_ONCE
    second = _start(starter, 2_000)
    assert second is ready
    assert type(second) is CompactSpan and second.start_time == 2_000
    ids = {first.get_span_context().span_id, second.get_span_context().span_id}
    ids.add(_start(starter, 3_000).get_span_context().span_id)  # the other prepared one
    assert len(ids) == 3
    # roots: each its own trace
    assert second.parent is None
    assert second.get_span_context().trace_id != first.get_span_context().trace_id
    for span in (first, second):
        span.end(end_time=5_000)
    assert [s.start_time for s in ring.steps] == [1_000, 2_000]


def test_prepare_builds_up_to_the_limit_and_only_after_a_start() -> None:
    starter, _, _ = _starter()
    starter.prepare()
    assert not starter._ready  # nothing started yet: nothing known to build
    _start(starter, 1)
    for _ in range(10):
        starter.prepare()
    assert len(starter._ready) == span_start.READY


def test_a_start_under_another_parent_builds_its_own() -> None:
    starter, _, _ = _starter()
    _start(starter, 1)  # a root step
    starter.prepare()
    parent = SpanContext(0xFEED, 0xBEEF, is_remote=True, trace_flags=TraceFlags(1))
    token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(parent)))
    try:
        span = _start(starter, 2)
        assert span.parent == parent
        assert span.get_span_context().trace_id == 0xFEED
        assert not starter._ready  # those were built for a root: dropped
        starter.prepare()  # now for this parent
        again = _start(starter, 3)
        assert again.parent == parent and again.start_time == 3
    finally:
        otel_context.detach(token)
    assert _start(starter, 4).parent is None


def test_a_sampler_or_process_change_drops_what_was_prepared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    starter, _, tracer = _starter()
    _start(starter, 1)
    starter.prepare()
    ready = starter._ready[0][-1][0]
    tracer.sampler = sampling.ParentBased(sampling.ALWAYS_OFF)
    starter._checked = (None, None, False)
    span = _start(starter, 2)
    assert span is not ready and not span.is_recording()  # the new sampler decided
    tracer.sampler = sampling.ParentBased(sampling.ALWAYS_ON)
    _start(starter, 3)
    starter.prepare()
    ready = starter._ready[0][-1][0]
    monkeypatch.setattr(os, "getpid", lambda: -1)  # as in a forked child
    span = _start(starter, 4)
    assert span is not ready and span.get_span_context() != ready.get_span_context()


def test_a_tracer_the_starter_does_not_build_for_prepares_nothing() -> None:
    provider = TracerProvider(shutdown_on_exit=False)
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    starter = SpanStarter(provider.get_tracer("app"))
    _start(starter, 1)
    starter.prepare()
    assert not starter._ready


def test_long_steps_start_spans_built_on_the_deferred_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handle = otelgpu.instrument(
        exporters="recording", recording_dir=str(tmp_path), gpu=False, frameworks="none"
    )
    runtime = handle.runtime
    assert runtime is not None
    starter = runtime.steps._starter
    taken: list[Any] = []
    take = starter._take

    def counting_take(name: str, kind: SpanKind, start_time: int) -> Any:
        span = take(name, kind, start_time)
        taken.append(span)
        return span

    monkeypatch.setattr(starter, "_take", counting_take)
    starts, span_ids = [], []
    try:
        for _ in range(12):
            with otelgpu.step() as s:
                starts.append(s._start_ns)
                span_ids.append(trace.get_current_span().get_span_context().span_id)
                time.sleep(0.003)
            if len(starts) % 3 == 0:
                runtime.deferred.drain()  # the deferred thread's turn: finish, then prepare
        handle.force_flush()
    finally:
        handle.shutdown()
    # all but the first few entries started a span built on the deferred thread
    assert sum(span is not None for span in taken) >= 8
    exported = [
        (span.start_time_unix_nano, int.from_bytes(span.span_id, "big"))
        for path in tmp_path.glob("*.jsonl")
        for message in read_recording(path)
        for resource_spans in getattr(message, "resource_spans", ())
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
        if span.name == "otelgpu.train.step"
    ]
    assert sorted(exported) == sorted(zip(starts, span_ids, strict=True))
    assert len(set(span_ids)) == 12
