"""A bounded batch span processor that counts what it drops and never exports across fork.

Why not the SDK's ``BatchSpanProcessor``: its queue-full drops are only visible through
opt-in SDK self-metrics, and a forked child restarts its worker. This one:

* keeps at most ``max_queue_size`` spans (the newest are dropped when full, counted in
  ``InternalStats`` as ``(traces, queue_full)``); memory is bounded during an outage;
* exports on a named daemon thread every ``schedule_delay_s`` or when a batch is full;
* after ``fork()`` the child clears the queue and exports nothing (``after_in_child``);
* ``force_flush`` and ``shutdown`` export what is queued, with a deadline that covers
  everything they wait for -- the worker thread, the export lock, each batch -- so a
  hung collector delays shutdown (and the interpreter's exit) by at most
  ``shutdown_timeout_s`` plus one export's own timeout; spans still queued then are
  dropped and counted (``(traces, shutdown)``).

``on_end`` (the application's hot path) is a deque append under no lock (plus, for step
spans, the tail sampler's decision: ``otelgpu.otel.tail_sampling``).

The host never waits long for the export thread: with an exporter that takes
pre-encoded batches (``otelgpu.otel.fast_export``), spans are encoded one by one
(``otelgpu.otel.span_encoding``) and the thread gives the GIL back for
``YIELD_S`` after every ``SLICE_S`` of encoding and after every request; requests carry
at most ``ENCODED_BATCH`` spans, so no single C call (parsing, serialising, sending) holds
the GIL for long either. Without it (console, a user's exporter), batches are exported as
the SDK's processor would.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Any

from opentelemetry.context import Context
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otelgpu._fork import after_fork_in_child
from otelgpu.otel.stats import InternalStats
from otelgpu.otel.tail_sampling import StepSpanSampler

#: Longest stretch of encoding between two GIL hand-backs (seconds).
SLICE_S = 0.0003
#: How long the export thread sleeps to hand the GIL back (seconds): long enough for a
#: waiting application thread to wake and take it.
YIELD_S = 0.0001
#: Most spans per pre-encoded request.
ENCODED_BATCH = 128


class BoundedBatchSpanProcessor(SpanProcessor):
    """Batches finished spans to ``exporter``; see the module docstring."""

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        stats: InternalStats,
        max_queue_size: int = 2048,
        max_export_batch_size: int = 512,
        schedule_delay_s: float = 5.0,
        shutdown_timeout_s: float = 10.0,
        step_spans_per_second: float = 0.0,
    ) -> None:
        self._exporter = exporter
        self._sampler = StepSpanSampler(step_spans_per_second)
        self._encoded = bool(getattr(exporter, "accepts_encoded", False))
        self._shutdown_timeout_s = shutdown_timeout_s
        self._stats = stats
        self._max_queue_size = max_queue_size
        self._batch_size = min(max_export_batch_size, max_queue_size)
        self._delay_s = schedule_delay_s
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._export_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._pid = os.getpid()
        self._thread = self._start_thread()
        after_fork_in_child(self._after_fork_in_child)

    def _start_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="otelgpu-span-export", daemon=True)
        thread.start()
        return thread

    def _after_fork_in_child(self) -> None:
        # The parent's spans belong to the parent; the child exports nothing at all.
        self._queue.clear()
        self._stopped = True
        self._export_lock = threading.Lock()

    # ------------------------------------------------------------------ hot path
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if self._stopped or not (span.context and span.context.trace_flags.sampled):
            return
        if not self._sampler.keep(span):
            self._stats.add_dropped("traces", "tail_sampled")
            return
        if len(self._queue) >= self._max_queue_size:
            self._stats.add_dropped("traces", "queue_full")
            return
        self._queue.append(span)
        if len(self._queue) >= self._batch_size:
            self._wake.set()

    # ------------------------------------------------------------------ worker
    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait(self._delay_s)
            self._wake.clear()
            if self._stopped:
                break
            self._export_all()

    def _export_all(self, deadline: float | None = None) -> bool:
        """Export the queue in batches; ``False`` if an export failed or time ran out.

        The worker (``deadline=None``) gives the queue up to ``shutdown`` as soon as a stop
        is requested, so ``shutdown`` never waits behind a worker draining a long queue
        into a hung collector.
        """
        if deadline is None:
            acquired = self._export_lock.acquire()
        else:
            acquired = self._export_lock.acquire(timeout=max(0.0, deadline - time.monotonic()))
        if not acquired:
            return False
        ok = True
        try:
            while self._queue and os.getpid() == self._pid:
                if deadline is None and self._stopped:
                    return False
                if deadline is not None and time.monotonic() > deadline:
                    return False
                batch: list[ReadableSpan] = []
                size = min(self._batch_size, ENCODED_BATCH) if self._encoded else self._batch_size
                while self._queue and len(batch) < size:
                    batch.append(self._queue.popleft())
                try:
                    with suppress_instrumentation():
                        if self._encoded:
                            batch, payload = self._encode_sliced(batch)
                            exporter: Any = self._exporter
                            result = exporter.export_encoded(batch, payload)
                        else:
                            result = self._exporter.export(batch)
                except Exception as exc:  # noqa: BLE001 - a broken exporter must not kill us
                    self._stats.report_error("span export", exc)
                    result = SpanExportResult.FAILURE
                if result is not SpanExportResult.SUCCESS:
                    ok = False
                if self._encoded and self._queue:
                    time.sleep(YIELD_S)
        finally:
            self._export_lock.release()
        return ok

    def _encode_sliced(self, batch: list[ReadableSpan]) -> tuple[list[ReadableSpan], Any]:
        """Encode ``batch`` span by span, handing the GIL back every ``SLICE_S``."""
        clock = time.perf_counter
        pairs = []
        slice_end = clock() + SLICE_S
        exporter: Any = self._exporter
        encode = exporter.encode_span
        for span in batch:
            try:
                pairs.append((span, encode(span)))
            except Exception as exc:  # noqa: BLE001 - one bad span must not sink the batch
                self._stats.report_error("span encoding", exc)
                self._stats.add_dropped("traces", "encoding_failed")
            if clock() > slice_end:
                time.sleep(YIELD_S)
                slice_end = clock() + SLICE_S
        return [span for span, _ in pairs], exporter.assemble(pairs)

    # ------------------------------------------------------------------ lifecycle
    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        if os.getpid() != self._pid:
            return True
        return self._export_all(time.monotonic() + timeout_millis / 1000)

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        deadline = time.monotonic() + self._shutdown_timeout_s
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        if os.getpid() == self._pid:
            self._export_all(deadline)
            left = len(self._queue)
            if left:
                self._queue.clear()
                self._stats.add_dropped("traces", "shutdown", left)
        try:
            self._exporter.shutdown()
        except Exception as exc:  # noqa: BLE001 - shutdown goes on
            self._stats.report_error("span exporter shutdown", exc)

    def abandon(self) -> None:
        """Shutdown ran out of time: count what is still queued as dropped
        (``(traces, shutdown_timeout)``) and stop; the batch in flight is the exporter's."""
        self._stopped = True
        self._wake.set()
        left = len(self._queue)
        if left:
            self._queue.clear()
            self._stats.add_dropped("traces", "shutdown_timeout", left)

    @property
    def queued(self) -> int:
        """Spans waiting for export."""
        return len(self._queue)
