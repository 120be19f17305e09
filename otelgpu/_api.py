"""Public API: ``instrument()``, ``shutdown()``, ``step()`` and ``request()``.

``instrument(**settings)`` is idempotent and safe to call from library code: the first
call builds the runtime, later calls return the same handle (their arguments are
ignored, with a debug log). ``step()`` and ``request()`` work with or without
``instrument()`` -- without it (or with ``OTEL_SDK_DISABLED=true``) they only time.

The context managers live in ``otelgpu._contexts`` (re-exported here).
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import threading
from pathlib import Path
from typing import Any

from opentelemetry import metrics, trace

from otelgpu import _runtime, _sigterm
from otelgpu._contexts import RequestContext, StepContext, request, step
from otelgpu._runtime import Runtime
from otelgpu._settings import Settings, resolve
from otelgpu.errors import ConfigurationError

_logger = logging.getLogger("otelgpu")
_lock = threading.RLock()
_handle: Instrumentation | None = None
_fork_hook_installed = False
_atexit_installed = False
_froze_gc = False  # instrument() called gc.freeze() (OTELGPU_GC_FREEZE): undone at exit


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
        """Export what was recorded so far, the steps the framework instrumentors still
        queue for their background threads included (a step in progress stays open)."""
        if self.runtime is None:
            return
        for instrumentor in self.instrumentors:
            drain = getattr(instrumentor, "drain", None)
            if drain is not None:
                try:
                    drain()
                except Exception as exc:  # noqa: BLE001 - never raise into the host
                    self.runtime.report_error("force_flush", exc)
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
        _sigterm.uninstall()
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
    """Activate the simulator if asked (``OTELGPU_SIM``), then start GPU discovery and the
    sampler off this thread (``otelgpu.sampler._startup``); ``None`` when there is no GPU.

    Waits at most ``gpu_startup_wait_ms`` for discovery: what it finds by then (a
    configuration error included) is handled here, anything later in the background.
    """
    from otelgpu.sim import activate_from_settings

    activate_from_settings()
    try:
        from otelgpu.sampler import GpuSampler
        from otelgpu.sampler._startup import DeferredSampler, reports_lost_gpus, validate_sampling
    except ImportError as exc:
        _logger.info("otelgpu: GPU sampler unavailable (%s); no GPU context", exc)
        return None
    devices = [int(d) if d.isdigit() else d for d in settings.devices] if settings.devices else None
    interval_s, history_s = settings.sample_interval_ms / 1000, settings.sampler_history_s
    try:
        validate_sampling(interval_s, history_s)
    except ConfigurationError as exc:
        raise _sampler_error(settings, exc) from exc

    def build() -> Any:
        return GpuSampler(devices=devices, interval_s=interval_s, history_s=history_s)

    deferred = DeferredSampler(build, report_lost_gpus=reports_lost_gpus(devices is not None))
    if not deferred.start().wait_or_detach(settings.gpu_startup_wait_ms / 1000):
        _logger.info(
            "otelgpu: GPU discovery still running after %d ms; GPU metrics appear when it ends",
            settings.gpu_startup_wait_ms,
        )
        return deferred
    error = deferred.error
    if isinstance(error, ConfigurationError):
        # NVML is there but the settings name GPUs it does not have: fail fast.
        deferred.close()
        raise _sampler_error(settings, error) from error
    if error is not None:  # no NVML / no GPU is a normal state
        _logger.info("otelgpu: no GPU sampling (%s); spans carry no GPU context", error)
        deferred.close()
        return None
    if not deferred.has_gpus:
        _logger.info("otelgpu: no GPU found; spans carry no GPU context")
        deferred.close()
        return None
    return deferred


def _sampler_error(settings: Settings, exc: ConfigurationError) -> ConfigurationError:
    """A GpuSampler argument error, renamed to the instrument() setting it comes from."""
    setting = _SAMPLER_SETTINGS.get(exc.setting, exc.setting)
    value = settings.sample_interval_ms if setting == "sample_interval_ms" else exc.value
    accepted = exc.accepted.replace("interval_s", "the sampling interval")
    return ConfigurationError(setting, value, accepted)


#: GpuSampler argument -> the instrument() setting it comes from.
_SAMPLER_SETTINGS = {
    "devices": "devices",
    "interval_s": "sample_interval_ms",
    "history_s": "sampler_history_s",
}


def _register_gpu_metrics(runtime: Runtime) -> None:
    """Create the GPU instruments once the sampler runs (discovery may still be going on)."""
    if runtime.sampler is None:
        return
    try:
        from otelgpu.metrics.gpu import register_gpu_metrics
        from otelgpu.sampler._startup import gpu_inventory
    except ImportError as exc:
        _logger.info("otelgpu: GPU metrics unavailable (%s)", exc)
        return

    def register(sampler: Any) -> None:
        if runtime.closed:
            return
        try:
            devices = gpu_inventory(runtime.sampler).devices
            lost = getattr(runtime.sampler, "lost_at_start", ())
            direct = runtime.pipeline.direct_metrics if runtime.pipeline is not None else None
            register_gpu_metrics(
                runtime, sampler, devices or None, lost_at_start=lost, direct=direct
            )
        except Exception as exc:  # noqa: BLE001
            runtime.report_error("register_gpu_metrics", exc)

    runtime.sampler.when_ready(register)


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
    from otelgpu.metrics.direct import DirectMetrics
    from otelgpu.otel.providers import build_pipeline
    from otelgpu.otel.resource import build_resource
    from otelgpu.otel.sketches import SketchRegistry
    from otelgpu.otel.stats import InternalStats
    from otelgpu.sampler._startup import gpu_inventory

    sampler = _start_sampler(settings) if settings.gpu else None
    try:
        inventory = gpu_inventory(sampler) if sampler is not None else None
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
            direct_metrics=DirectMetrics(stats),
        )
    except BaseException:
        if sampler is not None:
            sampler.close()
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
    from otelgpu.diagnosis.serving import attach

    attach(runtime)  # inference latency drift (OTELGPU_DIAGNOSIS; a bad value fails here)
    runtime.deferred.start()  # not at the first deferred finish, in the host's exit
    return runtime


def _after_fork_in_child() -> None:
    global _handle, _lock
    # Another parent thread may have held the lock at fork time (inside instrument() or
    # shutdown()); it does not exist here, so a child calling instrument() would hang.
    _lock = threading.RLock()
    handle = _handle
    _handle = None
    _sigterm.after_fork_in_child()
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
    if _froze_gc:
        # The interpreter's last collections skip frozen objects: extension types that
        # report what is never freed (nanobind's, triton's) would print leak warnings.
        gc.unfreeze()


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
    global _handle, _fork_hook_installed, _atexit_installed, _froze_gc
    with _lock:
        if _handle is not None:
            if settings or tracer_provider or meter_provider:
                _logger.debug("otelgpu: already instrumented; arguments ignored")
            return _handle
        resolved = resolve(settings)
        runtime = None if resolved.disabled else _build(resolved, tracer_provider, meter_provider)
        _handle = Instrumentation(resolved, runtime)
        if runtime is not None:
            # Starting up created tens of thousands of long-lived objects (the SDK, the
            # exporters' modules, the sampler). Left pending, they make the interpreter run
            # a full collection (~30 ms with the GIL held) within seconds, in whichever
            # thread allocates next -- often the host's loop. One full collection now, while
            # the caller waits for instrument() anyway, resets that count.
            gc.collect()
            if resolved.gc_freeze:
                # ... and leaves full collections only the objects made from now on to
                # scan: otherwise every later one walks all of start-up's again (6-16 ms,
                # ~50 k objects without torch, several times that with it), in whichever
                # thread triggers it -- the host's loop, often (OTELGPU_GC_FREEZE).
                gc.freeze()
                _froze_gc = True
            _runtime._set_current(runtime)
            if not _fork_hook_installed and hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=_after_fork_in_child)
                _fork_hook_installed = True
            if not _atexit_installed:
                atexit.register(_at_exit)
                _atexit_installed = True
            _handle.instrumentors = _enable_frameworks(resolved)
            if resolved.flush_on_sigterm:  # only replaces SIGTERM's default disposition
                # shutdown() is bounded by shutdown_timeout_ms; one more second of slack
                _sigterm.install(shutdown, resolved.shutdown_timeout_ms / 1000 + 1.0)
            if resolved.live:  # otelgpu top: read-only snapshots on an owner-only socket
                from otelgpu.report.live import provider

                provider.start(runtime)
        return _handle


def shutdown() -> None:
    """Flush and stop otelgpu if it is on (idempotent)."""
    handle = _handle
    if handle is not None:
        handle.shutdown()


def instrumentation() -> Instrumentation | None:
    """The active handle, or ``None``."""
    return _handle


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
