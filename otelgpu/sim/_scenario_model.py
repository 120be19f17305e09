"""Scenario data model: patterns, processes, events and the validated :class:`Scenario`,
and their normalized text for the C library (:meth:`Scenario.to_config`).

A loaded :class:`Scenario` is treated as immutable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from otelgpu.sim._scenario_keys import (
    _GIB,
    _MIB,
    EVENT_KINDS,
    FEATURES,
    INIT_ERRORS,
    THROTTLE_REASONS,
)
from otelgpu.sim.gpm import gpm_config
from otelgpu.sim.models import ARCHITECTURES


@dataclass(frozen=True)
class Pattern:
    """A load pattern: ``kind`` and its parameters (see docs/simulator.md)."""

    kind: str
    params: Mapping[str, Any]

    def to_config(self, scale: float = 1.0) -> str:
        """Normalized text; values (not times) are multiplied by ``scale``."""
        p = self.params
        if self.kind == "constant":
            return f"constant {_num(p['value'] * scale)}"
        if self.kind == "square":
            return (
                f"square {_num(p['high'] * scale)} {_num(p['low'] * scale)} "
                f"{_num(p['period_s'])} {_num(p['low_s'])} {_num(p['offset_s'])}"
            )
        if self.kind == "ramp":
            return (
                f"ramp {_num(p['from'] * scale)} {_num(p['to'] * scale)} "
                f"{_num(p['start_s'])} {_num(p['duration_s'])}"
            )
        if self.kind == "bursts":
            return (
                f"bursts {_num(p['base'] * scale)} {_num(p['peak'] * scale)} "
                f"{_num(p['period_s'])} {_num(p['burst_s'])} {int(p['seed'])}"
            )
        points = " ".join(f"{_num(t)} {_num(v * scale)}" for t, v in p["points"])
        return f"steps {len(p['points'])} {points}"


@dataclass(frozen=True)
class Process:
    """A process running on a simulated GPU during ``[start_s, end_s)``."""

    gpu: int
    pid: int
    name: str
    memory_gib: float
    start_s: float = 0.0
    end_s: float | None = None
    sm_util: float | None = None
    type: str = "compute"


@dataclass(frozen=True)
class Event:
    """A scripted fault at ``at_s`` on GPU ``gpu`` (``None`` = every GPU)."""

    kind: str
    at_s: float
    gpu: int | None
    params: Mapping[str, Any]

    @property
    def end_s(self) -> float:
        """End of the event's window (== ``at_s`` for instantaneous events)."""
        return self.at_s + float(self.params.get("duration_s", 0.0))

    def to_config(self, start_ns: int | str | None = None) -> str:
        """The normalized ``event=`` body (``start_ns`` overrides the start)."""
        p = self.params
        a = b = c = d = 0.0
        if self.kind == "xid":
            a = p["code"]
            b = (0 if p.get("contained", True) else 1) | (0 if p.get("companions", True) else 2)
        elif self.kind == "ecc":
            a, b = p["corrected"], p["uncorrected"]
        elif self.kind == "throttle":
            a = sum(THROTTLE_REASONS[r] for r in p["reason"])
            b, c = p["clock_factor"], p["power_cap_w"]
        elif self.kind == "remap":
            a, b = p["correctable"], p["uncorrectable"]
            c, d = float(p["pending"]), float(p["failure"])
        elif self.kind == "slow":
            a = p["latency_ms"] * 1000.0
        start = _ns(self.at_s) if start_ns is None else start_ns
        gpu = -1 if self.gpu is None else self.gpu
        dur = _ns(float(p.get("duration_s", 0.0)))
        return (
            f"{gpu} {EVENT_KINDS[self.kind]} {start} {dur} {_num(a)} {_num(b)} {_num(c)} {_num(d)}"
        )


@dataclass(frozen=True)
class Scenario:
    """A validated scenario. ``devices`` holds each GPU's resolved device keys."""

    name: str
    description: str
    source: str
    driver: Mapping[str, Any]
    devices: tuple[Mapping[str, Any], ...]
    processes: tuple[Process, ...] = ()
    events: tuple[Event, ...] = ()
    duration_s: float | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def gpu_count(self) -> int:
        return len(self.devices)

    def to_config(self, clock: str = "virtual", epoch_ns: int = 0) -> str:
        """The normalized text the C library parses (``clock``: "virtual" or "wall";
        ``epoch_ns``: wall time of t = 0, 0 = when the library loads it)."""
        lines = [
            "otelgpu-sim-config 1",
            f"# scenario {self.name} ({self.source})",
            f"clock={clock}",
            f"epoch_ns={int(epoch_ns)}",
            f"init_error={INIT_ERRORS.get(self.driver['init_error'] or '', 0)}",
            f"latency_us={round(self.driver['latency_ms'] * 1000)}",
            f"driver_version={self.driver['version']}",
            f"nvml_version={self.driver['nvml_version']}",
            f"cuda_version={self.driver['cuda_version']}",
            f"gpu_count={self.gpu_count}",
        ]
        for i, dev in enumerate(self.devices):
            lines += [f"gpu.{i}.{k}={v}" for k, v in _device_config(dev).items()]
        for proc in self.processes:
            end = -1 if proc.end_s is None else _ns(proc.end_s)
            sm = -1.0 if proc.sm_util is None else proc.sm_util
            lines.append(
                f"proc={proc.gpu} {proc.pid} {round(proc.memory_gib * _GIB)} {_ns(proc.start_s)} "
                f"{end} {_num(sm)} {1 if proc.type == 'graphics' else 0} {proc.name}"
            )
        lines += [f"event={ev.to_config()}" for ev in self.events]
        return "\n".join(lines) + "\n"


