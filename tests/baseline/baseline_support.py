"""A simulated fleet's metrics on otelgpu's pull-endpoint names, for the baseline tests.

* :func:`openmetrics_history` -- a healthy history (OpenMetrics text with timestamps) for
  ``promtool tsdb create-blocks-from openmetrics``: days of Prometheus data in seconds.
  The serve job's request latency is there also as its classic histogram
  (:func:`request_histogram`); the other sketch metrics only as quantile gauges.
* :class:`LiveTarget` -- a tiny HTTP scrape target serving the same fleet now, healthy or
  with injected faults (latency regression, thermal throttling, XID 79).
* :func:`backfill` / :func:`start_store` -- a real Prometheus holding such a history.

Series names come from the metric catalog (``otelgpu.baseline.names``), so a renamed
metric breaks these tests. The fleet: job ``train`` (one GPU) and job ``serve`` (model
``llama-3-8b``, one GPU), both H100s.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from fixtures.backends import (
    PrometheusServer,
    _wait_ready,
    require_binaries,
    wait_until,
)
from fixtures.processes import free_port

__all__ = [
    "EXPECTED_ALERTS",
    "LiveTarget",
    "PrometheusServer",
    "Webhook",
    "alerting_config",
    "backfill",
    "cli",
    "free_port",
    "http_ok",
    "openmetrics_history",
    "require_binaries",
    "start_alertmanager",
    "start_store",
    "wait_until",
]

from otelgpu.baseline.names import histogram_name
from otelgpu.baseline.names import metric_name as n

GPU_MODEL = "NVIDIA H100 80GB HBM3"
MODEL = "llama-3-8b"
HEALTHY = {
    "step_p95": 0.120,
    "data_wait": 0.05,
    "comm_wait": 0.10,
    "util": 0.92,
    "ckpt_p95": 8.0,
    "req_p99": 1.8,
    "ttft_p99": 0.25,
    "waiting": 3.0,
    "kv": 0.6,
    "mem": 60e9,
    "throttle_share": 0.005,
    "req_rate": 20.0,
    "err_share": 0.005,
}
FAULTS = {"req_p99": 3.6, "throttle_share": 0.5}
"""The injected faults: p99 latency doubled, half the time thermally throttled (+ XID 79)."""
EXPECTED_ALERTS = {
    "OtelgpuBaselineLatencyRegression",
    "OtelgpuBaselineThrottling",
    "OtelgpuGpuXidCritical",
}


# The pull endpoint serves each sketch's p50, p95 and p99 (setting `quantiles`).
_QUANTILES_95 = {"0.5": 0.85, "0.95": 1.0, "0.99": 1.1}
_QUANTILES_99 = {"0.5": 0.5, "0.95": 0.8, "0.99": 1.0}


def _gpu(job: str) -> dict[str, str]:
    return {"hw_id": f"GPU-{job}", "hw_name": GPU_MODEL, "hw_vendor": "NVIDIA", "hw_type": "gpu"}


def samples(
    job: str, t: float, v: dict[str, float], xid: bool = False
) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of job ``job`` at ``t`` seconds since its start, values ``v``
    (counters grow at the rates in ``v``)."""
    g = _gpu(job)
    if job == "train":
        for q, f in _QUANTILES_95.items():
            yield n("otelgpu.train.step.duration"), {"quantile": q}, v["step_p95"] * f
        yield n("otelgpu.train.data.wait.ratio"), {}, v["data_wait"]
        yield n("otelgpu.train.comm.wait.ratio"), {}, v["comm_wait"]
        for q, f in _QUANTILES_95.items():
            yield n("otelgpu.train.checkpoint.duration"), {"quantile": q}, v["ckpt_p95"] * f
        yield n("otelgpu.train.steps"), {}, t / v["step_p95"]
    else:
        m = {"gen_ai_request_model": MODEL}
        for q, f in _QUANTILES_99.items():
            yield n("gen_ai.server.request.duration"), {**m, "quantile": q}, v["req_p99"] * f
            yield n("gen_ai.server.time_to_first_token"), {**m, "quantile": q}, v["ttft_p99"] * f
        ok, err = v["req_rate"] * (1 - v["err_share"]), v["req_rate"] * v["err_share"]
        yield n("otelgpu.inference.requests"), {**m, "otelgpu_request_outcome": "ok"}, ok * t
        yield n("otelgpu.inference.requests"), {**m, "otelgpu_request_outcome": "error"}, err * t
        yield n("otelgpu.vllm.requests.waiting"), {}, v["waiting"]
        yield n("otelgpu.vllm.kv_cache.usage"), {}, v["kv"]
    yield n("hw.gpu.utilization"), {**g, "hw_gpu_task": "general"}, v["util"]
    yield n("hw.gpu.memory.usage"), g, v["mem"]
    yield n("hw.gpu.memory.limit"), g, 80e9
    yield (
        n("otelgpu.gpu.throttle.time"),
        {**g, "otelgpu_gpu_throttle_reason": "hw_thermal_slowdown"},
        v["throttle_share"] * t,
    )
    for state in ("ok", "failed"):
        yield n("hw.status"), {**g, "hw_state": state}, 1.0 if state == "ok" else 0.0
    if xid:
        yield n("otelgpu.gpu.xid"), {**g, "otelgpu_gpu_xid_code": "79"}, 1.0


