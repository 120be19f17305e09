"""Sampled-out steps held a short while: a GPU health event published late still gets its
step span ("health-event steps are always exported").

The sampler stamps an event when it happened (an XID when it is read, an ECC or throttle
change at its sample) but publishes it a little later (the pure twin at the end of its
round, milliseconds later on a busy host). A step that ended in between was decided by
tail-keeping sampling without the event; if it was sampled out, the event would land on no
span. So each sampled-out step is held here, with what its span needs, for about two
sampling intervals; when the sampler's event count changes, the step recorder
:meth:`HeldSteps.claim`\\ s the held steps whose window holds one of the new events and
exports them after all.

Bounded: at most ``limit`` steps, none kept past ``horizon_ns`` after its end. Steps
leaving unclaimed are counted in ``otelgpu.internal.dropped`` (reason ``tail_sampled``) in
batches of up to 64, and all at :meth:`HeldSteps.release_all` (a flush, the shutdown), so
that counter counts exactly the steps never exported.
Thread-safe (one short lock; the claim walks at most ``limit`` steps and runs only when
new events were published).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from otelgpu.runtime.records import StepRecord

__all__ = ["HeldStep", "HeldSteps"]

DEFAULT_LIMIT = 4096
_REPORT_EVERY = 64  # steps leaving unclaimed are reported in batches (one stats call each)


class HeldStep(NamedTuple):
    """A sampled-out step and what its span needs, computed when it was decided: the step
    number, the checked ``samples`` and ``tokens``, the GPU work attributes (whose
    sketches already counted the step) and the span's ``parent`` (a ``Context``; a live
    span's parent ``SpanContext``; ``None``: a root span). A tuple: built on the hot path."""

    record: StepRecord
    step: int
    samples: float | None
    tokens: float | None
    work: Mapping[str, Any]
    parent: Any


class HeldSteps:
    """The held sampled-out steps, oldest first (see the module docstring)."""

    def __init__(
        self, horizon_ns: int, on_released: Callable[[int], None], limit: int = DEFAULT_LIMIT
    ) -> None:
        self.horizon_ns = int(horizon_ns)
        self.limit = max(int(limit), 1)
        self._on_released = on_released
        self._steps: collections.deque[HeldStep] = collections.deque()
        self._lock = threading.Lock()
        self._unreported = 0  # steps that left and are not yet counted (under the lock)

    def __len__(self) -> int:
        return len(self._steps)

    def hold(self, held: HeldStep) -> None:
        """Hold ``held``; steps past the horizon (measured from its end) or the limit
        leave, counted as never exported. Hot path: an append, and a look at the oldest."""
        released = 0
        oldest_end = held.record.end_ns - self.horizon_ns
        with self._lock:
            steps = self._steps
            steps.append(held)
            gone = 0
            while steps and (len(steps) > self.limit or steps[0].record.end_ns < oldest_end):
                steps.popleft()
                gone += 1
            if gone:
                self._unreported += gone
                if self._unreported >= _REPORT_EVERY:
                    released, self._unreported = self._unreported, 0
        if released:
            self._on_released(released)

    def span(self) -> tuple[int, int] | None:
        """``(earliest start, latest end)`` of the held steps (ns); ``None`` when none."""
        with self._lock:
            steps = list(self._steps)
        if not steps:
            return None
        return min(h.record.start_ns for h in steps), max(h.record.end_ns for h in steps)

    def claim(self, events: Sequence[Any]) -> list[HeldStep]:
        """Take out and return the held steps whose window ``[start_ns, end_ns]`` holds one
        of ``events`` (``GpuEvent``-like: ``time_ns``, ``uuid``) of their GPUs (a step's
        ``devices``, or any GPU)."""
        found = [(int(e.time_ns), getattr(e, "uuid", None)) for e in events]
        if not found:
            return []
        first = min(t for t, _ in found)
        last = max(t for t, _ in found)
        with self._lock:
            claimed = [
                h
                for h in self._steps
                if h.record.end_ns >= first
                and h.record.start_ns <= last
                and _holds(h.record, found)
            ]
            if claimed:
                taken = {id(h) for h in claimed}
                self._steps = collections.deque(h for h in self._steps if id(h) not in taken)
        return claimed

    def release_all(self) -> int:
        """Let every held step go; counts them (and those that left but were not counted
        yet) as never exported. Returns how many were held."""
        with self._lock:
            count = len(self._steps)
            released = count + self._unreported
            self._steps.clear()
            self._unreported = 0
        if released:
            self._on_released(released)
        return count

    def after_fork_in_child(self) -> None:
        """Forget the parent's steps; replace the lock (never acquire it inside ``fork()``)."""
        self._lock = threading.Lock()
        self._steps = collections.deque()
        self._unreported = 0


def _holds(record: StepRecord, events: list[tuple[int, Any]]) -> bool:
    devices = record.devices
    return any(
        record.start_ns <= t <= record.end_ns and (devices is None or uuid in devices)
        for t, uuid in events
    )
