"""The pull endpoint's sketch histograms in a real Prometheus (Debian 2.42), and every
PromQL query of ``docs/`` over a demo-like run.

One instrumented process (``exporters="prometheus"``) records training steps and
inference requests (some failing, with ``error.type``); Prometheus scrapes it every
second. Checked:

* the classic ``_bucket{le}`` series exist at the documented bounds, and
  ``histogram_quantile`` over them (summed across ``error_type``) lands in the bucket of
  the exact quantile -- the overall query the docs give;
* the quantile gauges follow the nearest-rank rule (two checkpoints: p95 = p99 = the
  larger value);
* every PromQL expression in a ```promql block of ``docs/*.md`` parses and returns data,
  except those naming metrics only another component produces, which are listed here
  with the reason (none may be silently dropped).
"""

from __future__ import annotations

import functools
import itertools
import math
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.backends import (
    ROOT,
    PrometheusServer,
    promql_metric_names,
    require_binaries,
    start_prometheus,
    wait_until,
)
from fixtures.processes import free_port

import otelgpu
from otelgpu.otel import histogram_rule
from otelgpu.runtime.records import RequestRecord, StepRecord

pytestmark = [pytest.mark.backend, pytest.mark.usefixtures("reset_otel_globals")]

#: Metric-name prefixes a plain step()/request() run cannot produce, and who does.
ELSEWHERE = {
    "otelgpu_vllm_": "vLLM's stat logger (tests/vllm/)",
    "gen_ai_server_request_duration_seconds": "native histograms (OTLP into a native store)",
    "otelgpu_train_step_duration_seconds": "native histograms (OTLP into a native store)",
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


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[tuple[PrometheusServer, dict[str, list[float]]]]:
    binary = require_binaries("prometheus")["prometheus"]
    port = free_port()
    handle = otelgpu.instrument(
        exporters="prometheus",
        prometheus_port=port,
        prometheus_rank_offset=False,
        gpu=False,
        frameworks="none",
        traces_sampler="always_off",
    )
    server = None
    try:
        server = start_prometheus(binary, tmp_path / "prometheus", targets=[f"127.0.0.1:{port}"])
        runtime = handle.runtime
        assert runtime is not None
        # Record only once Prometheus scrapes: rate() must see the increases.
        assert wait_until(lambda: server.query("up == 1"), 20), server.log()
        rng = random.Random(11)
        values: dict[str, list[float]] = {"steps": [], "ok": [], "all": []}
        t0 = time.time_ns()
        for round_ in range(3):  # spread over scrapes, so rate() has increases to see
            for _ in range(400):
                d = rng.lognormvariate(math.log(0.04), 0.3)
                runtime.record_step(StepRecord(t0, t0 + int(d * 1e9)))
                values["steps"].append(d)
            for i in range(300):
                d = rng.lognormvariate(math.log(0.5), 0.6)
                failed = i % 10 == 0
                runtime.record_request(
                    RequestRecord(
                        t0,
                        t0 + int(d * 1e9),
                        model="tiny",
                        output_tokens=8,
                        outcome="error" if failed else "ok",
                        error_type="timeout" if failed else None,
                    )
                )
                values["all"].append(d)
                if not failed:
                    values["ok"].append(d)
            if round_ < 2:
                time.sleep(2.5)
        time.sleep(2.5)
        yield server, values
    finally:
        if server is not None:
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


def test_backends_prometheus_histograms_and_doc_queries(
    demo: tuple[PrometheusServer, dict[str, list[float]]],
) -> None:
    prom, values = demo
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

    names = set(prom.api("label/__name__/values"))
    checked = 0
    for doc, expr in _doc_queries():
        missing = {n for n in promql_metric_names(expr) if n not in names}
        elsewhere = {n for n in missing if any(n.startswith(prefix) for prefix in ELSEWHERE)}
        assert missing == elsewhere, (doc, expr, missing - elsewhere)
        if missing:
            continue
        result = wait_until(functools.partial(prom.query, expr), 10)
        assert result, (doc, expr)
        assert all(not math.isnan(float(s["value"][1])) for s in result), (doc, expr, result)
        checked += 1
    assert checked >= 4
