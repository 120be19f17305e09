"""Which ``otelgpu.step()`` and ``otelgpu.request()`` blocks finish off the host's thread.

A block's finish -- the span's GPU context, its attributes, the sketches and the span's
encoding -- is ~90 µs of CPU for a step with one GPU on a quiet machine, and 2.5-3x that
in a slow hour, all of it in the host's time between one block's end and the next one's
start. At 50 steps/s that was most of the added pause (``benchmarks/JOURNAL.md``). Run on
the runtime's deferred thread (``otelgpu.otel.deferred``: GIL hand-backs every 0.3 ms),
the same work lands while the host waits on the GPU, on I/O, or runs its next block, and
the host's exit is a queue append.

Only where otelgpu's own pipeline carries the spans: its ``force_flush()`` and
``shutdown()`` run what waits first. Attached to an application's tracer provider, whose
``force_flush()`` knows nothing of the deferred thread, every block finishes inline (the
:class:`Finisher` gets no queue). Even then, not every block goes there:

* a block shorter than :data:`DEFER_MIN_NS` finishes inline: at thousands of blocks per
  second the background thread, which gets the GIL only when the host gives it up (one
  switch interval, 5 ms, under a host that never blocks), could not keep up, and its
  slices would land in a few percent of the blocks;
* so does any block while :data:`BACKLOG_LIMIT` items wait on the deferred thread (a host
  that never lets it run: the backlog stays bounded and nothing is dropped);
* a block that ends once ``shutdown()`` began (nothing runs the queue any more);
* and a block that raised: its exception, and the frames its traceback holds (with their
  tensors), is not kept alive for the thread's interval.

The span ends at the block's own end time, and ``force_flush()`` / ``shutdown()`` run what
waits first, so what is exported is the same; only when it is built differs (at most the
thread's interval, 50 ms, later). The record's ``attributes`` mapping is copied when the
finish is deferred: the host may reuse and change it for its next block. Thread-safe (the
queue is; the rule reads only the record).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar

from opentelemetry.trace import Span

from otelgpu.otel.deferred import DeferredWork

#: Blocks at least this long (ns) finish on the deferred thread: 2 ms is 500 blocks a
#: second from one thread, ~45 ms of the thread's CPU a second for steps at most.
DEFER_MIN_NS = 2_000_000
#: Items waiting on the deferred thread beyond which blocks finish inline again.
BACKLOG_LIMIT = 256


class _Record(Protocol):
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any] | None


R = TypeVar("R", bound=_Record)


class Finisher(Generic[R]):
    """Finishes a live span now or on ``work``'s thread (see the module docstring).

    ``finish(span, record)`` is a recorder's finish; it never raises (the deferred thread
    reports whatever does)."""

    __slots__ = ("_finish", "_prepare", "_work")

    def __init__(
        self,
        work: DeferredWork | None,
        finish: Callable[[Span, R], None],
        prepare: Callable[[], None] | None = None,
    ) -> None:
        self._work = work  # None: every finish inline
        self._finish = finish
        # After a deferred finish, on the deferred thread: build the next blocks' spans
        # ahead (``SpanStarter.prepare``), so the host's next entries only start them.
        self._prepare = prepare

    def deferrable(self, record: R, *, failed: bool) -> bool:
        """Whether ``record``'s finish may leave the calling thread (``failed``: the
        block raised)."""
        work = self._work
        return (
            work is not None
            and not failed
            and record.end_ns - record.start_ns >= DEFER_MIN_NS
            and work.pending < BACKLOG_LIMIT
            and not work.stopped
        )

    def finish(self, span: Span, record: R, *, failed: bool = False) -> None:
        """Finish ``span`` with ``record``: queued when :meth:`deferrable`, else now."""
        work = self._work
        if work is None or not self.deferrable(record, failed=failed):
            self._finish(span, record)
            return
        attributes = record.attributes
        if attributes:  # the host's mapping: it may change it for its next block
            record.attributes = dict(attributes)
        work.submit(self._finish_later, span, record)

    def _finish_later(self, span: Span, record: R) -> None:
        self._finish(span, record)
        prepare = self._prepare
        if prepare is not None:
            prepare()
