"""GPU health events: each logged once (``otelgpu.health`` logger) and counted.

Published as ``otelgpu.gpu.health.events{otelgpu.gpu.event, hw.id}``. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from otelgpu.otel import gpu_context
from otelgpu.runtime.gpu import GpuContext, ReportError

_health_logger = logging.getLogger("otelgpu.health")

_SEEN_LIMIT = 10_000  # events remembered for de-duplication (bounded memory)
_OVERLAP_NS = 60_000_000_000  # events may be reported up to a minute after their timestamp


class HealthMonitor:
    """Polls the sampler's events; logs and counts each new one exactly once."""

    def __init__(self, gpu: GpuContext, report_error: ReportError) -> None:
        self._gpu = gpu
        self._report_error = report_error
        self._lock = threading.Lock()
        self._seen: dict[tuple[Any, ...], None] = {}
        self._counts: dict[tuple[str, str], int] = {}
        self._cursor_ns = time.time_ns()

    def poll(self) -> list[Any]:
        """New GPU health events since the last poll: logged once each and counted."""
        if self._gpu.sampler is None:
            return []
        now = time.time_ns()
        events = self._gpu.events(self._cursor_ns - _OVERLAP_NS, now)
        fresh = []
        with self._lock:
            for event in events:
                key = (
                    gpu_context.event_kind(event),
                    getattr(event, "uuid", None),
                    gpu_context.event_time_ns(event),
                    getattr(event, "code", None),
                )
                if key in self._seen:
                    continue
                self._seen[key] = None
                if len(self._seen) > _SEEN_LIMIT:
                    self._seen.pop(next(iter(self._seen)))
                kind_key = (key[0], str(key[1] or ""))
                self._counts[kind_key] = self._counts.get(kind_key, 0) + 1
                fresh.append(event)
            self._cursor_ns = now
        for event in fresh:
            attrs = gpu_context.event_attributes(event)
            _health_logger.warning(
                "otelgpu: GPU health event %s on %s: %s",
                attrs["otelgpu.gpu.event"],
                attrs.get("hw.id", "?"),
                attrs.get("otelgpu.gpu.event.detail", attrs.get("otelgpu.gpu.event.code", "")),
                extra={"otelgpu_event": attrs},
            )
        return fresh

    def counts(self) -> dict[tuple[str, str], int]:
        """(kind, uuid) -> health events seen so far."""
        self.poll()
        with self._lock:
            return dict(self._counts)

    def observe(self, _options: CallbackOptions) -> Iterable[Observation]:
        """Callback of ``otelgpu.gpu.health.events``."""
        try:
            counts = self.counts()
        except Exception as exc:  # noqa: BLE001
            self._report_error("gpu health", exc)
            return []
        return [
            Observation(
                n,
                {"otelgpu.gpu.event": kind, "hw.id": uuid} if uuid else {"otelgpu.gpu.event": kind},
            )
            for (kind, uuid), n in counts.items()
        ]

    def after_fork_in_child(self) -> None:
        """Replace the lock (never acquire it inside ``fork()``)."""
        self._lock = threading.Lock()
