"""Field bits, throttle reasons, GPM metrics and event kinds shared by both sampler cores.

These numbers are the contract between ``src_ext/sampler/otg_sampler.h`` and the
pure-Python core; a test compares them with the native module's ``constants()``.
"""

from __future__ import annotations

F_UTIL = 1 << 0
F_MEMORY = 1 << 1
F_POWER = 1 << 2
F_ENERGY = 1 << 3
F_TEMP = 1 << 4
F_SM_CLOCK = 1 << 5
F_MEM_CLOCK = 1 << 6
F_REASONS = 1 << 7
F_THR0 = 1 << 8  # throttle_ns[k] is F_THR0 << k
F_PCIE_TX = 1 << 16
F_PCIE_RX = 1 << 17
F_NVLINK_TX = 1 << 18
F_NVLINK_RX = 1 << 19
F_ECC_CORR = 1 << 20
F_ECC_UNCORR = 1 << 21
F_FAN = 1 << 22
F_PSTATE = 1 << 23
F_MEM_RESERVED = 1 << 24  # memory v2: reserved bytes; memory used then excludes them
F_MEM_TEMP = 1 << 25  # HBM temperature (field 82)
F_PCIE_REPLAY = 1 << 26  # cumulative PCIe replays (field 94)
F_REMAP = 1 << 27  # remapped rows: correctable, uncorrectable, pending, failure
F_ENC = 1 << 28  # encoder utilization
F_DEC = 1 << 29  # decoder utilization
F_GPM = 1 << 30  # GPU Performance Monitoring metrics (Hopper and newer)
F_ALL = 0x7FFFFFFF

STATUS_OK = 0
STATUS_FIELD_ERRORS = 1
STATUS_LOST = 2
STATUS_NAMES = ("ok", "field_errors", "lost")

#: GPM metrics: (name, NVML metric id), index k = bit ``1 << k`` of ``gpm_valid``.
#: Activities are percent (0-100) of the interval; the four ``*_rate`` ones MiB/s.
GPM_METRICS: tuple[tuple[str, int], ...] = (
    ("graphics_activity", 1),
    ("sm_activity", 2),
    ("sm_occupancy", 3),
    ("integer_activity", 4),
    ("tensor_activity", 5),
    ("dfma_tensor_activity", 6),
    ("hmma_tensor_activity", 7),
    ("dmma_tensor_activity", 8),
    ("imma_tensor_activity", 9),
    ("dram_activity", 10),
    ("fp64_activity", 11),
    ("fp32_activity", 12),
    ("fp16_activity", 13),
    ("pcie_tx_rate", 20),
    ("pcie_rx_rate", 21),
    ("nvlink_rx_rate", 60),
    ("nvlink_tx_rate", 61),
)
GPM_IDS = tuple(mid for _, mid in GPM_METRICS)
GPM_ALL = (1 << len(GPM_METRICS)) - 1
#: GPM samples closer than this are not compared (the counters refresh every ~100 ms).
GPM_MIN_INTERVAL_NS = 100_000_000
#: Pseudo NVML return recorded when nvmlGpmQueryDeviceSupport says "not this device".
OFF_GPM_DEVICE = 1000
#: ...and when a GPM call answers NVML_ERROR_NO_PERMISSION (it will not change later).
OFF_GPM_NO_PERMISSION = 1001

#: Clock-event reasons meaning "clocks held down": SwPowerCap, HwSlowdown,
#: SwThermal, HwThermal, HwPowerBrake, BoardLimit, Reliability (not GpuIdle,
#: ApplicationsClocksSetting, SyncBoost or DisplayClockSetting).
THROTTLE_MASK = 0x6EC

#: The energy counter refreshes about every 100 ms on current drivers: windows whose
#: bracketing samples span less use power x time.
ENERGY_MIN_SPAN_NS = 100_000_000

#: XID waiter's nvmlEventSetWait timeout (ms); bounds how long stop() waits for it.
WAIT_MS = 100

#: Clock-event reason bits (nvml.h) and the names otelgpu reports.
REASON_NAMES: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
    0x200: "board_limit",
    0x400: "reliability",
}

#: Cumulative throttle-time counters: (name, NVML field id), index k = bit F_THR0 << k.
THROTTLE_COUNTERS: tuple[tuple[str, int], ...] = (
    ("sw_power_cap", 74),
    ("sync_boost", 76),
    ("board_limit", 77),
    ("low_utilization", 78),
    ("reliability", 79),
    ("sw_thermal_slowdown", 269),
    ("hw_thermal_slowdown", 270),
    ("hw_power_brake_slowdown", 271),
)

