"""Starting an SDK span with its attributes, without the SDK's per-value cleaning where no
one can tell the difference.

``Tracer.start_span(attributes=…)`` cleans every value through the SDK's recursive,
isinstance-based walk into a new ``BoundedAttributes``: a step span recorded after the fact
carries ~16 attributes from its start, a request span 4. Started without them and given
them at once through :func:`otelgpu.otel.span_attributes.set_attributes` (exact type checks,
native where the core loaded), the span holds the same attributes, in the same order, with
the same limits applied and the same dropped count.

Only two parties could see the difference: the tracer's sampler, which receives the start
attributes, and the span processors' ``on_start``, which run before the attributes are set.
So the attributes are deferred only when the tracer is an SDK tracer whose sampler is one of
the SDK's samplers that ignore attributes (``ALWAYS_ON``/``ALWAYS_OFF``, ``TraceIdRatioBased``,
``ParentBased`` over those) and whose processors are otelgpu's own (their ``on_start`` reads
nothing). Any other sampler or processor -- an application's -- gets the SDK's path unchanged.
Under the same condition the span itself is an ``otelgpu.otel.compact_span.CompactSpan``
(the SDK's span without its per-span allocations and end-time snapshot). The decision is
kept per (sampler, processor tuple): the SDK replaces the tuple when a processor is added,
so a later processor is seen.

Under the same condition the span can be built ahead of its start (:meth:`SpanStarter.prepare`):
after a long step the host's entry pays for every object it touches with cold caches, and
building the span was most of it (~65 of ~90 µs of CPU at 50 steps/s in a slow hour).
otelgpu's deferred thread builds the next spans after each deferred finish (ids, sampling
decision, fields: ``otelgpu.otel.compact_span.prepare_compact``), for the name, kind and
parent span of the latest start, and a start in the current context takes one only if it
was built for it -- same process (a forked child never reuses its parent's ids), sampler,
name, kind and parent span -- and starts it at its own start time (the tracer's
self-metrics count it then). Anything else builds its span on the spot, and a mismatch
drops what was built. Thread-safety: one tuple assignment per check; the prepared spans
are a deque (append on the deferred thread, ``popleft`` on the host's).
"""

from __future__ import annotations

import collections
import os
from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace import sampling
from opentelemetry.trace import Span, SpanKind

from otelgpu.otel.compact_span import Prepared, prepare_compact, start_compact, start_prepared
from otelgpu.otel.span_attributes import set_attributes

__all__ = ["SpanStarter"]

#: The SDK's samplers that decide without reading attributes.
_BLIND_SAMPLERS: tuple[type, ...] = (sampling.StaticSampler, sampling.TraceIdRatioBased)


def _blind(sampler: Any) -> bool:
    """Whether ``sampler`` decides without reading a span's attributes."""
    if type(sampler) in _BLIND_SAMPLERS:
        return True
    if type(sampler) in (sampling.ParentBased, sampling.ParentBasedTraceIdRatio):
        return all(
            _blind(getattr(sampler, name, None))
            for name in (
                "_root",
                "_remote_parent_sampled",
                "_remote_parent_not_sampled",
                "_local_parent_sampled",
                "_local_parent_not_sampled",
            )
        )
    return False


#: otelgpu's span processors (module and name: no import of the live view here).
_OWN_PROCESSORS = frozenset(
    {
        ("otelgpu.otel.processor", "BoundedBatchSpanProcessor"),
        ("otelgpu.report.live.provider", "SpanRing"),
    }
)


def _own(processor: Any) -> bool:
    t = type(processor)
    return (t.__module__, t.__qualname__) in _OWN_PROCESSORS


#: Spans built ahead of their start, at most (:meth:`SpanStarter.prepare`).
READY = 4
#: Spans one :meth:`SpanStarter.prepare` builds, at most.
PREPARE_AT_ONCE = 2


