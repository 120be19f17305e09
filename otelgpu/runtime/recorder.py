"""What the step and request recorders share: their collaborators (:class:`Parts`)
and ``record()``.

A recorder turns one kind of record into a span (``start_span``) and then its
attributes, GPU context and metrics (``finish``, which ends the span). ``record()`` does
both and never raises: a failure to start the span is counted at :attr:`Recorder.where`
and a non-recording span returned. Subclasses are thread-safe.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from opentelemetry import trace
from opentelemetry.trace import Span

from otelgpu.gpu_truth.work import WorkAccounting
from otelgpu.metrics.spec import MetricSpec
from otelgpu.otel.span_attributes import set_attributes
from otelgpu.otel.span_start import SpanStarter
from otelgpu.otel.stats import InternalStats
from otelgpu.otel.tail_sampling import StepSpanSampler
from otelgpu.runtime.gpu import GpuContext

__all__ = ["Parts", "Recorder", "seen_by_processors"]

R = TypeVar("R")


def seen_by_processors(span: Span) -> bool:
    """Whether anything will see ``span``'s attributes: it records, and -- for an SDK span --
    its tracer provider has a span processor (e.g. not one with a Prometheus pull endpoint
    only: its spans record, for their ids and sampling, but go nowhere).

    Read per span, so a processor added to the provider later counts from then on. A span
    of another SDK (without the SDK's processor attributes) counts as seen.
    """
    if not span.is_recording():
        return False
    processors = getattr(getattr(span, "_span_processor", None), "_span_processors", None)
    return processors is None or len(processors) > 0


@dataclass(frozen=True)
class Parts:
    """The runtime's pieces a recorder works with.

    Attributes:
        tracer: where the spans start.
        instrument: the runtime's idempotent instrument factory.
        gpu: the GPU context added to spans.
        stats: where our own errors are counted.
        work: GPU work accounting (``otelgpu.gpu.work``, MFU).
        step_sampler: the pipeline's tail-keeping sampler of step spans, when it samples
            (the step recorder decides with it before building a span).
        held_horizon_ns: how long a sampled-out step is held for a GPU health event
            published late (``runtime.held_steps``): about two sampling intervals.
    """

    tracer: trace.Tracer
    instrument: Callable[[MetricSpec], Any]
    gpu: GpuContext
    stats: InternalStats
    work: WorkAccounting
    step_sampler: StepSpanSampler | None = None
    held_horizon_ns: int = 1_000_000_000


class Recorder(abc.ABC, Generic[R]):
    """Base of :class:`~.steps.StepRecorder` and :class:`~.requests.RequestRecorder`."""

    where: str
    """The ``otelgpu.internal.errors`` place of a span that could not start."""

    def __init__(self, parts: Parts) -> None:
        self._tracer = parts.tracer
        self._starter = SpanStarter(parts.tracer)
        self._work = parts.work
        self._gpu = parts.gpu
        self._stats = parts.stats

    @abc.abstractmethod
    def start_span(self, record: R) -> Span:
        """A live span for ``record``."""

    def prepare_span(self) -> None:
        """Build the next :meth:`start_span`'s span ahead, off the host's thread
        (``otelgpu.otel.span_start.SpanStarter.prepare``). Never raises."""
        self._starter.prepare()

    @abc.abstractmethod
    def finish(self, span: Span, record: R) -> None:
        """Attributes, GPU context and metrics of ``record``; ends ``span``. Never raises."""

    def _annotate(
        self,
        span: Span,
        own: dict[str, Any],
        attributes: Mapping[str, Any] | None,
        context: Mapping[str, Any],
        work: Mapping[str, Any],
        window: tuple[int, int, Sequence[str] | None],
        events: Sequence[Any] | None = None,
    ) -> None:
        """Sets a recording span's attributes -- the record's ``own``, then the caller's
        ``attributes``, the GPU ``context`` and ``work`` (later ones win) -- and adds the
        GPU health events of ``window`` (start ns, end ns, devices) when GPUs are sampled
        (``events``: those already read for the window)."""
        if attributes:
            own.update(attributes)
        own.update(context)
        own.update(work)
        set_attributes(span, own)
        gpu = self._gpu
        if gpu.sampler is not None:
            gpu.add_events(span, *window, events=events)

    def record(self, record: R) -> Span:
        """Span and metrics of a finished record; returns the (ended) span. Never raises."""
        try:
            span = self.start_span(record)
        except Exception as exc:  # noqa: BLE001 - hot path
            self._stats.report_error(self.where, exc)
            return trace.INVALID_SPAN
        self.finish(span, record)
        return span
