"""GPU health events: each counted, and logged once (``otelgpu.health`` logger).

Published as ``otelgpu.gpu.health.events{otelgpu.gpu.event, hw.id}``. Thread-safe.
A storm (an XID or ECC burst: hundreds of events a second on one GPU) is counted exactly but
logged at most ``_LOG_BURST`` lines per kind and GPU per minute, then one line saying how many
were not logged: the host's log must stay readable, and logging must not become the cost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from otelgpu.otel import gpu_context
from otelgpu.otel.deferred import DeferredWork
from otelgpu.runtime.gpu import GpuContext, ReportError

_health_logger = logging.getLogger("otelgpu.health")

_SEEN_LIMIT = 10_000  # events remembered for de-duplication (bounded memory)
_OVERLAP_NS = 60_000_000_000  # events may be reported up to a minute after their timestamp
_LOG_BURST = 5  # log lines per (kind, GPU) per window; the rest are only counted
_LOG_WINDOW_NS = 60_000_000_000
_REQUEUE_S = 1.0  # a poll queued by a span and not run after this is queued again


class _LogBudget:
    """Per (kind, GPU): how many lines the current window has used, and how many it held back."""

    __slots__ = ("held", "start_ns", "used")

    def __init__(self, now_ns: int) -> None:
        self.start_ns = now_ns
        self.used = 0
        self.held = 0


class HealthMonitor:
    """Polls the sampler's events; logs and counts each new one exactly once."""

    def __init__(self, gpu: GpuContext, report_error: ReportError) -> None:
        self._gpu = gpu
        self._report_error = report_error
        self._lock = threading.Lock()
        self._seen: dict[tuple[Any, ...], None] = {}
        self._counts: dict[tuple[str, str], int] = {}
        self._cursor_ns = time.time_ns()
        self._budgets: dict[tuple[str, str], _LogBudget] = {}
        #: When a poll was queued by :meth:`poll_soon` and has not run yet (monotonic s).
        self._queued_at: float | None = None

    def poll_soon(self, work: DeferredWork) -> None:
        """Have ``work``'s thread :meth:`poll` soon (hot path: a clock read; at most one
        poll queued at a time). Spans call it when their window holds events: those are
        logged within the deferred thread's interval, not at the next metric collection
        (which a long export interval, or a host that holds the GIL, can put seconds away).
        A queued poll that has not run after ``_REQUEUE_S`` (dropped from a full queue) is
        queued again."""
        now = time.monotonic()
        queued = self._queued_at
        if queued is not None and now - queued < _REQUEUE_S:
            return
        self._queued_at = now
        work.submit(self._queued_poll)

    def _queued_poll(self) -> None:
        self._queued_at = None
        self.poll()

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
            to_log, held = self._spend_budget(fresh, now)
        for (kind, uuid), n in held:
            if n == 0:  # the burst just ran out
                _health_logger.warning(
                    "otelgpu: GPU health events %s on %s keep coming; for the rest of the "
                    "minute they are counted in otelgpu.gpu.health.events, not logged",
                    kind,
                    uuid or "?",
                )
            else:
                _health_logger.warning(
                    "otelgpu: %d more GPU health event(s) %s on %s in the last minute were "
                    "not logged (all are counted in otelgpu.gpu.health.events)",
                    n,
                    kind,
                    uuid or "?",
                )
        for event in to_log:
            attrs = gpu_context.event_attributes(event)
            _health_logger.warning(
                "otelgpu: GPU health event %s on %s: %s",
                attrs["otelgpu.gpu.event"],
                attrs.get("hw.id", "?"),
                attrs.get("otelgpu.gpu.event.detail", attrs.get("otelgpu.gpu.event.code", "")),
                extra={"otelgpu_event": attrs},
            )
        return fresh

    def _spend_budget(
        self, fresh: list[Any], now_ns: int
    ) -> tuple[list[Any], list[tuple[tuple[str, str], int]]]:
        """Split ``fresh`` into the events to log and notices: ``(key, 0)`` when a (kind,
        GPU)'s burst runs out, ``(key, n)`` when its window ends with ``n`` events held back.
        Called under the lock."""
        held: list[tuple[tuple[str, str], int]] = []
        for key, ended in list(self._budgets.items()):
            if now_ns - ended.start_ns >= _LOG_WINDOW_NS:
                if ended.held:
                    held.append((key, ended.held))
                del self._budgets[key]  # bounded: only keys with events in the last minute
        to_log = []
        for event in fresh:
            key = (gpu_context.event_kind(event), str(getattr(event, "uuid", None) or ""))
            budget = self._budgets.get(key)
            if budget is None:
                budget = self._budgets[key] = _LogBudget(now_ns)
            if budget.used < _LOG_BURST:
                budget.used += 1
                to_log.append(event)
            else:
                if not budget.held:
                    held.append((key, 0))
                budget.held += 1
        return to_log, held

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
        """Replace the lock (never acquire it inside ``fork()``); the child's deferred
        queue starts empty, so no poll is queued."""
        self._lock = threading.Lock()
        self._queued_at = None
