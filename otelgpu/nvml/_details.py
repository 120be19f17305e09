"""Static details of a GPU read once at discovery: VBIOS, serial, temperature limits."""

from __future__ import annotations

from typing import Any

from otelgpu.nvml._types import DeviceDetails

_SHUTDOWN, _SLOWDOWN = 0, 1  # NVML_TEMPERATURE_THRESHOLD_*


def _text(value: Any) -> str | None:
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    text = text.strip()
    return text or None


def read_details(nv: Any, handle: object) -> DeviceDetails:
    """:class:`DeviceDetails` through pynvml; a value NVML refuses is ``None``."""

    def read(fn: str, *args: Any) -> Any:
        try:
            return getattr(nv, fn)(handle, *args)
        except (nv.NVMLError, AttributeError):
            return None

    vbios, serial = read("nvmlDeviceGetVbiosVersion"), read("nvmlDeviceGetSerial")
    slowdown = read("nvmlDeviceGetTemperatureThreshold", _SLOWDOWN)
    shutdown = read("nvmlDeviceGetTemperatureThreshold", _SHUTDOWN)
    return DeviceDetails(
        vbios_version=_text(vbios) if vbios is not None else None,
        serial=_text(serial) if serial is not None else None,
        slowdown_temp_c=int(slowdown) if slowdown is not None else None,
        shutdown_temp_c=int(shutdown) if shutdown is not None else None,
    )
