"""``otelgpu.otel.span_start.SpanStarter``: a span started with its attributes deferred
holds exactly what the SDK's ``start_span(attributes=…)`` gives it (keys, values, order,
dropped count, under every limit), and the attributes are deferred only where no sampler
or span processor could see the difference."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import (
    ReadableSpan,
    SpanLimits,
    SpanProcessor,
    TracerProvider,
    sampling,
)
from opentelemetry.trace import SpanKind

from otelgpu.otel import span_start
from otelgpu.otel.span_start import SpanStarter

CASES: dict[str, Mapping[str, Any]] = {
    "step-like": {
        "otelgpu.train.step": 7,
        "otelgpu.train.phase.forward": 0.25,
        "otelgpu.train.rule": "optimizer",
        "otelgpu.train.skipped": False,
        "otelgpu.gpu.ids": ["GPU-1", "GPU-2"],
    },
    "none and bytes": {"a.none": None, "a.bytes": b"\x00"},
    "needs the SDK's cleaning": {"a.map": {"k": 1}, "a.ok": 1, "a.nested": [[1]]},
    "long values": {"a.s": "x" * 40, "a.l": ["y" * 40]},
    "many": {f"a.{i}": i for i in range(12)},
}
LIMITS = {
    "default": SpanLimits(),
    "value length 8": SpanLimits(max_span_attribute_length=8),
    "count 5": SpanLimits(max_span_attributes=5),
}


def _state(span: Any) -> tuple[list[tuple[str, Any]], int]:
    return [(k, span.attributes[k]) for k in span.attributes], span.dropped_attributes


@pytest.mark.parametrize("limits", LIMITS.values(), ids=list(LIMITS))
@pytest.mark.parametrize("attributes", CASES.values(), ids=list(CASES))
def test_deferred_attributes_give_the_sdks_span(
    attributes: Mapping[str, Any], limits: SpanLimits
) -> None:
    tracer = TracerProvider(span_limits=limits).get_tracer("t")
    starter = SpanStarter(tracer)
    assert starter._deferrable()  # no processor, ALWAYS_ON parent-based: deferred
    ours = starter.start("s", context=None, start_time=1, attributes=attributes)
    sdk = tracer.start_span("s", start_time=1, attributes=attributes)
    ours.end(end_time=2)
    sdk.end(end_time=2)
    assert _state(ours) == _state(sdk)


class _SeeingSampler(sampling.Sampler):
    """An application's sampler: decides on the attributes it is given."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def should_sample(self, parent_context: Context | None, trace_id: int, name: str,
                      kind: SpanKind | None = None, attributes: Any = None, links: Any = None,
                      trace_state: Any = None) -> sampling.SamplingResult:  # fmt: skip
        self.seen.append(dict(attributes or {}))
        return sampling.SamplingResult(sampling.Decision.RECORD_AND_SAMPLE, attributes)

    def get_description(self) -> str:
        return "seeing"


class _SeeingProcessor(SpanProcessor):
    """An application's processor: reads the attributes at the span's start."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        self.seen.append(dict(span.attributes))

    def on_end(self, span: ReadableSpan) -> None:
        return None


def test_a_sampler_that_reads_attributes_gets_them_at_the_start() -> None:
    sampler = _SeeingSampler()
    starter = SpanStarter(TracerProvider(sampler=sampler).get_tracer("t"))
    starter.start("s", context=None, start_time=1, attributes={"a": 1})
    assert sampler.seen == [{"a": 1}]


def test_an_application_processor_sees_the_attributes_at_the_start() -> None:
    provider = TracerProvider()
    starter = SpanStarter(provider.get_tracer("t"))
    starter.start("s", context=None, start_time=1, attributes={"a": 1})
    assert starter._deferrable()
    seeing = _SeeingProcessor()
    provider.add_span_processor(seeing)  # added later: seen from then on
    starter.start("s", context=None, start_time=1, attributes={"a": 2})
    assert not starter._deferrable()
    assert seeing.seen == [{"a": 2}]


@pytest.mark.parametrize(
    "sampler, blind",
    [
        (sampling.ALWAYS_ON, True),
        (sampling.ALWAYS_OFF, True),
        (sampling.TraceIdRatioBased(0.5), True),
        (sampling.ParentBasedTraceIdRatio(0.5), True),
        (sampling.ParentBased(sampling.ALWAYS_ON), True),
        (sampling.ParentBased(_SeeingSampler()), False),
        (sampling.ParentBased(sampling.ALWAYS_ON, local_parent_sampled=_SeeingSampler()), False),
        (_SeeingSampler(), False),
    ],
)
def test_only_samplers_blind_to_attributes_allow_deferring(sampler: Any, blind: bool) -> None:
    assert span_start._blind(sampler) is blind
    starter = SpanStarter(TracerProvider(sampler=sampler).get_tracer("t"))
    assert starter._deferrable() is blind


def test_otelgpus_own_processors_allow_deferring() -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otelgpu.otel.processor import BoundedBatchSpanProcessor
    from otelgpu.report.live.provider import SpanRing

    assert span_start._own(BoundedBatchSpanProcessor.__new__(BoundedBatchSpanProcessor))
    assert span_start._own(SpanRing.__new__(SpanRing))
    assert not span_start._own(SimpleSpanProcessor(InMemorySpanExporter()))
