"""The hand-off of finished steps to the background thread hands the GIL back.

Half a second of queued steps is milliseconds of Python on the background thread; the
training thread must not wait for all of it in one stretch. The background drain ticks a
:class:`otelgpu.otel.slicing.Slicer` after every step (a pause once the slice is used);
a synchronous ``drain()`` (``flush()``) runs on the caller's thread and never pauses.
"""

from __future__ import annotations

import threading
import time

import pytest

from otelgpu.instrumentation.torch import _step_queue
from otelgpu.otel import slicing


class _EverySliceUsed(slicing.Slicer):
    """A slicer whose slice is always used up: each tick hands the GIL back."""

    def __init__(self) -> None:
        super().__init__(slice_s=0.0)


def _queue(consumed: list[int]) -> _step_queue.StepQueue[int]:
    errors: list[tuple[str, BaseException]] = []
    queue: _step_queue.StepQueue[int] = _step_queue.StepQueue(
        consumed.append,
        before_drain=lambda: None,
        on_error=lambda where, exc: errors.append((where, exc)),
        on_dropped=lambda n: None,
    )
    assert not errors
    return queue


def test_background_drain_hands_the_gil_back_between_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pauses: list[tuple[str, int]] = []
    consumed: list[int] = []
    real_pause = slicing.pause

    def pause() -> None:
        pauses.append((threading.current_thread().name, len(consumed)))
        real_pause()

    monkeypatch.setattr(slicing, "pause", pause)
    monkeypatch.setattr(slicing, "Slicer", _EverySliceUsed)
    monkeypatch.setattr(_step_queue, "WORKER_INTERVAL_S", 0.01)
    queue = _queue(consumed)
    try:
        for step in range(1, 6):
            queue.put(step)  # starts the background thread at the first step
        deadline = time.monotonic() + 10
        while len(consumed) < 5 and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        queue.close()
    assert consumed == [1, 2, 3, 4, 5]
    # a pause after every step, each taken by the background thread after its step
    assert [n for _, n in pauses] == [1, 2, 3, 4, 5]
    assert {name for name, _ in pauses} == {"otelgpu-torch-steps"}


def test_synchronous_drain_does_not_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[str] = []
    consumed: list[int] = []
    monkeypatch.setattr(slicing, "pause", lambda: pauses.append("pause"))
    monkeypatch.setattr(slicing, "Slicer", _EverySliceUsed)
    monkeypatch.setattr(_step_queue, "WORKER_INTERVAL_S", 3600.0)
    queue = _queue(consumed)
    try:
        for step in range(1, 4):
            queue.put(step)
        queue.drain()  # flush(): on this thread, all at once
        assert consumed == [1, 2, 3]
        assert pauses == []
    finally:
        queue.close()


def test_after_drain_runs_once_per_drain_that_consumed_steps() -> None:
    """Per-drain totals (the optimizer-step and micro-batch counters) are published once
    the drain's steps are consumed -- also when one of them failed -- and not by a drain
    that found nothing."""
    seen: list[tuple[int, ...]] = []
    consumed: list[int] = []
    errors: list[str] = []

    def consume(step: int) -> None:
        if step == 2:
            raise RuntimeError("bad step")
        consumed.append(step)

    queue: _step_queue.StepQueue[int] = _step_queue.StepQueue(
        consume,
        before_drain=lambda: None,
        on_error=lambda where, exc: errors.append(where),
        on_dropped=lambda n: None,
        after_drain=lambda: seen.append(tuple(consumed)),
    )
    queue.drain()
    assert seen == []
    for step in (1, 2, 3):
        queue._queue.append(step)  # queued without starting the background thread
    queue.drain()
    queue.drain()
    assert seen == [(1, 3)]
    assert errors == ["torch.step"]


def test_a_forgotten_queue_takes_nothing_and_starts_no_thread() -> None:
    """A forked child's copy (``forget()``): a step still handed to ``put`` -- the tracker
    may hold the queue's ``put`` itself -- is dropped and starts no background thread."""
    consumed: list[int] = []
    queue = _queue(consumed)
    queue.forget()
    before = {t.name for t in threading.enumerate()}
    for step in range(1, 4):
        queue.put(step)
    assert "otelgpu-torch-steps" not in {t.name for t in threading.enumerate()} - before
    queue.drain()
    assert consumed == []
