"""Background GPU sampling: ``GpuSampler`` and the readings it returns.

``GpuSampler`` uses the native core (``otelgpu.sampler._sampler_c``, a C loop that
never holds the GIL) when it is built and not disabled by
``OTELGPU_NO_EXTENSIONS``, else the pure-Python core; ``GpuSampler.implementation``
says which. ``PyGpuSampler`` always uses the pure core; ``NativeGpuSampler`` is
``None`` when the native core is unavailable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from otelgpu import _impl
from otelgpu.sampler._sampler import (
    BaseGpuSampler,
    PyGpuSampler,
    SamplerStats,
    native_sampler_class,
)
from otelgpu.sampler._types import GpuEvent, GpuSample, WindowStats

if TYPE_CHECKING:
    GpuSampler = PyGpuSampler
    NativeGpuSampler: type[BaseGpuSampler] | None
else:
    _native = _impl.native_module("otelgpu.sampler._sampler_c")
    NativeGpuSampler = native_sampler_class(_native) if _native is not None else None
    GpuSampler = NativeGpuSampler if NativeGpuSampler is not None else PyGpuSampler

__all__ = [
    "BaseGpuSampler",
    "GpuEvent",
    "GpuSample",
    "GpuSampler",
    "NativeGpuSampler",
    "PyGpuSampler",
    "SamplerStats",
    "WindowStats",
]