def _noisy(rng: random.Random, t: float) -> dict[str, float]:
    """Healthy values with noise and a daily cycle (what a real week looks like)."""
    day = math.sin(2 * math.pi * t / 86400)
    v = dict(HEALTHY)
    for key in ("step_p95", "ckpt_p95", "req_p99", "ttft_p99", "mem"):
        v[key] *= 1 + 0.04 * rng.gauss(0, 1) + 0.03 * day
    v["data_wait"] += 0.01 * rng.gauss(0, 1)
    v["comm_wait"] += 0.015 * rng.gauss(0, 1)
    v["util"] = min(1.0, v["util"] + 0.02 * rng.gauss(0, 1))
    v["waiting"] = float(max(0, round(3 + 1.5 * rng.gauss(0, 1) + day)))
    v["kv"] = min(0.95, max(0.0, 0.6 + 0.08 * rng.gauss(0, 1)))
    return v


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{val}"' for k, val in sorted(labels.items()))


def openmetrics_history(end: float, duration_s: float, step_s: float = 60.0, seed: int = 7) -> str:
    """A healthy fleet's history from ``end - duration_s`` to ``end`` as OpenMetrics."""
    rng = random.Random(seed)
    start = end - duration_s
    families: dict[str, dict[str, list[str]]] = {}
    t = start
    while t <= end:
        v = _noisy(rng, t)
        for job, instance in (("train", "node-a:9464"), ("serve", "node-b:9464")):
            for name, labels, value in samples(job, t - start, v):
                key = _labels({**labels, "job": job, "instance": instance})
                families.setdefault(name, {}).setdefault(key, []).append(
                    f"{name}{{{key}}} {value:.9g} {t:.0f}"
                )
        t += step_s
    out = []
    for name, series in families.items():
        out.append(f"# TYPE {name} gauge")
        for lines in series.values():
            out.extend(lines)
    out.extend(request_histogram(start, end, step_s))
    out.append("# EOF")
    return "\n".join(out) + "\n"


#: The serve job's request latencies: lognormal, median 0.6 s, p99 ``HEALTHY["req_p99"]``.
REQUEST_MU = math.log(0.6)
REQUEST_SIGMA = math.log(HEALTHY["req_p99"] / 0.6) / 2.3263478740408408  # z of 0.99


def request_histogram(start: float, end: float, step_s: float) -> list[str]:
    """The serve job's request-latency histogram as the pull endpoint exports it (classic
    ``_bucket{le}`` at otelgpu's fixed bounds, ``_count``, ``_sum``), OpenMetrics lines:
    ``req_rate x step_s`` requests per step, spread over the buckets by the lognormal."""
    from otelgpu.otel.histogram_rule import classic_bounds

    family = histogram_name("gen_ai.server.request.duration")
    per_step = HEALTHY["req_rate"] * step_s
    bounds = [*classic_bounds("s"), math.inf]

    def cdf(x: float) -> float:
        z = (math.log(x) - REQUEST_MU) / REQUEST_SIGMA if math.isfinite(x) else math.inf
        return 0.5 * math.erfc(-z / math.sqrt(2))

    increments = [round(per_step * cdf(b)) for b in bounds]
    mean = math.exp(REQUEST_MU + REQUEST_SIGMA**2 / 2)
    key = _labels({"gen_ai_request_model": MODEL, "job": "serve", "instance": "node-b:9464"})
    out = [f"# TYPE {family} histogram"]
    t, k = start, 0
    while t <= end:
        k += 1
        for b, inc in zip(bounds, increments, strict=True):
            le = "+Inf" if math.isinf(b) else repr(b)
            out.append(f'{family}_bucket{{{key},le="{le}"}} {k * inc} {t:.0f}')
        out.append(f"{family}_count{{{key}}} {k * increments[-1]} {t:.0f}")
        out.append(f"{family}_sum{{{key}}} {k * per_step * mean:.9g} {t:.0f}")
        t += step_s
    return out


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m otelgpu ARGS`` (the real command line), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "otelgpu", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def backfill(directory: Path, end: float, duration_s: float) -> Path:
    """A Prometheus data directory holding ``duration_s`` of healthy history up to ``end``."""
    promtool = require_binaries("promtool")["promtool"]
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "history.om"
    source.write_text(openmetrics_history(end, duration_s))
    data = directory / "data"
    result = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return data


