"""Counts on the hot path: bad token and sample counts never raise, counters stay
monotonic, and the local counter never raises."""

from __future__ import annotations

import pytest
from fixtures.otel import InMemoryOtel
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
)

import otelgpu
from otelgpu import _runtime
from otelgpu.metrics import catalog as names
from otelgpu.otel.counters import LocalCounter
from otelgpu.otel.stats import InternalStats

pytestmark = pytest.mark.usefixtures("reset_otel_globals")


_App = InMemoryOtel


@pytest.fixture
def review_app(otel_app: InMemoryOtel) -> InMemoryOtel:
    return otel_app


def _errors() -> dict[str, int]:
    runtime = _runtime.current()
    assert runtime is not None
    return runtime.stats.errors()


# ------------------------------------------------------------------ request tokens


@pytest.mark.parametrize("bad", [None, "many", float("nan"), float("inf"), -3])
def test_pipeline_request_token_counts_never_raise(review_app: _App, bad: object) -> None:
    with otelgpu.request(model="m") as r:
        r.first_token()
        r.tokens(2)
        r.tokens(bad)  # type: ignore[arg-type]
        r.input_tokens(bad)  # type: ignore[arg-type]
        r.tokens(3)
    assert r.output_tokens == 5
    assert r.outcome == "ok"
    (span,) = review_app.spans.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes["gen_ai.usage.output_tokens"] == 5
    assert "gen_ai.usage.input_tokens" not in span.attributes
    errors = _errors()
    assert errors["request tokens"] == 1
    assert errors["request input_tokens"] == 1


def test_pipeline_request_token_counts_without_instrument() -> None:
    with otelgpu.request(model="m") as r:
        r.tokens(None)  # type: ignore[arg-type]
        r.tokens(4)
        r.input_tokens("x")  # type: ignore[arg-type]
    assert r.output_tokens == 4


# ------------------------------------------------------------------ counters


def test_pipeline_step_with_negative_samples_keeps_counters_monotonic(review_app: _App) -> None:
    with otelgpu.step(samples=4, tokens=10):
        pass
    with otelgpu.step(samples=-4, tokens=float("nan")):
        pass
    with otelgpu.step(samples=2):
        pass
    samples = review_app.points(names.TRAIN_SAMPLES.name)
    tokens = review_app.points(names.TRAIN_TOKENS.name)
    steps = review_app.points(names.TRAIN_STEPS.name)
    assert [v for _, v in samples] == [6]
    assert [v for _, v in tokens] == [10]
    assert [v for _, v in steps] == [3]  # the step with bad counts still counts as a step
    # Rejected before the counters (never exported), counted by field and reason.
    runtime = _runtime.current()
    assert runtime is not None
    assert runtime.stats.rejected() == {("samples", "negative"): 1, ("tokens", "nan"): 1}


def test_pipeline_local_counter_never_raises() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    stats = InternalStats()
    counter = LocalCounter(provider.get_meter("t"), "c", "1", "", stats=stats)
    counter.add(2, {"a": "x"})
    counter.add(1, {"a": {"unhashable": "dict"}})  # type: ignore[dict-item]
    counter.add(-1, {"a": "x"})
    counter.add("3", {"a": "x"})  # type: ignore[arg-type]
    counter.add(True, {"a": "x"})
    counter.add(0.5, {"a": "x"})
    assert counter.value({"a": "x"}) == 2.5
    assert stats.errors() == {"counter c": 4}
    silent = LocalCounter(provider.get_meter("t"), "d", "1", "")  # no stats: dropped quietly
    silent.add(float("-inf"))
    assert silent.total() == 0.0
    provider.shutdown()
