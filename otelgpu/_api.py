"""Public API: ``instrument()``, ``shutdown()``, ``step()`` and ``request()``.

``instrument(**settings)`` is idempotent and safe to call from library code: the first
call builds the runtime, later calls return the same handle (their arguments are
ignored, with a debug log). ``step()`` and ``request()`` work with or without
``instrument()`` -- without it (or with ``OTEL_SDK_DISABLED=true``) they only time.

Both context managers are thread- and asyncio-safe: the span is made current through
OpenTelemetry's contextvars-based context, and all per-call state lives on the object
the ``with`` statement returns. Neither raises into the application; an exception from
the ``with`` body is recorded on the span and re-raised untouched.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace

from otelgpu import _runtime
from otelgpu._runtime import Runtime
from otelgpu._settings import Settings, resolve
from otelgpu.errors import ConfigurationError
from otelgpu.runtime.records import (
    DEFAULT_OPERATION,
    DEFAULT_PROVIDER,
    RequestRecord,
    StepRecord,
)

_logger = logging.getLogger("otelgpu")
_lock = threading.RLock()
_handle: Instrumentation | None = None
_fork_hook_installed = False
_atexit_installed = False


class Instrumentation:
    """What ``instrument()`` returns: the settings in force and ``shutdown()``."""

    def __init__(self, settings: Settings, runtime: Runtime | None) -> None:
        self.settings = settings
        self.runtime = runtime
        self.instrumentors: list[Any] = []

    @property
    def enabled(self) -> bool:
        """False when otelgpu is disabled (``OTEL_SDK_DISABLED``/``OTELGPU_DISABLED``)."""
        return self.runtime is not None

    @property
    def recording_path(self) -> Path | None:
        """The local recording file, when the ``recording`` exporter is on."""
        pipeline = self.runtime.pipeline if self.runtime else None
        return pipeline.recording.path if pipeline and pipeline.recording else None

    def force_flush(self, timeout_millis: int = 10_000) -> None:
        """Export what was recorded so far."""
        if self.runtime is not None:
            self.runtime.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Flush and stop (idempotent); after it, ``instrument()`` may be called again."""
        global _handle
        with _lock:
            if _handle is self:
                _handle = None
        for instrumentor in self.instrumentors:
            _uninstrument(instrumentor)
        self.instrumentors = []
        if self.runtime is not None:
            self.runtime.close()

    def __enter__(self) -> Instrumentation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _uninstrument(instrumentor: Any) -> None:
    try:
        instrumentor.uninstrument()
    except Exception as exc:  # noqa: BLE001 - shutdown goes on
        _logger.warning("otelgpu: error uninstrumenting %r: %r", instrumentor, exc)


def _start_sampler(settings: Settings) -> Any:
    """Activate the simulator if asked (``OTELGPU_SIM``), then start a GpuSampler or return None."""
    try:
        if os.environ.get("OTELGPU_SIM", "").strip():
            from otelgpu import sim

            sim.activate_from_env()
    except Exception as exc:  # noqa: BLE001 - a bad scenario must not stop the application
        _logger.warning("otelgpu: could not activate the simulated GPU: %r", exc)
    try:
        from otelgpu.sampler import GpuSampler
    except ImportError as exc:
        _logger.info("otelgpu: GPU sampler unavailable (%s); no GPU context", exc)
        return None
    try:
        sampler = GpuSampler(
            devices=[int(d) if d.isdigit() else d for d in settings.devices]
            if settings.devices
            else None,
            interval_s=settings.sample_interval_ms / 1000,
            history_s=settings.sampler_history_s,
        )
        if not sampler.devices:
            sampler.stop()
            _logger.info("otelgpu: no GPU found; spans carry no GPU context")
            return None
        sampler.start()
        return sampler
    except ConfigurationError as exc:
        # NVML is there but the settings name GPUs it does not have (or a history shorter
        # than the interval): a configuration error, not "no GPU" -- fail fast.
        setting = _SAMPLER_SETTINGS.get(exc.setting, exc.setting)
        value = settings.sample_interval_ms if setting == "sample_interval_ms" else exc.value
        accepted = exc.accepted.replace("interval_s", "the sampling interval")
        raise ConfigurationError(setting, value, accepted) from exc
    except Exception as exc:  # noqa: BLE001 - no NVML / no GPU is a normal state
        _logger.info("otelgpu: no GPU sampling (%s); spans carry no GPU context", exc)
        return None


