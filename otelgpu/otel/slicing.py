"""Background work in short slices: hand the GIL back to the host's threads regularly.

A Python thread keeps the GIL until it blocks or, when another thread asks for it, until
the interpreter's switch interval (5 ms) runs out -- and a C call never gives it up. So
otelgpu's background threads (export, collection, deferred work) cut long work into
slices and, after every ``SLICE_S`` of it, sleep ``YIELD_S``: a real sleep, long enough
for a waiting application thread to wake up and take the GIL (``time.sleep(0)`` returns
before a woken thread is scheduled, and the sleeper usually takes the GIL straight back).

Thread safety: a :class:`Slicer` belongs to one thread (one piece of work); :func:`tick`
keeps its slice per thread.
"""

from __future__ import annotations

import threading
import time

#: Longest stretch of background work between two GIL hand-backs (seconds).
SLICE_S = 0.0003
#: How long a background thread sleeps to hand the GIL back (seconds).
YIELD_S = 0.0001


def pause() -> None:
    """Hand the GIL over: a waiting thread runs before the caller goes on."""
    time.sleep(YIELD_S)


_local = threading.local()


def tick() -> None:
    """:meth:`Slicer.tick` for the calling thread's current work (thread-local slice):
    for code that runs in many small calls, such as metric callbacks."""
    clock = time.perf_counter
    if clock() > getattr(_local, "end", 0.0):
        pause()
        _local.end = clock() + SLICE_S


class Slicer:
    """Calls :func:`pause` from :meth:`tick` once ``slice_s`` passed since the last pause."""

    __slots__ = ("_clock", "_end", "_slice_s", "pauses")

    def __init__(self, slice_s: float = SLICE_S) -> None:
        self._clock = time.perf_counter
        self._slice_s = slice_s
        self._end = self._clock() + slice_s
        #: How many times :meth:`tick` paused.
        self.pauses = 0

    def tick(self) -> None:
        """Pause if this slice is used up (cheap otherwise: one clock read)."""
        if self._clock() > self._end:
            pause()
            self.pauses += 1
            self._end = self._clock() + self._slice_s
