"""Training steps: the step span (with GPU context) and the step metrics.

Metrics: ``otelgpu.train.step.duration`` (sketch), ``otelgpu.train.steps``,
``otelgpu.train.samples``, ``otelgpu.train.tokens`` (counters), all with the step's
``attributes``. Thread-safe; :meth:`StepRecorder.finish` and :meth:`StepRecorder.record`
never raise.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import INVALID_SPAN, Span, SpanContext, Status, StatusCode

from otelgpu import _values
from otelgpu.metrics import catalog
from otelgpu.otel.finished_span import FinishedSpans
from otelgpu.otel.tail_sampling import HEALTH_FLAGS as _HEALTH
from otelgpu.otel.tail_sampling import StepSpanSampler
from otelgpu.runtime.held_steps import HeldStep, HeldSteps
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


_MAX = _values.MAX_COUNT

#: A step looks at the sampler's event count at most once per millisecond
#: (events are published a round late, held steps wait two intervals: plenty of looks).
_LOOK_EVERY_NS = 1_000_000


class StepMetrics:
    """The step metrics of a batch of records without ``attributes`` (one attribute set:
    none), added to their instruments once for the batch (:meth:`StepRecorder.record_many`):
    the duration sketch takes the durations in one ``record_many``, the counters their
    sums, and the steps sampled out are counted once."""

    __slots__ = ("durations", "released", "samples", "tokens")

    def __init__(self) -> None:
        self.durations: list[float] = []
        self.samples: float = 0
        self.tokens: float = 0
        self.released = 0  # sampled out, not held: counted as dropped (tail_sampled)


class StepRecorder(Recorder[StepRecord]):
    """Turns :class:`StepRecord` rows into spans and metrics.

    With tail-keeping sampling it decides each step span, counts the steps it samples out
    (``otelgpu.internal.dropped``, reason ``tail_sampled``) and, while GPUs are sampled,
    holds them a short while (:mod:`~.held_steps`): a GPU health event the sampler
    publishes after the step was decided still gets the step exported.
    """

    where = "record_step"

    def __init__(self, parts: Parts) -> None:
        super().__init__(parts)
        sampler = parts.step_sampler
        self._sampler = sampler if sampler is not None and sampler.active else None
        #: sampled-out steps held for late GPU health events (with tail-keeping sampling)
        self._held = (
            HeldSteps(parts.held_horizon_ns, self._released) if self._sampler is not None else None
        )
        self._lane: StepLane | None = None
        self._finished = FinishedSpans(parts.tracer)
        self._events_seen = 0  # the sampler's event count at the last look
        self._next_look_ns = 0  # when (monotonic ns) a step looks again
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
        return self._starter.start(
            record.name or catalog.STEP_SPAN,
            context=record.context,
            start_time=record.start_ns,
            attributes=record.span_attributes,
        )

    def finish(self, span: Span, record: StepRecord) -> None:
        """Attributes, GPU context, metrics, then end ``span`` at ``record.end_ns``.

        Never raises. Out-of-range ``step``, ``samples`` or ``tokens`` are dropped and
        counted (``otelgpu._values``), never exported. With tail-keeping sampling, a span
        sampled out gets no attributes (its processors drop it).
        """
        self._finish(span, record)

    def record(self, record: StepRecord) -> Span:
        """Span and metrics of a finished step; returns the (ended) span. Never raises.

        With tail-keeping sampling the step is decided first, and a step sampled out gets
        no span at all (returned: a non-recording span), only its metrics."""
        if self._sampler is None or (record.name or catalog.STEP_SPAN) != catalog.STEP_SPAN:
            return super().record(record)
        return self._finish(None, record)

    def record_many(self, records: Iterable[StepRecord], *, spans: bool = True) -> None:
        """:meth:`record` of each record, in order (``spans=False``: :meth:`finish` of a
        non-recording span -- metrics only, no span, no sampling decision). The same
        spans, decisions and metric values as one call per record, but the step metrics
        of the records without ``attributes`` are added once for the batch
        (:class:`StepMetrics`) and the held steps looked at once. Never raises."""
        batch = StepMetrics()
        for record in records:
            if not spans:
                self._finish(INVALID_SPAN, record, batch)
            elif self._sampler is not None and (record.name or catalog.STEP_SPAN) == (
                catalog.STEP_SPAN
            ):
                self._finish(None, record, batch)
            else:  # Recorder.record: a span that could not start gets no metrics either
                try:
                    span = self.start_span(record)
                except Exception as exc:  # noqa: BLE001 - hot path
                    self._stats.report_error(self.where, exc)
                    continue
                self._finish(span, record, batch)
        self._publish(batch)

    def lane(self) -> StepLane | None:
        """The bulk path for steps known as numbers (:class:`StepLane`), where it gives the
        same spans and metrics as :meth:`record_many`: tail-keeping sampling is on and no
        GPU is sampled (so a step has no GPU context and is never held). None elsewhere;
        ask again per batch of steps (a GPU sampler may start late)."""
        sampler = self._sampler
        if sampler is None or self._gpu.sampler is not None:
            return None
        lane = self._lane
        if lane is None:
            lane = self._lane = StepLane(self, sampler)
        return lane

    def _record_decided(self, records: Iterable[StepRecord], batch: StepMetrics) -> None:
        """Span and metrics of steps :class:`StepLane` already decided to keep, then the
        batch's metrics (:meth:`_publish`). Never raises."""
        for record in records:
            self._finish(None, record, batch, decided=True)
        self._publish(batch)

    def _publish(self, batch: StepMetrics) -> None:
        """A batch's step metrics, added once; its steps sampled out counted once."""
        try:
            if batch.durations:
                self.duration.record_many(batch.durations)
                self._steps.add(len(batch.durations))
            if batch.samples:
                self._samples.add(batch.samples)
            if batch.tokens:
                self._tokens.add(batch.tokens)
        except Exception as exc:  # noqa: BLE001 - hot path
            self._stats.report_error("step", exc)
        if batch.released:
            self._released(batch.released)
        self._maybe_look_back()

    def _finish(
        self,
        span: Span | None,
        record: StepRecord,
        batch: StepMetrics | None = None,
        *,
        decided: bool = False,
    ) -> Span:
        """:meth:`finish` of a live ``span``, or of a step recorded after the fact
        (``span=None``: the span is started here if the step is kept; ``decided``: the
        tail-keeping sampler already kept it, :class:`StepLane`); with ``batch``
        (:meth:`record_many`), the metrics of a record without attributes go there."""
        start_ns, end_ns = record.start_ns, record.end_ns
        sampler = self._sampler
        upstream: int | None = None  # span id whose upstream decision the processors follow
        sampled_out = False
        try:
            stats = self._stats
            # _values.count's common case (an int in range, or None), inlined: per step
            samples = record.samples
            if samples is not None and not (type(samples) is int and 0 <= samples <= _MAX):
                samples = _values.count(samples, "samples", stats)
            tokens = record.tokens
            if tokens is not None and not (type(tokens) is int and 0 <= tokens <= _MAX):
                tokens = _values.count(tokens, "tokens", stats)
            step = record.step
            if step is None:
                step = self.next_number()
            elif not (type(step) is int and 0 <= step <= _MAX) and (
                _values.count(step, "step", stats) is None
            ):
                step = 0
            attributes = record.attributes
            devices = record.devices
            duration_s = max(end_ns - start_ns, 0) / 1e9
            # MFU and energy per unit of work (otelgpu.gpu_truth.work) read the GPU
            # context even for an unsampled span: their sketches cover every step.
            gpu = self._gpu
            sampled_gpu = gpu.sampler is not None
            context, events = gpu.context(start_ns, end_ns, devices) if sampled_gpu else ({}, [])
            finished = False  # kept, and built ended without an SDK span (_emit_finished)
            if sampler is not None and (
                span is None or (span.is_recording() and self._is_step(span))
            ):
                keep = decided or sampler.decide(
                    end_ns - start_ns, self._important(record, context, events, span), end_ns
                )
                if span is None:  # after the fact: only a kept step gets a span
                    if keep and decided and not sampled_gpu and self._finishable(record):
                        finished = True
                    else:
                        span = self._start(record) if keep else INVALID_SPAN
                if span is not None and span is not INVALID_SPAN:
                    # the processors follow this decision (a dropped live span: they drop
                    # it); none ever sees the invalid span of a step sampled out here
                    upstream = span.get_span_context().span_id
                    sampler.decided(upstream, keep)
                sampled_out = not keep  # build nothing for a span the processors drop
            elif span is None:
                span = self._start(record)
            # A span nobody sees (dropped by the OTel sampler or by tail-keeping sampling,
            # or a provider without span processor, e.g. Prometheus only) gets no
            # attribute dict built.
            recording = not sampled_out and span is not None and seen_by_processors(span)
            flops = record.flops
            if flops is not None:
                flops = _values.flops(flops, "flops", stats)
            # Energy per unit of work needs the GPU context, MFU the FLOPs: without either
            # there is nothing to record or add (a CPU loop, every step).
            work = (
                self._work.step(
                    span if recording else None,
                    context,
                    duration_s,
                    samples,
                    tokens,
                    flops,
                    attributes or None,
                )
                if context or flops
                else {}
            )
            if finished and not self._emit_finished(record, (step, samples, tokens), work):
                # the SDK's path after all (the span's limits, a current parent...)
                span = self._start(record)
                if span is not INVALID_SPAN:
                    upstream = span.get_span_context().span_id
                    sampler.decided(upstream, True)  # type: ignore[union-attr]
                recording = seen_by_processors(span)
            if recording and span is not None:
                self._fill(span, record, (step, samples, tokens), context, work, events)
            elif sampled_out and span is not None:
                self._sampled_out(span, record, (step, samples, tokens), work, sampled_gpu, batch)
            # The metric calls copy an attribute set only when it is new to them.
            metric_attrs = attributes or None
            if batch is not None and metric_attrs is None:
                batch.durations.append(duration_s)
                if samples:
                    batch.samples += samples
                if tokens:
                    batch.tokens += tokens
            else:
                self.duration.record(duration_s, metric_attrs)
                self._steps.add(1, metric_attrs)
                if samples:
                    self._samples.add(samples, metric_attrs)
                if tokens:
                    self._tokens.add(tokens, metric_attrs)
        except Exception as exc:  # noqa: BLE001 - hot path
            self._stats.report_error("step", exc)
        finally:
            if span is not None:
                span.end(end_time=end_ns)
            if upstream is not None and sampler is not None:
                sampler.forget(upstream)
        if batch is None:
            self._maybe_look_back()
        return span if span is not None else INVALID_SPAN

    def _maybe_look_back(self) -> None:
        """:meth:`_look_back` at most once per ``_LOOK_EVERY_NS``, and only while steps are
        held: with none held a new event has nothing to claim (and the sampler's event
        count is not read at every step of a loop whose steps are all kept). Runs on the
        thread that ends a step (the host's): never raises."""
        held = self._held
        if not held:  # None, or holding nothing
            return
        if (now := time.monotonic_ns()) >= self._next_look_ns:
            self._next_look_ns = now + _LOOK_EVERY_NS
            try:
                self._look_back()
            except Exception as exc:  # noqa: BLE001 - hot path
                self._stats.report_error("step", exc)

    def _fill(
        self,
        span: Span,
        record: StepRecord,
        counts: tuple[int, float | None, float | None],
        context: dict[str, Any],
        work: Any,
        events: list[Any],
    ) -> None:
        """A recording step span's attributes, GPU context, events and status."""
        step, samples, tokens = counts
        start_ns, end_ns = record.start_ns, record.end_ns
        attrs = step_attributes(max(end_ns - start_ns, 0) / 1e9, step, samples, tokens)
        self._annotate(
            span, attrs, record.attributes, context, work, (start_ns, end_ns, record.devices),
            events,
        )  # fmt: skip
        for name, t_ns, event_attributes in record.events:
            span.add_event(name, event_attributes, timestamp=t_ns)
        failed = record.failed
        if failed is not None:
            span.record_exception(failed)
            span.set_status(Status(StatusCode.ERROR, type(failed).__qualname__))

    @staticmethod
    def _finishable(record: StepRecord) -> bool:
        """Whether a kept step recorded after the fact may be built ended
        (``otelgpu.otel.finished_span``): a root step span without events or failure."""
        return (
            record.context is None
            and not record.events
            and record.failed is None
            and (record.name or catalog.STEP_SPAN) == catalog.STEP_SPAN
        )

    def _emit_finished(
        self, record: StepRecord, counts: tuple[int, float | None, float | None], work: Any
    ) -> bool:
        """The kept step's span built ended and handed to the processor, its attributes
        as :meth:`_fill` would set them on a span started with ``span_attributes``;
        ``False`` (nothing done) where the SDK's path must run."""
        step, samples, tokens = counts
        start_ns, end_ns = record.start_ns, record.end_ns
        own = step_attributes(max(end_ns - start_ns, 0) / 1e9, step, samples, tokens)
        if record.attributes:  # Recorder._annotate's merge, without a GPU context
            own.update(record.attributes)
        own.update(work)
        return self._finished.emit(
            catalog.STEP_SPAN,
            start_ns,
            end_ns,
            (record.span_attributes, own),
            kept_by=self._sampler,
        )

    def _released(self, n: int) -> None:
        self._stats.add_dropped("traces", "tail_sampled", n)

    def _sampled_out(
        self,
        span: Span,
        record: StepRecord,
        counts: tuple[int, float | None, float | None],
        work: Any,
        sampled_gpu: bool,
        batch: StepMetrics | None = None,
    ) -> None:
        """A step sampled out: held for a late GPU health event while GPUs are sampled
        (counted when it leaves unclaimed), else counted now (with ``batch``: with it)."""
        held = self._held
        if held is None or not sampled_gpu:
            if batch is not None:
                batch.released += 1
            else:
                self._released(1)
            return
        parent: Context | SpanContext | None
        if span.is_recording():  # a live span: its own parent (none: a root span)
            parent = getattr(span, "parent", None)
        else:  # after the fact: the parent it would have had now
            parent = record.context if record.context is not None else otel_context.get_current()
        held.hold(HeldStep(record, *counts, work=work, parent=parent))

    def _look_back(self) -> None:
        """When the sampler published new GPU health events, export the held steps whose
        window holds one (each once)."""
        gpu = self._gpu
        count = gpu.event_count()
        if count == self._events_seen:
            return
        self._events_seen = count
        held = self._held
        if held is None:
            return
        window = held.span()
        if window is None:
            return
        for late in held.claim(gpu.events(*window)):
            self._export_late(late)

    def _export_late(self, late: HeldStep) -> None:
        """The span of a held step after all: a new span (the sampled-out one, if live,
        was dropped) under the parent it had, with the GPU context read now."""
        record = late.record
        parent = late.parent
        if not isinstance(parent, Context):  # a live span's parent, or a root step
            parent = (
                trace.set_span_in_context(trace.NonRecordingSpan(parent))
                if parent is not None
                else Context()
            )
        try:
            span = self._starter.start(
                record.name or catalog.STEP_SPAN,
                context=parent,
                start_time=record.start_ns,
                attributes=record.span_attributes,
            )
        except Exception as exc:  # noqa: BLE001 - hot path
            self._stats.report_error(self.where, exc)
            self._released(1)
            return
        if not span.is_recording():  # the OTel sampler dropped the new span
            self._released(1)
            return
        sampler = self._sampler
        span_id = span.get_span_context().span_id
        if sampler is not None:
            sampler.decided(span_id, True)
        try:
            context, events = self._gpu.context(record.start_ns, record.end_ns, record.devices)
            if seen_by_processors(span):
                self._fill(
                    span, record, (late.step, late.samples, late.tokens), context, late.work,
                    events,
                )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - hot path
            self._stats.report_error("step", exc)
        finally:
            span.end(end_time=record.end_ns)
            if sampler is not None:
                sampler.forget(span_id)

    def settle(self) -> None:
        """Before a flush or shutdown: export the held steps that late GPU health events
        claim, then let the others go (counted). Never raises."""
        held = self._held
        if held is None:
            return
        try:
            self._events_seen = -1  # look whatever the count
            self._next_look_ns = 0
            self._look_back()
        except Exception as exc:  # noqa: BLE001
            self._stats.report_error("step", exc)
        held.release_all()

    def after_fork_in_child(self) -> None:
        """The parent's held steps are not the child's (replaced, never locked, here)."""
        if self._held is not None:
            self._held.after_fork_in_child()

    def _start(self, record: StepRecord) -> Span:
        try:
            return self.start_span(record)
        except Exception as exc:  # noqa: BLE001 - hot path
            self._stats.report_error(self.where, exc)
            return INVALID_SPAN

    @staticmethod
    def _is_step(span: Span) -> bool:
        return getattr(span, "name", catalog.STEP_SPAN) == catalog.STEP_SPAN

    @staticmethod
    def _important(
        record: StepRecord, context: dict[str, Any], events: list[Any], span: Span | None
    ) -> bool:
        """Whether the step is always kept: it failed, or has events (GPU health events of
        its window, the record's, the live span's) or GPU health flags, or the live span's
        status is ERROR."""
        if record.failed is not None or events or record.events:
            return True
        # tail_sampling.flagged, inlined three times: this runs for every step
        span_attributes, attributes = record.span_attributes, record.attributes
        if (
            (context and not _HEALTH.isdisjoint(context))
            or (span_attributes and not _HEALTH.isdisjoint(span_attributes))
            or (attributes and not _HEALTH.isdisjoint(attributes))
        ):
            return True
        if span is None:
            return False
        status = getattr(span, "status", None)
        if status is not None and status.status_code is StatusCode.ERROR:
            return True
        # An SDK span's own event list: its ``events`` property copies it into a tuple
        # under the list's lock, per step (~15 µs on a cold cache), to learn its length.
        own = getattr(span, "_events", None)
        if type(own) is BoundedList:
            return len(own) > 0
        return bool(getattr(span, "events", None))