#: GpuSampler argument -> the instrument() setting it comes from.
_SAMPLER_SETTINGS = {
    "devices": "devices",
    "interval_s": "sample_interval_ms",
    "history_s": "sampler_history_s",
}


def _register_gpu_metrics(runtime: Runtime) -> None:
    if runtime.sampler is None:
        return
    try:
        from otelgpu.metrics.gpu import register_gpu_metrics
    except ImportError as exc:
        _logger.info("otelgpu: GPU metrics unavailable (%s)", exc)
        return
    try:
        register_gpu_metrics(runtime, runtime.sampler)
    except Exception as exc:  # noqa: BLE001
        runtime.report_error("register_gpu_metrics", exc)


_FRAMEWORK_INSTRUMENTORS = {
    "torch": ("torch", "otelgpu.instrumentation.torch", "TorchInstrumentor"),
    "vllm": ("vllm", "otelgpu.instrumentation.vllm", "VllmInstrumentor"),
}


def _enable_frameworks(settings: Settings) -> list[Any]:
    """Turn on the framework instrumentors whose framework is installed (never raises)."""
    import importlib
    import importlib.util

    enabled = []
    for name in settings.frameworks:
        package, module_name, class_name = _FRAMEWORK_INSTRUMENTORS[name]
        try:
            if importlib.util.find_spec(package) is None:
                continue
            instrumentor = getattr(importlib.import_module(module_name), class_name)()
            if instrumentor.is_instrumented_by_opentelemetry:
                continue
            instrumentor.instrument()
            enabled.append(instrumentor)
        except Exception as exc:  # noqa: BLE001 - one framework must not disable the rest
            _logger.warning("otelgpu: could not instrument %s: %r", name, exc)
    return enabled


def _build(
    settings: Settings,
    tracer_provider: trace.TracerProvider | None,
    meter_provider: metrics.MeterProvider | None,
) -> Runtime:
    from otelgpu.otel.providers import build_pipeline
    from otelgpu.otel.resource import build_resource, nvml_inventory
    from otelgpu.otel.sketches import SketchRegistry
    from otelgpu.otel.stats import InternalStats

    sampler = _start_sampler(settings) if settings.gpu else None
    try:
        uuids = [d.uuid for d in sampler.devices] if sampler is not None else None
        inventory = nvml_inventory(uuids) if settings.gpu else None
        stats = InternalStats()
        sketches = SketchRegistry(
            relative_accuracy=settings.sketch_relative_accuracy,
            max_series=settings.max_series,
            quantiles=settings.quantiles,
            stats=stats,
        )
        pipeline = build_pipeline(
            settings,
            build_resource(settings, inventory),
            stats=stats,
            sketch_metrics=sketches.metrics,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
        )
    except BaseException:
        if sampler is not None:
            sampler.stop()
        raise
    runtime = Runtime(
        settings,
        tracer_provider=pipeline.tracer_provider,
        meter_provider=pipeline.meter_provider,
        sampler=sampler,
        pipeline=pipeline,
        stats=stats,
        sketches=sketches,
        internal_meter_provider=pipeline.internal_meter_provider,
    )
    _register_gpu_metrics(runtime)
    return runtime


