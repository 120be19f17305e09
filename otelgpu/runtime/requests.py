"""Inference requests: the SERVER span (with GPU context) and the request metrics.

Metrics: ``gen_ai.server.request.duration``, ``gen_ai.server.time_to_first_token``,
``gen_ai.server.time_per_output_token``, ``otelgpu.inference.queue.duration`` (sketches),
``otelgpu.inference.requests`` and ``otelgpu.inference.tokens`` (counters). Thread-safe;
:meth:`RequestRecorder.finish` and :meth:`RequestRecorder.record` never raise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from otelgpu import _values
from otelgpu.metrics import catalog
from otelgpu.otel.counters import LocalCounter
from otelgpu.otel.sketches import SketchHistogram, freeze
from otelgpu.runtime.recorder import Parts, Recorder, seen_by_processors
from otelgpu.runtime.records import OUTCOMES, RequestRecord

#: Most request label sets :meth:`RequestRecorder._labels` keeps.
_LABEL_CACHE_SIZE = 256


def cap_values(attributes: Mapping[str, Any] | None, limit: int) -> Mapping[str, Any] | None:
    """``attributes`` with string values cut to ``limit`` characters (the SDK's rule for spans)."""
    if not attributes or all(len(v) <= limit for v in attributes.values() if isinstance(v, str)):
        return attributes
    return {k: v[:limit] if isinstance(v, str) else v for k, v in attributes.items()}


class _RequestLabels:
    """The metric attribute sets of one kind of request, with their series keys.

    See :meth:`RequestRecorder._labels`. A key is ``None`` when its attribute set cannot be
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


class RequestRecorder(Recorder[RequestRecord]):
    """Turns :class:`RequestRecord` rows into spans and metrics.

    Args:
        parts: the runtime's pieces.
        attribute_value_length_limit: string values of metric attributes and the model
            name in the span name are cut to this many characters.
    """

    where = "record_request"

    def __init__(self, parts: Parts, *, attribute_value_length_limit: int) -> None:
        super().__init__(parts)
        instrument = parts.instrument
        self._limit = attribute_value_length_limit
        #: Called with (span, duration s, TTFT s or None) for each successful request,
        #: before its span ends (``otelgpu.diagnosis.serving``: latency drift).
        self.observers: list[Callable[[Span, float, float | None], None]] = []
        self._label_cache: dict[tuple[Any, ...], _RequestLabels] = {}
        self.duration = instrument(catalog.REQUEST_DURATION)
        self.ttft = instrument(catalog.TIME_TO_FIRST_TOKEN)
        self.tpot = instrument(catalog.TIME_PER_OUTPUT_TOKEN)
        self.queue_duration = instrument(catalog.QUEUE_DURATION)
        self._requests = instrument(catalog.REQUESTS)
        self._tokens = instrument(catalog.OUTPUT_TOKENS)

    def start_span(self, record: RequestRecord) -> Span:
        """A live SERVER span ``{operation} {model}`` for ``record``."""
        model, operation = record.model, record.operation
        if model and len(model) > self._limit:  # span names have no SDK limit: cap it here
            model = model[: self._limit]
        name = f"{operation} {model}" if model else operation
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": record.provider,
        }
        if model:
            attrs["gen_ai.request.model"] = model
        if record.server_address:
            attrs["server.address"] = record.server_address
        if record.server_port is not None:
            attrs["server.port"] = record.server_port
        if record.span_attributes:
            attrs.update(record.span_attributes)
        return self._starter.start(
            name,
            context=record.context,
            kind=SpanKind.SERVER,
            start_time=record.start_ns,
            attributes=attrs,
        )

    def finish(self, span: Span, record: RequestRecord) -> None:
        """Attributes, GPU context, metrics, then end ``span`` at ``record.end_ns``.

        Never raises. Out-of-range token counts and queue times are dropped and counted
        (``otelgpu._values``), never exported.
        """
        start_ns, end_ns = record.start_ns, record.end_ns
        try:
            stats = self._stats
            output_tokens = int(_values.count(record.output_tokens, "output_tokens", stats) or 0)
            input_tokens = record.input_tokens
            if input_tokens is not None:
                got = _values.count(input_tokens, "input_tokens", stats)
                input_tokens = None if got is None else int(got)
            queue_time_s = _values.duration(record.queue_time_s, "queue_time_s", stats)
            outcome = record.outcome if record.outcome in OUTCOMES else "error"
            error_type = record.error_type
            attributes = record.attributes
            devices = record.devices
            first_token_ns = record.first_token_ns
            duration_s = max(end_ns - start_ns, 0) / 1e9
            ttft_s = None
            tpot_s = None
            if first_token_ns is not None:
                ttft_s = max(first_token_ns - start_ns, 0) / 1e9
                if output_tokens > 1:
                    tpot_s = max(end_ns - first_token_ns, 0) / 1e9 / (output_tokens - 1)
            labels = self._labels(record, outcome, error_type, attributes)
            # Energy per request and output token (otelgpu.gpu_truth.work): every request.
            gpu = self._gpu
            if not seen_by_processors(span):
                # Unsampled, or no span exporter (e.g. Prometheus only): no attribute is
                # built, the GPU windows give the request's energy only.
                if gpu.sampler is not None:
                    joules = gpu.energy(start_ns, end_ns, devices)
                    if joules is not None:
                        energy = {"otelgpu.gpu.energy": joules}
                        self._work.request(energy, output_tokens, labels.base)
            else:
                sampled = gpu.sampler is not None
                context, events = gpu.context(start_ns, end_ns, devices) if sampled else ({}, [])
                work = self._work.request(context, output_tokens, labels.base)
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
                if record.response_id is not None:
                    span_attrs["gen_ai.response.id"] = record.response_id
                if record.response_model is not None:
                    span_attrs["gen_ai.response.model"] = record.response_model
                window = (start_ns, end_ns, devices)
                self._annotate(span, span_attrs, attributes, context, work, window, events)
                if record.exception is not None:
                    span.record_exception(record.exception)
                if outcome != "ok":
                    span.set_status(Status(StatusCode.ERROR, error_type or outcome))
            _record(self.duration, duration_s, labels.duration, labels.duration_key)
            if labels.ok:
                if ttft_s is not None:
                    _record(self.ttft, ttft_s, labels.base, labels.base_key)
                if tpot_s is not None:
                    _record(self.tpot, tpot_s, labels.base, labels.base_key)
            if queue_time_s is not None:
                _record(self.queue_duration, queue_time_s, labels.base, labels.base_key)
            _add(self._requests, 1, labels.requests, labels.requests_key)
            if output_tokens:
                _add(self._tokens, output_tokens, labels.output_tokens, labels.output_key)
            if input_tokens:
                _add(self._tokens, input_tokens, labels.input_tokens, labels.input_key)
            if labels.ok and self.observers:
                for observer in self.observers:
                    observer(span, duration_s, ttft_s)
        except Exception as exc:  # noqa: BLE001 - hot path
            self._stats.report_error("request", exc)
        finally:
            span.end(end_time=end_ns)

    def _labels(
        self,
        record: RequestRecord,
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
        limit = self._limit
        model, operation, provider = record.model, record.operation, record.provider
        if model and len(model) > limit:  # one huge value must not make a batch unsendable
            model = model[:limit]
        server = (record.server_address, record.server_port)
        if any(v is not None for v in server):
            attributes = {
                **({"server.address": server[0]} if server[0] else {}),
                **({"server.port": server[1]} if server[1] is not None else {}),
                **(attributes or {}),
            }
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
