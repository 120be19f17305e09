"""The runtime behind ``otelgpu.instrument()``; instrumentors, ``step()``, ``request()`` call it.

Contract (ARCHITECTURE.md, "Runtime"): :func:`current` returns the active
:class:`Runtime` or ``None`` (not instrumented, disabled, or a forked child). A runtime
has ``tracer``, ``meter``, ``sampler`` (a started ``GpuSampler`` or ``None`` when no GPU
or NVML is available), ``settings``, and:

* :meth:`Runtime.instrument` -- the instrument of a catalog ``MetricSpec`` (sketch-backed
  histograms are exported as OTLP exponential histograms plus ``<name>.quantile`` gauges);
* :meth:`Runtime.gpu_attributes` / :meth:`Runtime.gpu_events` -- GPU context of a window;
* :meth:`Runtime.record_step` / :meth:`Runtime.record_request` -- a finished step or
  request: span (with GPU context and health events) and metrics, in one call;
* :meth:`Runtime.report_error` -- log once per place, count in ``otelgpu.internal.errors``.

Times are ``time.time_ns()`` nanoseconds; durations in metrics are seconds. Everything
here is thread-safe; the ``record_*`` methods never raise (errors are reported and a
non-recording span is returned).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from otelgpu import _values
from otelgpu._settings import Settings
from otelgpu.metrics import catalog
from otelgpu.metrics.instruments import Callback, Instruments
from otelgpu.metrics.spec import MetricSpec
from otelgpu.otel import gpu_context
from otelgpu.otel.counters import LocalCounter
from otelgpu.otel.sketches import SketchHistogram, SketchRegistry, freeze
from otelgpu.otel.stats import InternalStats
from otelgpu.version import __version__

if TYPE_CHECKING:
    from otelgpu.otel.providers import Pipeline

_logger = logging.getLogger("otelgpu")
_health_logger = logging.getLogger("otelgpu.health")

_current: Runtime | None = None

#: Outcomes of an inference request (attribute ``otelgpu.request.outcome``).
OUTCOMES = ("ok", "error", "timeout")

_INVALID_SPAN = trace.INVALID_SPAN


def current() -> Runtime | None:
    """The active runtime, or ``None`` when otelgpu is not instrumented (or disabled)."""
    return _current


def _set_current(runtime: Runtime | None) -> None:
    global _current
    _current = runtime


def _extra_attributes(prefix: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """Unknown keyword fields: dotted keys verbatim, others under ``prefix``."""
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if value is None:
            continue
        if isinstance(value, bool | int | float | str) or (
            isinstance(value, list | tuple)
            and all(isinstance(v, bool | int | float | str) for v in value)
        ):
            out[key if "." in key else f"{prefix}.{key}"] = (
                list(value) if isinstance(value, tuple) else value
            )
    return out


def cap_values(attributes: Mapping[str, Any] | None, limit: int) -> Mapping[str, Any] | None:
    """``attributes`` with string values cut to ``limit`` characters (the SDK's rule for spans)."""
    if not attributes or all(len(v) <= limit for v in attributes.values() if isinstance(v, str)):
        return attributes
    return {k: v[:limit] if isinstance(v, str) else v for k, v in attributes.items()}


#: Most request label sets :meth:`Runtime._request_labels` keeps.
_LABEL_CACHE_SIZE = 256


class _RequestLabels:
    """The metric attribute sets of one kind of request, with their series keys.

    See ``Runtime.finish_request``. A key is ``None`` when its attribute set cannot be
    frozen (an unhashable attribute value): the metric then reports the error itself.
    """

    __slots__ = (
        "base",
        "base_key",
        "duration",
        "duration_key",
        "input_key",
        "input_tokens",
        "ok",
        "output_key",
        "output_tokens",
        "requests",
        "requests_key",
    )

    def __init__(
        self,
        model: str | None,
        operation: str,
        provider: str,
        outcome: str,
        error_type: str | None,
        attributes: Mapping[str, Any] | None,
    ) -> None:
        base: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": provider,
        }
        if model:
            base["gen_ai.request.model"] = model
        if attributes:
            # Cached: own copies of list values (a caller may reuse and mutate its lists).
            base.update((k, list(v) if isinstance(v, list) else v) for k, v in attributes.items())
        self.base = base
        self.ok = outcome == "ok"
        self.duration = base if self.ok else {**base, "error.type": error_type or outcome}
        self.requests = {**base, "otelgpu.request.outcome": outcome}
        self.output_tokens = {**base, "gen_ai.token.type": "output"}
        self.input_tokens = {**base, "gen_ai.token.type": "input"}
        self.base_key = _key(self.base)
        self.duration_key = _key(self.duration)
        self.requests_key = _key(self.requests)
        self.output_key = _key(self.output_tokens)
        self.input_key = _key(self.input_tokens)


