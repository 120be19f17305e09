"""One window's statistics over several devices: the pure twin of ``NativeCore.summary``.

A span carries the GPU context of the process's GPUs as a constant-size aggregate
(``otelgpu.otel.gpu_summary``); building it from one ``RawWindow`` per device cost a
Python object per device and a Python loop over them on the application's thread. The
native core computes the aggregate in one call; this module is its executable
specification. Floating-point operations happen in the same order in both twins
(device order, sums then one division), so they return identical values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from otelgpu.sampler import _fields as F
from otelgpu.sampler._records import NGPM, ZERO_GPM, RawSummary, RawWindow

_UTIL, _MEMORY, _ENERGY, _TEMP = F.F_UTIL, F.F_MEMORY, F.F_ENERGY, F.F_TEMP
_REASONS, _ECC_UNCORR, _GPM = F.F_REASONS, F.F_ECC_UNCORR, F.F_GPM


def summarise(
    windows: Sequence[tuple[int, RawWindow | None]], xid_events: Iterable[tuple[int, ...]]
) -> RawSummary | None:
    """The :class:`RawSummary` of ``(device index, window)`` pairs (``None`` windows:
    devices without data, skipped), in that order; ``None`` when no device has data.

    ``xid_events``: raw XID events ``(t, dev, kind, code, detail)`` of the window; only
    those of the summarised devices count. The worst device: lost, else one with new
    uncorrected ECC errors, else the most throttled, else the least utilized (the first
    of equals).
    """
    count = samples = valid = 0
    util_sum = mem_util_sum = 0.0
    util_n = 0
    util_min = util_max = 0.0
    peak = temp = reasons = eccu = 0
    energy = 0.0
    from_counter = 1
    tfrac_max = 0.0
    lost: list[int] = []
    throttled: list[int] = []
    worst = -1
    worst_score: tuple[bool, bool, float, float] = (False, False, 0.0, 0.0)
    gpm_sums = [0.0] * NGPM
    gpm_counts = [0] * NGPM
    devices: list[int] = []
    for i, w in windows:
        if w is None:
            continue
        devices.append(i)
        count += 1
        samples += w.samples
        v = w.valid
        gmean = 0.0
        if v & _UTIL:
            gmean = w.gpu_util_mean
            if not valid & _UTIL or gmean < util_min:
                util_min = gmean
            if not valid & _UTIL or w.gpu_util_max > util_max:
                util_max = w.gpu_util_max
            util_sum += gmean
            mem_util_sum += w.mem_util_mean
            util_n += 1
            valid |= _UTIL
        if v & _MEMORY:
            if not valid & _MEMORY or w.mem_used_peak > peak:
                peak = w.mem_used_peak
            valid |= _MEMORY
        if v & _ENERGY:
            energy += w.energy_j
            if not w.energy_from_counter:  # integrated power somewhere
                from_counter = 0
            valid |= _ENERGY
        if v & _TEMP:
            if not valid & _TEMP or w.temp_max > temp:
                temp = w.temp_max
            valid |= _TEMP
        tfrac = 0.0
        if v & _REASONS:
            tfrac = w.throttled_fraction
            reasons |= w.reasons
            if tfrac > 0:
                throttled.append(i)
                if tfrac > tfrac_max:
                    tfrac_max = tfrac
            valid |= _REASONS
        bad_ecc = w.ecc_uncorr_delta if v & _ECC_UNCORR else 0
        eccu += bad_ecc
        if w.lost:
            lost.append(i)
        score = (bool(w.lost), bad_ecc > 0, tfrac, -gmean)
        if worst < 0 or score > worst_score:
            worst, worst_score = i, score
        if v & _GPM:
            gpm_valid, gpm = w.gpm_valid, w.gpm
            for k in range(NGPM):
                if gpm_valid >> k & 1:
                    gpm_sums[k] += gpm[k]
                    gpm_counts[k] += 1
    if not count:
        return None
    gpm_bits = 0
    means = list(ZERO_GPM)
    for k in range(NGPM):
        if gpm_counts[k]:
            means[k] = gpm_sums[k] / gpm_counts[k]
            gpm_bits |= 1 << k
    if gpm_bits:
        valid |= _GPM
    seen = set(devices)
    xids = sorted({int(e[3]) for e in xid_events if e[1] in seen})
    return RawSummary(
        count, tuple(devices), samples, valid,
        util_sum / util_n if util_n else 0.0, util_min, util_max,
        mem_util_sum / util_n if util_n else 0.0, peak,
        energy if valid & _ENERGY else 0.0, from_counter if valid & _ENERGY else 0,
        temp, tfrac_max, reasons, eccu, worst, tuple(lost), tuple(throttled), tuple(xids),
        gpm_bits, tuple(means),
    )  # fmt: skip


__all__ = ["summarise"]
