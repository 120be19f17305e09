"""The host's requests and steps in flight: otelgpu's background work waits for a gap.

Under a host thread that keeps the GIL (a Python loop), a background thread gets the GIL
back one switch interval (5 ms) after it asked, wherever the host is then -- at 500
requests/s with 1 ms between them, inside a request half the time, where each slice of
export or sampling work lengthens that request. The same slice in the host's own time
between two requests (parsing the next one, the loop's bookkeeping) delays no request.

So ``otelgpu.request()`` and ``otelgpu.step()`` (with a runtime) mark their block open
(:func:`opened`, :func:`closed`: one deque append and pop, atomic under the GIL), and a
thread that :func:`mark_background` marked as otelgpu's calls :func:`wait_for_gap` before a
slice (``otelgpu.otel.slicing`` does, after each hand-back and when a piece of work
starts): while a block is open it sleeps, a hand-back's length at a time, for at most
``MAX_GAP_WAIT_S``. Measured (``benchmarks/bench_export.py --only pauses``, pure-Python
twin, 8 simulated GPUs, 500 requests/s of 1 ms with 1 ms of host work between; runs
interleaved with the code before): p99 over the bare loop +739 / +741 -> +517 / +405 µs.

A host with no gaps -- back-to-back steps, an async server that always has a request
open, a block never closed -- would make every wait time out: after ``GIVE_UP_AFTER``
time-outs in a row, waits are off for ``OFF_S``, then tried again; each further streak in a
row doubles that, up to ``MAX_OFF_S`` (a host without gaps: 3 waits of 20 ms every ~minute),
and a wait that ends in a gap starts over. The exporters keep up either way.
A wait also ends when the host thread has not run for ``HOST_STILL_S`` (its CPU clock,
given by ``slicing``): a host blocked -- on I/O, on the GPU, or on a lock the waiting
thread holds -- has nothing to keep clear of, and must not wait for a wait.
Nothing is waited for during ``slicing.draining`` (shutdown) or on a thread not marked.

Thread-safety: any thread may open and close blocks (a count, not an owner: an async
request may close on another thread); the give-up state is shared and updated without a
lock (a lost update only shifts when waits resume). A forked child starts with none open.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import threading
import time
from collections.abc import Callable, Iterator

#: Longest one :func:`wait_for_gap` sleeps for the host's open blocks to close (seconds).
MAX_GAP_WAIT_S = 0.02
#: How long the host's CPU clock must stand still for a wait to end (seconds): longer
#: than a slice of another of otelgpu's threads, which may hold the GIL meanwhile.
HOST_STILL_S = 0.002
#: Time-outs in a row after which waits are off for ``OFF_S``.
GIVE_UP_AFTER = 3
#: How long waits stay off after ``GIVE_UP_AFTER`` time-outs in a row (seconds); doubled
#: for each such streak in a row, up to ``MAX_OFF_S``; a wait that ends in a gap resets it.
OFF_S = 1.0
MAX_OFF_S = 64.0
#: One sleep of a wait: ``SLEEP_S`` plus a random extra of up to ``SLEEP_JITTER_S``, so a
#: waiting thread does not wake in step with a regular host (seconds).
SLEEP_S = 0.0001
SLEEP_JITTER_S = 0.001

# One entry per open block. Bounded: a block never closed (an abandoned generator) is
# forgotten after 4096 newer ones instead of growing this forever.
_open: collections.deque[None] = collections.deque(maxlen=4096)
_local = threading.local()
_timeouts = 0  # waits in a row that timed out
_off_until = 0.0  # time.monotonic() until which waits are off
_off_s = 0.0  # the last off period (0: none since the last gap)
_sleep = time.sleep  # a module attribute: tests count the sleeps
_jitter = random.Random().random  # its own generator: the application's seed stays its own


def opened() -> None:
    """A host block begins (hot path: never raises)."""
    _open.append(None)


def closed() -> None:
    """A host block ends (hot path: never raises)."""
    try:  # noqa: SIM105 - hot path: contextlib.suppress costs a context manager
        _open.pop()
    except IndexError:  # closed after a fork cleared the parent's blocks
        pass


def open_count() -> int:
    """Blocks open now (for tests and diagnostics)."""
    return len(_open)


def mark_background() -> None:
    """Mark the calling thread as one of otelgpu's background threads: its slices wait
    for a gap between the host's blocks. Idempotent."""
    _local.background = True


@contextlib.contextmanager
def background() -> Iterator[None]:
    """Within the block, the calling thread counts as one of otelgpu's background threads
    (:func:`mark_background`); afterwards it is what it was (a scrape served on a thread
    that also runs the host's code)."""
    was = is_background()
    _local.background = True
    try:
        yield
    finally:
        _local.background = was


def is_background() -> bool:
    """Whether :func:`mark_background` marked the calling thread."""
    return getattr(_local, "background", False)


def wait_for_gap(host_cpu_ns: Callable[[], int] | None = None) -> bool:
    """On a marked thread, while any host block is open (and waits are on): sleep until
    none is, at most ``MAX_GAP_WAIT_S``. ``host_cpu_ns``: the host thread's CPU clock --
    when it did not move over a sleep, the host is not running (blocked on a lock this
    thread may hold, on I/O, on the GPU) and the wait ends. Returns whether it slept at
    all. Never raises."""
    global _timeouts, _off_until, _off_s
    if not _open or not getattr(_local, "background", False):
        return False
    now = time.monotonic()
    if now < _off_until:
        return False
    deadline = now + MAX_GAP_WAIT_S
    try:
        ran = host_cpu_ns() if host_cpu_ns is not None else None
        still_since = now  # when the host's CPU clock last moved (or the wait began)
        while _open:
            now = time.monotonic()
            if now >= deadline:
                _timeouts += 1
                if _timeouts >= GIVE_UP_AFTER:
                    _timeouts = 0
                    _off_s = min(max(_off_s * 2, OFF_S), MAX_OFF_S)
                    _off_until = now + _off_s
                return True
            _sleep(SLEEP_S + _jitter() * SLEEP_JITTER_S)
            if host_cpu_ns is not None:
                before, ran = ran, host_cpu_ns()
                if ran != before:
                    still_since = time.monotonic()
                elif time.monotonic() - still_since >= HOST_STILL_S:
                    return True  # the host does not run: nothing of it to keep clear of
    except Exception:  # noqa: BLE001 - an optimisation only: never into the caller
        return True
    _timeouts = 0
    _off_s = 0.0
    return True


def _after_fork_in_child() -> None:
    global _timeouts, _off_until, _off_s
    _open.clear()  # the parent's blocks are not the child's
    _timeouts = 0
    _off_until = _off_s = 0.0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = [
    "GIVE_UP_AFTER",
    "HOST_STILL_S",
    "MAX_GAP_WAIT_S",
    "MAX_OFF_S",
    "OFF_S",
    "closed",
    "is_background",
    "mark_background",
    "open_count",
    "opened",
    "wait_for_gap",
]
