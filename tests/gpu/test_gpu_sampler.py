"""The sampler against a real NVIDIA driver: plausible ranges, both twins, window math.

Deselected by default (marker ``gpu``); ``make test-gpu`` runs it. Without a driver
every test is skipped with the NVML error as the reason.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from otelgpu import _impl
from otelgpu.nvml import NvmlUnavailableError, inventory
from otelgpu.sampler import BaseGpuSampler, NativeGpuSampler, PyGpuSampler

pytestmark = pytest.mark.gpu

TWINS: list[Any] = [pytest.param(PyGpuSampler, id="py")]
if not _impl.NO_EXTENSIONS:
    TWINS.append(pytest.param(NativeGpuSampler, id="native"))


@pytest.fixture(scope="module")
def gpus() -> list[Any]:
    try:
        found = inventory()
    except NvmlUnavailableError as exc:
        pytest.skip(f"no usable NVIDIA driver: {exc}")
    if not found:
        pytest.skip("NVML reports no GPU")
    return found


@pytest.fixture(params=TWINS)
def sampler(request: pytest.FixtureRequest, gpus: list[Any]) -> Iterator[BaseGpuSampler]:
    cls = request.param
    assert cls is not None, "native sampler did not load although extensions are enabled"
    s = cls(interval_s=0.1)
    yield s
    s.close()


def test_plausible_readings(sampler: BaseGpuSampler, gpus: list[Any]) -> None:
    assert sampler.error is None
    assert {d.uuid for d in sampler.devices} <= {g.uuid for g in gpus}
    sampler.start()
    start = sampler.now_ns()
    time.sleep(1.5)
    end = sampler.now_ns()
    assert sampler.stop()
    stats = sampler.stats()
    assert stats.ticks >= 10 and stats.dropped <= 2
    for device in sampler.devices:
        s = sampler.latest(device.uuid)
        assert s is not None and s.status in ("ok", "field_errors")
        assert start <= s.time_ns <= end
        if s.gpu_util_pct is not None:
            assert 0 <= s.gpu_util_pct <= 100 and 0 <= (s.memory_util_pct or 0) <= 100
        assert s.memory_total_bytes is not None and s.memory_total_bytes >= 1 << 30
        assert s.memory_used_bytes is not None and 0 < s.memory_used_bytes <= s.memory_total_bytes
        if s.power_w is not None:
            assert 5 <= s.power_w <= 1500
        if s.temperature_c is not None:
            assert 10 <= s.temperature_c <= 110
        if s.sm_clock_mhz is not None:
            assert 100 <= s.sm_clock_mhz <= 4000
        if s.pstate is not None:
            assert 0 <= s.pstate <= 15
        w = sampler.window(device.uuid, start, end)
        assert w is not None and 10 <= w.samples <= 17
        if w.power_mean_w is not None and w.energy_j is not None:
            # The energy counter and the averaged power agree within a loose factor.
            assert w.energy_j == pytest.approx(w.power_mean_w * w.duration_s, rel=0.6)
        print(device.uuid, device.name, s, w.as_attributes(), sampler.supported_fields(device.uuid))


def test_sampling_cost_and_events(sampler: BaseGpuSampler) -> None:
    sampler.sample_once()
    began = time.perf_counter()
    for _ in range(10):
        sampler.sample_once()
    per_round_ms = (time.perf_counter() - began) / 10 * 1000
    print(
        f"{sampler.implementation}: {per_round_ms:.2f} ms per round of {len(sampler.devices)} GPUs"
    )
    assert per_round_ms < 100 * len(sampler.devices)
    assert isinstance(sampler.events_supported, bool)
    assert all(
        e.kind in ("xid", "ecc_uncorrected", "device_lost", "throttle_start")
        for e in sampler.events(0, 2**62)
    )


def test_counters_are_monotonic(sampler: BaseGpuSampler) -> None:
    uuid = sampler.devices[0].uuid
    sampler.sample_once()
    first = sampler.latest(uuid)
    time.sleep(0.5)
    sampler.sample_once()
    second = sampler.latest(uuid)
    assert first is not None and second is not None
    for field in ("energy_mj", "ecc_corrected", "ecc_uncorrected"):
        a, b = getattr(first, field), getattr(second, field)
        if a is not None and b is not None:
            assert b >= a, field
    for reason, ns in second.throttle_ns.items():
        assert ns >= first.throttle_ns.get(reason, 0), reason


def test_busy_gpu_shows_utilization(sampler: BaseGpuSampler) -> None:
    import torch  # installed by the test command: a missing torch fails, never skips

    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    sampler.start()
    x = torch.randn(4096, 4096, device="cuda")
    start = sampler.now_ns()
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        x = (x @ x).clamp_(-1, 1)
    torch.cuda.synchronize()
    end = sampler.now_ns()
    uuid = torch.cuda.get_device_properties(0).uuid
    target = next((d.uuid for d in sampler.devices if str(uuid) in d.uuid), sampler.devices[0].uuid)
    w = sampler.window(target, start, end)
    assert w is not None and w.gpu_util_max_pct is not None and w.gpu_util_max_pct > 30
