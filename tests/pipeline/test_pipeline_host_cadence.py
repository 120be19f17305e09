"""otelgpu's background slices keep clear of the next boundary of steady back-to-back steps.

``otelgpu.step()`` notes each block's start; from a steady period the next start is
predicted, and otelgpu's own threads start no slice that would run into it (nor one right
after a start, while the host is still entering its block). Irregular or short periods,
no open block, an overrun step and the host's own threads are never waited for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import otelgpu
from otelgpu.otel import host_cadence, host_work, slicing
from otelgpu.otel.deferred import DeferredWork
from otelgpu.otel.stats import InternalStats

pytestmark = pytest.mark.usefixtures("reset_otel_globals")

MS = 1_000_000
AFTER_NS = int(host_cadence.AFTER_S * 1e9)
GUARD_NS = int(host_cadence.GUARD_S * 1e9)


@pytest.fixture(autouse=True)
def clean_history() -> Iterator[None]:
    host_cadence._starts.clear()
    host_work._open.clear()
    yield
    host_cadence._starts.clear()
    host_work._open.clear()


def _steady(last_ns: int, period_ns: int = 20 * MS) -> list[int]:
    """A full history of starts ``period_ns`` apart, the latest at ``last_ns``."""
    n = host_cadence.HISTORY
    return [last_ns - (n - 1 - i) * period_ns for i in range(n)]


def _history(starts: list[int], *, open_block: bool = True) -> None:
    host_cadence._starts.extend(starts)
    if open_block:
        host_work.opened()


def _on_background(work: Callable[[], object]) -> None:
    """Run ``work`` on a thread marked as otelgpu's, and wait for it."""
    errors: list[BaseException] = []

    def run() -> None:
        host_work.mark_background()
        try:
            work()
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    if errors:
        raise errors[0]


# ----------------------------------------------------------------------- the period


def test_pipeline_cadence_period_is_the_median_interval_of_a_full_history() -> None:
    starts = _steady(1_000 * MS, 20 * MS)
    assert host_cadence.period_ns(starts) == 20 * MS
    # too few starts to call it steady
    assert host_cadence.period_ns(starts[1:]) == 0


def test_pipeline_cadence_tolerates_one_outlier_on_each_side() -> None:
    starts = _steady(1_000 * MS, 20 * MS)
    starts[3] += 7 * MS  # one interval 27 ms, the next 13 ms
    assert host_cadence.period_ns(starts) == 20 * MS


def test_pipeline_cadence_irregular_or_short_periods_have_none() -> None:
    irregular = [0, 20, 31, 55, 60, 90, 97, 120, 150]
    assert host_cadence.period_ns([t * MS for t in irregular]) == 0
    short = int(host_cadence.MIN_PERIOD_S * 1e9) - MS
    assert host_cadence.period_ns(_steady(1_000 * MS, short)) == 0
    assert host_cadence.period_ns(_steady(1_000 * MS, short + MS)) == short + MS


# ---------------------------------------------------------------------- the windows


