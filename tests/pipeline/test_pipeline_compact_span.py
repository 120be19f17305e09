"""``otelgpu.otel.compact_span``: a compact span is the SDK's span in everything an
application, a sampler, a processor or an exporter can see -- ids, flags, trace state,
attributes, events, links, status, limits and dropped counts, warnings after its end, and
the bytes on the wire -- and otelgpu uses it only where its own processors are alone."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from fixtures.function_twins import twin_params, use_twin
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import (
    ReadableSpan,
    SpanLimits,
    SpanProcessor,
    TracerProvider,
    sampling,
)
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.trace.span import TraceState

import otelgpu
from otelgpu.otel import span_encoding
from otelgpu.otel.compact_span import CompactSpan, prepare_compact, start_compact, start_prepared
from otelgpu.otel.recording import read_recording
from otelgpu.otel.span_start import SpanStarter


@pytest.fixture(
    params=twin_params(span_encoding.py_encode_span, "otelgpu.otel._otlp_c", "encode_span")
)
def span_encoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``span_encoding`` with one twin of ``encode_span`` in use (both where both exist)."""
    return use_twin(request, monkeypatch, span_encoding, "encode_span")


class _CountingIds(IdGenerator):
    """Deterministic ids: two providers built alike hand out the same sequence."""

    def __init__(self) -> None:
        self._next = 0x1000

    def generate_span_id(self) -> int:
        self._next += 1
        return self._next

    def generate_trace_id(self) -> int:
        self._next += 1
        return self._next << 64 | 0xABC


def _provider(sampler: Any = None, limits: SpanLimits | None = None) -> Any:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        sampler=sampler,
        resource=Resource.create({"service.name": "compact"}),
        span_limits=limits or SpanLimits(),
        id_generator=_CountingIds(),
        shutdown_on_exit=False,
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("lib.a", "1.0"), exporter


_EXCEPTION = ValueError("bad batch")
try:  # a traceback, the same for both spans
    raise _EXCEPTION
except ValueError:
    pass


def _compact(tracer: Any, name: str, context: Any, kind: SpanKind, start: int) -> Any:
    span = start_compact(tracer, name, context, kind, start)
    assert span is not None  # the SDK tracer this test builds has all it needs
    return span


def _prepared(tracer: Any, name: str, context: Any, kind: SpanKind, start: int) -> Any:
    """Built ahead (``prepare_compact``, as otelgpu's deferred thread does), started later
    (``start_prepared``, as the host's next entry does)."""
    prepared = prepare_compact(tracer, name, context, kind)
    assert isinstance(prepared, tuple)
    return start_prepared(tracer, prepared, start)


STARTS = {"at once": _compact, "prepared ahead": _prepared}


def _use(span: Any) -> None:
    """What an application and otelgpu do to a live span (the same on both paths)."""
    span.set_attributes({"otelgpu.train.step": 7, "a.list": ["x", "y"], "a.map": {"k": 1}})
    span.set_attribute("a.long", "z" * 40)
    span.set_attribute("otelgpu.train.step", 8)  # an existing key moves to the end
    span.add_event("otelgpu.gpu.xid", {"otelgpu.gpu.xid": 79, "hw.id": "GPU-1"}, timestamp=5)
    span.add_event("second", timestamp=6)
    span.add_event("third", {"n": 3}, timestamp=7)
    span.add_link(SpanContext(0xAB, 0xCD, is_remote=True, trace_flags=TraceFlags(1)), {"l": 1})
    span.record_exception(_EXCEPTION, {"extra": True}, timestamp=8)
    span.set_status(Status(StatusCode.ERROR, "ValueError"))
    span.update_name("renamed")


def _same(ours: ReadableSpan, sdk: ReadableSpan) -> None:
    assert ours.to_json() == sdk.to_json()
    assert ours.dropped_attributes == sdk.dropped_attributes
    assert ours.dropped_events == sdk.dropped_events
    assert ours.dropped_links == sdk.dropped_links
    assert span_encoding.encode_span(ours) == span_encoding.encode_span(sdk)


