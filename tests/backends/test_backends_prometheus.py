"""A real Prometheus (Debian 2.42) scrapes otelgpu's pull endpoint.

One instrumented process on the simulated GPU (2 H100s, virtual clock), with
``exporters="prometheus"`` on a free 127.0.0.1 port; Prometheus scrapes it every second
and evaluates the shipped alert rules -- once negotiating the text format, once the
protobuf format (``--enable-feature=native-histograms``). PromQL over its HTTP API must
return, in both:

* ``hw_gpu_utilization`` per GPU, keyed by ``hw_id`` = the GPU's UUID, at the scenario's
  value; the rank (a resource attribute) joined in from ``target_info``;
* the step-time and request-latency quantile gauges, equal to a sketch fed the same
  durations and within 1 % of the exact quantiles;
* the step-time histogram's count (classic ``_count``, or native ``histogram_count``);
* the alert rules loaded and healthy, and the GPU-lost and critical-XID alerts firing
  for exactly the GPU where the simulator injected the fault.
"""

from __future__ import annotations

import functools
import math
import random
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.backends import (
    NATIVE_HISTOGRAMS,
    RULES,
    PrometheusServer,
    require_binaries,
    start_prometheus,
    wait_until,
)
from fixtures.processes import free_port
from fixtures.sim import SMALL_SCENARIO
from prometheus_client.parser import text_string_to_metric_families

import otelgpu
from otelgpu import sim
from otelgpu.otel import histogram_rule
from otelgpu.runtime.records import RequestRecord, StepRecord
from otelgpu.sketch import QuantileSketch

pytestmark = [pytest.mark.backend, pytest.mark.usefixtures("reset_otel_globals")]

QUANTILES = (0.5, 0.95, 0.99)
STEP_MS_SEED = 7


def _step_durations_ns() -> list[int]:
    """A known step-time data set: ~40 ms steps with jitter and a few 4x slow ones."""
    rng = random.Random(STEP_MS_SEED)
    out = [int(rng.gauss(40e6, 3e6)) for _ in range(1900)]
    out += [int(rng.uniform(150e6, 170e6)) for _ in range(100)]
    rng.shuffle(out)
    return out


