"""otelgpu's background slices wait for a gap between the host's requests and steps.

``otelgpu.request()`` and ``otelgpu.step()`` mark their block open; a thread otelgpu marked
as its own waits, before a slice, until no block is open (bounded, and off for a while
when the host never leaves one open); the host's own threads never wait.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fixtures.sim import sim_gpu  # noqa: F401 - fixture

import otelgpu
from otelgpu import sim
from otelgpu.otel import host_work, slicing
from otelgpu.runtime.deferral import Finisher

pytestmark = pytest.mark.usefixtures("reset_otel_globals")


@pytest.fixture
def no_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    # A host thread that a loaded machine leaves without a CPU for a while must not end
    # the waits these tests are about (the blocked-host test sets its own).
    monkeypatch.setattr(host_work, "HOST_STILL_S", 5.0)
    host_work._open.clear()
    host_work._off_until = host_work._off_s = 0.0
    host_work._timeouts = 0


def _spin(seconds: float) -> None:
    """The host computing in Python (it keeps the GIL but for the switch interval)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _spin_until_done(thread: threading.Thread, limit_s: float = 10.0) -> None:
    end = time.monotonic() + limit_s
    while thread.is_alive() and time.monotonic() < end:
        pass


def _stamped(work: Callable[[], object], out: list[float]) -> Callable[[], None]:
    """``work``, then the time it returned appended to ``out``."""

    def run() -> None:
        work()
        out.append(time.monotonic())

    return run


def _background(target: Callable[[], object]) -> threading.Thread:
    def run() -> None:
        host_work.mark_background()
        target()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.usefixtures("no_blocks")
