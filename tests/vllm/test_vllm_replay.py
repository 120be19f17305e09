"""Replay: a scripted burst through vLLM's real stats classes into otelgpu, checked at the
OTLP receiver against values computed directly from the script.

2,000 requests at ~200 QPS with log-normal latencies, a 5 % slow tail (queueing 10-40x
longer), 3 % aborts (a third of them while still waiting) and 1 % errors. The exported
exponential histograms must give p95/p99 within the sketch's relative accuracy (1 %) of
the script's own order statistics, and the counters the exact error and abort rates.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from fixtures.otlp_receiver import attributes
from vllm_script import ScriptedRequest, batches, burst, vllm_config
from vllm_support import Instrumented

from otelgpu.metrics import catalog
from otelgpu.sketch import QuantileSketch

pytestmark = pytest.mark.usefixtures("reset_otel_globals")

ACCURACY = 0.01
IPC_S = 0.0003


def _quantile_bracket(values: Sequence[float], q: float) -> tuple[float, float]:
    """The order statistics around rank ``q * (n - 1)`` (a sketch may return either side)."""
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    lo = ordered[max(0, math.floor(rank) - 1)]
    hi = ordered[min(len(ordered) - 1, math.ceil(rank) + 1)]
    return lo, hi


def _assert_quantile(estimate: float, truth: Sequence[float], q: float, what: str) -> None:
    lo, hi = _quantile_bracket(truth, q)
    assert lo * (1 - ACCURACY) <= estimate <= hi * (1 + ACCURACY), (what, q, estimate, lo, hi)


def _merged(run: Instrumented, name: str) -> Any:
    """All vLLM series of exponential histogram ``name`` at the receiver, as one sketch."""
    merged = QuantileSketch(relative_accuracy=ACCURACY)
    metric = run.metrics()[name]
    for point in metric.exponential_histogram.data_points:
        if attributes(point.attributes).get("gen_ai.provider.name") == "vllm":
            merged.merge(QuantileSketch.from_data_point(point))
    return merged


def test_vllm_replayed_burst_matches_the_script(
    vllm_api: SimpleNamespace, instrumented: Callable[..., Instrumented]
) -> None:
    requests: list[ScriptedRequest] = burst(2000)
    recorded = batches(vllm_api, requests, with_scheduler_stats=False, ipc_s=IPC_S)
    run = instrumented(gpu=False, span_queue_size=4096)
    from otelgpu.instrumentation.vllm.stat_logger import OtelGpuStatLogger

    logger = OtelGpuStatLogger(vllm_config(vllm_api), 0)
    for b in recorded:
        logger.record(b.scheduler_stats, b.iteration_stats, None, 0)
    run.finish()
    assert run.runtime_errors() == {}

    # ---- ground truth, straight from the script
    e2e = [r.end + IPC_S - r.arrival for r in requests]
    ok = [r for r in requests if r.finish_reason in ("stop", "length")]
    ttft = [r.first_token + IPC_S - r.arrival for r in ok]
    queue = [r.queue_s for r in requests if r.scheduled]
    reasons = Counter(r.finish_reason for r in requests)
    assert reasons["abort"] > 30 and reasons["error"] > 5  # the script has failures to find

    # ---- tail latency from the exported histograms
    duration = _merged(run, "gen_ai.server.request.duration")
    assert duration.count == len(requests)
    for q in (0.5, 0.95, 0.99):
        _assert_quantile(duration.quantile(q), e2e, q, "e2e")
    first_token = _merged(run, "gen_ai.server.time_to_first_token")
    assert first_token.count == len(ok)
    for q in (0.95, 0.99):
        _assert_quantile(first_token.quantile(q), ttft, q, "ttft")
    queued = _merged(run, "otelgpu.inference.queue.duration")
    assert queued.count == len(queue)
    for q in (0.95, 0.99):
        _assert_quantile(queued.quantile(q), queue, q, "queue")
    # the slow tail is what p99 sees: far above the median
    assert queued.quantile(0.99) > 5 * queued.quantile(0.5)

    # ---- error, abort and success rates from the counters: exact
    finished = {
        a["otelgpu.vllm.finish_reason"]: p.as_int
        for a, p in run.points(catalog.REQUESTS_FINISHED.name)
    }
    assert finished == dict(reasons)
    outcomes = {
        a["otelgpu.request.outcome"]: p.as_int
        for a, p in run.points("otelgpu.inference.requests")
        if a.get("gen_ai.provider.name") == "vllm"
    }
    assert outcomes == {"ok": len(ok), "error": reasons["abort"] + reasons["error"]}
    errors_by_type: Counter[str] = Counter()
    for point in run.metrics()["gen_ai.server.request.duration"].exponential_histogram.data_points:
        errors_by_type[attributes(point.attributes).get("error.type", "")] += point.count
    assert errors_by_type == {"": len(ok), "abort": reasons["abort"], "error": reasons["error"]}
    abort_rate = errors_by_type["abort"] / duration.count
    assert abort_rate == pytest.approx(reasons["abort"] / len(requests))

    # ---- one span per request, none dropped
    spans = [s for s in run.spans() if "gen_ai.response.id" in _span_attrs(s)]
    assert len(spans) == len(requests)


def test_vllm_timeout_setting_turns_slow_requests_into_timeouts(
    vllm_api: SimpleNamespace,
    instrumented: Callable[..., Instrumented],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    requests = burst(300, seed=5)
    limit = sorted(r.end + IPC_S - r.arrival for r in requests)[270]  # ~10 % reach it
    monkeypatch.setenv("OTELGPU_VLLM_TIMEOUT_S", repr(limit))
    run = instrumented(gpu=False)
    from otelgpu.instrumentation.vllm.stat_logger import OtelGpuStatLogger

    logger = OtelGpuStatLogger(vllm_config(vllm_api), 0)
    for b in batches(vllm_api, requests, with_scheduler_stats=False, ipc_s=IPC_S):
        logger.record(b.scheduler_stats, b.iteration_stats)
    run.finish()
    expected = sum(1 for r in requests if r.end + IPC_S - r.arrival >= limit)
    outcomes = {
        a["otelgpu.request.outcome"]: p.as_int
        for a, p in run.points("otelgpu.inference.requests")
        if a.get("gen_ai.provider.name") == "vllm"
    }
    assert outcomes["timeout"] == expected == 30


def test_vllm_replayed_energy_per_output_token_is_the_energy_window_over_tokens(
    vllm_api: SimpleNamespace, instrumented: Callable[..., Instrumented]
) -> None:
    """Issue 12.4: each request's joules per output token is the sampler's energy window
    of its span (its engine's GPUs, simulated) divided by its output tokens, with the
    window's source (the energy counter, power integration only for windows too short for
    it); the sketches hold the same values."""
    run = instrumented()
    sampler = run.runtime.sampler
    time.sleep(0.3)  # the sampler covers the whole replay
    requests = burst(30, seed=3, start=time.time())
    time.sleep(max(r.end for r in requests) - time.time() + 0.2)
    from otelgpu.instrumentation.vllm.stat_logger import OtelGpuStatLogger

    logger = OtelGpuStatLogger(vllm_config(vllm_api), 0)
    for b in batches(vllm_api, requests, with_scheduler_stats=False, ipc_s=IPC_S):
        logger.record(b.scheduler_stats, b.iteration_stats, None, 0)
    expected: dict[str, tuple[float, str | None]] = {}
    run.handle.force_flush()  # the spans reach the receiver; the sampler still runs
    per_token = run.runtime.instrument(catalog.ENERGY_PER_OUTPUT_TOKEN).merged()
    request_energy = run.runtime.instrument(catalog.REQUEST_ENERGY).merged()
    assert run.runtime_errors() == {}
    spans = [s for s in run.spans() if "gen_ai.response.id" in _span_attrs(s)]
    assert len(spans) == len(requests)
    with_tokens = 0
    for span in spans:
        attrs = _span_attrs(span)
        ids = attrs.get("otelgpu.gpu.ids") or [attrs["hw.id"]]
        windows = sampler.windows(span.start_time_unix_nano, span.end_time_unix_nano)
        joules = sum(windows[u].energy_j for u in ids)
        sources = {windows[u].energy_source for u in ids}
        expected[attrs["gen_ai.response.id"]] = (joules, sources.pop())
        assert not sources  # one source for all the engine's GPUs
        assert attrs["otelgpu.gpu.energy"] == pytest.approx(joules, rel=1e-12)
        assert attrs["otelgpu.gpu.energy.source"] == expected[attrs["gen_ai.response.id"]][1]
        tokens = attrs.get("gen_ai.usage.output_tokens", 0)
        if tokens:
            with_tokens += 1
            assert attrs["otelgpu.request.energy.per_output_token"] == pytest.approx(
                joules / tokens, rel=1e-12
            )
        else:
            assert "otelgpu.request.energy.per_output_token" not in attrs
    assert with_tokens > 20
    assert request_energy.count == len(requests)
    assert request_energy.sum == pytest.approx(sum(j for j, _ in expected.values()), rel=1e-9)
    assert per_token.count == with_tokens
    assert {s for _, s in expected.values()} <= {"counter", "power"}
    assert "counter" in {s for _, s in expected.values()}
    run.finish()


def _span_attrs(span: Any) -> dict[str, Any]:
    return attributes(span.attributes)