def start_store(
    directory: Path,
    config: Mapping[str, object],
    data: Path | None = None,
    extra: tuple[str, ...] = (),
    port: int | None = None,
) -> PrometheusServer:
    """A real Prometheus with ``config`` (dict, written as JSON) and ``data`` (or empty)."""
    binary = require_binaries("prometheus")["prometheus"]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "prometheus.yml"
    path.write_text(json.dumps(config))
    port = port or free_port()
    with open(directory / "prometheus.log", "wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={path}",
                f"--storage.tsdb.path={data or directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
                "--storage.tsdb.retention.time=30d",
                *extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    server = PrometheusServer(process, port, directory)
    if not _wait_ready(server):
        server.stop()
        raise RuntimeError(f"prometheus did not become ready:\n{server.log()}")
    return server


class LiveTarget:
    """An HTTP scrape target: ``/train`` and ``/serve`` in the Prometheus text format.

    ``faulty = True`` switches to the injected faults (counters keep growing without a
    reset, as a real process's would). Thread-safe: one flag read per request.
    """

    def __init__(self) -> None:
        self.faulty = False
        self.t0 = time.monotonic()
        self._throttle = {"train": 0.0, "serve": 0.0}
        self._last = {"train": 0.0, "serve": 0.0}
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                job = self.path.strip("/")
                body = target.render(job).encode() if job in ("train", "serve") else b""
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def render(self, job: str) -> str:
        t = time.monotonic() - self.t0 + 3600.0  # an hour into the run
        v = dict(HEALTHY)
        # The throttle counter integrates the current share (no jump when faults start).
        share = FAULTS["throttle_share"] if self.faulty else HEALTHY["throttle_share"]
        self._throttle[job] += share * (t - (self._last[job] or t))
        self._last[job] = t
        if self.faulty and job == "serve":
            v.update(FAULTS)
        lines = []
        for name, labels, value in samples(job, t, v, xid=self.faulty and job == "serve"):
            if name == n("otelgpu.gpu.throttle.time"):
                value = self._throttle[job]
            lines.append(f"{name}{{{_labels(labels)}}} {value:.9g}")
        return "\n".join(lines) + "\n"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Webhook:
    """Alertmanager's webhook receiver: records every delivered (status, alertname)."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[str, str, dict[str, str]]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                for alert in body["alerts"]:
                    hook.deliveries.append(
                        (alert["status"], alert["labels"]["alertname"], alert["labels"])
                    )
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def firing(self) -> set[str]:
        return {name for status, name, _ in self.deliveries if status == "firing"}

    def settle(
        self, expected: set[str], timeout: float = 45.0
    ) -> tuple[set[str], list[tuple[str, str, dict[str, str]]]]:
        """Wait until ``expected`` have fired (at most ``timeout`` s), then 5 s more so
        that anything else that would fire has had time to; the alert names fired and
        every delivery so far."""
        wait_until(lambda: self.firing() >= expected, timeout)
        time.sleep(5)
        return self.firing(), list(self.deliveries)


def start_alertmanager(directory: Path, webhook: Webhook) -> tuple[subprocess.Popen[bytes], int]:
    binary = require_binaries("prometheus-alertmanager")["prometheus-alertmanager"]
    config = {
        "route": {
            "receiver": "hook",
            "group_by": ["alertname"],
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [
            {
                "name": "hook",
                "webhook_configs": [
                    {"url": f"http://127.0.0.1:{webhook.port}/", "send_resolved": False}
                ],
            }
        ],
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "am.yml").write_text(json.dumps(config))
    port = free_port()
    log = open(directory / "am.log", "wb")  # noqa: SIM115 (kept open for the process)
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={directory / 'am.yml'}",
            f"--storage.path={directory / 'am'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )

    ready = f"http://127.0.0.1:{port}/-/ready"
    assert wait_until(lambda: http_ok(ready), 15), (directory / "am.log").read_text()
    return process, port


def http_ok(url: str) -> bool:
    """Whether ``url`` answers 200 now (a server's readiness or health endpoint)."""
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def alerting_config(
    rules: Path, alertmanager_port: int, scrape_configs: list[dict[str, Any]]
) -> dict[str, Any]:
    """A Prometheus configuration for the end-to-end tests: 1 s scrapes and evaluations
    (``scrape_interval`` overridable per scrape config), ``rules`` evaluated and sent to
    the Alertmanager on ``alertmanager_port``."""
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "alerting": {
            "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]
        },
        "scrape_configs": scrape_configs,
    }
