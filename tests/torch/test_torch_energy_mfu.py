"""Energy per step and MFU on a real torch loop (CPU torch, the real sampler over a
simulated H100, the torch instrumentor's step rule): the steps' energy adds up to the
sampler's energy window over the loop, and ``flops_per_step`` gives each step its MFU."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch  # the test command installs it: a missing torch must fail, not skip
from fixtures.otel import attributes_of, span_seconds, span_times
from fixtures.torch_runtime import RuntimeHarness, sampler_over

from otelgpu.instrumentation.torch import TorchInstrumentor, flush

NODE = {
    "version": 1,
    "name": "torch-energy-1",
    "gpus": {"count": 1, "model": "H100-SXM", "utilization": 90, "power_w": 500},
}
STEPS = 5
FLOPS = 2e12
STEP_SLEEP_S = 0.3


@pytest.fixture
def node(sim_scenario: Any) -> Iterator[Any]:
    with sampler_over(sim_scenario, NODE) as sampler:
        yield sampler


def test_energy_per_step_is_the_samplers_window_over_steps(node: Any) -> None:
    harness = RuntimeHarness(sampler=node, step_devices="all")
    try:
        harness.instrument(flops_per_step=FLOPS)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(STEPS + 1):  # the first optimizer.step() opens the first step
            model(torch.randn(4, 8)).sum().backward()
            # Well above the energy counter's 100 ms refresh: a step's counter delta runs
            # from the sample at or before its start to the last one before its end, so
            # it spans the refresh unless that last sample is > STEP_SLEEP_S - 0.1 s
            # late -- which a 10 ms pure-Python sampler on a loaded 2-core CI machine
            # was, once, at a 0.12 s step (the window fell back to power x time).
            time.sleep(STEP_SLEEP_S)
            opt.step()
        flush()
        spans = sorted(harness.step_spans(), key=span_times)
        assert len(spans) >= STEPS - 1
        (uuid,) = [d.uuid for d in node.devices]
        first, last = span_times(spans[0])[0], span_times(spans[-1])[1]
        window = node.windows(first, last)[uuid]
        assert window.energy_source == "counter"  # never power x time when the counter exists
        energies = [attributes_of(s)["otelgpu.gpu.energy"] for s in spans]
        # Each step's energy is exactly the sampler's energy window of that step ...
        for span, joules in zip(spans, energies, strict=True):
            step_window = node.windows(*span_times(span))[uuid]
            assert step_window.energy_source == "counter"
            assert joules == pytest.approx(step_window.energy_j, rel=1e-12)
        # ... and, the steps being contiguous, energy per step is the loop's energy window
        # over the steps. The sampler scales a counter delta to its window (the counter
        # refreshes every ~100 ms), so the two agree to the simulated power's jitter.
        gaps = [span_times(b)[0] - span_times(a)[1] for a, b in itertools.pairwise(spans)]
        assert gaps == [0] * (len(spans) - 1)
        assert sum(energies) / len(spans) == pytest.approx(window.energy_j / len(spans), rel=0.01)
        for span in spans:
            attrs = attributes_of(span)
            assert attrs["otelgpu.gpu.energy.source"] == "counter"
            duration_s = span_seconds(span)
            assert attrs["otelgpu.train.flops"] == FLOPS
            assert attrs["otelgpu.train.mfu"] == pytest.approx(FLOPS / (duration_s * 989e12))
        energy = harness.sketch("otelgpu.train.step.energy").merged()
        assert energy.count == len(spans)
        assert energy.sum == pytest.approx(sum(energies), rel=1e-9)
        mfu = harness.sketch("otelgpu.train.mfu").merged()
        assert mfu.count == len(spans)
    finally:
        TorchInstrumentor().uninstrument()
