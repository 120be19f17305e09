"""Helpers of the real-backend tier (tests/backends/): binaries, a Prometheus server, PromQL.

* :func:`require_binaries` -- the path of each binary, or a test *failure* naming
  ``tests/backends/install.sh`` (CI installs them); a skip only with
  ``OTELGPU_SKIP_BACKENDS=1`` set explicitly.
* :class:`PrometheusServer` -- a real ``prometheus`` process on a free 127.0.0.1 port with
  its data in a scratch directory, started by :func:`start_prometheus` and stopped by its
  own PID (SIGTERM, then SIGKILL after a bounded wait).
* :func:`promql_metric_names` -- the metric names a PromQL expression selects.
* :func:`exposition_names` -- the names otelgpu's metrics get on the Prometheus endpoint,
  produced by the real ``opentelemetry-exporter-prometheus`` from otelgpu's metric tables.

Every wait here is bounded; nothing binds anything but 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "docs" / "alerts" / "otelgpu-rules.yml"
RULES_TEST = ROOT / "docs" / "alerts" / "otelgpu-rules.test.yml"
INSTALL = "tests/backends/install.sh"
SKIP_VARIABLE = "OTELGPU_SKIP_BACKENDS"
#: The flag that makes Prometheus (2.40+) negotiate the protobuf format and ingest native
#: histograms; the sketch metrics then arrive as native histograms only (2.42 keeps one
#: representation per histogram family).
NATIVE_HISTOGRAMS = "--enable-feature=native-histograms"


def require_binaries(*names: str) -> dict[str, str]:
    """Paths of the named binaries; fail (or skip with OTELGPU_SKIP_BACKENDS=1) if missing."""
    found = {name: shutil.which(name) for name in names}
    missing = sorted(name for name, path in found.items() if path is None)
    if not missing:
        return {name: str(path) for name, path in found.items()}
    message = (
        f"backend binaries not found on PATH: {', '.join(missing)}. Install them with "
        f"`sudo {INSTALL}` (Debian 12: apt-get install prometheus), or set "
        f"{SKIP_VARIABLE}=1 to skip the real-backend tests explicitly."
    )
    if os.environ.get(SKIP_VARIABLE, "").strip() == "1":
        pytest.skip(message)
    pytest.fail(message, pytrace=False)


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout`` passes
    (then the last falsy value is returned)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def http_get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


# ----------------------------------------------------------------------------- Prometheus
@dataclass
class PrometheusServer:
    """A running ``prometheus`` process (see :func:`start_prometheus`)."""

    process: subprocess.Popen[bytes]
    port: int
    directory: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        path = self.directory / "prometheus.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>``; returns ``data`` (asserts ``status == success``)."""
        query = "?" + urllib.parse.urlencode(params) if params else ""
        body = http_get_json(f"{self.url}/api/v1/{path}{query}")
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant PromQL query: the ``result`` vector (``metric`` labels, ``value``)."""
        data = self.api("query", query=promql)
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def stop(self) -> None:
        """SIGTERM by PID, bounded wait, then SIGKILL."""
        if self.process.poll() is not None:
            return
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(5)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _wait_ready(server: PrometheusServer, timeout: float = 15.0) -> bool:
    """Wait for ``/-/ready`` (bounded); False at once if the process exited."""
    wait_until(lambda: _ready(server.url) or server.process.poll() is not None, timeout)
    return server.process.poll() is None and _ready(server.url)


def start_prometheus(
    binary: str,
    directory: Path,
    *,
    targets: Iterable[str],
    rule_files: Iterable[Path] = (),
    interval_s: int = 1,
    flags: Iterable[str] = (),
) -> PrometheusServer:
    """Start Prometheus scraping ``targets`` every ``interval_s`` (rules evaluated as often),
    with extra command-line ``flags`` (e.g. ``NATIVE_HISTOGRAMS``).

    Retries on another port if the chosen one was taken in the meantime; fails with the
    server's log if it never becomes ready (15 s per attempt).
    """
    config = {
        "global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": "otelgpu", "static_configs": [{"targets": list(targets)}]},
        ],
    }
    directory.mkdir(parents=True, exist_ok=True)
    config_path = directory / "prometheus.yml"
    config_path.write_text(json.dumps(config))  # JSON is YAML
    log_path = directory / "prometheus.log"
    for _attempt in range(3):
        port = free_port()
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config_path}",
                    f"--storage.tsdb.path={directory / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                    *flags,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        server = PrometheusServer(process, port, directory)
        if _wait_ready(server):
            return server
        server.stop()
        if "address already in use" not in server.log():
            break
    raise RuntimeError(f"prometheus did not become ready:\n{server.log()}")


# ----------------------------------------------------------------------------- PromQL names
_KEYWORDS = frozenset(
    {
        *("and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"),
        *("group_left", "group_right", "inf", "nan"),
    }
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w.:])([A-Za-z_:][\w:]*)(\s*\()?")


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, label names and
    label values excluded). Handles what alerting rules use: strings, ``{...}`` matchers,
    ``[...]`` ranges, grouping clauses, ``offset``, numbers; ``__name__`` matchers are
    reported as ``__name__`` so a caller can refuse them."""
    text = _STRING.sub('""', expr)
    names: set[str] = set()
    if re.search(r"\b__name__\b", text):
        names.add("__name__")
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    for match in _IDENTIFIER.finditer(text):
        word, call = match.group(1), match.group(2)
        if call or word in _KEYWORDS:
            continue
        names.add(word)
    return names


