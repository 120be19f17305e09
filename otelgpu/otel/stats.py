"""Internal counters: errors swallowed on hot paths and telemetry dropped on purpose.

Thread-safe (one short lock); never raises. Exported as ``otelgpu.internal.errors``
and ``otelgpu.internal.dropped`` by the runtime.
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

    def reset(self) -> None:
        """Forget everything (a forked child starts from zero)."""
        with self._lock:
            self._errors.clear()
            self._dropped.clear()
