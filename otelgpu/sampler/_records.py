"""The records both sampler cores exchange: one device reading, one window's statistics.

The native core (``_sampler_c``) builds the same named tuples from its C structs
(``otg_sample_t``, ``otg_window_t`` in ``src_ext/sampler/otg_sampler.h``); field order
and meaning match them one to one.
"""

from __future__ import annotations

from typing import NamedTuple

from otelgpu.sampler import _fields as F


class RawSample(NamedTuple):
    """One device reading as both cores store it; a field counts only when its ``F_*``
    bit is set in ``valid`` (``gpm[k]`` only when bit ``k`` of ``gpm_valid`` is set)."""

    t_ns: int
    valid: int
    status: int
    nerrors: int
    gpu_util: int
    mem_util: int
    mem_used: int
    mem_total: int
    power_mw: int
    temperature_c: int
    energy_mj: int
    sm_clock_mhz: int
    mem_clock_mhz: int
    reasons: int
    throttle_ns: tuple[int, ...]
    pcie_tx: int
    pcie_rx: int
    nvlink_tx: int
    nvlink_rx: int
    ecc_corr: int
    ecc_uncorr: int
    fan_pct: int
    pstate: int
    mem_reserved: int
    mem_temp_c: int
    pcie_replay: int
    remap: tuple[int, int, int, int]  # correctable, uncorrectable, pending, failure
    enc_util: int
    dec_util: int
    gpm_valid: int
    gpm_dt_ns: int  # the GPM interval gpm[] covers, ending at t_ns
    gpm: tuple[float, ...]


class RawWindow(NamedTuple):
    """Window statistics as both cores compute them (see ``PyCore.window``)."""

    samples: int
    lost: int
    valid: int
    gpu_util_mean: float
    gpu_util_min: float
    gpu_util_max: float
    mem_util_mean: float
    mem_used_peak: int
    mem_total: int
    power_mean_w: float
    power_max_w: float
    energy_j: float
    energy_from_counter: int
    temp_max: int
    sm_clock_mean: float
    reasons: int
    throttled_fraction: float
    ecc_corr_delta: int
    ecc_uncorr_delta: int
    pcie_tx: int
    pcie_rx: int
    nvlink_tx: int
    nvlink_rx: int
    mem_reserved: int
    mem_temp_max: int
    pcie_replay_delta: int
    enc_util_mean: float
    dec_util_mean: float
    gpm_valid: int
    gpm: tuple[float, ...]


class RawSummary(NamedTuple):
    """Window statistics summed up over several devices (see ``PyCore.summary``).

    A field counts only when its ``F_*`` bit is set in ``valid`` (some device had it):
    ``F_UTIL`` (the utilization fields), ``F_MEMORY``, ``F_ENERGY``, ``F_TEMP``,
    ``F_REASONS`` (throttling) and ``F_GPM`` (``gpm[k]`` when bit ``k`` of ``gpm_valid``).
    Device positions (``worst``, ``lost``, ``throttled``) are sampler device indexes.
    """

    n_devices: int  # devices with data in the window
    devices: tuple[int, ...]  # those devices, in the order asked
    samples: int  # samples behind the figures, sum over devices
    valid: int
    gpu_util_mean: float  # mean over devices of each device's mean (percent)
    gpu_util_min: float  # lowest per-device mean (percent)
    gpu_util_max: float  # highest sample of any device (percent)
    mem_util_mean: float  # mean over devices of each device's mean (percent)
    mem_used_peak: int  # highest memory used on any device (bytes)
    energy_j: float  # sum over devices
    energy_from_counter: int  # 1 when every device's energy came from its counter
    temp_max: int  # hottest sample of any device (Celsius)
    throttled_fraction: float  # highest per-device share of throttled samples
    reasons: int  # union of the throttle reason bits
    ecc_uncorr_delta: int  # new uncorrected ECC errors, sum over devices
    worst: int  # lost, else uncorrected ECC, else most throttled, else least utilized
    lost: tuple[int, ...]  # lost devices
    throttled: tuple[int, ...]  # devices with throttled samples
    xids: tuple[int, ...]  # XID codes of the devices' events in the window, sorted, unique
    gpm_valid: int
    gpm: tuple[float, ...]  # mean over the devices that have metric k


RAW_SAMPLE_FIELDS = list(RawSample._fields)
RAW_WINDOW_FIELDS = list(RawWindow._fields)
NGPM = len(F.GPM_METRICS)
ZERO_GPM = (0.0,) * NGPM
ZERO_REMAP = (0, 0, 0, 0)

__all__ = ["RAW_SAMPLE_FIELDS", "RAW_WINDOW_FIELDS", "RawSample", "RawSummary", "RawWindow"]
