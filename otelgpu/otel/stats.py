"""Internal counters: errors swallowed on hot paths, telemetry dropped on purpose, and
caller values rejected as out of range.

Thread-safe (one short lock); never raises. Exported as ``otelgpu.internal.errors``,
``otelgpu.internal.dropped`` and ``otelgpu.internal.rejected`` by the runtime.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

_logger = logging.getLogger("otelgpu")


class InternalStats:
    """Counts errors per place (``where``) and drops per (signal, reason)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._errors: Counter[str] = Counter()
        self._dropped: Counter[tuple[str, str]] = Counter()
        self._rejected: Counter[tuple[str, str]] = Counter()

    def report_error(self, where: str, exc: BaseException | None = None) -> None:
        """Count an error at ``where``; log it the first time ``where`` fails."""
        try:
            with self._lock:
                self._errors[where] += 1
                first = self._errors[where] == 1
            if first:
                _logger.warning(
                    "otelgpu: error in %s (further errors here are only counted): %r", where, exc
                )
        except Exception:  # noqa: BLE001 - the last line of defence must not raise
            pass

    def add_dropped(self, signal: str, reason: str, count: int = 1) -> None:
        """Count ``count`` items of ``signal`` dropped for ``reason``."""
        if count <= 0:
            return
        with self._lock:
            self._dropped[(signal, reason)] += count

    def add_rejected(self, field: str, reason: str) -> None:
        """Count one value of ``field`` rejected for ``reason``; log the first of each field."""
        try:
            with self._lock:
                self._rejected[(field, reason)] += 1
                first = sum(n for (f, _), n in self._rejected.items() if f == field) == 1
            if first:
                _logger.warning(
                    "otelgpu: rejected a %s value (%s); it is not exported "
                    "(further ones are only counted in otelgpu.internal.rejected)",
                    field,
                    reason,
                )
        except Exception:  # noqa: BLE001 - the last line of defence must not raise
            pass

    def rejected(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._rejected)

    def errors(self) -> dict[str, int]:
        with self._lock:
            return dict(self._errors)

    def dropped(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._dropped)

    def dropped_total(self, signal: str | None = None) -> int:
        with self._lock:
            return sum(n for (s, _), n in self._dropped.items() if signal in (None, s))

    def after_fork_in_child(self) -> None:
        """Start from zero in a forked child, without acquiring the lock (a parent thread
        may have held it at fork time; it would never be released here)."""
        self._lock = threading.Lock()
        self._errors = Counter()
        self._dropped = Counter()
        self._rejected = Counter()

    def reset(self) -> None:
        """Forget everything (a forked child starts from zero)."""
        with self._lock:
            self._errors.clear()
            self._dropped.clear()
            self._rejected.clear()
