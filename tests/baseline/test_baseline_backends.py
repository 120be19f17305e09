"""The operating loop against real servers: Prometheus (TSDB backfill of a healthy day),
promtool, Alertmanager with a webhook receiver in the test.

healthy history -> ``otelgpu baseline learn`` -> ``baseline rules`` (promtool check + the
generated unit tests) -> a live run: healthy delivers no alert; with an injected latency
regression, thermal throttling and an XID 79 Alertmanager delivers exactly the expected
alerts. Every dashboard panel's query then runs against that store. Refusals: an empty
store, one hour of history, a store without otelgpu's metrics, an unreachable store.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from baseline_support import (
    EXPECTED_ALERTS,
    LiveTarget,
    Webhook,
    alerting_config,
    backfill,
    cli,
    free_port,
    http_ok,
    require_binaries,
    start_alertmanager,
    start_store,
    wait_until,
)

from otelgpu.baseline import dashboards
from otelgpu.baseline.figures import FIGURES
from otelgpu.baseline.model import load
from otelgpu.baseline.names import metric_name, spec

pytestmark = pytest.mark.backend

DAY = 86400.0
MODEL_KEY = "gen_ai_request_model"


def learn(url: str, out: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """``otelgpu baseline learn --url URL OPTIONS --out OUT`` (the real command line)."""
    return cli("baseline", "learn", "--url", url, *options, "--out", str(out))


def promtool(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``promtool ARGS``, its output captured."""
    binary = require_binaries("promtool")["promtool"]
    return subprocess.run(
        [binary, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, float]]:
    """A Prometheus holding one healthy day of the simulated fleet (1-minute samples)."""
    directory = tmp_path_factory.mktemp("history")
    end = time.time() - 120
    data = backfill(directory, end, DAY)
    store = start_store(directory, {"global": {"scrape_interval": "15s"}}, data)
    yield store, end
    store.stop()


