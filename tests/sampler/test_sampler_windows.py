"""Window statistics against numbers computed from the scenario, ring wrap-around, and
exact agreement of the two twins on the same samples."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import pytest
from fixtures.sim import Twins

from otelgpu import _impl, sim
from otelgpu.sampler import BaseGpuSampler, PyGpuSampler

IDLE_W, MAX_W = 70.0, 690.0


def _power(util_pct: float) -> float:
    return IDLE_W + (MAX_W - IDLE_W) * util_pct / 100


def _util(t_s: float) -> float:
    """SMALL_SCENARIO: 20 % during [10k, 10k + 2) s, else 80 %."""
    return 20.0 if (t_s % 10) < 2 else 80.0


def _sample_series(gpu: sim.SimGpu, sampler: BaseGpuSampler, n: int, step_s: float) -> list[int]:
    stamps = []
    for _ in range(n):
        stamps.append(gpu.time_ns())
        sampler.sample_once(timestamp_ns=stamps[-1])
        gpu.advance(step_s)
    return stamps


def test_window_statistics_match_the_scenario(
    sim_gpu: sim.SimGpu, make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    sampler = make_sampler()
    stamps = _sample_series(sim_gpu, sampler, 200, 0.1)  # t = 0.0 .. 19.9 s
    times = [k * 0.1 for k in range(200)]
    utils = [_util(t + 1e-9) for t in times]
    for device in sampler.devices:
        w = sampler.window(device.uuid, stamps[0], stamps[-1])
        assert w is not None
        assert w.samples == 200 and not w.lost
        assert w.gpu_util_mean_pct == pytest.approx(sum(utils) / len(utils))
        assert (w.gpu_util_min_pct, w.gpu_util_max_pct) == (20.0, 80.0)
        assert w.memory_util_mean_pct == 40.0
        assert w.power_mean_w == pytest.approx(sum(_power(u) for u in utils) / 200, rel=1e-3)
        assert w.power_max_w == pytest.approx(_power(80), rel=1e-3)
        # Energy: the counter's delta = the integral of the scenario's power over 19.9 s.
        expected_j = 4.0 * _power(20) + 15.9 * _power(80)
        assert w.energy_source == "counter"
        assert w.energy_j == pytest.approx(expected_j, rel=2e-3)
        assert w.memory_used_peak_bytes is not None
        assert w.memory_total_bytes == device.memory_total_bytes
        assert w.throttled_fraction == 0.0 and w.throttle_reasons == 0
        assert w.xids == () and w.ecc_uncorrected_delta == 0
        assert w.pcie_tx_bytes is not None and w.pcie_tx_bytes > 0
        assert w.duration_s == pytest.approx(19.9)
    # The dip alone: samples at t = 10.0 .. 11.9.
    dip = sampler.window(sampler.devices[0].uuid, stamps[100], stamps[119])
    assert dip is not None and dip.samples == 20 and dip.gpu_util_max_pct == 20.0
    assert dip.energy_j == pytest.approx(1.9 * _power(20), rel=2e-3)
    assert set(sampler.windows(stamps[0], stamps[-1])) == {d.uuid for d in sampler.devices}


def test_short_window_uses_power_times_time(
    sim_gpu: sim.SimGpu, make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    sampler = make_sampler()
    sim_gpu.advance(3.0)
    stamps = _sample_series(sim_gpu, sampler, 3, 0.1)
    uuid = sampler.devices[0].uuid
    # 50 ms between two samples: no sample inside, the one in effect is used.
    w = sampler.window(uuid, stamps[1] + 20_000_000, stamps[1] + 70_000_000)
    assert w is not None and w.samples == 1
    assert w.energy_source == "power"
    assert w.energy_j == pytest.approx(_power(80) * 0.05, rel=1e-3)
    # A window shorter than the counter refresh (samples 100 ms apart at most) too.
    w2 = sampler.window(uuid, stamps[0] + 1, stamps[1])
    assert w2 is not None and w2.energy_source == "power"
    # Before the first sample there is no data; an inverted window is empty.
    assert sampler.window(uuid, stamps[0] - 10**9, stamps[0] - 1) is None
    assert sampler.window(uuid, stamps[2], stamps[0]) is None


def test_ring_wraps_around_and_counts_overwrites(
    sim_gpu: sim.SimGpu, make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    sampler = make_sampler(interval_s=0.1, history_s=1.0)  # 11 slots per device
    assert sampler.history_s == pytest.approx(1.0)
    stamps = _sample_series(sim_gpu, sampler, 30, 0.1)
    uuid = sampler.devices[0].uuid
    latest = sampler.latest(uuid)
    assert latest is not None and latest.time_ns == stamps[-1]
    everything = sampler.window(uuid, 0, 2**62)
    assert everything is not None and everything.samples == 11
    assert sampler.window(uuid, stamps[0], stamps[10]) is None  # aged out
    last = sampler.window(uuid, stamps[19], stamps[29])
    assert last is not None and last.samples == 11
    stats = sampler.stats()
    assert stats.samples == 60 and stats.overwritten == 2 * (30 - 11)


def test_events_ring_is_bounded(
    sim_gpu: sim.SimGpu, make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    sampler = make_sampler(event_capacity=16)
    uuid = sampler.devices[0].uuid
    assert sampler.event_count() == 0
    for k in range(40):  # every throttle window start is an event
        sim_gpu.inject("throttle", gpu=0, reason="sw_power_cap", duration_s=0.05)
        sampler.sample_once(timestamp_ns=sim_gpu.time_ns())
        sim_gpu.advance(0.1)
        sampler.sample_once(timestamp_ns=sim_gpu.time_ns())
        sim_gpu.advance(0.1)
        assert k < 40
    events = sampler.events(0, 2**62, uuid=uuid)
    assert len(events) == 16
    assert sampler.stats().events_dropped == 40 - 16
    assert sampler.event_count() == 40  # every event published, retained or not
    assert [e.time_ns for e in events] == sorted(e.time_ns for e in events)


@pytest.mark.skipif(_impl.NO_EXTENSIONS, reason="only one twin in this run")
def test_twins_agree_exactly(sim_gpu: sim.SimGpu, twins: Twins) -> None:
    stamps = []
    for k in range(300):
        if k == 100:
            sim_gpu.inject("throttle", gpu=1, reason="sw_thermal", duration_s=3.0)
        if k == 150:
            sim_gpu.inject("ecc", gpu=0, corrected=2, uncorrected=1)
        stamps.append(twins.sample(sim_gpu))
        sim_gpu.advance(0.07)
    rng = random.Random(7)
    py, native = twins.py, twins.native
    for device in py.devices:
        assert py.latest(device.uuid) == native.latest(device.uuid)
        for _ in range(300):
            a, b = sorted(rng.randrange(stamps[0] - 10**9, stamps[-1] + 10**9) for _ in "ab")
            assert py.window(device.uuid, a, b) == native.window(device.uuid, a, b)
    assert py.events(0, 2**62) == native.events(0, 2**62)
    assert len(py.events(0, 2**62)) >= 2


def test_pure_window_memo_returns_what_a_fresh_computation_does(sim_gpu: sim.SimGpu) -> None:
    """The pure core keeps a window's parts, and a summary, by the ring positions they
    come from; windows that share them (short spans after the newest sample, windows with
    samples on their start) must come out as a core without memory computes them: energy
    scaled to each window, lost flags by the window's end, device order as asked."""
    kept = PyGpuSampler(history_s=2.0, interval_s=0.1)  # 21 slots: the ring wraps
    fresh = PyGpuSampler(history_s=2.0, interval_s=0.1)  # forgets before every query
    try:
        rng = random.Random(11)
        stamps: list[int] = []
        uuids = [d.uuid for d in kept.devices]
        orders = (None, [uuids[1], uuids[0]], [uuids[1]])
        kept_core: Any = kept._core
        fresh_core: Any = fresh._core

        class Counting(dict):  # type: ignore[type-arg]
            hits = 0

            def get(self, key: Any, default: Any = None) -> Any:
                found = super().get(key, default)
                Counting.hits += found is not None
                return found

        kept_core._summary_memo = Counting()

        def forget() -> None:
            for d in fresh_core._dev:
                d.memo.clear()
            fresh_core._summary_memo.clear()

        with_data = 0
        for k in range(60):
            if k == 30:
                sim_gpu.inject("ecc", gpu=0, corrected=3, uncorrected=1)
            if k == 45:
                sim_gpu.inject("gpu_lost", gpu=1)
            stamps.append(sim_gpu.time_ns())
            kept.sample_once(timestamp_ns=stamps[-1])
            fresh.sample_once(timestamp_ns=stamps[-1])
            sim_gpu.advance(0.1)
            for _ in range(10):
                newest = stamps[-1]
                s = rng.choice(
                    [
                        newest + rng.randrange(1, 10**8),
                        rng.choice(stamps),
                        rng.randrange(stamps[0], newest + 10**8),
                    ]
                )
                e = s + rng.choice([0, 10**6, rng.randrange(0, 5 * 10**8)])
                for u in uuids:
                    forget()
                    expected = fresh.window(u, s, e)
                    assert kept.window(u, s, e) == expected
                    with_data += expected is not None
                for order in orders:
                    forget()
                    assert kept.summary(s, e, order) == fresh.summary(s, e, order)
        assert Counting.hits > 100 and with_data > 600  # the memo was in use, windows had data
        assert all(len(d.memo) <= 32 for d in kept_core._dev) and len(kept_core._summary_memo) <= 32
        # An XID 79 between two rounds marks GPU 0 lost (as the XID waiter does): windows
        # over the same samples are lost only when they end after it.
        last = kept.latest(uuids[0])
        assert last is not None
        lost_t = last.time_ns + 50_000_000
        with kept_core._data_lock:
            kept_core._mark_lost(0, lost_t, 79)
        before = kept.summary(last.time_ns + 1, lost_t - 1, [uuids[0]])
        after = kept.summary(last.time_ns + 1, lost_t + 1, [uuids[0]])
        assert before is not None and before.lost == ()
        assert after is not None and after.lost == (0,)
    finally:
        kept.close()
        fresh.close()


def test_pure_sampling_round_leaves_the_next_windows_summary_ready(sim_gpu: sim.SimGpu) -> None:
    """The pure sampling thread summarises a window after each round (``_prewarm``): the
    next span's summary is found remembered, and equals one computed afresh."""
    sampler = PyGpuSampler(interval_s=0.02)
    try:
        core: Any = sampler._core
        sampler.start()
        deadline = time.monotonic() + 5
        while len(core._summary_memo) == 0 or sampler.stats().ticks < 3:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        sampler.stop()
        newest = max(s.time_ns for d in sampler.devices if (s := sampler.latest(d.uuid)))
        start, end = newest + 1_000, newest + 2_000_000
        key = core._after_newest(range(len(core._dev)), start, end)
        assert key in core._summary_memo  # left by the thread's last round
        remembered = sampler.summary(start, end)
        for d in core._dev:
            d.memo.clear()
        core._summary_memo.clear()
        assert remembered is not None and remembered == sampler.summary(start, end)
        assert remembered.n_devices == len(sampler.devices) and remembered.energy_j > 0
    finally:
        sampler.close()
