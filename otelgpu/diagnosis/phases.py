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

__all__ = ["Interval", "clip", "overlap", "phases_of", "split_step", "total"]

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
    if comm:
        fwd = clip(forward, start_ns, end_ns)
        bwd = clip(backward, start_ns, end_ns)
        coll = clip(comm, start_ns, end_ns)
        f = total(fwd) - overlap(fwd, coll)
        b = total(bwd) - overlap(bwd, coll)
    else:
        f = _clipped_total(forward, start_ns, end_ns) if forward else 0
        b = _clipped_total(backward, start_ns, end_ns) if backward else 0
    return phases_of(end_ns - start_ns, data_ns, f, b, optimizer_ns, comm_ns, checkpoint_ns)


def phases_of(
    duration_ns: int,
    data_ns: int,
    forward_ns: int,
    backward_ns: int,
    optimizer_ns: int,
    comm_ns: int,
    checkpoint_ns: int,
) -> dict[str, int]:
    """The phase dict of :func:`split_step` from its measured parts (ns, positional).

    Negative parts count as 0; ``other`` is the rest of ``duration_ns``, and when the parts
    add up to more than the step, the excess is taken from forward, then backward, the
    optimizer, data, checkpoint and comm, so the phases always sum to the step. The hot
    path (parts fit in the step) is one comparison per part and one dict.
    """
    # conditional expressions, not max(): this runs every step, and a builtin call per
    # part costs more than the comparison itself
    duration = duration_ns if duration_ns > 0 else 0
    data = data_ns if data_ns > 0 else 0
    forward = forward_ns if forward_ns > 0 else 0
    backward = backward_ns if backward_ns > 0 else 0
    optimizer = optimizer_ns if optimizer_ns > 0 else 0
    comm = comm_ns if comm_ns > 0 else 0
    checkpoint = checkpoint_ns if checkpoint_ns > 0 else 0
    rest = duration - (data + forward + backward + optimizer + comm + checkpoint)
    phases = {
        "data": data,
        "forward": forward,
        "backward": backward,
        "optimizer": optimizer,
        "comm": comm,
        "checkpoint": checkpoint,
        "other": rest if rest > 0 else 0,
    }
    if rest < 0:
        deficit = -rest
        for name in ("forward", "backward", "optimizer", "data", "checkpoint", "comm"):
            take = min(deficit, phases[name])
            phases[name] -= take
            deficit -= take
            if not deficit:
                break
    return phases