class StepLane:
    """Steps recorded from their numbers, for a background thread that has many at hand
    (the torch instrumentation's step thread): only the steps tail-keeping sampling keeps
    become a :class:`StepRecord` and a span; the others are numbers added to the step
    metrics once per batch. The same spans, decisions and metric values as
    :meth:`StepRecorder.record_many` of the same records, where
    :meth:`StepRecorder.lane` offers one (no GPU context: a step's importance is its
    own -- events, failure -- and nothing is held for a late GPU event).

    Per step, in step order: :meth:`decide` (for a step that may get a span), then
    :meth:`keep` with its record or :meth:`skip` with its numbers; :meth:`publish` ends
    a batch (kept steps are also published every :data:`KEEP_BATCH`). Not thread-safe:
    one caller at a time (the torch step queue's drain lock). Never raises.
    """

    KEEP_BATCH = 8
    """Kept steps recorded together: one stretch between two GIL hand-backs of the
    background thread (as the torch telemetry's ``EMIT_BATCH``)."""

    __slots__ = ("_batch", "_decide", "_kept", "_recorder", "_stats", "_work")

    def __init__(self, recorder: StepRecorder, sampler: StepSpanSampler) -> None:
        self._recorder = recorder
        self._decide = sampler.decide
        self._stats = recorder._stats
        self._work = recorder._work
        self._batch = StepMetrics()
        self._kept: list[StepRecord] = []

    def decide(self, duration_ns: int, end_ns: int, important: bool) -> bool:
        """Whether the step that ended at ``end_ns`` gets its span (tail-keeping sampling:
        ``StepSpanSampler.decide``); ``important``: it has events or failed."""
        try:
            return self._decide(duration_ns, important, end_ns)
        except Exception as exc:  # noqa: BLE001 - when in doubt, export
            self._stats.report_error("step", exc)
            return True

    def keep(self, record: StepRecord) -> None:
        """A step :meth:`decide` kept: its span and metrics (``record`` without
        ``attributes`` or a name: the step metrics' single attribute set)."""
        kept = self._kept
        kept.append(record)
        if len(kept) >= self.KEEP_BATCH:
            self.publish()

    def skip(
        self,
        duration_ns: int,
        samples: float | None,
        tokens: float | None,
        flops: float | None,
        *,
        sampled_out: bool,
    ) -> None:
        """A step without a span: its metrics only, counted as sampled out
        (``otelgpu.internal.dropped``, ``tail_sampled``) when ``sampled_out``, i.e.
        :meth:`decide` dropped it (not a step the caller never offered a span)."""
        try:
            batch = self._batch
            stats = self._stats
            # StepRecorder._finish's checks of the counts, inlined: per step
            if samples is not None and not (type(samples) is int and 0 <= samples <= _MAX):
                samples = _values.count(samples, "samples", stats)
            if tokens is not None and not (type(tokens) is int and 0 <= tokens <= _MAX):
                tokens = _values.count(tokens, "tokens", stats)
            duration_s = (duration_ns if duration_ns > 0 else 0) / 1e9
            batch.durations.append(duration_s)
            if samples:
                batch.samples += samples
            if tokens:
                batch.tokens += tokens
            if sampled_out:
                batch.released += 1
            if flops is not None:  # MFU is recorded for every step, as in _finish
                flops = _values.flops(flops, "flops", stats)
                if flops:
                    self._work.step(None, {}, duration_s, samples, tokens, flops, None)
        except Exception as exc:  # noqa: BLE001 - hot path
            stats.report_error("step", exc)

    def publish(self) -> None:
        """The kept steps' spans, then the batch's metrics, added once."""
        kept, batch = self._kept, self._batch
        if not kept and not batch.durations:
            return
        self._kept, self._batch = [], StepMetrics()
        self._recorder._record_decided(kept, batch)
