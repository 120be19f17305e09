"""``otelgpu.runtime.held_steps``: sampled-out steps held for GPU health events published
late -- bounded in time and number, each step claimed or counted exactly once."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from otelgpu.runtime.held_steps import HeldStep, HeldSteps
from otelgpu.runtime.records import StepRecord

MS = 1_000_000


class _Event(NamedTuple):
    time_ns: int
    uuid: str


def _held(n: int, start_ms: int, devices: list[str] | None = None) -> HeldStep:
    record = StepRecord(start_ms * MS, (start_ms + 10) * MS - 1, step=n, devices=devices)
    return HeldStep(record, n, None, None, {}, None)


def _steps(held: list[HeldStep]) -> list[int]:
    return [h.step for h in held]


def test_held_steps_claims_the_steps_whose_window_holds_an_event_of_their_gpus() -> None:
    released: list[int] = []
    held = HeldSteps(horizon_ns=10_000 * MS, on_released=released.append)
    for i in range(10):
        held.hold(_held(i, 10 * i, devices=["GPU-b"] if i == 4 else None))
    assert held.span() == (0, 100 * MS - 1)
    claimed = held.claim(
        [_Event(25 * MS, "GPU-a"), _Event(45 * MS, "GPU-a"), _Event(71 * MS, "GPU-b")]
    )
    assert _steps(claimed) == [2, 7]  # step 4 runs on GPU-b only
    assert held.claim([_Event(25 * MS, "GPU-a")]) == []  # each step is claimed once
    assert len(held) == 8 and released == []
    assert held.release_all() == 8 and released == [8]
    assert held.span() is None and held.claim([_Event(5 * MS, "GPU-a")]) == []


def test_held_steps_are_bounded_in_time_and_number_and_counted_when_they_leave() -> None:
    released: list[int] = []
    held = HeldSteps(horizon_ns=50 * MS, on_released=released.append, limit=8)
    for i in range(5):
        held.hold(_held(i, 10 * i))
    held.hold(_held(5, 100))  # ends at 110 ms: steps that ended before 60 ms leave
    assert len(held) == 1
    for i in range(6, 300):
        held.hold(_held(i, 100))  # same window: only the limit applies
    assert len(held) == 8
    assert 0 < sum(released) <= 300 - 8  # counted as they leave, in batches
    assert all(n >= 64 for n in released)  # one stats call per batch, not per step
    assert held.release_all() == 8
    assert sum(released) == 300  # every step counted exactly once


def test_held_steps_after_fork_forgets_the_parents_steps() -> None:
    released: list[Any] = []
    held = HeldSteps(horizon_ns=10_000 * MS, on_released=released.append)
    held.hold(_held(1, 0))
    held.after_fork_in_child()
    assert len(held) == 0 and held.release_all() == 0 and released == []


def test_held_steps_give_back_what_was_held_packed_or_not() -> None:
    # The usual step is kept packed (bytes), the others as they are; a claim gives back
    # the same step number, counts (ints stay ints), work attributes and parent either way.
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanContext

    held = HeldSteps(horizon_ns=10_000 * MS, on_released=lambda n: None)
    work = {"otelgpu.train.energy.per_sample": 0.25, "otelgpu.train.mfu": 0.5}
    usual = [
        HeldStep(StepRecord(0, 10 * MS - 1, step=1, samples=32), 1, 32, None, work, None),
        HeldStep(StepRecord(10 * MS, 20 * MS - 1), 2, 0.5, 4096, {}, Context()),
        HeldStep(StepRecord(60 * MS, 70 * MS - 1), 7, -0.0, -0.0, {}, None),  # signs kept
    ]
    parent = SpanContext(trace_id=7, span_id=9, is_remote=False)
    unusual = [
        HeldStep(StepRecord(20 * MS, 30 * MS - 1, attributes={"a": 1}), 3, None, None, {}, None),
        HeldStep(StepRecord(30 * MS, 40 * MS - 1), 4, None, None, {}, parent),
        HeldStep(StepRecord(40 * MS, 50 * MS - 1), 5, None, None, {"other": 1.0}, None),
        HeldStep(StepRecord(50 * MS, 60 * MS - 1), 6, 2**60, None, {}, None),  # no double
    ]
    for step in usual + unusual:
        held.hold(step)
    assert held.span() == (0, 70 * MS - 1)
    claimed = held.claim([_Event(t * MS + 5 * MS, "GPU-a") for t in range(0, 70, 10)])
    assert [h.step for h in claimed] == [1, 2, 7, 3, 4, 5, 6]
    assert claimed[3:] == unusual and all(a is b for a, b in zip(claimed[3:], unusual, strict=True))
    first, second, third = claimed[:3]
    assert third.samples is not None and third.tokens is not None
    assert [math.copysign(1.0, x) for x in (third.samples, third.tokens)] == [-1.0, -1.0]
    assert (first.samples, type(first.samples), first.tokens) == (32, int, None)
    assert (second.samples, second.tokens, type(second.tokens)) == (0.5, 4096, int)
    assert first.work == work and second.work == {}
    assert first.parent is None and second.parent is None  # the root, as Context() was
    for got, given in zip(claimed[:3], usual, strict=True):
        assert (got.record.start_ns, got.record.end_ns) == (
            given.record.start_ns,
            given.record.end_ns,
        )
        assert got.record.attributes is None and got.record.devices is None


def test_usual_held_steps_leave_nothing_for_the_garbage_collector() -> None:
    # A loop of thousands of steps a second holds thousands: as objects, every young
    # collection traversed them all (~1 ms of the GIL, in whichever thread allocated).
    import gc

    def tracked_after_holding(attributes: dict[str, int] | None) -> int:
        held = HeldSteps(horizon_ns=10_000 * MS, on_released=lambda n: None)
        gc.collect()
        before = len(gc.get_objects())
        for i in range(2000):
            record = StepRecord(i * MS, (i + 1) * MS - 1, step=i, attributes=attributes)
            held.hold(HeldStep(record, i, 32, None, {"otelgpu.train.mfu": 0.5}, None))
        grown = len(gc.get_objects()) - before
        assert len(held) == 2000
        return grown

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        assert tracked_after_holding(None) < 50
        assert tracked_after_holding({"a": 1}) >= 2000  # unusual steps: kept as objects
    finally:
        if was_enabled:
            gc.enable()
