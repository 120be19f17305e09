"""Typed readings returned by ``GpuSampler``: samples, window statistics, events.

Units are in the field names. A field is ``None`` when the device does not support
it or the reading failed; unsupported readings are never replaced by placeholders.
All timestamps are ``time.time_ns()``-compatible nanoseconds (see ``GpuSampler``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from otelgpu.sampler import _fields as F

AttributeValue = str | bool | int | float | Sequence[str] | Sequence[int]


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

    @property
    def throttle_reason_names(self) -> tuple[str, ...]:
        """Names of the active clock-event reasons."""
        return F.reason_names(self.clock_event_reasons or 0)


class WindowStats(NamedTuple):
    """What one device did during ``[start_ns, end_ns]``.

    Samples used: those taken inside the window; when there are none (a window
    shorter than the sampling interval), the newest sample before it (the value in
    effect). Means are arithmetic means over those samples. Counter deltas
    (energy, ECC, PCIe, NVLink) run from the newest sample at or before the window
    start (else the first inside) to the last one used. ``energy_j`` is that counter
    delta scaled to the window length when both the window and the two samples span
    at least 100 ms (the counter's refresh), else ``power_mean_w`` x window length;
    ``energy_source`` says which.
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


def sample_from_raw(uuid: str, raw: tuple) -> GpuSample:  # type: ignore[type-arg]
    """Build a :class:`GpuSample` from a core's raw record (see ``_core_py.RawSample``)."""
    (t, valid, status, nerr, gpu, memu, used, total, pmw, temp, emj, sm, mclk, reasons,
     thr, ptx, prx, ntx, nrx, ecc_c, ecc_u, fan, pstate) = raw  # fmt: skip

    def opt(bit: int, value: int) -> int | None:
        return value if valid & bit else None

    throttle = {
        name: thr[k]
        for k, (name, _fid) in enumerate(F.THROTTLE_COUNTERS)
        if valid & (F.F_THR0 << k)
    }
    return GpuSample(
        uuid,
        t,
        F.STATUS_NAMES[status] if 0 <= status < len(F.STATUS_NAMES) else "field_errors",
        opt(F.F_UTIL, gpu),
        opt(F.F_UTIL, memu),
        opt(F.F_MEMORY, used),
        opt(F.F_MEMORY, total),
        pmw / 1000.0 if valid & F.F_POWER else None,
        opt(F.F_ENERGY, emj),
        opt(F.F_TEMP, temp),
        opt(F.F_SM_CLOCK, sm),
        opt(F.F_MEM_CLOCK, mclk),
        opt(F.F_REASONS, reasons),
        throttle,
        opt(F.F_PCIE_TX, ptx),
        opt(F.F_PCIE_RX, prx),
        opt(F.F_NVLINK_TX, ntx),
        opt(F.F_NVLINK_RX, nrx),
        opt(F.F_ECC_CORR, ecc_c),
        opt(F.F_ECC_UNCORR, ecc_u),
        opt(F.F_FAN, fan),
        opt(F.F_PSTATE, pstate),
        nerr,
    )


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
    raw: tuple,  # type: ignore[type-arg]
    xids: tuple[int, ...],
) -> WindowStats:
    """Build :class:`WindowStats` from a core's raw window tuple (see ``_core_py.window``)."""
    (samples, lost, valid, gmean, gmin, gmax, mmean, peak, total, pmean, pmax, energy,
     from_counter, tmax, smmean, reasons, tfrac, eccc, eccu, ptx, prx, ntx, nrx) = raw  # fmt: skip
    util = bool(valid & F.F_UTIL)
    mem = bool(valid & F.F_MEMORY)
    power = bool(valid & F.F_POWER)
    has_reasons = bool(valid & F.F_REASONS)
    has_energy = bool(valid & F.F_ENERGY)
    return WindowStats(
        uuid,
        start_ns,
        end_ns,
        samples,
        bool(lost),
        gmean if util else None,
        gmin if util else None,
        gmax if util else None,
        mmean if util else None,
        peak if mem else None,
        total if mem else None,
        pmean if power else None,
        pmax if power else None,
        energy if has_energy else None,
        ("counter" if from_counter else "power") if has_energy else None,
        tmax if valid & F.F_TEMP else None,
        smmean if valid & F.F_SM_CLOCK else None,
        reasons if has_reasons else None,
        _cached_reason_names(reasons) if has_reasons else (),
        tfrac if has_reasons else None,
        xids,
        eccc if valid & F.F_ECC_CORR else None,
        eccu if valid & F.F_ECC_UNCORR else None,
        ptx if valid & F.F_PCIE_TX else None,
        prx if valid & F.F_PCIE_RX else None,
        ntx if valid & F.F_NVLINK_TX else None,
        nrx if valid & F.F_NVLINK_RX else None,
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
