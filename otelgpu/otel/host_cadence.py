"""The host's step rhythm: otelgpu's background slices keep clear of the next step boundary.

A training loop's steps are back to back and regular (a step every 20 ms at 50 steps/s).
Inside a step a background slice rarely costs the host anything -- the host is waiting for
the GPU, or, in the pause benchmark, spinning to a deadline it reaches all the same -- but
one that holds the GIL when the step ends (the host's ``loss.item()`` returning, its
``step()`` exit and the next entry) lengthens that step by what is left of the slice.
``otelgpu.otel.host_work`` cannot help there: between back-to-back steps there is no gap
to wait for, so its waits time out and switch off.

So ``otelgpu.step()`` and ``otelgpu.request()`` note each block's start (:func:`began`: a
deque append, no Python frame), and before a slice otelgpu's own threads ask
:func:`wait_s` how long to stay off the GIL: when the last starts came at a steady period
(``MIN_PERIOD_S`` or more, the middle intervals within ``TOLERANCE`` of their median) and
a block is open, a slice expected to take ``expected_s`` that would still run at the
predicted next start (within ``GUARD_S``), or that would start within ``AFTER_S`` of the
latest one (the host's entry is still running), waits until ``AFTER_S`` past that start.
:func:`keep_clear` sleeps that long, once per call (a thread always gets on with its work
after one wait: progress never depends on the prediction). A slice already under way stops
``CUT_S`` before the predicted start however little of its CPU budget it used
(:func:`cut_in_s`: ``otelgpu.otel.slicing`` ends its slices there), since one the OS
preempted can take several times its budget in wall time. A host whose blocks overlap or
come irregularly (a server's requests) has no steady period and is never waited for; a
step that overran its prediction is not waited for either.

All times are ``time.time_ns()`` (the clock the step's start is read with). Thread-safety:
the host's threads append, otelgpu's read a copy (both atomic under the GIL); a forked
child starts with no history.
"""

from __future__ import annotations

import collections
import itertools
import os
import time

from otelgpu.otel import host_work

#: Shortest steady period the boundary is kept clear for (seconds). A background thread
#: that waited gets the GIL back one switch interval (5 ms) after asking, under a host that
#: keeps it: with shorter periods that lands on the next boundary.
MIN_PERIOD_S = 0.01
#: How far the middle block-to-block intervals may stray from their median (fraction).
TOLERANCE = 0.1
#: Margin before the predicted next start that a slice must end by (seconds): the period's
#: jitter, and a slice running over its CPU budget on a loaded machine.
GUARD_S = 0.0005
#: How long after a block's start the host is still entering it (seconds): a ``step()``
#: entry is 20-80 µs, over 0.2 ms when the machine is slow.
AFTER_S = 0.0005
#: How long before the predicted next start a slice under way stops, however little of
#: its CPU budget it used (seconds): a slice preempted by the OS can take several times its
#: budget in wall time.
CUT_S = 0.0002
#: Block starts remembered (intervals between them are one fewer).
HISTORY = 9

_MIN_PERIOD_NS = int(MIN_PERIOD_S * 1e9)
_GUARD_NS = int(GUARD_S * 1e9)
_AFTER_NS = int(AFTER_S * 1e9)
_CUT_NS = int(CUT_S * 1e9)
_INF = float("inf")

_starts: collections.deque[int] = collections.deque(maxlen=HISTORY)

began = _starts.append
"""A host block began at ``time.time_ns()`` value ``start_ns`` (hot path: the deque's own
bound method, no Python frame; never raises)."""

_sleep = time.sleep  # a module attribute: tests count the sleeps


def period_ns(starts: list[int]) -> int:
    """The steady period of ``starts`` (ns), or 0 when there is none: too few starts, a
    period under ``MIN_PERIOD_S``, or the middle intervals spread over ``TOLERANCE``."""
    if len(starts) < HISTORY:
        return 0
    intervals = sorted(b - a for a, b in itertools.pairwise(starts))
    median = intervals[len(intervals) // 2]
    if median < _MIN_PERIOD_NS:
        return 0
    # One outlier on each side (a stalled step, a short first one) is allowed.
    spread = TOLERANCE * median
    if median - intervals[1] > spread or intervals[-2] - median > spread:
        return 0
    return median


#: (latest start, its history's period): the period is recomputed once per new start.
_cached: tuple[int, int] = (0, 0)


def _steady() -> tuple[int, int]:
    """(latest start, steady period) of the history now; period 0 when there is none."""
    global _cached
    starts = list(_starts)
    if not starts:
        return 0, 0
    last = starts[-1]
    cached = _cached
    if cached[0] == last:
        return cached
    _cached = cached = (last, period_ns(starts))
    return cached


def wait_s(now_ns: int, expected_s: float) -> float:
    """How long a slice of ``expected_s`` seconds starting at ``now_ns`` should wait to
    keep clear of the host's step boundary (0.0: go on now). Pure: reads the history."""
    if not host_work.open_count():
        return 0.0  # between blocks: the host's own time, where slices belong
    last, period = _steady()
    if not period:
        return 0.0
    if now_ns - last < _AFTER_NS:
        return (last + _AFTER_NS - now_ns) / 1e9
    following = last + period
    if now_ns > following:
        return 0.0  # the step overran its prediction: no telling when it ends
    if now_ns + int(expected_s * 1e9) + _GUARD_NS < following:
        return 0.0
    return (following + _AFTER_NS - now_ns) / 1e9


def clear_for_s(now_ns: int) -> float:
    """How long a slice under way at ``now_ns`` may go on before it must stop to keep clear
    of the host's next step boundary (``CUT_S`` before it): ``inf`` where there is none to
    keep clear of (no steady period, no block open, the step overran), 0.0 at or past that
    point. Pure: reads the history."""
    if not host_work.open_count():
        return _INF
    last, period = _steady()
    if not period:
        return _INF
    following = last + period
    if now_ns > following:
        return _INF  # the step overran its prediction: no telling when it ends
    return max(0.0, (following - _CUT_NS - now_ns) / 1e9)


def cut_in_s() -> float:
    """On otelgpu's own threads: seconds from now until a slice under way must stop to keep
    clear of the next step boundary (:func:`clear_for_s`); ``inf`` elsewhere, or where
    there is none. Never raises."""
    if not _starts or not host_work.is_background():
        return _INF
    try:
        return clear_for_s(time.time_ns())
    except Exception:  # noqa: BLE001 - an optimisation only: never into the caller
        return _INF


def keep_clear(expected_s: float) -> float:
    """On otelgpu's own threads: sleep as :func:`wait_s` says, at most once. Returns the
    seconds slept. Never raises."""
    if not _starts or not host_work.is_background():
        return 0.0
    try:
        delay = wait_s(time.time_ns(), expected_s)
        if delay > 0.0:
            _sleep(delay)
        return delay
    except Exception:  # noqa: BLE001 - an optimisation only: never into the caller
        return 0.0


def _after_fork_in_child() -> None:
    global _cached
    _starts.clear()  # the parent's rhythm is not the child's
    _cached = (0, 0)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = [
    "AFTER_S",
    "CUT_S",
    "GUARD_S",
    "HISTORY",
    "MIN_PERIOD_S",
    "TOLERANCE",
    "began",
    "clear_for_s",
    "cut_in_s",
    "keep_clear",
    "period_ns",
    "wait_s",
]
