"""Every tier A and tier B NVML call through the real pynvml binding.

Expected values are computed here from the scenario's own numbers (SCENARIO below)
with the model stated in docs/simulator.md, not read back from the simulator.
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from otelgpu import sim

GIB = 1 << 30
MIB = 1 << 20
IDLE_W, MAX_W, LIMIT_W = 100.0, 600.0, 700.0
AMBIENT, C_PER_W, TAU = 30.0, 0.1, 10.0
UUID1 = "GPU-11111111-2222-3333-4444-555555555555"

SCENARIO: dict[str, Any] = {
    "version": 1,
    "name": "pynvml-tiers",
    "driver": {"version": "550.54.15", "cuda_version": "12.4"},
    "gpus": {
        "count": 2,
        "model": "H100-SXM",
        "memory_gib": 80,
        "reserved_mib": 512,
        "idle_power_w": IDLE_W,
        "max_power_w": MAX_W,
        "power_limit_w": LIMIT_W,
        "default_power_limit_w": LIMIT_W,
        "min_power_limit_w": 200,
        "max_power_limit_w": LIMIT_W,
        # 50 % for 10 s, then 100 %
        "utilization": {"kind": "steps", "points": [[0, 50], [10, 100]]},
        "memory_utilization": 30,
        "memory_used_gib": 2,
        "sm_clock_mhz": 1980,
        "sm_clock_idle_mhz": 345,
        "mem_clock_mhz": 2619,
        "pcie_tx_mb_s": 1000,
        "pcie_rx_mb_s": 3000,
        "nvlink_links": 18,
        "nvlink_tx_mb_s": 18000,
        "nvlink_rx_mb_s": 36000,
        "ambient_c": AMBIENT,
        "thermal_c_per_w": C_PER_W,
        "thermal_tau_s": TAU,
        "slowdown_temp_c": 87,
        "shutdown_temp_c": 92,
    },
    "gpu": [
        {"index": 1, "uuid": UUID1, "serial": "1650000000042", "pci_bus_id": "00000000:2A:00.0"}
    ],
    "process": [
        {"gpu": 0, "pid": 1001, "name": "python a.py", "memory_gib": 10},
        {"gpu": 0, "pid": 1002, "name": "python b.py", "memory_gib": 5, "start_s": 5, "end_s": 20},
    ],
}


def util_at(t: float) -> float:
    return 50.0 if t < 10 else 100.0


def power_w(t: float) -> float:
    return IDLE_W + (MAX_W - IDLE_W) * util_at(t) / 100.0


def temperature(t: float) -> float:
    """First-order lag towards ambient + P * c_per_w, starting idle (ambient + idle * c)."""
    temp = AMBIENT + IDLE_W * C_PER_W
    for start, end in ((0.0, 10.0), (10.0, math.inf)):
        if t <= start:
            break
        target = AMBIENT + power_w(start) * C_PER_W
        temp = target + (temp - target) * math.exp(-(min(t, end) - start) / TAU)
    return temp


@pytest.fixture
def tiers(sim_scenario: Callable[..., sim.SimGpu]) -> Iterator[tuple[Any, sim.SimGpu]]:
    gpu = sim_scenario(SCENARIO, clock="virtual")
    import pynvml

    pynvml.nvmlInit()
    yield pynvml, gpu
    pynvml.nvmlShutdown()


def test_system_and_enumeration(tiers: tuple[Any, sim.SimGpu]) -> None:
    n, _ = tiers
    assert n.nvmlSystemGetDriverVersion() == "550.54.15"
    assert n.nvmlSystemGetNVMLVersion() == "12.550.54.15"
    assert n.nvmlSystemGetCudaDriverVersion() == 12040
    assert n.nvmlSystemGetCudaDriverVersion_v2() == 12040
    assert n.nvmlDeviceGetCount() == 2
    h0, h1 = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(1)
    assert n.nvmlDeviceGetIndex(h1) == 1
    assert n.nvmlDeviceGetMinorNumber(h1) == 1
    assert n.nvmlDeviceGetUUID(h1) == UUID1
    assert n.nvmlDeviceGetSerial(h1) == "1650000000042"
    assert n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(UUID1)) == 1
    assert n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByPciBusId("00000000:2A:00.0")) == 1
    assert n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByPciBusId("0000:2a:00.0")) == 1
    with pytest.raises(n.NVMLError_NotFound):
        n.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceGetHandleByIndex(2)
    assert n.nvmlDeviceGetName(h0) == "NVIDIA H100 80GB HBM3"
    assert n.nvmlDeviceGetUUID(h0).startswith("GPU-") and n.nvmlDeviceGetUUID(h0) != UUID1
    pci = n.nvmlDeviceGetPciInfo(h1)
    assert pci.busId == "00000000:2A:00.0"
    assert pci.busIdLegacy == "0000:2A:00.0"
    assert (pci.domain, pci.bus, pci.device) == (0, 0x2A, 0)
    assert pci.pciDeviceId == 0x233010DE  # H100 SXM
    assert n.nvmlDeviceGetArchitecture(h0) == n.NVML_DEVICE_ARCH_HOPPER
    assert n.nvmlDeviceGetCudaComputeCapability(h0) == (9, 0)
    assert n.nvmlErrorString(n.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"


def test_memory_v1_and_v2(tiers: tuple[Any, sim.SimGpu]) -> None:
    n, gpu = tiers
    h = n.nvmlDeviceGetHandleByIndex(0)
    gpu.set_time(1.0)  # process 1001 (10 GiB) + memory_used_gib 2
    v2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
    assert v2.total == 80 * GIB
    assert v2.reserved == 512 * MIB
    assert v2.used == 12 * GIB
    assert v2.free == 80 * GIB - 512 * MIB - 12 * GIB
    v1 = n.nvmlDeviceGetMemoryInfo(h)
    assert v1.used == 12 * GIB + 512 * MIB  # v1 'used' includes reserved
    assert v1.free == v1.total - v1.used
    gpu.set_time(6.0)  # process 1002 (5 GiB) running in [5, 20)
    assert n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2).used == 17 * GIB
    gpu.set_time(25.0)
    assert n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2).used == 12 * GIB


def test_memory_v2_version_checked(tiers: tuple[Any, sim.SimGpu]) -> None:
    import ctypes

    n, _ = tiers
    h = n.nvmlDeviceGetHandleByIndex(0)
    mem = n.c_nvmlMemory_v2_t()
    mem.version = 0x01000028  # wrong version
    fn = n._nvmlGetFunctionPointer("nvmlDeviceGetMemoryInfo_v2")
    assert fn(h, ctypes.byref(mem)) == n.NVML_ERROR_ARGUMENT_VERSION_MISMATCH


def test_utilization_power_energy_temperature(tiers: tuple[Any, sim.SimGpu]) -> None:
    n, gpu = tiers
    h = n.nvmlDeviceGetHandleByIndex(0)
    u = n.nvmlDeviceGetUtilizationRates(h)
    assert (u.gpu, u.memory) == (50, 30)
    assert n.nvmlDeviceGetPowerUsage(h) == round(power_w(0) * 1000)
    assert n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU) == round(temperature(0))
    assert n.nvmlDeviceGetTemperatureV(h, n.NVML_TEMPERATURE_GPU) == round(temperature(0))
    assert n.nvmlDeviceGetTotalEnergyConsumption(h) == 0
    gpu.set_time(15.0)
    assert n.nvmlDeviceGetUtilizationRates(h).gpu == 100
    assert n.nvmlDeviceGetPowerUsage(h) == round(power_w(15) * 1000)
    # energy: 350 W for 10 s + 600 W for 5 s, in mJ
    assert n.nvmlDeviceGetTotalEnergyConsumption(h) == pytest.approx(
        (power_w(0) * 10 + power_w(15) * 5) * 1000, abs=1
    )
    # temperature rises with power
    assert temperature(15) > temperature(0)
    assert n.nvmlDeviceGetTemperature(h, 0) == round(temperature(15))
    assert n.nvmlDeviceGetTemperatureThreshold(h, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) == 87
    assert n.nvmlDeviceGetTemperatureThreshold(h, n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN) == 92


def test_power_limits_fans_pstate(tiers: tuple[Any, sim.SimGpu]) -> None:
    n, _ = tiers
    h = n.nvmlDeviceGetHandleByIndex(0)
    assert n.nvmlDeviceGetPowerManagementLimit(h) == LIMIT_W * 1000
    assert n.nvmlDeviceGetEnforcedPowerLimit(h) == LIMIT_W * 1000
    assert n.nvmlDeviceGetPowerManagementDefaultLimit(h) == LIMIT_W * 1000
    assert n.nvmlDeviceGetPowerManagementLimitConstraints(h) == [200_000, 700_000]
    with pytest.raises(n.NVMLError_NotSupported):  # SXM boards have no fan
        n.nvmlDeviceGetFanSpeed(h)
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetNumFans(h)
    assert n.nvmlDeviceGetPerformanceState(h) == 0  # busy


def test_clocks_and_reasons(tiers: tuple[Any, sim.SimGpu]) -> None:
    n, _ = tiers
    h = n.nvmlDeviceGetHandleByIndex(0)
    assert n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM) == 1980
    assert n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_GRAPHICS) == 1980
    assert n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM) == 2619
    assert n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM) == 1980
    assert n.nvmlDeviceGetClock(h, n.NVML_CLOCK_SM, n.NVML_CLOCK_ID_CURRENT) == 1980
    assert n.nvmlDeviceGetCurrentClocksEventReasons(h) == 0
    assert n.nvmlDeviceGetCurrentClocksThrottleReasons(h) == 0
    supported = n.nvmlDeviceGetSupportedClocksEventReasons(h)
    for bit in (0x1, 0x4, 0x8, 0x20, 0x40, 0x80):
        assert supported & bit
    v = n.nvmlDeviceGetViolationStatus(h, n.NVML_PERF_POLICY_POWER)
    assert v.violationTime == 0


def test_field_values(tiers: tuple[Any, sim.SimGpu]) -> None:
    n, gpu = tiers
    h = n.nvmlDeviceGetHandleByIndex(0)
    gpu.set_time(15.0)
    ids = [
        n.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
        (n.NVML_FI_DEV_POWER_INSTANT, 0),
        (n.NVML_FI_DEV_POWER_AVERAGE, 0),
        n.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
        n.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
        (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF),
        (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0xFFFFFFFF),
        (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0),
        n.NVML_FI_DEV_NVLINK_LINK_COUNT,
        n.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP,
        n.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
        n.NVML_FI_DEV_REMAPPED_COR,
        9999,
    ]
    values = n.nvmlDeviceGetFieldValues(h, ids)
    by_id = [(v.fieldId, v.scopeId, v.nvmlReturn) for v in values]
    util_seconds = 0.5 * 10 + 1.0 * 5  # integral of util/100 over [0, 15]
    assert values[0].value.ullVal == pytest.approx(
        (power_w(0) * 10 + power_w(15) * 5) * 1000, abs=1
    )
    assert values[1].value.uiVal == round(power_w(15) * 1000)
    assert values[2].value.uiVal == round(power_w(15) * 1000)
    assert values[3].value.ullVal == pytest.approx(1000e6 * util_seconds, rel=1e-9)
    assert values[4].value.ullVal == pytest.approx(3000e6 * util_seconds, rel=1e-9)
    assert values[5].value.ullVal == pytest.approx(18000e6 * util_seconds / 1024, abs=1)
    assert values[6].value.ullVal == pytest.approx(36000e6 * util_seconds / 1024, abs=1)
    assert values[7].value.ullVal == pytest.approx(18000e6 * util_seconds / 18 / 1024, abs=1)
    assert values[8].value.uiVal == 18
    assert values[9].value.ullVal == 0
    assert values[10].value.ullVal == 0
    assert values[11].value.uiVal == 0
    assert [r for _, _, r in by_id[:-1]] == [0] * (len(ids) - 1)
    assert by_id[-1][2] == n.NVML_ERROR_NOT_SUPPORTED  # unknown field: per-entry error
    # timestamps are epoch microseconds of the scenario time
    assert values[0].timestamp == (gpu.epoch_ns + 15 * 10**9) // 1000


def test_processes(tiers: tuple[Any, sim.SimGpu]) -> None:
    n, gpu = tiers
    h0, h1 = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(1)
    gpu.set_time(6.0)
    procs = n.nvmlDeviceGetComputeRunningProcesses(h0)
    assert sorted((p.pid, p.usedGpuMemory) for p in procs) == [(1001, 10 * GIB), (1002, 5 * GIB)]
    assert n.nvmlDeviceGetComputeRunningProcesses(h1) == []
    assert n.nvmlDeviceGetGraphicsRunningProcesses(h0) == []
    assert n.nvmlSystemGetProcessName(1002) == "python b.py"
    util = n.nvmlDeviceGetProcessUtilization(h0, 0)
    assert sorted((s.pid, s.smUtil, s.memUtil) for s in util) == [(1001, 50, 30), (1002, 50, 30)]
    info = n.nvmlDeviceGetProcessesUtilizationInfo(h0, 0)
    assert sorted((s.pid, s.smUtil) for s in info) == [(1001, 50), (1002, 50)]
    with pytest.raises(n.NVMLError_NotFound):  # no samples newer than "now"
        n.nvmlDeviceGetProcessUtilization(h0, gpu.time_ns() // 1000)


def test_samples(tiers: tuple[Any, sim.SimGpu]) -> None:
    n, gpu = tiers
    h = n.nvmlDeviceGetHandleByIndex(0)
    gpu.set_time(10.5)
    last_seen = (gpu.epoch_ns + 9_750_000_000) // 1000  # epoch µs of t = 9.75 s
    val_type, samples = n.nvmlDeviceGetSamples(h, n.NVML_GPU_UTILIZATION_SAMPLES, last_seen)
    assert val_type == n.NVML_VALUE_TYPE_UNSIGNED_INT
    got = [((s.timeStamp * 1000 - gpu.epoch_ns) / 1e9, s.sampleValue.uiVal) for s in samples]
    expected = [(t / 10, util_at(t / 10)) for t in range(98, 106)]  # 100 ms grid
    assert [(round(t, 3), v) for t, v in got] == [(round(t, 3), v) for t, v in expected]
    _, power = n.nvmlDeviceGetSamples(h, n.NVML_TOTAL_POWER_SAMPLES, last_seen)
    assert power[-1].sampleValue.uiVal == round(power_w(10.5) * 1000)


def test_health_tier_b(tiers: tuple[Any, sim.SimGpu]) -> None:
    n, _ = tiers
    h = n.nvmlDeviceGetHandleByIndex(0)
    assert n.nvmlDeviceGetEccMode(h) == [1, 1]
    assert (
        n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC)
        == 0
    )
    assert (
        n.nvmlDeviceGetMemoryErrorCounter(
            h,
            n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            n.NVML_AGGREGATE_ECC,
            n.NVML_MEMORY_LOCATION_DRAM,
        )
        == 0
    )
    assert n.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)
    with pytest.raises(n.NVMLError_NotSupported):  # Hopper remaps rows instead
        n.nvmlDeviceGetRetiredPages(h, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    assert n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES) == 1000e6 * 0.5 / 1000
    assert n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_RX_BYTES) == 3000e6 * 0.5 / 1000
    assert n.nvmlDeviceGetPcieReplayCounter(h) == 0
    assert n.nvmlDeviceGetCurrPcieLinkGeneration(h) == 5
    assert n.nvmlDeviceGetCurrPcieLinkWidth(h) == 16
    assert n.nvmlDeviceGetNvLinkState(h, 0) == 1
    assert n.nvmlDeviceGetNvLinkErrorCounter(h, 0, n.NVML_NVLINK_ERROR_DL_REPLAY) == 0
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceGetNvLinkState(h, 18)
    assert n.nvmlDeviceGetMigMode(h) == [0, 0]
    assert n.nvmlDeviceGetMaxMigDeviceCount(h) == 7
    assert not n.nvmlDeviceIsMigDeviceHandle(h)
    with pytest.raises(n.NVMLError_NotFound):
        n.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    assert n.nvmlDeviceGetSupportedEventTypes(h) & n.nvmlEventTypeXidCriticalError


def test_event_api_roundtrip(tiers: tuple[Any, sim.SimGpu]) -> None:
    n, gpu = tiers
    h1 = n.nvmlDeviceGetHandleByIndex(1)
    es = n.nvmlEventSetCreate()
    n.nvmlDeviceRegisterEvents(h1, n.nvmlEventTypeXidCriticalError, es)
    with pytest.raises(n.NVMLError_Timeout):
        n.nvmlEventSetWait_v2(es, 0)
    gpu.inject("xid", gpu=1, code=31)
    data = n.nvmlEventSetWait_v2(es, 1000)
    assert data.eventType == n.nvmlEventTypeXidCriticalError
    assert data.eventData == 31
    assert n.nvmlDeviceGetUUID(data.device) == UUID1
    assert (data.gpuInstanceId, data.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    n.nvmlEventSetFree(es)


def test_uninitialized_before_init() -> None:
    """A fresh process: device calls answer UNINITIALIZED until nvmlInit and after the
    matching nvmlShutdown. (A subprocess: in this one, clients of earlier tests -- nvitop,
    a forked sampler -- may legitimately still hold an init, which the library keeps.)"""
    program = textwrap.dedent(
        f"""
        import ctypes
        from otelgpu import sim
        sim.activate({SCENARIO!r})
        lib = ctypes.CDLL(sim.library_path())
        count = ctypes.c_uint(99)
        before = lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
        init = lib.nvmlInit_v2()
        during = lib.nvmlDeviceGetCount_v2(ctypes.byref(count)), count.value
        shutdown = lib.nvmlShutdown()
        after = lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
        extra = lib.nvmlShutdown()  # more shutdowns than inits
        print(before, init, during[0], during[1], shutdown, after, extra)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    # 1 = NVML_ERROR_UNINITIALIZED
    assert out == ["1", "0", "0", "2", "0", "1", "1"]


