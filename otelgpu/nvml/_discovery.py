"""Which GPUs this process samples, by UUID.

NVML ignores ``CUDA_VISIBLE_DEVICES`` and numbers GPUs its own way (by PCI bus id),
so the process's view is rebuilt here the way CUDA builds it:

1. order the physical GPUs as CUDA does: by PCI bus id when
   ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, else FASTEST_FIRST (compute capability
   descending, then PCI bus id);
2. apply ``CUDA_VISIBLE_DEVICES``: integers index that order, ``GPU-…`` entries are
   UUIDs or unique UUID prefixes, ``MIG-…`` entries MIG instances; the first entry
   that matches nothing ends the list (CUDA's truncation rule); duplicates are skipped;
3. pick the devices to sample: an explicit ``devices=`` always wins; else, under a
   distributed launcher, the rank's own device (``torch.cuda.current_device()`` once
   ``torch.distributed`` and CUDA are initialised, else ``LOCAL_RANK``), so ranks on
   one node do not export duplicate series; else every visible device.

The pure functions (:func:`visible_devices`, :func:`select_devices`) take an
inventory and the environment as arguments; :func:`discover` reads both from NVML
(through pynvml) and ``os.environ``.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from otelgpu.errors import ConfigurationError
from otelgpu.nvml._details import read_details
from otelgpu.nvml._library import NvmlUnavailableError, library_path, pynvml_init
from otelgpu.nvml._types import DeviceDetails, DeviceInfo

_logger = logging.getLogger(__name__)

DeviceSpec = str | int | DeviceInfo
"""An explicit device: a UUID (or unique prefix, or MIG UUID), a CUDA ordinal, a DeviceInfo."""


@dataclass(frozen=True)
class MigInstance:
    """A MIG instance of a physical GPU, as NVML reports it."""

    uuid: str
    name: str
    memory_total_bytes: int


@dataclass(frozen=True)
class PhysicalGpu:
    """One physical GPU as NVML enumerates it."""

    nvml_index: int
    uuid: str
    name: str
    pci_bus_id: str
    memory_total_bytes: int
    compute_capability: tuple[int, int] | None = None
    migs: tuple[MigInstance, ...] = ()
    extra: DeviceDetails = field(default_factory=DeviceDetails)


def _device_info(gpu: PhysicalGpu, cuda_index: int | None) -> DeviceInfo:
    # DeviceInfo's fields in their order: the GPU's own, but for its CUDA ordinal.
    return DeviceInfo(
        gpu.uuid, gpu.nvml_index, cuda_index, gpu.name, gpu.pci_bus_id,
        gpu.memory_total_bytes, gpu.compute_capability, details=gpu.extra,
    )  # fmt: skip


def _mig_info(gpu: PhysicalGpu, mig: MigInstance, cuda_index: int | None) -> DeviceInfo:
    # A MIG instance is its GPU with its own identity and memory.
    return replace(
        _device_info(gpu, cuda_index),
        uuid=mig.uuid,
        name=mig.name,
        memory_total_bytes=mig.memory_total_bytes,
        parent_uuid=gpu.uuid,
    )


def cuda_order(gpus: Iterable[PhysicalGpu], device_order: str | None) -> list[PhysicalGpu]:
    """Physical GPUs in CUDA's enumeration order (``CUDA_DEVICE_ORDER``)."""
    by_bus = sorted(gpus, key=lambda g: g.pci_bus_id.upper())
    if (device_order or "").strip().upper() == "PCI_BUS_ID":
        return by_bus
    # FASTEST_FIRST: higher compute capability first; sorted() is stable, so equal
    # capabilities keep PCI bus order.
    return sorted(by_bus, key=lambda g: g.compute_capability or (0, 0), reverse=True)


def _match_uuid(token: str, candidates: Sequence[tuple[str, DeviceInfo]]) -> DeviceInfo | None:
    exact = [info for uuid, info in candidates if uuid.lower() == token.lower()]
    if exact:
        return exact[0]
    prefixed = [info for uuid, info in candidates if uuid.lower().startswith(token.lower())]
    return prefixed[0] if len(prefixed) == 1 else None


