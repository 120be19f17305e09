"""Turns vLLM's per-step stats into otelgpu metrics and per-request spans (no vLLM import).

One :class:`EngineRecorder` per vLLM engine (DP rank). ``record()`` is called by the stat
logger once per engine-core output batch, **inline on vLLM's serving event loop**, so it
does as little as possible:

* counters and gauges are plain Python numbers on the recorder, published to OpenTelemetry
  by observable-instrument callbacks at export time (no SDK call per step);
* latencies go into the runtime's sketch histograms (one dict lookup + ``sketch.add``);
* one span per *finished* request through ``Runtime.record_request`` (span with the GPU
  context of the request's lifetime, plus the shared request metrics).

Clocks. ``IterationStats.iteration_timestamp`` is the front end's wall clock
(``time.time()``); ``FinishedRequestStats.e2e_latency`` runs from the request's arrival on
that clock, so the span is ``[iteration_timestamp - e2e_latency, iteration_timestamp]``
exactly. The queue / prefill / decode / inference times are differences of engine-core
*monotonic* timestamps, a different clock; only ``decode_time`` is placed on the front-end
clock, anchored at the end: ``first_token = end - decode_time`` (the front end receives the
last token one IPC hop after the engine produced it, typically well under a millisecond).
Hence ``TTFT = e2e - decode_time`` and the semconv TPOT ``(e2e - TTFT) / (n - 1)`` equals
vLLM's ``mean_time_per_output_token``. A phase that is negative or longer than the request is
treated as absent: vLLM reports ``0 - ts`` differences for phases a request never reached.

Never raises into vLLM: every entry point catches, counts through
``Runtime.report_error`` and returns.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import SpanKind

from otelgpu.instrumentation.vllm import _names as n
from otelgpu.instrumentation.vllm._context import TraceContextRegistry
from otelgpu.instrumentation.vllm._devices import EnginePlacement
from otelgpu.instrumentation.vllm._fields import FieldReader
from otelgpu.metrics import catalog as C
from otelgpu.metrics.spec import MetricSpec
from otelgpu.runtime.api import RuntimeAPI
from otelgpu.runtime.records import RequestRecord

_logger = logging.getLogger("otelgpu.instrumentation.vllm")

# Fields we read, per vLLM class (for the one DEBUG line listing the ones we ignore).
KNOWN_FIELDS: dict[str, frozenset[str]] = {
    "SchedulerStats": frozenset(
        {
            "num_running_reqs",
            "num_waiting_reqs",
            "num_skipped_waiting_reqs",
            "kv_cache_usage",
            "prefix_cache_stats",
        }
    ),
    "IterationStats": frozenset(
        {
            "iteration_timestamp",
            "num_generation_tokens",
            "prompt_token_stats",
            "num_preempted_reqs",
            "finished_requests",
            "time_to_first_tokens_iter",
            "inter_token_latencies_iter",
        }
    ),
    "FinishedRequestStats": frozenset(
        {
            "finish_reason",
            "request_id",
            "e2e_latency",
            "num_prompt_tokens",
            "num_preemptions",
            "num_generation_tokens",
            "max_tokens_param",
            "queued_time",
            "prefill_time",
            "inference_time",
            "decode_time",
            "mean_time_per_output_token",
            "num_cached_tokens",
        }
    ),
}

# An engine-core phase may exceed the front end's e2e by clock skew and IPC delay only.
_PHASE_SLACK_S = 0.010
_NS = 1_000_000_000


OPERATION = "text_completion"
"""``gen_ai.operation.name`` of engine requests: the engine sees a rendered prompt, whether
the HTTP route was ``/v1/chat/completions`` or ``/v1/completions``."""

_FAILED_REASONS = frozenset({"error", "abort"})


@dataclass(frozen=True)
class RecorderOptions:
    """Per-process options (from ``OTELGPU_VLLM_*``; see environment_variables.py).

    Attributes:
        timeout_s: a finished request whose e2e time reaches this has outcome ``timeout``
            (``None``: never).
    """

    timeout_s: float | None = None


class EngineRecorder:
    """Records one vLLM engine's stats into a runtime. See the module docstring.

    Args:
        runtime: the runtime (``otelgpu.runtime.api.RuntimeAPI``).
        placement: the engine's index and GPUs (``_devices.engine_placement``).
        model_name: ``gen_ai.request.model`` (vLLM's served model name).
        registry: where the ``add_request`` wrappers left each request's parent context.
        options: see :class:`RecorderOptions`.
        process_start_ns: wall-clock start of this process (for the cold-start time).
    """

    def __init__(
        self,
        runtime: RuntimeAPI,
        placement: EnginePlacement,
        model_name: str | None,
        *,
        registry: TraceContextRegistry | None = None,
        options: RecorderOptions | None = None,
        process_start_ns: int | None = None,
    ) -> None:
        self.runtime = runtime
        self.placement = placement
        self.model_name = model_name
        self.options = options or RecorderOptions()
        self.fields = FieldReader(KNOWN_FIELDS)
        self._registry = registry
        self._process_start_ns = process_start_ns

        # Same attribute set as the runtime's request metrics, so series line up.
        self.engine_attributes: Mapping[str, Any] = {n.ATTR_ENGINE: placement.engine_index}
        base: dict[str, Any] = {
            "gen_ai.operation.name": OPERATION,
            n.ATTR_PROVIDER: n.PROVIDER,
            **self.engine_attributes,
        }
        if model_name:
            base[n.ATTR_MODEL] = model_name
        self.base_attributes: Mapping[str, Any] = base

        self._h_itl = runtime.instrument(C.INTER_TOKEN_LATENCY)
        self._h_prefill = runtime.instrument(C.PREFILL_TIME)
        self._h_decode = runtime.instrument(C.DECODE_TIME)
        self._h_inference = runtime.instrument(C.INFERENCE_TIME)

        # Published by the observable instruments (see _OBSERVERS); written only here.
        self.running: int | None = None
        self.waiting: int | None = None
        self.kv_cache_usage: float | None = None
        self.kv_cache_peak: float | None = None
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.tokens_in = 0
        self.tokens_out = 0
        self.preemptions = 0
        self.finished: dict[str, int] = {}
        self.finished_total = 0
        self.startup_s: float | None = None
        self.requests_recorded = 0
        self.gpu_uuids: tuple[str, ...] = ()
        """The UUIDs of the GPUs this engine runs on (set by ``_setup``)."""
        # Marks for the "since the previous export" gauges (written by the export thread).
        self._interval_lock = threading.Lock()
        self._rate_mark = (time.time_ns(), 0)
        self._prefix_mark = (0, 0)

        self._observables = [
            (runtime.instrument(spec), _Observer(self, fn)) for spec, fn in _OBSERVERS
        ]
        for observable, callback in self._observables:
            observable.add(callback)

    # ------------------------------------------------------------------ hot path
    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        """Records one output batch. Never raises (errors go to ``report_error``)."""
        try:
            if scheduler_stats is not None:
                self._record_scheduler(scheduler_stats)
            if iteration_stats is not None:
                self._record_iteration(iteration_stats)
        except Exception as exc:  # noqa: BLE001 - vLLM's serving loop must never see it
            self.runtime.report_error("vllm.record", exc)

    def _record_scheduler(self, stats: Any) -> None:
        f = self.fields
        f.inspect(stats)
        # A field vLLM stopped providing leaves its gauge unreported, never zeroed.
        running = f.maybe_integer(stats, "num_running_reqs")
        if running is not None:
            self.running = running
        waiting = f.maybe_integer(stats, "num_waiting_reqs")
        if waiting is not None:
            self.waiting = waiting + f.integer(stats, "num_skipped_waiting_reqs")
        usage = f.number(stats, "kv_cache_usage")
        if usage is not None:
            self.kv_cache_usage = usage
            with self._interval_lock:
                if self.kv_cache_peak is None or usage > self.kv_cache_peak:
                    self.kv_cache_peak = usage
        prefix = f.child(stats, "prefix_cache_stats")
        if prefix is not None:
            self.prefix_queries += f.integer(prefix, "queries")
            self.prefix_hits += f.integer(prefix, "hits")

    def _record_iteration(self, stats: Any) -> None:
        f = self.fields
        f.inspect(stats)
        self.tokens_out += f.integer(stats, "num_generation_tokens")
        prompt = f.child(stats, "prompt_token_stats", optional=True)
        if prompt is not None:
            self.tokens_in += f.integer(prompt, "total")
        else:  # older releases: a plain counter (0.34 keeps it as a property)
            self.tokens_in += f.integer(stats, "num_prompt_tokens")
        self.preemptions += f.integer(stats, "num_preempted_reqs")
        itl = f.sequence(stats, "inter_token_latencies_iter")
        if itl:
            record_many = getattr(self._h_itl, "record_many", None)
            if record_many is not None:  # one attribute lookup for the whole batch
                record_many(itl, self.base_attributes)
            else:
                base = self.base_attributes
                for value in itl:
                    self._h_itl.record(value, base)
        finished = f.sequence(stats, "finished_requests")
        if finished:
            end_s = f.number(stats, "iteration_timestamp")
            end_ns = int(end_s * _NS) if end_s is not None else time.time_ns()
            # On the engine loop: the finish counters only. The request's span (GPU context,
            # attributes) and its latency metrics are made off the loop (otelgpu.otel.deferred).
            deferred = getattr(self.runtime, "deferred", None)
            for request in finished:
                reason = f.text(request, "finish_reason", "unknown")
                self.finished[reason] = self.finished.get(reason, 0) + 1
                self.finished_total += 1
                # The caller's trace context is consumed now (the registry stays bounded).
                parent: Context | None = None
                if self._registry is not None:
                    request_id = f.child(request, "request_id", optional=True)
                    if request_id is not None:
                        parent = self._registry.pop(request_id)
                if deferred is not None:
                    deferred.submit(self._record_finished, request, end_ns, reason, parent)
                else:
                    self._record_finished(request, end_ns, reason, parent)

    def _record_finished(self, req: Any, end_ns: int, reason: str, parent: Context | None) -> None:
        f = self.fields
        f.inspect(req)
        e2e = f.number(req, "e2e_latency")
        if e2e is None or e2e < 0:
            return
        limit = e2e + _PHASE_SLACK_S
        queued = _phase(f.number(req, "queued_time"), limit)
        prefill = _phase(f.number(req, "prefill_time"), limit)
        decode = _phase(f.number(req, "decode_time"), limit)
        inference = _phase(f.number(req, "inference_time"), limit)
        n_out = f.integer(req, "num_generation_tokens")
        if n_out <= 0:
            # No token ever produced: vLLM's 0 - 0 differences are not phase times.
            prefill = decode = inference = None
        base = self.base_attributes
        if prefill is not None:
            self._h_prefill.record(prefill, base)
        if decode is not None:
            self._h_decode.record(decode, base)
        if inference is not None:
            self._h_inference.record(inference, base)

        timeout = self.options.timeout_s
        if timeout is not None and e2e >= timeout:
            outcome, error_type = "timeout", "timeout"
        elif reason in _FAILED_REASONS:
            outcome, error_type = "error", reason
        else:
            outcome, error_type = "ok", None
        start_ns = end_ns - int(e2e * _NS)
        # first token = last token - decode time; so (e2e - TTFT) / (n - 1) -- the runtime's
        # semconv TPOT -- equals vLLM's mean_time_per_output_token exactly.
        first_token_ns = end_ns - int(decode * _NS) if decode is not None else None
        request_id = f.child(req, "request_id", optional=True)
        # Every span attribute costs ~1.5 us of SDK validation: only what is not derivable
        # (inference_time = prefill_time + decode_time is left to the metric).
        extra: dict[str, Any] = {"gen_ai.response.finish_reasons": [reason]}
        preemptions = f.integer(req, "num_preemptions")
        if preemptions:
            extra["otelgpu.vllm.preemptions"] = preemptions
        cached = f.integer(req, "num_cached_tokens")
        if cached:
            extra["gen_ai.usage.cache_read.input_tokens"] = cached
        max_tokens = f.child(req, "max_tokens_param", optional=True)
        if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
            extra["gen_ai.request.max_tokens"] = max_tokens
        if prefill is not None:
            extra["otelgpu.vllm.prefill_time"] = prefill
        if decode is not None:
            extra["otelgpu.vllm.decode_time"] = decode
        self.runtime.record_request(
            RequestRecord(
                start_ns,
                end_ns,
                model=self.model_name,
                operation=OPERATION,
                provider=n.PROVIDER,
                context=parent if parent is not None else Context(),
                first_token_ns=first_token_ns,
                output_tokens=n_out,
                input_tokens=f.integer(req, "num_prompt_tokens"),
                queue_time_s=queued,
                outcome=outcome,
                error_type=error_type,
                attributes=self.engine_attributes,
                span_attributes=extra,
                devices=self.gpu_uuids or None,  # GPU context of this engine's GPUs only
                response_id=request_id if isinstance(request_id, str) else None,
                response_model=self.model_name,
            )
        )
        self.requests_recorded += 1

    # ------------------------------------------------------------------ lifecycle
    def engine_initialized(self, now_ns: int | None = None) -> None:
        """Records the cold start (process start -> engine ready) once. Never raises."""
        try:
            end_ns = time.time_ns() if now_ns is None else now_ns
            start_ns = self._process_start_ns
            if start_ns is None or start_ns >= end_ns or self.startup_s is not None:
                return
            self.startup_s = (end_ns - start_ns) / _NS
            p = self.placement
            attributes: dict[str, Any] = {
                **self.base_attributes,
                "otelgpu.vllm.tensor_parallel_size": p.tensor_parallel_size,
                "otelgpu.vllm.pipeline_parallel_size": p.pipeline_parallel_size,
                "otelgpu.vllm.data_parallel_size": p.data_parallel_size,
                "otelgpu.vllm.world_size": p.world_size,
            }
            if self.gpu_uuids:
                attributes["otelgpu.vllm.gpu_ids"] = list(self.gpu_uuids)
            span = self.runtime.tracer.start_span(
                n.STARTUP_SPAN_NAME,
                context=Context(),
                kind=SpanKind.INTERNAL,
                attributes=attributes,
                start_time=start_ns,
            )
            try:
                self.runtime.annotate(span, start_ns, end_ns, self.gpu_uuids or None)
            finally:
                span.end(end_time=end_ns)
        except Exception as exc:  # noqa: BLE001 - runs inside vLLM's engine start-up
            self.runtime.report_error("vllm.engine_initialized", exc)

    def interval_rate(self, now_ns: int) -> float | None:
        """Finished requests per second since the previous call (or construction)."""
        with self._interval_lock:
            last_ns, last_count = self._rate_mark
            self._rate_mark = (now_ns, self.finished_total)
        dt = (now_ns - last_ns) / _NS
        return (self.finished_total - last_count) / dt if dt > 0 else None

    def interval_hit_ratio(self) -> float | None:
        """Prefix-cache hits / queries since the previous call; ``None`` without queries."""
        with self._interval_lock:
            last_q, last_h = self._prefix_mark
            q, h = self.prefix_queries, self.prefix_hits
            self._prefix_mark = (q, h)
        return (h - last_h) / (q - last_q) if q > last_q else None

    def interval_kv_peak(self) -> float | None:
        """Highest KV-cache usage since the previous call; restarts from the current value."""
        with self._interval_lock:
            peak = self.kv_cache_peak
            self.kv_cache_peak = self.kv_cache_usage
        return peak

    def close(self) -> None:
        """Stops publishing this engine's gauges and counters."""
        observables, self._observables = self._observables, []
        for observable, callback in observables:
            observable.remove(callback)


def _phase(value: float | None, limit: float) -> float | None:
    if value is None or value < 0 or value > limit:
        return None
    return value


class _Observer:
    """One engine's callback for one observable instrument; holds its recorder weakly.

    Every engine of a runtime feeds the same instruments (``Runtime.instrument`` is
    idempotent), each with its own attributes (``otelgpu.vllm.engine``).
    """

    __slots__ = ("_fn", "_recorder")

    def __init__(
        self, recorder: EngineRecorder, fn: Callable[[EngineRecorder], Iterable[Observation]]
    ) -> None:
        self._recorder = weakref.ref(recorder)
        self._fn = fn

    def __call__(self, _options: CallbackOptions) -> Iterable[Observation]:
        recorder = self._recorder()
        return [] if recorder is None else _safe_observe(self._fn, recorder)


def _safe_observe(
    fn: Callable[[EngineRecorder], Iterable[Observation]], recorder: EngineRecorder
) -> Iterable[Observation]:
    try:
        return list(fn(recorder))
    except Exception as exc:  # noqa: BLE001 - one engine's failure must not stop collection
        recorder.runtime.report_error("vllm.collect", exc)
        return []


def _obs_finished(r: EngineRecorder) -> Iterable[Observation]:
    base = r.base_attributes
    return [
        Observation(count, {**base, n.ATTR_FINISH_REASON: reason})
        for reason, count in list(r.finished.items())
    ]


def _obs_tokens(r: EngineRecorder) -> Iterable[Observation]:
    base = r.base_attributes
    return [
        Observation(r.tokens_in, {**base, n.ATTR_TOKEN_TYPE: "input"}),
        Observation(r.tokens_out, {**base, n.ATTR_TOKEN_TYPE: "output"}),
    ]


def _obs_rate(r: EngineRecorder) -> Iterable[Observation]:
    rate = r.interval_rate(time.time_ns())
    return [] if rate is None else [Observation(rate, r.base_attributes)]


def _obs_hit_ratio(r: EngineRecorder) -> Iterable[Observation]:
    ratio = r.interval_hit_ratio()
    return [] if ratio is None else [Observation(ratio, r.base_attributes)]


def _obs_startup(r: EngineRecorder) -> Iterable[Observation]:
    return [] if r.startup_s is None else [Observation(r.startup_s, r.base_attributes)]


def _gauge(
    value: Callable[[EngineRecorder], float | None],
) -> Callable[[EngineRecorder], Iterable[Observation]]:
    def fn(r: EngineRecorder) -> Iterable[Observation]:
        v = value(r)
        return [] if v is None else [Observation(v, r.base_attributes)]

    return fn


_OBSERVERS: tuple[tuple[MetricSpec, Callable[[EngineRecorder], Iterable[Observation]]], ...] = (
    (C.REQUESTS_FINISHED, _obs_finished),
    (C.TOKENS, _obs_tokens),
    (C.PREEMPTIONS, lambda r: [Observation(r.preemptions, r.base_attributes)]),
    (C.PREFIX_CACHE_QUERIES, lambda r: [Observation(r.prefix_queries, r.base_attributes)]),
    (C.PREFIX_CACHE_HITS, lambda r: [Observation(r.prefix_hits, r.base_attributes)]),
    (C.REQUESTS_RUNNING, _gauge(lambda r: r.running)),
    (C.REQUESTS_WAITING, _gauge(lambda r: r.waiting)),
    (C.KV_CACHE_USAGE, _gauge(lambda r: r.kv_cache_usage)),
    (C.STARTUP_DURATION, _obs_startup),
    (C.REQUEST_RATE, _obs_rate),
    (C.PREFIX_CACHE_HIT_RATIO, _obs_hit_ratio),
    (C.KV_CACHE_USAGE_PEAK, _gauge(lambda r: r.interval_kv_peak())),
)
"""Each observable vLLM metric and what one engine reports for it."""
