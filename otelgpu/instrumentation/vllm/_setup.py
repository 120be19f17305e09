"""Builds an :class:`EngineRecorder` for one vLLM engine (no vLLM import).

Called from the stat-logger shim's ``__init__`` -- i.e. while vLLM builds its
``StatLoggerManager``, once per engine, in the front-end process. Here we:

1. find the otelgpu runtime (``otelgpu._runtime.current()``) or start one with
   ``otelgpu.instrument()`` (the zero-code ``vllm serve`` path: settings from ``OTELGPU_*`` /
   ``OTEL_*`` variables);
2. map the engine's parallel configuration to the GPUs it runs on (``_devices``);
3. read the instrumentation's own settings (``environment_variables``), failing fast;
4. install the ``add_request`` trace-context wrappers (idempotent).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from otelgpu import environment_variables as otelgpu_ev
from otelgpu._settings import Setting, _bool, resolve_table
from otelgpu.instrumentation.vllm import _context, _devices
from otelgpu.instrumentation.vllm import environment_variables as ev
from otelgpu.instrumentation.vllm._recorder import EngineRecorder, RecorderOptions
from otelgpu.runtime.api import RuntimeAPI

_logger = logging.getLogger("otelgpu.instrumentation.vllm")


def _seconds(raw: object) -> float:
    value = float(raw.strip()) if isinstance(raw, str) else float(raw)  # type: ignore[arg-type]
    if not 0 < value < float("inf"):
        raise ValueError(raw)
    return value


#: The settings table (the pattern of ``otelgpu._settings``); variables only.
SETTINGS: tuple[Setting, ...] = (
    Setting("timeout_s", ev.OTELGPU_VLLM_TIMEOUT_S, None, _seconds,
            "a number of seconds > 0", "e2e time from which a finished request is a timeout."),
    Setting("trace_context", ev.OTELGPU_VLLM_TRACE_CONTEXT, None, _bool, "true or false",
            "Parent request spans on the incoming traceparent."),
)  # fmt: skip


def _settings(environ: Mapping[str, str] | None) -> dict[str, Any]:
    return resolve_table(SETTINGS, {}, os.environ if environ is None else environ)


def read_options(environ: Mapping[str, str] | None = None) -> RecorderOptions:
    """The instrumentation's options from the environment.

    Raises:
        ConfigurationError: a variable has an invalid value (named in the message).
    """
    return RecorderOptions(timeout_s=_settings(environ).get("timeout_s"))


def trace_context_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``add_request`` should be wrapped (``OTELGPU_VLLM_TRACE_CONTEXT``)."""
    return bool(_settings(environ).get("trace_context", True))


def vllm_owns_global_tracer_provider() -> bool:
    """True when the global tracer provider is the one vLLM's ``--otlp-traces-endpoint`` built.

    vLLM's ``init_tracer`` installs it globally before the stat loggers are created and tags
    its resource with ``vllm.instrumenting_module_name``.
    """
    from opentelemetry import trace

    resource = getattr(trace.get_tracer_provider(), "resource", None)
    attributes = getattr(resource, "attributes", None) or {}
    return "vllm.instrumenting_module_name" in attributes


def current_runtime(
    start: bool = True, environ: Mapping[str, str] | None = None
) -> RuntimeAPI | None:
    """The active otelgpu runtime; with ``start``, ``otelgpu.instrument()`` when there is none.

    When vLLM's own tracing owns the global tracer provider, otelgpu is started with
    ``attach="never"`` (unless ``OTELGPU_ATTACH`` says otherwise): it keeps its own provider,
    exporters and sampler instead of adding its spans to vLLM's, and vLLM's tracing is left
    exactly as configured.
    """
    from otelgpu import _runtime

    runtime = _runtime.current()
    if runtime is None and start:
        from otelgpu._api import instrument

        env = os.environ if environ is None else environ
        if vllm_owns_global_tracer_provider() and not env.get(otelgpu_ev.OTELGPU_ATTACH):
            instrument(attach="never")
        else:
            instrument()
        runtime = _runtime.current()
    return runtime


def model_name(vllm_config: object) -> str | None:
    """vLLM's served model name (the first one when several are configured)."""
    model_config = getattr(vllm_config, "model_config", None)
    name = getattr(model_config, "served_model_name", None)
    if isinstance(name, (list, tuple)):
        name = name[0] if name else None
    if name is None:
        name = getattr(model_config, "model", None)
    return str(name) if name else None


def process_start_ns() -> int | None:
    """Wall-clock start of this process, from psutil (a vLLM dependency), or ``None``."""
    try:
        import psutil  # type: ignore[import-untyped]

        return int(psutil.Process().create_time() * 1_000_000_000)
    except Exception:  # noqa: BLE001 - psutil missing or /proc unreadable: no cold start
        return None


def sampled_devices(runtime: object) -> tuple[object, ...]:
    """The ``DeviceInfo`` of every GPU the runtime samples (``()`` without a sampler)."""
    sampler = getattr(runtime, "sampler", None)
    if sampler is None:
        return ()
    try:
        return tuple(sampler.devices)
    except Exception:  # noqa: BLE001 - no devices means no GPU context, not a failure
        return ()


def build_recorder(
    vllm_config: object,
    engine_index: int,
    *,
    runtime: RuntimeAPI | None = None,
    environ: Mapping[str, str] | None = None,
) -> EngineRecorder | None:
    """A recorder for engine ``engine_index``, or ``None`` when otelgpu is disabled.

    Raises:
        ConfigurationError: an ``OTELGPU_VLLM_*`` variable is invalid.
    """
    options = read_options(environ)
    rt = runtime if runtime is not None else current_runtime(environ=environ)
    if rt is None:
        _logger.info("otelgpu: disabled; the vLLM stat logger records nothing")
        return None
    devices = sampled_devices(rt)
    placement = _devices.engine_placement(
        vllm_config, engine_index, _devices.visible_count(devices)
    )
    uuids = _devices.resolve_uuids(placement.cuda_indices, devices)
    registry = None
    if trace_context_enabled(environ):
        from otelgpu.instrumentation.vllm import _patch

        _patch.install_trace_context()
        registry = _context.REGISTRY
    recorder = EngineRecorder(
        rt,
        placement,
        model_name(vllm_config),
        registry=registry,
        options=options,
        process_start_ns=process_start_ns(),
    )
    recorder.gpu_uuids = uuids
    _logger.info(
        "otelgpu: recording vLLM engine %d (TP=%d, PP=%d) on GPUs %s",
        engine_index,
        placement.tensor_parallel_size,
        placement.pipeline_parallel_size,
        ", ".join(uuids) or "(none sampled)",
    )
    return recorder
