"""Requests whose span nobody sees -- a tracer provider without span processor (e.g. a
Prometheus pull endpoint only) or a span the OTel sampler drops -- still record every
request metric and the request's GPU energy exactly; only the span attributes are skipped.
Real SDK providers, the sampler of ``otelgpu.instrument()`` on the simulated 8 GPUs."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fixtures.otel import attributes_of
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler

import otelgpu
from otelgpu import _runtime, sim
from otelgpu.metrics import catalog
from otelgpu.runtime.records import RequestRecord

pytestmark = pytest.mark.usefixtures("reset_otel_globals")


@pytest.fixture
def gpus(sim_scenario: Callable[..., sim.SimGpu]) -> Iterator[sim.SimGpu]:
    yield sim_scenario("healthy-8xh100", clock="wall")


def _instrument(tracer_provider: TracerProvider) -> _runtime.Runtime:
    otelgpu.instrument(
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]),
        exporters="none",
        frameworks="none",
        sample_interval_ms=20,
    )
    runtime = _runtime.current()
    assert runtime is not None
    deadline = time.monotonic() + 10
    while not runtime.sampler.devices or runtime.sampler.summary(0, 2**62) is None:
        assert time.monotonic() < deadline, "the sampler did not start"
        time.sleep(0.02)
    time.sleep(0.7)  # samples over the last 0.7 s: every window below has data
    return runtime


def _requests(runtime: _runtime.Runtime, n: int) -> list[tuple[Any, RequestRecord]]:
    """``n`` finished requests over windows the sampler covers, 30 ms each."""
    now = time.time_ns()
    out = []
    for k in range(n):
        start = now - (k + 1) * 40_000_000
        record = RequestRecord(
            start,
            start + 30_000_000,
            model="m",
            first_token_ns=start + 5_000_000,
            output_tokens=k,  # the first has no token: energy, no energy per token
        )
        out.append((runtime.record_request(record), record))
    return out


@pytest.mark.parametrize("otel_sampler", [ALWAYS_ON, ALWAYS_OFF], ids=["no-processor", "dropped"])
def test_pipeline_unseen_request_spans_keep_metrics_and_energy(
    gpus: sim.SimGpu, otel_sampler: Sampler
) -> None:
    tracer_provider = TracerProvider(sampler=otel_sampler)  # no span processor yet
    runtime = _instrument(tracer_provider)
    try:
        done = _requests(runtime, 12)
        sampler = runtime.sampler
        expected = []
        for span, record in done:
            # Real SDK spans (ids for the context), no attribute built for them.
            assert span.get_span_context().is_valid
            assert "otelgpu.gpu.energy" not in (getattr(span, "attributes", None) or {})
            summary = sampler.summary(record.start_ns, record.end_ns)
            assert summary is not None and summary.n_devices == 8
            expected.append((summary.energy_j, record.output_tokens))
        energy = runtime.instrument(catalog.REQUEST_ENERGY).merged()
        per_token = runtime.instrument(catalog.ENERGY_PER_OUTPUT_TOKEN).merged()
        assert energy.count == 12
        assert energy.sum == pytest.approx(sum(j for j, _ in expected), rel=1e-12)
        assert per_token.count == 11
        assert per_token.sum == pytest.approx(sum(j / t for j, t in expected if t), rel=1e-12)
        assert runtime.request_duration.merged().count == 12
        assert runtime.ttft.merged().count == 12
        requests = runtime.instrument(catalog.REQUESTS)
        labels = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "_OTHER",
            "gen_ai.request.model": "m",
            "otelgpu.request.outcome": "ok",
        }
        assert requests.value(labels) == 12
        assert runtime.stats.errors() == {}

        # A processor added later sees the next spans with their GPU context.
        exporter = InMemorySpanExporter()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        seen = _requests(runtime, 3)
        if otel_sampler is ALWAYS_OFF:
            assert exporter.get_finished_spans() == ()
            return
        finished = exporter.get_finished_spans()
        assert len(finished) == 3
        for span, (_, record) in zip(finished, seen, strict=True):
            attrs = attributes_of(span)
            summary = sampler.summary(record.start_ns, record.end_ns)
            assert summary is not None
            assert attrs["otelgpu.gpu.energy"] == summary.energy_j
            assert attrs["otelgpu.gpu.count"] == 8
            assert attrs["otelgpu.request.outcome"] == "ok"
        assert runtime.instrument(catalog.REQUEST_ENERGY).merged().count == 15
    finally:
        otelgpu.shutdown()
        tracer_provider.shutdown()
