"""Learning from recordings (exact histogram merge), refusals, the baseline file, tighten's
arithmetic, names from the catalog, and the baseline file as the drift detectors' baseline.

The recording is a real one: ``tests/report/make_run.py`` (real runtime, simulated GPUs,
recording exporter; 1000 steps of ~20 ms lognormal, 1000 requests).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from fixtures.otel import make_run, python_env

from otelgpu.baseline import names
from otelgpu.baseline.drift import FileBaseline
from otelgpu.baseline.figures import FIGURES, figure
from otelgpu.baseline.learn import Requirements, entry_from_values
from otelgpu.baseline.model import BaselineFile, load
from otelgpu.baseline.tighten import propose, render
from otelgpu.diagnosis.drift import StepDrift
from otelgpu.diagnosis.serving import ServingDiagnosis
from otelgpu.diagnosis.settings import resolve
from otelgpu.errors import ConfigurationError
from otelgpu.report.model import load as load_run


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "otelgpu", *args],
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run")
    return make_run(out, "--seed", "1")


@pytest.fixture(scope="module")
def learned(recording: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("learned") / "baseline.json"
    result = cli(
        "baseline",
        "learn",
        "--recording",
        str(recording),
        "--window",
        "2m",
        "--min-coverage",
        "0.5",
        "--min-samples",
        "5",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_baseline_learn_from_recording_merges_the_histograms_exactly(
    recording: Path, learned: Path
) -> None:
    baseline = load(learned)
    run = load_run([str(recording)])
    merged = run.merged_sketch("otelgpu.train.step.duration")
    step = baseline.entry("train_step_p95")
    assert step is not None and step.samples == merged.count == 1000
    assert step.median == merged.quantile(0.95)  # the exact merged sketch's p95
    # the stored distribution is that same sketch, bucket for bucket
    stored = baseline.sketch("train_step_p95")
    assert stored.to_bytes() == merged.to_bytes()
    assert step.labels == {"job": "make-run"}
    ttft = baseline.entry("inference_ttft_p99")
    assert ttft is not None
    assert ttft.median == run.merged_sketch("gen_ai.server.time_to_first_token").quantile(0.99)
    assert baseline.source["kind"] == "recordings" and baseline.version == 2


def test_baseline_learn_refuses_a_recording_shorter_than_the_window(
    recording: Path, tmp_path: Path
) -> None:
    result = cli(
        "baseline", "learn", "--recording", str(recording), "--out", str(tmp_path / "b.json")
    )  # default window: 7 days
    assert result.returncode == 3
    assert "train_step_p95" in result.stderr and "of the 7d window" in result.stderr
    assert not (tmp_path / "b.json").exists()


def test_baseline_learn_refuses_an_empty_recording(tmp_path: Path) -> None:
    empty = tmp_path / "empty.otlp.jsonl"
    empty.write_text("")
    result = cli(
        "baseline",
        "learn",
        "--recording",
        str(empty),
        "--window",
        "1m",
        "--out",
        str(tmp_path / "b.json"),
    )
    assert result.returncode == 3
    assert "no otelgpu metrics in the recordings" in result.stderr


def test_baseline_file_round_trip_and_version_check(learned: Path, tmp_path: Path) -> None:
    baseline = load(learned)
    copy = tmp_path / "copy.json"
    baseline.save(copy)
    assert json.loads(copy.read_text()) == json.loads(learned.read_text())
    doc = json.loads(learned.read_text())
    doc["version"] = 99
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="version 99"):
        load(newer)
    with pytest.raises(ValueError, match="not an otelgpu baseline"):
        (tmp_path / "x.json").write_text("{}")
        load(tmp_path / "x.json")


def test_baseline_thresholds_follow_the_documented_margins() -> None:
    rng = random.Random(3)
    values = [rng.gauss(0.1, 0.005) for _ in range(1000)]
    ordered = sorted(values)
    up = entry_from_values(figure("train_step_p95"), {"job": "j"}, values, 1.0)
    assert up.p99 == pytest.approx(ordered[989] + (ordered[990] - ordered[989]) * 0.01)
    assert up.threshold == pytest.approx(up.p99 * 1.25)
    down = entry_from_values(figure("train_gpu_utilization"), {"job": "j"}, values, 1.0)
    assert down.reference == down.p1 and down.threshold == pytest.approx(down.p1 * 0.75)
    share = entry_from_values(figure("train_data_wait_share"), {"job": "j"}, values, 1.0)
    assert share.threshold == pytest.approx(share.p99 + 0.10)
    kv = entry_from_values(figure("inference_kv_cache"), {"job": "j"}, [0.97] * 10, 1.0)
    assert kv.threshold == 0.98  # capped


def test_baseline_tighten_reports_the_extra_alert_rate() -> None:
    fig = figure("train_step_p95")
    history = [0.1] * 90 + [0.14] * 10  # 10 % of the newer history at 140 ms
    old = BaselineFile(
        {"kind": "prometheus"}, {}, [entry_from_values(fig, {"job": "j"}, [0.2] * 200, 1.0)]
    )  # threshold 250 ms
    newer = BaselineFile(
        {"kind": "prometheus"}, {}, [entry_from_values(fig, {"job": "j"}, [0.1] * 200, 1.0)]
    )  # threshold 125 ms
    values = {("train_step_p95", "job=j"): [(float(i), v) for i, v in enumerate(history)]}
    proposal = propose(old, newer, values)
    (change,) = proposal.changes
    assert change.old == pytest.approx(0.25) and change.new == pytest.approx(0.125)
    assert change.old_rate == 0.0 and change.new_rate == pytest.approx(0.10)
    text = render(proposal)
    assert "0.25 -> 0.125 s" in text and "+10.00% expected extra alert time" in text
    assert proposal.baseline.entries[0].threshold == pytest.approx(0.125)
    # a looser newer history is not proposed
    assert not propose(newer, old, values).changes


def test_baseline_names_come_from_the_catalog() -> None:
    assert names.metric_name("otelgpu.train.step.duration") == (
        "otelgpu_train_step_duration_quantile_seconds"
    )
    assert names.metric_name("otelgpu.train.step.duration", "otlp") == (
        "otelgpu_train_step_duration_seconds_bucket"
    )
    assert names.metric_name("otelgpu.gpu.xid") == "otelgpu_gpu_xid_total"
    assert names.metric_name("hw.gpu.utilization", "otlp") == "hw_gpu_utilization_ratio"
    for f in FIGURES:
        for m in f.metrics:
            assert names.metric_name(m) in f.expr, (f.id, m)
    with pytest.raises(KeyError):
        names.spec("otelgpu.no.such.metric")


# --------------------------------------------------------------- drift against the file
def test_baseline_file_drives_the_step_drift_detector(learned: Path) -> None:
    base = FileBaseline(learned)
    rng = random.Random(5)
    healthy = StepDrift(baseline=base, window=200)
    slow = StepDrift(baseline=base, window=200)
    healthy_findings = [healthy.add(rng.lognormvariate(-3.9, 0.25)) for _ in range(600)]
    slow_findings = [slow.add(rng.lognormvariate(-3.9, 0.25) * 1.4) for _ in range(200)]
    assert not any(healthy_findings)
    # The first window already compares with the file: no warm-up, no run-start baseline.
    (finding,) = [f for f in slow_findings if f]
    assert "slower than the baseline" in finding.message
    # a run-start baseline could not have flagged a run slow from its first step
    own = StepDrift(window=200)
    assert not any(own.add(rng.lognormvariate(-3.9, 0.25) * 1.4) for _ in range(600))


def test_baseline_setting_resolves_and_fails_fast(learned: Path, tmp_path: Path) -> None:
    settings = resolve({}, {"OTELGPU_BASELINE": str(learned)})
    assert settings.baseline == str(learned)
    assert resolve({"baseline": learned}, {}).baseline == str(learned)
    from otelgpu.diagnosis.training import TrainingDiagnosis

    diagnosis = TrainingDiagnosis(lambda: None, settings)
    assert isinstance(diagnosis.drift.baseline, FileBaseline)
    assert not isinstance(
        TrainingDiagnosis(lambda: None, resolve({}, {})).drift.baseline, FileBaseline
    )
    with pytest.raises(ConfigurationError, match="OTELGPU_BASELINE"):
        resolve({}, {"OTELGPU_BASELINE": str(tmp_path / "missing.json")})
    store_only = load(learned)
    store_only.sketches = {}
    store_only.save(tmp_path / "figures-only.json")
    with pytest.raises(ConfigurationError, match="recorded distribution"):
        resolve({"baseline": str(tmp_path / "figures-only.json")}, {})


def test_baseline_file_drives_the_serving_latency_drift(
    learned: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import otelgpu
    from otelgpu import _runtime

    monkeypatch.setenv("OTELGPU_BASELINE", str(learned))
    otelgpu.instrument(exporters="none", gpu=False)
    try:
        rt = _runtime.current()
        assert rt is not None
        (observe,) = rt.requests.observers
        assert isinstance(observe, types.MethodType)  # the serving diagnosis' bound observer
        serving = observe.__self__
        assert isinstance(serving, ServingDiagnosis)
        assert isinstance(serving.ttft.baseline, FileBaseline)
        assert isinstance(serving.duration.baseline, FileBaseline)
        stored = load(learned).sketch("inference_ttft_p99")
        learned_sketch = serving.ttft.baseline.sketch()
        assert learned_sketch is not None
        assert learned_sketch.to_bytes() == stored.to_bytes()
    finally:
        otelgpu.shutdown()
    monkeypatch.delenv("OTELGPU_BASELINE")
    otelgpu.instrument(exporters="none", gpu=False)
    try:
        rt = _runtime.current()
        assert rt is not None
        (observe,) = rt.requests.observers
        assert isinstance(observe, types.MethodType)
        assert isinstance(observe.__self__, ServingDiagnosis)
        assert not isinstance(observe.__self__.ttft.baseline, FileBaseline)
    finally:
        otelgpu.shutdown()


def test_baseline_requirements_defaults() -> None:
    assert Requirements() == Requirements(min_coverage=0.8, min_samples=100)


# ----------------------------------------------- merged store buckets (learning from a store)
def _process_sketches(seed: int, processes: int = 3) -> tuple[list[Any], list[float]]:
    """Sketches of a few "processes" (lognormal latencies) and every value recorded."""
    from otelgpu.sketch import QuantileSketch

    rng = random.Random(seed)
    sketches: list[Any] = []
    values: list[float] = []
    for p in range(processes):
        sketch = QuantileSketch()
        for _ in range(500 + 300 * p):
            v = rng.lognormvariate(-2.0 + 0.3 * p, 0.4)
            sketch.add(v)
            values.append(v)
        sketches.append(sketch)
    return sketches, sorted(values)


def _exact(values: list[float], q: float) -> float:
    from otelgpu.otel.histogram_rule import nearest_rank

    return values[nearest_rank(q, len(values)) - 1]


def test_baseline_merge_of_classic_le_buckets_is_exact() -> None:
    # What `sum by (le) (increase(x_bucket[w]))` returns for processes exporting on the
    # pull endpoint: the per-process classic buckets, added bound by bound.
    from otelgpu.baseline.merge import buckets_from_labels, merged_quantile
    from otelgpu.otel.histogram_rule import classic_buckets

    sketches, values = _process_sketches(3)
    counts: dict[tuple[str, str], float] = {}
    for sketch in sketches:
        for le, count in classic_buckets(sketch.to_data_point(0, 1), "s"):
            key = ("+Inf" if le == float("inf") else repr(le), "")
            counts[key] = counts.get(key, 0.0) + count
    buckets = buckets_from_labels(counts)
    assert sum(b.count for b in buckets) == len(values)
    for q in (0.5, 0.95, 0.99):
        found = merged_quantile(buckets, q, "upper")
        assert found is not None
        assert found.lo < _exact(values, q) <= found.hi == found.value
        assert found.resolution == pytest.approx(1 - 2**-0.5)


def test_baseline_merge_of_vmrange_buckets_is_exact() -> None:
    # VictoriaMetrics stores an OTLP exponential histogram as `vmrange="lo...hi"` buckets
    # (the sketch's own buckets, bounds printed to 4 digits): equal in every process.
    from otelgpu.baseline.merge import buckets_from_labels, merged_quantile

    sketches, values = _process_sketches(4)
    counts: dict[tuple[str, str], float] = {}
    for sketch in sketches:
        point = sketch.to_data_point(0, 1)
        base = 2.0 ** (2.0**-point.scale)
        for i, count in enumerate(point.positive.bucket_counts):
            if count:
                lo = base ** (point.positive.offset + i)
                key = ("", f"{lo:.3e}...{lo * base:.3e}")
                counts[key] = counts.get(key, 0.0) + count
    buckets = buckets_from_labels(counts)
    assert sum(b.count for b in buckets) == len(values)
    for q in (0.5, 0.99):
        found = merged_quantile(buckets, q, "upper")
        assert found is not None and found.resolution is not None
        # 4 printed digits: the bucket holds the exact quantile up to that rounding
        assert found.lo * (1 - 1e-3) < _exact(values, q) <= found.hi * (1 + 1e-3)
        assert found.resolution == pytest.approx(1 - 2 ** -(2.0**-6), rel=0.1)


def test_baseline_merge_refusals_and_edges() -> None:
    from otelgpu.baseline.merge import Bucket, buckets_from_labels, merged_quantile

    assert merged_quantile([], 0.99, "upper") is None
    assert merged_quantile([Bucket(0.1, 0.2, 0.0)], 0.99, "upper") is None
    # Beyond the last classic bound: the value is the bound, the error unbounded.
    found = merged_quantile(
        buckets_from_labels({("4096", ""): 1.0, ("+Inf", ""): 5.0}), 0.99, "upper"
    )
    assert found is not None and found.value == 4096.0 and found.resolution is None
    # increase() rounding: a cumulative count a hair below the previous one counts 0
    buckets = buckets_from_labels({("1", ""): 10.0, ("2", ""): 9.9999, ("+Inf", ""): 10.0})
    assert [b.count for b in buckets] == [10.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="not a vmrange"):
        buckets_from_labels({("", "1.0e-3"): 1.0})


def test_baseline_version_1_files_still_load(learned: Path, tmp_path: Path) -> None:
    doc = json.loads(learned.read_text())
    doc["version"] = 1
    for entry in doc["entries"]:
        del entry["resolution"]
    (tmp_path / "v1.json").write_text(json.dumps(doc))
    old = load(tmp_path / "v1.json")
    assert old.version == 1 and all(e.resolution is None for e in old.entries)