def _exact(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@pytest.fixture
def prometheus_binary() -> str:
    return require_binaries("prometheus")["prometheus"]


@pytest.fixture(params=["text", "protobuf"])
def scraped(
    request: pytest.FixtureRequest,
    prometheus_binary: str,
    sim_scenario: Callable[..., sim.SimGpu],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[PrometheusServer, sim.SimGpu, Any]]:
    """An instrumented process on the simulator, scraped by a running Prometheus."""
    gpu = sim_scenario(SMALL_SCENARIO, clock="virtual")
    gpu.advance(5.0)  # out of the scenario's initial 2 s dip: 80 % utilization
    monkeypatch.setenv("RANK", "3")
    port = free_port()
    handle = otelgpu.instrument(
        exporters="prometheus",
        prometheus_host="127.0.0.1",
        prometheus_port=port,
        service_name="otelgpu-backend-test",
        frameworks="none",
        sample_interval_ms=50,
        traces_sampler="always_off",
    )
    server = None
    try:
        assert handle.runtime is not None and handle.runtime.sampler is not None
        server = start_prometheus(
            prometheus_binary,
            tmp_path / "prometheus",
            targets=[f"127.0.0.1:{port}"],
            rule_files=[RULES],
            flags=[NATIVE_HISTOGRAMS] if request.param == "protobuf" else [],
        )
        yield server, gpu, handle
    finally:
        if server is not None:
            server.stop()
        otelgpu.shutdown()


def test_backends_prometheus_scrapes_gpu_metrics_and_quantiles(
    scraped: tuple[PrometheusServer, sim.SimGpu, Any],
) -> None:
    prom, _gpu, handle = scraped
    runtime = handle.runtime
    uuids = sorted(d.uuid for d in runtime.sampler.devices)
    assert len(uuids) == 2

    steps_ns = _step_durations_ns()
    t0 = 1_700_000_000_000_000_000
    start = t0
    for i, duration in enumerate(steps_ns):
        if i == len(steps_ns) - 100:
            # A pull endpoint has nothing to flush. The exporter's own flush queued a
            # collection that the next scrape served beside its own, every series twice,
            # the values of the flush first: Prometheus kept those and dropped the newer
            # ones as duplicates.
            for _ in range(3):
                handle.force_flush()
        runtime.record_step(StepRecord(start, start + duration))
        start += duration
    requests_ns = [int(d * 3.1) + 1_000_000 for d in steps_ns[:500]]
    for duration in requests_ns:
        runtime.record_request(RequestRecord(t0, t0 + duration, model="tiny", output_tokens=4))
    # A scrape taken while the loops ran has every series, with partial values: wait for
    # one taken after the last request (recorded last, so everything else is in it too).
    everything = f"sum(otelgpu_inference_requests_total) == {len(requests_ns)}"
    assert wait_until(lambda: prom.query(everything), 30), prom.log()

    util = wait_until(lambda: prom.query("hw_gpu_utilization"), 20)
    assert util, prom.log()
    by_gpu = {s["metric"]["hw_id"]: float(s["value"][1]) for s in util}
    assert sorted(by_gpu) == uuids
    assert by_gpu == {u: pytest.approx(0.8) for u in uuids}
    assert {s["metric"]["job"] for s in util} == {"otelgpu"}

    # Resource attributes live on target_info; the usual join slices GPUs by rank.
    joined = prom.query(
        "hw_gpu_utilization * on (job, instance) group_left (otelgpu_dist_rank, service_name)"
        " target_info"
    )
    assert {(s["metric"]["hw_id"], s["metric"]["otelgpu_dist_rank"]) for s in joined} == {
        (u, "3") for u in uuids
    }
    assert {s["metric"]["service_name"] for s in joined} == {"otelgpu-backend-test"}

    memory = prom.query("hw_gpu_memory_limit_bytes")
    limits = {s["metric"]["hw_id"]: float(s["value"][1]) for s in memory}
    assert limits == {d.uuid: float(d.memory_total_bytes) for d in runtime.sampler.devices}

    model = ',gen_ai_request_model="tiny"'
    for metric, durations_ns, selector in (
        ("otelgpu_train_step_duration_quantile_seconds", steps_ns, ""),
        ("gen_ai_server_request_duration_quantile_seconds", requests_ns, model),
    ):
        seconds = [d / 1e9 for d in durations_ns]
        reference = QuantileSketch(relative_accuracy=0.01)
        for v in seconds:
            reference.add(v)
        for q in QUANTILES:
            promql = f'{metric}{{quantile="{q}"{selector}}}'
            result = wait_until(functools.partial(prom.query, promql), 10)
            assert len(result) == 1, (promql, result)
            value = float(result[0]["value"][1])
            # The gauge's rule is the one the histogram implies (nearest rank).
            implied = histogram_rule.quantiles(reference.to_data_point(0, 0), [q])[0]
            assert value == pytest.approx(implied, rel=1e-12), promql
            exact = _exact(seconds, q)
            assert abs(value - exact) <= 0.01 * exact, (promql, value, exact)

    steps_total = prom.query("otelgpu_train_steps_total")
    assert [float(s["value"][1]) for s in steps_total] == [len(steps_ns)]

    # Over protobuf the sketches are native histograms (and only that, in 2.42); over
    # text, classic ones. Either way they count every step.
    native = NATIVE_HISTOGRAMS in list(prom.process.args)  # type: ignore[arg-type]
    count = (
        "histogram_count(sum(otelgpu_train_step_duration_seconds))"
        if native
        else "sum(otelgpu_train_step_duration_seconds_count)"
    )
    result = wait_until(lambda: prom.query(count), 10)
    assert [float(s["value"][1]) for s in result] == [len(steps_ns)], count

    # Every scrape had each series once: Prometheus counts a sample repeated with another
    # value in one scrape (the same series and timestamp) in its own metrics.
    with urllib.request.urlopen(f"{prom.url}/metrics", timeout=10) as answer:
        own = {
            s.name: s.value
            for f in text_string_to_metric_families(answer.read().decode())
            for s in f.samples
        }
    assert own["prometheus_target_scrapes_sample_duplicate_timestamp_total"] == 0


def test_backends_prometheus_alerts_fire_on_simulated_faults(
    scraped: tuple[PrometheusServer, sim.SimGpu, Any],
) -> None:
    prom, gpu, handle = scraped
    devices = sorted(handle.runtime.sampler.devices, key=lambda d: d.nvml_index)
    healthy, lost = devices[0].uuid, devices[1].uuid

    # The shipped rules load and evaluate against real otelgpu series without errors.
    def rules_evaluated() -> list[dict[str, Any]]:
        groups = prom.api("rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        never = "0001-01-01"  # Go's zero time: not evaluated yet
        done = all(not r["lastEvaluation"].startswith(never) for r in rules)
        return rules if rules and done else []

    rules = wait_until(rules_evaluated, 15)
    assert len(rules) == 14, prom.log()
    assert {r["name"]: r["health"] for r in rules} == {r["name"]: "ok" for r in rules}

    assert wait_until(lambda: prom.query('hw_status{hw_state="ok"} == 1'), 20), prom.log()
    assert prom.api("alerts")["alerts"] == []

    gpu.inject("xid", gpu=0, code=48)  # double-bit ECC: a critical XID
    gpu.inject("gpu_lost", gpu=1)  # XID 79: the GPU falls off the bus
    gpu.advance(1.0)  # the faults are now in the past of every NVML reader

    def firing() -> set[tuple[str, str]]:
        alerts = prom.api("alerts")["alerts"]
        return {
            (a["labels"]["alertname"], a["labels"].get("hw_id", ""))
            for a in alerts
            if a["state"] == "firing"
        }

    expected = {("OtelgpuGpuLost", lost), ("OtelgpuGpuXidCritical", healthy)}
    # Generous: on a loaded 2-core CI machine scrape + rule evaluation can lag by seconds.
    got = wait_until(lambda: expected <= firing() and firing(), 60) or firing()
    assert expected <= got, (
        got,
        prom.query("hw_status"),
        prom.query("otelgpu_gpu_xid_total"),
        [(e.kind, e.uuid, e.code) for e in handle.runtime.sampler.events(0, 2**62)],
        handle.runtime.sampler.stats(),
        handle.runtime.sampler.running,
        gpu.now_s(),
        [t.name for t in __import__("threading").enumerate()],
        prom.log(),
    )
    assert ("OtelgpuGpuLost", healthy) not in got
