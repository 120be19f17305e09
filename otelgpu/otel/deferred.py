"""Work moved off the host's hot loop: a bounded queue drained by a background thread.

A serving engine's loop (vLLM's ``record()``) should pay for a finished request what its
own Prometheus logger pays -- a few counters -- not for a span with its GPU context and a
dozen attributes. :class:`DeferredWork` takes a callable and its arguments (an append,
well under a microsecond) and runs it on the ``otelgpu-deferred`` thread, which:

* wakes every ``interval_s`` (or when ``batch`` items wait) and runs what is queued, in
  order, handing the GIL back (``otelgpu.otel.slicing.pause``) before an item that
  would take the work past ``SLICE_S`` (judged by the one before it), so the host's loop
  never waits long for it, and starting none that would run into the host's next step
  boundary (``otelgpu.otel.host_cadence``);
* holds at most ``limit`` items; beyond that the newest are dropped and counted
  (``otelgpu.internal.dropped``, signal ``traces``, reason ``deferred_queue_full``);
* never lets an exception out (reported once per place, counted);
* :meth:`drain` runs everything queued now, on the calling thread (flush, shutdown);
* a forked child starts empty, with no thread (started again on first use);
  ``instrument()`` starts the parent's (:meth:`start`), so no host thread waits for a
  thread to start on its first deferred item.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from otelgpu.otel import host_cadence, host_work, slicing
from otelgpu.otel.stats import InternalStats

#: The GIL hand-back rhythm shared by otelgpu's background threads (seconds).
SLICE_S, YIELD_S = slicing.SLICE_S, slicing.YIELD_S


class DeferredWork:
    """A bounded queue of calls run by a background thread (see the module docstring)."""

    def __init__(
        self,
        stats: InternalStats,
        *,
        where: str,
        limit: int = 65_536,
        interval_s: float = 0.05,
        batch: int = 64,
    ) -> None:
        self._stats = stats
        self._where = where
        self._limit = limit
        self._interval_s = interval_s
        self._batch = batch
        self._queue: collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]] = (
            collections.deque()
        )
        self._wake = threading.Event()
        self._run_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._stopped = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)`` (hot path: an append). Never raises."""
        if self._stopped:
            return
        if self._thread is None or self._pid != os.getpid():
            self._start()  # first: a forked child's start empties the parent's queue
        queue = self._queue
        if len(queue) >= self._limit:
            self._stats.add_dropped("traces", "deferred_queue_full")
            return
        queue.append((fn, args))
        if len(queue) >= self._batch:
            self._wake.set()

    def _start(self) -> None:
        if self._pid != os.getpid():  # a forked child: nothing of the parent's runs here
            self._start_lock = threading.Lock()  # a parent's thread may have held it
        with self._start_lock:  # two first submits at once start one thread
            if self._thread is not None and self._pid == os.getpid():
                return
            if self._pid != os.getpid():
                self._pid = os.getpid()
                self._queue.clear()
                self._run_lock = threading.Lock()
            thread = threading.Thread(target=self._loop, name="otelgpu-deferred", daemon=True)
            self._thread = thread
            thread.start()

    def start(self) -> None:
        """Start the thread now (idempotent): ``instrument()`` does, so the first item's
        :meth:`submit` -- on the host's thread -- does not wait for a thread to start."""
        if not self._stopped and (self._thread is None or self._pid != os.getpid()):
            self._start()

    def _loop(self) -> None:
        host_work.mark_background()
        wake = self._wake
        # Every interval, not only once something is queued: a first item waking the
        # thread from the host's exit added ~+200 µs to the 50 steps/s p99 (two
        # interleaved pairs, benchmarks/JOURNAL.md stop 49).
        while not self._stopped:
            wake.wait(self._interval_s)
            wake.clear()
            self._run(yielding=True)

    def _run(self, *, yielding: bool) -> None:
        clock = time.perf_counter
        with self._run_lock:
            queue = self._queue
            took = SLICE_S  # the last item's time: the next one's expected time
            if yielding and queue:
                slicing.starting(took)
            slice_end = clock() + SLICE_S
            while queue:
                try:
                    fn, args = queue.popleft()
                except IndexError:
                    return
                started = clock()
                try:
                    fn(*args)
                except Exception as exc:  # noqa: BLE001 - never out of the worker
                    self._stats.report_error(self._where, exc)
                if not (yielding and queue):
                    continue
                ended = clock()
                took = ended - started
                # Hand back before an item that, as long as this one, would end past the
                # slice: a step's finish is 0.1-0.3 ms cold, so two in a row held the GIL
                # for up to twice the slice.
                if ended + took > slice_end:
                    slicing.pause()
                    slice_end = clock() + SLICE_S
                else:  # nor run into the host's next step boundary
                    host_cadence.keep_clear(took)

    def drain(self) -> None:
        """Run everything queued now, on the calling thread."""
        if self._pid != os.getpid():
            return
        self._run(yielding=False)

    def close(self) -> None:
        """Drain, then stop the thread (idempotent; waits for it at most a second)."""
        self.drain()
        self._stopped = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)

    @property
    def pending(self) -> int:
        return len(self._queue)

    @property
    def stopped(self) -> bool:
        """Whether :meth:`close` ran: :meth:`submit` takes nothing any more."""
        return self._stopped
