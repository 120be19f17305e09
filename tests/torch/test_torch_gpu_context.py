"""Step spans carry the GPU context of exactly their window, for the GPUs the process
trains on (setting ``step_devices``; simulated 8-GPU node, real sampler, real torch)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch  # the test command installs it: a missing torch must fail, not skip
from fixtures.otel import attributes_of
from fixtures.torch_runtime import RuntimeHarness

from otelgpu._settings import resolve
from otelgpu.errors import ConfigurationError
from otelgpu.instrumentation.torch import TorchInstrumentor, flush
from otelgpu.instrumentation.torch._devices import StepDevices, cuda_devices_in_use

NODE = {
    "version": 1,
    "name": "torch-node-8",
    "gpus": {"count": 8, "model": "H100-SXM", "utilization": 70, "memory_used_gib": 2},
}


@pytest.fixture
def node(sim_scenario: Any) -> Iterator[Any]:
    """A started sampler over a simulated 8-GPU node (wall clock, as the sampler's)."""
    from otelgpu.sampler import GpuSampler

    sim_scenario(NODE, clock="wall")
    sampler = GpuSampler(interval_s=0.01)
    sampler.start()
    try:
        yield sampler
    finally:
        sampler.stop()


def _train(sampler: Any, **settings: object) -> list[dict[str, Any]]:
    harness = RuntimeHarness(sampler=sampler, **settings)
    try:
        harness.instrument()
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            model(torch.randn(4, 8)).sum().backward()
            time.sleep(0.08)  # a step long enough for several samples
            opt.step()
        flush()
        return [attributes_of(s) for s in harness.step_spans()]
    finally:
        TorchInstrumentor().uninstrument()


def _gpu_keys(attrs: dict[str, Any]) -> set[str]:
    return {k for k in attrs if k.startswith(("otelgpu.gpu.", "hw."))}


@pytest.mark.slow
def test_cpu_only_run_gets_no_gpu_context(node: Any) -> None:
    """Issue 15.7: a CPU-only torch run on an 8-GPU node uses no GPU: its steps carry no
    GPU context (it used to get the average of all 8)."""
    assert not torch.cuda.is_initialized()
    spans = _train(node)
    assert len(spans) == 4
    assert [_gpu_keys(a) for a in spans] == [set()] * 4


def _utilization(spans: list[dict[str, Any]]) -> list[float]:
    """Mean utilization of the steps whose window got samples (a starved sampler thread
    on a loaded machine may leave a step without any)."""
    values = [
        a["otelgpu.gpu.utilization.mean"] for a in spans if "otelgpu.gpu.utilization.mean" in a
    ]
    assert values, spans
    return values


@pytest.mark.slow
def test_step_devices_all_and_explicit(node: Any) -> None:
    """The override: ``all`` is every sampled GPU; a CUDA index is exactly that GPU."""
    by_index = {d.cuda_index: d.uuid for d in node.devices}
    everything = _train(node, step_devices="all")
    assert len(everything) == 4
    # Every sampled GPU: the constant-size context (count, worst GPU), no id list.
    with_data = [a for a in everything if "otelgpu.gpu.count" in a]
    assert with_data, everything
    assert {a["otelgpu.gpu.count"] for a in with_data} == {8}
    assert all(a["otelgpu.gpu.worst.id"] in set(by_index.values()) for a in with_data)
    assert not any("otelgpu.gpu.ids" in a or "hw.id" in a for a in everything)
    assert _utilization(everything) == pytest.approx(
        [0.70] * len(_utilization(everything)), abs=0.01
    )
    third = _train(node, step_devices=("2",))
    assert len(third) == 4
    assert {a["hw.id"] for a in third if "hw.id" in a} == {by_index[2]}
    assert not any("otelgpu.gpu.ids" in a for a in third)
    assert _utilization(third) == pytest.approx([0.70] * len(_utilization(third)), abs=0.01)


def test_auto_follows_the_cuda_devices_in_use(node: Any) -> None:
    """``auto`` maps the CUDA ordinals in use to the sampled GPUs (the probe is given here:
    this torch build has no CUDA, and the real probe answers "none" for it)."""
    assert cuda_devices_in_use() == set()  # real torch, CUDA never initialised
    by_index = {d.cuda_index: d.uuid for d in node.devices}
    in_use: set[int] = set()
    devices = StepDevices("auto", node.devices, in_use=lambda: set(in_use))
    assert devices.for_step(1) == []
    in_use.add(3)
    assert devices.for_step(2) == [by_index[3]]
    in_use.add(5)
    assert devices.for_step(50) == [by_index[3]]  # cached between refreshes
    assert devices.for_step(100) == [by_index[3], by_index[5]]
    assert StepDevices("none", node.devices).for_step(1) == []
    assert StepDevices("all", node.devices).for_step(1) is None
    errors: list[str] = []
    picked = StepDevices(("1", by_index[6][:12], "9"), node.devices, errors.append)
    assert picked.for_step(1) == [by_index[1], by_index[6]]
    assert errors == ["step_devices entry '9' matches no sampled GPU"]


def test_step_devices_setting_fails_fast() -> None:
    assert resolve({}, {}).step_devices == "auto"
    assert resolve({}, {"OTELGPU_STEP_DEVICES": "ALL"}).step_devices == "all"
    assert resolve({"step_devices": [0, 1]}, {}).step_devices == ("0", "1")
    assert resolve({}, {"OTELGPU_STEP_DEVICES": "0, GPU-1"}).step_devices == ("0", "GPU-1")
    with pytest.raises(ConfigurationError, match="OTELGPU_STEP_DEVICES"):
        resolve({}, {"OTELGPU_STEP_DEVICES": "0,all"})
    with pytest.raises(ConfigurationError, match="step_devices"):
        resolve({"step_devices": 3}, {})
