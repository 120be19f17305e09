"""Tail-keeping sampling of step spans (``otelgpu.otel.tail_sampling``) and the export
path's behaviour at realistic rates: nothing dropped, health-event steps always
exported, metrics exact, the SDK's sampler and resource settings still in force."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fixtures.otel import steps_then_request
from fixtures.otlp_receiver import OtlpReceiver, attributes

import otelgpu
from otelgpu.metrics import catalog as names
from otelgpu.runtime.records import StepRecord

pytestmark = pytest.mark.usefixtures("reset_otel_globals")


@pytest.fixture
def receiver() -> Any:
    r = OtlpReceiver()
    r.start()
    yield r
    r.stop()


def _instrument(receiver: Any, protocol: str = "grpc", **settings: Any) -> Any:
    endpoint = receiver.grpc_endpoint if protocol == "grpc" else receiver.http_endpoint
    return otelgpu.instrument(
        otlp_endpoint=endpoint,
        otlp_protocol=protocol,
        span_schedule_delay_ms=50,
        metric_export_interval_ms=3_600_000,
        frameworks="none",
        **settings,
    )


def _step_spans(receiver: Any) -> list[Any]:
    return [s for _, _, s in receiver.spans() if s.name == names.STEP_SPAN]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_pipeline_realistic_rate_nothing_dropped(receiver: Any, protocol: str) -> None:
    """50 steps/s for 2 s and 100 requests: every span arrives, nothing is counted lost."""
    handle = _instrument(receiver, protocol, gpu=False)
    runtime = handle.runtime
    for _ in range(100):
        steps_then_request(1, 0.02, samples=2)
    handle.force_flush()
    handle.shutdown()
    assert len(_step_spans(receiver)) == 100
    assert sum(1 for _, _, s in receiver.spans() if s.name.startswith("chat")) == 100
    assert runtime.stats.dropped() == {}


def test_pipeline_high_rate_keeps_health_slow_and_failed_steps(receiver: Any) -> None:
    """Thousands of steps per second: the ordinary ones are thinned to the budget, every
    failed, slow or GPU-health step is exported, and the step metrics stay exact."""
    handle = _instrument(receiver, gpu=False, step_spans_per_second=20)
    runtime = handle.runtime
    n = 3000
    t0 = time.time_ns()
    special = {}
    for i in range(n):
        start = t0 + i * 1_000_000
        duration = 100_000
        span_attributes: dict[str, Any] | None = None
        if i % 500 == 250:  # a slow step (10x the usual)
            duration = 1_000_000
            special[i + 1] = "slow"
        if i % 500 == 400:  # a GPU health flag on the step
            span_attributes = {"otelgpu.gpu.xids": [79]}
            special[i + 1] = "health"
        runtime.record_step(
            StepRecord(start, start + duration, step=i + 1, span_attributes=span_attributes)
        )
    for i in range(3):
        try:
            with otelgpu.step(step=n + 1 + i):
                raise ValueError("bad batch")
        except ValueError:
            special[n + 1 + i] = "failed"
    handle.force_flush()
    steps = {attributes(s.attributes)["otelgpu.train.step"] for s in _step_spans(receiver)}
    assert set(special) <= steps
    assert len(steps) < n // 5  # thinned: the budget, not every step
    sampled_out = runtime.stats.dropped().get(("traces", "tail_sampled"), 0)
    assert sampled_out + len(steps) == n + 3
    handle.shutdown()
    total = receiver.last_metric(names.TRAIN_STEPS.name)
    assert total is not None
    assert sum(p.as_int for p in total.sum.data_points) == n + 3  # metrics exact


def test_pipeline_sdk_sampler_and_resource_still_apply(
    receiver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=bench,team=ml")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    handle = _instrument(receiver, gpu=False, step_spans_per_second=0)
    for _ in range(400):
        with otelgpu.step():
            pass
    handle.force_flush()
    rows = [(res, s) for res, _, s in receiver.spans() if s.name == names.STEP_SPAN]
    assert 100 < len(rows) < 300  # the ratio sampler decided, not otelgpu
    resource = rows[0][0]
    assert resource["deployment.environment"] == "bench" and resource["team"] == "ml"
    handle.shutdown()
