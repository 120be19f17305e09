"""The pure-Python sampler's round hands the GIL back to the application's threads.

An NVML call releases the GIL only for microseconds: the sampling thread takes it back
before a waiting application thread wakes, so without explicit hand-backs a whole round
would be one pause of the host's loop. The round driven by the loop hands it back
between devices once its slice is used, always right before it publishes its samples
(publishing and the first pre-warmed summary stay one stretch, so a short request never
sees new samples without their summary), and once more before the pre-warm's second
summary. ``sample_once`` runs on the caller's
own thread and never sleeps. (The native core samples without the GIL.)
"""

from __future__ import annotations

import threading
import time

import pytest
from fixtures.sim import sim_gpu  # noqa: F401 - fixture

from otelgpu import sim
from otelgpu.otel import slicing
from otelgpu.sampler import PyGpuSampler
from otelgpu.sampler._core_py import PyCore


class _EverySliceUsed(slicing.Slicer):
    """A slicer whose slice is always used up: each tick hands the GIL back."""

    def __init__(self) -> None:
        super().__init__(slice_s=0.0)


def _heads(sampler: PyGpuSampler) -> list[int]:
    return [d.head for d in sampler._core._dev]  # type: ignore[attr-defined]


def test_loop_round_hands_the_gil_back_before_publishing(
    sim_gpu: sim.SimGpu,  # noqa: F811 - fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    heads_at_pause: list[list[int]] = []
    real_pause = slicing.pause
    sampler = PyGpuSampler(interval_s=0.05, history_s=60)
    try:
        sampler.sample_once()  # opens NVML; runs on this thread: no hand-back
        before = _heads(sampler)

        def pause() -> None:
            heads_at_pause.append(_heads(sampler))
            real_pause()

        monkeypatch.setattr(slicing, "pause", pause)
        sampler.sample_once()
        assert heads_at_pause == []  # the caller's own thread keeps the GIL
        assert _heads(sampler) == [h + 1 for h in before]

        published = _heads(sampler)
        core = sampler._core
        assert isinstance(core, PyCore)
        core._tick(0, True)  # one round of the loop
        # one hand-back right before publishing, with nothing of the round published yet
        assert heads_at_pause == [published]
        after = [h + 1 for h in published]
        assert _heads(sampler) == after
        core._summary_memo.clear()
        core._prewarm(sliced=True)  # the loop's pre-warm: one more, between its summaries
        assert heads_at_pause == [published, after]
        assert len(core._summary_memo) >= 2  # both summaries remembered
        heads_at_pause.clear()
        core._prewarm()  # unsliced: no hand-back
        assert heads_at_pause == []
    finally:
        sampler.close()


def test_loop_round_hands_the_gil_back_between_devices(
    sim_gpu: sim.SimGpu,  # noqa: F811 - fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With every slice used up, each device's sample is followed by a hand-back; the
    round's samples are published only after the last one, all together."""
    heads_at_pause: list[list[int]] = []
    real_pause = slicing.pause
    sampler = PyGpuSampler(interval_s=0.05, history_s=60)
    try:
        sampler.sample_once()
        published = _heads(sampler)
        ndev = len(published)
        assert ndev >= 2

        def pause() -> None:
            heads_at_pause.append(_heads(sampler))
            real_pause()

        monkeypatch.setattr(slicing, "pause", pause)
        monkeypatch.setattr(slicing, "Slicer", _EverySliceUsed)
        sampler._core._tick(0, True)  # type: ignore[attr-defined]
        assert heads_at_pause == [published] * (ndev + 1)  # after each device, then once more
        assert _heads(sampler) == [h + 1 for h in published]
    finally:
        sampler.close()


def test_running_loop_publishes_rounds_that_handed_the_gil_back(
    sim_gpu: sim.SimGpu,  # noqa: F811 - fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sampling thread itself takes the hand-backs, and its rounds still land."""
    threads: list[str] = []
    real_pause = slicing.pause

    def pause() -> None:
        threads.append(threading.current_thread().name)
        real_pause()

    monkeypatch.setattr(slicing, "pause", pause)
    sampler = PyGpuSampler(interval_s=0.02, history_s=60)
    try:
        sampler.start()
        deadline = time.monotonic() + 10
        while min(_heads(sampler)) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sampler.stop(timeout_s=5.0)
        rounds = min(_heads(sampler))
        assert rounds >= 3
        assert len(threads) >= rounds  # at least one hand-back per published round
        assert all(name == threads[0] and name != "MainThread" for name in threads)
    finally:
        sampler.close()
