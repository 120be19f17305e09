"""Splits one training step into phases that sum to its wall time (pure; no torch).

Inputs are what the torch hooks measured: the step window, the host totals the step
tracker keeps (data wait, communication wait, checkpoint, optimizer) and the intervals of
the outermost forward and backward calls and of every collective. Rules:

* forward/backward = their intervals inside the step, minus collectives running inside
  them (FSDP all-gathers, explicit all-reduces in hooks): communication is reported once,
  as ``comm``;
* ``other`` = the rest (Python between phases, ``zero_grad``, logging, sleeps);
* when phases overlap in ways not subtracted above (a data fetch inside forward, a
  collective inside the optimizer), the overlap is taken from forward, then backward,
  then the optimizer, so the sum still equals the step time exactly.

Times are integer nanoseconds on one clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["Interval", "clip", "overlap", "split_step", "total"]

Interval = tuple[int, int]


def clip(intervals: Iterable[Interval], start_ns: int, end_ns: int) -> list[Interval]:
    """The parts of ``intervals`` inside ``[start_ns, end_ns]`` (empty ones dropped)."""
    out = []
    for a, b in intervals:
        a, b = max(a, start_ns), min(b, end_ns)
        if b > a:
            out.append((a, b))
    return out


def total(intervals: Iterable[Interval]) -> int:
    """Summed length of (assumed disjoint) intervals."""
    return sum(b - a for a, b in intervals)


def overlap(xs: Sequence[Interval], ys: Sequence[Interval]) -> int:
    """Total length of the pairwise intersections of two interval lists."""
    got = 0
    for a, b in xs:
        for c, d in ys:
            lo, hi = max(a, c), min(b, d)
            if hi > lo:
                got += hi - lo
    return got


def _clipped_total(intervals: Iterable[Interval], start_ns: int, end_ns: int) -> int:
    """``total(clip(intervals, start_ns, end_ns))`` without the intermediate list."""
    got = 0
    for a, b in intervals:
        a = max(a, start_ns)
        b = min(b, end_ns)
        if b > a:
            got += b - a
    return got


def split_step(
    start_ns: int,
    end_ns: int,
    *,
    data_ns: int = 0,
    comm_ns: int = 0,
    checkpoint_ns: int = 0,
    optimizer_ns: int = 0,
    forward: Sequence[Interval] = (),
    backward: Sequence[Interval] = (),
    comm: Sequence[Interval] = (),
) -> dict[str, int]:
    """Phase durations (ns) of one step, keyed as ``names.PHASES``; they sum to the step.

    Runs once per step on the telemetry thread: the common case (no collective inside the
    step) builds no intermediate lists.
    """
    duration = max(0, end_ns - start_ns)
    if comm:
        fwd = clip(forward, start_ns, end_ns)
        bwd = clip(backward, start_ns, end_ns)
        coll = clip(comm, start_ns, end_ns)
        f = total(fwd) - overlap(fwd, coll)
        b = total(bwd) - overlap(bwd, coll)
    else:
        f = _clipped_total(forward, start_ns, end_ns) if forward else 0
        b = _clipped_total(backward, start_ns, end_ns) if backward else 0
    phases = {
        "data": max(0, data_ns),
        "forward": max(0, f),
        "backward": max(0, b),
        "optimizer": max(0, optimizer_ns),
        "comm": max(0, comm_ns),
        "checkpoint": max(0, checkpoint_ns),
    }
    rest = duration - sum(phases.values())
    if rest < 0:
        deficit = -rest
        for name in ("forward", "backward", "optimizer", "data", "checkpoint", "comm"):
            take = min(deficit, phases[name])
            phases[name] -= take
            deficit -= take
            if not deficit:
                break
        rest = 0
    phases["other"] = rest
    return phases
