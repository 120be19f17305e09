"""The simulator's GPM API through real pynvml: support per model, the sample life
cycle, argument checks, per-metric NOT_SUPPORTED, and values from the scenario."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from typing import Any

import pynvml
import pytest

from otelgpu import sim


def _scenario(model: str, **gpus: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "name": "gpm",
        "gpus": {"count": 1, "model": model, "utilization": 60, **gpus},
    }


def _metrics(s1: Any, s2: Any, ids: list[int]) -> Any:
    mg = pynvml.c_nvmlGpmMetricsGet_t()
    mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = len(ids)
    mg.sample1, mg.sample2 = s1, s2
    for j, metric in enumerate(ids):
        mg.metrics[j].metricId = metric
    return pynvml.nvmlGpmMetricsGet(mg)


@pytest.fixture
def gpm_nvml(sim_scenario: Callable[..., sim.SimGpu]) -> Iterator[tuple[Any, sim.SimGpu]]:
    """(pynvml initialised, the SimGpu) on an H100 with a tensor pattern and no NVLink."""
    gpu = sim_scenario(_scenario("H100-SXM", tensor_activity=12, nvlink_links=0))
    pynvml.nvmlInit()
    yield pynvml, gpu
    pynvml.nvmlShutdown()


@pytest.mark.parametrize(
    ("model", "extra", "supported"),
    [
        ("H100-SXM", {}, 1),
        ("A100-SXM", {}, 0),
        ("L4", {}, 0),
        ("RTX-4090", {}, 0),
        ("H100-SXM", {"unsupported": ["gpm"]}, 0),
        ("H100-SXM", {"architecture": "blackwell"}, 1),
    ],
)
def test_sim_gpm_support_follows_the_model(
    sim_scenario: Callable[..., sim.SimGpu],
    model: str,
    extra: dict[str, Any],
    supported: int,
) -> None:
    sim_scenario(_scenario(model, **extra))
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == supported
        sample = pynvml.nvmlGpmSampleAlloc()
        if supported:
            pynvml.nvmlGpmSampleGet(h, sample)
        else:
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlGpmSampleGet(h, sample)
        pynvml.nvmlGpmSampleFree(sample)
    finally:
        pynvml.nvmlShutdown()


def test_sim_gpm_values_and_per_metric_support(gpm_nvml: tuple[Any, sim.SimGpu]) -> None:
    nvml, gpu = gpm_nvml
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    s1, s2 = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    nvml.nvmlGpmSampleGet(h, s1)
    gpu.advance(1.0)
    nvml.nvmlGpmSampleGet(h, s2)
    ids = [1, 2, 5, 10, 20, 60, 61, 400]
    mg = _metrics(s1, s2, ids)
    got = {mg.metrics[j].metricId: mg.metrics[j] for j in range(len(ids))}
    assert got[1].value == pytest.approx(60.0)  # graphics = utilization
    assert got[2].value == pytest.approx(0.85 * 60)  # default SM share of utilization
    assert got[5].value == pytest.approx(12.0)  # the scenario's tensor pattern
    assert got[10].value == pytest.approx(0.35 * 60)
    assert got[20].value == pytest.approx(2000e6 * 0.6 / (1 << 20))  # H100 PCIe TX MiB/s
    assert got[5].metricInfo.unit == b"%" and got[20].metricInfo.unit == b"MiB/sec"
    for metric in (60, 61, 400):  # no NVLink links; 400 is no metric the simulator has
        assert got[metric].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    nvml.nvmlGpmSampleFree(s1)
    nvml.nvmlGpmSampleFree(s2)


def test_sim_gpm_argument_checks(gpm_nvml: tuple[Any, sim.SimGpu]) -> None:
    nvml, gpu = gpm_nvml
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    lib = nvml.nvmlLib
    bad = nvml.c_nvmlGpmSupport_t()
    bad.version = 7
    assert lib.nvmlGpmQueryDeviceSupport(h, ctypes.byref(bad)) == 25  # VERSION_MISMATCH
    s1, s2, fresh = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    nvml.nvmlGpmSampleGet(h, s1)
    gpu.advance(0.5)
    nvml.nvmlGpmSampleGet(h, s2)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        _metrics(s2, s1, [1])  # samples in the wrong order
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        _metrics(s1, fresh, [1])  # a sample never filled
    mg = nvml.c_nvmlGpmMetricsGet_t()
    mg.version, mg.numMetrics, mg.sample1, mg.sample2 = 99, 1, s1, s2
    assert lib.nvmlGpmMetricsGet(ctypes.byref(mg)) == 25
    # the same instant twice (a frozen virtual clock): the values at that instant
    assert _metrics(s2, s2, [1]).metrics[0].value == pytest.approx(60.0)
    for sample in (s1, s2, fresh):
        nvml.nvmlGpmSampleFree(sample)


def test_sim_gpm_samples_of_a_previous_scenario_are_rejected(
    sim_scenario: Callable[..., sim.SimGpu],
) -> None:
    sim_scenario(_scenario("H100-SXM"))
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        s1 = pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(h, s1)
        gpu = sim_scenario(_scenario("H100-SXM", utilization=20))  # a new scenario
        gpu.advance(1.0)
        s2 = pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(pynvml.nvmlDeviceGetHandleByIndex(0), s2)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            _metrics(s1, s2, [1])
        pynvml.nvmlGpmSampleFree(s1)
        pynvml.nvmlGpmSampleFree(s2)
    finally:
        pynvml.nvmlShutdown()


def test_sim_gpm_no_permission(sim_scenario: Callable[..., sim.SimGpu]) -> None:
    sim_scenario(_scenario("H100-SXM", gpm_no_permission=True))
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 1
        sample = pynvml.nvmlGpmSampleAlloc()
        with pytest.raises(pynvml.NVMLError_NoPermission):
            pynvml.nvmlGpmSampleGet(h, sample)
        pynvml.nvmlGpmSampleFree(sample)
    finally:
        pynvml.nvmlShutdown()
