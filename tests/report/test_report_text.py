"""The text report: verdict card, phases, gauges read per GPU, zero-only counters dropped."""

from __future__ import annotations

import io
from pathlib import Path

from otelgpu.commands import report
from otelgpu.report import analysis, model, text


def _text(*paths: Path) -> str:
    buf = io.StringIO()
    assert report.summarise([str(p) for p in paths], buf) > 0
    return buf.getvalue()


def test_report_text_verdict_card_names_the_input_bound_run(
    synthetic_runs: dict[str, Path],
) -> None:
    out = _text(synthetic_runs["healthy_a"])
    card = out.split("└")[0]
    # make_run.py puts 25 % of every step into data wait
    assert "INPUT-BOUND — input wait took 25 % of step time — increase DataLoader workers" in card
    assert "compute 70 %; data 25 %; checkpoint 5 %" in card
    assert "SERVING OK" in card
    run = model.load([synthetic_runs["healthy_a"]])
    shares = {p: s for p, _t, s in analysis.phase_shares(run)}
    assert abs(shares["data"] - 0.25) < 1e-6 and abs(shares["checkpoint"] - 0.05) < 1e-6
    assert "other" not in shares or shares["other"] < 1e-6


def test_report_text_reads_gpu_gauges_and_drops_zero_counters(
    synthetic_runs: dict[str, Path],
) -> None:
    out = _text(synthetic_runs["healthy_a"])
    gpus = out.split("== GPUs (from the sampled gauges) ==")[1].split("\n\n")[0].splitlines()[2:]
    assert len(gpus) == 8  # the simulated 8xH100 node
    for line in gpus:
        # healthy-8xh100: 95 % utilization, 64.5 GiB used less 0.5 GiB reserved (memory v2)
        assert "95/95 %" in line and "64.0 GiB" in line and " W " in line and "°C" in line
    counters = out.split("== counters")[1].split("== spans ==")[0]
    assert "otelgpu.train.steps [-] 1000" in counters
    assert "throttle" not in counters  # 64 zero throttle counters were noise
    assert " 0 {" not in counters
    # the old contract: every sketch series with its quantiles, span counts
    assert "otelgpu.train.step.duration [-] n=1000" in out
    assert "otelgpu.train.step: 1000" in out


def test_report_text_health_events_and_throttled_steps(workload_run: Path) -> None:
    out = _text(workload_run)
    assert "GPU HEALTH" in out and "throttle_start" in out
    events = out.split("== GPU health events ==")[1].split("\n\n")[0]
    assert "throttle_start" in events and "hw_thermal" in events
    run = model.load([workload_run])
    t = analysis.training(run)
    assert t is not None and t.steps > 50
    assert t.throttled_step_share is not None and t.throttled_step_share > 0.3
    # steps are 20 ms sleeps: the recorded p50 is within a few ms of it
    assert 0.019 < t.step_quantiles[0] < 0.030


def test_report_text_merges_files_of_one_run(synthetic_runs: dict[str, Path]) -> None:
    both = model.load([synthetic_runs["healthy_a"], synthetic_runs["healthy_b"]])
    step = both.merged_sketch("otelgpu.train.step.duration")
    assert step is not None and step.count == 2000
    assert len(both.processes) == 2
    buf = io.StringIO()
    text.write(both, buf)
    assert "2 process(es)" in buf.getvalue()


def test_report_text_shows_the_diagnosis_verdict_when_recorded() -> None:
    """The diagnosis' verdict span (otelgpu.verdict.json) becomes the card's first line."""
    from otelgpu.diagnosis.summary import Verdict
    from otelgpu.report.model import Finding, Run

    verdict = Verdict(
        steps=500,
        step_time_s=10.0,
        step_p50_s=0.02,
        step_p95_s=0.03,
        bottleneck="input",
        phase_shares={"data": 0.26, "forward": 0.3, "backward": 0.4, "other": 0.04},
        stragglers=[{"rank": 2, "host": "node-1", "cause": "input", "evidence": ["data wait"]}],
        drift=["otelgpu: step time p95 +12 % against the early baseline"],
    )
    run = Run(paths=["x"], messages=1)
    run.findings.append(
        Finding(5.0, "otelgpu.run.verdict", {"otelgpu.verdict.json": verdict.to_json()})
    )
    (card, *_rest) = analysis.verdicts(run)
    assert card.source == "recorded"
    assert card.line().startswith("INPUT-BOUND — input wait took 26 % of step time")
    assert "straggler: rank 2 on node-1: input (data wait)" in card.evidence
    assert "step time p95 +12 % against the early baseline" in card.evidence
    buf = io.StringIO()
    text.verdict_card(run, buf)
    assert "INPUT-BOUND — input wait took 26 %" in buf.getvalue()