# ----------------------------------------------------------------------------- exposition
def otelgpu_metric_tables() -> list[tuple[str, str, str]]:
    """(OpenTelemetry name, kind, unit) of every metric otelgpu exports.

    Kinds: ``counter``, ``updowncounter``, ``gauge`` (observable or not), ``sketch``
    (exported as an exponential histogram plus a ``<name>.quantile`` gauge), read from
    ``otelgpu.metrics.catalog`` (every metric of otelgpu).
    """
    from otelgpu.metrics import catalog
    from otelgpu.metrics.spec import Kind

    kinds = {
        Kind.SKETCH: "sketch",
        Kind.COUNTER: "counter",
        Kind.OBSERVABLE_COUNTER: "counter",
        Kind.OBSERVABLE_UP_DOWN_COUNTER: "updowncounter",
        Kind.OBSERVABLE_GAUGE: "gauge",
    }
    return [(m.name, kinds[m.kind], m.unit) for m in catalog.ALL]


def exposition_names(tables: Iterable[tuple[str, str, str]]) -> dict[str, str]:
    """Prometheus exposition name -> OpenTelemetry name, as the real Prometheus exporter
    (``PrometheusMetricReader``, the one ``exporters=prometheus`` uses) writes them.

    One observable instrument per table row, with the row's kind and unit, in a private
    MeterProvider; sketches contribute their ``<name>.quantile`` gauge, which is what the
    pull endpoint serves for them (the exponential histogram travels over OTLP).
    """
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import REGISTRY, generate_latest

    def one(_options: CallbackOptions) -> list[Observation]:
        return [Observation(1, {"quantile": "0.5"})]

    reader = PrometheusMetricReader(disable_target_info=True)  # registers in REGISTRY
    provider = MeterProvider(metric_readers=[reader])
    meter = provider.get_meter("otelgpu-names")
    origin: dict[str, str] = {}  # instrument name -> otelgpu metric name
    try:
        for name, kind, unit in tables:
            if kind == "sketch":
                meter.create_observable_gauge(name + ".quantile", [one], unit=unit)
                origin[name + ".quantile"] = name
            elif kind == "counter":
                meter.create_observable_counter(name, [one], unit=unit)
                origin[name] = name
            elif kind == "updowncounter":
                meter.create_observable_up_down_counter(name, [one], unit=unit)
                origin[name] = name
            elif kind == "gauge":
                meter.create_observable_gauge(name, [one], unit=unit)
                origin[name] = name
            else:
                raise AssertionError(f"unknown metric kind {kind!r} of {name}")
        text = generate_latest(REGISTRY).decode()
    finally:
        provider.shutdown()  # unregisters the reader's collector
    # The exporter replaces every character outside [a-zA-Z0-9_:] with '_' and appends
    # unit and type suffixes; map each exposed sample name back by its longest such prefix.
    by_prefix = {re.sub(r"[^a-zA-Z0-9_:]", "_", name): name for name in origin}
    resolved: dict[str, str] = {}
    for sample_name in set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", text, re.MULTILINE)):
        candidates = [p for p in by_prefix if sample_name.startswith(p)]
        if candidates:  # others: the process/GC collectors of prometheus_client
            resolved[sample_name] = origin[by_prefix[max(candidates, key=len)]]
    missing = set(origin.values()) - set(resolved.values())
    assert not missing, f"the Prometheus exporter exposed nothing for {sorted(missing)}"
    return resolved
