"""GPU context of a time window: span attributes and health events from the sampler.

Thread-safe (the sampler's queries are); never raises (errors are reported).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.trace import Span

from otelgpu.otel import gpu_context, gpu_summary
from otelgpu.otel.span_attributes import set_attributes
from otelgpu.sampler._fields import F_ENERGY

ReportError = Callable[[str, BaseException], None]


class GpuContext:
    """Reads the window statistics and events of a ``GpuSampler`` (or nothing without one)."""

    def __init__(self, sampler: Any, report_error: ReportError) -> None:
        self.sampler = sampler
        self._report_error = report_error
        #: (sampler, its constant-size summarizer or None); rebuilt when the sampler changes.
        self._summary: tuple[Any, gpu_summary.GpuSummarizer | None] | None = None
        #: Called (no arguments, must not block) when a span's window holds health events:
        #: the runtime has them logged now rather than at the next metric collection.
        self.on_events: Callable[[], None] | None = None

    def device_names(self) -> dict[str, str]:
        """``{uuid: NVML product name}`` of the sampled GPUs ({} without a sampler)."""
        sampler = self.sampler
        if sampler is None:
            return {}
        return {d.uuid: str(getattr(d, "name", "") or "") for d in sampler.devices}

    def _summarizer(self, sampler: Any) -> gpu_summary.GpuSummarizer | None:
        summary = self._summary
        if summary is None or summary[0] is not sampler:
            summarizer = gpu_summary.summarizer_for(sampler)
            if summarizer is None and not getattr(sampler, "devices", None):
                return None  # still starting: ask again next time
            summary = self._summary = (sampler, summarizer)
        return summary[1]

    def attributes(
        self, start_ns: int, end_ns: int, devices: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """GPU context of ``[start_ns, end_ns]`` as span attributes ({} without a sampler).

        ``devices`` (UUIDs) restricts it to those GPUs, in that order (e.g. one vLLM
        engine's tensor-parallel group); default: every sampled GPU.
        """
        sampler = self.sampler
        if sampler is None:
            return {}
        try:
            summarizer = self._summarizer(sampler)
            if summarizer is not None:  # constant size for 1 or 8 GPUs (otel.gpu_summary)
                return summarizer.attributes(start_ns, end_ns, devices)
            windows = sampler.windows(start_ns, end_ns)
            if devices is not None:
                windows = {u: windows[u] for u in devices if u in windows}
            return gpu_context.window_attributes(windows)
        except Exception as exc:  # noqa: BLE001 - GPU context is best effort
            self._report_error("gpu window", exc)
            return {}

    def context(
        self, start_ns: int, end_ns: int, devices: Sequence[str] | None = None
    ) -> tuple[dict[str, Any], list[Any]]:
        """:meth:`attributes` and :meth:`events` of ``[start_ns, end_ns]`` together, read
        from the sampler in one call where it can (a span's GPU context on the hot path);
        ``({}, [])`` without a sampler."""
        sampler = self.sampler
        if sampler is None:
            return {}, []
        try:
            known = self._summary  # _summarizer's hit, inline: this runs for every span
            summarizer = (
                known[1] if known is not None and known[0] is sampler else self._summarizer(sampler)
            )
            if summarizer is None:
                return self.attributes(start_ns, end_ns, devices), self.events(
                    start_ns, end_ns, devices
                )
            attributes, events = summarizer.attributes_and_events(start_ns, end_ns, devices)
        except Exception as exc:  # noqa: BLE001 - GPU context is best effort
            self._report_error("gpu window", exc)
            return {}, []
        if events and devices is not None:
            wanted = set(devices)
            events = [e for e in events if getattr(e, "uuid", None) in wanted]
        return attributes, events

    def event_count(self) -> int:
        """How many GPU health events the sampler ever published (0 without a sampler, or
        one that cannot tell): read per step, a change means events to look at."""
        sampler = self.sampler
        if sampler is None:
            return 0
        try:
            return int(sampler.event_count())
        except AttributeError:  # a sampler without the count: nothing is looked at late
            return 0
        except Exception as exc:  # noqa: BLE001
            self._report_error("gpu events", exc)
            return 0

    def energy(
        self, start_ns: int, end_ns: int, devices: Sequence[str] | None = None
    ) -> float | None:
        """Energy (J) of ``[start_ns, end_ns]``, summed over the GPUs (or ``devices``) --
        ``otelgpu.gpu.energy`` of :meth:`attributes` without building the attributes
        (for a span nobody sees); ``None`` without a sampler or reading."""
        sampler = self.sampler
        if sampler is None:
            return None
        try:
            summarizer = self._summarizer(sampler)
            if summarizer is None:
                joules = self.attributes(start_ns, end_ns, devices).get("otelgpu.gpu.energy")
                return None if joules is None else float(joules)
            raw = summarizer.summary(start_ns, end_ns, devices)
            return raw.energy_j if raw is not None and raw.valid & F_ENERGY else None
        except Exception as exc:  # noqa: BLE001 - GPU context is best effort
            self._report_error("gpu window", exc)
            return None

    def events(self, start_ns: int, end_ns: int, devices: Sequence[str] | None = None) -> list[Any]:
        """GPU health events (``GpuEvent``) in ``[start_ns, end_ns]`` (of ``devices`` only)."""
        sampler = self.sampler
        if sampler is None:
            return []
        try:
            events = sampler.events(start_ns, end_ns)
            if not events:  # the common case: nothing to filter or copy
                return []
            events = list(events)
        except Exception as exc:  # noqa: BLE001
            self._report_error("gpu events", exc)
            return []
        if devices is not None:
            wanted = set(devices)
            events = [e for e in events if getattr(e, "uuid", None) in wanted]
        return events

    def add_events(
        self,
        span: Span,
        start_ns: int,
        end_ns: int,
        devices: Sequence[str] | None = None,
        events: Sequence[Any] | None = None,
    ) -> None:
        """GPU health events of the window (``events``: those :meth:`events` returned for
        it, when already read) as span events, timestamped when they happened."""
        if self.sampler is None:
            return
        if events is None:
            events = self.events(start_ns, end_ns, devices)
        if events and self.on_events is not None:
            self.on_events()
        for event in events:
            span.add_event(
                "otelgpu.gpu." + gpu_context.event_kind(event),
                gpu_context.event_attributes(event),
                timestamp=gpu_context.event_time_ns(event),
            )

    def annotate(
        self, span: Span, start_ns: int, end_ns: int, devices: Sequence[str] | None = None
    ) -> None:
        """Add the GPU context and health events of the window to a live span."""
        if self.sampler is None or not span.is_recording():
            return
        attrs = self.attributes(start_ns, end_ns, devices)
        if attrs:
            set_attributes(span, attrs)
        self.add_events(span, start_ns, end_ns, devices)
