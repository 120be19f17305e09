"""The anchor rule's memory: which optimizer steps least often among the recent steps.

:class:`AnchorWindow` keeps the ``id()`` of the optimizer of each of the last ``window``
optimizer steps; the anchor (the optimizer whose step ends a training step) is the least
frequently stepping one among them and, on a tie, the one that stepped most recently
(the generator of a GAN, the outer one of nested optimizers). Memory and time per
observation are bounded by the window (O(1) per step, O(distinct optimizers) per query).

Not thread-safe: the step tracker calls it under its own lock.
"""

from __future__ import annotations

from collections import deque

__all__ = ["AnchorWindow"]


class AnchorWindow:
    """The last ``window`` optimizer steps, by optimizer ``id()``."""

    __slots__ = ("_counts", "_last_seen", "_seq", "_window")

    def __init__(self, window: int) -> None:
        self._window: deque[int] = deque(maxlen=window)
        self._counts: dict[int, int] = {}
        self._last_seen: dict[int, int] = {}
        self._seq = 0

    def observe(self, key: int) -> None:
        """One optimizer step of the optimizer ``key`` (the oldest one leaves the window)."""
        window = self._window
        if len(window) == window.maxlen:
            old = window[0]
            c = self._counts[old] - 1
            if c:
                self._counts[old] = c
            else:
                del self._counts[old]
                self._last_seen.pop(old, None)
        window.append(key)
        self._counts[key] = self._counts.get(key, 0) + 1
        self._seq += 1
        self._last_seen[key] = self._seq

    def anchor(self) -> int | None:
        """The least frequently stepping optimizer; the latest to step on a tie."""
        best: int | None = None
        best_rank = (0, 0)
        for key, count in self._counts.items():
            rank = (count, -self._last_seen[key])
            if best is None or rank < best_rank:
                best, best_rank = key, rank
        return best

    def count(self, key: int) -> int:
        """Steps of ``key`` in the window."""
        return self._counts.get(key, 0)

    @property
    def seen(self) -> int:
        """Optimizer steps in the window."""
        return len(self._window)
