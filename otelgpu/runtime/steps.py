"""Training steps: the step span (with GPU context) and the step metrics.

Metrics: ``otelgpu.train.step.duration`` (sketch), ``otelgpu.train.steps``,
``otelgpu.train.samples``, ``otelgpu.train.tokens`` (counters), all with the step's
``attributes``. Thread-safe; :meth:`StepRecorder.finish` and :meth:`StepRecorder.record`
never raise.
"""

from __future__ import annotations

import itertools
from typing import Any

from opentelemetry.trace import Span, Status, StatusCode

from otelgpu import _values
from otelgpu.metrics import catalog
from otelgpu.runtime.recorder import Parts, Recorder, seen_by_processors
from otelgpu.runtime.records import StepRecord


def step_attributes(
    duration_s: float, step: int | None, samples: float | None, tokens: float | None
) -> dict[str, Any]:
    """The step span's own attributes: number, counts and their throughput."""
    attrs: dict[str, Any] = {"otelgpu.train.step": step if step is not None else 0}
    if samples is not None:
        attrs["otelgpu.train.samples"] = samples
        if duration_s > 0:
            attrs["otelgpu.train.samples_per_second"] = samples / duration_s
    if tokens is not None:
        attrs["otelgpu.train.tokens"] = tokens
        if duration_s > 0:
            attrs["otelgpu.train.tokens_per_second"] = tokens / duration_s
    return attrs


class StepRecorder(Recorder[StepRecord]):
    """Turns :class:`StepRecord` rows into spans and metrics."""

    where = "record_step"

    def __init__(self, parts: Parts) -> None:
        super().__init__(parts)
        instrument = parts.instrument
        self._numbers = itertools.count(1)
        self.duration = instrument(catalog.TRAIN_STEP_DURATION)
        self._steps = instrument(catalog.TRAIN_STEPS)
        self._samples = instrument(catalog.TRAIN_SAMPLES)
        self._tokens = instrument(catalog.TRAIN_TOKENS)

    def next_number(self) -> int:
        """The next step number (1, 2, ...; thread-safe)."""
        return next(self._numbers)

    def start_span(self, record: StepRecord) -> Span:
        """A live span for ``record`` (its start time, name, parent and span attributes)."""
        return self._tracer.start_span(
            record.name or catalog.STEP_SPAN,
            context=record.context,
            start_time=record.start_ns,
            attributes=record.span_attributes,
        )

    def finish(self, span: Span, record: StepRecord) -> None:
        """Attributes, GPU context, metrics, then end ``span`` at ``record.end_ns``.

        Never raises. Out-of-range ``step``, ``samples`` or ``tokens`` are dropped and
        counted (``otelgpu._values``), never exported.
        """
        start_ns, end_ns = record.start_ns, record.end_ns
        try:
            stats = self._stats
            samples = _values.count(record.samples, "samples", stats)
            tokens = _values.count(record.tokens, "tokens", stats)
            step = record.step
            if step is None:
                step = self.next_number()
            elif _values.count(step, "step", stats) is None:
                step = 0
            attributes = record.attributes
            devices = record.devices
            duration_s = max(end_ns - start_ns, 0) / 1e9
            # MFU and energy per unit of work (otelgpu.gpu_truth.work) read the GPU
            # context even for an unsampled span: their sketches cover every step.
            gpu = self._gpu
            context = gpu.attributes(start_ns, end_ns, devices) if gpu.sampler is not None else {}
            # A span nobody sees (dropped by the OTel sampler, or a provider without span
            # processor, e.g. Prometheus only) gets no attribute dict built.
            recording = seen_by_processors(span)
            work = self._work.step(
                span if recording else None,
                context,
                duration_s,
                samples,
                tokens,
                _values.flops(record.flops, "flops", stats),
                attributes or None,
            )
            if recording:
                attrs = step_attributes(duration_s, step, samples, tokens)
                self._annotate(span, attrs, attributes, context, work, (start_ns, end_ns, devices))
                failed = record.failed
                if failed is not None:
                    span.record_exception(failed)
                    span.set_status(Status(StatusCode.ERROR, type(failed).__qualname__))
            # The metric calls copy an attribute set only when it is new to them.
            metric_attrs = attributes or None
            self.duration.record(duration_s, metric_attrs)
            self._steps.add(1, metric_attrs)
            if samples:
                self._samples.add(samples, metric_attrs)
            if tokens:
                self._tokens.add(tokens, metric_attrs)
        except Exception as exc:  # noqa: BLE001 - hot path
            self._stats.report_error("step", exc)
        finally:
            span.end(end_time=end_ns)
