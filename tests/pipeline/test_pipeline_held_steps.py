"""``otelgpu.runtime.held_steps``: sampled-out steps held for GPU health events published
late -- bounded in time and number, each step claimed or counted exactly once."""

from __future__ import annotations

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
