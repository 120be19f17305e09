"""``RuntimeAPI``: what the torch and vLLM instrumentors (and any package built on the
runtime) may use of ``otelgpu._runtime.Runtime``. They type against this protocol, not
the class, so the runtime's internals can change without touching them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.trace import Span

from otelgpu.metrics.instruments import Callback
from otelgpu.metrics.spec import MetricSpec
from otelgpu.otel.stats import InternalStats
from otelgpu.runtime.records import RequestRecord, StepRecord
from otelgpu.runtime.steps import StepLane


class RuntimeAPI(Protocol):
    """The runtime contract (ARCHITECTURE.md, "Runtime"). Every method is thread-safe;
    none raises into the caller."""

    @property
    def tracer(self) -> trace.Tracer: ...

    @property
    def stats(self) -> InternalStats: ...

    @property
    def closed(self) -> bool: ...

    def instrument(self, spec: MetricSpec, callback: Callback | None = None) -> Any:
        """The instrument of a catalog spec (created once per runtime)."""
        ...

    def record_step(self, record: StepRecord) -> Span:
        """Span and metrics of a finished step; returns the ended span."""
        ...

    def record_steps(self, records: Iterable[StepRecord], *, spans: bool = True) -> None:
        """:meth:`record_step` of each record in order (``spans=False``: metrics only, as
        :meth:`finish_step` of a non-recording span), the step metrics added once for the
        batch: for a background thread that has many steps at hand."""
        ...

    def step_lane(self) -> StepLane | None:
        """The bulk path of a background thread with steps known as numbers (only the
        steps tail-keeping sampling keeps get a record and a span), where it gives the
        same spans and metrics as :meth:`record_steps`; None elsewhere (ask per batch)."""
        ...

    def start_step_span(self, record: StepRecord) -> Span:
        """A live step span, to be ended by :meth:`finish_step`."""
        ...

    def finish_step(self, span: Span, record: StepRecord) -> None:
        """Attributes, GPU context and metrics of ``record``; ends ``span``."""
        ...

    def record_request(self, record: RequestRecord) -> Span:
        """Span and metrics of a finished request; returns the ended span."""
        ...

    def annotate(
        self, span: Span, start_ns: int, end_ns: int, devices: Sequence[str] | None = None
    ) -> None:
        """Add the GPU context and health events of a window to a live span."""
        ...

    def report_error(self, where: str, exc: BaseException | None = None) -> None:
        """Log the first error at ``where``; count all in ``otelgpu.internal.errors``."""
        ...


__all__ = ["RuntimeAPI"]
