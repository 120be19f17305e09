"""Window and query bounds: query methods never raise on odd time bounds, the twins agree on
them, the native window never overflows int64, native device indices are bounds-checked."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from fixtures.sim import Twins

from otelgpu import _impl, sim
from otelgpu.sampler import BaseGpuSampler, NativeGpuSampler

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _filled(
    gpu: sim.SimGpu, make_sampler: Callable[..., BaseGpuSampler]
) -> tuple[BaseGpuSampler, str, list[int]]:
    """A sampler fed 30 samples 100 ms apart (virtual clock): the sampler, its first GPU's
    UUID and the samples' stamps."""
    sampler = make_sampler()
    stamps = []
    for _ in range(30):
        stamps.append(gpu.time_ns())
        sampler.sample_once(timestamp_ns=stamps[-1])
        gpu.advance(0.1)
    return sampler, sampler.devices[0].uuid, stamps


@pytest.mark.parametrize(
    "bounds",
    [(None, 5), ("1", 10**12), (float("nan"), 10**12), (0, float("inf")), (object(), 1)],
)
def test_sampler_queries_with_non_time_bounds_answer_nothing(
    sim_gpu: sim.SimGpu,
    make_sampler: Callable[..., BaseGpuSampler],
    bounds: tuple[object, object],
) -> None:
    sampler, uuid, _ = _filled(sim_gpu, make_sampler)
    assert sampler.window(uuid, *bounds) is None  # type: ignore[arg-type]
    assert sampler.windows(*bounds) == {}  # type: ignore[arg-type]
    assert sampler.events(*bounds) == []  # type: ignore[arg-type]
    assert sampler.latest(["not", "a", "uuid"]) is None  # type: ignore[arg-type]


def test_sampler_window_beyond_int64_is_clamped_not_raised(
    sim_gpu: sim.SimGpu, make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    sampler, uuid, stamps = _filled(sim_gpu, make_sampler)
    # Beyond the int64 range: the native core used to raise OverflowError.
    whole = sampler.window(uuid, -(1 << 70), 1 << 70)
    clamped = sampler.window(uuid, INT64_MIN, INT64_MAX)
    assert whole is not None and clamped is not None
    assert whole.samples == clamped.samples == len(stamps)
    assert whole.energy_j == clamped.energy_j
    assert sampler.events(-(1 << 70), 1 << 70) == sampler.events(INT64_MIN, INT64_MAX)
    # numpy integers and floats are times too (floats truncated, as the C conversion does).
    a, b = stamps[3], stamps[9]
    by_numpy = sampler.window(uuid, np.int64(a), np.int64(b))  # type: ignore[arg-type]
    assert by_numpy == sampler.window(uuid, a, b)
    fa, fb = float(a), float(b) + 0.5
    by_float = sampler.window(uuid, np.float64(fa), fb)  # type: ignore[arg-type]
    assert by_float == sampler.window(uuid, int(fa), int(fb))


def test_sampler_window_over_the_whole_int64_range_has_positive_energy(
    sim_gpu: sim.SimGpu, make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    """e_ns - s_ns overflowed int64 in the native core: the energy came out negative."""
    sampler, uuid, stamps = _filled(sim_gpu, make_sampler)
    w = sampler.window(uuid, INT64_MIN, INT64_MAX)
    ref = sampler.window(uuid, stamps[0], stamps[-1])
    assert w is not None and ref is not None and ref.energy_j is not None
    assert ref.energy_j > 0
    assert w.energy_j is not None and w.energy_j > 0
    # Same counter delta, extrapolated over the (2**64 - 1) ns requested instead of the
    # sampled span: the ratio of the two energies is the ratio of the two spans.
    span = float((1 << 64) - 1)
    assert w.energy_j == pytest.approx(ref.energy_j * span / (stamps[-1] - stamps[0]), rel=1e-9)


@pytest.mark.skipif(_impl.NO_EXTENSIONS, reason="only one twin in this run")
def test_sampler_twins_agree_on_extreme_and_fractional_bounds(
    sim_gpu: sim.SimGpu, twins: Twins
) -> None:
    stamps = []
    for _ in range(40):
        stamps.append(twins.sample(sim_gpu))
        sim_gpu.advance(0.1)
    bounds = [
        (INT64_MIN, INT64_MAX),
        (-(1 << 80), 1 << 80),
        (stamps[5] + 0.9, stamps[20] + 0.2),
        (float(stamps[2]), float(stamps[30])),
        (stamps[10], stamps[10]),
    ]
    py, native = twins.py, twins.native
    for device in py.devices:
        for s, e in bounds:
            assert py.window(device.uuid, s, e) == native.window(device.uuid, s, e)  # type: ignore[arg-type]
            assert py.events(s, e) == native.events(s, e)  # type: ignore[arg-type]


@pytest.mark.skipif(_impl.NO_EXTENSIONS, reason="native core only")
def test_sampler_native_core_checks_device_indices(sim_gpu: sim.SimGpu) -> None:
    assert NativeGpuSampler is not None
    sampler = NativeGpuSampler()
    try:
        core = sampler._core
        n = len(sampler.devices)
        assert len(core.device_state(n - 1)) == 7
        for bad in (n, n + 1000, -1):
            with pytest.raises(IndexError):
                core.device_state(bad)
            with pytest.raises(IndexError):
                core.take_disabled(bad)
    finally:
        sampler.close()