#: NVML field requests in the order the native core issues them: (id, scope, bit).
#: One nvmlDeviceGetFieldValues call per device and round reads energy (83, mJ),
#: volatile ECC totals (3 corrected, 4 uncorrected), throttle ns, PCIe and NVLink.
SCOPE_ALL_LINKS = 0xFFFFFFFF
FIELD_TABLE: tuple[tuple[int, int, int], ...] = (
    (83, 0, F_ENERGY),
    (3, 0, F_ECC_CORR),
    (4, 0, F_ECC_UNCORR),
    *((fid, 0, F_THR0 << k) for k, (_, fid) in enumerate(THROTTLE_COUNTERS)),
    (197, 0, F_PCIE_TX),
    (198, 0, F_PCIE_RX),
    (138, SCOPE_ALL_LINKS, F_NVLINK_TX),
    (139, SCOPE_ALL_LINKS, F_NVLINK_RX),
    (82, 0, F_MEM_TEMP),
    (94, 0, F_PCIE_REPLAY),
    (142, 0, F_REMAP),
    (143, 0, F_REMAP),
    (144, 0, F_REMAP),
    (145, 0, F_REMAP),
)
REMAP_FIRST_FIELD = 142

#: Names of the fields behind each bit, for "switched off" log lines.
FIELD_NAMES: dict[int, str] = {
    F_UTIL: "utilization",
    F_MEMORY: "memory",
    F_POWER: "power",
    F_ENERGY: "energy",
    F_TEMP: "temperature",
    F_SM_CLOCK: "sm_clock",
    F_MEM_CLOCK: "memory_clock",
    F_REASONS: "clock_event_reasons",
    **{F_THR0 << k: f"throttle_ns.{name}" for k, (name, _) in enumerate(THROTTLE_COUNTERS)},
    F_PCIE_TX: "pcie_tx_bytes",
    F_PCIE_RX: "pcie_rx_bytes",
    F_NVLINK_TX: "nvlink_tx_bytes",
    F_NVLINK_RX: "nvlink_rx_bytes",
    F_ECC_CORR: "ecc_corrected",
    F_ECC_UNCORR: "ecc_uncorrected",
    F_FAN: "fan_speed",
    F_PSTATE: "pstate",
    F_MEM_RESERVED: "memory_reserved",
    F_MEM_TEMP: "memory_temperature",
    F_PCIE_REPLAY: "pcie_replay",
    F_REMAP: "remapped_rows",
    F_ENC: "encoder_utilization",
    F_DEC: "decoder_utilization",
    F_GPM: "gpm",
}

EV_XID = 0
EV_ECC_UNCORRECTED = 1
EV_DEVICE_LOST = 2
EV_THROTTLE_START = 3
EVENT_KINDS = ("xid", "ecc_uncorrected", "device_lost", "throttle_start")

#: NVML return codes that mean the GPU is gone (GPU_IS_LOST, GPU_NOT_FOUND).
LOST_CODES = frozenset({15, 28})
#: Returns that switch a field off for good: NOT_SUPPORTED, FUNCTION_NOT_FOUND,
#: ARGUMENT_VERSION_MISMATCH (an older driver's struct version) and OFF_GPM_DEVICE.
NOT_SUPPORTED_CODES = frozenset({3, 13, 25, OFF_GPM_DEVICE, OFF_GPM_NO_PERMISSION})

#: Why a field is not sampled, by the code that switched it off.
OFF_REASONS: dict[int, str] = {
    3: "the device does not support it (NVML_ERROR_NOT_SUPPORTED)",
    13: "this driver's NVML lacks the function (NVML_ERROR_FUNCTION_NOT_FOUND)",
    25: "this driver's NVML has an older version of the call (ARGUMENT_VERSION_MISMATCH)",
    OFF_GPM_DEVICE: (
        "nvmlGpmQueryDeviceSupport: not supported on this GPU "
        "(GPM needs Hopper or newer; MIG instances need GPM permission)"
    ),
    OFF_GPM_NO_PERMISSION: (
        "NVML_ERROR_NO_PERMISSION: this process may not read GPM counters "
        "(profiling restricted to admin users, or a MIG instance without GPM access)"
    ),
}
TIMEOUT_CODE = 10


def field_names(bits: int) -> list[str]:
    """Names of the fields set in ``bits``, in bit order."""
    return [name for bit, name in sorted(FIELD_NAMES.items()) if bits & bit]


def gpm_names(bits: int) -> list[str]:
    """Names of the GPM metrics set in ``bits``, in index order."""
    return [name for k, (name, _) in enumerate(GPM_METRICS) if bits & (1 << k)]


def off_reasons(codes: tuple[int, ...]) -> dict[str, str]:
    """``{field name: why it is off}`` from a core's per-bit switch-off codes."""
    out: dict[str, str] = {}
    for bit, name in sorted(FIELD_NAMES.items()):
        code = codes[bit.bit_length() - 1]
        if code:
            out[name] = OFF_REASONS.get(code, f"NVML error {code}")
    return out


def reason_names(bits: int) -> tuple[str, ...]:
    """Names of the clock-event reasons set in ``bits`` (unknown bits as ``0x…``)."""
    names = [name for bit, name in REASON_NAMES.items() if bits & bit]
    unknown = bits & ~sum(REASON_NAMES)
    if unknown:
        names.append(hex(unknown))
    return tuple(names)
