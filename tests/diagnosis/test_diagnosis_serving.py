"""Inference latency drift on the runtime's own request path (real SDK spans)."""

from __future__ import annotations

import logging
import random

import pytest
from fixtures.otel import attributes_of
from fixtures.torch_runtime import RuntimeHarness

from otelgpu.diagnosis import names as N
from otelgpu.diagnosis.serving import attach
from otelgpu.runtime.records import RequestRecord


def _requests(h: RuntimeHarness, rng: random.Random, n: int, ttft_s: float, t0: int) -> int:
    t = t0
    for _ in range(n):
        ttft = ttft_s * rng.lognormvariate(0, 0.2)
        duration = ttft + 0.2 * rng.lognormvariate(0, 0.2)
        h.runtime.record_request(
            RequestRecord(
                start_ns=t,
                end_ns=t + int(duration * 1e9),
                model="m",
                first_token_ns=t + int(ttft * 1e9),
                output_tokens=20,
            )
        )
        t += 10_000_000
    return t


def test_diagnosis_ttft_drift_on_request_spans(
    harness: RuntimeHarness, caplog: pytest.LogCaptureFixture
) -> None:
    diagnosis = attach(harness.runtime)
    assert diagnosis is not None
    diagnosis.ttft.window = diagnosis.duration.window = 300
    rng = random.Random(2)
    with caplog.at_level(logging.WARNING, logger="otelgpu.diagnosis"):
        t = _requests(harness, rng, 1500, 0.05, 1_000_000_000)
        assert caplog.records == []  # healthy: silent
        _requests(harness, rng, 600, 0.09, t)  # TTFT +80 % (prefill queueing)
    lines = [r.getMessage() for r in caplog.records]
    assert any("TTFT drifted slower" in line for line in lines), lines
    events = [
        attributes_of(e)
        for s in harness.spans_exporter.get_finished_spans()
        for e in s.events
        if e.name == N.EVENT_PREFIX + "latency_drift"
    ]
    assert any(e["otelgpu.diagnosis.what"] == "TTFT" for e in events)
    counted = harness.metrics()[N.FINDINGS.name]
    drift_counts = [v for a, v in counted if a["otelgpu.diagnosis.kind"] == "latency_drift"]
    assert drift_counts and drift_counts[0] == len([line for line in lines if "drifted" in line])


def test_diagnosis_instrument_attaches_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    import otelgpu
    from otelgpu import _runtime

    monkeypatch.setenv("OTELGPU_DIAGNOSIS", "false")
    otelgpu.instrument(exporters="none", gpu=False)
    try:
        rt = _runtime.current()
        assert rt is not None and rt.requests.observers == []  # type: ignore[attr-defined]
    finally:
        otelgpu.shutdown()
    monkeypatch.setenv("OTELGPU_DIAGNOSIS", "true")
    otelgpu.instrument(exporters="none", gpu=False)
    try:
        rt = _runtime.current()
        assert rt is not None and len(rt.requests.observers) == 1  # type: ignore[attr-defined]
    finally:
        otelgpu.shutdown()