def _after_fork_in_child() -> None:
    global _handle, _lock
    # Another parent thread may have held the lock at fork time (inside instrument() or
    # shutdown()); it does not exist here, so a child calling instrument() would hang.
    _lock = threading.RLock()
    handle = _handle
    _handle = None
    if handle is not None and handle.runtime is not None:
        handle.runtime.after_fork_in_child()
    try:
        from otelgpu.otel.resource import new_instance_id

        new_instance_id()
    except Exception:  # noqa: BLE001 - never fail a fork
        pass


def _at_exit() -> None:
    handle = _handle
    if handle is not None:
        try:
            handle.shutdown()
        except Exception as exc:  # noqa: BLE001 - interpreter is exiting
            _logger.warning("otelgpu: error during exit flush: %r", exc)


def instrument(
    *,
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    **settings: Any,
) -> Instrumentation:
    """Turn otelgpu on (idempotent). Returns a handle with ``shutdown()``.

    Args:
        tracer_provider: use this provider instead of the global/otelgpu-built one.
        meter_provider: likewise for metrics.
        **settings: any setting of ``otelgpu._settings.Settings`` (see
            ``docs/configuration.md``); each also has an ``OTELGPU_*`` variable.

    Raises:
        otelgpu.errors.ConfigurationError: a setting has an invalid value (the message
            names the setting and the accepted values).
    """
    global _handle, _fork_hook_installed, _atexit_installed
    with _lock:
        if _handle is not None:
            if settings or tracer_provider or meter_provider:
                _logger.debug("otelgpu: already instrumented; arguments ignored")
            return _handle
        resolved = resolve(settings)
        runtime = None if resolved.disabled else _build(resolved, tracer_provider, meter_provider)
        _handle = Instrumentation(resolved, runtime)
        if runtime is not None:
            _runtime._set_current(runtime)
            if not _fork_hook_installed and hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=_after_fork_in_child)
                _fork_hook_installed = True
            if not _atexit_installed:
                atexit.register(_at_exit)
                _atexit_installed = True
            _handle.instrumentors = _enable_frameworks(resolved)
        return _handle


def shutdown() -> None:
    """Flush and stop otelgpu if it is on (idempotent)."""
    handle = _handle
    if handle is not None:
        handle.shutdown()


def instrumentation() -> Instrumentation | None:
    """The active handle, or ``None``."""
    return _handle


# ========================================================================= span scope


class _SpanScope:
    """What ``StepContext`` and ``RequestContext`` share: a span made current for the
    ``with`` block (sync or async), the block's times, and a finish that never raises.

    Subclasses implement :meth:`_start` (the live span) and :meth:`_finish` (record the
    step or request; ``exc`` is what left the block).
    """

    __slots__ = ("_runtime", "_span", "_start_ns", "_token", "end_ns")

    _where = "scope"

    def __init__(self) -> None:
        self.end_ns: int | None = None
        self._runtime: Runtime | None = None
        self._span: trace.Span | None = None
        self._token: object = None
        self._start_ns = 0

    @property
    def duration_s(self) -> float | None:
        """Duration in seconds once the block has ended."""
        return None if self.end_ns is None else (self.end_ns - self._start_ns) / 1e9

    def _start(self, runtime: Runtime) -> trace.Span:
        raise NotImplementedError

    def _exited(self, exc: BaseException | None) -> None:
        """Runs at exit with or without a runtime (e.g. to set the outcome)."""

    def _finish(self, runtime: Runtime, span: trace.Span, exc: BaseException | None) -> None:
        raise NotImplementedError

    def _enter(self) -> None:
        runtime = _runtime.current()
        self._start_ns = time.time_ns()
        if runtime is None:
            return
        try:
            span = self._start(runtime)
            self._token = otel_context.attach(trace.set_span_in_context(span))
            self._span = span
            self._runtime = runtime
        except Exception as exc:  # noqa: BLE001 - hot path
            runtime.report_error(f"{self._where} enter", exc)

    def _exit(self, exc: BaseException | None) -> None:
        self.end_ns = time.time_ns()
        self._exited(exc)
        runtime, span = self._runtime, self._span
        if runtime is None or span is None:
            return
        self._runtime = self._span = None
        try:
            otel_context.detach(self._token)  # type: ignore[arg-type]
        except Exception as err:  # noqa: BLE001
            runtime.report_error(f"{self._where} exit", err)
        self._finish(runtime, span, exc)


