"""GPM on step spans: the memory-bound scenario's steps read ~95 % utilization and ~10 %
tensor activity -- the case GPM exists to expose -- through the real pipeline (real OTel
SDK tracer provider, the sampler of ``otelgpu.instrument()`` on the wall-clock simulator)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otelgpu
from otelgpu import sim
from otelgpu.metrics import catalog

pytestmark = pytest.mark.usefixtures("reset_otel_globals")


def test_pipeline_memory_bound_step_spans_show_low_tensor_activity(
    sim_scenario: Callable[..., sim.SimGpu],
) -> None:
    sim_scenario("memory-bound-decode", clock="wall")
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    handle = otelgpu.instrument(tracer_provider=provider, exporters="none", sample_interval_ms=100)
    try:
        time.sleep(0.25)  # the first GPM sample is the baseline of the next ones
        for _ in range(2):
            with otelgpu.step(samples=4):
                time.sleep(0.75)
    finally:
        handle.shutdown()
        provider.shutdown()
    steps = [s for s in spans.get_finished_spans() if s.name == catalog.STEP_SPAN]
    assert len(steps) == 2
    for span in steps:
        attrs = dict(span.attributes or {})
        assert attrs["otelgpu.gpu.utilization.mean"] == pytest.approx(0.95)
        assert attrs["otelgpu.gpu.tensor.activity"] == pytest.approx(0.10)
        assert attrs["otelgpu.gpu.sm.activity"] == pytest.approx(0.60)
        assert attrs["otelgpu.gpu.sm.occupancy"] == pytest.approx(0.25)
        assert attrs["otelgpu.gpu.dram.activity"] == pytest.approx(0.85)
        assert attrs["otelgpu.gpu.fp32.activity"] == pytest.approx(0.12)
        assert attrs["otelgpu.gpu.energy"] > 0