def _num(v: float) -> str:
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


# The device lines of the sim's config written from one scenario field each, scaled to
# the sim's units: (config key, scenario field, scale).
_ROUNDED: tuple[tuple[str, str, float], ...] = (  # integers
    ("memory_bytes", "memory_gib", _GIB),
    ("reserved_bytes", "reserved_mib", _MIB),
    ("bar1_bytes", "bar1_gib", _GIB),
    ("power_limit_mw", "power_limit_w", 1000),
    ("default_limit_mw", "default_power_limit_w", 1000),
    ("min_limit_mw", "min_power_limit_w", 1000),
    ("max_limit_mw", "max_power_limit_w", 1000),
    ("sm_clock_max", "sm_clock_mhz", 1),
    ("sm_clock_idle", "sm_clock_idle_mhz", 1),
    ("mem_clock", "mem_clock_mhz", 1),
    ("video_clock", "video_clock_mhz", 1),
)
_NUMBERS: tuple[tuple[str, str, float], ...] = (
    ("idle_power_w", "idle_power_w", 1),
    ("max_power_w", "max_power_w", 1),
    ("ambient_c", "ambient_c", 1),
    ("thermal_c_per_w", "thermal_c_per_w", 1),
    ("thermal_tau_s", "thermal_tau_s", 1),
    ("slowdown_c", "slowdown_temp_c", 1),
    ("shutdown_c", "shutdown_temp_c", 1),
    ("mem_temp_offset_c", "mem_temp_offset_c", 1),
    ("thermal_clock_factor", "thermal_clock_factor", 1),
    ("pcie_tx_bps", "pcie_tx_mb_s", 1e6),
    ("pcie_rx_bps", "pcie_rx_mb_s", 1e6),
    ("nvlink_tx_bps", "nvlink_tx_mb_s", 1e6),
    ("nvlink_rx_bps", "nvlink_rx_mb_s", 1e6),
)
_COUNTS: tuple[tuple[str, str], ...] = (  # written as they are
    ("pci_device_id", "pci_device_id"),
    ("fans", "fans"),
    ("nvlink_links", "nvlink_links"),
    ("pcie_gen", "pcie_gen"),
    ("pcie_width", "pcie_width"),
    ("pcie_gen_max", "pcie_gen"),
    ("pcie_width_max", "pcie_width"),
    ("ecc_agg_corrected", "ecc_aggregate_corrected"),
    ("ecc_agg_uncorrected", "ecc_aggregate_uncorrected"),
)


def _device_config(dev: Mapping[str, Any]) -> dict[str, str]:
    unsupported = sum(FEATURES[f] for f in dev["unsupported"])
    major, minor = dev["compute_capability"]
    out = {
        "name": dev["name"],
        "uuid": dev["uuid"],
        "serial": dev["serial"],
        "bus_id": dev["pci_bus_id"],
        "pci_subsystem_id": str(0x16C110DE),
        "arch": str(ARCHITECTURES[dev["architecture"]]),
        "cc": f"{major} {minor}",
        "ecc": "1" if dev["ecc"] else "0",
        "unsupported": str(unsupported),
        "mig_capable": "1" if dev["mig_capable"] else "0",
        "util": dev["utilization"].to_config(),
    }
    out.update((key, str(round(dev[field] * scale))) for key, field, scale in _ROUNDED)
    out.update((key, _num(dev[field] * scale)) for key, field, scale in _NUMBERS)
    out.update((key, str(dev[field])) for key, field in _COUNTS)
    if dev.get("memory_utilization") is not None:
        out["mem_util"] = dev["memory_utilization"].to_config()
    if dev.get("memory_used_gib") is not None:
        out["mem_used"] = dev["memory_used_gib"].to_config(scale=_GIB)
    if dev.get("power_w") is not None:
        out["power"] = dev["power_w"].to_config()
    out.update(gpm_config(dev))
    return out
