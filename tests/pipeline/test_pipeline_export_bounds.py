"""Exporter settings per signal, a bounded shutdown, and Prometheus ports per rank.

* ``OTEL_TRACES_EXPORTER=none`` / ``OTEL_METRICS_EXPORTER=none`` are honoured per signal
  even without an endpoint (the local recording used to take the signal anyway);
* with an unreachable collector -- a closed port, or a port that accepts and never
  answers -- ``shutdown()`` ends within ``shutdown_timeout_ms`` (3 s by default; it used to
  take 23-26 s), counts what was not delivered in ``otelgpu.internal.dropped`` and says so
  in one warning line instead of the SDK's retry warnings and tracebacks;
* several ranks on one node ask for ``prometheus_port + LOCAL_RANK`` and a port in use
  never crashes ``instrument()``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import otelgpu
from otelgpu._settings import resolve
from otelgpu.otel import pull_endpoint

pytestmark = pytest.mark.usefixtures("reset_otel_globals")

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ per-signal "none"
def _lines(directory: Path) -> list[dict[str, object]]:
    out = []
    for path in directory.glob("*.otlp.jsonl*"):
        out += [json.loads(line) for line in path.read_text().splitlines() if line]
    return out


@pytest.mark.parametrize(
    ("env", "spans_expected", "metrics_expected"),
    [
        ({"OTEL_TRACES_EXPORTER": "none"}, False, True),
        ({"OTEL_METRICS_EXPORTER": "none"}, True, False),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_METRICS_EXPORTER": "none"}, True, False),
    ],
)
def test_pipeline_signal_exporter_none_without_endpoint(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    spans_expected: bool,
    metrics_expected: bool,
) -> None:
    for name in providers_endpoint_variables():
        monkeypatch.delenv(name, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    handle = otelgpu.instrument(recording_dir=str(tmp_path), gpu=False)
    with otelgpu.step(samples=4):
        pass
    handle.shutdown()
    lines = _lines(tmp_path)
    assert any("resourceSpans" in line for line in lines) is spans_expected
    assert any("resourceMetrics" in line for line in lines) is metrics_expected


def test_pipeline_both_signals_none_records_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in providers_endpoint_variables():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    handle = otelgpu.instrument(recording_dir=str(tmp_path), gpu=False)
    assert handle.recording_path is None
    with otelgpu.step():
        pass
    handle.shutdown()
    assert list(tmp_path.iterdir()) == []


def test_pipeline_signal_setting_keyword_wins_and_rejects_empty() -> None:
    keyword = resolve({"traces_exporter": "none"}, {"OTEL_TRACES_EXPORTER": "otlp"})
    assert keyword.traces_exporter == "none"
    assert resolve({}, {"OTEL_METRICS_EXPORTER": "otlp,console"}).metrics_exporter == "default"
    assert resolve({}, {"OTEL_METRICS_EXPORTER": "NONE"}).metrics_exporter == "none"


def providers_endpoint_variables() -> tuple[str, ...]:
    from otelgpu._settings import OTLP_ENDPOINT_VARIABLES

    return (*OTLP_ENDPOINT_VARIABLES, "OTELGPU_OTLP_ENDPOINT", "OTELGPU_EXPORTERS")


# ------------------------------------------------------------------ bounded shutdown
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def blackhole() -> Iterator[int]:
    """A port that accepts connections and never answers (nor reads)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conns.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join(2)
        for c in conns:
            c.close()
        server.close()


