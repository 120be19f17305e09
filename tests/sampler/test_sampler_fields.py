"""Every sampled field against the simulator: scenario numbers and a real pynvml cross-check."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml
import pytest

from otelgpu import sim
from otelgpu.sampler import BaseGpuSampler

H100_IDLE_W, H100_MAX_W = 70.0, 690.0
GIB = 1 << 30


def _pynvml_reading(index: int) -> dict[str, Any]:
    """The same fields read independently through pynvml (a different NVML client)."""
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        util = pynvml.nvmlDeviceGetUtilizationRates(h)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        mem_v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
        fields = pynvml.nvmlDeviceGetFieldValues(h, [74, 270, 197, 198, (138, 0xFFFFFFFF), 82, 94])
        remap = pynvml.nvmlDeviceGetRemappedRows(h)
        return {
            "uuid": pynvml.nvmlDeviceGetUUID(h),
            "gpu_util_pct": util.gpu,
            "memory_util_pct": util.memory,
            "memory_used_bytes": mem.used,  # v2: excludes the reserved memory
            "memory_reserved_bytes": mem.reserved,
            "memory_used_v1_bytes": mem_v1.used,
            "memory_total_bytes": mem.total,
            "memory_temperature_c": fields[5].value.uiVal,
            "pcie_replay_count": fields[6].value.uiVal,
            "remapped_rows": dict(
                zip(("correctable", "uncorrectable", "pending", "failure"), remap, strict=True)
            ),
            "encoder_util_pct": pynvml.nvmlDeviceGetEncoderUtilization(h)[0],
            "decoder_util_pct": pynvml.nvmlDeviceGetDecoderUtilization(h)[0],
            "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "energy_mj": pynvml.nvmlDeviceGetTotalEnergyConsumption(h),
            "temperature_c": pynvml.nvmlDeviceGetTemperature(h, 0),
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, 1),
            "memory_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, 2),
            "clock_event_reasons": pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
            "sw_power_cap_ns": fields[0].value.ullVal,
            "hw_thermal_ns": fields[1].value.ullVal,
            "pcie_tx_bytes": fields[2].value.ullVal,
            "pcie_rx_bytes": fields[3].value.ullVal,
            "nvlink_tx_bytes": fields[4].value.ullVal * 1024,
            "ecc_corrected": pynvml.nvmlDeviceGetTotalEccErrors(h, 0, 0),
            "ecc_uncorrected": pynvml.nvmlDeviceGetTotalEccErrors(h, 1, 0),
            "pstate": pynvml.nvmlDeviceGetPerformanceState(h),
        }
    finally:
        pynvml.nvmlShutdown()


def test_every_field_matches_the_scenario_and_pynvml(
    sim_gpu: sim.SimGpu, make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    sampler = make_sampler()
    assert len(sampler.devices) == 2
    sim_gpu.advance(5.0)  # inside the 80 % phase of the square wave
    sampler.sample_once(timestamp_ns=sim_gpu.time_ns())
    for index, device in enumerate(sampler.devices):
        s = sampler.latest(device.uuid)
        assert s is not None
        expected = _pynvml_reading(index)
        assert s.uuid == expected["uuid"]
        assert s.time_ns == sim_gpu.time_ns()
        assert s.status == "ok" and s.field_errors == 0
        # Scenario numbers: 80 % load, 40 % memory utilization, power model, H100 clocks.
        assert s.gpu_util_pct == 80
        assert s.memory_util_pct == 40
        assert s.power_w == pytest.approx(H100_IDLE_W + (H100_MAX_W - H100_IDLE_W) * 0.80, abs=1)
        assert s.memory_total_bytes == device.memory_total_bytes
        assert s.memory_used_bytes is not None and s.memory_used_bytes >= 21 * GIB - 1
        assert s.sm_clock_mhz == 1980 and s.memory_clock_mhz == 2619
        assert s.clock_event_reasons == 0 and s.throttle_reason_names == ()
        assert s.pstate == 0
        assert s.fan_speed_pct is None  # the H100 SXM model has no fan: NOT_SUPPORTED
        assert s.ecc_corrected == 0 and s.ecc_uncorrected == 0
        assert s.energy_mj is not None and s.energy_mj > 0
        assert 20 <= (s.temperature_c or 0) <= 90
        # pynvml at the same (frozen virtual) time reads exactly the same values.
        for field in (
            "gpu_util_pct",
            "memory_util_pct",
            "memory_used_bytes",
            "memory_total_bytes",
            "power_w",
            "energy_mj",
            "temperature_c",
            "sm_clock_mhz",
            "memory_clock_mhz",
            "clock_event_reasons",
            "pcie_tx_bytes",
            "pcie_rx_bytes",
            "nvlink_tx_bytes",
            "ecc_corrected",
            "ecc_uncorrected",
            "pstate",
            "memory_reserved_bytes",
            "memory_temperature_c",
            "pcie_replay_count",
            "remapped_rows",
            "encoder_util_pct",
            "decoder_util_pct",
        ):
            assert getattr(s, field) == expected[field], field
        # Memory v2, as nvidia-smi: used excludes the reserved memory that v1 counts.
        assert s.memory_reserved_bytes == 512 << 20  # the model's reserved_mib
        assert s.memory_used_bytes + s.memory_reserved_bytes == expected["memory_used_v1_bytes"]
        assert s.memory_temperature_c == (s.temperature_c or 0) + 6  # H100 mem offset 6 C
        assert s.throttle_ns["sw_power_cap"] == expected["sw_power_cap_ns"]
        assert s.throttle_ns["hw_thermal_slowdown"] == expected["hw_thermal_ns"]
        assert set(s.throttle_ns) >= {"sw_power_cap", "hw_thermal_slowdown", "sync_boost"}
        assert "fan_speed" not in sampler.supported_fields(device.uuid)
        assert "power" in sampler.supported_fields(device.uuid)


def test_counters_grow_with_scenario_time(
    sim_gpu: sim.SimGpu, make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    sampler = make_sampler()
    uuid = sampler.devices[0].uuid
    sim_gpu.advance(3.0)
    sampler.sample_once(timestamp_ns=sim_gpu.time_ns())
    first = sampler.latest(uuid)
    sim_gpu.advance(4.0)  # 80 % load throughout [3, 7)
    sampler.sample_once(timestamp_ns=sim_gpu.time_ns())
    second = sampler.latest(uuid)
    assert first is not None and second is not None
    power_w = H100_IDLE_W + (H100_MAX_W - H100_IDLE_W) * 0.80
    assert second.energy_mj - first.energy_mj == pytest.approx(power_w * 4.0 * 1000, rel=0.01)  # type: ignore[operator]
    # PCIe at 80 % of the model's 2000 MB/s TX, 6000 MB/s RX.
    assert second.pcie_tx_bytes - first.pcie_tx_bytes == pytest.approx(0.8 * 2000e6 * 4, rel=0.02)  # type: ignore[operator]
    assert second.pcie_rx_bytes - first.pcie_rx_bytes == pytest.approx(0.8 * 6000e6 * 4, rel=0.02)  # type: ignore[operator]
    assert second.nvlink_tx_bytes > first.nvlink_tx_bytes  # type: ignore[operator]


def test_sample_status_and_unknown_device(
    sim_gpu: sim.SimGpu, make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    sampler = make_sampler()
    assert sampler.latest("GPU-not-a-device") is None
    assert sampler.latest(sampler.devices[0].uuid) is None  # nothing sampled yet
    assert sampler.window("GPU-not-a-device", 0, 1) is None
    assert sampler.events(0, 2**62, uuid="GPU-not-a-device") == []


def test_memory_falls_back_to_v1_without_memory_v2(
    sim_with: Callable[..., sim.SimGpu],
    make_sampler: Callable[..., BaseGpuSampler],
) -> None:
    """A driver without MemoryInfo v2 (< 515): memory is still sampled (v1, used includes
    the reserved memory), only the reserved field is off -- with NVML's reason."""
    gpu = sim_with(unsupported=["memory_v2"])
    sampler = make_sampler()
    gpu.advance(1.0)
    sampler.sample_once(timestamp_ns=gpu.time_ns())
    uuid = sampler.devices[0].uuid
    s = sampler.latest(uuid)
    assert s is not None and s.status == "ok"
    pynvml.nvmlInit()
    try:
        v1 = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        pynvml.nvmlShutdown()
    assert s.memory_used_bytes == v1.used == 21 * GIB + (512 << 20)
    assert s.memory_reserved_bytes is None
    assert "memory" in sampler.supported_fields(uuid)
    assert "memory_reserved" not in sampler.supported_fields(uuid)
    assert sampler.unsupported_fields(uuid) == {
        "fan_speed": "the device does not support it (NVML_ERROR_NOT_SUPPORTED)",
        "memory_reserved": "the device does not support it (NVML_ERROR_NOT_SUPPORTED)",
    }


def test_device_details_match_pynvml(
    sim_gpu: sim.SimGpu, make_sampler: Callable[..., BaseGpuSampler]
) -> None:
    """VBIOS, serial and temperature limits on DeviceInfo, read once at discovery."""
    sampler = make_sampler()
    pynvml.nvmlInit()
    try:
        for index, device in enumerate(sampler.devices):
            h = pynvml.nvmlDeviceGetHandleByIndex(index)
            assert device.uuid == pynvml.nvmlDeviceGetUUID(h)
            assert device.vbios_version == pynvml.nvmlDeviceGetVbiosVersion(h)
            assert device.serial == pynvml.nvmlDeviceGetSerial(h)
            d = device.details
            assert d.slowdown_temp_c == pynvml.nvmlDeviceGetTemperatureThreshold(h, 1) == 87
            assert d.shutdown_temp_c == pynvml.nvmlDeviceGetTemperatureThreshold(h, 0) == 92
    finally:
        pynvml.nvmlShutdown()
