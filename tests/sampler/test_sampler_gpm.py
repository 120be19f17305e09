"""GPM (GPU Performance Monitoring) in both sampler twins against the simulator.

Expected values are computed here from the scenario's own numbers: each activity is
its pattern, or the simulator's documented default share of utilization
(``otelgpu.sim.gpm.DEFAULT_RATIOS``), averaged over the window; the PCIe / NVLink rates
are the model's bytes/s at 100 % utilization times the mean utilization, in MiB/s.
A GPM value of a sample covers the interval since the previous GPM sample, so a window
[a, b] on the 100 ms sample grid averages exactly (a, b].
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

import pynvml
import pytest

from otelgpu import sim
from otelgpu.commands._capabilities import report_capabilities
from otelgpu.otel.gpu_context import window_attributes
from otelgpu.sampler import BaseGpuSampler
from otelgpu.sampler import _fields as F
from otelgpu.sim.gpm import DEFAULT_RATIOS

MIB = 1 << 20
STEP_NS = 10_000_000  # the simulator's integration grid

UTIL = {"kind": "square", "high": 90, "low": 30, "period_s": 4, "low_s": 1}
PATTERNS: dict[str, Any] = {
    "sm_activity": {"kind": "square", "high": 70, "low": 5, "period_s": 4, "low_s": 1},
    "tensor_activity": 40,
    "hmma_activity": 35,
    "imma_activity": 5,
    "dram_activity": {"kind": "square", "high": 50, "low": 20, "period_s": 2, "low_s": 1},
    "fp32_activity": 12,
}
GPM_SCENARIO: dict[str, Any] = {
    "version": 1,
    "name": "test-gpm",
    "description": "1x H100 with GPM patterns",
    "gpus": {"count": 1, "model": "H100-SXM", "utilization": UTIL, **PATTERNS},
}

#: WindowStats field -> scenario key of the activity behind it.
ACTIVITY_FIELDS = {
    "sm_activity_pct": "sm_activity",
    "sm_occupancy_pct": "sm_occupancy",
    "integer_activity_pct": "integer_activity",
    "tensor_activity_pct": "tensor_activity",
    "dfma_tensor_activity_pct": "dfma_activity",
    "hmma_tensor_activity_pct": "hmma_activity",
    "dmma_tensor_activity_pct": "dmma_activity",
    "imma_tensor_activity_pct": "imma_activity",
    "dram_activity_pct": "dram_activity",
    "fp64_activity_pct": "fp64_activity",
    "fp32_activity_pct": "fp32_activity",
    "fp16_activity_pct": "fp16_activity",
}
H100_BPS = {  # bytes/s at 100 % utilization (models.py H100-SXM, MB/s x 1e6)
    "pcie_tx_rate_mib_s": 2000e6,
    "pcie_rx_rate_mib_s": 6000e6,
    "nvlink_rx_rate_mib_s": 120000e6,
    "nvlink_tx_rate_mib_s": 120000e6,
}


def _value(pattern: Any, t: float) -> float:
    if isinstance(pattern, int | float):
        return float(pattern)
    assert pattern["kind"] == "square"
    phase = math.fmod(t, pattern["period_s"])
    return float(pattern["low"] if phase < pattern["low_s"] else pattern["high"])


def _mean(fn: Callable[[float], float], a: float, b: float) -> float:
    """Average of fn over (a, b] by the midpoint rule on the 10 ms grid (exact for the
    square waves above, whose edges lie on the grid)."""
    n = round((b - a) * 1e9 / STEP_NS)
    return sum(fn(a + (k + 0.5) * STEP_NS / 1e9) for k in range(n)) / n


def _activity(key: str, t: float) -> float:
    if key in PATTERNS:
        return _value(PATTERNS[key], t)
    return DEFAULT_RATIOS[key] * _value(UTIL, t)


def _drive(
    gpu: sim.SimGpu, make_sampler: Callable[..., BaseGpuSampler], seconds: float
) -> tuple[BaseGpuSampler, str, int]:
    """A sampler (100 ms interval) fed samples at virtual t = 0, 0.1 s, 0.2 s… up to
    ``seconds``: the sampler, its first GPU's UUID and t = 0's stamp."""
    sampler = make_sampler(interval_s=0.1)
    origin = gpu.time_ns()
    sampler.sample_once(timestamp_ns=origin)
    for _ in range(round(seconds / 0.1)):
        gpu.advance(0.1)
        sampler.sample_once(timestamp_ns=gpu.time_ns())
    return sampler, sampler.devices[0].uuid, origin


@pytest.mark.parametrize(("a", "b"), [(0.0, 10.0), (0.5, 3.7), (1.0, 4.0), (2.3, 7.9)])
def test_every_gpm_metric_window_equals_the_scenario(
    sim_scenario: Callable[..., sim.SimGpu],
    make_sampler: Callable[..., BaseGpuSampler],
    a: float,
    b: float,
) -> None:
    gpu = sim_scenario(GPM_SCENARIO)
    sampler, uuid, origin = _drive(gpu, make_sampler, 10.0)
    w = sampler.window(uuid, origin + round(a * 1e9), origin + round(b * 1e9))
    assert w is not None
    util = _mean(lambda t: _value(UTIL, t), a, b)
    assert w.graphics_activity_pct == pytest.approx(util, rel=1e-9)
    for field, key in ACTIVITY_FIELDS.items():
        expected = _mean(lambda t, key=key: _activity(key, t), a, b)  # type: ignore[misc]
        assert getattr(w, field) == pytest.approx(expected, rel=1e-9, abs=1e-9), field
    for field, bps in H100_BPS.items():
        assert getattr(w, field) == pytest.approx(bps * util / 100 / MIB, rel=1e-9), field
    assert "gpm" in sampler.supported_fields(uuid)
    assert "gpm" not in sampler.unsupported_fields(uuid)


def test_gpm_samples_match_pynvml_at_the_same_instants(
    sim_scenario: Callable[..., sim.SimGpu], make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    """A second NVML client (real pynvml) taking GPM samples at the same virtual instants
    reads exactly the values the sampler stored."""
    gpu = sim_scenario(GPM_SCENARIO)
    sampler = make_sampler(interval_s=0.1)
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 1
        s1, s2 = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        gpu.advance(0.5)
        sampler.sample_once(timestamp_ns=gpu.time_ns())
        pynvml.nvmlGpmSampleGet(h, s1)
        gpu.advance(0.7)  # crosses the 1 s edge of the square waves
        sampler.sample_once(timestamp_ns=gpu.time_ns())
        pynvml.nvmlGpmSampleGet(h, s2)
        mg = pynvml.c_nvmlGpmMetricsGet_t()
        mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(F.GPM_IDS)
        mg.sample1, mg.sample2 = s1, s2
        for j, metric in enumerate(F.GPM_IDS):
            mg.metrics[j].metricId = metric
        pynvml.nvmlGpmMetricsGet(mg)
        theirs = {name: mg.metrics[j].value for j, (name, _) in enumerate(F.GPM_METRICS)}
        assert all(mg.metrics[j].nvmlReturn == 0 for j in range(len(F.GPM_IDS)))
        pynvml.nvmlGpmSampleFree(s1)
        pynvml.nvmlGpmSampleFree(s2)
    finally:
        pynvml.nvmlShutdown()
    latest = sampler.latest(sampler.devices[0].uuid)
    assert latest is not None and latest.gpm_interval_ns == 700_000_000
    assert latest.gpm == theirs
    assert latest.gpm["sm_activity"] == pytest.approx((5 * 0.5 + 70 * 0.2) / 0.7)


def test_gpm_samples_are_at_least_100ms_apart(
    sim_scenario: Callable[..., sim.SimGpu], make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    """Sampling every 50 ms: GPM is compared every other sample (its counters refresh
    every ~100 ms), and the GPM intervals still tile the window exactly."""
    gpu = sim_scenario(GPM_SCENARIO)
    sampler = make_sampler(interval_s=0.05)
    uuid = sampler.devices[0].uuid
    origin = gpu.time_ns()
    sampler.sample_once(timestamp_ns=origin)
    intervals = []
    for _ in range(40):
        gpu.advance(0.05)
        sampler.sample_once(timestamp_ns=gpu.time_ns())
        latest = sampler.latest(uuid)
        assert latest is not None
        intervals.append(latest.gpm_interval_ns)
    assert intervals == [None, 100_000_000] * 20
    stats = sampler.window(uuid, origin, origin + 2_000_000_000)
    assert stats is not None and stats.samples == 41
    assert stats.tensor_activity_pct == pytest.approx(40.0)
    expected = _mean(lambda t: _activity("sm_activity", t), 0, 2)
    assert stats.sm_activity_pct == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    ("model", "extra"),
    [("A100-SXM", {}), ("RTX-4090", {}), ("H100-SXM", {"unsupported": ["gpm"]})],
)
def test_gpm_unsupported_devices_degrade_clearly(
    sim_scenario: Callable[..., sim.SimGpu],
    make_sampler: Callable[..., BaseGpuSampler],
    model: str,
    extra: dict[str, Any],
) -> None:
    gpu = sim_scenario(
        {
            "version": 1,
            "name": "no-gpm",
            "gpus": {"count": 1, "model": model, "utilization": 80, **extra},
        }
    )
    sampler, uuid, origin = _drive(gpu, make_sampler, 1.0)
    w = sampler.window(uuid, origin, origin + 1_000_000_000)
    assert w is not None and w.gpu_util_mean_pct == 80.0  # the rest is still sampled
    for field in ("graphics_activity_pct", *ACTIVITY_FIELDS, *H100_BPS):
        assert getattr(w, field) is None, field
    latest = sampler.latest(uuid)
    assert latest is not None and latest.gpm == {} and latest.gpm_interval_ns is None
    assert "gpm" not in sampler.supported_fields(uuid)
    assert "nvmlGpmQueryDeviceSupport" in sampler.unsupported_fields(uuid)["gpm"]
    assert "otelgpu.gpu.tensor.activity" not in window_attributes({uuid: w})
    buf = io.StringIO()
    report_capabilities(buf)
    assert "GPM: SM / tensor / DRAM / FP-pipe activity (per step and request): no -- " in (
        buf.getvalue()
    )
    assert "nvmlGpmQueryDeviceSupport: not supported on this GPU" in buf.getvalue()


def test_doctor_lists_gpm_on_hopper(sim_scenario: Callable[..., sim.SimGpu]) -> None:
    sim_scenario("memory-bound-decode")
    buf = io.StringIO()
    report_capabilities(buf)
    text = buf.getvalue()
    assert "GPM: SM / tensor / DRAM / FP-pipe activity (per step and request): yes" in text
    assert "energy counter (joules per step / request): yes" in text
    assert "slowdown 87 C, shutdown 92 C" in text


def test_memory_bound_scenario_high_utilization_low_tensor_activity(
    sim_scenario: Callable[..., sim.SimGpu], make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    gpu = sim_scenario("memory-bound-decode")
    sampler, uuid, origin = _drive(gpu, make_sampler, 3.0)
    w = sampler.window(uuid, origin + 1_000_000_000, origin + 3_000_000_000)
    assert w is not None
    assert w.gpu_util_mean_pct == 95.0
    assert w.tensor_activity_pct == pytest.approx(10.0)
    assert w.dram_activity_pct == pytest.approx(85.0)
    assert w.sm_activity_pct == pytest.approx(60.0)
    attrs = window_attributes({uuid: w})
    assert attrs["otelgpu.gpu.utilization.mean"] == pytest.approx(0.95)
    assert attrs["otelgpu.gpu.tensor.activity"] == pytest.approx(0.10)
    assert attrs["otelgpu.gpu.dram.activity"] == pytest.approx(0.85)


def test_data_starved_steps_sm_activity_collapses_while_utilization_stays(
    sim_scenario: Callable[..., sim.SimGpu], make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    gpu = sim_scenario("data-starved-steps")
    sampler, uuid, origin = _drive(gpu, make_sampler, 10.0)
    stall = sampler.window(uuid, origin, origin + 3_000_000_000)  # the stall: [0, 3) s
    busy = sampler.window(uuid, origin + 3_000_000_000, origin + 10_000_000_000)
    assert stall is not None and busy is not None
    assert stall.gpu_util_mean_pct == busy.gpu_util_mean_pct == 90.0
    assert stall.sm_activity_pct == pytest.approx(6.0)
    assert busy.sm_activity_pct == pytest.approx(80.0)
    assert stall.tensor_activity_pct == pytest.approx(1.0)


def test_gpm_without_permission_is_switched_off_with_the_reason(
    sim_scenario: Callable[..., sim.SimGpu], make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    """A host that restricts profiling counters: nvmlGpmSampleGet answers NO_PERMISSION.
    GPM goes off for that GPU (asked once, not every round) with that reason."""
    gpu = sim_scenario(
        {
            "version": 1,
            "name": "gpm-restricted",
            "gpus": {"count": 1, "model": "H100-SXM", "utilization": 80, "gpm_no_permission": True},
        }
    )
    sampler, uuid, origin = _drive(gpu, make_sampler, 1.0)
    w = sampler.window(uuid, origin, origin + 1_000_000_000)
    assert w is not None and w.gpu_util_mean_pct == 80.0 and w.sm_activity_pct is None
    latest = sampler.latest(uuid)
    assert latest is not None and latest.status == "ok" and latest.field_errors == 0
    assert "gpm" not in sampler.supported_fields(uuid)
    assert "NVML_ERROR_NO_PERMISSION" in sampler.unsupported_fields(uuid)["gpm"]
