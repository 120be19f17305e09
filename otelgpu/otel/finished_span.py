"""A span built finished and handed straight to otelgpu's span processor, where no one can
tell it from an SDK span started, given its attributes and ended.

A step span recorded after the fact (the torch instrumentation's background thread: the
whole step is known) goes start → attributes → end in one call, and only otelgpu's
processor ever sees it, which encodes it at its end and keeps no reference. The SDK path
still builds everything a live span needs -- its lock, a ``BoundedAttributes`` with its
own lock, the attribute writes under both, the end's checks -- about 35 µs of GIL-held CPU
per kept step in place, a third of what the torch step thread spent per step at 100 kept
spans a second (``benchmarks/JOURNAL.md``, stop 55).

:meth:`FinishedSpans.emit` builds the ended span directly: a :class:`FinishedSpan` (an SDK
``ReadableSpan``, its fields the SDK's own) with the ids from the tracer's id generator,
the trace flags and sampling result the SDK's default sampler gives a root span, its
attributes as ``set_attributes`` of each given mapping in turn would leave them (plain
values only, within the span's limits), and the tracer's self-metrics counted; then the
processor's ``on_end``, as ``Span.end`` calls it. Only where that is exactly what the SDK
would hand the processor (:meth:`FinishedSpans.target`):

* an SDK tracer, enabled, whose sampler is the SDK's default ``ParentBased(ALWAYS_ON)``
  and whose only processor is otelgpu's ``BoundedBatchSpanProcessor`` encoding spans as
  they end (so nothing keeps the span object or could tell its class);
* a root span (no parent given, none current), without events, links or an error status;
* attributes the SDK stores unchanged (``otelgpu.otel.span_attributes.plain_values``),
  no more than the span's count limit.

Anything else returns ``None`` and the caller takes the SDK's path
(``tests/pipeline/test_pipeline_finished_span.py`` compares both, byte for byte).
Thread-safety: :meth:`FinishedSpans.emit` may run on any thread (the check is one tuple
assignment; the processor's ``on_end`` is thread-safe).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision, ParentBased
from opentelemetry.trace import SpanKind
from opentelemetry.trace.status import Status, StatusCode

from otelgpu.otel.processor import BoundedBatchSpanProcessor
from otelgpu.otel.span_attributes import plain_values
from otelgpu.otel.tail_sampling import StepSpanSampler

__all__ = ["FinishedSpan", "FinishedSpans"]

_UNSET = Status(StatusCode.UNSET)
_RANDOM = getattr(trace_api.TraceFlags, "RANDOM_TRACE_ID", None)
_SAMPLED = trace_api.TraceFlags(trace_api.TraceFlags.SAMPLED)
_SAMPLED_RANDOM = (
    trace_api.TraceFlags(trace_api.TraceFlags.SAMPLED | _RANDOM) if _RANDOM is not None else None
)


class FinishedSpan(ReadableSpan):
    """An SDK ``ReadableSpan`` whose fields :meth:`FinishedSpans.emit` sets (the SDK's
    properties read them unchanged)."""

    def __init__(self) -> None:  # pylint: disable=super-init-not-called
        # The fields are set by FinishedSpans.emit (ReadableSpan.__init__ would set defaults).
        pass


class FinishedSpans:
    """Emits finished spans of one tracer (see the module docstring)."""

    def __init__(self, tracer: Any) -> None:
        self._tracer = tracer
        #: (sampler, processors tuple, the processor or None) of the last check.
        self._checked: tuple[Any, Any, BoundedBatchSpanProcessor | None] = (None, None, None)

    def target(self) -> BoundedBatchSpanProcessor | None:
        """The processor a finished span goes to, or ``None`` where the SDK path must run
        (module docstring). Checked again when the tracer's sampler or processors change."""
        tracer = self._tracer
        if type(tracer) is not SdkTracer:
            return None
        sampler = tracer.sampler
        processors = getattr(tracer.span_processor, "_span_processors", None)
        checked = self._checked
        if checked[0] is sampler and checked[1] is processors:
            return checked[2]
        target = None
        if (
            type(sampler) is ParentBased
            and getattr(sampler, "_root", None) is ALWAYS_ON
            and type(processors) is tuple
            and len(processors) == 1
            and type(processors[0]) is BoundedBatchSpanProcessor
            and processors[0].encodes_at_end
            and all(
                hasattr(tracer, a)
                for a in ("_is_enabled", "_tracer_metrics", "_span_limits", "id_generator")
            )
        ):
            target = processors[0]
        self._checked = (sampler, processors, target)
        return target

    def emit(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        attribute_sets: tuple[Mapping[str, Any] | None, ...],
        *,
        kept_by: StepSpanSampler | None = None,
    ) -> bool:
        """The ended root span ``name`` from ``start_ns`` to ``end_ns`` (ns since the
        epoch), its attributes those of ``attribute_sets`` set in turn (a key set again
        moves to the end, as the SDK's ``set_attributes`` does), handed to the processor;
        ``kept_by``: the tail-keeping sampler that already kept it (the processor follows
        that decision, as for a live span the step recorder decided). ``False`` (nothing
        done) where the SDK's path must run. Never raises on the span's own account: the
        processor's ``on_end`` reports its own failures."""
        processor = self.target()
        if processor is None:
            return False
        tracer = self._tracer
        if trace_api.get_current_span().get_span_context().is_valid:
            return False  # a parent: the SDK's sampler and flags decide
        if not tracer._is_enabled():
            return False
        limits = tracer._span_limits
        max_len = limits.max_span_attribute_length
        attributes: dict[str, Any] = {}
        count = 0
        for given in attribute_sets:
            if not given:
                continue
            values = plain_values(given, max_len)
            if values is None:
                return False
            count += len(values)
            if attributes and not attributes.keys().isdisjoint(values):
                for key in values:
                    attributes.pop(key, None)
            attributes.update(values)
        maxlen = limits.max_span_attributes
        if maxlen is not None and count > maxlen:
            return False  # the SDK drops the oldest: let it
        id_generator = tracer.id_generator
        flags = _SAMPLED
        if _SAMPLED_RANDOM is not None and id_generator.is_trace_id_random():
            flags = _SAMPLED_RANDOM
        context = trace_api.SpanContext(
            id_generator.generate_trace_id(),
            id_generator.generate_span_id(),
            is_remote=False,
            trace_flags=flags,
            trace_state=None,
        )
        span: Any = FinishedSpan()
        span._name = name
        span._context = context
        span._kind = SpanKind.INTERNAL
        span._instrumentation_info = tracer.instrumentation_info
        span._instrumentation_scope = tracer._instrumentation_scope
        span._parent = None
        span._start_time = start_ns
        span._end_time = end_ns
        span._attributes = attributes
        span._events = ()
        span._links = ()
        span._resource = tracer.resource
        span._status = _UNSET
        # the SDK counts a span at its start and, when it records, its end
        tracer._tracer_metrics.start_span(None, Decision.RECORD_AND_SAMPLE)()
        if kept_by is None:
            processor.on_end(span)
            return True
        span_id = context.span_id
        kept_by.decided(span_id, True)
        try:
            processor.on_end(span)
        finally:
            kept_by.forget(span_id)
        return True