_REMOTE_SAMPLED = SpanContext(
    0xFEED, 0xBEEF, is_remote=True, trace_flags=TraceFlags(1), trace_state=TraceState([("k", "v")])
)
_REMOTE_UNSAMPLED = SpanContext(0xFEED, 0xBEEF, is_remote=True, trace_flags=TraceFlags(0))
PARENTS = {
    "root": None,
    "remote sampled parent": _REMOTE_SAMPLED,
    "remote unsampled parent": _REMOTE_UNSAMPLED,
}
LIMITS = {
    "default": SpanLimits(),
    "tight": SpanLimits(
        max_span_attributes=3,
        max_span_attribute_length=8,
        max_events=2,
        max_event_attributes=1,
        max_links=0,
    ),
}


@pytest.mark.parametrize("start", STARTS.values(), ids=list(STARTS))
@pytest.mark.parametrize("limits", LIMITS.values(), ids=list(LIMITS))
@pytest.mark.parametrize("parent", PARENTS.values(), ids=list(PARENTS))
@pytest.mark.parametrize("kind", [SpanKind.INTERNAL, SpanKind.SERVER])
def test_a_compact_span_is_the_sdks_span(
    limits: SpanLimits,
    parent: SpanContext | None,
    kind: SpanKind,
    span_encoder: Any,
    start: Any,
) -> None:
    context = None if parent is None else trace.set_span_in_context(NonRecordingSpan(parent))
    tracer, exported = _provider(limits=limits)
    sdk_tracer, sdk_exported = _provider(limits=limits)
    ours = start(tracer, "step", context, kind, 1_000)
    sdk = sdk_tracer.start_span("step", context=context, kind=kind, start_time=1_000)
    assert ours.get_span_context() == sdk.get_span_context()
    assert type(ours) is (CompactSpan if sdk.is_recording() else NonRecordingSpan)
    for span in (ours, sdk):
        _use(span)
        span.end(end_time=2_000)
    if parent is _REMOTE_UNSAMPLED:  # dropped by the default parent-based sampler
        assert not exported.get_finished_spans() and not sdk_exported.get_finished_spans()
        return
    (ours_out,) = exported.get_finished_spans()
    (sdk_out,) = sdk_exported.get_finished_spans()
    _same(ours_out, sdk_out)


SAMPLERS = {
    # the SDK's default, which start_compact does not call for a root span
    "parent-based on": sampling.ParentBased(sampling.ALWAYS_ON),
    "always off": sampling.ALWAYS_OFF,
    "ratio 0.5": sampling.TraceIdRatioBased(0.5),
    "parent-based ratio": sampling.ParentBasedTraceIdRatio(0.5),
    "parent-based off": sampling.ParentBased(sampling.ALWAYS_OFF),
}


@pytest.mark.parametrize("parent", PARENTS.values(), ids=list(PARENTS))
@pytest.mark.parametrize("sampler", SAMPLERS.values(), ids=list(SAMPLERS))
def test_the_tracers_sampler_decides_as_for_an_sdk_span(
    sampler: Any, parent: SpanContext | None
) -> None:
    context = None if parent is None else trace.set_span_in_context(NonRecordingSpan(parent))
    tracer, exported = _provider(sampler)
    sdk_tracer, sdk_exported = _provider(sampler)
    for _ in range(40):  # ratio samplers: kept and dropped trace ids alike
        ours = _compact(tracer, "step", context, SpanKind.INTERNAL, 1)
        sdk = sdk_tracer.start_span("step", context=context, start_time=1)
        assert ours.get_span_context() == sdk.get_span_context()
        assert ours.is_recording() == sdk.is_recording()
        assert type(ours) is (CompactSpan if sdk.is_recording() else NonRecordingSpan)
        ours.end(end_time=2)
        sdk.end(end_time=2)
    assert [s.context for s in exported.get_finished_spans()] == [
        s.context for s in sdk_exported.get_finished_spans()
    ]


