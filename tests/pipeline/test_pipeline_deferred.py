"""``DeferredWork`` (``otelgpu-deferred``): what vLLM's finished requests and the GPU
health polls are handed to. Bounded (drops counted), in order, failures reported and
counted, one thread however many first submits race, and a forked child runs its own
work, never the parent's queue."""

from __future__ import annotations

import os
import threading
import time

import pytest

from otelgpu.otel.deferred import DeferredWork
from otelgpu.otel.stats import InternalStats


def test_submit_past_its_limit_drops_and_counts() -> None:
    stats = InternalStats()
    work = DeferredWork(stats, where="t", limit=2, interval_s=3600.0)
    done: list[int] = []
    with work._run_lock:  # the thread cannot run what waits meanwhile
        for i in range(4):
            work.submit(done.append, i)
        assert work.pending == 2
    work.drain()
    assert done == [0, 1]
    assert stats.dropped() == {("traces", "deferred_queue_full"): 2}
    work.close()
    work.submit(done.append, 9)  # closed: neither queued nor counted as a drop
    assert done == [0, 1] and work.pending == 0
    assert stats.dropped() == {("traces", "deferred_queue_full"): 2}


def test_the_thread_runs_what_waits_in_order_and_reports_failures() -> None:
    stats = InternalStats()
    work = DeferredWork(stats, where="t", interval_s=0.01)
    done: list[int] = []

    def fail() -> None:
        raise RuntimeError("broken finish")

    work.submit(done.append, 1)
    work.submit(fail)
    work.submit(done.append, 2)
    deadline = time.monotonic() + 10
    while (work.pending or len(done) < 2) and time.monotonic() < deadline:
        time.sleep(0.01)
    work.close()
    assert done == [1, 2]
    assert stats.errors() == {"t": 1}


def test_racing_first_submits_start_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    work = DeferredWork(InternalStats(), where="t", interval_s=3600.0)
    barrier = threading.Barrier(8)
    done: list[int] = []

    def first(i: int) -> None:
        barrier.wait()
        work.submit(done.append, i)

    threads = [threading.Thread(target=first, args=(i,)) for i in range(8)]
    started: list[str] = []

    class Counted(threading.Thread):
        def start(self) -> None:
            started.append(self.name)
            super().start()

    monkeypatch.setattr(threading, "Thread", Counted)  # the threads DeferredWork starts
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    work.drain()
    work.close()
    assert sorted(done) == list(range(8))
    assert started == ["otelgpu-deferred"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_a_forked_child_runs_its_own_first_submit_not_the_parents_queue() -> None:
    work = DeferredWork(InternalStats(), where="t", interval_s=3600.0)
    done: list[str] = []
    with work._run_lock:  # the parent's item still waits at the fork
        work.submit(done.append, "parent")
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: the parent's queue is not its own; its first item counts
            try:
                work._run_lock = threading.Lock()  # held by the parent's thread: not ours
                work.submit(done.append, "child")
                work.drain()
                os.write(write, ",".join(done).encode())
            finally:
                os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child_saw = pipe.read().decode()
    os.waitpid(pid, 0)
    assert child_saw == "child"  # before the fix, the child's first item was cleared too
    work.drain()
    work.close()
    assert done == ["parent"]


def test_the_thread_hands_back_before_an_item_would_overrun_its_slice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Items of 0.2 ms against a 0.3 ms slice: a hand-back between every two, none after
    the last (two in a row would hold the GIL for 0.4 ms)."""
    from otelgpu.otel import deferred, slicing

    events: list[str] = []
    monkeypatch.setattr(slicing, "pause", lambda: events.append("pause"))
    monkeypatch.setattr(deferred, "SLICE_S", 0.0003)
    work = DeferredWork(InternalStats(), where="t", interval_s=3600.0)

    def item(i: int) -> None:
        end = time.perf_counter() + 0.0002
        while time.perf_counter() < end:
            pass
        events.append(f"item {i}")

    with work._run_lock:  # the thread cannot take them first
        for i in range(5):
            work.submit(item, i)
    work._run(yielding=True)  # what the thread does
    work.close()
    assert events == ["item 0", "pause", "item 1", "pause", "item 2", "pause", "item 3",
                      "pause", "item 4"]  # fmt: skip


def test_start_starts_one_thread_and_close_waits_for_it() -> None:
    """``instrument()`` starts the thread (not the first item, on the host's thread), and
    a close stops it: none is left behind, also after a close racing its sleep."""
    for _ in range(20):
        work = DeferredWork(InternalStats(), where="t", interval_s=0.001)
        work.start()
        thread = work._thread
        assert thread is not None and thread.is_alive()
        done: list[int] = []
        work.submit(done.append, 1)
        work.start()  # idempotent
        assert work._thread is thread
        work.close()
        assert done == [1]
        assert not thread.is_alive()
