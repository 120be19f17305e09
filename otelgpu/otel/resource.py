"""The OpenTelemetry Resource of an instrumented process.

Attributes (semantic-convention names where they exist, ``otelgpu.*`` otherwise):

* service: ``service.name`` (setting ``service_name``), ``service.instance.id``;
* host/process: ``host.name``, ``host.arch``, ``process.pid``, ``process.executable.name``,
  ``process.runtime.name``, ``process.runtime.version``;
* GPUs: ``otelgpu.gpu.count``, ``otelgpu.gpu.driver_version``, ``otelgpu.gpu.cuda_version``
  (per-GPU identity -- ``hw.id``, ``hw.model``, ``hw.serial_number``... -- is on the GPU
  series and spans, never a list here);
* distributed job: ``otelgpu.dist.rank``, ``otelgpu.dist.local_rank``,
  ``otelgpu.dist.world_size`` (torchrun, then SLURM, then Open MPI variables);
* ``slurm.job.id``, ``slurm.job.name``, ``slurm.cluster.name`` when under SLURM;
* ``k8s.pod.name``, ``k8s.namespace.name``, ``k8s.node.name``, ``k8s.pod.uid`` in Kubernetes;
* the simulated-GPU marker from ``otelgpu.sim.resource_attributes()`` when the simulator is on;
* ``otelgpu.version``; then ``resource_attributes`` from the settings (they win).

``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` are merged by the SDK's
``Resource.create``; the attributes above take precedence over them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import socket
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.resources import Resource

from otelgpu._settings import Settings
from otelgpu.version import __version__

_logger = logging.getLogger("otelgpu")

#: One id per process; a forked child gets a new one (see ``new_instance_id``).
_INSTANCE_ID = str(uuid.uuid4())


@dataclass(frozen=True)
class GpuInventory:
    """What the resource says about the GPUs this process samples."""

    uuids: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    driver_version: str | None = None
    cuda_version: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    devices: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """UUID -> the recommended ``hw.*`` attributes NVML could read (``hw.model``,
    ``hw.driver_version``, ``hw.firmware_version``, ``hw.serial_number``); they go on
    the GPU series, not on the resource."""
    unreadable: tuple[str, ...] = ()
    """Devices NVML listed but could not read (``"index N: <error>"``), e.g. a GPU lost
    before start; the rest of the inventory is still complete."""


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _device_attributes(pynvml: Any, handle: Any, name: str, driver: str) -> dict[str, str]:
    """The semconv-recommended ``hw.*`` attributes of one device that NVML can read."""
    attrs = {"hw.model": name, "hw.driver_version": driver}
    for key, read in (
        ("hw.firmware_version", "nvmlDeviceGetVbiosVersion"),
        ("hw.serial_number", "nvmlDeviceGetSerial"),
    ):
        try:
            value = _decode(getattr(pynvml, read)(handle)).strip()
        except Exception:  # noqa: BLE001 - not readable on every board (NOT_SUPPORTED)
            continue
        if value:
            attrs[key] = value
    return attrs


def nvml_inventory(uuids: Sequence[str] | None = None) -> GpuInventory:
    """Driver/CUDA versions and device names through pynvml (the real or simulated NVML).

    ``uuids`` restricts (and orders) the devices; ``None`` lists every device. Returns
    an empty inventory when there is no NVML.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no NVML is a normal state, not an error
        _logger.debug("otelgpu: no NVML (%s)", exc)
        return GpuInventory()
    try:
        driver = _decode(pynvml.nvmlSystemGetDriverVersion())
        try:
            cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
            cuda_version: str | None = f"{cuda // 1000}.{cuda % 1000 // 10}"
        except Exception:  # noqa: BLE001 - optional
            cuda_version = None
        found: dict[str, str] = {}
        devices: dict[str, dict[str, str]] = {}
        unreadable: list[str] = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            # One device at a time: a lost or faulted GPU (GPU_IS_LOST, UNKNOWN) must not
            # hide the others; it is named in one line and left out of the inventory.
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                uuid = _decode(pynvml.nvmlDeviceGetUUID(handle))
                found[uuid] = _decode(pynvml.nvmlDeviceGetName(handle))
            except Exception as exc:  # noqa: BLE001 - reported below, per device
                unreadable.append(f"index {i}: {exc!r}")
                continue
            devices[uuid] = _device_attributes(pynvml, handle, found[uuid], driver)
        if unreadable:
            _logger.warning(
                "otelgpu: GPU(s) left out of the inventory (NVML could not read them): %s",
                "; ".join(unreadable),
            )
        order = list(uuids) if uuids is not None else list(found)
        return GpuInventory(
            uuids=tuple(order),
            names=tuple(found.get(u, "") for u in order),
            driver_version=driver,
            cuda_version=cuda_version,
            devices={u: devices[u] for u in order if u in devices},
            unreadable=tuple(unreadable),
        )
    except Exception as exc:  # noqa: BLE001 - a partial NVML is reported, not raised
        _logger.warning("otelgpu: could not read the GPU inventory: %r", exc)
        return GpuInventory()
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _first_int(environ: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            try:
                return int(value)
            except ValueError:
                continue
    return None


def job_attributes(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Rank, SLURM and Kubernetes attributes from the environment."""
    env = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    for key, names in (
        ("otelgpu.dist.rank", ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")),
        ("otelgpu.dist.local_rank", ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")),
        (
            "otelgpu.dist.world_size",
            ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"),
        ),
    ):
        value = _first_int(env, *names)
        if value is not None:
            out[key] = value
    for key, name in (
        ("slurm.job.id", "SLURM_JOB_ID"),
        ("slurm.job.name", "SLURM_JOB_NAME"),
        ("slurm.cluster.name", "SLURM_CLUSTER_NAME"),
    ):
        if env.get(name):
            out[key] = env[name]
    if env.get("KUBERNETES_SERVICE_HOST"):
        pod = env.get("POD_NAME") or env.get("HOSTNAME")
        if pod:
            out["k8s.pod.name"] = pod
        namespace = env.get("POD_NAMESPACE")
        if not namespace:
            try:
                with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
                    namespace = f.read().strip()
            except OSError:
                namespace = None
        if namespace:
            out["k8s.namespace.name"] = namespace
        for key, name in (("k8s.node.name", "NODE_NAME"), ("k8s.pod.uid", "POD_UID")):
            if env.get(name):
                out[key] = env[name]
    return out


def sim_attributes() -> dict[str, Any]:
    """The simulated-GPU marker, when ``otelgpu.sim`` is active in this process."""
    try:
        from otelgpu import sim

        if sim.active() is None:
            return {}
        return dict(sim.resource_attributes())
    except Exception:  # noqa: BLE001 - the simulator is optional
        return {}


def build_resource(settings: Settings, gpus: GpuInventory | None = None) -> Resource:
    """The Resource for otelgpu's own providers (see the module docstring)."""
    attrs: dict[str, Any] = {
        "service.instance.id": _INSTANCE_ID,
        "host.name": socket.gethostname(),
        "host.arch": platform.machine(),
        "process.pid": os.getpid(),
        "process.executable.name": os.path.basename(sys.executable),
        "process.runtime.name": sys.implementation.name,
        "process.runtime.version": platform.python_version(),
        "otelgpu.version": __version__,
    }
    if gpus is not None and gpus.uuids:
        # Per-GPU identity stays on the GPU series (hw.id): list values here would become
        # kilobyte-long labels on every series in Prometheus-style stores.
        attrs["otelgpu.gpu.count"] = len(gpus.uuids)
    if gpus is not None and gpus.driver_version:
        attrs["otelgpu.gpu.driver_version"] = gpus.driver_version
    if gpus is not None and gpus.cuda_version:
        attrs["otelgpu.gpu.cuda_version"] = gpus.cuda_version
    attrs.update(job_attributes())
    attrs.update(sim_attributes())
    if settings.service_name:
        attrs["service.name"] = settings.service_name
    attrs.update(settings.resource_attributes)
    return Resource.create(attrs)


def new_instance_id() -> None:
    """Give a forked child its own ``service.instance.id``."""
    global _INSTANCE_ID
    _INSTANCE_ID = str(uuid.uuid4())
