"""Typed readings returned by ``GpuSampler``: samples, window statistics, events.

Units are in the field names. A field is ``None`` when the device does not support
it or the reading failed; unsupported readings are never replaced by placeholders.
All timestamps are ``time.time_ns()``-compatible nanoseconds (see ``GpuSampler``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from otelgpu.sampler import _fields as F

if TYPE_CHECKING:
    from otelgpu.sampler._records import RawSample, RawWindow

AttributeValue = str | bool | int | float | Sequence[str] | Sequence[int]

#: WindowStats field of each GPM metric (index order of ``_fields.GPM_METRICS``):
#: activities in percent (``*_pct``), PCIe/NVLink rates in MiB/s (``*_mib_s``).
GPM_WINDOW_FIELDS: tuple[str, ...] = tuple(
    f"{name}_mib_s" if name.endswith("_rate") else f"{name}_pct" for name, _ in F.GPM_METRICS
)


class GpuSample(NamedTuple):
    """One reading of one device."""

    uuid: str
    time_ns: int
    status: str  # "ok" | "field_errors" | "lost"
    gpu_util_pct: int | None
    memory_util_pct: int | None  # memory-controller busy time, percent
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_w: float | None
    energy_mj: int | None  # cumulative since the driver loaded
    temperature_c: int | None
    sm_clock_mhz: int | None
    memory_clock_mhz: int | None
    clock_event_reasons: int | None  # NVML bitmask, see throttle_reason_names
    throttle_ns: dict[str, int]  # cumulative throttle time per reason (supported ones)
    pcie_tx_bytes: int | None  # cumulative; may wrap
    pcie_rx_bytes: int | None
    nvlink_tx_bytes: int | None  # cumulative, all links
    nvlink_rx_bytes: int | None
    ecc_corrected: int | None  # volatile (since driver load) totals
    ecc_uncorrected: int | None
    fan_speed_pct: int | None
    pstate: int | None
    field_errors: int  # reads that failed in this sample (not counting unsupported fields)
    memory_reserved_bytes: int | None = None  # memory v2 only; memory used then excludes it
    memory_temperature_c: int | None = None  # HBM temperature
    pcie_replay_count: int | None = None  # cumulative PCIe replays
    remapped_rows: dict[str, int] | None = None  # correctable/uncorrectable/pending/failure
    encoder_util_pct: int | None = None
    decoder_util_pct: int | None = None
    #: GPM metrics over the interval ending at time_ns ({} when GPM is off or too soon):
    #: ``sm_activity`` etc. in percent, ``*_rate`` in MiB/s.
    gpm: dict[str, float] | None = None
    gpm_interval_ns: int | None = None

    @property
    def throttle_reason_names(self) -> tuple[str, ...]:
        """Names of the active clock-event reasons."""
        return F.reason_names(self.clock_event_reasons or 0)

    @property
    def remapped_rows_pending(self) -> int | None:
        """1 while a row remap waits for a GPU reset (``None``: not readable)."""
        return None if self.remapped_rows is None else self.remapped_rows["pending"]

    @property
    def remapped_rows_failure(self) -> int | None:
        """1 after a row remap failed (``None``: not readable)."""
        return None if self.remapped_rows is None else self.remapped_rows["failure"]


class WindowStats(NamedTuple):
    """What one device did during ``[start_ns, end_ns]``.

    Samples used: those taken inside the window; when there are none (a window
    shorter than the sampling interval), the newest sample before it (the value in
    effect). Means are arithmetic means over those samples. Counter deltas
    (energy, ECC, PCIe, NVLink) run from the newest sample at or before the window
    start (else the first inside) to the last one used. ``energy_j`` is that counter
    delta scaled to the window length when both the window and the two samples span
    at least 100 ms (the counter's refresh), else ``power_mean_w`` x window length;
    ``energy_source`` says which. GPM metrics (``sm_activity_pct``,
    ``tensor_activity_pct``, ``dram_activity_pct``…) are means of the GPM intervals of
    the samples after ``start_ns``, weighted by interval length (GPM samples are taken
    at least 100 ms apart); ``None`` on GPUs without GPM.
    """

    uuid: str
    start_ns: int
    end_ns: int
    samples: int
    lost: bool  # the device was lost (e.g. XID 79) at or before end_ns
    gpu_util_mean_pct: float | None
    gpu_util_min_pct: float | None
    gpu_util_max_pct: float | None
    memory_util_mean_pct: float | None
    memory_used_peak_bytes: int | None
    memory_total_bytes: int | None
    power_mean_w: float | None
    power_max_w: float | None
    energy_j: float | None
    energy_source: str | None  # "counter" | "power"
    temperature_max_c: int | None
    sm_clock_mean_mhz: float | None
    throttle_reasons: int | None  # union (bitwise OR) of clock-event reasons
    throttle_reason_names: tuple[str, ...]
    throttled_fraction: float | None  # share of samples with a throttling reason active
    xids: tuple[int, ...]  # XID codes delivered during the window, in order
    ecc_corrected_delta: int | None
    ecc_uncorrected_delta: int | None
    pcie_tx_bytes: int | None
    pcie_rx_bytes: int | None
    nvlink_tx_bytes: int | None
    nvlink_rx_bytes: int | None
    memory_reserved_bytes: int | None = None  # newest sample's (memory v2 only)
    memory_temperature_max_c: int | None = None  # HBM temperature
    pcie_replay_delta: int | None = None
    encoder_util_mean_pct: float | None = None
    decoder_util_mean_pct: float | None = None
    # GPM (Hopper+): means over the GPM intervals of the samples with t > start_ns,
    # weighted by interval length; None where the GPU has no GPM.
    graphics_activity_pct: float | None = None
    sm_activity_pct: float | None = None
    sm_occupancy_pct: float | None = None
    integer_activity_pct: float | None = None
    tensor_activity_pct: float | None = None
    dfma_tensor_activity_pct: float | None = None
    hmma_tensor_activity_pct: float | None = None
    dmma_tensor_activity_pct: float | None = None
    imma_tensor_activity_pct: float | None = None
    dram_activity_pct: float | None = None
    fp64_activity_pct: float | None = None
    fp32_activity_pct: float | None = None
    fp16_activity_pct: float | None = None
    pcie_tx_rate_mib_s: float | None = None
    pcie_rx_rate_mib_s: float | None = None
    nvlink_rx_rate_mib_s: float | None = None
    nvlink_tx_rate_mib_s: float | None = None

    @property
    def duration_s(self) -> float:
        """Window length in seconds."""
        return (self.end_ns - self.start_ns) / 1e9

    def as_attributes(self, prefix: str = "gpu.") -> dict[str, AttributeValue]:
        """Span attributes ``{prefix}{field}``; ``None`` fields and empty tuples are left out.

        ``uuid`` becomes ``{prefix}uuid``; the window bounds are omitted (the span
        has them).
        """
        attrs: dict[str, AttributeValue] = {}
        for name, value in zip(self._fields, self, strict=True):
            if name in ("start_ns", "end_ns") or value is None or value == ():
                continue
            attrs[prefix + name] = value
        return attrs


class GpuEvent(NamedTuple):
    """Something that happened to a device; the pipeline turns these into span events.

    ``kind`` is one of ``"xid"`` (code = XID number, from the NVML event API),
    ``"ecc_uncorrected"`` (code = new uncorrected errors), ``"device_lost"``
    (code = NVML error, or 79 when XID 79 announced it), ``"throttle_start"``
    (code = bitmask of throttle reasons that became active).
    """

    time_ns: int
    uuid: str
    kind: str
    code: int
    detail: str


def sample_from_raw(uuid: str, raw: RawSample) -> GpuSample:
    """Build a :class:`GpuSample` from a core's raw record."""
    valid = raw.valid

    def opt(bit: int, value: int) -> int | None:
        return value if valid & bit else None

    throttle = {
        name: raw.throttle_ns[k]
        for k, (name, _fid) in enumerate(F.THROTTLE_COUNTERS)
        if valid & (F.F_THR0 << k)
    }
    status = raw.status
    gpm = (
        {name: raw.gpm[k] for k, (name, _) in enumerate(F.GPM_METRICS) if raw.gpm_valid >> k & 1}
        if valid & F.F_GPM
        else {}
    )
    return GpuSample(
        uuid,
        raw.t_ns,
        F.STATUS_NAMES[status] if 0 <= status < len(F.STATUS_NAMES) else "field_errors",
        opt(F.F_UTIL, raw.gpu_util),
        opt(F.F_UTIL, raw.mem_util),
        opt(F.F_MEMORY, raw.mem_used),
        opt(F.F_MEMORY, raw.mem_total),
        raw.power_mw / 1000.0 if valid & F.F_POWER else None,
        opt(F.F_ENERGY, raw.energy_mj),
        opt(F.F_TEMP, raw.temperature_c),
        opt(F.F_SM_CLOCK, raw.sm_clock_mhz),
        opt(F.F_MEM_CLOCK, raw.mem_clock_mhz),
        opt(F.F_REASONS, raw.reasons),
        throttle,
        opt(F.F_PCIE_TX, raw.pcie_tx),
        opt(F.F_PCIE_RX, raw.pcie_rx),
        opt(F.F_NVLINK_TX, raw.nvlink_tx),
        opt(F.F_NVLINK_RX, raw.nvlink_rx),
        opt(F.F_ECC_CORR, raw.ecc_corr),
        opt(F.F_ECC_UNCORR, raw.ecc_uncorr),
        opt(F.F_FAN, raw.fan_pct),
        opt(F.F_PSTATE, raw.pstate),
        raw.nerrors,
        opt(F.F_MEM_RESERVED, raw.mem_reserved),
        opt(F.F_MEM_TEMP, raw.mem_temp_c),
        opt(F.F_PCIE_REPLAY, raw.pcie_replay),
        dict(zip(_REMAP_NAMES, raw.remap, strict=True)) if valid & F.F_REMAP else None,
        opt(F.F_ENC, raw.enc_util),
        opt(F.F_DEC, raw.dec_util),
        gpm,
        raw.gpm_dt_ns if valid & F.F_GPM else None,
    )


_REMAP_NAMES = ("correctable", "uncorrectable", "pending", "failure")

_reason_cache: dict[int, tuple[str, ...]] = {}


def _cached_reason_names(bits: int) -> tuple[str, ...]:
    names = _reason_cache.get(bits)
    if names is None:
        names = F.reason_names(bits)
        if len(_reason_cache) < 4096:
            _reason_cache[bits] = names
    return names


def window_from_raw(
    uuid: str,
    start_ns: int,
    end_ns: int,
    raw: RawWindow,
    xids: tuple[int, ...],
) -> WindowStats:
    """Build :class:`WindowStats` from a core's raw window."""
    valid = raw.valid
    util = bool(valid & F.F_UTIL)
    mem = bool(valid & F.F_MEMORY)
    power = bool(valid & F.F_POWER)
    has_reasons = bool(valid & F.F_REASONS)
    has_energy = bool(valid & F.F_ENERGY)
    reasons = raw.reasons
    gpm_valid = raw.gpm_valid if valid & F.F_GPM else 0
    gpm = raw.gpm
    return WindowStats(
        uuid,
        start_ns,
        end_ns,
        raw.samples,
        bool(raw.lost),
        raw.gpu_util_mean if util else None,
        raw.gpu_util_min if util else None,
        raw.gpu_util_max if util else None,
        raw.mem_util_mean if util else None,
        raw.mem_used_peak if mem else None,
        raw.mem_total if mem else None,
        raw.power_mean_w if power else None,
        raw.power_max_w if power else None,
        raw.energy_j if has_energy else None,
        ("counter" if raw.energy_from_counter else "power") if has_energy else None,
        raw.temp_max if valid & F.F_TEMP else None,
        raw.sm_clock_mean if valid & F.F_SM_CLOCK else None,
        reasons if has_reasons else None,
        _cached_reason_names(reasons) if has_reasons else (),
        raw.throttled_fraction if has_reasons else None,
        xids,
        raw.ecc_corr_delta if valid & F.F_ECC_CORR else None,
        raw.ecc_uncorr_delta if valid & F.F_ECC_UNCORR else None,
        raw.pcie_tx if valid & F.F_PCIE_TX else None,
        raw.pcie_rx if valid & F.F_PCIE_RX else None,
        raw.nvlink_tx if valid & F.F_NVLINK_TX else None,
        raw.nvlink_rx if valid & F.F_NVLINK_RX else None,
        raw.mem_reserved if valid & F.F_MEM_RESERVED else None,
        raw.mem_temp_max if valid & F.F_MEM_TEMP else None,
        raw.pcie_replay_delta if valid & F.F_PCIE_REPLAY else None,
        raw.enc_util_mean if valid & F.F_ENC else None,
        raw.dec_util_mean if valid & F.F_DEC else None,
        *(gpm[k] if gpm_valid >> k & 1 else None for k in range(len(GPM_WINDOW_FIELDS))),
    )


_XID_TEXT = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup",
    48: "double-bit ECC error",
    63: "page retirement / row remapping pending",
    64: "page retirement / row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
}


def event_detail(kind: int, code: int, detail: int) -> str:
    """Human-readable detail of a raw event."""
    if kind == F.EV_XID:
        text = _XID_TEXT.get(code)
        return f"Xid {code}" + (f": {text}" if text else "")
    if kind == F.EV_ECC_UNCORRECTED:
        return f"{code} new uncorrected ECC error(s), {detail} since driver load"
    if kind == F.EV_DEVICE_LOST:
        if code == 79:
            return "Xid 79: GPU has fallen off the bus"
        return f"NVML error {code} (GPU is lost)" if code in F.LOST_CODES else f"NVML error {code}"
    if kind == F.EV_THROTTLE_START:
        return ",".join(F.reason_names(code))
    return ""


def event_from_raw(uuids: Sequence[str], raw: tuple[int, int, int, int, int]) -> GpuEvent:
    """Build a :class:`GpuEvent` from a core's raw ``(t, dev, kind, code, detail)``."""
    t, dev, kind, code, detail = raw
    name = F.EVENT_KINDS[kind] if 0 <= kind < len(F.EVENT_KINDS) else "unknown"
    return GpuEvent(t, uuids[dev], name, code, event_detail(kind, code, detail))