def visible_devices(
    gpus: Sequence[PhysicalGpu],
    cuda_visible_devices: str | None,
    device_order: str | None = None,
) -> list[DeviceInfo]:
    """The devices CUDA would show this process, in CUDA ordinal order.

    Args:
        gpus: NVML inventory.
        cuda_visible_devices: the ``CUDA_VISIBLE_DEVICES`` value, ``None`` when unset.
        device_order: the ``CUDA_DEVICE_ORDER`` value.
    """
    ordered = cuda_order(gpus, device_order)
    if cuda_visible_devices is None:
        return [_device_info(g, i) for i, g in enumerate(ordered)]
    physical = [(g.uuid, _device_info(g, None)) for g in ordered]
    migs = [(m.uuid, _mig_info(g, m, None)) for g in ordered for m in g.migs]
    result: list[DeviceInfo] = []
    seen: set[str] = set()
    for raw in cuda_visible_devices.split(","):
        token = raw.strip()
        info: DeviceInfo | None = None
        if token.lstrip("-").isdigit():
            index = int(token)
            info = physical[index][1] if 0 <= index < len(physical) else None
        elif token.upper().startswith("MIG-"):
            info = _match_uuid(token, migs)
        elif token.upper().startswith("GPU-"):
            info = _match_uuid(token, physical)
        if info is None:
            if token:
                _logger.debug("CUDA_VISIBLE_DEVICES entry %r matches no device; list ends", token)
            break
        if info.uuid in seen:
            continue
        seen.add(info.uuid)
        result.append(replace(info, cuda_index=len(result)))
    return result


def _torch_current_device() -> int | None:
    """CUDA ordinal of this rank's device when torch.distributed and CUDA are initialised."""
    torch: Any = sys.modules.get("torch")
    dist: Any = sys.modules.get("torch.distributed")
    if torch is None or dist is None:
        return None
    try:
        if not (dist.is_available() and dist.is_initialized() and torch.cuda.is_initialized()):
            return None
        return int(torch.cuda.current_device())
    except Exception:  # noqa: BLE001 - torch in any strange state: fall back to LOCAL_RANK
        return None


def _local_rank(environ: Mapping[str, str]) -> int | None:
    raw = environ.get("LOCAL_RANK", "").strip()
    if not raw:
        return None
    try:
        rank = int(raw)
    except ValueError:
        _logger.warning("otelgpu: ignoring LOCAL_RANK=%r (not an integer)", raw)
        return None
    return rank if rank >= 0 else None


def select_devices(
    visible: Sequence[DeviceInfo],
    *,
    local_rank: int | None = None,
    current_device: int | None = None,
) -> list[DeviceInfo]:
    """The visible devices this process samples when no explicit list is given.

    Args:
        visible: :func:`visible_devices` output.
        local_rank: ``LOCAL_RANK`` of a distributed launcher, or ``None``.
        current_device: ``torch.cuda.current_device()`` when torch.distributed runs.
    """
    rank_device = current_device if current_device is not None else local_rank
    if rank_device is None or len(visible) <= 1:
        return list(visible)
    if rank_device < len(visible):
        return [visible[rank_device]]
    _logger.warning(
        "otelgpu: rank device %d is not among the %d visible GPUs; sampling all of them",
        rank_device,
        len(visible),
    )
    return list(visible)


