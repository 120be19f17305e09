"""The runtime behind ``otelgpu.instrument()``: a thin, typed façade over its collaborators.

Contract (ARCHITECTURE.md, "Runtime"; the protocol is ``otelgpu.runtime.api.RuntimeAPI``):
:func:`current` returns the active :class:`Runtime` or ``None`` (not instrumented,
disabled, or a forked child). A runtime has ``tracer``, ``meter``, ``sampler`` (a started
``GpuSampler`` or ``None`` when no GPU or NVML is available), ``settings``, ``stats``, and:

* :meth:`Runtime.instrument` -- the instrument of a catalog ``MetricSpec`` (sketch-backed
  histograms are exported as OTLP exponential histograms plus ``<name>.quantile`` gauges);
* :meth:`Runtime.gpu_attributes` / :meth:`Runtime.gpu_events` / :meth:`Runtime.annotate`
  -- GPU context of a window (``otelgpu.runtime.gpu.GpuContext``);
* :meth:`Runtime.record_step` / :meth:`Runtime.record_request` -- a finished step or
  request (``StepRecord`` / ``RequestRecord``): span with GPU context and health events,
  and metrics, in one call (``otelgpu.runtime.steps`` / ``otelgpu.runtime.requests``);
* :meth:`Runtime.report_error` -- log once per place, count in ``otelgpu.internal.errors``.

Times are ``time.time_ns()`` nanoseconds; durations in metrics are seconds. Everything
here is thread-safe; the ``record_*``/``finish_*`` methods never raise (errors are
reported and a non-recording span is returned).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Span

from otelgpu._settings import Settings
from otelgpu.gpu_truth.work import WorkAccounting
from otelgpu.metrics import catalog
from otelgpu.metrics.instruments import Callback, Instruments
from otelgpu.metrics.spec import MetricSpec
from otelgpu.otel.deferred import DeferredWork
from otelgpu.otel.sketches import SketchHistogram, SketchRegistry
from otelgpu.otel.stats import InternalStats
from otelgpu.runtime.deferral import Finisher
from otelgpu.runtime.gpu import GpuContext
from otelgpu.runtime.health import HealthMonitor
from otelgpu.runtime.recorder import Parts
from otelgpu.runtime.records import OUTCOMES, RequestRecord, StepRecord
from otelgpu.runtime.requests import RequestRecorder
from otelgpu.runtime.steps import StepLane, StepRecorder
from otelgpu.version import __version__

if TYPE_CHECKING:
    from otelgpu.otel.providers import Pipeline

_logger = logging.getLogger("otelgpu")

_current: Runtime | None = None

__all__ = ["OUTCOMES", "RequestRecord", "Runtime", "StepRecord", "current"]


def current() -> Runtime | None:
    """The active runtime, or ``None`` when otelgpu is not instrumented (or disabled)."""
    return _current


def _set_current(runtime: Runtime | None) -> None:
    global _current
    _current = runtime


class Runtime:
    """One instrumented process's telemetry state (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        *,
        tracer_provider: trace.TracerProvider,
        meter_provider: metrics.MeterProvider,
        sampler: Any = None,
        pipeline: Pipeline | None = None,
        stats: InternalStats | None = None,
        sketches: SketchRegistry | None = None,
        internal_meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.stats = stats or InternalStats()
        self.sketches = sketches or SketchRegistry(
            relative_accuracy=settings.sketch_relative_accuracy,
            max_series=settings.max_series,
            quantiles=settings.quantiles,
            stats=self.stats,
        )
        self.tracer = tracer_provider.get_tracer("otelgpu", __version__)
        self.meter = meter_provider.get_meter("otelgpu", __version__)
        self.sketches.add_meter(self.meter)
        self._closed = False
        self._lock = threading.Lock()
        im = (internal_meter_provider or meter_provider).get_meter("otelgpu", __version__)
        self.instruments = Instruments(
            self.meter,
            internal_meter=im,
            sketches=self.sketches,
            max_series=settings.max_series,
            stats=self.stats,
        )
        self.gpu = GpuContext(sampler, self.report_error)
        #: Work instrumentors move off the host's loop (spans of finished vLLM requests).
        self.deferred = DeferredWork(self.stats, where="deferred telemetry")
        self.health = HealthMonitor(self.gpu, self.report_error)
        self.gpu.on_events = functools.partial(self.health.poll_soon, self.deferred)
        work = WorkAccounting(
            self.instrument,
            self.gpu.device_names,
            peak_flops=settings.peak_flops,
            dtype=settings.mfu_dtype,
        )
        own_spans = pipeline is not None and pipeline.tracer_provider is tracer_provider
        parts = Parts(
            self.tracer,
            self.instrument,
            self.gpu,
            self.stats,
            work,
            step_sampler=pipeline.step_sampler if own_spans and pipeline is not None else None,
            # the sampler publishes an event within a round of stamping it: two intervals
            held_horizon_ns=2 * settings.sample_interval_ms * 1_000_000 + 250_000_000,
        )
        self.steps = StepRecorder(parts)
        self.requests = RequestRecorder(
            parts, attribute_value_length_limit=settings.attribute_value_length_limit
        )
        #: ``otelgpu.step()`` / ``otelgpu.request()``'s finish: blocks of 2 ms or more on
        #: the deferred thread (``otelgpu.runtime.deferral``) where otelgpu's own
        #: pipeline, which drains it on every flush, carries the spans
        owned = own_spans and pipeline is not None and pipeline.owns_tracer_provider
        finish_later = self.deferred if owned else None
        self.step_finisher: Finisher[StepRecord] = Finisher(
            finish_later, self.steps.finish, self.steps.prepare_span
        )
        self.request_finisher: Finisher[RequestRecord] = Finisher(
            finish_later, self.requests.finish, self.requests.prepare_span
        )
        if sampler is not None:
            self.instrument(catalog.GPU_HEALTH_EVENTS, self.health.observe)
        self.instrument(catalog.INTERNAL_ERRORS, self._observe_errors)
        # Also what makes the private sketch provider (attached mode) export at all: a
        # collection with no metric is not exported, so the histograms need a companion.
        self.instrument(catalog.INTERNAL_SKETCH_SERIES, self._observe_series)
        self.instrument(catalog.INTERNAL_DROPPED, self._observe_dropped)
        self.instrument(catalog.INTERNAL_REJECTED, self._observe_rejected)

    # ------------------------------------------------------------------ contract
    def instrument(self, spec: MetricSpec, callback: Callback | None = None) -> Any:
        """The instrument of ``spec`` (created once per runtime; see ``otelgpu.metrics``).

        A sketch spec gives a ``SketchHistogram``, a counter a ``LocalCounter``, an
        observable kind an ``Observable`` that ``callback`` (if given) now feeds.
        """
        return self.instruments.instrument(spec, callback)

    def report_error(self, where: str, exc: BaseException | None = None) -> None:
        """Log the first error at ``where``; count all in ``otelgpu.internal.errors``."""
        self.stats.report_error(where, exc)

    @property
    def sampler(self) -> Any:
        """The started ``GpuSampler``, or ``None``."""
        return self.gpu.sampler

    @sampler.setter
    def sampler(self, sampler: Any) -> None:
        self.gpu.sampler = sampler

    # ------------------------------------------------------------------ GPU context
    def gpu_attributes(
        self, start_ns: int, end_ns: int, devices: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """GPU context of ``[start_ns, end_ns]`` as span attributes (see ``GpuContext``)."""
        return self.gpu.attributes(start_ns, end_ns, devices)

    def gpu_events(
        self, start_ns: int, end_ns: int, devices: Sequence[str] | None = None
    ) -> list[Any]:
        """GPU health events in ``[start_ns, end_ns]`` (of ``devices`` only)."""
        return self.gpu.events(start_ns, end_ns, devices)

    def annotate(
        self, span: Span, start_ns: int, end_ns: int, devices: Sequence[str] | None = None
    ) -> None:
        """Add the GPU context and health events of the window to a live span."""
        self.gpu.annotate(span, start_ns, end_ns, devices)

    # ------------------------------------------------------------------ steps, requests
    def next_step_number(self) -> int:
        return self.steps.next_number()

    def start_step_span(self, record: StepRecord) -> Span:
        """A live span for a step whose metrics :meth:`finish_step` records later."""
        return self.steps.start_span(record)

    def finish_step(self, span: Span, record: StepRecord) -> None:
        """Attributes, GPU context, metrics, then end ``span``. Never raises."""
        self.steps.finish(span, record)

    def record_step(self, record: StepRecord) -> Span:
        """Record a finished training step; returns its (ended) span. Never raises."""
        return self.steps.record(record)

    def record_steps(self, records: Iterable[StepRecord], *, spans: bool = True) -> None:
        """:meth:`record_step` of each record in order (``spans=False``: metrics only),
        the step metrics added once for the batch. Never raises."""
        self.steps.record_many(records, spans=spans)

    def step_lane(self) -> StepLane | None:
        """The bulk path for steps known as numbers, where it gives the same result
        (``StepRecorder.lane``); None elsewhere."""
        return self.steps.lane()

    def start_request_span(self, record: RequestRecord) -> Span:
        """A live SERVER span for a request whose metrics :meth:`finish_request` records."""
        return self.requests.start_span(record)

    def finish_request(self, span: Span, record: RequestRecord) -> None:
        """Attributes, GPU context, metrics, then end ``span``. Never raises."""
        self.requests.finish(span, record)

    def record_request(self, record: RequestRecord) -> Span:
        """Record a finished inference request; returns its (ended) span. Never raises."""
        return self.requests.record(record)

    @property
    def step_duration(self) -> SketchHistogram:
        return self.steps.duration  # type: ignore[no-any-return]

    @property
    def request_duration(self) -> SketchHistogram:
        return self.requests.duration  # type: ignore[no-any-return]

    @property
    def ttft(self) -> SketchHistogram:
        return self.requests.ttft  # type: ignore[no-any-return]

    @property
    def tpot(self) -> SketchHistogram:
        return self.requests.tpot  # type: ignore[no-any-return]

    @property
    def queue_duration(self) -> SketchHistogram:
        return self.requests.queue_duration  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ health
    def poll_health(self) -> list[Any]:
        """New GPU health events since the last poll: logged once each and counted."""
        return self.health.poll()

    def health_counts(self) -> dict[tuple[str, str], int]:
        """(kind, uuid) -> health events seen so far."""
        return self.health.counts()

    # ------------------------------------------------------------------ observables
    def _observe_errors(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"otelgpu.where": w}) for w, n in self.stats.errors().items()]

    def _observe_series(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(len(h.series()), {"otelgpu.metric": h.name})
            for h in self.sketches.histograms()
            if h.series()
        ]

    def _observe_dropped(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(n, {"otelgpu.signal": s, "otelgpu.reason": r})
            for (s, r), n in self.stats.dropped().items()
        ]

    def _observe_rejected(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(n, {"otelgpu.field": f, "otelgpu.reason": r})
            for (f, r), n in self.stats.rejected().items()
        ]

    # ------------------------------------------------------------------ lifecycle
    @property
    def closed(self) -> bool:
        return self._closed

    def force_flush(self, timeout_millis: int = 10_000) -> None:
        """Export everything recorded so far: the spans, and a metric collection for the
        push exporters (a pull endpoint's metrics leave at its next scrape)."""
        self.deferred.drain()
        self.steps.settle()
        if self.pipeline is not None:
            self.pipeline.force_flush(timeout_millis)

    def close(self) -> None:
        """Final flush, then stop exporters and close the sampler (NVML released). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if current() is self:
            _set_current(None)
        self.deferred.close()
        try:
            self.poll_health()
        except Exception as exc:  # noqa: BLE001
            self.report_error("gpu health", exc)
        self.steps.settle()
        if self.pipeline is not None:
            self.pipeline.shutdown()
        self.sketches.disable()
        if self.sampler is not None:
            try:
                # close(), not stop(): NVML (init, event set) is released now, never by the
                # garbage collector during a later run, where it would cancel that run's init.
                self.sampler.close()
            except Exception as exc:  # noqa: BLE001
                _logger.warning("otelgpu: error closing the GPU sampler: %r", exc)

    def after_fork_in_child(self) -> None:
        """A forked child exports nothing of the parent's state and records nothing.

        Runs inside ``fork()`` (``os.register_at_fork``): it must not wait for a lock that
        another parent thread held at fork time (the metric export reading the sketches,
        a hot path counting an error) -- that thread does not exist in the child, so the
        fork would never return. Locks are replaced, never acquired, here.
        """
        self._lock = threading.Lock()
        self.health.after_fork_in_child()
        self.steps.after_fork_in_child()
        self._closed = True
        self.sampler = None
        self.sketches.after_fork_in_child()
        self.stats.after_fork_in_child()
        if current() is self:
            _set_current(None)
