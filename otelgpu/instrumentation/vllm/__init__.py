"""vLLM auto-instrumentation: request latencies, queue, KV cache, errors, cold start, and one
span per request with the GPU context of the engine's devices.

Two ways in (see docs/vllm.md):

* **zero code** for ``vllm serve`` and every ``AsyncLLM``: vLLM loads
  :class:`~otelgpu.instrumentation.vllm.stat_logger.OtelGpuStatLogger` through the
  ``vllm.stat_logger_plugins`` entry point ``otelgpu``;
* :class:`VllmInstrumentor` (entry point ``opentelemetry_instrumentor: otelgpu_vllm``) adds
  request trace-context propagation and covers the offline ``LLM`` / ``LLMEngine``, which
  never load stat-logger plugins.

Importing this package does not import vLLM (``import vllm`` takes seconds); only the
``OtelGpuStatLogger`` attribute does, on first access.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)

from otelgpu.instrumentation.vllm import _patch
from otelgpu.instrumentation.vllm.package import _instruments

if TYPE_CHECKING:
    from otelgpu.instrumentation.vllm.stat_logger import OtelGpuStatLogger


def _stat_logger_class() -> Any:
    from otelgpu.instrumentation.vllm.stat_logger import OtelGpuStatLogger

    return OtelGpuStatLogger


class VllmInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Instruments vLLM in this process; vLLM itself is imported lazily (or never).

    ``instrument(**kwargs)`` options:

    * ``trace_context`` (default: ``OTELGPU_VLLM_TRACE_CONTEXT``, on): wrap
      ``AsyncLLM.add_request`` / ``LLMEngine.add_request`` so each request span joins the
      caller's trace (W3C ``trace_headers`` or the active span);
    * ``offline`` (default on): make ``LLMEngine.from_engine_args`` /
      ``from_vllm_config`` -- hence the offline ``LLM`` class -- turn stats on and add
      ``OtelGpuStatLogger``.

    The stat logger itself (and the otelgpu runtime it starts with ``otelgpu.instrument()``
    when none is running) owns the tracer and meter providers; ``tracer_provider`` /
    ``meter_provider`` keyword arguments are not used.
    """

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        from otelgpu.instrumentation.vllm._setup import trace_context_enabled

        trace_context = kwargs.get("trace_context")
        if trace_context is None:
            trace_context = trace_context_enabled()
        if trace_context:
            _patch.install_trace_context()
        if kwargs.get("offline", True):
            _patch.install_offline(_stat_logger_class)

    def _uninstrument(self, **kwargs: Any) -> None:
        _patch.uninstall_trace_context()
        _patch.uninstall_offline()


def __getattr__(name: str) -> Any:
    if name == "OtelGpuStatLogger":
        return _stat_logger_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["OtelGpuStatLogger", "VllmInstrumentor"]
