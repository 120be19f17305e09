"""otelgpu's own hot spans without the SDK's per-span allocations, where no one can tell.

A step or request span goes from ``start`` to ``end`` on the host's thread, and after a
long step every object it allocates and every function it runs is paid with cold caches
(on the 2-core VM of the benchmarks, 5-10x its warm cost). The SDK's
``Tracer.start_span`` builds, per span, a ``Span`` with two ``BoundedList`` (each a lock
and a deque) for events and links that a step span almost never has, runs every
processor's ``on_start``, and at ``end`` copies the span into a ``ReadableSpan`` snapshot
for the processors.

:class:`CompactSpan` is an SDK ``Span`` (a subclass: every method an application calls on
the current span -- attributes, events, links, status, exceptions, name -- is the SDK's,
with its limits, cleaning and warnings) that differs only in what it allocates:

* events and links get their ``BoundedList`` on first use (a shared empty one before);
* :func:`start_compact` repeats ``Tracer.start_span``'s decisions (parent, trace and span
  ids from the tracer's id generator, the tracer's sampler and its trace state, trace
  flags, the tracer's self-metrics) and skips the processors' ``on_start``; the SDK's
  default sampler (``ParentBased(ALWAYS_ON)``, exactly) is not called for a root span,
  whose result it fixes (~2 µs of its five calls per span);
* ``end`` hands the span itself to the processors, not a snapshot: once ended, an SDK
  span no longer changes (attributes are frozen, events, links, status and name refuse
  changes with the SDK's warning), so the snapshot protects nothing.

Used only where the difference is invisible (``otelgpu.otel.span_start``): an SDK tracer
whose sampler ignores attributes and whose processors are all otelgpu's (their
``on_start`` reads nothing and they keep no reference they would expect to be a
snapshot); anything else -- an application's processor, a custom sampler, another SDK --
gets ``Tracer.start_span`` unchanged. Where the tracer lacks an attribute this module
relies on (another SDK version), :func:`start_compact` returns ``None`` and the caller takes
the SDK's path. ``tests/pipeline/test_pipeline_compact_span.py`` compares both paths field
by field and byte for byte.

Thread-safety: as the SDK's ``Span`` (its lock guards the same state).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace import logger as _sdk_logger
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision, ParentBased, SamplingResult
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import SpanKind
from opentelemetry.trace.status import Status, StatusCode

__all__ = ["CompactSpan", "Prepared", "prepare_compact", "start_compact", "start_prepared"]

_UNSET = Status(StatusCode.UNSET)
#: Shared by every span without events or links (never appended to: see ``_add_event``).
_NONE: Any = BoundedList(0)
_SAMPLED = trace_api.TraceFlags(trace_api.TraceFlags.SAMPLED)
_NOT_SAMPLED = trace_api.TraceFlags(trace_api.TraceFlags.DEFAULT)
#: What ``ParentBased(ALWAYS_ON)`` -- the SDK's default sampler -- returns for a span
#: without a valid parent: record and sample, no attributes, no trace state (its root
#: sampler's result; ``tests/pipeline/test_pipeline_compact_span.py`` compares). Shared:
#: the span copies its attributes, and nothing else in it is per span.
_ROOT_ALWAYS_ON = SamplingResult(Decision.RECORD_AND_SAMPLE, None, None)
#: ``TraceFlags.RANDOM_TRACE_ID`` in SDKs that have it (W3C trace context level 2).
_RANDOM = getattr(trace_api.TraceFlags, "RANDOM_TRACE_ID", None)


class CompactSpan(SdkSpan):
    """An SDK span with lazily allocated events and links, ended without a snapshot
    (module docstring). Built by :func:`start_compact` only."""

    def __init__(self) -> None:  # pylint: disable=super-init-not-called
        # The fields are set by start_compact (SdkSpan.__init__ would allocate them all).
        pass

    def _add_event(self, event: Any) -> None:
        self._append("_events", self._limits.max_events, event, "_add_event")

    def _add_link(self, link: Any) -> None:
        self._append("_links", self._limits.max_links, link, "_add_link")

    def _append(self, field: str, limit: int | None, item: Any, caller: str) -> None:
        """The SDK's ``_add_event``/``_add_link`` (appended unless ended, else its warning),
        with the span's own list made on first use."""
        with self._lock:
            if self._end_time is None:
                items = getattr(self, field)
                if items is _NONE:
                    items = BoundedList(limit)
                    setattr(self, field, items)
                items.append(item)
                return
        _sdk_logger.warning("Tried calling %s on an ended span.", caller)

    def end(self, end_time: int | None = None) -> None:
        with self._lock:
            if self._end_time is not None:
                _sdk_logger.warning("Calling end() on an ended span.")
                return
            self._end_time = end_time if end_time is not None else time.time_ns()
            attributes: Any = self._attributes
            attributes._immutable = True
        record_end_metrics = self._record_end_metrics
        if record_end_metrics:
            record_end_metrics()
        self._span_processor.on_end(self)


