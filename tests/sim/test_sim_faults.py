"""Deterministic tests of every scripted fault, through the real pynvml binding.

Times are virtual: the clock moves only when a test calls ``advance``/``set_time``.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml as n
import pytest

from otelgpu import sim

Activate = Callable[..., sim.SimGpu]


def _base(**gpus: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "name": "faults",
        "gpus": {"count": 2, "model": "A100-SXM", "utilization": 90, **gpus},
    }


@pytest.fixture
def init() -> Any:
    """Call after activating: nvmlInit now, nvmlShutdown at teardown."""
    done: list[bool] = []

    def _init() -> None:
        n.nvmlInit()
        done.append(True)

    yield _init
    for _ in done:
        with contextlib.suppress(n.NVMLError):
            n.nvmlShutdown()


# -- XID through the event API ----------------------------------------------------------


def test_xid_delivered_at_scripted_time(sim_scenario: Activate, init: Any) -> None:
    scenario = _base()
    scenario["event"] = [{"at_s": 30, "gpu": 1, "kind": "xid", "code": 43}]
    gpu = sim_scenario(scenario)
    init()
    h1 = n.nvmlDeviceGetHandleByIndex(1)
    es = n.nvmlEventSetCreate()
    n.nvmlDeviceRegisterEvents(h1, n.nvmlEventTypeXidCriticalError, es)
    gpu.advance(29.99)
    with pytest.raises(n.NVMLError_Timeout):
        n.nvmlEventSetWait_v2(es, 0)

    received: list[Any] = []
    waiter = threading.Thread(target=lambda: received.append(n.nvmlEventSetWait_v2(es, 10_000)))
    waiter.start()
    time.sleep(0.1)
    assert received == []  # blocked: the event is still in the future
    gpu.advance(0.01)  # t = 30 s: the waiter wakes up
    waiter.join(5)
    assert not waiter.is_alive()
    (data,) = received
    assert data.eventType == n.nvmlEventTypeXidCriticalError
    assert data.eventData == 43
    assert n.nvmlDeviceGetIndex(data.device) == 1
    # delivered once
    with pytest.raises(n.NVMLError_Timeout):
        n.nvmlEventSetWait_v2(es, 0)
    n.nvmlEventSetFree(es)


def test_wait_blocks_for_its_timeout(sim_gpu: sim.SimGpu, init: Any) -> None:
    init()
    es = n.nvmlEventSetCreate()
    n.nvmlDeviceRegisterEvents(n.nvmlDeviceGetHandleByIndex(0), n.nvmlEventTypeXidCriticalError, es)
    start = time.monotonic()
    with pytest.raises(n.NVMLError_Timeout):
        n.nvmlEventSetWait_v2(es, 300)
    assert time.monotonic() - start >= 0.29  # no busy return
    n.nvmlEventSetFree(es)


def test_events_before_registration_are_not_recorded(sim_scenario: Activate, init: Any) -> None:
    scenario = _base()
    scenario["event"] = [
        {"at_s": 5, "gpu": 0, "kind": "xid", "code": 13},
        {"at_s": 20, "gpu": 0, "kind": "xid", "code": 31},
    ]
    gpu = sim_scenario(scenario)
    init()
    gpu.set_time(10)
    es = n.nvmlEventSetCreate()
    n.nvmlDeviceRegisterEvents(n.nvmlDeviceGetHandleByIndex(0), n.nvmlEventTypeXidCriticalError, es)
    gpu.set_time(25)
    assert n.nvmlEventSetWait_v2(es, 0).eventData == 31
    with pytest.raises(n.NVMLError_Timeout):
        n.nvmlEventSetWait_v2(es, 0)
    n.nvmlEventSetFree(es)


def test_wall_clock_event_wakes_waiter(sim_scenario: Activate, init: Any) -> None:
    scenario = _base()
    scenario["event"] = [{"at_s": 0.3, "gpu": 0, "kind": "xid", "code": 94}]
    sim_scenario(scenario, clock="wall")
    init()
    es = n.nvmlEventSetCreate()
    n.nvmlDeviceRegisterEvents(n.nvmlDeviceGetHandleByIndex(0), n.nvmlEventTypeXidCriticalError, es)
    start = time.monotonic()
    data = n.nvmlEventSetWait_v2(es, 5000)
    waited = time.monotonic() - start
    assert data.eventData == 94
    assert waited < 2.0  # woken at the event time, not at the timeout
    n.nvmlEventSetFree(es)


# -- ECC, remapped rows -----------------------------------------------------------------


def test_ecc_storm_counters_and_events(sim_scenario: Activate, init: Any) -> None:
    gpu = sim_scenario("ecc-storm")
    init()
    sc = gpu.scenario
    storm = next(e for e in sc.raw["event"] if e["kind"] == "ecc" and e.get("corrected"))
    dbe = next(e for e in sc.raw["event"] if e["kind"] == "xid" and e["code"] == 48)
    g = storm["gpu"]
    h = n.nvmlDeviceGetHandleByIndex(g)
    other = n.nvmlDeviceGetHandleByIndex((g + 1) % sc.gpu_count)
    es = n.nvmlEventSetCreate()
    n.nvmlDeviceRegisterEvents(
        h, n.nvmlEventTypeXidCriticalError | n.nvmlEventTypeDoubleBitEccError, es
    )

    def corrected(handle: Any) -> int:
        return int(
            n.nvmlDeviceGetTotalEccErrors(
                handle, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC
            )
        )

    gpu.set_time(storm["at_s"] - 1)
    assert corrected(h) == 0
    half = storm["at_s"] + storm["duration_s"] / 2
    gpu.set_time(half)
    assert corrected(h) == storm["corrected"] // 2
    assert corrected(other) == 0
    gpu.set_time(storm["at_s"] + storm["duration_s"] + 1)
    assert corrected(h) == storm["corrected"]
    unc = n.nvmlDeviceGetTotalEccErrors(
        h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC
    )
    assert unc == 0
    gpu.set_time(dbe["at_s"])
    values = n.nvmlDeviceGetFieldValues(
        h,
        [
            n.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
            n.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
            n.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
        ],
    )
    # Xid 48 brings one uncorrectable error, a pending uncorrectable row remap (Xid 63)
    # and Xid 94 (contained), as on a real H100.
    assert [v.value.ullVal for v in values] == [storm["corrected"], 1, 1]
    assert n.nvmlDeviceGetRemappedRows(h) == (0, 1, 1, 0)  # uncorrectable row, remap pending
    events = [(e.eventType, e.eventData) for e in (n.nvmlEventSetWait_v2(es, 0) for _ in range(4))]
    assert events == [
        (n.nvmlEventTypeXidCriticalError, 48),
        (n.nvmlEventTypeDoubleBitEccError, 0),
        (n.nvmlEventTypeXidCriticalError, 63),
        (n.nvmlEventTypeXidCriticalError, 94),
    ]
    with pytest.raises(n.NVMLError_Timeout):
        n.nvmlEventSetWait_v2(es, 0)
    n.nvmlEventSetFree(es)


def test_ecc_inject_now(sim_gpu: sim.SimGpu, init: Any) -> None:
    init()
    h = n.nvmlDeviceGetHandleByIndex(1)
    sim_gpu.advance(5)
    sim_gpu.inject("ecc", gpu=1, corrected=7, uncorrected=2)
    assert n.nvmlDeviceGetTotalEccErrors(h, 0, n.NVML_VOLATILE_ECC) == 7
    assert n.nvmlDeviceGetTotalEccErrors(h, 1, n.NVML_AGGREGATE_ECC) == 2
    assert n.nvmlDeviceGetTotalEccErrors(n.nvmlDeviceGetHandleByIndex(0), 0, 0) == 0


# -- throttling -------------------------------------------------------------------------


def test_scripted_throttle_window(sim_scenario: Activate, init: Any) -> None:
    gpu = sim_scenario("thermal-throttling")
    init()
    window = gpu.scenario.raw["event"][0]
    start, dur, factor = window["at_s"], window["duration_s"], window["clock_factor"]
    h = n.nvmlDeviceGetHandleByIndex(window["gpu"])
    max_sm = n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM)

    def hw_thermal_ns() -> int:
        (v,) = n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN])
        assert v.nvmlReturn == n.NVML_SUCCESS
        return int(v.value.ullVal)

    gpu.set_time(start - 1)
    assert n.nvmlDeviceGetCurrentClocksEventReasons(h) == 0
    assert n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM) == max_sm
    gpu.set_time(start + dur / 2)
    reasons = n.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert reasons == n.nvmlClocksEventReasonHwThermalSlowdown | n.nvmlClocksEventReasonHwSlowdown
    assert n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM) == round(max_sm * factor)
    assert hw_thermal_ns() == round(dur / 2 * 1e9)
    gpu.set_time(start + dur + 30)
    assert n.nvmlDeviceGetCurrentClocksEventReasons(h) == 0
    assert hw_thermal_ns() == round(dur * 1e9)  # exactly the window, in ns


def test_injected_thermal_throttle_heats_the_board(sim_scenario: Activate, init: Any) -> None:
    # An injected hw_thermal window is a cooling fault: the throttled GPU heats to its
    # slowdown limit (the reason is visible in the temperature), its neighbour does not,
    # and it cools again once the window is over.
    gpu = sim_scenario(_base())
    init()
    hot, cool = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(1)
    slowdown = gpu.scenario.devices[0]["slowdown_temp_c"]
    gpu.advance(120)  # both boards settle at their working temperature
    settled = n.nvmlDeviceGetTemperature(hot, 0)
    assert settled < slowdown - 5 and settled == n.nvmlDeviceGetTemperature(cool, 0)
    gpu.inject("throttle", gpu=0, reason="hw_thermal", duration_s=120)
    gpu.advance(110)
    assert slowdown - 1 <= n.nvmlDeviceGetTemperature(hot, 0) <= slowdown + 2
    assert n.nvmlDeviceGetTemperature(cool, 0) == settled
    reasons = n.nvmlDeviceGetCurrentClocksEventReasons(hot)
    assert reasons & n.nvmlClocksEventReasonHwThermalSlowdown
    gpu.advance(200)  # window over: back to the working temperature, no throttle
    assert n.nvmlDeviceGetTemperature(hot, 0) <= settled + 1
    assert n.nvmlDeviceGetCurrentClocksEventReasons(hot) == 0


def test_thermal_slowdown_when_temperature_crosses_threshold(
    sim_scenario: Activate, init: Any
) -> None:
    gpu = sim_scenario("thermal-throttling")
    init()
    hot = gpu.scenario.raw["gpu"][0]
    idx = hot["index"]
    h = n.nvmlDeviceGetHandleByIndex(idx)
    model = gpu.scenario.devices[idx]
    util = gpu.scenario.raw["gpus"]["utilization"]
    # temperature: T(t) = target + (T0 - target) * exp(-t / tau), from the TOML numbers
    power = model["idle_power_w"] + (model["max_power_w"] - model["idle_power_w"]) * util / 100
    t0 = hot["ambient_c"] + model["idle_power_w"] * hot["thermal_c_per_w"]
    target = hot["ambient_c"] + power * hot["thermal_c_per_w"]
    slowdown = model["slowdown_temp_c"]
    assert t0 < slowdown < target
    crossing = -hot["thermal_tau_s"] * math.log((target - slowdown) / (target - t0))

    def temp(t: float) -> float:
        return float(target + (t0 - target) * math.exp(-t / hot["thermal_tau_s"]))

    gpu.set_time(crossing / 2)
    assert n.nvmlDeviceGetTemperature(h, 0) == round(temp(crossing / 2))
    gpu.set_time(crossing - 0.1)
    assert (
        n.nvmlDeviceGetCurrentClocksEventReasons(h) & n.nvmlClocksEventReasonSwThermalSlowdown == 0
    )
    gpu.set_time(crossing + 0.1)
    assert n.nvmlDeviceGetCurrentClocksEventReasons(h) & n.nvmlClocksEventReasonSwThermalSlowdown
    assert n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM) == round(
        model["sm_clock_mhz"] * model["thermal_clock_factor"]
    )
    # Clocks and power drop together: the dynamic power scales with the clock factor.
    throttled_w = (
        model["idle_power_w"] + (power - model["idle_power_w"]) * model["thermal_clock_factor"]
    )
    assert n.nvmlDeviceGetPowerUsage(h) == round(throttled_w * 1000)
    # So the temperature holds at the slowdown limit instead of climbing to the target.
    temps = []
    for k in range(1, 101):
        gpu.set_time(crossing + k)
        temps.append(n.nvmlDeviceGetTemperature(h, 0))
    assert slowdown - 2 <= min(temps) and max(temps) <= slowdown + 1 < target
    (v,) = n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN])
    assert 10 < v.value.ullVal / 1e9 < 100  # throttling comes and goes around the limit
    # the cool GPUs never throttle
    assert n.nvmlDeviceGetCurrentClocksEventReasons(n.nvmlDeviceGetHandleByIndex(0)) == 0


def test_power_cap(sim_scenario: Activate, init: Any) -> None:
    # demand 100 + (900 - 100) * 1.0 = 900 W > 400 W limit: capped, SwPowerCap all the time
    scenario = _base(utilization=100, idle_power_w=100, max_power_w=900, power_limit_w=400)
    scenario["event"] = [
        {
            "at_s": 10,
            "gpu": 1,
            "kind": "throttle",
            "reason": "sw_power_cap",
            "duration_s": 5,
            "power_cap_w": 250,
            "clock_factor": 0.8,
        },
    ]
    gpu = sim_scenario(scenario)
    init()
    h0, h1 = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(1)
    gpu.set_time(12)
    assert n.nvmlDeviceGetPowerUsage(h0) == 400_000
    assert n.nvmlDeviceGetPowerUsage(h1) == 250_000
    assert n.nvmlDeviceGetCurrentClocksEventReasons(h0) == n.nvmlClocksEventReasonSwPowerCap
    gpu.set_time(20)
    (v,) = n.nvmlDeviceGetFieldValues(h0, [n.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP])
    assert v.value.ullVal == 20 * 10**9
    assert n.nvmlDeviceGetViolationStatus(h0, n.NVML_PERF_POLICY_POWER).violationTime == 20 * 10**9
    # energy: 400 W for 20 s on GPU 0; GPU 1 spent 5 of them at 250 W
    assert n.nvmlDeviceGetTotalEnergyConsumption(h0) == 400 * 20 * 1000
    assert n.nvmlDeviceGetTotalEnergyConsumption(h1) == (400 * 15 + 250 * 5) * 1000


def test_inject_throttle_now(sim_gpu: sim.SimGpu, init: Any) -> None:
    init()
    h = n.nvmlDeviceGetHandleByIndex(0)
    sim_gpu.advance(3)
    sim_gpu.inject("throttle", gpu=0, reason=["hw_power_brake"], duration_s=2, clock_factor=0.5)
    sim_gpu.advance(1)
    assert n.nvmlDeviceGetCurrentClocksEventReasons(h) == (
        n.nvmlClocksEventReasonHwPowerBrakeSlowdown | n.nvmlClocksEventReasonHwSlowdown
    )
    sim_gpu.advance(5)
    (v,) = n.nvmlDeviceGetFieldValues(
        h, [n.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN]
    )
    assert v.value.ullVal == 2 * 10**9


# -- GPU lost -------------------------------------------------------------------------------


def test_gpu_falls_off_the_bus(sim_scenario: Activate, init: Any) -> None:
    gpu = sim_scenario("xid79-gpu-lost")
    init()
    lost = gpu.scenario.raw["event"][0]
    g, at = lost["gpu"], lost["at_s"]
    h = n.nvmlDeviceGetHandleByIndex(g)
    es = n.nvmlEventSetCreate()
    n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, es)
    gpu.set_time(at - 0.5)
    assert n.nvmlDeviceGetPowerUsage(h) > 0
    gpu.set_time(at)
    for call in (
        lambda: n.nvmlDeviceGetPowerUsage(h),
        lambda: n.nvmlDeviceGetUUID(h),
        lambda: n.nvmlDeviceGetMemoryInfo(h),
        lambda: n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]),
        lambda: n.nvmlDeviceGetRemappedRows(h),
        lambda: n.nvmlDeviceGetHandleByIndex(g),
    ):
        with pytest.raises(n.NVMLError_GpuIsLost):
            call()
    assert n.nvmlDeviceGetCount() == gpu.scenario.gpu_count  # still enumerated
    others = [i for i in range(gpu.scenario.gpu_count) if i != g]
    assert all(n.nvmlDeviceGetPowerUsage(n.nvmlDeviceGetHandleByIndex(i)) > 0 for i in others)
    data = n.nvmlEventSetWait_v2(es, 0)
    assert (data.eventType, data.eventData) == (n.nvmlEventTypeXidCriticalError, 79)
    start = time.monotonic()
    with pytest.raises(n.NVMLError_GpuIsLost):  # after the Xid: blocks, then GPU_IS_LOST
        n.nvmlEventSetWait_v2(es, 100)
    assert time.monotonic() - start >= 0.09
    n.nvmlEventSetFree(es)


# -- slow NVML ------------------------------------------------------------------------------


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def test_slow_calls(sim_scenario: Activate, init: Any) -> None:
    scenario = _base()
    scenario["driver"] = {"latency_ms": 20}
    scenario["event"] = [{"at_s": 10, "gpu": 0, "kind": "slow", "latency_ms": 100, "duration_s": 5}]
    gpu = sim_scenario(scenario)
    init()
    h0, h1 = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(1)
    assert _timed(lambda: n.nvmlDeviceGetPowerUsage(h0)) >= 0.020
    gpu.set_time(12)
    assert _timed(lambda: n.nvmlDeviceGetPowerUsage(h0)) >= 0.120
    fast = _timed(lambda: n.nvmlDeviceGetPowerUsage(h1))
    assert 0.020 <= fast < 0.120
    # the latency is slept outside the library lock: slow calls do not serialise
    threads = [threading.Thread(target=lambda: n.nvmlDeviceGetPowerUsage(h0)) for _ in range(4)]

    def start_and_join() -> None:
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    elapsed = _timed(start_and_join)
    assert elapsed < 4 * 0.120
    gpu.set_time(15)
    assert _timed(lambda: n.nvmlDeviceGetPowerUsage(h0)) < 0.100


# -- NOT_SUPPORTED fields ---------------------------------------------------------------------


def test_consumer_card_not_supported(sim_scenario: Activate, init: Any) -> None:
    gpu = sim_scenario("consumer-rtx4090")
    init()
    h = n.nvmlDeviceGetHandleByIndex(0)
    for call in (
        lambda: n.nvmlDeviceGetEccMode(h),
        lambda: n.nvmlDeviceGetTotalEccErrors(h, 0, 0),
        lambda: n.nvmlDeviceGetRemappedRows(h),
        lambda: n.nvmlDeviceGetNvLinkState(h, 0),
        lambda: n.nvmlDeviceGetMigMode(h),
        lambda: n.nvmlDeviceRegisterEvents(
            h, n.nvmlEventTypeDoubleBitEccError, n.nvmlEventSetCreate()
        ),
    ):
        with pytest.raises(n.NVMLError_NotSupported):
            call()
    ecc, nvlink, energy = n.nvmlDeviceGetFieldValues(
        h,
        [
            n.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
            (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF),
            n.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
        ],
    )
    assert ecc.nvmlReturn == nvlink.nvmlReturn == n.NVML_ERROR_NOT_SUPPORTED
    assert energy.nvmlReturn == n.NVML_SUCCESS
    assert n.nvmlDeviceGetSupportedEventTypes(h) == n.nvmlEventTypeXidCriticalError
    # GeForce has fans: 30 % + 1.4 %/°C above 30 °C (docs/simulator.md)
    dev = gpu.scenario.devices[0]
    temp_idle = dev["ambient_c"] + dev["idle_power_w"] * dev["thermal_c_per_w"]
    assert n.nvmlDeviceGetNumFans(h) == 2
    assert n.nvmlDeviceGetTemperature(h, 0) == round(temp_idle)
    assert n.nvmlDeviceGetFanSpeed(h) == round(min(100, max(30, 30 + (temp_idle - 30) * 1.4)))
    assert n.nvmlDeviceGetFanSpeed_v2(h, 1) == n.nvmlDeviceGetFanSpeed(h)


def test_unsupported_list(sim_scenario: Activate, init: Any) -> None:
    sim_scenario(_base(unsupported=["power", "energy", "utilization", "processes"]))
    init()
    h = n.nvmlDeviceGetHandleByIndex(0)
    for call in (
        lambda: n.nvmlDeviceGetPowerUsage(h),
        lambda: n.nvmlDeviceGetTotalEnergyConsumption(h),
        lambda: n.nvmlDeviceGetUtilizationRates(h),
        lambda: n.nvmlDeviceGetComputeRunningProcesses(h),
        lambda: n.nvmlDeviceGetEnforcedPowerLimit(h),
    ):
        with pytest.raises(n.NVMLError_NotSupported):
            call()
    (power,) = n.nvmlDeviceGetFieldValues(h, [(n.NVML_FI_DEV_POWER_INSTANT, 0)])
    assert power.nvmlReturn == n.NVML_ERROR_NOT_SUPPORTED
    assert n.nvmlDeviceGetName(h) == "NVIDIA A100-SXM4-80GB"  # the rest still works


# -- init failure ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("driver_not_loaded", n.NVMLError_DriverNotLoaded),
        ("no_permission", n.NVMLError_NoPermission),
        ("lib_rm_version_mismatch", n.NVMLError_LibRmVersionMismatch),
    ],
)
def test_init_failure(sim_scenario: Activate, name: str, error: type[Exception]) -> None:
    scenario = _base()
    scenario["driver"] = {"init_error": name}
    sim_scenario(scenario)
    with pytest.raises(error):
        n.nvmlInit()
    with pytest.raises(n.NVMLError_Uninitialized):
        n.nvmlDeviceGetCount()


def test_builtin_driver_not_loaded(sim_scenario: Activate) -> None:
    sim_scenario("driver-not-loaded")
    with pytest.raises(n.NVMLError_DriverNotLoaded):
        n.nvmlInit()
