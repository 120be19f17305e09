"""Run comparison: shifts of p50/p95/p99 judged against the sketch's error bound and the
quantile's sampling uncertainty; the CI gate (--fail-on-regression)."""

from __future__ import annotations

import io
import random
import subprocess
import sys
from pathlib import Path

from fixtures.otel import python_env

from otelgpu.report import compare, model
from otelgpu.sketch import QuantileSketch

AFFECTED = {"otelgpu.train.step.duration", "gen_ai.server.time_to_first_token"}


def _verdicts(a: Path, b: Path) -> dict[tuple[str, str], str]:
    result = compare.compare(model.load([a]), model.load([b]))
    return {(m.name, m.label): m.verdict for m in result.metrics if not m.only_in}


def test_report_compare_two_healthy_runs_show_no_change(synthetic_runs: dict[str, Path]) -> None:
    verdicts = _verdicts(synthetic_runs["healthy_a"], synthetic_runs["healthy_b"])
    assert len(verdicts) >= 5  # step time, latency (ok/error), TTFT, TPOT, queue
    assert set(verdicts.values()) == {compare.NO_CHANGE}, verdicts


def test_report_compare_flags_exactly_the_regressed_metrics(
    synthetic_runs: dict[str, Path],
) -> None:
    verdicts = _verdicts(synthetic_runs["healthy_a"], synthetic_runs["regressed"])
    regressed = {name for (name, _label), v in verdicts.items() if v == compare.REGRESSION}
    assert regressed == AFFECTED, verdicts
    others = {k: v for k, v in verdicts.items() if k[0] not in AFFECTED}
    assert set(others.values()) == {compare.NO_CHANGE}, others
    # and the other way round it is an improvement, not a regression
    back = _verdicts(synthetic_runs["regressed"], synthetic_runs["healthy_a"])
    assert {n for (n, _), v in back.items() if v == compare.IMPROVEMENT} == AFFECTED


def test_report_compare_shift_within_the_sketch_error_is_no_change() -> None:
    # Same values scaled by 1.004: every bucket moves by less than the sketch's 0.54 %
    # bound, so even with a million values (no sampling uncertainty) nothing changed...
    rng = random.Random(5)
    values = [rng.lognormvariate(-3, 0.5) for _ in range(200_000)]
    a, b, c = QuantileSketch(0.01), QuantileSketch(0.01), QuantileSketch(0.01)
    for v in values:
        a.add(v)
        b.add(v * 1.004)
        c.add(v * 1.08)
    assert compare.sketch_alpha(a) < 0.006
    assert {s.verdict for s in compare.compare_sketches(a, b)} == {compare.NO_CHANGE}
    # ... while 8 % is far outside both bounds and above the 5 % materiality threshold.
    assert {s.verdict for s in compare.compare_sketches(a, c)} == {compare.REGRESSION}
    # and 8 % is "no change" when the user asks for at least 10 %
    assert {s.verdict for s in compare.compare_sketches(a, c, min_change=0.10)} == {
        compare.NO_CHANGE
    }


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "otelgpu", "report", *args],
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_report_compare_cli_gate_exits_non_zero_on_regression(
    synthetic_runs: dict[str, Path], tmp_path: Path
) -> None:
    a, b, c = (str(synthetic_runs[k]) for k in ("healthy_a", "healthy_b", "regressed"))
    healthy = _cli(a, b, "--fail-on-regression", "10")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "0 regression(s)" in healthy.stdout
    gate = _cli(a, c, "--fail-on-regression", "10", "--html", str(tmp_path / "cmp.html"))
    assert gate.returncode == 3, gate.stdout + gate.stderr
    assert "FAIL: 2 metric(s) regressed" in gate.stdout
    assert "otelgpu.train.step.duration" in gate.stdout.split("FAIL:")[1]
    assert "== GPU context ==" in gate.stdout and "GPU utilization (mean)" in gate.stdout
    assert (tmp_path / "cmp.html").stat().st_size > 100_000
    # the gate's threshold: the +30 % and +50 % shifts pass a 60 % gate
    result = compare.compare(model.load([a]), model.load([c]))
    assert len(result.regressions(0.10)) == 2
    assert result.regressions(0.60) == []


def test_report_compare_text_names_the_regressed_quantiles(synthetic_runs: dict[str, Path]) -> None:
    result = compare.compare(
        model.load([synthetic_runs["healthy_a"]]), model.load([synthetic_runs["regressed"]])
    )
    buf = io.StringIO()
    compare.write_text(result, buf)
    text = buf.getvalue()
    step_block = text.split("otelgpu.train.step.duration")[1].split("\n\n")[0]
    assert step_block.count("▲ regression") == 3  # p50, p95, p99
