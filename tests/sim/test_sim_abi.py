"""C ABI details pynvml hides: two-call size queries, short buffers, NULL arguments.

Calls go straight through ctypes with pynvml's own struct declarations (the layouts
in src_ext/common/nvml_abi.h).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from typing import Any

import pynvml
import pytest

from otelgpu import sim

SUCCESS, INVALID_ARGUMENT, NOT_SUPPORTED, NOT_FOUND, INSUFFICIENT_SIZE = 0, 2, 3, 6, 7

SCENARIO: dict[str, Any] = {
    "version": 1,
    "gpus": {"count": 2, "utilization": 40},
    "process": [
        {"gpu": 0, "pid": 11, "memory_gib": 1},
        {"gpu": 0, "pid": 12, "memory_gib": 2},
        {"gpu": 0, "pid": 13, "memory_gib": 3},
    ],
}


@pytest.fixture
def lib(
    sim_scenario: Callable[..., sim.SimGpu],
) -> Iterator[tuple[ctypes.CDLL, list[ctypes.c_void_p]]]:
    sim_scenario(SCENARIO)
    lib = ctypes.CDLL(sim.library_path())
    assert lib.nvmlInit_v2() == SUCCESS
    handles = []
    for i in range(2):
        h = ctypes.c_void_p()
        assert lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == SUCCESS
        handles.append(h)
    yield lib, handles
    lib.nvmlShutdown()


def test_struct_sizes_match_pynvml() -> None:
    assert ctypes.sizeof(pynvml.c_nvmlMemory_v2_t) == 40
    assert ctypes.sizeof(pynvml.c_nvmlFieldValue_t) == 40
    assert ctypes.sizeof(pynvml.c_nvmlProcessInfo_v3_t) == 24
    assert ctypes.sizeof(pynvml.c_nvmlEventData_t) == 32
    assert ctypes.sizeof(pynvml.nvmlPciInfo_t) == 68


def test_running_processes_two_call(lib: tuple[ctypes.CDLL, list[ctypes.c_void_p]]) -> None:
    c, (h0, h1) = lib
    count = ctypes.c_uint(0)
    assert (
        c.nvmlDeviceGetComputeRunningProcesses_v3(h0, ctypes.byref(count), None)
        == INSUFFICIENT_SIZE
    )
    assert count.value == 3
    assert c.nvmlDeviceGetComputeRunningProcesses_v3(h1, ctypes.byref(count), None) == SUCCESS
    assert count.value == 0  # no processes: the size query succeeds (pynvml returns [])
    buf = (pynvml.c_nvmlProcessInfo_v3_t * 11)()
    count.value = 11
    assert c.nvmlDeviceGetComputeRunningProcesses_v3(h0, ctypes.byref(count), buf) == SUCCESS
    assert count.value == 3
    assert [(buf[i].pid, buf[i].usedGpuMemory >> 30) for i in range(3)] == [
        (11, 1),
        (12, 2),
        (13, 3),
    ]
    assert buf[0].gpuInstanceId == 0xFFFFFFFF
    count.value = 2  # too small
    assert (
        c.nvmlDeviceGetComputeRunningProcesses_v3(h0, ctypes.byref(count), buf) == INSUFFICIENT_SIZE
    )
    assert count.value == 3


def test_v1_process_struct_is_16_bytes(lib: tuple[ctypes.CDLL, list[ctypes.c_void_p]]) -> None:
    c, (h0, _) = lib

    class ProcV1(ctypes.Structure):
        _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]

    buf = (ProcV1 * 3)()
    count = ctypes.c_uint(3)
    assert c.nvmlDeviceGetComputeRunningProcesses(h0, ctypes.byref(count), buf) == SUCCESS
    assert [p.pid for p in buf] == [11, 12, 13]


def test_process_utilization_size_query(lib: tuple[ctypes.CDLL, list[ctypes.c_void_p]]) -> None:
    c, (h0, h1) = lib
    count = ctypes.c_uint(0)
    assert (
        c.nvmlDeviceGetProcessUtilization(h0, None, ctypes.byref(count), ctypes.c_ulonglong(0))
        == INSUFFICIENT_SIZE
    )
    assert count.value == 3
    assert (
        c.nvmlDeviceGetProcessUtilization(h1, None, ctypes.byref(count), ctypes.c_ulonglong(0))
        == NOT_FOUND
    )


def test_samples_size_query(lib: tuple[ctypes.CDLL, list[ctypes.c_void_p]]) -> None:
    c, (h0, _) = lib
    val_type, count = ctypes.c_uint(99), ctypes.c_uint(0)
    rc = c.nvmlDeviceGetSamples(
        h0, 1, ctypes.c_ulonglong(0), ctypes.byref(val_type), ctypes.byref(count), None
    )
    assert rc == SUCCESS  # pynvml raises on anything else
    assert val_type.value == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT and count.value > 0
    buf = (pynvml.c_nvmlSample_t * count.value)()
    rc = c.nvmlDeviceGetSamples(
        h0, 1, ctypes.c_ulonglong(0), ctypes.byref(val_type), ctypes.byref(count), buf
    )
    assert rc == SUCCESS and count.value == 1  # t = 0: one 100 ms sample so far
    assert buf[0].sampleValue.uiVal == 40
    rc = c.nvmlDeviceGetSamples(
        h0, 99, ctypes.c_ulonglong(0), ctypes.byref(val_type), ctypes.byref(count), None
    )
    assert rc == INVALID_ARGUMENT


def test_strings_and_null_arguments(lib: tuple[ctypes.CDLL, list[ctypes.c_void_p]]) -> None:
    c, (h0, _) = lib
    small = ctypes.create_string_buffer(8)
    assert c.nvmlDeviceGetName(h0, small, 8) == INSUFFICIENT_SIZE
    assert c.nvmlDeviceGetUUID(h0, small, 8) == INSUFFICIENT_SIZE
    exact = ctypes.create_string_buffer(len(b"NVIDIA H100 80GB HBM3") + 1)
    assert c.nvmlDeviceGetName(h0, exact, len(exact)) == SUCCESS
    assert exact.value == b"NVIDIA H100 80GB HBM3"
    assert c.nvmlDeviceGetPowerUsage(h0, None) == INVALID_ARGUMENT
    assert c.nvmlDeviceGetPowerUsage(None, ctypes.byref(ctypes.c_uint())) == INVALID_ARGUMENT
    bogus = ctypes.c_void_p(ctypes.addressof(small))  # not one of our handles
    assert c.nvmlDeviceGetPowerUsage(bogus, ctypes.byref(ctypes.c_uint())) == INVALID_ARGUMENT
    assert (
        c.nvmlEventSetWait_v2(bogus, ctypes.byref(pynvml.c_nvmlEventData_t()), 0)
        == INVALID_ARGUMENT
    )


def test_processes_utilization_info_version(lib: tuple[ctypes.CDLL, list[ctypes.c_void_p]]) -> None:
    c, (h0, _) = lib
    info = pynvml.c_nvmlProcessesUtilizationInfo_v1_t()
    info.version = 0x02000018  # wrong
    assert c.nvmlDeviceGetProcessesUtilizationInfo(h0, ctypes.byref(info)) == 25  # VERSION_MISMATCH
    info.version = pynvml.ProcessesUtilizationInfo_v1
    info.processSamplesCount = 0
    assert c.nvmlDeviceGetProcessesUtilizationInfo(h0, ctypes.byref(info)) == INSUFFICIENT_SIZE
    assert info.processSamplesCount == 3


def test_handles_are_stable_and_distinct(lib: tuple[ctypes.CDLL, list[ctypes.c_void_p]]) -> None:
    c, (h0, h1) = lib
    again = ctypes.c_void_p()
    assert c.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(again)) == SUCCESS
    assert again.value == h0.value and h0.value != h1.value and h0.value
    assert c.nvmlDeviceGetNumFans(h0, ctypes.byref(ctypes.c_uint())) == NOT_SUPPORTED
