"""A bounded batch span processor that counts what it drops and never exports across fork.

Why not the SDK's ``BatchSpanProcessor``: its queue-full drops are only visible through
opt-in SDK self-metrics, and a forked child restarts its worker. This one:

* keeps at most ``max_queue_size`` spans (the newest are dropped when full, counted in
  ``InternalStats`` as ``(traces, queue_full)``); memory is bounded during an outage;
* exports on a named daemon thread every ``schedule_delay_s`` or when a batch is full;
  a wake sends what waits, then goes on only while whole batches wait -- spans that end
  during the send wait for the next wake. Chasing that tail had a host at 500
  requests/s send ~40 requests of ~10 spans a second instead of two, each costing the
  host a GIL hand-over (gRPC's Python layer);
* after ``fork()`` the child clears the queue and exports nothing (``after_in_child``);
* ``force_flush`` and ``shutdown`` export what is queued, with a deadline that covers
  everything they wait for -- the worker thread, the export lock, each batch -- so a
  hung collector delays shutdown (and the interpreter's exit) by at most
  ``shutdown_timeout_s`` plus one export's own timeout; spans still queued then are
  dropped and counted (``(traces, shutdown)``).

``on_end`` (the application's hot path) is the span's encoding where it is compact (see
below) and a deque append under no lock (plus, for step spans, the tail sampler's
decision: ``otelgpu.otel.tail_sampling``).

The host never waits long for the export thread: with an exporter that takes
pre-encoded batches (``otelgpu.otel.fast_export``), spans are encoded one by one
(``otelgpu.otel.span_encoding``) and the thread gives the GIL back
(``otelgpu.otel.slicing.pause``) after every ``SLICE_S`` of encoding and after every
request; requests carry at most ``ENCODED_BATCH`` spans, so no single C call (parsing,
serialising, sending) holds the GIL for long either. Without it (console, a user's
exporter), batches are exported as the SDK's processor would.

Spans are encoded at once, on the thread that ends them, when the encoding is compact
(OTLP protobuf bytes, written natively: ~5 µs for a request span with 26 attributes; the
recording's JSON text); the export thread then only sends, once a batch is ready or the
schedule delay has passed. Two reasons. A queued SDK span is about twenty objects the
garbage collector tracks; held for the whole schedule delay (seconds), they outlive two
young collections and are promoted to the oldest generation, and those promotions are
what trigger full collections (tens of ms with the GIL held, in whichever thread
allocates -- often the host's). Bytes are not tracked, so encoded spans promote nothing.
And encoding in the background meant waking the export thread every few tens of ms: a
thread that wakes needs the GIL, and a host that runs Python without pause hands it over
only when forced (at the end of a switch interval), one pause per wake (a 50 steps/s loop
lost the GIL ~2.5 times per step to the export thread and the metric reader).
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
from otelgpu.otel import host_work, slicing
from otelgpu.otel.stats import InternalStats
from otelgpu.otel.tail_sampling import StepSpanSampler

#: The GIL hand-back rhythm shared by otelgpu's background threads (seconds).
SLICE_S, YIELD_S = slicing.SLICE_S, slicing.YIELD_S
#: Most spans per pre-encoded request.
ENCODED_BATCH = 512
#: Spans waiting (queued or encoded, not sent) at which the export thread counts as
#: falling behind, as a share of the queue's capacity: span ends then hand it the GIL
#: (see ``on_end``).
BEHIND_SHARE = 8
#: While behind, one span end in this many hands the GIL to the export thread.
HAND_OVER_EVERY = 4


class _Origin:
    """The resource and instrumentation scope of encoded spans (what grouping them into a
    request needs), one shared object per pair instead of the spans themselves."""

    __slots__ = ("instrumentation_scope", "resource")

    def __init__(self, resource: Any, scope: Any) -> None:
        self.resource = resource
        self.instrumentation_scope = scope


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
        step_sampler: StepSpanSampler | None = None,
    ) -> None:
        self._exporter = exporter
        #: Tail-keeping sampling of step spans; ``step_sampler`` is the pipeline's shared
        #: one (the step recorder decides with it), else one of this processor's own.
        self._sampler = step_sampler or StepSpanSampler(step_spans_per_second)
        self._encoded = bool(getattr(exporter, "accepts_encoded", False))
        #: Encode early (module docstring): only when the encoding is bytes.
        self._early = self._encoded and bool(getattr(exporter, "compact_encoding", False))
        #: Spans encoded at their end, not sent yet: ``(origin, bytes)`` (appended by the
        #: ending threads, taken from the left by the export thread).
        self._ready: collections.deque[tuple[_Origin, Any]] = collections.deque()
        self._encode: Any = getattr(exporter, "encode_span", None)
        self._origins: dict[tuple[int, Any], _Origin] = {}
        self._last_origin: _Origin | None = None  # the previous span's, by identity
        self._last_export = time.monotonic()
        self._shutdown_timeout_s = shutdown_timeout_s
        self._stats = stats
        self._max_queue_size = max_queue_size
        self._batch_size = min(max_export_batch_size, max_queue_size)
        #: Spans waiting that wake the thread before its timer: a batch.
        self._wake_at = self._batch_size
        #: Spans waiting at which span ends hand the export thread the GIL (``on_end``).
        self._behind_at = max(self._wake_at, max_queue_size // BEHIND_SHARE)
        self._behind = 0
        #: How many times a span end handed the GIL to the falling-behind export thread.
        self.host_hand_overs = 0
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
        self._ready = collections.deque()
        self._stopped = True
        self._export_lock = threading.Lock()

    @property
    def encodes_at_end(self) -> bool:
        """Whether ``on_end`` encodes each span at once and keeps no reference to it."""
        return self._early

    @property
    def step_sampler(self) -> StepSpanSampler:
        """The tail-keeping sampler of step spans this processor follows."""
        return self._sampler

    # ------------------------------------------------------------------ hot path
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        ctx = span.context
        if self._stopped or not (ctx and ctx.trace_flags.sampled):
            return
        sampler = self._sampler
        if not sampler.keep(span):
            if not sampler.decided_upstream(span):  # the step recorder counts its own
                self._stats.add_dropped("traces", "tail_sampled")
            return
        if len(self._queue) + len(self._ready) >= self._max_queue_size:
            self._stats.add_dropped("traces", "queue_full")
            return
        if self._early:  # encoded now, on this thread (module docstring)
            if not self._encode_ready(span):
                return
            waiting = len(self._ready)
        else:
            self._queue.append(span)
            waiting = len(self._queue)
        if waiting >= self._wake_at:
            self._wake.set()
            if waiting + len(self._queue if self._early else self._ready) >= self._behind_at:
                self._hand_over()

    def _encode_ready(self, span: ReadableSpan) -> bool:
        """Encodes ``span`` into ``_ready``; ``False`` (reported, counted as dropped) if its
        encoding failed: one bad span must not sink the others."""
        try:
            body = self._encode(span)
        except Exception as exc:  # noqa: BLE001 - never raised into the span's end
            self._stats.report_error("span encoding", exc)
            self._stats.add_dropped("traces", "encoding_failed")
            return False
        self._ready.append((self._origin(span), body))
        return True

    def _origin(self, span: ReadableSpan) -> _Origin:
        """The shared :class:`_Origin` of ``span``'s resource and scope."""
        scope = span.instrumentation_scope or None
        last = self._last_origin
        # most spans come from the tracer of the span before: no scope hashed for them
        if (
            last is not None
            and last.resource is span.resource
            and last.instrumentation_scope is scope
        ):
            return last
        key = (id(span.resource), scope)
        origins = self._origins
        origin = origins.get(key)
        if origin is None or origin.resource is not span.resource:
            if len(origins) >= 64:
                origins.clear()
            origin = origins[key] = _Origin(span.resource, scope)
        self._last_origin = origin
        return origin

    def _hand_over(self) -> None:
        """The export thread is falling behind: hand it the GIL from the ending thread,
        every ``HAND_OVER_EVERY`` spans while it is. A host that runs Python without pause
        (and calls nothing that releases the GIL) leaves a waiting thread one turn per
        switch interval (5 ms), too few to encode hundreds of spans per second; the queue
        would fill and drop. Here the host waits a short sleep plus one of the export
        thread's slices (``SLICE_S``), a bounded pause, instead of losing spans."""
        self._behind += 1
        if self._behind % HAND_OVER_EVERY:
            return
        self.host_hand_overs += 1
        time.sleep(YIELD_S)

    # ------------------------------------------------------------------ worker
    def _run(self) -> None:
        host_work.mark_background()
        while not self._stopped:
            self._wake.wait(self._delay_s)
            self._wake.clear()
            if self._stopped:
                break
            slicing.starting()  # clear of the host's requests and step boundaries
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
            if self._early:
                return self._send_ready(deadline)
            first = True
            while self._queue and os.getpid() == self._pid:
                if deadline is None and (self._stopped or not (first or self._batch_due())):
                    return not self._stopped
                first = False
                if deadline is not None and time.monotonic() > deadline:
                    return False
                batch: list[ReadableSpan] = []
                size = min(self._batch_size, ENCODED_BATCH) if self._encoded else self._batch_size
                while self._queue and len(batch) < size:
                    batch.append(self._queue.popleft())
                if not self._send(batch):
                    ok = False
                if self._encoded and self._queue:
                    slicing.pause()
        finally:
            self._export_lock.release()
        return ok

    def _batch_due(self) -> bool:
        """Whether a whole batch waits: the worker sends on after its first request only
        then, so spans that ended meanwhile wait for the next wake."""
        return len(self._queue) + len(self._ready) >= self._wake_at

    def _send(self, batch: list[Any], *, ready: bool = False) -> bool:
        """Export one batch: SDK spans, or ``(origin, encoded)`` pairs when ``ready``.
        ``False`` if the export failed (reported, never raised)."""
        exporter: Any = self._exporter
        try:
            with suppress_instrumentation():
                if ready:
                    origins = [origin for origin, _ in batch]
                    result = exporter.export_encoded(origins, exporter.assemble(batch))
                elif self._encoded:
                    spans, payload = self._encode_sliced(batch)
                    result = exporter.export_encoded(spans, payload)
                else:
                    result = exporter.export(batch)
        except Exception as exc:  # noqa: BLE001 - a broken exporter must not kill us
            self._stats.report_error("span export", exc)
            result = SpanExportResult.FAILURE
        return result is SpanExportResult.SUCCESS

    def _send_ready(self, deadline: float | None) -> bool:
        """Encode what is queued, then send every encoded span (export lock held)."""
        ok = True
        self._last_export = time.monotonic()
        first = True
        while os.getpid() == self._pid:
            if deadline is not None and time.monotonic() > deadline:
                return False
            self._encode_queue()
            if not self._ready:
                break
            if deadline is None and self._stopped:
                return False
            if deadline is None and not first and not self._batch_due():
                break  # the tail waits for the next wake (module docstring)
            first = False
            ready = self._ready
            chunk = [ready.popleft() for _ in range(min(ENCODED_BATCH, len(ready)))]
            # Assembling and sending (a C call that may hold the GIL) start a new slice
            # if encoding used this one up.
            slicing.tick()
            if not self._send(chunk, ready=True):
                ok = False
            if self._ready or self._queue:
                slicing.pause()
        return ok

    def _encode_queue(self) -> None:
        """Move queued spans (a batch at most) into ``_ready`` as bytes, handing the GIL back
        every ``SLICE_S`` (export lock held). Spans are encoded as they end; this catches
        those queued before an exporter could take encoded batches."""
        tick = slicing.tick
        queue = self._queue
        for _ in range(self._batch_size):
            try:
                span = queue.popleft()
            except IndexError:
                break
            self._encode_ready(span)
            tick()

    def _encode_sliced(self, batch: list[ReadableSpan]) -> tuple[list[ReadableSpan], Any]:
        """Encode ``batch`` span by span, handing the GIL back every ``SLICE_S``."""
        tick = slicing.tick
        pairs = []
        exporter: Any = self._exporter
        encode = exporter.encode_span
        for span in batch:
            try:
                pairs.append((span, encode(span)))
            except Exception as exc:  # noqa: BLE001 - one bad span must not sink the batch
                self._stats.report_error("span encoding", exc)
                self._stats.add_dropped("traces", "encoding_failed")
            tick()
        tick()
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
            left = len(self._queue) + len(self._ready)
            if left:
                self._queue.clear()
                self._ready.clear()
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
        left = len(self._queue) + len(self._ready)
        if left:
            self._queue.clear()
            self._ready.clear()
            self._stats.add_dropped("traces", "shutdown_timeout", left)

    @property
    def queued(self) -> int:
        """Spans waiting for export (queued or already encoded)."""
        return len(self._queue) + len(self._ready)
