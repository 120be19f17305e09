"""The torch step thread's bulk path (``RuntimeAPI.step_lane``) through the whole
pipeline: a real training loop, ``otelgpu.instrument()`` with tail-keeping sampling,
real OTLP on the wire. Only the kept steps get a span; every step is in the metrics."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from fixtures.otlp_receiver import OtlpReceiver, attributes

import otelgpu
from otelgpu.instrumentation.torch import _names as N
from otelgpu.instrumentation.torch import flush
from otelgpu.metrics import catalog as C

pytestmark = pytest.mark.usefixtures("reset_otel_globals")

STEPS = 300
SLOW_STEP = 150


def _train(receiver: Any, budget: int) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
    """``STEPS`` optimizer steps (step ``SLOW_STEP`` 30 ms long), exported over OTLP gRPC:
    the step spans' attributes, the step metrics' totals and the tail-sampled count."""
    handle = otelgpu.instrument(
        otlp_endpoint=receiver.grpc_endpoint,
        otlp_protocol="grpc",
        span_schedule_delay_ms=50,
        metric_export_interval_ms=3_600_000,
        gpu=False,
        step_spans_per_second=budget,
    )
    try:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        for i in range(1, STEPS + 1):
            net(torch.randn(4, 8)).pow(2).mean().backward()
            if i == SLOW_STEP:
                time.sleep(0.03)
            opt.step()
            opt.zero_grad()
        flush()  # the end of training: the last step, and the queued ones, recorded
        handle.force_flush()
        assert handle.runtime is not None
        sampled_out = handle.runtime.stats.dropped().get(("traces", "tail_sampled"), 0)
    finally:
        otelgpu.shutdown()
    spans = [attributes(s.attributes) for _, _, s in receiver.spans() if s.name == C.STEP_SPAN]
    steps = receiver.last_metric(C.TRAIN_STEPS.name).sum.data_points
    durations = receiver.last_metric(C.TRAIN_STEP_DURATION.name).exponential_histogram
    optimizer = receiver.last_metric(C.OPTIMIZER_STEPS.name).sum.data_points
    totals = {
        "steps": sum(p.as_int for p in steps),
        "durations": sum(p.count for p in durations.data_points),
        "optimizer_steps": sum(p.as_int for p in optimizer),
    }
    return spans, totals, sampled_out


@pytest.fixture
def receiver() -> Any:
    r = OtlpReceiver()
    r.start()
    yield r
    r.stop()


def test_sampled_out_steps_are_in_every_metric_and_kept_spans_are_whole(receiver: Any) -> None:
    spans, totals, sampled_out = _train(receiver, budget=20)
    assert totals == {"steps": STEPS, "durations": STEPS, "optimizer_steps": STEPS}
    numbers = sorted(s["otelgpu.train.step"] for s in spans)
    assert len(numbers) == len(set(numbers))
    assert len(numbers) + sampled_out == STEPS
    assert sampled_out > STEPS // 2  # well over the budget: most steps sampled out
    assert SLOW_STEP in numbers  # a slow step is always kept
    for span in spans:  # a kept step's span has the torch fields and the step's own
        assert span[N.SPAN_STEP_RULE] == "optimizer"
        assert span[N.SPAN_OPTIMIZER_STEPS] == 1
        assert N.SPAN_DATA_WAIT in span and "otelgpu.train.compute" in span


def test_without_tail_sampling_every_step_has_its_span(receiver: Any) -> None:
    spans, totals, sampled_out = _train(receiver, budget=0)
    assert totals == {"steps": STEPS, "durations": STEPS, "optimizer_steps": STEPS}
    assert sorted(s["otelgpu.train.step"] for s in spans) == list(range(1, STEPS + 1))
    assert sampled_out == 0


def test_force_flush_exports_the_steps_still_queued(receiver: Any) -> None:
    """``force_flush()`` of the handle records the finished steps the background thread
    had not taken yet (its drain runs every half second), the open step excepted."""
    handle = otelgpu.instrument(
        otlp_endpoint=receiver.grpc_endpoint,
        otlp_protocol="grpc",
        span_schedule_delay_ms=3_600_000,
        metric_export_interval_ms=3_600_000,
        gpu=False,
        step_spans_per_second=0,
    )
    try:
        net = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        for _ in range(20):
            net(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        handle.force_flush()
        numbers = sorted(
            attributes(s.attributes)["otelgpu.train.step"]
            for _, _, s in receiver.spans()
            if s.name == C.STEP_SPAN
        )
        steps = receiver.last_metric(C.TRAIN_STEPS.name).sum.data_points
    finally:
        otelgpu.shutdown()
    assert numbers == list(range(1, 20))  # step 20 is still open: its end is the next start
    assert sum(p.as_int for p in steps) == 19
