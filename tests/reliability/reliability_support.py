"""Helpers of the reliability probes: run the host program, misbehaving collectors."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]  # no grpcio stubs in the test extras
from fixtures.otel import PYTHON, python_env
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as mgrpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tpb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tgrpc

HOST = Path(__file__).with_name("host.py")


@dataclass
class HostRun:
    """What one run of ``host.py`` reported, with its exit status, wall time and stderr."""

    result: dict[str, Any]
    returncode: int
    wall_s: float
    stderr: str
    stdout: str

    @property
    def traceback(self) -> bool:
        return "Traceback" in self.stderr

    def __getitem__(self, key: str) -> Any:
        return self.result[key]


def start_host(cfg: dict[str, Any], **env: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [PYTHON, str(HOST), json.dumps(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=python_env(**env),
    )


def finish_host(proc: subprocess.Popen[str], t0: float, timeout: float = 120) -> HostRun:
    killed = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        killed = True
    wall = time.monotonic() - t0
    result: dict[str, Any] = {}
    for line in out.splitlines():
        if line.startswith("HOST-RESULT "):
            result = json.loads(line.removeprefix("HOST-RESULT "))
        elif line.startswith("HOST-SHUTDOWN "):
            result.update(json.loads(line.removeprefix("HOST-SHUTDOWN ")))
    if result and "shutdown_s" not in result:
        # still shutting down when the probe's patience ran out: a lower bound
        result["shutdown_s"] = round(wall - result.get("loop_s", 0.0), 1)
        result["shutdown_killed"] = killed
    return HostRun(result, proc.returncode, wall, err, out)


def run_host(cfg: dict[str, Any], timeout: float = 120, **env: Any) -> HostRun:
    t0 = time.monotonic()
    return finish_host(start_host(cfg, **env), t0, timeout)


def p99_change(run: HostRun, base: HostRun) -> str:
    return f"p99 {base['p99_ms']:.1f} → {run['p99_ms']:.1f} ms (max {run['max_ms']:.0f} ms)"


def p99_ok(run: HostRun, base: HostRun) -> bool:
    """The host was never blocked: its p99 step time stayed within 3x (or +20 ms) of the
    healthy run's, and no step took a second.

    Generous on purpose: machines running CI are shared and a 1 ms step's p99 moves by tens
    of ms with the load; a host blocked by otelgpu shows up as seconds. (The per-step cost
    itself is measured in benchmarks/, not here.)"""
    p99, base_p99 = run["p99_ms"], base["p99_ms"]
    return bool(p99 <= max(3 * base_p99, base_p99 + 20.0) and run["max_ms"] < 1000.0)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Blackhole:
    """A TCP port that accepts connections and never answers (nor closes them)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self.held: list[socket.socket] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        for c in self.held:
            c.close()


@dataclass
class FaultyCollector:
    """OTLP over HTTP and gRPC that answers every export with a chosen fault.

    ``http_status``: e.g. 503 or 429 (with ``retry_after`` seconds) or 200;
    ``grpc_code``: e.g. ``grpc.StatusCode.UNAVAILABLE``, or ``None`` for success;
    ``delay_s``: seconds before each answer (a slow collector).
    """

    http_status: int = 200
    retry_after: int | None = None
    grpc_code: Any = None
    delay_s: float = 0.0
    requests: list[str] = field(default_factory=list)
    http_port: int = 0
    grpc_port: int = 0

    def start(self) -> FaultyCollector:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                collector.requests.append(f"http {self.path}")
                time.sleep(collector.delay_s)
                self.send_response(collector.http_status)
                if collector.retry_after is not None:
                    self.send_header("Retry-After", str(collector.retry_after))
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self.http_port = self._http.server_address[1]
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

        def answer(kind: str, response: Any, context: Any) -> Any:
            collector.requests.append(f"grpc {kind}")
            time.sleep(collector.delay_s)
            if collector.grpc_code is not None:
                if collector.retry_after is not None:
                    context.set_trailing_metadata((("retry-after", str(collector.retry_after)),))
                context.abort(collector.grpc_code, "injected by the reliability probe")
            return response

        class Traces(tgrpc.TraceServiceServicer):  # type: ignore[misc]
            def Export(self, request: Any, context: Any) -> Any:
                return answer("traces", tpb.ExportTraceServiceResponse(), context)

        class Metrics(mgrpc.MetricsServiceServicer):  # type: ignore[misc]
            def Export(self, request: Any, context: Any) -> Any:
                return answer("metrics", mpb.ExportMetricsServiceResponse(), context)

        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        tgrpc.add_TraceServiceServicer_to_server(Traces(), self._grpc)
        mgrpc.add_MetricsServiceServicer_to_server(Metrics(), self._grpc)
        self.grpc_port = self._grpc.add_insecure_port("127.0.0.1:0")
        self._grpc.start()
        return self

    def endpoint(self, protocol: str) -> str:
        port = self.grpc_port if protocol == "grpc" else self.http_port
        return f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._grpc.stop(None)


def otlp_settings(endpoint: str, protocol: str = "grpc", **extra: Any) -> dict[str, Any]:
    """instrument() keywords for a fast-exporting OTLP host."""
    return {
        "exporters": "otlp",
        "otlp_endpoint": endpoint,
        "otlp_protocol": protocol,
        "otlp_insecure": True if protocol == "grpc" else None,
        "metric_export_interval_ms": 500,
        "span_schedule_delay_ms": 200,
        "gpu": False,
        **extra,
    }


def summary(run: HostRun) -> str:
    if not run.result:
        return f"no result (exit {run.returncode})"
    dropped = sum(run.result.get("dropped", {}).values())
    shut = run["shutdown_s"]
    shut_text = f"> {shut:.0f} s (killed)" if run.result.get("shutdown_killed") else f"{shut:.1f} s"
    return f"{run['steps']} steps, shutdown {shut_text}, {dropped} dropped (counted)"
