"""The pure core's reusable NVML requests (``otelgpu.sampler._nvml_requests``) read what
pynvml's own calls and structures read, value type by value type, against the simulator."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest

from otelgpu import sim
from otelgpu.sampler import PyGpuSampler
from otelgpu.sampler import _core_py as core_py
from otelgpu.sampler import _fields as F
from otelgpu.sampler._nvml_requests import (
    DeviceReads,
    FieldRequest,
    GpmRequest,
    PublicReads,
    decode_field,
)

VALUES: dict[int, tuple[str, list[Any]]] = {
    0: ("dVal", [0.0, 1.5, 12345.99, -3.0, 2.0**40]),
    1: ("uiVal", [0, 7, 2**32 - 1]),
    2: ("ulVal", [0, 2**40 + 3, 2**64 - 1]),
    3: ("ullVal", [0, 1, 2**63 + 5, 2**64 - 1]),
    4: ("sllVal", [0, 42, -1, -(2**62), 2**62]),
    5: ("siVal", [0, 9, -1, -(2**31), 2**31 - 1]),
    6: ("usVal", [0, 65535, 300]),
}


@pytest.mark.parametrize("value_type", sorted(VALUES))
def test_decode_field_reads_the_union_as_the_structure_path_does(value_type: int) -> None:
    member, values = VALUES[value_type]
    for value in values:
        fv = pynvml.c_nvmlFieldValue_t()
        fv.value.ullVal = 0xA5A5A5A5A5A5A5A5  # bytes a narrower member leaves alone
        setattr(fv.value, member, value)
        fv.valueType = value_type
        raw = int.from_bytes(bytes(fv.value), "little")
        assert decode_field(value_type, raw) == core_py._field_u64(fv), (member, value)


@pytest.fixture
def nvml(sim_gpu: sim.SimGpu) -> Iterator[Any]:
    pynvml.nvmlInit()
    yield pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlShutdown()


def test_field_request_reads_what_pynvml_reads(sim_gpu: sim.SimGpu, nvml: Any) -> None:
    fields = [(fid, scope) for fid, scope, _ in F.FIELD_TABLE] + [(9999, 0)]  # one unknown
    request = FieldRequest(pynvml, fields)
    for _ in range(3):  # the same buffer again: nothing of the previous answer remains
        sim_gpu.advance(7.0)
        got = request.read(nvml)
        expected = [
            (int(fv.nvmlReturn), core_py._field_u64(fv) if fv.nvmlReturn == 0 else 0)
            for fv in pynvml.nvmlDeviceGetFieldValues(nvml, fields)
        ]
        assert got == expected
        assert got[0][0] == 0 and got[0][1] > 0  # energy, mJ
        assert got[-1][0] != 0  # the unknown field fails alone


def test_gpm_request_reads_what_the_pynvml_structure_reads(sim_gpu: sim.SimGpu, nvml: Any) -> None:
    samples = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
    ids = F.GPM_IDS
    request = GpmRequest(pynvml, samples, ids)
    pynvml.nvmlGpmSampleGet(nvml, samples[0])
    for cur in (1, 0, 1):  # the newer sample alternates, as in the core
        sim_gpu.advance(0.5)
        pynvml.nvmlGpmSampleGet(nvml, samples[cur])
        got = request.get(cur)
        mg = pynvml.c_nvmlGpmMetricsGet_t()
        mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        mg.sample1, mg.sample2 = samples[1 - cur], samples[cur]
        mg.numMetrics = len(ids)
        for j, mid in enumerate(ids):
            mg.metrics[j].metricId = mid
        pynvml.nvmlGpmMetricsGet(mg)
        expected = [(int(mg.metrics[j].nvmlReturn), mg.metrics[j].value) for j in range(len(ids))]
        assert got == expected
        assert any(code == 0 and value > 0 for code, value in got)
    for sample in samples:
        pynvml.nvmlGpmSampleFree(sample)


def test_pure_core_samples_the_same_without_its_reusable_requests(
    sim_gpu: sim.SimGpu, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback (pynvml's public calls, another pynvml's layout) and the reusable
    requests give the same samples, GPM and counters included."""
    fast = PyGpuSampler()
    slow = PyGpuSampler()

    def unavailable(*_args: Any) -> Any:
        raise ValueError("unexpected layout")

    def public_reads(nv: Any, handle: Any) -> PublicReads:
        return PublicReads(nv, handle)

    try:
        for _ in range(4):
            sim_gpu.advance(0.25)
            t = sim_gpu.time_ns()
            fast.sample_once(timestamp_ns=t)
            with monkeypatch.context() as m:
                m.setattr(core_py, "FieldRequest", unavailable)
                m.setattr(core_py, "GpmRequest", unavailable)
                m.setattr(core_py, "device_reads", public_reads)
                slow.sample_once(timestamp_ns=t)
        fast_core: Any = fast._core
        slow_core: Any = slow._core
        assert fast_core._dev[0].field_request is not None
        assert slow_core._dev[0].field_request is None
        assert type(fast_core._dev[0].reads) is DeviceReads
        assert type(slow_core._dev[0].reads) is PublicReads
        for device in fast.devices:
            a, b = fast.latest(device.uuid), slow.latest(device.uuid)
            assert a is not None and a == b
            assert a.gpm and a.energy_mj and a.throttle_ns
    finally:
        for s in (fast, slow):
            s.close()


