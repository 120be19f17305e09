"""Window statistics of the pure-Python core, in three steps (the rules of otg_window).

1. :func:`locate` finds the samples a window uses and the two its counter deltas run
   between (binary search of the time-sorted ring, under the core's data lock);
2. :func:`aggregate` and :func:`gpm_means` reduce the used samples (means, extremes,
   unions; GPM interval-weighted means);
3. :func:`energy` and :func:`counter_deltas` take the counters' differences.

Floating-point operations happen in the same order as in C, so both twins return
identical ``RawWindow`` values for identical samples.
"""

from __future__ import annotations

from typing import NamedTuple

from otelgpu.sampler import _fields as F
from otelgpu.sampler._records import NGPM, ZERO_GPM, RawSample


def locate(
    ring: list[RawSample | None], first: int, n: int, cap: int, s_ns: int, e_ns: int
) -> tuple[int, int, int] | None:
    """The window ``[s_ns, e_ns]`` in a time-sorted ring (data lock held): ``(f, last,
    a)``, offsets from ``first`` of the first and last used samples and of the sample the
    counter deltas start from (the newest at or before ``s_ns``, else the first used);
    ``None`` when no sample is at or before ``e_ns``."""
    if n == 0:
        return None
    newest = ring[(first + n - 1) % cap]
    assert newest is not None
    if newest.t_ns < s_ns:
        # A window after the newest sample (a short span between two sampler rounds,
        # the common case): it uses that sample alone, without a search.
        return n - 1, n - 1, n - 1

    def at(k: int) -> RawSample:
        rec = ring[(first + k) % cap]
        assert rec is not None
        return rec

    x, y = 0, n
    while x < y:  # lo = first k with t >= s
        m = x + (y - x) // 2
        if at(m).t_ns < s_ns:
            x = m + 1
        else:
            y = m
    lo = x
    y = n
    while x < y:  # hi = first k with t > e
        m = x + (y - x) // 2
        if at(m).t_ns <= e_ns:
            x = m + 1
        else:
            y = m
    hi = x
    if hi > lo:
        f, last = lo, hi - 1
    elif lo > 0:
        f = last = lo - 1
    else:
        return None
    a = lo if (lo < n and at(lo).t_ns == s_ns) or lo == 0 else lo - 1
    return f, last, a


class _Aggregate(NamedTuple):
    valid: int
    gpu_util_mean: float
    gpu_util_min: float
    gpu_util_max: float
    mem_util_mean: float
    mem_used_peak: int
    mem_total: int
    power_mean_w: float
    power_max_w: float
    temp_max: int
    sm_clock_mean: float
    reasons: int
    throttled_fraction: float
    mem_reserved: int
    mem_temp_max: int
    enc_util_mean: float
    dec_util_mean: float


def aggregate(used: list[RawSample]) -> _Aggregate:
    """Means, extremes and unions of the gauges over the used samples (as otg_window)."""
    valid = 0
    n_util = sum_gpu = sum_mem = n_power = sum_power = max_power = 0
    n_sm = sum_sm = n_reason = n_throttled = n_enc = sum_enc = n_dec = sum_dec = 0
    min_gpu = max_gpu = 0
    peak = total = temp_max = reasons = reserved = mem_temp_max = 0
    for p in used:
        pv = p.valid
        if pv & F.F_UTIL:
            g = p.gpu_util
            if n_util == 0 or g < min_gpu:
                min_gpu = g
            if n_util == 0 or g > max_gpu:
                max_gpu = g
            sum_gpu += g
            sum_mem += p.mem_util
            n_util += 1
        if pv & F.F_MEMORY:
            if not valid & F.F_MEMORY or p.mem_used > peak:
                peak = p.mem_used
            total = p.mem_total
            valid |= F.F_MEMORY
        if pv & F.F_POWER:
            if n_power == 0 or p.power_mw > max_power:
                max_power = p.power_mw
            sum_power += p.power_mw
            n_power += 1
        if pv & F.F_TEMP:
            if not valid & F.F_TEMP or p.temperature_c > temp_max:
                temp_max = p.temperature_c
            valid |= F.F_TEMP
        if pv & F.F_SM_CLOCK:
            sum_sm += p.sm_clock_mhz
            n_sm += 1
        if pv & F.F_REASONS:
            reasons |= p.reasons
            if p.reasons & F.THROTTLE_MASK:
                n_throttled += 1
            n_reason += 1
        if pv & F.F_MEM_RESERVED:
            reserved = p.mem_reserved
            valid |= F.F_MEM_RESERVED
        if pv & F.F_MEM_TEMP:
            if not valid & F.F_MEM_TEMP or p.mem_temp_c > mem_temp_max:
                mem_temp_max = p.mem_temp_c
            valid |= F.F_MEM_TEMP
        if pv & F.F_ENC:
            sum_enc += p.enc_util
            n_enc += 1
        if pv & F.F_DEC:
            sum_dec += p.dec_util
            n_dec += 1
    gmean = gmin = gmax = mmean = pmean = pmax = smmean = tfrac = emean = dmean = 0.0
    if n_util:
        valid |= F.F_UTIL
        gmean = float(sum_gpu) / float(n_util)
        gmin, gmax = float(min_gpu), float(max_gpu)
        mmean = float(sum_mem) / float(n_util)
    if n_power:
        valid |= F.F_POWER
        pmean = float(sum_power) / float(n_power) / 1000.0
        pmax = float(max_power) / 1000.0
    if n_sm:
        valid |= F.F_SM_CLOCK
        smmean = float(sum_sm) / float(n_sm)
    if n_reason:
        valid |= F.F_REASONS
        tfrac = float(n_throttled) / float(n_reason)
    if n_enc:
        valid |= F.F_ENC
        emean = float(sum_enc) / float(n_enc)
    if n_dec:
        valid |= F.F_DEC
        dmean = float(sum_dec) / float(n_dec)
    return _Aggregate(
        valid, gmean, gmin, gmax, mmean, peak, total, pmean, pmax, temp_max, smmean,
        reasons, tfrac, reserved, mem_temp_max, emean, dmean,
    )  # fmt: skip


