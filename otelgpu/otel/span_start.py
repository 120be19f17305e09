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
so a later processor is seen. Thread-safe (one tuple assignment).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace import sampling
from opentelemetry.trace import Span, SpanKind

from otelgpu.otel.compact_span import start_compact
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


class SpanStarter:
    """Starts spans of one tracer (see the module docstring)."""

    def __init__(self, tracer: Any) -> None:
        self._tracer = tracer
        #: (sampler, processors tuple, attributes may be deferred) of the last check.
        self._checked: tuple[Any, Any, bool] = (None, None, False)

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
