"""Inference-side diagnosis: TTFT and request-duration drift (p50/p99) against the
service's own early baseline.

:func:`attach` (called by ``otelgpu.instrument()``) registers :class:`ServingDiagnosis` as
an observer of the runtime's successful requests; a significant shift becomes a span
event ``otelgpu.diagnosis.latency_drift`` on the request that closed the window, the
counter and one log line (``emit.Emitter``). Detectors: :class:`~.drift.LatencyDrift`.
Thread-safe (requests finish on any thread); per request: two sketch adds under a lock.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from opentelemetry.trace import Span

from otelgpu.diagnosis.drift import LatencyDrift
from otelgpu.diagnosis.emit import Emitter
from otelgpu.diagnosis.settings import resolve

__all__ = ["ServingDiagnosis", "attach"]


class ServingDiagnosis:
    """Latency drift of one runtime's requests (see the module docstring)."""

    def __init__(self, runtime: Any, *, window: int = 1000, baseline: str | None = None) -> None:
        from otelgpu.baseline.drift import file_baseline

        self.emitter = Emitter(runtime)
        # With a baseline file (OTELGPU_BASELINE) its recorded distributions stand in for
        # the service's early requests.
        self.ttft = LatencyDrift(
            "TTFT", window=window, baseline=file_baseline(baseline, "inference_ttft_p99")
        )
        self.duration = LatencyDrift(
            "request duration",
            window=window,
            baseline=file_baseline(baseline, "inference_request_p99"),
        )
        self._lock = threading.Lock()

    def observe(self, span: Span, duration_s: float, ttft_s: float | None) -> None:
        """One successful request (the runtime calls it before the span ends)."""
        with self._lock:
            found = [self.duration.add(duration_s)]
            if ttft_s is not None:
                found.append(self.ttft.add(ttft_s))
        for finding in found:
            if finding is None:
                continue
            name, t_ns, attrs = self.emitter.finding(finding, time.time_ns())
            if span.is_recording():
                span.add_event(name, attrs, timestamp=t_ns)  # type: ignore[arg-type]


def attach(runtime: Any) -> ServingDiagnosis | None:
    """Observes ``runtime``'s requests unless ``OTELGPU_DIAGNOSIS`` is off.

    Raises:
        ConfigurationError: ``OTELGPU_DIAGNOSIS`` (or another diagnosis variable) is invalid.
    """
    settings = resolve({})
    if not settings.enabled:
        return None
    requests = getattr(runtime, "requests", None)
    observers = getattr(requests, "observers", None)
    if observers is None:
        return None
    diagnosis = ServingDiagnosis(runtime, baseline=settings.baseline)
    observers.append(diagnosis.observe)
    return diagnosis
