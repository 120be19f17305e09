"""The simulator behaves like a board, not like a table of numbers (docs/simulator.md, Model).

* throttling is throttling: clocks and power drop together, in a throttle window and under
  a power cap;
* the temperature stops at the model's limits: a board that reaches its shutdown
  temperature powers off and falls off the bus (GPU_IS_LOST, Xid 79) -- it does not run on
  at 99 °C;
* an Xid 48 comes with what an Ampere/Hopper board raises alongside it: the uncorrectable
  ECC error, a pending row remap (Xid 63) and Xid 94 (contained) or 95 (uncontained).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pynvml as n
import pytest

from otelgpu import sim
from otelgpu.sim.models import MODELS

Activate = Callable[..., sim.SimGpu]
H100 = MODELS["H100-SXM"]


def _scenario(
    util: float = 100, count: int = 1, model: str = "H100-SXM", **gpu0: Any
) -> dict[str, Any]:
    scenario: dict[str, Any] = {
        "version": 1,
        "name": "realism",
        "gpus": {"count": count, "model": model, "utilization": util},
    }
    if gpu0:
        scenario["gpu"] = [{"index": 0, **gpu0}]
    return scenario


@pytest.fixture
def nvml() -> Iterator[None]:
    yield
    n.nvmlShutdown()


def _dynamic(util: float) -> float:
    return float((H100["max_power_w"] - H100["idle_power_w"]) * util / 100)


@pytest.mark.usefixtures("nvml")
def test_sim_throttle_window_drops_power_and_clocks_together(sim_scenario: Activate) -> None:
    gpu = sim_scenario(_scenario(util=60))
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    full_w = H100["idle_power_w"] + _dynamic(60)
    gpu.advance(1)
    assert n.nvmlDeviceGetPowerUsage(h) == round(full_w * 1000)
    assert n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM) == H100["sm_clock_mhz"]
    gpu.inject("throttle", gpu=0, reason="hw_thermal", duration_s=5, clock_factor=0.5)
    gpu.advance(1)
    assert n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM) == round(H100["sm_clock_mhz"] * 0.5)
    assert n.nvmlDeviceGetPowerUsage(h) == round((H100["idle_power_w"] + _dynamic(60) * 0.5) * 1000)
    gpu.advance(5)  # the window is over: both come back
    assert n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM) == H100["sm_clock_mhz"]
    assert n.nvmlDeviceGetPowerUsage(h) == round(full_w * 1000)


@pytest.mark.usefixtures("nvml")
def test_sim_power_cap_lowers_the_clocks_until_the_power_fits(sim_scenario: Activate) -> None:
    gpu = sim_scenario(_scenario(util=100))
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    cap_w = 400.0
    gpu.inject("throttle", gpu=0, reason="sw_power_cap", duration_s=5, power_cap_w=cap_w)
    gpu.advance(1)
    assert n.nvmlDeviceGetPowerUsage(h) == round(cap_w * 1000)
    factor = (cap_w - H100["idle_power_w"]) / _dynamic(100)
    assert n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM) == round(H100["sm_clock_mhz"] * factor)
    reasons = n.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert reasons & n.nvmlClocksEventReasonSwPowerCap


@pytest.mark.usefixtures("nvml")
def test_sim_shutdown_temperature_ends_in_gpu_lost(sim_scenario: Activate) -> None:
    # A board with a dead cooler: even throttled, its power heats it past the shutdown limit.
    gpu = sim_scenario(_scenario(util=100, count=2, thermal_c_per_w=0.3, thermal_tau_s=5))
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    es = n.nvmlEventSetCreate()
    n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, es)
    shutdown_c = H100["shutdown_temp_c"]
    temps = []
    lost_at = None
    for step in range(1, 121):
        gpu.set_time(step * 0.5)
        try:
            temps.append(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))
        except n.NVMLError_GpuIsLost:
            lost_at = step * 0.5
            break
    assert lost_at is not None, f"never shut down; temperatures {temps}"
    assert max(temps) <= shutdown_c  # the temperature stops at the limit
    assert max(temps) >= H100["slowdown_temp_c"]
    # Lost for good: handle lookups fail, Xid 79 is delivered, the other GPU goes on.
    with pytest.raises(n.NVMLError_GpuIsLost):
        n.nvmlDeviceGetHandleByIndex(0)
    event = n.nvmlEventSetWait_v2(es, 0)
    assert (event.eventType, event.eventData) == (n.nvmlEventTypeXidCriticalError, 79)
    other = n.nvmlDeviceGetHandleByIndex(1)
    assert n.nvmlDeviceGetTemperature(other, n.NVML_TEMPERATURE_GPU) < H100["slowdown_temp_c"]
    n.nvmlEventSetFree(es)


def _xids(gpu: sim.SimGpu, h: Any, **params: Any) -> list[int]:
    es = n.nvmlEventSetCreate()
    n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, es)
    gpu.advance(1)
    gpu.inject("xid", gpu=0, code=48, **params)
    out = []
    while True:
        try:
            out.append(int(n.nvmlEventSetWait_v2(es, 0).eventData))
        except n.NVMLError_Timeout:
            break
    n.nvmlEventSetFree(es)
    return out


@pytest.mark.usefixtures("nvml")
@pytest.mark.parametrize(
    ("params", "expected", "remap"),
    [
        ({}, [48, 63, 94], (0, 1, 1, 0)),
        ({"contained": False}, [48, 63, 95], (0, 1, 1, 0)),
        ({"companions": False}, [48], (0, 0, 0, 0)),
    ],
)
def test_sim_xid48_comes_with_its_h100_companions(
    sim_scenario: Activate, params: dict[str, Any], expected: list[int], remap: tuple[int, ...]
) -> None:
    gpu = sim_scenario(_scenario())
    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(0)
    assert _xids(gpu, h, **params) == expected
    assert n.nvmlDeviceGetRemappedRows(h) == remap
    uncorrected = n.nvmlDeviceGetTotalEccErrors(h, 1, n.NVML_VOLATILE_ECC)
    assert uncorrected == (0 if params.get("companions") is False else 1)


@pytest.mark.usefixtures("nvml")
def test_sim_xid48_without_row_remapping_has_no_xid63(sim_scenario: Activate) -> None:
    scenario = _scenario()
    scenario["gpus"]["unsupported"] = ["remapped_rows"]
    gpu = sim_scenario(scenario)
    n.nvmlInit()
    assert _xids(gpu, n.nvmlDeviceGetHandleByIndex(0)) == [48, 94]


def test_sim_xid48_flags_are_validated(sim_scenario: Activate) -> None:
    gpu = sim_scenario(_scenario())
    with pytest.raises(sim.ScenarioError, match="contained"):
        gpu.inject("xid", gpu=0, code=48, contained="yes")
