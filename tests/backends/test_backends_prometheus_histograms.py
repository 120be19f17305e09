"""The pull endpoint's sketch histograms in a real Prometheus (Debian 2.42) -- classic
over the text format, native over the protobuf format -- and every PromQL query of
``docs/`` over a demo-like run.

One instrumented process (``exporters="prometheus"``) records training steps and
inference requests (some failing, with ``error.type``); two Prometheus servers scrape it
every second: one plain (text format, classic histograms), one started with
``--enable-feature=native-histograms`` (protobuf format, native histograms). Checked:

* the classic ``_bucket{le}`` series exist at the documented bounds, and
  ``histogram_quantile`` over them (summed across ``error_type``) lands in the bucket of
  the exact quantile -- the overall query the docs give;
* the quantile gauges follow the nearest-rank rule (two checkpoints: p95 = p99 = the
  larger value);
* the native histograms: ``histogram_count``/``histogram_sum`` equal the values
  recorded, ``histogram_quantile`` over the cumulative histogram lands in the native
  bucket (schema 6, ~1.1 % wide) of the exact quantile, and over ``rate(…[1m])`` (the
  step series) within a bucket of the exact quantile of the steps in the window;
  Prometheus 2.42 keeps one representation per histogram family, so there the classic
  series of the sketches are absent (the docs say so);
* every PromQL expression in a ```promql block of ``docs/*.md`` parses and returns data
  on each server that has all its metric names (and at least one has), except those
  naming metrics or labels only another component produces, which are listed here with
  the reason (none may be silently dropped).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures.backends import (
    NATIVE_HISTOGRAMS,
    ROOT,
    PrometheusServer,
    promql_metric_names,
    require_binaries,
    start_prometheus,
    wait_until,
)
from fixtures.processes import free_port
from fixtures.pull import instrument_pull_only, tiny_request

import otelgpu
from otelgpu.otel import histogram_rule
from otelgpu.runtime.records import StepRecord

pytestmark = [pytest.mark.backend, pytest.mark.usefixtures("reset_otel_globals")]

#: Metric-name prefixes a plain step()/request() run cannot produce, and who does.
ELSEWHERE = {
    "otelgpu_vllm_": "vLLM's stat logger (tests/vllm/)",
}
#: Label matchers the pull endpoint cannot satisfy, and who does.
LABELS_ELSEWHERE = {
    "slurm_job_id=": "resource attributes as series labels: OTLP ingestion into a store "
    "that promotes them (on the pull endpoint they are on target_info)",
}


def _doc_queries() -> list[tuple[str, str]]:
    """(file, expression) for every query of every ```promql block in docs/."""
    out = []
    for path in sorted((ROOT / "docs").glob("*.md")):
        for block in re.findall(r"^```promql\n(.*?)^```", path.read_text(), re.M | re.S):
            expr = ""
            for line in block.splitlines():
                if not line.strip() or line.lstrip().startswith("#"):
                    if expr:
                        out.append((path.name, expr))
                    expr = ""
                    continue
                if line[0].isspace() and expr:
                    expr += " " + line.strip()
                else:
                    if expr:
                        out.append((path.name, expr))
                    expr = line.strip()
            if expr:
                out.append((path.name, expr))
    return out


@dataclass
class Demo:
    classic: PrometheusServer  # text scrape
    native: PrometheusServer  # protobuf scrape, native histograms
    values: dict[str, list[float]]  # steps, steps_window (after warm-up), ok, all (requests)


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    binary = require_binaries("prometheus")["prometheus"]
    port = free_port()
    handle = instrument_pull_only(port)
    servers: list[PrometheusServer] = []
    try:
        targets = [f"127.0.0.1:{port}"]
        for name, flags in (("classic", []), ("native", [NATIVE_HISTOGRAMS])):
            servers.append(start_prometheus(binary, tmp_path / name, targets=targets, flags=flags))
        classic, native = servers
        runtime = handle.runtime
        assert runtime is not None
        # Record only once Prometheus scrapes: rate() must see the increases.
        for server in servers:
            assert wait_until(functools.partial(server.query, "up == 1"), 20), server.log()
        rng = random.Random(11)
        values: dict[str, list[float]] = {"steps": [], "steps_window": [], "ok": [], "all": []}
        t0 = time.time_ns()

        def step(d: float, window: bool) -> None:
            runtime.record_step(StepRecord(t0, t0 + int(d * 1e9)))
            values["steps"].append(d)
            if window:
                values["steps_window"].append(d)

        def request(d: float, failed: bool) -> None:
            runtime.record_request(tiny_request(t0, d, failed))
            values["all"].append(d)
            if not failed:
                values["ok"].append(d)

        # Warm-up: one value per series, scraped before the rest, so rate() over the
        # native step series covers exactly the steps recorded after it.
        step(0.04, False)
        request(0.5, False)
        request(0.5, True)
        warm = "histogram_count(sum(otelgpu_train_step_duration_seconds)) == 1"
        assert wait_until(lambda: native.query(warm), 20), native.log()
        for round_ in range(3):  # spread over scrapes, so rate() has increases to see
            for _ in range(400):
                step(rng.lognormvariate(math.log(0.04), 0.3), True)
            for i in range(300):
                request(rng.lognormvariate(math.log(0.5), 0.6), i % 10 == 0)
            if round_ < 2:
                time.sleep(2.5)
        # Both servers have scraped everything (the requests are recorded last): a fixed
        # wait could end before a loaded machine's next scrape.
        done = f"sum(otelgpu_inference_requests_total) == {len(values['all'])}"
        for server in servers:
            assert wait_until(functools.partial(server.query, done), 30), server.log()
        yield Demo(classic, native, values)
    finally:
        for server in servers:
            server.stop()
        otelgpu.shutdown()


def _bucket_of(value: float) -> tuple[float, float]:
    bounds = histogram_rule.classic_bounds("s")
    for lo, hi in itertools.pairwise(bounds):
        if lo < value <= hi:
            return lo, hi
    raise AssertionError(value)


def _exact(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[histogram_rule.nearest_rank(q, len(ordered)) - 1]


def _native_bucket(value: float, schema: int = 6) -> tuple[float, float]:
    """The native bucket ``(base**(k-1), base**k]`` holding ``value``."""
    k = math.ceil(math.log2(value) * 2**schema)
    return 2.0 ** ((k - 1) / 2**schema), 2.0 ** (k / 2**schema)


def test_backends_prometheus_native_histograms(demo: Demo) -> None:
    prom, values = demo.native, demo.values
    name = "gen_ai_server_request_duration_seconds"
    # Cumulative: exactly the recorded values, quantiles in the bucket of the exact ones.
    count = wait_until(lambda: prom.query(f"histogram_count(sum({name}))"), 20)
    assert count, prom.log()
    assert float(count[0]["value"][1]) == len(values["all"])
    total = prom.query(f"histogram_sum(sum({name}))")
    assert float(total[0]["value"][1]) == pytest.approx(sum(values["all"]), rel=1e-9)
    for q in (0.5, 0.9, 0.99):
        result = prom.query(f"histogram_quantile({q}, sum({name}))")
        estimate = float(result[0]["value"][1])
        lo, hi = _native_bucket(_exact(values["all"], q))
        assert lo * (1 - 1e-12) <= estimate <= hi * (1 + 1e-12), (q, estimate, lo, hi)

    # Over a window (the documented form), on the step series (one series: rate()'s
    # extrapolation scales all its buckets alike, so the quantile is that of the values
    # recorded after the warm-up; with several series each is extrapolated on its own,
    # which shifts their weights and, in a sparse tail, the rank). A neighbouring bucket
    # is allowed: the scaled cumulative counts are floats compared with q * count.
    steps = "otelgpu_train_step_duration_seconds"
    for q in (0.5, 0.9, 0.99):
        result = prom.query(f"histogram_quantile({q}, sum(rate({steps}[1m])))")
        estimate = float(result[0]["value"][1])
        lo, hi = _native_bucket(_exact(values["steps_window"], q))
        base = 2 ** (1 / 64)
        assert lo / base <= estimate <= hi * base, (q, estimate, lo, hi)
    rate_count = prom.query(f"histogram_count(sum(rate({steps}[1m])))")
    rate_sum = prom.query(f"histogram_sum(sum(rate({steps}[1m])))")
    mean = float(rate_sum[0]["value"][1]) / float(rate_count[0]["value"][1])
    window = values["steps_window"]
    # The window's mean from rate()'s sum and count: Prometheus 2.42 answered ~1e-4
    # (relative) off the exact mean in trials, cause not pinned down, hence the loose bound.
    assert mean == pytest.approx(sum(window) / len(window), rel=1e-3)
    # increase() extrapolates the window's count to the range's edges: never below it.
    increase = prom.query(f"histogram_count(sum(increase({steps}[1m])))")
    assert len(window) <= float(increase[0]["value"][1]) <= 1.5 * len(window)
    count = prom.query(f"histogram_count(sum({steps}))")
    assert float(count[0]["value"][1]) == len(values["steps"])

    # Prometheus 2.42 ingests a family that carries native histograms as native only;
    # the classic series of the sketches are in the text-scraping server.
    assert prom.query(f"count({name}_bucket)") == []
    assert demo.classic.query(f"count({name}_bucket)")
    # Counters and gauges are the same series in both servers.
    for expr in (
        "otelgpu_inference_requests_total",
        "gen_ai_server_request_duration_quantile_seconds",
    ):
        a, b = prom.query(expr), demo.classic.query(expr)
        assert {json.dumps(s["metric"], sort_keys=True) for s in a} == {
            json.dumps(s["metric"], sort_keys=True) for s in b
        }, expr


def test_backends_prometheus_histograms_and_doc_queries(demo: Demo) -> None:
    prom, values = demo.classic, demo.values
    buckets = wait_until(lambda: prom.query("gen_ai_server_request_duration_seconds_bucket"), 20)
    assert buckets, prom.log()
    les = sorted({float(s["metric"]["le"]) for s in buckets})
    assert les == [*histogram_rule.classic_bounds("s"), math.inf]
    assert {s["metric"].get("error_type", "") for s in buckets} == {"", "timeout"}

    # Overall p99 across error_type (the documented query), cumulative since start:
    # histogram_quantile interpolates inside the bucket that holds the exact quantile.
    for q in (0.5, 0.99):
        result = prom.query(
            f"histogram_quantile({q}, sum by (le) (gen_ai_server_request_duration_seconds_bucket))"
        )
        estimate = float(result[0]["value"][1])
        lo, hi = _bucket_of(_exact(values["all"], q))
        assert lo <= estimate <= hi, (q, estimate, lo, hi)
    count = prom.query("sum(gen_ai_server_request_duration_seconds_count)")
    assert float(count[0]["value"][1]) == len(values["all"])

    # The gauge of the successful requests: nearest rank, within the sketch's 1 %.
    gauge = prom.query(
        'gen_ai_server_request_duration_quantile_seconds{quantile="0.99", error_type=""}'
    )
    assert len(gauge) == 1
    exact = _exact(values["ok"], 0.99)
    assert abs(float(gauge[0]["value"][1]) - exact) <= 0.01 * exact

    servers = {"classic": demo.classic, "native": demo.native}
    names = {key: set(server.api("label/__name__/values")) for key, server in servers.items()}
    checked = dict.fromkeys(servers, 0)
    native_queries = 0
    for doc, expr in _doc_queries():
        if any(matcher in expr for matcher in LABELS_ELSEWHERE):
            continue
        selected = promql_metric_names(expr)
        missing = {n for n in selected if not any(n in held for held in names.values())}
        elsewhere = {n for n in missing if any(n.startswith(prefix) for prefix in ELSEWHERE)}
        assert missing == elsewhere, (doc, expr, missing - elsewhere)
        if missing:
            continue
        holders = [key for key in servers if selected <= names[key]]
        assert holders, (doc, expr, "no server holds every name")
        for key in holders:
            server = servers[key]
            result = wait_until(functools.partial(server.query, expr), 10)
            assert result, (key, doc, expr)
            assert all(not math.isnan(float(s["value"][1])) for s in result), (key, doc, expr)
            checked[key] += 1
        native_queries += holders == ["native"]
    assert checked["classic"] >= 4 and native_queries >= 3, (checked, native_queries)