def test_events_and_links_belong_to_their_own_span() -> None:
    tracer, exported = _provider()
    first = _compact(tracer, "a", None, SpanKind.INTERNAL, 1)
    second = _compact(tracer, "b", None, SpanKind.INTERNAL, 1)
    first.add_event("only-a", timestamp=1)
    first.add_link(SpanContext(1, 2, is_remote=False))
    for span in (first, second):
        span.end(end_time=2)
    a, b = exported.get_finished_spans()
    assert [e.name for e in a.events] == ["only-a"] and len(a.links) == 1
    assert b.events == () and b.links == ()


def test_an_ended_span_refuses_changes_with_the_sdks_warnings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tracer, exported = _provider()
    sdk_tracer, _ = _provider()
    spans = [
        _compact(tracer, "s", None, SpanKind.INTERNAL, 1),
        sdk_tracer.start_span("s", start_time=1),
    ]
    warnings = []
    for span in spans:
        span.end(end_time=2)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="opentelemetry.sdk.trace"):
            span.end(end_time=3)
            span.set_attribute("late", 1)
            span.add_event("late")
            span.add_link(SpanContext(1, 2, is_remote=False))
            span.set_status(Status(StatusCode.ERROR))
            span.update_name("late")
        warnings.append(len(caplog.records))
        assert span.end_time == 2 and span.name == "s" and not span.events
        assert "late" not in span.attributes and span.status.status_code is StatusCode.UNSET
    assert warnings[0] == warnings[1] == 6
    assert len(exported.get_finished_spans()) == 1  # ended once: the processors saw it once


class _SeeingProcessor(SpanProcessor):
    """An application's processor: keeps what it is handed at the end."""

    def __init__(self) -> None:
        self.ended: list[ReadableSpan] = []

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.append(span)


def test_the_compact_path_is_taken_only_where_otelgpus_processors_are_alone() -> None:
    from otelgpu.otel.processor import BoundedBatchSpanProcessor
    from otelgpu.otel.stats import InternalStats

    provider = TracerProvider(shutdown_on_exit=False)
    ours = BoundedBatchSpanProcessor(InMemorySpanExporter(), stats=InternalStats())
    provider.add_span_processor(ours)
    starter = SpanStarter(provider.get_tracer("t"))
    alone = starter.start("s", context=None, start_time=1, attributes={"a": 1})
    assert type(alone) is CompactSpan
    alone.end(end_time=2)
    seeing = _SeeingProcessor()
    provider.add_span_processor(seeing)
    shared = starter.start("s", context=None, start_time=1, attributes={"a": 2})
    assert type(shared) is not CompactSpan  # the SDK's span, as the application expects
    shared.end(end_time=2)
    (seen,) = seeing.ended
    assert dict(seen.attributes or {})["a"] == 2
    ours.shutdown()


def test_a_step_span_takes_what_the_application_adds_and_parents_its_spans(
    tmp_path: Path, reset_otel_globals: None
) -> None:
    handle = otelgpu.instrument(recording_dir=str(tmp_path), gpu=False, service_name="c")
    tracer = trace.get_tracer("app")
    with otelgpu.step(samples=4):
        current = trace.get_current_span()
        assert type(current) is CompactSpan
        current.set_attribute("app.batch", "b-1")
        current.add_event("app.checkpoint", {"n": 1})
        with tracer.start_as_current_span("app.forward"):
            pass
    handle.shutdown()
    spans = {
        span.name: span
        for path in sorted(tmp_path.glob("*.jsonl"))
        for request in read_recording(path)
        for rs in getattr(request, "resource_spans", ())
        for ss in rs.scope_spans
        for span in ss.spans
    }
    step, child = spans["otelgpu.train.step"], spans["app.forward"]
    attributes = {a.key: a.value for a in step.attributes}
    assert attributes["app.batch"].string_value == "b-1"
    assert attributes["otelgpu.train.samples"].int_value == 4
    assert [e.name for e in step.events] == ["app.checkpoint"]
    assert child.parent_span_id == step.span_id and child.trace_id == step.trace_id
