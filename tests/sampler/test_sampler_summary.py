"""``GpuSampler.summary``: one window's statistics over several GPUs in one call (the
constant-size GPU context of a span), against the per-GPU windows it sums up, and exact
agreement of the two twins."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from otelgpu import _impl, sim
from otelgpu.sampler import BaseGpuSampler, NativeGpuSampler, PyGpuSampler, WindowStats
from otelgpu.sampler import _fields as F
from otelgpu.sampler._types import GPM_WINDOW_FIELDS

FOREVER = 2**62


def _series(gpu: sim.SimGpu, samplers: list[BaseGpuSampler], n: int) -> list[int]:
    """``n`` samples 70 ms apart, GPU 1 throttled from sample 100, new uncorrected ECC
    errors on GPU 0 at sample 150."""
    stamps = []
    for k in range(n):
        if k == 100:
            gpu.inject("throttle", gpu=1, reason="sw_thermal", duration_s=3.0)
        if k == 150:
            gpu.inject("ecc", gpu=0, corrected=2, uncorrected=1)
        stamps.append(gpu.time_ns())
        for sampler in samplers:
            sampler.sample_once(timestamp_ns=stamps[-1])
        gpu.advance(0.07)
    return stamps


def _expected(windows: list[tuple[int, WindowStats]]) -> dict[str, Any]:
    """What the summary must say, from the per-GPU ``WindowStats``."""
    util = [(i, w) for i, w in windows if w.gpu_util_mean_pct is not None]
    energy = [w for _, w in windows if w.energy_j is not None]
    throttled = [(i, w.throttled_fraction or 0.0) for i, w in windows]

    def score(item: tuple[int, WindowStats]) -> tuple[bool, bool, float, float]:
        _, w = item
        return (
            w.lost,
            bool(w.ecc_uncorrected_delta),
            w.throttled_fraction or 0.0,
            -(w.gpu_util_mean_pct or 0.0),
        )

    worst = windows[0]
    for item in windows[1:]:
        if score(item) > score(worst):
            worst = item
    return {
        "n_devices": len(windows),
        "devices": tuple(i for i, _ in windows),
        "samples": sum(w.samples for _, w in windows),
        "gpu_util_mean": sum(w.gpu_util_mean_pct for _, w in util) / len(util),  # type: ignore[misc]
        "gpu_util_min": min(w.gpu_util_mean_pct for _, w in util),  # type: ignore[type-var]
        "gpu_util_max": max(w.gpu_util_max_pct for _, w in util),  # type: ignore[type-var]
        "energy_j": sum(w.energy_j for w in energy),  # type: ignore[misc]
        "energy_from_counter": int(all(w.energy_source == "counter" for w in energy)),
        "temp_max": max(w.temperature_max_c for _, w in windows),  # type: ignore[type-var]
        "throttled_fraction": max(f for _, f in throttled),
        "throttled": tuple(i for i, f in throttled if f > 0),
        "reasons": _union(w.throttle_reasons for _, w in windows),
        "ecc_uncorr_delta": sum(w.ecc_uncorrected_delta or 0 for _, w in windows),
        "worst": worst[0],
        "lost": tuple(i for i, w in windows if w.lost),
        "xids": tuple(sorted({x for _, w in windows for x in w.xids})),
    }


def _union(values: Any) -> int:
    out = 0
    for v in values:
        out |= v or 0
    return out


def test_summary_sums_up_the_windows_of_the_gpus(
    sim_gpu: sim.SimGpu, make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    sampler = make_sampler()
    stamps = _series(sim_gpu, [sampler], 250)
    uuids = [d.uuid for d in sampler.devices]
    rng = random.Random(11)
    bounds = [(stamps[90], stamps[200]), (stamps[0], stamps[-1]), (stamps[120], stamps[120])]
    bounds += [
        tuple(sorted(rng.randrange(stamps[0], stamps[-1] + 10**9) for _ in "ab"))  # type: ignore[misc]
        for _ in range(40)
    ]
    seen_throttled = seen_ecc = False
    for a, b in bounds:
        for order in (None, [uuids[1], uuids[0]], [uuids[1], "GPU-unknown"]):
            raw = sampler.summary(a, b, order)
            asked = (
                range(len(uuids))
                if order is None
                else [1, 0]
                if "GPU-unknown" not in order
                else [1]
            )
            windows = [(i, sampler.window(uuids[i], a, b)) for i in asked]
            have = [(i, w) for i, w in windows if w is not None]
            assert raw is not None and have
            want = _expected(have)
            got = {k: getattr(raw, k) for k in want}
            approx = ("gpu_util_mean", "energy_j")
            assert {k: v for k, v in got.items() if k not in approx} == {
                k: v for k, v in want.items() if k not in approx
            }
            for k in approx:
                assert got[k] == pytest.approx(want[k], rel=1e-12)
            assert raw.valid & F.F_UTIL and raw.valid & F.F_ENERGY and raw.valid & F.F_TEMP
            seen_throttled = seen_throttled or (raw.throttled == (1,) and raw.worst == 1)
            seen_ecc = seen_ecc or (raw.ecc_uncorr_delta > 0 and raw.worst == 0)
            # GPM (H100): the mean over the GPUs of each metric.
            for slot, field in enumerate(GPM_WINDOW_FIELDS):
                values = [getattr(w, field) for _, w in have if getattr(w, field) is not None]
                assert bool(raw.gpm_valid >> slot & 1) == bool(values)
                if values:
                    assert raw.gpm[slot] == pytest.approx(sum(values) / len(values), rel=1e-12)
    # The windows covered the throttled GPU and the ECC error: the worst GPU was found.
    assert seen_throttled and seen_ecc
    # No data: before the first sample, an inverted window, no known GPU, not times.
    assert sampler.summary(0, stamps[0] - 1) is None
    assert sampler.summary(stamps[5], stamps[1]) is None
    assert sampler.summary(stamps[0], stamps[-1], ["GPU-unknown"]) is None
    assert sampler.summary("start", stamps[-1]) is None  # type: ignore[arg-type]


def test_summary_and_events_reads_both_in_one_call(
    sim_gpu: sim.SimGpu, make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    sampler = make_sampler()
    stamps = _series(sim_gpu, [sampler], 250)  # throttle and ECC events from sample 100 on
    uuids = [d.uuid for d in sampler.devices]
    rng = random.Random(5)
    bounds = [(stamps[0], stamps[-1]), (stamps[95], stamps[105]), (stamps[10], stamps[20])]
    bounds += [
        tuple(sorted(rng.randrange(stamps[0] - 10**9, stamps[-1] + 10**9) for _ in "ab"))  # type: ignore[misc]
        for _ in range(40)
    ]
    with_events = 0
    for a, b in bounds:
        for order in (None, [uuids[1], uuids[0]], [uuids[1], "GPU-unknown"], ["GPU-unknown"]):
            raw, events = sampler.summary_and_events(a, b, order)
            assert raw == sampler.summary(a, b, order)
            assert events == sampler.events(a, b)  # every GPU's: the caller filters
            with_events += bool(events)
    assert with_events  # some windows held the throttle and ECC events
    assert sampler.summary_and_events("start", stamps[-1]) == (None, [])  # type: ignore[arg-type]
    assert sampler.summary_and_events(stamps[5], stamps[1]) == (None, [])


def test_summary_carries_the_xids_of_the_gpus_asked(
    sim_gpu: sim.SimGpu, make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    sampler = make_sampler(interval_s=0.05)
    sampler.start()
    uuids = [d.uuid for d in sampler.devices]
    before = sampler.now_ns()
    sim_gpu.inject("xid", gpu=1, code=48)  # with 63 and 94 on an H100
    deadline = time.monotonic() + 5
    while len([e for e in sampler.events(0, FOREVER) if e.kind == "xid"]) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # Each GPU's XIDs count once that GPU has a sample in the window: wait for both (a
    # round samples them one after the other; a loaded machine can end it between the two).
    while (ready := sampler.summary(before, sampler.now_ns())) is None or ready.n_devices < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    end = sampler.now_ns()
    everything = sampler.summary(before, end)
    assert everything is not None and everything.xids == (48, 63, 94)
    other = sampler.summary(before, end, [uuids[0]])
    assert other is not None and other.xids == () and other.devices == (0,)


def test_a_spans_gpu_context_is_its_attributes_and_events(
    sim_gpu: sim.SimGpu, make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    """``GpuContext.context`` (one sampler call) gives what ``attributes`` and ``events``
    give one by one, the events restricted to the GPUs asked for."""
    from otelgpu.runtime.gpu import GpuContext

    sampler = make_sampler()
    stamps = _series(sim_gpu, [sampler], 200)  # GPU 1 throttled, ECC on GPU 0
    errors: list[BaseException] = []
    gpu = GpuContext(sampler, lambda _where, exc: errors.append(exc))
    uuids = [d.uuid for d in sampler.devices]
    for a, b in ((stamps[0], stamps[-1]), (stamps[98], stamps[160]), (stamps[5], stamps[9])):
        for devices in (None, [uuids[0]], [uuids[1]], [uuids[1], uuids[0]]):
            attributes, events = gpu.context(a, b, devices)
            assert attributes == gpu.attributes(a, b, devices)
            assert events == gpu.events(a, b, devices)
            assert {e.uuid for e in events} <= set(devices or uuids)
    assert any(e.uuid == uuids[1] for e in gpu.context(stamps[98], stamps[160])[1])
    assert (
        gpu.context(stamps[98], stamps[160], [uuids[0]])[1]
        != gpu.context(stamps[98], stamps[160], [uuids[1]])[1]
    )
    assert GpuContext(None, lambda _w, _e: None).context(0, 1) == ({}, [])
    assert not errors


@pytest.mark.skipif(_impl.NO_EXTENSIONS, reason="only one twin in this run")
def test_twins_summarise_identically(sim_gpu: sim.SimGpu) -> None:
    assert NativeGpuSampler is not None
    py, native = PyGpuSampler(), NativeGpuSampler()
    try:
        stamps = _series(sim_gpu, [py, native], 300)
        uuids = [d.uuid for d in py.devices]
        rng = random.Random(7)
        for _ in range(300):
            a, b = sorted(rng.randrange(stamps[0] - 10**9, stamps[-1] + 10**9) for _ in "ab")
            for order in (None, uuids[::-1], uuids[:1]):
                assert py.summary(a, b, order) == native.summary(a, b, order)
        assert py.summary(stamps[0], stamps[-1]) is not None
    finally:
        py.close()
        native.close()


def _raw_summaries(rng: random.Random, n: int) -> list[Any]:
    """RawSummary values over every branch of the span attributes: one or several GPUs,
    each field valid or not, GPM slots, throttling, ECC, lost GPUs, XIDs."""
    from otelgpu.sampler._records import NGPM, RawSummary

    out = []
    for _ in range(n):
        count = rng.choice([1, 2, 8])
        devices = tuple(rng.sample(range(8), count))
        valid = 0
        for bit in (F.F_UTIL, F.F_MEMORY, F.F_ENERGY, F.F_TEMP, F.F_REASONS, F.F_GPM):
            if rng.random() < 0.7:
                valid |= bit
        gpm_valid = rng.getrandbits(NGPM) if valid & F.F_GPM else 0
        lost = tuple(d for d in devices if rng.random() < 0.2)
        throttled = tuple(d for d in devices if rng.random() < 0.3)
        raw = RawSummary(
                count, devices, rng.randrange(1, 500), valid,
                rng.uniform(0, 100), rng.uniform(0, 100), rng.uniform(0, 100),
                rng.uniform(0, 100), rng.randrange(1 << 40), rng.uniform(0, 5000),
                rng.randrange(2), rng.randrange(20, 95),
                rng.random() if throttled else 0.0, rng.getrandbits(12) if throttled else 0,
                rng.choice([0, 0, 3]), rng.choice(devices), lost, throttled,
                tuple(sorted(rng.sample([13, 31, 48, 79, 94], rng.randrange(3)))),
                gpm_valid, tuple(rng.uniform(0, 100) for _ in range(NGPM)),
        )  # fmt: skip
        out.append(raw)
    return out


def test_summary_attribute_twins_agree() -> None:
    """The native and pure-Python span attributes of a summary: same keys in the same
    order, same values and value types, for every branch."""
    from otelgpu.otel import gpu_summary

    native = _impl.native_module("otelgpu.sampler._sampler_c")
    if native is None:
        pytest.skip("pure-Python run (OTELGPU_NO_EXTENSIONS): no native twin")
    uuids = tuple(f"GPU-{i}" for i in range(8))

    def names(bits: int) -> tuple[str, ...]:
        return tuple(sorted(F.reason_names(bits)))

    gpm = gpu_summary._GPM_ATTRIBUTES
    assert gpm  # GPM slots are named: the GPM branch is exercised
    seen: set[str] = set()
    for raw in _raw_summaries(random.Random(11), 400):
        for listed in (False, True):
            ours = native.summary_attributes(raw, uuids, listed, gpm, names)
            theirs = gpu_summary.py_summary_attributes(raw, uuids, listed, gpm, names)
            assert list(ours.items()) == list(theirs.items())
            assert [type(v) for v in ours.values()] == [type(v) for v in theirs.values()]
            seen.update(ours)
    for key in ("otelgpu.gpu.lost.ids", "otelgpu.gpu.xids", "hw.id", "otelgpu.gpu.ids"):
        assert key in seen
    assert gpu_summary.summary_attributes is native.summary_attributes
