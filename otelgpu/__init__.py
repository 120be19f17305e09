"""otelgpu: OpenTelemetry instrumentation that tells ML teams what their GPUs do.

One line turns it on::

    import otelgpu
    otelgpu.instrument()

Public API (see README.md): ``instrument``, ``shutdown``, ``step``, ``request``,
``NATIVE``, and the subpackages ``otelgpu.sketch``, ``otelgpu.sampler`` and
``otelgpu.sim``. ``import otelgpu`` stays cheap: the OpenTelemetry pipeline is
imported on first use of ``instrument``/``step``/``request``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from otelgpu import _impl
from otelgpu.version import __version__

NATIVE: bool = _impl.native_loaded()
"""True when the whole native core (Cython/C) is in use; False with the pure-Python twins."""

if TYPE_CHECKING:
    from otelgpu._api import instrument, request, shutdown, step

_LAZY = {"instrument", "shutdown", "step", "request"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from otelgpu import _api

        value = getattr(_api, name)
        # Kept as a module attribute: ``otelgpu.request(...)`` on every request must not
        # go through this function again (a Python call per lookup).
        globals()[name] = value
        return value
    raise AttributeError(f"module 'otelgpu' has no attribute {name!r}")


__all__ = ["NATIVE", "__version__", "instrument", "request", "shutdown", "step"]
