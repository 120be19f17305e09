"""Static device description shared by discovery, both sampler twins and the metrics."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DeviceDetails:
    """Static identity and limits of a physical GPU, read once at discovery.

    Each is ``None`` where NVML cannot read it (consumer boards have no serial; MIG
    instances report their parent's values).
    """

    vbios_version: str | None = None
    serial: str | None = None
    slowdown_temp_c: int | None = None  # NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    shutdown_temp_c: int | None = None  # NVML_TEMPERATURE_THRESHOLD_SHUTDOWN


@dataclass(frozen=True)
class DeviceInfo:
    """One device this process samples; immutable, identified by its UUID everywhere.

    Attributes:
        uuid: NVML UUID (``GPU-…``, or ``MIG-…`` for a MIG instance).
        nvml_index: NVML's index of the physical GPU (of the parent for a MIG
            instance). NVML order is not CUDA order; never use it to match CUDA devices.
        cuda_index: position among this process's CUDA-visible devices, or ``None``
            when the device was named explicitly and is not CUDA-visible.
        name: product name, e.g. ``NVIDIA H100 80GB HBM3``.
        pci_bus_id: ``%08X:%02X:%02X.0`` bus id of the (parent) GPU.
        memory_total_bytes: framebuffer size in bytes.
        compute_capability: ``(major, minor)`` or ``None`` when unknown.
        parent_uuid: the physical GPU's UUID for a MIG instance, else ``None``.
        details: static identity and limits (VBIOS, serial, temperature thresholds),
            each ``None`` where NVML cannot read it.
    """

    uuid: str
    nvml_index: int
    cuda_index: int | None
    name: str
    pci_bus_id: str
    memory_total_bytes: int
    compute_capability: tuple[int, int] | None = None
    parent_uuid: str | None = None
    details: DeviceDetails = field(default_factory=DeviceDetails)

    vendor: str = "nvidia"

    @property
    def is_mig(self) -> bool:
        """True for a MIG instance."""
        return self.parent_uuid is not None

    @property
    def vbios_version(self) -> str | None:
        """VBIOS version (``hw.firmware_version``), e.g. ``96.00.89.00.01``."""
        return self.details.vbios_version

    @property
    def serial(self) -> str | None:
        """Board serial number (``hw.serial_number``); ``None`` on consumer boards."""
        return self.details.serial

    def attributes(self) -> dict[str, str]:
        """Semantic-convention attributes identifying this device (``hw.*``)."""
        attrs = {"hw.id": self.uuid, "hw.name": self.name, "hw.vendor": self.vendor}
        attrs["hw.type"] = "gpu"
        if self.parent_uuid is not None:
            attrs["hw.parent"] = self.parent_uuid
        return attrs
