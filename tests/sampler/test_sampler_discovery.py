"""Device discovery: CUDA_VISIBLE_DEVICES (indices, UUIDs, prefixes, MIG), CUDA order,
LOCAL_RANK and explicit devices -- as pure functions and against the simulator."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from otelgpu import sim
from otelgpu.errors import ConfigurationError
from otelgpu.nvml import (
    MigInstance,
    PhysicalGpu,
    discover,
    resolve_explicit,
    select_devices,
    visible_devices,
)
from otelgpu.sampler import BaseGpuSampler

U = [f"GPU-{k}{k}{k}{k}aaaa-0000-0000-0000-00000000000{k}" for k in range(4)]
MIG = "MIG-5a5a5a5a-1111-2222-3333-444444444444"

# NVML order 0..3 = PCI order; GPU 3 is newer (higher compute capability).
INVENTORY = [
    PhysicalGpu(0, U[0], "A100", "00000000:18:00.0", 80 << 30, (8, 0)),
    PhysicalGpu(
        1, U[1], "A100", "00000000:2A:00.0", 80 << 30, (8, 0), (MigInstance(MIG, "1g", 10 << 30),)
    ),
    PhysicalGpu(2, U[2], "A100", "00000000:3A:00.0", 80 << 30, (8, 0)),
    PhysicalGpu(3, U[3], "H100", "00000000:DB:00.0", 80 << 30, (9, 0)),
]


def _uuids(devices: object) -> list[str]:
    return [d.uuid for d in devices]  # type: ignore[attr-defined]


def test_cuda_order_fastest_first_and_pci_bus_id() -> None:
    assert _uuids(visible_devices(INVENTORY, None)) == [U[3], U[0], U[1], U[2]]
    assert _uuids(visible_devices(INVENTORY, None, "PCI_BUS_ID")) == U
    same_cc = [g for g in INVENTORY if g.compute_capability == (8, 0)]
    assert _uuids(visible_devices(same_cc, None)) == [U[0], U[1], U[2]]


def test_visible_devices_by_index_reorders_and_sets_cuda_index() -> None:
    devices = visible_devices(INVENTORY, "2,0", "PCI_BUS_ID")
    assert _uuids(devices) == [U[2], U[0]]
    assert [d.cuda_index for d in devices] == [0, 1]
    assert [d.nvml_index for d in devices] == [2, 0]
    fastest = visible_devices(INVENTORY, "0,1")  # FASTEST_FIRST: 3, 0, 1, 2
    assert _uuids(fastest) == [U[3], U[0]]


def test_visible_devices_by_uuid_prefix_and_mig() -> None:
    assert _uuids(visible_devices(INVENTORY, f"{U[2]}, GPU-1111")) == [U[2], U[1]]
    mig = visible_devices(INVENTORY, MIG[:12])
    assert _uuids(mig) == [MIG]
    assert mig[0].is_mig and mig[0].parent_uuid == U[1] and mig[0].nvml_index == 1
    assert mig[0].attributes()["hw.parent"] == U[1]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", []),
        ("-1", []),
        ("0,7,1", [U[3]]),  # an invalid index ends the list
        ("GPU-, 1", []),  # an ambiguous prefix ends it too
        ("GPU-nope,0", []),
        ("1,1,2", [U[0], U[1]]),  # duplicates are skipped
    ],
)
def test_invalid_entries_truncate_like_cuda(value: str, expected: list[str]) -> None:
    assert _uuids(visible_devices(INVENTORY, value)) == expected


def test_select_devices_by_rank(caplog: pytest.LogCaptureFixture) -> None:
    visible = visible_devices(INVENTORY, None, "PCI_BUS_ID")
    assert _uuids(select_devices(visible, local_rank=2)) == [visible[2].uuid]
    assert _uuids(select_devices(visible, local_rank=1, current_device=3)) == [visible[3].uuid]
    assert _uuids(select_devices(visible[:1], local_rank=5)) == [visible[0].uuid]  # one per rank
    assert _uuids(select_devices(visible)) == _uuids(visible)
    with caplog.at_level(logging.WARNING, logger="otelgpu"):
        assert len(select_devices(visible, local_rank=9)) == 4
    assert "rank device 9" in caplog.text


def test_resolve_explicit_devices() -> None:
    visible = visible_devices(INVENTORY, "2,3")
    got = resolve_explicit([1, U[3][:10], MIG], INVENTORY, visible)
    assert _uuids(got) == [U[2], U[3], MIG]
    assert got[0].cuda_index == 1 and got[1].cuda_index is None
    assert _uuids(resolve_explicit([got[0], U[1]], INVENTORY, visible)) == [U[2], U[1]]
    for bad in (5, "GPU-ffff", "", True):
        with pytest.raises(ConfigurationError) as info:
            resolve_explicit([bad], INVENTORY, visible)
        assert info.value.setting == "devices"


def test_discovery_against_the_simulator(
    sim_gpu: sim.SimGpu, monkeypatch: pytest.MonkeyPatch
) -> None:
    everything = discover(environ={})
    assert len(everything) == 2 and everything[0].name == "NVIDIA H100 80GB HBM3"
    second = everything[1].uuid
    assert _uuids(discover(environ={"CUDA_VISIBLE_DEVICES": "1"})) == [second]
    assert _uuids(discover(environ={"CUDA_VISIBLE_DEVICES": second[:13]})) == [second]
    assert _uuids(discover(environ={"LOCAL_RANK": "1"})) == [second]
    assert _uuids(discover(environ={"LOCAL_RANK": "x"})) == _uuids(everything)
    # An explicit list always wins over the launcher's rank.
    assert _uuids(discover([0], environ={"LOCAL_RANK": "1"})) == [everything[0].uuid]
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert _uuids(discover()) == [second]


def test_sampler_samples_only_the_ranks_device(
    sim_gpu: sim.SimGpu,
    make_sampler: Callable[..., BaseGpuSampler],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    sampler = make_sampler()
    assert len(sampler.devices) == 1 and sampler.devices[0].cuda_index == 1
    sampler.sample_once()
    assert sampler.stats().samples == 1
    explicit = make_sampler(devices=[d.uuid for d in discover(environ={})])
    assert len(explicit.devices) == 2
    with pytest.raises(ConfigurationError):
        make_sampler(devices=["GPU-does-not-exist"])


def test_a_gpu_lost_before_start_is_skipped(
    sim_with: Callable[..., sim.SimGpu],
    make_sampler: Callable[..., BaseGpuSampler],
    caplog: pytest.LogCaptureFixture,
) -> None:
    gpu = sim_with(event=[{"at_s": 0, "gpu": 1, "kind": "gpu_lost"}])
    gpu.advance(0.5)
    with caplog.at_level(logging.WARNING, logger="otelgpu"):
        sampler = make_sampler()
    assert len(sampler.devices) == 1 and sampler.devices[0].nvml_index == 0
    assert "skipping GPU 1" in caplog.text
    sampler.sample_once()
    s = sampler.latest(sampler.devices[0].uuid)
    assert s is not None and s.status == "ok"