PROTOCOLS = ("grpc", "http/protobuf")


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("collector", ["closed", "blackhole"])
def test_pipeline_shutdown_bounded_with_unreachable_collector(
    protocol: str,
    collector: str,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = request.getfixturevalue("blackhole") if collector == "blackhole" else _closed_port()
    handle = otelgpu.instrument(
        otlp_endpoint=f"http://127.0.0.1:{port}",
        otlp_protocol=protocol,
        exporters="otlp",
        gpu=False,
        shutdown_timeout_ms=1000,
    )
    runtime = handle.runtime
    assert runtime is not None
    for _ in range(40):
        with otelgpu.step(samples=1):
            pass
    caplog.clear()
    quiet_before = _quiet_filters()
    t0 = time.monotonic()
    handle.shutdown()
    elapsed = time.monotonic() - t0
    assert elapsed < 2.5, elapsed  # the bound (1 s) plus scheduling slack on a busy machine
    dropped = runtime.stats.dropped()
    spans_lost = sum(n for (signal, _), n in dropped.items() if signal == "traces")
    metrics_lost = sum(n for (signal, _), n in dropped.items() if signal == "metrics")
    assert spans_lost == 40  # every span, each counted once
    assert metrics_lost > 0  # the final collection
    ours = [r for r in caplog.records if r.name == "otelgpu" and "not delivered" in r.message]
    assert len(ours) == 1
    assert "40 spans" in ours[0].getMessage()
    sdk = [r for r in caplog.records if r.name.startswith("opentelemetry.exporter")]
    assert sdk == []
    # the exporters it gave up on may still retry: their loggers stay held back
    assert _quiet_filters() == quiet_before + 1


def _quiet_filters() -> int:
    """otelgpu's shutdown filters on the gRPC exporter's logger (one per shutdown that
    gave up, in this process)."""
    grpc_logger = logging.getLogger("opentelemetry.exporter.otlp.proto.grpc.exporter")
    return sum(getattr(f, "name", "") == "otelgpu.quiet" for f in grpc_logger.filters)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_pipeline_process_exit_bounded_by_default(protocol: str, blackhole: int) -> None:
    """A real process exiting (atexit flush) with a collector that never answers:
    the default bound (3 s) holds for the interpreter's exit, one warning, no traceback."""
    script = textwrap.dedent(
        f"""
        import time, otelgpu
        otelgpu.instrument(otlp_endpoint="http://127.0.0.1:{blackhole}",
                           otlp_protocol="{protocol}", exporters="otlp", gpu=False)
        for _ in range(20):
            with otelgpu.step():
                pass
        print("EXITING", time.monotonic(), flush=True)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in providers_endpoint_variables():
        env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    ended = time.monotonic()
    assert proc.returncode == 0, proc.stderr
    exiting = float(proc.stdout.split("EXITING", 1)[1].split()[0])
    assert ended - exiting < 3.0 + 2.0, (ended - exiting, proc.stderr)  # bound + exit slack
    assert "Traceback" not in proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "not delivered" in line]
    assert len(warnings) == 1 and "20 spans" in warnings[0], proc.stderr


def test_pipeline_shutdown_delivers_everything_to_a_live_collector(otlp_receiver: object) -> None:
    endpoint = otlp_receiver.grpc_endpoint  # type: ignore[attr-defined]
    handle = otelgpu.instrument(
        otlp_endpoint=endpoint, otlp_protocol="grpc", exporters="otlp", gpu=False
    )
    runtime = handle.runtime
    assert runtime is not None
    for _ in range(30):
        with otelgpu.step():
            pass
    quiet_before = _quiet_filters()
    handle.shutdown()
    assert runtime.stats.dropped() == {}
    # finished: the exporters' loggers are given back
    assert _quiet_filters() == quiet_before
    spans = otlp_receiver.spans()  # type: ignore[attr-defined]
    assert sum(1 for _, _, s in spans if s.name == "otelgpu.train.step") == 30


# ------------------------------------------------------------------ Prometheus per rank
def test_pipeline_prometheus_port_rule() -> None:
    s = resolve({"prometheus_port": 9464}, {})
    assert pull_endpoint.prometheus_port(s, {"LOCAL_RANK": "3"}) == 9467
    assert pull_endpoint.prometheus_port(s, {}) == 9464
    off = resolve({"prometheus_port": 9464, "prometheus_rank_offset": False}, {})
    assert pull_endpoint.prometheus_port(off, {"LOCAL_RANK": "3"}) == 9464
    free = resolve({"prometheus_port": 0}, {})
    assert pull_endpoint.prometheus_port(free, {"LOCAL_RANK": "3"}) == 0


_RANK_SCRIPT = """
import os, sys, time, otelgpu
h = otelgpu.instrument(exporters="prometheus", prometheus_port=int(sys.argv[1]), gpu=False)
with otelgpu.step(samples=1):
    pass
addr = h.runtime.pipeline.prometheus_address
print("ADDR", addr[1] if addr else None, flush=True)
sys.stdin.readline()
h.shutdown()
"""


def test_pipeline_prometheus_several_ranks_on_one_node() -> None:
    """Four ranks (LOCAL_RANK 0-3) with the same settings: each serves its own port;
    a fifth process whose port is taken still instruments (no pull endpoint, a warning)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        base = int(probe.getsockname()[1])
    if base > 65000:
        base -= 1000
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in providers_endpoint_variables():
        env.pop(name, None)
    procs = []
    for rank in ("0", "1", "2", "3", "1"):
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _RANK_SCRIPT, str(base)],
                env={**env, "LOCAL_RANK": rank, "OTELGPU_PROMETHEUS_HOST": "127.0.0.1"},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
        # The duplicate rank starts last, once rank 1 holds its port.
        line = procs[-1].stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("ADDR"), procs[-1].stderr.read()  # type: ignore[union-attr]
        procs[-1].addr = line.split()[1]  # type: ignore[attr-defined]
    try:
        ports = [p.addr for p in procs]  # type: ignore[attr-defined]
        assert ports[:4] == [str(base + r) for r in range(4)]
        assert ports[4] == "None"
        for port in ports[:4]:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
            assert b"otelgpu_train_steps" in body
    finally:
        outs = []
        for p in procs:
            _out, err = p.communicate("\n", timeout=30)
            outs.append((p.returncode, err))
    assert all(rc == 0 for rc, _ in outs), outs
    assert "port in use" in outs[4][1]
