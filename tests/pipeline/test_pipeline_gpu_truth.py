"""GPM on step spans: the memory-bound scenario's steps read ~95 % utilization and ~10 %
tensor activity -- the case GPM exists to expose -- through the real pipeline (real OTel
SDK tracer provider, the sampler of ``otelgpu.instrument()`` on the wall-clock simulator)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fixtures.otel import attributes_of, instrumented_steps

from otelgpu import sim

pytestmark = pytest.mark.usefixtures("reset_otel_globals")


def test_pipeline_memory_bound_step_spans_show_low_tensor_activity(
    sim_scenario: Callable[..., sim.SimGpu],
) -> None:
    sim_scenario("memory-bound-decode", clock="wall")
    # warm-up: the first GPM sample is the baseline of the next ones
    steps = instrumented_steps(2, 0.75, warmup_s=0.25, step={"samples": 4}, sample_interval_ms=100)
    for span in steps:
        attrs = attributes_of(span)
        assert attrs["otelgpu.gpu.utilization.mean"] == pytest.approx(0.95)
        assert attrs["otelgpu.gpu.tensor.activity"] == pytest.approx(0.10)
        assert attrs["otelgpu.gpu.sm.activity"] == pytest.approx(0.60)
        assert attrs["otelgpu.gpu.sm.occupancy"] == pytest.approx(0.25)
        assert attrs["otelgpu.gpu.dram.activity"] == pytest.approx(0.85)
        assert attrs["otelgpu.gpu.fp32.activity"] == pytest.approx(0.12)
        assert attrs["otelgpu.gpu.energy"] > 0
