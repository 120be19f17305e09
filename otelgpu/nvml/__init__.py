"""NVML access shared by the sampler twins: library resolution and device discovery.

* :func:`library_path` — which ``libnvidia-ml.so.1`` to load (``OTELGPU_NVML_LIBRARY``);
* :func:`discover` — which devices this process samples, by UUID
  (``CUDA_VISIBLE_DEVICES``, ``CUDA_DEVICE_ORDER``, ``LOCAL_RANK``, torch.distributed);
* :class:`DeviceInfo` — the immutable description every other module uses.
"""

from __future__ import annotations

from otelgpu.nvml._discovery import (
    DeviceSpec,
    MigInstance,
    PhysicalGpu,
    cuda_order,
    discover,
    inventory,
    resolve_explicit,
    select_devices,
    visible_devices,
)
from otelgpu.nvml._library import (
    DEFAULT_LIBRARY,
    ENV_NVML_LIBRARY,
    NvmlUnavailableError,
    library_path,
    pynvml_init,
    pynvml_module,
)
from otelgpu.nvml._types import DeviceDetails, DeviceInfo

__all__ = [
    "DEFAULT_LIBRARY",
    "ENV_NVML_LIBRARY",
    "DeviceDetails",
    "DeviceInfo",
    "DeviceSpec",
    "MigInstance",
    "NvmlUnavailableError",
    "PhysicalGpu",
    "cuda_order",
    "discover",
    "inventory",
    "library_path",
    "pynvml_init",
    "pynvml_module",
    "resolve_explicit",
    "select_devices",
    "visible_devices",
]