def test_every_pynvml_symbol_exists() -> None:
    """Every function pynvml looks up resolves (stubs answer NOT_SUPPORTED)."""
    import ctypes
    import re
    from pathlib import Path

    import pynvml

    names = set(
        re.findall(r'_nvmlGetFunctionPointer\("(\w+)"\)', Path(pynvml.__file__).read_text())
    )
    assert len(names) > 300
    lib = ctypes.CDLL(sim.library_path())
    missing = sorted(name for name in names if not hasattr(lib, name))
    assert missing == []
    assert lib.nvmlDeviceGetGpcClkVfOffset(None, None) == 3  # a stub: NOT_SUPPORTED


def test_compatibility_tier_c(tiers: tuple[Any, sim.SimGpu]) -> None:
    """Calls nvitop, gpustat and torch.cuda make besides tiers A/B."""
    n, gpu = tiers
    h = n.nvmlDeviceGetHandleByIndex(0)
    assert n.nvmlDeviceGetEncoderUtilization(h) == [0, 167000]
    assert n.nvmlDeviceGetDecoderUtilization(h) == [0, 167000]
    assert n.nvmlDeviceGetComputeMode(h) == n.NVML_COMPUTEMODE_DEFAULT
    assert n.nvmlDeviceGetPersistenceMode(h) == n.NVML_FEATURE_ENABLED
    assert n.nvmlDeviceGetDisplayActive(h) == 0 and n.nvmlDeviceGetDisplayMode(h) == 0
    assert n.nvmlDeviceGetBrand(h) == n.NVML_BRAND_NVIDIA
    assert n.nvmlDeviceGetPowerManagementMode(h) == n.NVML_FEATURE_ENABLED
    assert n.nvmlDeviceGetPowerState(h) == 0
    bar1 = n.nvmlDeviceGetBAR1MemoryInfo(h)
    assert bar1.bar1Total == 128 * GIB and bar1.bar1Free + bar1.bar1Used == bar1.bar1Total
    assert n.nvmlDeviceGetApplicationsClock(h, n.NVML_CLOCK_SM) == 1980
    assert n.nvmlDeviceGetDefaultApplicationsClock(h, n.NVML_CLOCK_MEM) == 2619
    assert n.nvmlDeviceGetMaxCustomerBoostClock(h, n.NVML_CLOCK_SM) == 1980
    assert n.nvmlDeviceGetSupportedClocksThrottleReasons(
        h
    ) == n.nvmlDeviceGetSupportedClocksEventReasons(h)
    assert n.nvmlDeviceGetMaxPcieLinkGeneration(h) == 5
    assert n.nvmlDeviceGetGpuMaxPcieLinkGeneration(h) == 5
    assert n.nvmlDeviceGetMaxPcieLinkWidth(h) == 16
    assert n.nvmlDeviceGetNvLinkVersion(h, 0) == 4
    assert n.nvmlDeviceGetBoardPartNumber(h) and n.nvmlDeviceGetVbiosVersion(h)
    gpu.set_time(6.0)
    v2 = n.nvmlDeviceGetComputeRunningProcesses_v2(h)
    assert sorted(p.pid for p in v2) == [1001, 1002]
    assert n.nvmlDeviceGetMPSComputeRunningProcesses(h) == []
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetRetiredPagesPendingStatus(h)
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetRetiredPages_v2(
            h, n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        )
    with pytest.raises(n.NVMLError_InvalidArgument):  # not a MIG handle
        n.nvmlDeviceGetGpuInstanceId(h)
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceGetComputeInstanceId(h)
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h)