# =============================================================================== step


class StepContext(_SpanScope):
    """``with otelgpu.step(samples=…, tokens=…) as s:`` -- one training step.

    On exit: a span ``otelgpu.train.step`` (step number, duration, samples/tokens and
    their throughput, GPU context of exactly that window, health events as span events),
    the duration into the ``otelgpu.train.step.duration`` sketch, and the counters.
    ``s.samples`` / ``s.tokens`` may be set inside the block (e.g. once the batch is known).
    Counts that are out of range (negative, NaN, infinite, over 2**53) are dropped and
    counted in ``otelgpu.internal.rejected``, never raised.
    """

    __slots__ = ("attributes", "samples", "step", "tokens")

    _where = "step"

    def __init__(
        self,
        samples: float | None = None,
        tokens: float | None = None,
        *,
        step: int | None = None,
        attributes: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.samples = samples
        self.tokens = tokens
        self.step = step
        self.attributes = attributes

    def _start(self, runtime: Runtime) -> trace.Span:
        if self.step is None:
            self.step = runtime.next_step_number()
        return runtime.start_step_span(StepRecord(self._start_ns, self._start_ns))

    def _finish(self, runtime: Runtime, span: trace.Span, exc: BaseException | None) -> None:
        runtime.finish_step(
            span,
            StepRecord(
                self._start_ns,
                self.end_ns or self._start_ns,
                step=self.step or 0,
                samples=self.samples,
                tokens=self.tokens,
                attributes=self.attributes,
                failed=exc,
            ),
        )

    def __enter__(self) -> StepContext:
        self._enter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit(exc)

    async def __aenter__(self) -> StepContext:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)


