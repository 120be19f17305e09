"""What the node's NVML says about itself: driver and CUDA versions, device names, and the
GPUs that are already lost.

One pynvml session, every device read on its own: a GPU that answers ``GPU_IS_LOST``
(or any other error) is listed in :attr:`NodeInventory.lost` and never hides the others.
Callers run this off the application's thread (it makes a few NVML calls per GPU, and
a degraded driver can take a long time per call).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from otelgpu.nvml._library import NvmlUnavailableError, library_path, pynvml_init

_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LostGpu:
    """A GPU NVML enumerates but cannot open (e.g. fallen off the bus before start)."""

    nvml_index: int
    error_code: int
    error: str

    @property
    def id(self) -> str:
        """Stable identifier when the UUID cannot be read: ``nvml-index-<n>``."""
        return f"nvml-index-{self.nvml_index}"


@dataclass(frozen=True)
class NodeInventory:
    """The node's NVML view; empty when NVML is unavailable."""

    driver_version: str | None = None
    cuda_version: str | None = None
    names: dict[str, str] = field(default_factory=dict)  # uuid -> product name
    lost: tuple[LostGpu, ...] = ()
    devices: dict[str, dict[str, str]] = field(default_factory=dict)
    """UUID -> the ``hw.*`` attributes NVML could read (``hw.model``, ``hw.driver_version``,
    ``hw.firmware_version`` = VBIOS, ``hw.serial_number``)."""


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _error_code(exc: BaseException) -> int:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else -1


def _device_attributes(nv: Any, handle: Any, name: str, driver: str | None) -> dict[str, str]:
    """The semantic-convention ``hw.*`` attributes of one device that NVML can read."""
    attrs = {"hw.model": name}
    if driver:
        attrs["hw.driver_version"] = driver
    for key, read in (
        ("hw.firmware_version", "nvmlDeviceGetVbiosVersion"),
        ("hw.serial_number", "nvmlDeviceGetSerial"),
    ):
        try:
            value = _text(getattr(nv, read)(handle)).strip()
        except Exception:  # noqa: BLE001 - not readable on every board (NOT_SUPPORTED)
            continue
        if value:
            attrs[key] = value
    return attrs


def read_node(library: str | None = None) -> NodeInventory:
    """Scan the node through pynvml (see the module docstring). Never raises."""
    try:
        nv: Any = pynvml_init(library_path(library))
    except (NvmlUnavailableError, ImportError) as exc:
        _logger.debug("otelgpu: no NVML (%s)", exc)
        return NodeInventory()
    except Exception as exc:  # noqa: BLE001 - a bad library path is reported by the sampler
        _logger.debug("otelgpu: no NVML (%r)", exc)
        return NodeInventory()
    try:
        driver: str | None
        try:
            driver = _text(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError:
            driver = None
        cuda: str | None
        try:
            raw = int(nv.nvmlSystemGetCudaDriverVersion_v2())
            cuda = f"{raw // 1000}.{raw % 1000 // 10}"
        except nv.NVMLError:
            cuda = None
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as exc:
            _logger.warning("otelgpu: NVML device enumeration failed: %s", exc)
            return NodeInventory(driver, cuda)
        names: dict[str, str] = {}
        devices: dict[str, dict[str, str]] = {}
        lost: list[LostGpu] = []
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
                names[uuid] = _text(nv.nvmlDeviceGetName(handle))
            except nv.NVMLError as exc:
                lost.append(LostGpu(index, _error_code(exc), str(exc)))
                continue
            devices[uuid] = _device_attributes(nv, handle, names[uuid], driver)
        return NodeInventory(driver, cuda, names, tuple(lost), devices)
    finally:
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()
