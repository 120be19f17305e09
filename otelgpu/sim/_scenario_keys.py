"""Scenario vocabulary: format limits, device keys, feature bits, event kinds, and the
error every scenario problem raises. Shared by the model, validation and loading.
"""

from __future__ import annotations

from otelgpu.errors import ConfigurationError
from otelgpu.sim.gpm import GPM_KEYS, NO_PERMISSION_KEY

FORMAT_VERSION = 1
MAX_GPUS = 16
MAX_STEPS = 64
MAX_PROCESSES = 256  # after "all" expansion
MAX_EVENTS = 3072  # the library holds 4096; the rest is room for inject()
_GIB = 1 << 30
_MIB = 1 << 20

#: Features a device can lack (queries then return NVML_ERROR_NOT_SUPPORTED); the value
#: is the bit the C library uses.
FEATURES: dict[str, int] = {
    "ecc": 1 << 0,
    "fan": 1 << 1,
    "power": 1 << 2,
    "energy": 1 << 3,
    "temperature": 1 << 4,
    "nvlink": 1 << 5,
    "remapped_rows": 1 << 6,
    "pcie": 1 << 7,
    "processes": 1 << 8,
    "utilization": 1 << 9,
    "clock_reasons": 1 << 10,
    "memory_v2": 1 << 11,
    "clocks": 1 << 12,
    "pstate": 1 << 13,
    "events": 1 << 14,
    "samples": 1 << 15,
    "retired_pages": 1 << 16,
    "gpm": 1 << 17,
}

#: Clock-event (throttle) reasons a throttle window can set, as NVML bits.
THROTTLE_REASONS: dict[str, int] = {
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
}

#: ``driver.init_error`` names and the nvmlReturn_t that nvmlInit then returns.
INIT_ERRORS: dict[str, int] = {
    "driver_not_loaded": 9,
    "no_permission": 4,
    "lib_rm_version_mismatch": 18,
    "unknown": 999,
}

#: Event kinds and their code in the normalized form.
EVENT_KINDS: dict[str, int] = {
    "xid": 1,
    "gpu_lost": 2,
    "ecc": 3,
    "throttle": 4,
    "remap": 5,
    "slow": 6,
}

_PATTERN_KEYS: dict[str, tuple[str, ...]] = {
    "constant": ("value",),
    "square": ("high", "low", "period_s", "low_s", "offset_s"),
    "ramp": ("from", "to", "start_s", "duration_s"),
    "bursts": ("base", "peak", "period_s", "burst_s", "seed"),
    "steps": ("points",),
}
_PATTERN_OPTIONAL = {"offset_s": 0.0}

# Device keys: name -> kind of value.
_DEVICE_KEYS: dict[str, str] = {
    "model": "model",
    "name": "str",
    "uuid": "str",
    "serial": "str",
    "pci_bus_id": "str",
    "pci_device_id": "uint",
    "memory_gib": "pos",
    "reserved_mib": "nonneg",
    "bar1_gib": "nonneg",
    "architecture": "arch",
    "compute_capability": "cc",
    "power_limit_w": "pos",
    "default_power_limit_w": "pos",
    "min_power_limit_w": "pos",
    "max_power_limit_w": "pos",
    "idle_power_w": "nonneg",
    "max_power_w": "pos",
    "sm_clock_mhz": "pos",
    "sm_clock_idle_mhz": "pos",
    "mem_clock_mhz": "pos",
    "video_clock_mhz": "pos",
    "ecc": "bool",
    "fans": "uint",
    "nvlink_links": "uint",
    "pcie_gen": "uint",
    "pcie_width": "uint",
    "ambient_c": "float",
    "thermal_c_per_w": "nonneg",
    "thermal_tau_s": "pos",
    "slowdown_temp_c": "pos",
    "shutdown_temp_c": "pos",
    "mem_temp_offset_c": "float",
    "thermal_clock_factor": "fraction",
    "pcie_tx_mb_s": "nonneg",
    "pcie_rx_mb_s": "nonneg",
    "nvlink_tx_mb_s": "nonneg",
    "nvlink_rx_mb_s": "nonneg",
    "ecc_aggregate_corrected": "uint",
    "ecc_aggregate_uncorrected": "uint",
    "unsupported": "features",
    "mig_capable": "bool",
    "utilization": "percent_pattern",
    "memory_utilization": "percent_pattern",
    "memory_used_gib": "pattern",
    "power_w": "pattern",
    **dict.fromkeys(GPM_KEYS, "percent_pattern"),
    NO_PERMISSION_KEY: "bool",
}

#: Upper bounds of device keys: far beyond any real board, small enough that every value
#: stays finite and exact through the byte/milliwatt conversions and the C library's types.
_DEVICE_LIMITS: dict[str, float] = {
    "memory_gib": 16384,
    "reserved_mib": 16384 * 1024,
    "bar1_gib": 16384,
    "memory_used_gib": 16384,
    "pci_device_id": 0xFFFFFFFF,
    "power_limit_w": 100_000,
    "default_power_limit_w": 100_000,
    "min_power_limit_w": 100_000,
    "max_power_limit_w": 100_000,
    "idle_power_w": 100_000,
    "max_power_w": 100_000,
    "power_w": 100_000,
    "sm_clock_mhz": 100_000,
    "sm_clock_idle_mhz": 100_000,
    "mem_clock_mhz": 100_000,
    "video_clock_mhz": 100_000,
    "fans": 64,
    "nvlink_links": 64,
    "pcie_gen": 16,
    "pcie_width": 64,
    "ambient_c": 1000,
    "thermal_c_per_w": 1000,
    "thermal_tau_s": 1e6,
    "slowdown_temp_c": 1000,
    "shutdown_temp_c": 1000,
    "mem_temp_offset_c": 1000,
    "ecc_aggregate_corrected": 2**62,
    "ecc_aggregate_uncorrected": 2**62,
}
_DEFAULT_LIMIT = 1e12  # rates (MB/s) and anything else numeric

#: A scenario file is a small hand-written document: bounded size and nesting.
MAX_SCENARIO_BYTES = 1 << 20
MAX_NESTING = 16

_TOP_KEYS = (
    "version",
    "name",
    "description",
    "duration_s",
    "driver",
    "gpus",
    "gpu",
    "process",
    "event",
)
_DRIVER_KEYS = ("version", "cuda_version", "nvml_version", "init_error", "latency_ms")
_PROCESS_KEYS = ("gpu", "pid", "name", "memory_gib", "start_s", "end_s", "sm_util", "type")
_EVENT_KEYS: dict[str, tuple[str, ...]] = {
    "xid": ("code", "contained", "companions"),
    "gpu_lost": (),
    "ecc": ("corrected", "uncorrected", "duration_s"),
    "throttle": ("reason", "duration_s", "clock_factor", "power_cap_w"),
    "remap": ("correctable", "uncorrectable", "pending", "failure"),
    "slow": ("latency_ms", "duration_s"),
}
_EVENT_COMMON = ("at_s", "gpu", "kind")


class ScenarioError(ConfigurationError):
    """A scenario file is missing or invalid.

    ``source`` is the file (or ``<dict>``), ``setting`` the dotted key, e.g.
    ``event[2].kind``; the message names both and the accepted values.
    """

    def __init__(self, source: str, key: str, value: object, accepted: str) -> None:
        self.source = source
        super().__init__(f"{source}: {key}", value, accepted)