def step(
    samples: float | None = None,
    tokens: float | None = None,
    *,
    step: int | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> StepContext:
    """A training step (context manager, sync or async); see :class:`StepContext`."""
    return StepContext(samples, tokens, step=step, attributes=attributes)


# ============================================================================ request


class RequestContext(_SpanScope):
    """``with otelgpu.request(model=…) as r:`` -- one inference request.

    Inside the block: ``r.scheduled()`` (queue ends), ``r.first_token()``, ``r.tokens(n)``
    (output tokens, cumulative), ``r.input_tokens(n)``, ``r.error(kind)`` (``"timeout"``
    makes the outcome ``timeout``; anything else ``error`` with ``error.type=kind``).
    An exception leaving the block sets outcome ``error`` (``timeout`` for TimeoutError).
    On exit: a SERVER span ``{operation} {model}`` with TTFT, time per output token,
    tokens, queue time, outcome and the GPU context; the ``gen_ai.server.*`` sketches.
    ``provider`` is ``gen_ai.provider.name`` (default ``DEFAULT_PROVIDER``, ``otelgpu``).
    """

    __slots__ = (
        "_error_type",
        "_first_token_ns",
        "_input_tokens",
        "_outcome",
        "_output_tokens",
        "_queue_time_s",
        "_scheduled_ns",
        "attributes",
        "model",
        "operation",
        "provider",
    )

    _where = "request"

    def __init__(
        self,
        model: str | None = None,
        *,
        operation: str = DEFAULT_OPERATION,
        provider: str = DEFAULT_PROVIDER,
        queue_time_s: float | None = None,
        attributes: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.operation = operation
        self.provider = provider
        self.attributes = attributes
        self._queue_time_s = queue_time_s
        self._first_token_ns: int | None = None
        self._scheduled_ns: int | None = None
        self._output_tokens = 0
        self._input_tokens: int | None = None
        self._outcome = "ok"
        self._error_type: str | None = None

    # ---------------------------------------------------------------- inside the block
    def scheduled(self) -> None:
        """The request left the queue now (queue time = now - start)."""
        if self._scheduled_ns is None:
            self._scheduled_ns = time.time_ns()

    def first_token(self) -> None:
        """The first output token was produced now (only the first call counts)."""
        if self._first_token_ns is None:
            self._first_token_ns = time.time_ns()

    def tokens(self, n: int = 1) -> None:
        """``n`` more output tokens were produced (a count >= 0; anything else is ignored)."""
        count = self._count(n, "request tokens")
        if count is not None:
            self._output_tokens += count

    def input_tokens(self, n: int) -> None:
        """The prompt had ``n`` tokens (a count >= 0; anything else is ignored)."""
        count = self._count(n, "request input_tokens")
        if count is not None:
            self._input_tokens = count

    def _count(self, n: object, where: str) -> int | None:
        """``n`` as a token count, or ``None`` (reported, never raised: hot path)."""
        try:
            count: int = int(n)  # type: ignore[call-overload]
            if count < 0:
                raise ValueError(f"negative token count {n!r}")
        except Exception as exc:  # noqa: BLE001 - e.g. an object whose __int__ raises
            runtime = self._runtime or _runtime.current()
            if runtime is not None:
                runtime.report_error(where, exc)
            return None
        return count

    def error(self, kind: str = "error") -> None:
        """Mark the request failed: ``timeout`` or an error of type ``kind``."""
        self._outcome = "timeout" if kind == "timeout" else "error"
        self._error_type = kind

    @property
    def outcome(self) -> str:
        return self._outcome

    @property
    def output_tokens(self) -> int:
        return self._output_tokens

    @property
    def ttft_s(self) -> float | None:
        ft = self._first_token_ns
        return None if ft is None else (ft - self._start_ns) / 1e9

    # ---------------------------------------------------------------- span scope
    def _start(self, runtime: Runtime) -> trace.Span:
        return runtime.start_request_span(
            RequestRecord(
                self._start_ns,
                self._start_ns,
                model=self.model,
                operation=self.operation,
                provider=self.provider,
            )
        )

    def _exited(self, exc: BaseException | None) -> None:
        if exc is not None and self._outcome == "ok":
            if isinstance(exc, TimeoutError):
                self._outcome, self._error_type = "timeout", "timeout"
            else:
                self._outcome, self._error_type = "error", type(exc).__qualname__

    def _finish(self, runtime: Runtime, span: trace.Span, exc: BaseException | None) -> None:
        queue_time_s = self._queue_time_s
        if queue_time_s is None and self._scheduled_ns is not None:
            queue_time_s = (self._scheduled_ns - self._start_ns) / 1e9
        runtime.finish_request(
            span,
            RequestRecord(
                self._start_ns,
                self.end_ns or self._start_ns,
                model=self.model,
                operation=self.operation,
                provider=self.provider,
                first_token_ns=self._first_token_ns,
                output_tokens=self._output_tokens,
                input_tokens=self._input_tokens,
                queue_time_s=queue_time_s,
                outcome=self._outcome,
                error_type=self._error_type,
                attributes=self.attributes,
                exception=exc,
            ),
        )

    def __enter__(self) -> RequestContext:
        self._enter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit(exc)

    async def __aenter__(self) -> RequestContext:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)


def request(
    model: str | None = None,
    *,
    operation: str = DEFAULT_OPERATION,
    provider: str = DEFAULT_PROVIDER,
    queue_time_s: float | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> RequestContext:
    """An inference request (context manager, sync or async); see :class:`RequestContext`."""
    return RequestContext(
        model,
        operation=operation,
        provider=provider,
        queue_time_s=queue_time_s,
        attributes=attributes,
    )


__all__ = [
    "Instrumentation",
    "RequestContext",
    "StepContext",
    "instrument",
    "instrumentation",
    "request",
    "shutdown",
    "step",
]