def resolve_explicit(
    devices: Iterable[DeviceSpec],
    gpus: Sequence[PhysicalGpu],
    visible: Sequence[DeviceInfo],
) -> list[DeviceInfo]:
    """Resolve an explicit ``devices=`` list (UUIDs, unique prefixes, CUDA ordinals).

    Raises:
        ConfigurationError: an entry matches no device (or an ambiguous prefix).
    """
    visible_by_uuid = {d.uuid: d for d in visible}
    everything: list[tuple[str, DeviceInfo]] = []
    for g in gpus:
        everything.append((g.uuid, visible_by_uuid.get(g.uuid) or _device_info(g, None)))
        everything += [
            (m.uuid, visible_by_uuid.get(m.uuid) or _mig_info(g, m, None)) for m in g.migs
        ]
    result: list[DeviceInfo] = []
    for spec in devices:
        info: DeviceInfo | None
        if isinstance(spec, DeviceInfo):
            info = _match_uuid(spec.uuid, everything)
        elif isinstance(spec, bool):
            info = None
        elif isinstance(spec, int):
            info = visible[spec] if 0 <= spec < len(visible) else None
        else:
            token = str(spec).strip()
            info = _match_uuid(token, everything) if token else None
        if info is None:
            raise ConfigurationError(
                "devices",
                spec,
                "UUIDs (or unique UUID prefixes) of present GPUs/MIG instances, or CUDA "
                f"ordinals 0..{len(visible) - 1}",
            )
        if all(info.uuid != r.uuid for r in result):
            result.append(info)
    return result


def inventory(library: str | None = None) -> list[PhysicalGpu]:
    """Enumerate the physical GPUs (and their MIG instances) through pynvml.

    Raises:
        NvmlUnavailableError: NVML cannot be loaded or initialised, or enumeration failed.
    """
    pynvml = pynvml_init(library_path(library))
    try:
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailableError(f"NVML device enumeration failed: {exc}") from exc
        gpus = []
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                gpus.append(_physical(pynvml, index, handle))
            except pynvml.NVMLError as exc:  # noqa: PERF203 - one lost GPU must not hide the rest
                _logger.warning("otelgpu: skipping GPU %d (NVML index): %s", index, exc)
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _physical(pynvml: Any, index: int, handle: object) -> PhysicalGpu:
    nv = pynvml
    uuid = _text(nv.nvmlDeviceGetUUID(handle))
    name = _text(nv.nvmlDeviceGetName(handle))
    pci = nv.nvmlDeviceGetPciInfo(handle)
    memory = nv.nvmlDeviceGetMemoryInfo(handle)
    cc: tuple[int, int] | None
    try:
        major, minor = nv.nvmlDeviceGetCudaComputeCapability(handle)
        cc = (int(major), int(minor))
    except nv.NVMLError:
        cc = None
    return PhysicalGpu(
        nvml_index=index,
        uuid=uuid,
        name=name,
        pci_bus_id=_text(pci.busId),
        memory_total_bytes=int(memory.total),
        compute_capability=cc,
        migs=tuple(_migs(nv, handle)),
        extra=read_details(nv, handle),
    )


def _migs(nv: Any, handle: object) -> list[MigInstance]:
    try:
        current, _pending = nv.nvmlDeviceGetMigMode(handle)
        if current != 1:
            return []
        count = nv.nvmlDeviceGetMaxMigDeviceCount(handle)
    except nv.NVMLError:
        return []  # no MIG support (pre-Ampere, old driver, simulator without MIG)
    result = []
    for slot in range(int(count)):
        try:
            mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            memory = nv.nvmlDeviceGetMemoryInfo(mig)
            result.append(
                MigInstance(
                    uuid=_text(nv.nvmlDeviceGetUUID(mig)),
                    name=_text(nv.nvmlDeviceGetName(mig)),
                    memory_total_bytes=int(memory.total),
                )
            )
        except nv.NVMLError:  # noqa: PERF203 - empty slots answer NOT_FOUND
            continue
    return result


def discover(
    devices: Iterable[DeviceSpec] | None = None,
    *,
    library: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[DeviceInfo, ...]:
    """The devices this process should sample (see the module docstring).

    Raises:
        NvmlUnavailableError: NVML cannot be loaded or initialised.
        ConfigurationError: an explicit device matches nothing.
    """
    env = os.environ if environ is None else environ
    gpus = inventory(library)
    visible = visible_devices(gpus, env.get("CUDA_VISIBLE_DEVICES"), env.get("CUDA_DEVICE_ORDER"))
    if devices is not None:
        return tuple(resolve_explicit(devices, gpus, visible))
    return tuple(
        select_devices(visible, local_rank=_local_rank(env), current_device=_torch_current_device())
    )