@pytest.fixture(scope="module")
def learned(history: tuple[Any, float], tmp_path_factory: pytest.TempPathFactory) -> Path:
    store, end = history
    out = tmp_path_factory.mktemp("learned")
    result = learn(
        store.url,
        out / "baseline.json",
        "--window",
        "1d",
        "--end",
        str(end),
        "--header",
        "X-Scope-OrgID=fleet",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out / "baseline.json"


def test_baseline_learn_every_figure_per_key(learned: Path) -> None:
    baseline = load(learned)
    got = {(e.figure, tuple(sorted((k, v) for k, v in e.labels.items()))) for e in baseline.entries}
    train, serve = (("job", "train"),), (("gen_ai_request_model", "llama-3-8b"), ("job", "serve"))
    gpu = (("hw_name", "NVIDIA H100 80GB HBM3"),)
    expected = {
        (f.id, {"training": train, "inference": serve, "health": gpu}[f.family]) for f in FIGURES
    }
    # queue and KV cache are per job only (vLLM's engine gauges carry no model label)
    expected = {
        (fid, (("job", "serve"),) if fid in ("inference_queue", "inference_kv_cache") else key)
        for fid, key in expected
    }
    assert got == expected
    step = baseline.entry("train_step_p95", {"job": "train"})
    assert step is not None and 0.11 < step.median < 0.13  # the history's 120 ms p95
    assert step.threshold == pytest.approx(step.p99 * 1.25)
    assert step.samples >= 1400 and step.coverage > 0.95
    assert baseline.version == 2 and baseline.source["kind"] == "prometheus"
    # The step time has quantile gauges only in the backfilled history: learned from
    # them, and said so. The request latency has its classic histogram: merged buckets.
    learned_from = baseline.source["learned_from"]
    assert learned_from["train_step_p95"] == "quantile gauges"
    assert "train_step_p95" in baseline.source["note"] and step.resolution is None
    assert learned_from["inference_request_p99"] == "histogram buckets (le)"
    assert "inference_request_p99" not in baseline.source["note"]
    latency = baseline.entry("inference_request_p99", {"job": "serve", MODEL_KEY: "llama-3-8b"})
    assert latency is not None and latency.resolution == pytest.approx(1 - 2**-0.5, abs=1e-6)
    # the bucket holding the lognormal's p99 (1.8 s): (2 ** 0.5, 2], reported at 2 s
    assert latency.reference == 2.0 and latency.threshold == pytest.approx(2.5)
    # a day of 20 requests a second, each minute's increase counted once (Prometheus
    # extrapolates to the window's edges: within a minute's worth)
    assert abs(latency.samples - 20 * DAY) <= 20 * 60


def test_baseline_rules_pass_promtool_check_and_unit_tests(learned: Path, tmp_path: Path) -> None:
    rules, tests = tmp_path / "rules.yml", tmp_path / "rules.test.yml"
    result = cli("baseline", "rules", str(learned), "--out", str(rules), "--tests", str(tests))
    assert result.returncode == 0, result.stderr
    entries = len(load(learned).entries)
    check = promtool("check", "rules", str(rules))
    assert check.returncode == 0 and "FAILED" not in check.stdout + check.stderr, check.stderr
    assert f"SUCCESS: {entries + 4} rules found" in check.stdout
    unit = promtool("test", "rules", str(tests), timeout=120)
    assert unit.returncode == 0, unit.stdout[-4000:]
    import yaml  # type: ignore[import-untyped]  # no PyYAML stubs in the test extras

    doc = yaml.safe_load(tests.read_text())
    names = [t["name"] for t in doc["tests"]]
    # every alert: one firing case and one quiet case
    assert len(names) == 2 * (entries + 4)
    alerts = {t["alert_rule_test"][0]["alertname"] for t in doc["tests"]}
    for alert in alerts:
        assert any(n.startswith(f"{alert} fires") for n in names)
        assert any(n.startswith(f"{alert} quiet") for n in names)
    text = rules.read_text()
    assert "p99 of history" in text and "runbook" in text  # figure and margin quoted


def test_baseline_rules_unit_tests_catch_a_loosened_threshold(
    learned: Path, tmp_path: Path
) -> None:
    rules, tests = tmp_path / "rules.yml", tmp_path / "rules.test.yml"
    cli("baseline", "rules", str(learned), "--out", str(rules), "--tests", str(tests))
    step = load(learned).entry("train_step_p95")
    assert step is not None
    import yaml  # type: ignore[import-untyped]  # no PyYAML stubs in the test extras

    doc = yaml.safe_load(rules.read_text())
    (rule,) = [
        r
        for g in doc["groups"]
        for r in g["rules"]
        if r["alert"] == "OtelgpuBaselineStepTimeRegression"
    ]
    old = f"> {step.threshold:.6g}"
    assert rule["expr"].endswith(old)
    rule["expr"] = rule["expr"].replace(old, f"> {step.threshold * 10:.6g}")
    rules.write_text(yaml.safe_dump(doc))
    unit = promtool("test", "rules", str(tests), timeout=120)
    assert unit.returncode == 1
    assert "OtelgpuBaselineStepTimeRegression fires" in unit.stdout + unit.stderr


def test_baseline_tighten_against_the_store(
    history: tuple[Any, float], learned: Path, tmp_path: Path
) -> None:
    # An older, looser baseline: every threshold 40 % further from normal than the newer
    # history supports. tighten proposes the learned thresholds back, with their rates.
    store, end = history
    loose = load(learned)
    for e in loose.entries:
        e.threshold = e.threshold * (1.4 if e.direction == "upper" else 0.6)
    loose.save(tmp_path / "loose.json")
    result = cli(
        "baseline",
        "tighten",
        str(tmp_path / "loose.json"),
        "--url",
        store.url,
        "--window",
        "1d",
        "--end",
        str(end),
        "--out",
        str(tmp_path / "tight.json"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(loose.entries)} thresholds tighter" in result.stdout
    tight, fresh = load(tmp_path / "tight.json"), load(learned)
    for e in tight.entries:
        again = fresh.entry(e.figure, e.labels)
        assert again is not None and e.threshold == pytest.approx(again.threshold)
    # The extra alert rate, recomputed here from the store: the share of the history's
    # samples beyond the proposed threshold (none beyond the loose one).
    import re

    from otelgpu.baseline.figures import figure

    rates = dict(
        re.findall(r"^- (\S+ \{[^}]*\}): .*\+(\d+\.\d+)% expected extra", result.stdout, re.M)
    )
    assert len(rates) == len(loose.entries)
    for e in tight.entries:
        data = store.api(
            "query_range",
            query=figure(e.figure).query(),
            start=str(end - DAY),
            end=str(end),
            step="43.2",
        )
        (series,) = [
            r
            for r in data["result"]
            if all(r["metric"].get(k, "") == v for k, v in e.labels.items())
        ]
        values = [float(v) for _, v in series["values"]]
        beyond = sum(
            1 for v in values if (v > e.threshold if e.direction == "upper" else v < e.threshold)
        )
        key = ",".join(f"{k}={v}" for k, v in sorted(e.labels.items()) if v)
        assert float(rates[f"{e.figure} {{{key}}}"]) == pytest.approx(
            100 * beyond / len(values), abs=0.005
        )


# ------------------------------------------------------------------------ refusals
def test_baseline_refuses_an_empty_store(tmp_path: Path) -> None:
    store = start_store(tmp_path, {"global": {"scrape_interval": "15s"}})
    try:
        result = learn(store.url, tmp_path / "b.json")
    finally:
        store.stop()
    assert result.returncode == 3
    assert "no otelgpu metrics in" in result.stderr
    assert metric_name("otelgpu.train.step.duration") in result.stderr  # what it looked for
    assert not (tmp_path / "b.json").exists()


def test_baseline_refuses_one_hour_of_history(tmp_path: Path) -> None:
    end = time.time() - 60
    data = backfill(tmp_path, end, 3600)
    store = start_store(tmp_path, {"global": {"scrape_interval": "15s"}}, data)
    try:
        result = learn(store.url, tmp_path / "b.json", "--end", str(end))
    finally:
        store.stop()
    assert result.returncode == 3, result.stdout + result.stderr
    assert "too little history" in result.stderr
    assert 'train_step_p95 {job="train"}' in result.stderr
    assert "of the 7d window (needs >= 80% coverage" in result.stderr
    assert not (tmp_path / "b.json").exists()


def test_baseline_refuses_a_store_without_the_metrics(tmp_path: Path) -> None:
    # A Prometheus scraping itself: plenty of data, none of it otelgpu's.
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            {"job_name": "self", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
        ],
    }
    store = start_store(tmp_path, config, port=port)
    try:
        assert wait_until(lambda: store.query("up == 1"), 15)
        result = learn(store.url, tmp_path / "b.json", "--window", "1h")
    finally:
        store.stop()
    assert result.returncode == 3
    assert "no otelgpu metrics in" in result.stderr


def test_baseline_unreachable_store_exit_code(tmp_path: Path) -> None:
    result = learn(f"http://127.0.0.1:{free_port()}", tmp_path / "b.json")
    assert result.returncode == 4
    assert "the store did not answer" in result.stderr


# ------------------------------------------------------------------ end to end (alerts)
@pytest.fixture(scope="module")
def live_run(learned: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Rules from the learned baseline in a Prometheus scraping a live fleet, with
    Alertmanager delivering to a webhook: healthy first, then with the injected faults."""
    directory = tmp_path_factory.mktemp("live")
    rules = directory / "rules.yml"
    result = cli(
        "baseline",
        "rules",
        str(learned),
        "--out",
        str(rules),
        "--for",
        "3s",
        "--rate-window",
        "20s",
    )
    assert result.returncode == 0, result.stderr
    webhook = Webhook()
    target = LiveTarget()
    am, am_port = start_alertmanager(directory / "am", webhook)
    config = alerting_config(
        rules,
        am_port,
        [
            {
                "job_name": job,
                "metrics_path": f"/{job}",
                "static_configs": [{"targets": [f"127.0.0.1:{target.port}"]}],
            }
            for job in ("train", "serve")
        ],
    )
    store = start_store(directory / "prom", config)
    state: dict[str, Any] = {"store": store, "webhook": webhook}
    try:
        # Healthy: every rule evaluated for well beyond its 3 s for:, nothing delivered.
        assert wait_until(lambda: len(store.query("up == 1")) == 2, 15)
        time.sleep(10)
        state["healthy_firing"] = webhook.firing()
        state["healthy_pending"] = store.api("alerts")["alerts"]
        target.faulty = True
        state["faulty_firing"], state["deliveries"] = webhook.settle(EXPECTED_ALERTS)
        yield state
    finally:
        store.stop()
        am.terminate()
        am.wait(10)
        target.close()
        webhook.server.shutdown()


def test_baseline_healthy_run_delivers_no_alert(live_run: dict[str, Any]) -> None:
    assert live_run["healthy_firing"] == set()
    assert live_run["healthy_pending"] == []


def test_baseline_faulty_run_delivers_exactly_the_expected_alerts(live_run: dict[str, Any]) -> None:
    assert live_run["faulty_firing"] == EXPECTED_ALERTS, live_run["deliveries"]
    labels = {name: lab for status, name, lab in live_run["deliveries"] if status == "firing"}
    assert labels["OtelgpuBaselineLatencyRegression"]["job"] == "serve"
    assert labels["OtelgpuBaselineThrottling"]["hw_name"] == "NVIDIA H100 80GB HBM3"
    assert labels["OtelgpuGpuXidCritical"]["otelgpu_gpu_xid_code"] == "79"


# ------------------------------------------------------------------------ dashboards
def _unit_of(panel: dashboards.PanelSpec) -> str:
    return panel.unit


def test_baseline_every_dashboard_panel_returns_data(live_run: dict[str, Any]) -> None:
    store = live_run["store"]
    built = dashboards.build("pull")
    by_title = {p.title: p for p in dashboards.PANELS}
    counts: dict[str, int] = {}
    for file_name, doc in built.items():
        assert doc["panels"], file_name
        for panel in doc["panels"]:
            (target,) = panel["targets"]
            result = store.query(target["expr"])
            counts[f"{file_name}: {panel['title']}"] = len(result)
            assert result, f"{file_name}: {panel['title']}: no data for {target['expr']}"
            spec_ = by_title[panel["title"]]
            assert panel["fieldConfig"]["defaults"]["unit"] == _unit_of(spec_)
            if spec_.view in ("value",) or spec_.view.startswith("q"):
                assert panel["fieldConfig"]["defaults"]["unit"] == dashboards.grafana_unit(
                    spec(spec_.metric).unit
                )
    print("\n".join(f"{k}: {v} series" for k, v in sorted(counts.items())))
    assert len(counts) == sum(len(d["panels"]) for d in built.values())


def test_baseline_overview_is_training_left_inference_right_health_below() -> None:
    doc = dashboards.build("pull")["otelgpu-overview-pull.json"]
    by_title = {p.title: p for p in dashboards.PANELS}
    health_top = min(
        p["gridPos"]["y"] for p in doc["panels"] if by_title[p["title"]].section == "health"
    )
    for p in doc["panels"]:
        section, pos = by_title[p["title"]].section, p["gridPos"]
        if section == "training":
            assert pos["x"] == 0 and pos["w"] == 12 and pos["y"] < health_top
        elif section == "inference":
            assert pos["x"] == 12 and pos["w"] == 12 and pos["y"] < health_top


def test_baseline_shipped_dashboards_are_current(tmp_path: Path) -> None:
    written = dashboards.write(tmp_path)
    assert len(written) == 6
    for path in written:
        shipped = dashboards.SHIPPED / path.name
        assert shipped.read_text() == path.read_text(), (
            f"regenerate {shipped} (otelgpu dashboards --out)"
        )


def test_baseline_names_are_what_the_real_exporter_exposes(learned: Path) -> None:
    # Every metric name in the generated rules and the pull-path dashboards is one the
    # real Prometheus exporter writes for otelgpu's catalog -- a rename breaks this test.
    from fixtures.backends import exposition_names, otelgpu_metric_tables, promql_metric_names

    from otelgpu.baseline.rules import rules_document

    exposed = set(exposition_names(otelgpu_metric_tables()))
    used: set[str] = set()
    for group in rules_document(load(learned))["groups"]:
        for rule in group["rules"]:
            used |= promql_metric_names(rule["expr"])
    for doc in dashboards.build("pull").values():
        for panel in doc["panels"]:
            used |= promql_metric_names(panel["targets"][0]["expr"])
    assert used and used <= exposed, sorted(used - exposed)


# ------------------------------------------------------- OTLP path: VictoriaMetrics
# Panels whose metrics come only from the torch/vLLM instrumentations or checkpoints,
# which the OTLP demo (runtime steps and requests, simulated GPUs) does not produce.
_NOT_IN_OTLP_DEMO = {
    "Data-wait share",
    "Comm-wait share",
    "Checkpoint p95",
    "Queued requests",
    "KV-cache usage",
}


def test_baseline_otlp_dashboards_against_victoria_metrics(tmp_path: Path) -> None:
    import urllib.parse
    import urllib.request

    binary = require_binaries("victoria-metrics")["victoria-metrics"]
    port = free_port()
    vm = subprocess.Popen(
        [
            binary,
            f"-httpListenAddr=127.0.0.1:{port}",
            f"-storageDataPath={tmp_path / 'vm'}",
            "-retentionPeriod=1d",
            "-search.latencyOffset=1s",
            "-opentelemetry.usePrometheusNaming",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"

    def query(expr: str) -> list[Any]:
        params = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{url}/api/v1/query?{params}", timeout=5) as r:
            return list(json.loads(r.read())["data"]["result"])

    try:
        assert wait_until(lambda: http_ok(f"{url}/health"), 15)
        demo = Path(__file__).with_name("otlp_demo.py")
        run = subprocess.run(
            [sys.executable, str(demo), f"{url}/opentelemetry", "5"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        xid = metric_name("otelgpu.gpu.xid", "otlp")
        assert wait_until(lambda: query(xid), 15), f"no {xid} in VictoriaMetrics"
        counts, empty = {}, set()
        by_title = {p.title: p for p in dashboards.PANELS}
        for file_name, doc in dashboards.build("otlp").items():
            for panel in doc["panels"]:
                n = len(query(panel["targets"][0]["expr"]))
                counts[f"{file_name}: {panel['title']}"] = n
                if n == 0:
                    empty.add(panel["title"])
                assert panel["fieldConfig"]["defaults"]["unit"] == by_title[panel["title"]].unit
        # The same store, read by `baseline learn --path otlp` (a few seconds of history,
        # with requirements to match), and its rules accepted by promtool.
        out = tmp_path / "otlp-baseline.json"
        learned = learn(
            url,
            out,
            "--path",
            "otlp",
            "--window",
            "8s",
            "--step",
            "1s",
            "--min-coverage",
            "0.1",
            "--min-samples",
            "2",
        )
        assert learned.returncode == 0, learned.stdout + learned.stderr
    finally:
        vm.terminate()
        vm.wait(10)
    print("\n".join(f"{k}: {v} series" for k, v in sorted(counts.items())))
    assert empty == _NOT_IN_OTLP_DEMO, sorted(empty ^ _NOT_IN_OTLP_DEMO)
    baseline = load(out)
    assert baseline.source["path"] == "otlp"
    # The latency figures come from VictoriaMetrics' vmrange buckets, merged exactly: at
    # the sketch's scale 6 a bucket is 2 ** (1 / 64) wide (1.08 %).
    for fid in ("train_step_p95", "inference_request_p99", "inference_ttft_p99"):
        assert baseline.source["learned_from"][fid] == "histogram buckets (vmrange)"
        entry = baseline.entry(fid)
        assert entry is not None and entry.resolution is not None
        assert entry.resolution == pytest.approx(1 - 2 ** (-1 / 64), rel=0.1)
    assert "note" not in baseline.source
    figures = {e.figure for e in baseline.entries}
    assert {
        "train_step_p95",
        "inference_request_p99",
        "inference_ttft_p99",
        "inference_error_rate",
        "train_gpu_utilization",
        "health_memory_usage",
    } <= figures
    rules = tmp_path / "otlp-rules.yml"
    assert (
        cli(
            "baseline",
            "rules",
            str(out),
            "--out",
            str(rules),
            "--tests",
            str(tmp_path / "otlp-rules.test.yml"),
        ).returncode
        == 0
    )
    assert metric_name("hw.gpu.utilization", "otlp") in rules.read_text()
    for args in (
        ("check", "rules", str(rules)),
        ("test", "rules", str(tmp_path / "otlp-rules.test.yml")),
    ):
        check = promtool(*args)
        assert check.returncode == 0, check.stdout[-3000:] + check.stderr
