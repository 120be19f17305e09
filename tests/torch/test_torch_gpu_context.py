"""Step spans carry the GPU context of exactly their window (simulated GPU, real sampler)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch  # the test command installs it: a missing torch must fail, not skip
from torch_helpers import RuntimeHarness

from otelgpu.instrumentation.torch import TorchInstrumentor, flush


@pytest.mark.slow
def test_step_spans_have_gpu_context(sim_scenario: Any) -> None:
    from otelgpu.sampler import GpuSampler

    # Wall clock: the sampler timestamps its samples with time.time_ns().
    sim_scenario(
        {
            "version": 1,
            "name": "torch-steady",
            "gpus": {"count": 1, "model": "H100-SXM", "utilization": 70, "memory_used_gib": 2},
        },
        clock="wall",
    )
    sampler = GpuSampler(interval_s=0.01)
    sampler.start()
    harness = RuntimeHarness(sampler=sampler)
    try:
        harness.instrument()
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            model(torch.randn(4, 8)).sum().backward()
            time.sleep(0.08)  # a step long enough for several samples
            opt.step()
        flush()
        spans = harness.step_spans()
    finally:
        TorchInstrumentor().uninstrument()
        sampler.stop()
    assert len(spans) == 4
    for span in spans:
        attrs = dict(span.attributes)
        assert attrs["otelgpu.gpu.utilization.mean"] == pytest.approx(0.70, abs=0.01)
        assert attrs["otelgpu.gpu.samples"] >= 3
        assert "hw.id" in attrs
