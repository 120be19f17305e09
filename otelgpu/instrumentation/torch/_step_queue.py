"""The hand-off of finished steps from the training thread to a background thread.

The training thread only appends to a bounded deque (< 1 µs); a daemon thread, started
at the first step, calls the consumer for every queued step each
:data:`WORKER_INTERVAL_S`, and :meth:`StepQueue.drain` does the same synchronously
(``flush()``/``uninstrument()``). Steps beyond :data:`QUEUE_LIMIT` are dropped and
counted, never blocking the host.

The background thread hands the GIL back (``otelgpu.otel.slicing``) between steps once
its slice (~0.3 ms of its CPU) is used: half a second of steps is milliseconds of Python,
and the training thread, back from a torch op that released the GIL, would otherwise wait
for all of it (or for the interpreter's 5 ms switch interval). A synchronous
:meth:`StepQueue.drain` runs on the caller's thread and does not pause.

Thread-safety: :meth:`StepQueue.put` runs on the training thread; :meth:`StepQueue.drain`
may run on any thread and holds one lock, so steps are consumed in order, one at a time.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from otelgpu.otel import host_work, slicing

__all__ = ["QUEUE_LIMIT", "WORKER_INTERVAL_S", "StepQueue"]

QUEUE_LIMIT = 10_000
"""Steps waiting for the background thread at most; more are dropped and counted
(``otelgpu.internal.dropped{otelgpu.signal=torch_steps}``)."""

WORKER_INTERVAL_S = 0.5
"""How often the background thread turns queued steps into spans and metrics."""

T = TypeVar("T")


class StepQueue(Generic[T]):
    """A bounded queue of steps and the daemon thread that consumes it.

    Args:
        consume: called with each step, in order, under the drain lock.
        before_drain: called under the drain lock before the queued steps (e.g. resolve
            finished CUDA events they may need); must not raise.
        on_error: receives ``(where, exception)`` of a failing ``consume``
            (``torch.step``); must not raise.
        on_dropped: receives the count of steps dropped since the last drain, after it.
        after_drain: called under the drain lock once the queued steps are consumed, also
            when one failed (e.g. publish totals ``consume`` kept per drain); must not raise.
    """

    def __init__(
        self,
        consume: Callable[[T], None],
        *,
        before_drain: Callable[[], None],
        on_error: Callable[[str, BaseException], None],
        on_dropped: Callable[[int], None],
        after_drain: Callable[[], None] | None = None,
    ) -> None:
        self._consume = consume
        self._after_drain = after_drain
        self._before_drain = before_drain
        self._on_error = on_error
        self._on_dropped = on_dropped
        self._queue: deque[T] = deque()
        self._dropped = 0
        self._drain_lock = threading.Lock()
        self._worker_lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._stop = threading.Event()
        self._forgotten = False  # a forked child's copy: takes nothing, starts no thread

    def put(self, step: T) -> None:
        """Queues one step (the training thread: an append); starts the worker if needed."""
        queue = self._queue
        if len(queue) >= QUEUE_LIMIT:
            self._dropped += 1
            return
        queue.append(step)
        if self._worker is None:  # none yet, or it ended (its _run clears it on the way out)
            self._start_worker()

    def _start_worker(self) -> None:
        with self._worker_lock:
            if self._forgotten:  # a forked child: nothing of the parent's is recorded
                self._queue.clear()
                return
            if self._worker is not None:
                return
            self._stop.clear()
            worker = threading.Thread(target=self._run, name="otelgpu-torch-steps", daemon=True)
            self._worker = worker
            worker.start()

    def _run(self) -> None:
        host_work.mark_background()
        try:
            while not self._stop.wait(WORKER_INTERVAL_S):
                self._drain(slicing.Slicer())
            self._drain(slicing.Slicer())
        finally:
            # put() starts a new worker when this one is gone, without asking the thread
            # (Thread.is_alive() on every step was a lock round trip on the training thread)
            with self._worker_lock:
                if self._worker is threading.current_thread():
                    self._worker = None

    def drain(self) -> None:
        """Consumes every queued step now (thread-safe), then reports the drops."""
        self._drain(None)

    def _drain(self, slicer: slicing.Slicer | None) -> None:
        """:meth:`drain`; with a ``slicer`` (the background thread) the GIL is handed
        back between steps once its slice is used."""
        queue = self._queue
        with self._drain_lock:
            self._before_drain()
            consumed = False
            while queue:
                step = queue.popleft()
                consumed = True
                try:
                    self._consume(step)
                except Exception as exc:  # noqa: BLE001 - never raise into the host
                    self._on_error("torch.step", exc)
                if slicer is not None:
                    slicer.tick()
            if consumed and self._after_drain is not None:
                self._after_drain()
            dropped, self._dropped = self._dropped, 0
        if dropped:
            self._on_dropped(dropped)

    def close(self) -> None:
        """Stops the background thread (bounded wait), then drains. Idempotent."""
        self._stop.set()
        worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout=2.0)
        self._worker = None
        self.drain()

    def forget(self) -> None:
        """In a forked child: drops the parent's queued steps (its thread did not
        survive); a later :meth:`put` (the tracker may hold it directly) is dropped too,
        and starts no thread."""
        self._forgotten = True
        self._queue.clear()
        self._worker = None