def start_compact(
    tracer: Any,
    name: str,
    context: Context | None,
    kind: SpanKind,
    start_time: int | None,
) -> trace_api.Span | None:
    """``tracer.start_span(name, context=context, kind=kind, start_time=start_time)`` as a
    :class:`CompactSpan` (or the SDK's ``NonRecordingSpan`` where the sampler drops it);
    ``None`` where ``tracer`` lacks what this needs (the caller then calls the SDK)."""
    prepared = prepare_compact(tracer, name, context, kind)
    if prepared is None or isinstance(prepared, trace_api.Span):
        return prepared
    return start_prepared(tracer, prepared, start_time)


#: A span built ahead of its start: (the span, its parent's span context, the decision).
Prepared = tuple[Any, Any, Any]


def prepare_compact(
    tracer: Any, name: str, context: Context | None, kind: SpanKind
) -> Prepared | trace_api.Span | None:
    """Everything :func:`start_compact` does before the span's start: its ids, sampling
    decision and fields, for the parent that ``context`` holds (``None``: the current
    context) -- a :data:`Prepared` for :func:`start_prepared`. A span where the tracer is
    disabled (the SDK's non-recording span, started already), ``None`` where ``tracer``
    lacks what this needs."""
    try:
        enabled = tracer._is_enabled
        id_generator = tracer.id_generator
        sampler = tracer.sampler
        limits = tracer._span_limits
        processor = tracer.span_processor
        tracer._tracer_metrics  # noqa: B018 - needed by start_prepared
    except AttributeError:
        return None
    parent: Any = trace_api.get_current_span(context).get_span_context()
    if parent is not None and not isinstance(parent, trace_api.SpanContext):
        return None  # the SDK raises here: let it
    if not enabled():
        return trace_api.NonRecordingSpan(context=parent)  # type: ignore[arg-type]
    if parent is None or not parent.is_valid:
        parent = None
        trace_id = id_generator.generate_trace_id()
    else:
        trace_id = parent.trace_id
    result: Any
    if parent is None and type(sampler) is ParentBased and sampler._root is ALWAYS_ON:
        result = _ROOT_ALWAYS_ON  # the SDK's default sampler on a root span: fixed result
    else:
        result = sampler.should_sample(context, trace_id, name, kind, None, ())
    decision = result.decision
    flags = _SAMPLED if decision.is_sampled() else _NOT_SAMPLED
    if _RANDOM is not None:
        random_id = (
            id_generator.is_trace_id_random()
            if parent is None
            else parent.trace_flags.random_trace_id
        )
        if random_id:
            flags = trace_api.TraceFlags(flags | _RANDOM)
    span_context = trace_api.SpanContext(
        trace_id,
        id_generator.generate_span_id(),
        is_remote=False,
        trace_flags=flags,
        trace_state=result.trace_state,
    )
    if not decision.is_recording():
        return trace_api.NonRecordingSpan(context=span_context), parent, decision
    compact = CompactSpan()
    span: Any = compact  # the SDK's private fields, set as SdkSpan.__init__ sets them
    span._name = name
    span._context = span_context
    span._kind = kind
    span._instrumentation_info = tracer.instrumentation_info
    span._instrumentation_scope = tracer._instrumentation_scope
    span._parent = parent
    span._start_time = None
    span._end_time = None
    span._events = _NONE
    span._links = _NONE
    span._resource = tracer.resource
    span._status = _UNSET
    span._sampler = sampler
    span._trace_config = None
    span._record_exception = True
    span._set_status_on_exception = True
    span._span_processor = processor
    span._limits = limits
    span._lock = threading.Lock()
    span._attributes = BoundedAttributes(
        limits.max_span_attributes,
        result.attributes,
        immutable=False,
        max_value_len=limits.max_span_attribute_length,
    )
    span._record_end_metrics = None
    return compact, parent, decision


def start_prepared(tracer: Any, prepared: Prepared, start_time: int | None) -> trace_api.Span:
    """Start a span :func:`prepare_compact` built: the tracer's self-metrics count it now,
    and a recording span starts at ``start_time`` (``None``: now). Once per prepared span."""
    span, parent, decision = prepared
    record_end_metrics = tracer._tracer_metrics.start_span(parent, decision)
    if decision.is_recording():
        span._start_time = start_time if start_time is not None else time.time_ns()
        span._record_end_metrics = record_end_metrics
    return span  # type: ignore[no-any-return]
