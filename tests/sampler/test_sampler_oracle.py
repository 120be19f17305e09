"""Window statistics against a naive reference (filter the retained samples, compute
the documented rules directly) on varied data with ring wrap-around; concurrent
readers while the loop writes; a driver without the event API."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from otelgpu import sim
from otelgpu.sampler import BaseGpuSampler, GpuSample, WindowStats

VARIED = {
    "utilization": {
        "kind": "bursts",
        "base": 10,
        "peak": 95,
        "period_s": 1.3,
        "burst_s": 0.4,
        "seed": 3,
    },
    "memory_utilization": {"kind": "ramp", "from": 5, "to": 60, "start_s": 0, "duration_s": 6},
    "memory_used_gib": {"kind": "ramp", "from": 1, "to": 30, "start_s": 0, "duration_s": 6},
}


def _mean(values: list[int]) -> float | None:
    return float(sum(values)) / float(len(values)) if values else None


def oracle(retained: list[GpuSample], s: int, e: int) -> dict[str, Any] | None:
    """The WindowStats rules of the docstring, written the obvious way."""
    inside = [k for k, x in enumerate(retained) if s <= x.time_ns <= e]
    if inside:
        used = inside
    else:
        before = [k for k, x in enumerate(retained) if x.time_ns < s]
        if not before:
            return None
        used = [before[-1]]
    at_or_before = [k for k, x in enumerate(retained) if x.time_ns <= s]
    a = at_or_before[-1] if at_or_before else used[0]
    b = used[-1]
    xs = [retained[k] for k in used]
    util = [x.gpu_util_pct for x in xs if x.gpu_util_pct is not None]
    power = [round(x.power_w * 1000) for x in xs if x.power_w is not None]
    reasons = [x.clock_event_reasons for x in xs if x.clock_event_reasons is not None]
    power_mean = float(sum(power)) / float(len(power)) / 1000.0 if power else None
    pa, pb = retained[a], retained[b]
    if (
        a < b
        and pa.energy_mj is not None
        and pb.energy_mj is not None
        and pb.energy_mj >= pa.energy_mj
        and e - s >= 100_000_000
        and pb.time_ns - pa.time_ns >= 100_000_000
    ):
        energy = (
            float(pb.energy_mj - pa.energy_mj)
            * float(e - s)
            / float(pb.time_ns - pa.time_ns)
            / 1000.0
        )
    elif power_mean is not None:
        energy = power_mean * float(e - s) / 1e9
    else:
        energy = None
    return {
        "samples": len(used),
        "gpu_util_mean_pct": _mean(util),
        "gpu_util_min_pct": float(min(util)) if util else None,
        "gpu_util_max_pct": float(max(util)) if util else None,
        "memory_used_peak_bytes": max(
            x.memory_used_bytes for x in xs if x.memory_used_bytes is not None
        ),
        "power_mean_w": power_mean,
        "power_max_w": max(power) / 1000.0 if power else None,
        "energy_j": energy,
        "throttled_fraction": sum(1 for r in reasons if r & 0x6EC) / len(reasons)
        if reasons
        else None,
        "ecc_uncorrected_delta": pb.ecc_uncorrected - pa.ecc_uncorrected,  # type: ignore[operator]
        "pcie_tx_bytes": pb.pcie_tx_bytes - pa.pcie_tx_bytes,  # type: ignore[operator]
    }


def test_windows_match_a_naive_reference(
    sim_with: Callable[..., sim.SimGpu],
    make_sampler: Callable[..., BaseGpuSampler],
) -> None:
    gpu = sim_with(**VARIED)
    sampler = make_sampler(interval_s=0.1, history_s=2.0)  # 21 slots: the ring wraps
    uuid = sampler.devices[0].uuid
    rng = random.Random(11)
    history: list[GpuSample] = []
    for k in range(60):
        if k == 20:
            gpu.inject("throttle", gpu=0, reason="sw_power_cap", duration_s=1.5)
        if k == 30:
            gpu.inject("ecc", gpu=0, uncorrected=2, corrected=1)
        sampler.sample_once(timestamp_ns=gpu.time_ns())
        latest = sampler.latest(uuid)
        assert latest is not None
        history.append(latest)
        gpu.advance(rng.choice((0.03, 0.1, 0.1, 0.25)))
        if k < 15:
            continue
        retained = history[-21:]
        stamps = [x.time_ns for x in retained]
        lo, hi = stamps[0] - 500_000_000, stamps[-1] + 500_000_000
        for _ in range(25):
            s = rng.choice(stamps) if rng.random() < 0.3 else rng.randrange(lo, hi)
            e = rng.choice(stamps) if rng.random() < 0.3 else rng.randrange(lo, hi)
            if e < s:
                s, e = e, s
            got: WindowStats | None = sampler.window(uuid, s, e)
            want = oracle(retained, s, e)
            if want is None:
                assert got is None, (s, e)
                continue
            assert got is not None
            for field, value in want.items():
                assert getattr(got, field) == pytest.approx(value, rel=1e-12), field


def test_concurrent_readers_see_consistent_rings(
    sim_gpu: sim.SimGpu, make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    sampler = make_sampler(interval_s=0.002, history_s=0.05)  # 26 slots, wrapping constantly
    uuids = [d.uuid for d in sampler.devices]
    errors: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        last = 0
        while not stop.is_set():
            for uuid in uuids:
                s = sampler.latest(uuid)
                w = sampler.window(uuid, 0, 2**62)
                if s is None or w is None:
                    continue
                if s.uuid != uuid or s.status != "ok" or s.gpu_util_pct not in (20, 80):
                    errors.append(f"torn sample {s}")
                if not 1 <= w.samples <= 26:
                    errors.append(f"window of {w.samples} samples")
                if uuid == uuids[0]:
                    if s.time_ns < last:
                        errors.append("time went back")
                    last = s.time_ns

    threads = [threading.Thread(target=reader) for _ in range(2)]
    sampler.start()
    for t in threads:
        t.start()
    # Half a second of reading, and at least until the rings wrapped (two readers that
    # never release the GIL starve a pure-Python sampler on a loaded 2-core machine).
    time.sleep(0.5)
    deadline = time.monotonic() + 20
    while sampler.stats().overwritten < 26 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join()
    assert sampler.stop()
    assert errors == []
    stats = sampler.stats()
    retained = 0
    for u in uuids:
        window = sampler.window(u, 0, 2**62)
        assert window is not None
        retained += window.samples
    assert stats.samples == retained + stats.overwritten
    assert stats.overwritten > 0


def test_driver_without_events(
    sim_with: Callable[..., sim.SimGpu],
    make_sampler: Callable[..., BaseGpuSampler],
) -> None:
    gpu = sim_with(unsupported=["events"])
    before = set(threading.enumerate())
    sampler = make_sampler(interval_s=0.02)
    sampler.start()
    assert sampler.running and not sampler.events_supported
    # no XID waiter of its own (an earlier test's sampler is not this one)
    assert [t.name for t in set(threading.enumerate()) - before if "xid" in t.name] == []
    gpu.inject("gpu_lost", gpu=1)  # still found through the failing calls
    deadline = time.monotonic() + 5
    while not sampler.lost(sampler.devices[1].uuid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sampler.lost(sampler.devices[1].uuid)
    assert [e.kind for e in sampler.events(0, 2**62)] == ["device_lost"]