def gpm_means(used: list[RawSample], s_ns: int) -> tuple[int, tuple[float, ...]]:
    """Interval-weighted GPM means over the used samples with ``t > s`` (all used ones
    when there are none): ``(valid bits, values)``."""
    chosen = [p for p in used if p.t_ns > s_ns] or used
    sums = [0.0] * NGPM
    weights = [0.0] * NGPM
    # While every sample has every metric, all weights are the same running sum: keep
    # one scalar (the same additions in the same order as otg_window's per-metric sums).
    w_all = 0.0
    uniform = True
    for p in chosen:
        if not p.valid & F.F_GPM:
            continue
        dt = float(p.gpm_dt_ns)
        if uniform and p.gpm_valid == F.GPM_ALL:
            sums = [acc + v * dt for acc, v in zip(sums, p.gpm, strict=True)]
            w_all += dt
            continue
        if uniform:
            uniform = False
            weights = [w_all] * NGPM
        for j in range(NGPM):
            if p.gpm_valid & (1 << j):
                sums[j] += p.gpm[j] * dt
                weights[j] += dt
    if uniform:
        weights = [w_all] * NGPM
    valid = 0
    values = list(ZERO_GPM)
    for j in range(NGPM):
        if weights[j] > 0:
            values[j] = sums[j] / weights[j]
            valid |= 1 << j
    return valid, tuple(values)


def energy(
    pa: RawSample, pb: RawSample, distinct: bool, agg: _Aggregate, s_ns: int, e_ns: int
) -> tuple[float | None, int]:
    """Energy over the window: the counter delta from ``pa`` to ``pb`` (the samples the
    deltas run between; ``distinct``: two ring slots) scaled to the window when both span
    the counter's refresh, else mean power x length; ``(joules, from_counter)``."""
    if (
        distinct
        and pa.valid & pb.valid & F.F_ENERGY
        and pb.energy_mj >= pa.energy_mj
        and e_ns - s_ns >= F.ENERGY_MIN_SPAN_NS
        and pb.t_ns - pa.t_ns >= F.ENERGY_MIN_SPAN_NS
    ):
        joules = (
            float(pb.energy_mj - pa.energy_mj)
            * float(e_ns - s_ns)
            / float(pb.t_ns - pa.t_ns)
            / 1000.0
        )
        return joules, 1
    if agg.valid & F.F_POWER:
        return agg.power_mean_w * float(e_ns - s_ns) / 1e9, 0
    return None, 0


def counter_deltas(pa: RawSample, pb: RawSample) -> tuple[int, int, int, int, int, int, int, int]:
    """Deltas of ECC, PCIe, NVLink and PCIe-replay counters from ``pa`` to ``pb`` (0 and
    no bit when either lacks the field or the counter went backwards), then their bits."""
    both = pa.valid & pb.valid
    out: list[int] = []
    bits = 0
    for bit, name in _COUNTERS:
        va, vb = getattr(pa, name), getattr(pb, name)
        if both & bit and vb >= va:
            out.append(vb - va)
            bits |= bit
        else:
            out.append(0)
    return (*out, bits)  # type: ignore[return-value]


_COUNTERS = (
    (F.F_ECC_CORR, "ecc_corr"),
    (F.F_ECC_UNCORR, "ecc_uncorr"),
    (F.F_PCIE_TX, "pcie_tx"),
    (F.F_PCIE_RX, "pcie_rx"),
    (F.F_NVLINK_TX, "nvlink_tx"),
    (F.F_NVLINK_RX, "nvlink_rx"),
    (F.F_PCIE_REPLAY, "pcie_replay"),
)


__all__ = ["aggregate", "counter_deltas", "energy", "gpm_means", "locate"]
