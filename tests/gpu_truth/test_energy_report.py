"""Tokens per joule in the report (text and HTML) and MFU, from a live recording: the
real runtime, the recording exporter, the sampler on a simulated H100."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import otelgpu
from otelgpu import sim
from otelgpu.commands import report
from otelgpu.report import analysis, html, model

pytestmark = pytest.mark.usefixtures("reset_otel_globals")


def test_report_shows_tokens_per_joule_and_mfu(
    sim_scenario: Callable[..., sim.SimGpu], tmp_path: Path
) -> None:
    sim_scenario("memory-bound-decode", clock="wall")
    handle = otelgpu.instrument(
        exporters="recording",
        recording_dir=str(tmp_path),
        sample_interval_ms=50,
        metric_export_interval_ms=100,  # hw.energy points bracket the serving period
    )
    try:
        time.sleep(0.15)
        for _ in range(3):
            with otelgpu.step(samples=8, tokens=2048, flops=1e12):
                time.sleep(0.12)
        for _ in range(3):
            with otelgpu.request(model="tiny") as r:
                r.first_token()
                time.sleep(0.12)
                r.tokens(16)
        time.sleep(0.3)
    finally:
        handle.shutdown()
    recording = handle.recording_path
    assert recording is not None
    run = model.load([Path(recording)])
    t = analysis.training(run)
    assert t is not None and t.joules_per_token is not None and t.mfu is not None
    step_spans = run.steps
    energy = sum(float(s.attributes["otelgpu.gpu.energy"]) for s in step_spans)
    assert t.joules_per_token == pytest.approx(energy / (2048 * len(step_spans)))
    for s in step_spans:
        assert s.attributes["otelgpu.train.energy.per_token"] == pytest.approx(
            float(s.attributes["otelgpu.gpu.energy"]) / 2048
        )
        assert s.attributes["otelgpu.train.energy.per_sample"] == pytest.approx(
            float(s.attributes["otelgpu.gpu.energy"]) / 8
        )
    buf = io.StringIO()
    assert report.summarise([str(recording)], buf) > 0
    text = buf.getvalue()
    assert f"({1 / t.joules_per_token:,.0f} tokens/J)" in text
    assert f"MFU          {t.mfu * 100:.1f} %" in text
    page = html.render(run)
    assert "training tokens / J" in page
    i = analysis.inference(run)
    assert i is not None and i.joules_per_output_token is not None
    assert "output tokens / J" in page
    assert f"({1 / i.joules_per_output_token:.2f} tokens/J)" in text.split("== inference ==")[1]