def _key(attributes: Mapping[str, Any]) -> Any:
    try:
        return freeze(attributes)
    except Exception:  # noqa: BLE001 - recorded without a key: the metric reports it
        return None


def _record(hist: SketchHistogram, value: float, attributes: Mapping[str, Any], key: Any) -> None:
    if key is None:
        hist.record(value, attributes)
    else:
        hist.record_frozen(value, key, attributes)


def _add(counter: LocalCounter, amount: int, attributes: Mapping[str, Any], key: Any) -> None:
    if key is None:
        counter.add(amount, attributes)
    else:
        counter.add_frozen(amount, key, attributes)


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
        self.sampler = sampler
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
        self._step_numbers = itertools.count(1)
        self._closed = False
        self._lock = threading.Lock()
        self._health_seen: dict[tuple[Any, ...], None] = {}
        self._health_counts: dict[tuple[str, str], int] = {}
        self._health_cursor_ns = time.time_ns()
        self._label_cache: dict[tuple[Any, ...], _RequestLabels] = {}

        im = (internal_meter_provider or meter_provider).get_meter("otelgpu", __version__)
        self.instruments = Instruments(
            self.meter,
            internal_meter=im,
            sketches=self.sketches,
            max_series=settings.max_series,
            stats=self.stats,
        )
        instrument = self.instrument
        self.step_duration = instrument(catalog.TRAIN_STEP_DURATION)
        self.request_duration = instrument(catalog.REQUEST_DURATION)
        self.ttft = instrument(catalog.TIME_TO_FIRST_TOKEN)
        self.tpot = instrument(catalog.TIME_PER_OUTPUT_TOKEN)
        self.queue_duration = instrument(catalog.QUEUE_DURATION)
        self._steps = instrument(catalog.TRAIN_STEPS)
        self._samples = instrument(catalog.TRAIN_SAMPLES)
        self._tokens = instrument(catalog.TRAIN_TOKENS)
        self._requests = instrument(catalog.REQUESTS)
        self._out_tokens = instrument(catalog.OUTPUT_TOKENS)
        if sampler is not None:
            instrument(catalog.GPU_HEALTH_EVENTS, self._observe_health)
        instrument(catalog.INTERNAL_ERRORS, self._observe_errors)
        # Also what makes the private sketch provider (attached mode) export at all: a
        # collection with no metric is not exported, so the histograms need a companion.
        instrument(catalog.INTERNAL_SKETCH_SERIES, self._observe_series)
        instrument(catalog.INTERNAL_DROPPED, self._observe_dropped)
        instrument(catalog.INTERNAL_REJECTED, self._observe_rejected)

    def instrument(self, spec: MetricSpec, callback: Callback | None = None) -> Any:
        """The instrument of ``spec`` (created once per runtime; see ``otelgpu.metrics``).

        A sketch spec gives a ``SketchHistogram``, a counter a ``LocalCounter``, an
        observable kind an ``Observable`` that ``callback`` (if given) now feeds.
        """
        return self.instruments.instrument(spec, callback)

    # ------------------------------------------------------------------ contract
    def report_error(self, where: str, exc: BaseException | None = None) -> None:
        """Log the first error at ``where``; count all in ``otelgpu.internal.errors``."""
        self.stats.report_error(where, exc)

    def gpu_attributes(
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
            windows = sampler.windows(start_ns, end_ns)
            if devices is not None:
                windows = {u: windows[u] for u in devices if u in windows}
            return gpu_context.window_attributes(windows)
        except Exception as exc:  # noqa: BLE001 - GPU context is best effort
            self.report_error("gpu window", exc)
            return {}

    def gpu_events(
        self, start_ns: int, end_ns: int, devices: Sequence[str] | None = None
    ) -> list[Any]:
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
            self.report_error("gpu events", exc)
            return []
        if devices is not None:
            wanted = set(devices)
            events = [e for e in events if getattr(e, "uuid", None) in wanted]
        return events

    def annotate(
        self, span: Span, start_ns: int, end_ns: int, devices: Sequence[str] | None = None
    ) -> None:
        """Add the GPU context and health events of the window to a live span."""
        if self.sampler is None or not span.is_recording():
            return
        attrs = self.gpu_attributes(start_ns, end_ns, devices)
        if attrs:
            span.set_attributes(attrs)
        self.add_gpu_events(span, start_ns, end_ns, devices)

    def add_gpu_events(
        self, span: Span, start_ns: int, end_ns: int, devices: Sequence[str] | None = None
    ) -> None:
        """GPU health events of the window as span events (timestamped when they happened)."""
        if self.sampler is None:
            return
        for event in self.gpu_events(start_ns, end_ns, devices):
            span.add_event(
                "otelgpu.gpu." + gpu_context.event_kind(event),
                gpu_context.event_attributes(event),
                timestamp=gpu_context.event_time_ns(event),
            )

    def next_step_number(self) -> int:
        return next(self._step_numbers)

    # ------------------------------------------------------------------ steps
    def step_attributes(
        self, duration_s: float, step: int | None, samples: float | None, tokens: float | None
    ) -> dict[str, Any]:
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

    def finish_step(
        self,
        span: Span,
        start_ns: int,
        end_ns: int,
        *,
        step: int,
        samples: float | None = None,
        tokens: float | None = None,
        attributes: Mapping[str, Any] | None = None,
        failed: BaseException | None = None,
        devices: Sequence[str] | None = None,
    ) -> None:
        """Attributes, GPU context, metrics, then end ``span`` at ``end_ns``. Never raises.

        Out-of-range ``step``, ``samples`` or ``tokens`` are dropped and counted
        (``otelgpu._values``), never exported.
        """
        try:
            stats = self.stats
            if samples is not None:
                samples = _values.count(samples, "samples", stats)
            if tokens is not None:
                tokens = _values.count(tokens, "tokens", stats)
            if _values.count(step, "step", stats) is None:
                step = 0
            duration_s = max(end_ns - start_ns, 0) / 1e9
            if span.is_recording():  # an unsampled span gets no attribute dict built
                attrs = self.step_attributes(duration_s, step, samples, tokens)
                if attributes:
                    attrs.update(attributes)
                sampler = self.sampler
                if sampler is not None:
                    attrs.update(self.gpu_attributes(start_ns, end_ns, devices))
                span.set_attributes(attrs)
                if sampler is not None:
                    self.add_gpu_events(span, start_ns, end_ns, devices)
                if failed is not None:
                    span.record_exception(failed)
                    span.set_status(Status(StatusCode.ERROR, type(failed).__qualname__))
            # The metric calls copy an attribute set only when it is new to them.
            metric_attrs = attributes or None
            self.step_duration.record(duration_s, metric_attrs)
            self._steps.add(1, metric_attrs)
            if samples:
                self._samples.add(samples, metric_attrs)
            if tokens:
                self._tokens.add(tokens, metric_attrs)
        except Exception as exc:  # noqa: BLE001 - hot path
            self.report_error("step", exc)
        finally:
            span.end(end_time=end_ns)

    def record_step(self, start_ns: int, end_ns: int, **fields: Any) -> Span:
        """Record a finished training step ``[start_ns, end_ns]`` and return its (ended) span.

        Fields: ``step`` (number; default: the next one), ``samples``, ``tokens``,
        ``attributes`` (added to the span and the metrics), ``name`` (span name),
        ``context`` (parent ``Context``), ``devices`` (GPU UUIDs the GPU context is
        restricted to; default all sampled GPUs); other fields become span attributes
        (``otelgpu.train.<key>``, or the key itself when it contains a dot).
        """
        try:
            step = fields.pop("step", None)
            samples = fields.pop("samples", None)
            tokens = fields.pop("tokens", None)
            attributes = fields.pop("attributes", None)
            name = fields.pop("name", None) or catalog.STEP_SPAN
            context = fields.pop("context", None)
            devices = fields.pop("devices", None)
            extra = _extra_attributes("otelgpu.train", fields)
            span = self.tracer.start_span(name, context=context, start_time=start_ns)
            if extra and span.is_recording():
                span.set_attributes(extra)
            self.finish_step(
                span,
                start_ns,
                end_ns,
                step=step if step is not None else self.next_step_number(),
                samples=samples,
                tokens=tokens,
                attributes=attributes,
                devices=devices,
            )
            return span
        except Exception as exc:  # noqa: BLE001 - hot path
            self.report_error("record_step", exc)
            return _INVALID_SPAN

    # ------------------------------------------------------------------ requests
    def start_request_span(
        self, model: str | None, operation: str, provider: str, start_ns: int, context: Any = None
    ) -> Span:
        limit = self.settings.attribute_value_length_limit
        if model and len(model) > limit:  # span names have no SDK limit: cap it here
            model = model[:limit]
        name = f"{operation} {model}" if model else operation
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": provider,
        }
        if model:
            attrs["gen_ai.request.model"] = model
        return self.tracer.start_span(
            name, context=context, kind=SpanKind.SERVER, start_time=start_ns, attributes=attrs
        )

    def finish_request(
        self,
        span: Span,
        start_ns: int,
        end_ns: int,
        *,
        model: str | None = None,
        operation: str = "chat",
        provider: str = "otelgpu",
        first_token_ns: int | None = None,
        output_tokens: int = 0,
        input_tokens: int | None = None,
        queue_time_s: float | None = None,
        outcome: str = "ok",
        error_type: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        exception: BaseException | None = None,
        devices: Sequence[str] | None = None,
    ) -> None:
        """Attributes, GPU context, metrics, then end ``span`` at ``end_ns``. Never raises.

        Out-of-range token counts and queue times are dropped and counted
        (``otelgpu._values``), never exported.
        """
        try:
            stats = self.stats
            output_tokens = int(_values.count(output_tokens, "output_tokens", stats) or 0)
            if input_tokens is not None:
                got = _values.count(input_tokens, "input_tokens", stats)
                input_tokens = None if got is None else int(got)
            if queue_time_s is not None:
                queue_time_s = _values.duration(queue_time_s, "queue_time_s", stats)
            duration_s = max(end_ns - start_ns, 0) / 1e9
            ttft_s = None
            tpot_s = None
            if first_token_ns is not None:
                ttft_s = max(first_token_ns - start_ns, 0) / 1e9
                if output_tokens > 1:
                    tpot_s = max(end_ns - first_token_ns, 0) / 1e9 / (output_tokens - 1)
            if span.is_recording():  # an unsampled span gets no attribute dict built
                span_attrs: dict[str, Any] = {"otelgpu.request.outcome": outcome}
                if ttft_s is not None:
                    span_attrs["otelgpu.request.time_to_first_token"] = ttft_s
                if tpot_s is not None:
                    span_attrs["otelgpu.request.time_per_output_token"] = tpot_s
                if output_tokens:
                    span_attrs["gen_ai.usage.output_tokens"] = output_tokens
                if input_tokens is not None:
                    span_attrs["gen_ai.usage.input_tokens"] = input_tokens
                if queue_time_s is not None:
                    span_attrs["otelgpu.request.queue_time"] = queue_time_s
                if error_type is not None:
                    span_attrs["error.type"] = error_type
                if attributes:
                    span_attrs.update(attributes)
                sampler = self.sampler
                if sampler is not None:
                    span_attrs.update(self.gpu_attributes(start_ns, end_ns, devices))
                span.set_attributes(span_attrs)
                if sampler is not None:
                    self.add_gpu_events(span, start_ns, end_ns, devices)
                if exception is not None:
                    span.record_exception(exception)
                if outcome != "ok":
                    span.set_status(Status(StatusCode.ERROR, error_type or outcome))
            labels = self._request_labels(
                model, operation, provider, outcome, error_type, attributes
            )
            _record(self.request_duration, duration_s, labels.duration, labels.duration_key)
            if labels.ok:
                if ttft_s is not None:
                    _record(self.ttft, ttft_s, labels.base, labels.base_key)
                if tpot_s is not None:
                    _record(self.tpot, tpot_s, labels.base, labels.base_key)
            if queue_time_s is not None:
                _record(self.queue_duration, queue_time_s, labels.base, labels.base_key)
            _add(self._requests, 1, labels.requests, labels.requests_key)
            if output_tokens:
                _add(self._out_tokens, output_tokens, labels.output_tokens, labels.output_key)
            if input_tokens:
                _add(self._out_tokens, input_tokens, labels.input_tokens, labels.input_key)
        except Exception as exc:  # noqa: BLE001 - hot path
            self.report_error("request", exc)
        finally:
            span.end(end_time=end_ns)

    def _request_labels(
        self,
        model: str | None,
        operation: str,
        provider: str,
        outcome: str,
        error_type: str | None,
        attributes: Mapping[str, Any] | None,
    ) -> _RequestLabels:
        """The metric attribute sets of a request, cached by their values.

        A service sees a handful of (model, operation, provider, outcome, attributes)
        combinations, so the dicts and their series keys are built once each: a request
        then costs one freeze of its extra attributes (none without), not one per metric.
        The cache is bounded: it is emptied when it holds ``_LABEL_CACHE_SIZE`` entries.
        The dicts are shared and never mutated (the sketches and counters copy an
        attribute set when they first see it).
        """
        limit = self.settings.attribute_value_length_limit
        if model and len(model) > limit:  # one huge value must not make a batch unsendable
            model = model[:limit]
        try:
            key = (model, operation, provider, outcome, error_type, freeze(attributes))
            labels = self._label_cache.get(key)
        except Exception:  # noqa: BLE001 - unhashable values: built for this request only
            attributes = cap_values(attributes, limit)
            return _RequestLabels(model, operation, provider, outcome, error_type, attributes)
        if labels is None:
            attributes = cap_values(attributes, limit)
            labels = _RequestLabels(model, operation, provider, outcome, error_type, attributes)
            cache = self._label_cache
            if len(cache) >= _LABEL_CACHE_SIZE:
                cache.clear()
            cache[key] = labels
        return labels

    def record_request(self, start_ns: int, end_ns: int, **fields: Any) -> Span:
        """Record a finished inference request ``[start_ns, end_ns]``; returns its (ended) span.

        Fields: ``model``, ``operation`` (``gen_ai.operation.name``, default ``chat``),
        ``provider`` (``gen_ai.provider.name``, default ``otelgpu``), ``first_token_ns``
        or ``ttft_s``, ``output_tokens``, ``input_tokens``, ``queue_time_s``,
        ``outcome`` (``ok``/``error``/``timeout``), ``error_type``, ``attributes``,
        ``context`` (parent), ``devices`` (GPU UUIDs of the GPU context; default all);
        other fields become span attributes
        (``otelgpu.request.<key>`` or the dotted key itself).
        """
        try:
            model = fields.pop("model", None)
            operation = fields.pop("operation", None) or "chat"
            provider = fields.pop("provider", None) or "otelgpu"
            context = fields.pop("context", None)
            first_token_ns = fields.pop("first_token_ns", None)
            ttft_s = _values.duration(fields.pop("ttft_s", None), "ttft_s", self.stats)
            if first_token_ns is None and ttft_s is not None:
                first_token_ns = start_ns + int(ttft_s * 1e9)
            outcome = fields.pop("outcome", None) or "ok"
            if outcome not in OUTCOMES:
                outcome = "error"
            kwargs: dict[str, Any] = {
                "output_tokens": fields.pop("output_tokens", 0) or 0,
                "input_tokens": fields.pop("input_tokens", None),
                "queue_time_s": fields.pop("queue_time_s", None),
                "error_type": fields.pop("error_type", None),
                "attributes": fields.pop("attributes", None),
                "devices": fields.pop("devices", None),
            }
            extra = _extra_attributes("otelgpu.request", fields)
            span = self.start_request_span(model, operation, provider, start_ns, context)
            if extra and span.is_recording():
                span.set_attributes(extra)
            self.finish_request(
                span,
                start_ns,
                end_ns,
                model=model,
                operation=operation,
                provider=provider,
                first_token_ns=first_token_ns,
                outcome=outcome,
                **kwargs,
            )
            return span
        except Exception as exc:  # noqa: BLE001 - hot path
            self.report_error("record_request", exc)
            return _INVALID_SPAN

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

    def poll_health(self) -> list[Any]:
        """New GPU health events since the last poll: logged once each and counted."""
        sampler = self.sampler
        if sampler is None:
            return []
        now = time.time_ns()
        # Overlap one minute: events may be reported after their timestamp.
        events = self.gpu_events(self._health_cursor_ns - 60_000_000_000, now)
        fresh = []
        with self._lock:
            for event in events:
                key = (
                    gpu_context.event_kind(event),
                    getattr(event, "uuid", None),
                    gpu_context.event_time_ns(event),
                    getattr(event, "code", None),
                )
                if key in self._health_seen:
                    continue
                self._health_seen[key] = None
                if len(self._health_seen) > 10_000:  # bounded memory
                    self._health_seen.pop(next(iter(self._health_seen)))
                kind_key = (key[0], str(key[1] or ""))
                self._health_counts[kind_key] = self._health_counts.get(kind_key, 0) + 1
                fresh.append(event)
            self._health_cursor_ns = now
        for event in fresh:
            attrs = gpu_context.event_attributes(event)
            _health_logger.warning(
                "otelgpu: GPU health event %s on %s: %s",
                attrs["otelgpu.gpu.event"],
                attrs.get("hw.id", "?"),
                attrs.get("otelgpu.gpu.event.detail", attrs.get("otelgpu.gpu.event.code", "")),
                extra={"otelgpu_event": attrs},
            )
        return fresh

    def health_counts(self) -> dict[tuple[str, str], int]:
        """(kind, uuid) -> health events seen so far."""
        self.poll_health()
        with self._lock:
            return dict(self._health_counts)

    def _observe_health(self, _options: CallbackOptions) -> Iterable[Observation]:
        try:
            counts = self.health_counts()
        except Exception as exc:  # noqa: BLE001
            self.report_error("gpu health", exc)
            return []
        return [
            Observation(
                n,
                {"otelgpu.gpu.event": kind, "hw.id": uuid} if uuid else {"otelgpu.gpu.event": kind},
            )
            for (kind, uuid), n in counts.items()
        ]

    # ------------------------------------------------------------------ lifecycle
    @property
    def closed(self) -> bool:
        return self._closed

    def force_flush(self, timeout_millis: int = 10_000) -> None:
        """Export everything recorded so far (spans and a metric collection)."""
        if self.pipeline is not None:
            self.pipeline.force_flush(timeout_millis)

    def close(self) -> None:
        """Final flush, then stop exporters and the sampler. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if current() is self:
            _set_current(None)
        try:
            self.poll_health()
        except Exception as exc:  # noqa: BLE001
            self.report_error("gpu health", exc)
        if self.pipeline is not None:
            self.pipeline.shutdown()
        self.sketches.disable()
        if self.sampler is not None:
            try:
                self.sampler.stop()
            except Exception as exc:  # noqa: BLE001
                _logger.warning("otelgpu: error stopping the GPU sampler: %r", exc)

    def after_fork_in_child(self) -> None:
        """A forked child exports nothing of the parent's state and records nothing.

        Runs inside ``fork()`` (``os.register_at_fork``): it must not wait for a lock that
        another parent thread held at fork time (the metric export reading the sketches,
        a hot path counting an error) -- that thread does not exist in the child, so the
        fork would never return. Locks are replaced, never acquired, here.
        """
        self._lock = threading.Lock()
        self._closed = True
        self.sampler = None
        self.sketches.after_fork_in_child()
        self.stats.after_fork_in_child()
        if current() is self:
            _set_current(None)