def test_field_value_layout_is_checked() -> None:
    class Odd(ctypes.Structure):
        _fields_ = [
            ("fieldId", ctypes.c_uint32),
            ("scopeId", ctypes.c_uint32),
            ("valueType", ctypes.c_uint32),
            ("value", ctypes.c_uint64),
            ("nvmlReturn", ctypes.c_uint32),
        ]

    class OddNvml:
        c_nvmlFieldValue_t = Odd

        @staticmethod
        def _nvmlGetFunctionPointer(name: str) -> Any:
            raise AssertionError(name)

    with pytest.raises(ValueError, match="layout"):
        FieldRequest(OddNvml, [(83, 0)])


class _NvmlWithout:
    """pynvml as a library without the symbols ``missing`` would look."""

    def __init__(self, missing: set[str]) -> None:
        self._missing = missing

    def __getattr__(self, name: str) -> Any:
        return getattr(pynvml, name)

    def _nvmlGetFunctionPointer(self, name: str) -> Any:
        if name in self._missing:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return pynvml._nvmlGetFunctionPointer(name)


def test_device_reads_read_what_pynvml_reads(sim_gpu: sim.SimGpu, nvml: Any) -> None:
    reads, public = DeviceReads(pynvml, nvml), PublicReads(pynvml, nvml)
    names = [
        "utilization", "memory_v2", "memory_v1", "power", "temperature", "sm_clock",
        "mem_clock", "reasons", "fan", "pstate", "encoder", "decoder",
    ]  # fmt: skip
    for _ in range(3):
        sim_gpu.advance(3.0)
        got = {n: getattr(reads, n)() for n in names}
        expected = {n: getattr(public, n)() for n in names}
        assert {n: code for n, (code, _) in got.items()} == {
            n: code for n, (code, _) in expected.items()
        }
        assert {n: v for n, (code, v) in got.items() if not code} == {
            n: v for n, (code, v) in expected.items() if not code
        }
    assert got["power"][1] > 0 and got["memory_v2"][1][1] > 0 and got["sm_clock"][1] > 0


def test_device_reads_look_symbols_up_as_the_native_core(sim_gpu: sim.SimGpu, nvml: Any) -> None:
    """A library without the clock event reasons reads the older throttle reasons (as
    ``otg_nvml.h``); a symbol missing altogether reads as FUNCTION_NOT_FOUND, which the
    core's field rules switch off like a NOT_SUPPORTED answer."""
    old = DeviceReads(_NvmlWithout({"nvmlDeviceGetCurrentClocksEventReasons"}), nvml)
    new = DeviceReads(pynvml, nvml)
    assert old.reasons()[0] == 0 and old.reasons() == new.reasons()
    none = DeviceReads(
        _NvmlWithout(
            {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"}
        ),
        nvml,
    )
    assert none.reasons()[0] == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    assert pynvml.NVML_ERROR_FUNCTION_NOT_FOUND in F.NOT_SUPPORTED_CODES