class SpanStarter:
    """Starts spans of one tracer (see the module docstring)."""

    def __init__(self, tracer: Any) -> None:
        self._tracer = tracer
        #: (sampler, processors tuple, attributes may be deferred) of the last check.
        self._checked: tuple[Any, Any, bool] = (None, None, False)
        #: Spans built ahead (:meth:`prepare`), oldest first: (process id, sampler, name,
        #: kind, parent span, prepared).
        self._ready: collections.deque[tuple[int, Any, str, SpanKind, Any, Prepared]] = (
            collections.deque(maxlen=READY)
        )
        #: (name, kind, context) of the latest start in the current context: what
        #: :meth:`prepare` builds next.
        self._wanted: tuple[str, SpanKind, Context] | None = None

    def _deferrable(self) -> bool:
        tracer = self._tracer
        if type(tracer) is not SdkTracer:
            return False
        sampler = tracer.sampler
        processors = getattr(tracer.span_processor, "_span_processors", None)
        checked = self._checked
        if checked[0] is sampler and checked[1] is processors:
            return checked[2]
        ok = type(processors) is tuple and all(_own(p) for p in processors) and _blind(sampler)
        self._checked = (sampler, processors, ok)
        return ok

    def start(
        self,
        name: str,
        *,
        context: Context | None,
        start_time: int,
        attributes: Mapping[str, Any] | None,
        kind: SpanKind = SpanKind.INTERNAL,
    ) -> Span:
        """``tracer.start_span(name, context=…, kind=…, start_time=…, attributes=…)``, with
        the same resulting span (module docstring)."""
        if self._deferrable():
            span = None
            if context is None:
                span = self._take(name, kind, start_time)
            if span is None:
                span = start_compact(self._tracer, name, context, kind, start_time)
            if span is None:
                span = self._tracer.start_span(
                    name, context=context, kind=kind, start_time=start_time
                )
            if attributes:
                set_attributes(span, attributes)
            return span
        return self._tracer.start_span(  # type: ignore[no-any-return]
            name, context=context, kind=kind, start_time=start_time, attributes=attributes
        )

    def _take(self, name: str, kind: SpanKind, start_time: int) -> Span | None:
        """The span :meth:`prepare` built, started now, if it was built for this start
        (same process, sampler, name, kind and parent span); else ``None``, and the next
        :meth:`prepare` builds one for it."""
        current = otel_context.get_current()
        self._wanted = (name, kind, current)
        ready = self._ready
        if not ready:  # nothing built (blocks finished inline): no exception raised either
            return None
        try:
            pid, sampler, made_name, made_kind, parent, prepared = ready.popleft()
        except IndexError:  # taken meanwhile by another thread
            return None
        tracer = self._tracer
        if (
            pid != os.getpid()  # a forked child: the parent's ids are the parent's
            or sampler is not tracer.sampler
            or made_kind is not kind
            or made_name != name
            or parent is not trace_api.get_current_span(current)
        ):
            ready.clear()  # built for another start: so are the others
            return None
        if not tracer._is_enabled():
            return None
        return start_prepared(tracer, prepared, start_time)

    def prepare(self) -> None:
        """Build up to ``PREPARE_AT_ONCE`` spans ahead of their start (``READY`` at most
        waiting), for the name, kind and parent of the latest start (off the host's
        thread: otelgpu's deferred work calls this after a finish). A no-op when nothing
        was started yet, or the tracer is not one :meth:`start` builds spans for itself.
        Never raises."""
        try:
            wanted = self._wanted
            ready = self._ready
            if wanted is None or len(ready) >= READY or not self._deferrable():
                return
            name, kind, context = wanted
            tracer = self._tracer
            parent = trace_api.get_current_span(context)
            for _ in range(min(PREPARE_AT_ONCE, READY - len(ready))):
                prepared = prepare_compact(tracer, name, context, kind)
                if prepared is None or isinstance(prepared, Span):
                    return  # unsupported, or the tracer is disabled: started on the spot
                ready.append((os.getpid(), tracer.sampler, name, kind, parent, prepared))
        except Exception:  # noqa: BLE001 - an optimisation only: the start builds its own
            self._ready.clear()
