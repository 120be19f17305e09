"""The record every detector yields, and the rate limiter they share (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Finding", "RateLimiter"]


@dataclass(frozen=True)
class Finding:
    """Something a detector concluded.

    ``kind`` is one of ``names.KINDS``; ``cause`` one of ``names.CAUSES`` or ``""``;
    ``message`` is the one log line; ``attributes`` go on the span event and the log
    record; ``step`` is the step (or request count) it was concluded at.
    """

    kind: str
    message: str
    cause: str = ""
    step: int | None = None
    attributes: dict[str, Any] = field(default_factory=dict)


class RateLimiter:
    """Allows one report per key every ``every`` ticks (steps, requests, windows)."""

    def __init__(self, every: int) -> None:
        self.every = max(1, every)
        self._last: dict[str, int] = {}

    def allow(self, key: str, tick: int) -> bool:
        """True (and remembers ``tick``) when ``key`` was not reported in the last ``every``."""
        last = self._last.get(key)
        if last is not None and tick - last < self.every:
            return False
        self._last[key] = tick
        return True