def test_every_init_entry_point(sim_scenario: Callable[..., sim.SimGpu]) -> None:
    """pynvml uses nvmlInitWithFlags, C clients nvmlInit_v2, torch.cuda legacy nvmlInit;
    the library keeps its own refcount across all three."""
    import ctypes

    gpu = sim_scenario(SCENARIO)
    lib = ctypes.CDLL(sim.library_path())
    held = gpu.nvml_refcount()  # inits other clients in this process still hold
    assert lib.nvmlInit() == 0
    assert lib.nvmlInit_v2() == 0
    assert lib.nvmlInitWithFlags(0) == 0
    assert gpu.nvml_refcount() == held + 3
    assert [lib.nvmlShutdown() for _ in range(3)] == [0, 0, 0]
    assert gpu.nvml_refcount() == held
    # the v1 event wait (24-byte nvmlEventData_t)
    assert lib.nvmlInit_v2() == 0
    handle, es = ctypes.c_void_p(), ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) == 0
    assert lib.nvmlEventSetCreate(ctypes.byref(es)) == 0
    assert lib.nvmlDeviceRegisterEvents(handle, ctypes.c_ulonglong(8), es) == 0
    gpu.inject("xid", gpu=0, code=62)
    data = (ctypes.c_ulonglong * 4)(0, 0, 0, 0xABCD)  # 24 bytes written, the 4th untouched
    assert lib.nvmlEventSetWait(es, data, 0) == 0
    assert (data[0], data[1], data[2], data[3]) == (handle.value, 8, 62, 0xABCD)
    assert lib.nvmlEventSetFree(es) == 0
    assert lib.nvmlShutdown() == 0
