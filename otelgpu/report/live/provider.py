"""The runtime side of the live view: a snapshot server on an owner-only Unix socket.

``instrument()`` calls :func:`start` when the ``live`` setting is on. It starts one daemon
thread that accepts connections on ``<live dir>/<pid>.sock`` and answers each with one
snapshot (:func:`snapshot`), built from what the runtime already has: the step/request
sketches (cumulative counts and quantiles), a bounded ring of the latest finished step
and request spans (a span processor appends a reference; ~1 µs per span, nothing else on
the hot path), and the sampler's window over the last two seconds per GPU plus its
health events. Building a snapshot happens on the server thread, only when a client asks.

Never raises into the application: a failure to start is logged once and the process
runs on without a live view. The socket is removed when the runtime closes or the
process exits; forked children (DataLoader workers) do not serve.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import SpanProcessor

from otelgpu.report.live import protocol

_logger = logging.getLogger("otelgpu.live")

RING_SIZE = 4096
RECENT_S = 10.0
GPU_WINDOW_S = 2.0
MAX_EVENTS = 30
STEP_SPAN = "otelgpu.train.step"


class SpanRing(SpanProcessor):
    """A span processor keeping the newest finished step and request spans (bounded)."""

    def __init__(self, size: int = RING_SIZE) -> None:
        self.steps: deque[Any] = deque(maxlen=size)
        self.requests: deque[Any] = deque(maxlen=size)

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        return None

    def on_end(self, span: Any) -> None:
        try:
            if span.name == STEP_SPAN:
                self.steps.append(span)
            elif span.attributes and "gen_ai.operation.name" in span.attributes:
                self.requests.append(span)
        except Exception:  # noqa: BLE001 - never disturb span end
            return

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def _quantile(sorted_values: Sequence[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * (len(sorted_values) - 1) + 0.5))]


def _num(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _recent(spans: Sequence[Any], since_ns: int) -> list[Any]:
    return [s for s in spans if (s.end_time or 0) >= since_ns]


def _percentiles(sketch: Any, *percents: int) -> dict[str, float] | None:
    """``{"p50": …, "p99": …}`` of a merged sketch, or ``None`` when it is empty."""
    if not sketch.count:
        return None
    values = sketch.quantiles([p / 100 for p in percents])
    return {f"p{p}": v for p, v in zip(percents, values, strict=True)}


def _numbers(attrs: Sequence[Mapping[str, Any]], name: str) -> list[float]:
    """The numeric values of attribute ``name`` in the spans that have one."""
    return [v for a in attrs if (v := _num(a.get(name))) is not None]


def _elapsed(spans: Sequence[Any], now_ns: int) -> float:
    """Seconds from the first span's start to ``now_ns`` (never 0: a rate's divisor)."""
    first: int = min(s.start_time for s in spans)
    return max((now_ns - first) / 1e9, 1e-9)


def _train(runtime: Any, ring: SpanRing, now_ns: int) -> dict[str, Any] | None:
    from otelgpu.report.analysis import phase_shares
    from otelgpu.report.model import Record

    sketch = runtime.step_duration.merged()
    if not sketch.count and not ring.steps:
        return None
    out: dict[str, Any] = {"steps": int(sketch.count)}
    if (step_time := _percentiles(sketch, 50, 95, 99)) is not None:
        out["step_time_s"] = step_time
    spans = _recent(list(ring.steps), now_ns - int(RECENT_S * 1e9))
    if spans:
        durations = sorted((s.end_time - s.start_time) / 1e9 for s in spans)
        elapsed = _elapsed(spans, now_ns)
        attrs = [dict(s.attributes or {}) for s in spans]
        samples = sum(_num(a.get("otelgpu.train.samples")) or 0.0 for a in attrs)
        tokens = sum(_num(a.get("otelgpu.train.tokens")) or 0.0 for a in attrs)
        recent: dict[str, Any] = {
            "window_s": RECENT_S,
            "steps": len(spans),
            "steps_per_s": len(spans) / elapsed,
            "p50_s": _quantile(durations, 0.5),
            "p99_s": _quantile(durations, 0.99),
            "last_s": (spans[-1].end_time - spans[-1].start_time) / 1e9,
        }
        if samples:
            recent["samples_per_s"] = samples / elapsed
        if tokens:
            recent["tokens_per_s"] = tokens / elapsed
        records = [
            Record(0.0, (s.end_time - s.start_time) / 1e9, a)
            for s, a in zip(spans, attrs, strict=True)
        ]
        phases = phase_shares(records)
        if phases:
            recent["phases"] = {p: share for p, _s, share in phases}
        means = (("mfu", "otelgpu.train.mfu"), ("tensor_activity", "otelgpu.gpu.tensor.activity"))
        for key, name in means:
            values = _numbers(attrs, name)
            if values:
                recent[key] = sum(values) / len(values)
        out["recent"] = recent
    return out


def _inference(runtime: Any, ring: SpanRing, now_ns: int) -> dict[str, Any] | None:
    sketch = runtime.request_duration.merged()
    if not sketch.count and not ring.requests:
        return None
    out: dict[str, Any] = {"requests": int(sketch.count)}
    if (latency := _percentiles(sketch, 50, 99)) is not None:
        out["latency_s"] = latency
    if (ttft := _percentiles(runtime.ttft.merged(), 50, 99)) is not None:
        out["ttft_s"] = ttft
    spans = _recent(list(ring.requests), now_ns - int(RECENT_S * 1e9))
    if spans:
        attrs = [dict(s.attributes or {}) for s in spans]
        elapsed = _elapsed(spans, now_ns)
        lat = sorted((s.end_time - s.start_time) / 1e9 for s in spans)
        ttfts = sorted(_numbers(attrs, "otelgpu.request.time_to_first_token"))
        queue = sorted(_numbers(attrs, "otelgpu.request.queue_time"))
        errors = sum(1 for a in attrs if a.get("otelgpu.request.outcome", "ok") != "ok")
        tokens = sum(_num(a.get("gen_ai.usage.output_tokens")) or 0.0 for a in attrs)
        out["recent"] = {
            "window_s": RECENT_S,
            "requests": len(spans),
            "requests_per_s": len(spans) / elapsed,
            "p50_s": _quantile(lat, 0.5),
            "p99_s": _quantile(lat, 0.99),
            "ttft_p50_s": _quantile(ttfts, 0.5),
            "ttft_p99_s": _quantile(ttfts, 0.99),
            "queue_p50_s": _quantile(queue, 0.5),
            "error_rate": errors / len(spans),
            "output_tokens_per_s": tokens / elapsed,
            # requests still queued or running are not known to a span ring; the queue
            # time of the finished ones is what the view shows.
        }
    return out


def _gpus(runtime: Any, now_ns: int) -> list[dict[str, Any]]:
    sampler = runtime.sampler
    if sampler is None:
        return []
    windows = sampler.windows(now_ns - int(GPU_WINDOW_S * 1e9), now_ns)
    out = []
    for n, device in enumerate(getattr(sampler, "devices", ())):
        w = windows.get(device.uuid)
        gpu: dict[str, Any] = {"index": n, "uuid": device.uuid, "name": device.name}
        if w is not None:
            util = _num(w.gpu_util_mean_pct)
            gpu.update(
                {
                    "utilization": None if util is None else util / 100,
                    "memory_used_bytes": w.memory_used_peak_bytes,
                    "memory_total_bytes": w.memory_total_bytes or device.memory_total_bytes,
                    "power_w": _num(w.power_mean_w),
                    "temperature_c": w.temperature_max_c,
                    "sm_clock_mhz": _num(w.sm_clock_mean_mhz),
                    "throttle_reasons": list(w.throttle_reason_names or ()),
                    "lost": bool(w.lost),
                }
            )
            tensor = _num(getattr(w, "tensor_activity_pct", None))  # GPM, where supported
            if tensor is not None:
                gpu["tensor_activity"] = tensor / 100
        out.append(gpu)
    return out


def _events(runtime: Any, started_ns: int, now_ns: int) -> list[dict[str, Any]]:
    from otelgpu.otel import gpu_context

    events = runtime.gpu_events(started_ns, now_ns)[-MAX_EVENTS:]
    out = []
    for e in events:
        attrs = gpu_context.event_attributes(e)
        out.append(
            {
                "time_unix_nano": gpu_context.event_time_ns(e),
                "kind": attrs["otelgpu.gpu.event"],
                "uuid": attrs.get("hw.id", ""),
                "detail": str(
                    attrs.get("otelgpu.gpu.event.detail", attrs.get("otelgpu.gpu.event.code", ""))
                ),
            }
        )
    return out


def snapshot(runtime: Any, ring: SpanRing, started_ns: int) -> dict[str, Any]:
    """The ``otelgpu.live/1`` document of ``runtime`` now (see :mod:`.protocol`)."""
    now = time.time_ns()
    settings = runtime.settings
    doc: dict[str, Any] = {
        "protocol": protocol.PROTOCOL,
        "pid": os.getpid(),
        "service": settings.service_name or "",
        "time_unix_nano": now,
        "started_unix_nano": started_ns,
    }
    for key, build in (
        ("train", lambda: _train(runtime, ring, now)),
        ("inference", lambda: _inference(runtime, ring, now)),
        ("gpus", lambda: _gpus(runtime, now)),
        ("events", lambda: _events(runtime, started_ns, now)),
    ):
        doc[key] = _part(runtime, key, build)
    finite: dict[str, Any] = _finite(doc)
    return finite


def _part(runtime: Any, key: str, build: Any) -> Any:
    try:
        return build()
    except Exception as exc:  # noqa: BLE001 - a part missing beats no snapshot
        runtime.report_error(f"live {key}", exc)
        return None


def _finite(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _finite(v) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return [_finite(v) for v in node]
    if isinstance(node, float) and not math.isfinite(node):
        return None
    return node


class LiveServer:
    """Serves snapshots of one runtime on ``path`` until the runtime closes (a daemon thread)."""

    def __init__(self, runtime: Any, directory: Path) -> None:
        self.runtime = runtime
        self.ring = SpanRing()
        self.path = protocol.socket_path(directory)
        self.started_ns = time.time_ns()
        self._pid = os.getpid()
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a stale socket of a dead process with our pid
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # the socket file is born 0600
        try:
            sock.bind(os.fspath(self.path))
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        sock.listen(8)
        sock.settimeout(0.25)
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="otelgpu-live", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        sock = self._sock
        assert sock is not None
        while not self._stop.is_set() and not self.runtime.closed:
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            with conn:
                try:
                    if not _same_user(conn):
                        continue
                    conn.settimeout(2.0)
                    conn.sendall(
                        protocol.encode(snapshot(self.runtime, self.ring, self.started_ns))
                    )
                except Exception as exc:  # noqa: BLE001 - a client hanging up is normal
                    if not isinstance(exc, OSError):
                        self.runtime.report_error("live snapshot", exc)
        self.stop()

    def stop(self) -> None:
        """Close and remove the socket (idempotent; only in the process that bound it)."""
        self._stop.set()
        if os.getpid() != self._pid:
            return
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
            with contextlib.suppress(OSError):
                self.path.unlink()


def _same_user(conn: socket.socket) -> bool:
    """True when the peer runs as our uid (SO_PEERCRED; True where unsupported)."""
    peercred = getattr(socket, "SO_PEERCRED", None)
    if peercred is None:
        return True
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, peercred, struct.calcsize("3i"))
    except OSError:
        return False
    _pid, uid, _gid = struct.unpack("3i", creds)
    return bool(uid == os.getuid())


def start(runtime: Any) -> LiveServer | None:
    """Start the live server of ``runtime`` (``live`` setting on). Never raises."""
    try:
        directory = protocol.ensure_private_dir(runtime.settings.live_dir or protocol.default_dir())
        server = LiveServer(runtime, directory)
        provider = getattr(runtime.pipeline, "tracer_provider", None)
        add = getattr(provider, "add_span_processor", None)
        if add is not None:
            add(server.ring)
        server.start()
    except Exception as exc:  # noqa: BLE001 - the application runs on without a live view
        _logger.warning("otelgpu: live view not available: %s", exc)
        return None
    atexit.register(server.stop)
    _logger.debug("otelgpu: live snapshots on %s", server.path)
    return server