@pytest.mark.parametrize("kind", ["request", "step"])
def test_pipeline_blocks_are_open_for_the_body_and_the_finish(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    handle = otelgpu.instrument(
        exporters="recording", recording_dir=str(tmp_path), gpu=False, frameworks="none"
    )
    runtime = handle.runtime
    assert runtime is not None
    seen_in_finish: list[int] = []
    recorder = runtime.requests if kind == "request" else runtime.steps
    real_finish = recorder.finish

    def finish(*args: Any, **kwargs: Any) -> Any:
        seen_in_finish.append(host_work.open_count())
        return real_finish(*args, **kwargs)

    # Inline finishes (blocks under 2 ms are, unless the machine stalls one): a deferred
    # one runs on the deferred thread, outside the block (test_pipeline_deferral.py).
    name = "request_finisher" if kind == "request" else "step_finisher"
    monkeypatch.setattr(runtime, name, Finisher(None, finish))
    scope = otelgpu.request(model="m") if kind == "request" else otelgpu.step(samples=1)
    try:
        assert host_work.open_count() == 0
        with scope:
            assert host_work.open_count() == 1
            with otelgpu.request(model="inner"):  # nested or concurrent: counted
                assert host_work.open_count() == 2
            assert host_work.open_count() == 1
        assert host_work.open_count() == 0
        assert seen_in_finish[-1] == 1  # the finish is the host's time too
        with pytest.raises(ValueError, match="boom"), scope.__class__():
            raise ValueError("boom")  # the application's error still closes the block
        assert host_work.open_count() == 0
    finally:
        handle.shutdown()


@pytest.mark.usefixtures("no_blocks")
def test_pipeline_without_instrument_nothing_is_marked_open() -> None:
    with otelgpu.request(model="m"), otelgpu.step():
        assert host_work.open_count() == 0


@pytest.mark.usefixtures("no_blocks")
@pytest.mark.parametrize(
    "work",
    [slicing.pause, slicing.Slicer],
    ids=["a hand-back", "a piece of work's start"],
)
def test_pipeline_background_slices_wait_for_the_host_block_to_end(
    monkeypatch: pytest.MonkeyPatch, work: Callable[[], object]
) -> None:
    monkeypatch.setattr(host_work, "MAX_GAP_WAIT_S", 5.0)  # generous: CI may be slow
    returned: list[float] = []
    host_work.opened()
    worker = _background(_stamped(work, returned))
    _spin(0.15)  # the host's block: the worker must still be waiting
    assert returned == []
    closed_at = time.monotonic()
    host_work.closed()
    worker.join(5)
    assert returned and returned[0] >= closed_at


@pytest.mark.usefixtures("no_blocks")
def test_pipeline_a_blocked_host_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host that does not run (sleeping, on I/O, or waiting for a lock the background
    thread holds while it pauses) has nothing to keep clear of: the wait ends."""
    monkeypatch.setattr(host_work, "MAX_GAP_WAIT_S", 5.0)
    monkeypatch.setattr(host_work, "HOST_STILL_S", 0.002)
    held = threading.Lock()
    returned: list[float] = []

    def export_under_a_lock() -> None:
        with held:
            slicing.pause()
            returned.append(time.monotonic())

    host_work.opened()
    try:
        began = time.monotonic()
        worker = _background(export_under_a_lock)
        time.sleep(0.01)
        with held:  # the host's block needs the lock the paused worker holds
            pass
        worker.join(5)
        assert returned and returned[0] - began < 1.0  # not MAX_GAP_WAIT_S
    finally:
        host_work.closed()


@pytest.mark.usefixtures("no_blocks")
def test_pipeline_host_threads_and_draining_never_wait_for_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(host_work, "MAX_GAP_WAIT_S", 5.0)
    host_work.opened()
    try:
        began = time.monotonic()
        slicing.pause()  # the main thread: the host itself
        slicing.Slicer()
        unmarked = threading.Thread(target=slicing.pause)  # a host worker thread
        unmarked.start()
        unmarked.join(5)
        assert time.monotonic() - began < 1.0

        returned: list[float] = []
        with slicing.draining():  # shutdown: the host waits for the final flush
            began = time.monotonic()
            _background(_stamped(slicing.pause, returned)).join(5)
        assert returned and returned[0] - began < 1.0
    finally:
        host_work.closed()


@pytest.mark.usefixtures("no_blocks")
def test_pipeline_waits_turn_off_when_the_host_never_leaves_a_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(host_work, "MAX_GAP_WAIT_S", 0.01)
    monkeypatch.setattr(host_work, "OFF_S", 0.3)

    def waits(n: int) -> list[tuple[bool, float]]:
        outcomes: list[tuple[bool, float]] = []

        def run() -> None:
            for _ in range(n):
                began = time.monotonic()
                outcomes.append((host_work.wait_for_gap(), time.monotonic() - began))

        _spin_until_done(_background(run))  # the host computes meanwhile
        return outcomes

    streak = host_work.GIVE_UP_AFTER
    host_work.opened()  # never closed: an async server that always has a request open
    outcomes = waits(streak + 2)
    assert all(waited and took >= 0.01 for waited, took in outcomes[:streak])
    assert [waited for waited, _ in outcomes[streak:]] == [False, False]  # off now
    time.sleep(0.35)  # OFF_S passed: waits are tried again ...
    outcomes = waits(streak + 1)
    assert [waited for waited, _ in outcomes] == [True] * streak + [False]
    time.sleep(0.35)  # ... and after a second streak they stay off twice as long
    assert [waited for waited, _ in waits(1)] == [False]
    time.sleep(0.3)
    assert [waited for waited, _ in waits(1)] == [True]
    host_work.closed()
    # A wait that ends in a gap starts over: the next streak is off for OFF_S again.
    host_work._timeouts = 0
    monkeypatch.setattr(host_work, "MAX_GAP_WAIT_S", 5.0)
    host_work.opened()
    gap = threading.Timer(0.005, host_work.closed)
    gap.start()
    assert [waited for waited, _ in waits(1)] == [True]
    gap.join()
    assert host_work._off_s == 0.0


@pytest.mark.usefixtures("no_blocks")
def test_pipeline_a_forked_child_starts_with_no_block_open() -> None:
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    host_work.opened()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's handlers
        os.write(write, str(host_work.open_count()).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 16) == b"0"
    os.close(read)
    assert host_work.open_count() == 1
    host_work.closed()
    host_work.closed()  # one more than opened: never raises
    assert host_work.open_count() == 0


def test_pipeline_otelgpus_background_threads_are_marked(
    sim_gpu: sim.SimGpu,  # noqa: F811 - fixture
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    marked: set[str] = set()
    real_mark = host_work.mark_background

    def mark() -> None:
        marked.add(threading.current_thread().name)
        real_mark()

    monkeypatch.setattr(host_work, "mark_background", mark)
    handle = otelgpu.instrument(
        exporters="recording",
        recording_dir=str(tmp_path),
        gpu=True,
        frameworks="none",
        metric_export_interval_ms=50,
        span_schedule_delay_ms=50,
    )
    try:
        with otelgpu.request(model="m"):
            pass
        deadline = time.monotonic() + 10
        wanted = {"otelgpu-span-export", "OtelPeriodicExportingMetricReader"}
        if not otelgpu.NATIVE:
            wanted.add("otelgpu-sampler-py")  # the native sampler's thread holds no GIL
        while not wanted <= marked and time.monotonic() < deadline:
            time.sleep(0.05)
        assert wanted <= marked
        handle.force_flush()  # from the host's thread: not marked
        assert threading.current_thread().name not in marked
    finally:
        handle.shutdown()
