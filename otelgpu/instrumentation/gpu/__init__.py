"""``GpuMetricsInstrumentor``: turns on otelgpu (GPU sampler, metrics, sketches) as an instrumentor.

Under ``opentelemetry-instrument python app.py`` the entry point
``otelgpu_gpu = otelgpu.instrumentation.gpu:GpuMetricsInstrumentor`` is loaded and
``instrument()`` called with the providers the distro configured (or none, then the
global ones), so the application needs no code change. It depends on no framework.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)

from otelgpu.environment_variables import OTELGPU_FRAMEWORKS
from otelgpu.instrumentation.gpu.package import _instruments

_SETTING_KEYS = frozenset({"tracer_provider", "meter_provider"})


class GpuMetricsInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Calls ``otelgpu.instrument()`` with the given (or global) providers."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        from otelgpu import _api, _settings

        known = {f.name for f in _settings.SETTINGS}
        settings = {k: v for k, v in kwargs.items() if k in known}
        if "frameworks" not in settings and not os.environ.get(OTELGPU_FRAMEWORKS):
            # Under opentelemetry-instrument the loader starts each framework's own entry
            # point (and honours OTEL_PYTHON_DISABLED_INSTRUMENTATIONS): don't do it twice.
            settings["frameworks"] = "none"
        _api.instrument(
            tracer_provider=kwargs.get("tracer_provider"),
            meter_provider=kwargs.get("meter_provider"),
            **settings,
        )

    def _uninstrument(self, **kwargs: Any) -> None:
        from otelgpu import _api

        _api.shutdown()


__all__ = ["GpuMetricsInstrumentor"]