def test_pipeline_cadence_waits_through_the_hosts_entry() -> None:
    last = 1_000 * MS
    _history(_steady(last))
    wait = host_cadence.wait_s(last + AFTER_NS // 5, 0.0003)
    assert wait == pytest.approx((AFTER_NS - AFTER_NS // 5) / 1e9)


def test_pipeline_cadence_waits_past_the_predicted_boundary() -> None:
    last = 1_000 * MS
    _history(_steady(last))
    following = last + 20 * MS
    # a 0.3 ms slice starting 0.5 ms before the boundary would still run at it
    now = following - MS // 2
    assert host_cadence.wait_s(now, 0.0003) == pytest.approx((following + AFTER_NS - now) / 1e9)
    # a longer piece of work is kept clear from further off
    now = following - 3 * MS
    assert host_cadence.wait_s(now, 0.003) == pytest.approx((following + AFTER_NS - now) / 1e9)
    assert host_cadence.wait_s(now, 0.0003) == 0.0


def test_pipeline_cadence_goes_on_mid_step_between_blocks_and_after_an_overrun() -> None:
    last = 1_000 * MS
    _history(_steady(last))
    assert host_cadence.wait_s(last + 10 * MS, 0.0003) == 0.0  # mid-step
    assert host_cadence.wait_s(last + 21 * MS, 0.0003) == 0.0  # the step overran
    host_work.closed()  # between blocks: the host's own time
    assert host_cadence.wait_s(last + AFTER_NS // 5, 0.0003) == 0.0
    assert host_cadence.wait_s(last + 20 * MS - GUARD_NS, 0.0003) == 0.0


def test_pipeline_cadence_waits_only_on_otelgpus_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(host_cadence, "_sleep", slept.append)
    _history(_steady(time.time_ns()))  # the host has just entered a step
    assert host_cadence.keep_clear(0.0003) == 0.0  # the host's own thread
    assert slept == []
    got: list[float] = []

    def entered_then_check() -> None:
        host_cadence._starts.extend(_steady(time.time_ns()))
        got.append(host_cadence.keep_clear(0.0003))

    _on_background(entered_then_check)
    assert 0.0 < got[0] <= host_cadence.AFTER_S
    assert slept == got  # once, as long as it said


# ------------------------------------------------------------------ the host's side


def test_pipeline_steps_record_their_start_times(tmp_path: Path) -> None:
    handle = otelgpu.instrument(
        exporters="recording", recording_dir=str(tmp_path), gpu=False, frameworks="none"
    )
    try:
        starts = []
        for _ in range(3):
            with otelgpu.step() as s:
                starts.append(s._start_ns)
            time.sleep(0.002)
        assert list(host_cadence._starts)[-3:] == starts
    finally:
        handle.shutdown()


# --------------------------------------------------------- otelgpu's threads use it


def _boundary_soon(lead_ns: int, period_ns: int = 20 * MS) -> int:
    """A steady history (``period_ns`` apart) whose next start is ``lead_ns`` from now, a
    block open; returns the time the host's entry into that step is predicted to end
    (``AFTER_S`` past it). Called on the thread that then checks (a thread's start may take
    longer than the lead)."""
    following = time.time_ns() + lead_ns
    host_cadence._starts.extend(_steady(following - period_ns, period_ns))
    return following + AFTER_NS


def _until_conclusive(attempt: Callable[[], tuple[int, int]], tries: int = 5) -> tuple[int, int]:
    """Runs ``attempt`` (returning when the work ran and when the boundary was kept clear
    until) until it is conclusive: the work ran either before the predicted start (it did
    not wait: the assertion fails) or once the boundary was clear. A thread that the machine
    stalled past the predicted start itself finds the step overran, and rightly does not
    wait; that attempt shows nothing either way and is tried again."""
    ran, clear = attempt()
    for _ in range(tries - 1):
        if ran < clear - AFTER_NS or ran >= clear:
            break
        host_cadence._starts.clear()
        ran, clear = attempt()
    return ran, clear


@pytest.fixture
def open_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step open, as between back-to-back steps: waits for a gap are off (host_work)."""
    monkeypatch.setattr(host_work, "_off_until", time.monotonic() + 60)
    host_work.opened()


@pytest.mark.usefixtures("open_block")
def test_pipeline_deferred_work_starts_no_item_into_the_boundary() -> None:
    work = DeferredWork(InternalStats(), where="test")

    def attempt() -> tuple[int, int]:
        ran: list[int] = []
        clear: list[int] = []
        work._queue.append((lambda: ran.append(time.time_ns()), ()))

        def run() -> None:
            clear.append(_boundary_soon(MS // 4))
            work._run(yielding=True)

        _on_background(run)
        return ran[0], clear[0]

    ran, clear = _until_conclusive(attempt)
    assert ran >= clear


@pytest.mark.usefixtures("open_block")
def test_pipeline_deferred_work_keeps_clear_between_items(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from otelgpu.otel import deferred

    monkeypatch.setattr(deferred, "SLICE_S", 1.0)  # no hand-back: only the boundary decides
    work = DeferredWork(InternalStats(), where="test")

    def attempt() -> tuple[int, int]:
        ran: list[int] = []
        clear: list[int] = []
        # the host's next step is 0.4 ms off when the first item ends: the second, expected
        # to take as long as the first, would end within the guard before it
        work._queue.append((lambda: clear.append(_boundary_soon(4 * MS // 10)), ()))
        work._queue.append((lambda: ran.append(time.time_ns()), ()))
        _on_background(lambda: work._run(yielding=True))
        return ran[0], clear[0]

    ran, clear = _until_conclusive(attempt)
    assert ran >= clear


@pytest.mark.usefixtures("open_block")
def test_pipeline_a_slicers_work_starts_clear_of_the_boundary() -> None:
    def attempt() -> tuple[int, int]:
        started: list[int] = []
        clear: list[int] = []

        def work() -> None:
            clear.append(_boundary_soon(MS // 4))
            slicing.Slicer()
            started.append(time.time_ns())

        _on_background(work)
        return started[0], clear[0]

    started, clear = _until_conclusive(attempt)
    assert started >= clear


@pytest.mark.usefixtures("open_block")
def test_pipeline_a_flush_never_waits_for_the_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(host_cadence, "_sleep", slept.append)

    def check() -> None:
        host_cadence._starts.clear()
        _boundary_soon(MS // 4)
        slicing.starting()

    with slicing.draining():
        _on_background(check)
    assert slept == []
    for _ in range(5):  # the same, not draining (again if the machine stalled past the lead)
        _on_background(check)
        if slept:
            break
    assert len(slept) == 1 and slept[0] > 0.0


# ------------------------------------------------------------- a slice under way


def test_pipeline_cadence_cut_point_is_just_before_the_predicted_start() -> None:
    last = 1_000 * MS
    cut_ns = int(host_cadence.CUT_S * 1e9)
    _history(_steady(last))
    following = last + 20 * MS
    assert host_cadence.clear_for_s(following - 3 * MS) == pytest.approx((3 * MS - cut_ns) / 1e9)
    assert host_cadence.clear_for_s(following - cut_ns // 2) == 0.0
    assert host_cadence.clear_for_s(following + MS) == float("inf")  # overran
    host_work.closed()
    assert host_cadence.clear_for_s(following - 3 * MS) == float("inf")  # between blocks


@pytest.mark.usefixtures("open_block")
def test_pipeline_a_preempted_slice_stops_before_the_boundary() -> None:
    """A slice whose thread lost the CPU has used little of its CPU budget; it goes on
    after the wall slice ends -- but never past the host's next step boundary."""
    pauses: list[int] = []

    def work() -> None:
        # the next start 100 ms off: a 0.3 ms slice may start (it would end well before)
        _boundary_soon(100 * MS, 200 * MS)
        slicer = slicing.Slicer()
        time.sleep(0.0004)  # off the CPU: the wall slice is over, its CPU budget is not
        slicer.tick()
        pauses.append(slicer.pauses)
        time.sleep(0.12)  # still off the CPU, now past the cut point
        slicer.tick()
        pauses.append(slicer.pauses)

    _on_background(work)
    assert pauses == [0, 1]


@pytest.mark.usefixtures("open_block")
def test_pipeline_a_threads_slice_stops_before_the_boundary(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same for the thread-local slice of :func:`slicing.tick` (metric callbacks)."""
    paused: list[bool] = []
    # the hand-back's own sleeps (up to ~3 ms) would take this past the boundary
    monkeypatch.setattr(slicing, "_hand_over", lambda: None)

    def work() -> None:
        _boundary_soon(100 * MS, 200 * MS)
        slicing.pause()  # a fresh slice, the boundary 100 ms off
        monkeypatch.setattr(slicing, "pause", lambda: paused.append(True))
        time.sleep(0.0004)
        slicing.tick()
        assert not paused
        time.sleep(0.12)
        slicing.tick()

    _on_background(work)
    assert paused == [True]
