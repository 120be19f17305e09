"""Incoming trace context per vLLM request, kept from ``add_request`` until the request ends.

vLLM's stats objects carry the request id but not the caller's ``traceparent``; ``AsyncLLM``
even drops ``trace_headers`` when its own ``--otlp-traces-endpoint`` tracing is off. The
instrumentor therefore wraps ``add_request`` and stores, per external request id, the parent
context: the W3C headers passed in (extracted with the globally configured propagator), or
else the span active in the caller (e.g. an instrumented HTTP server). The request span takes
it as its parent when the request finishes.

Bounded: at most ``max_entries`` ids; the oldest is evicted (and counted in ``evicted``)
when full, so requests that never report back (client aborts, which vLLM's stat loggers
never see) cannot grow it. Thread-safe (one short lock per call).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping

from opentelemetry import propagate, trace
from opentelemetry.context import Context

DEFAULT_MAX_ENTRIES = 65_536


class TraceContextRegistry:
    """Maps vLLM external request ids to the parent context of their request span."""

    __slots__ = ("_entries", "_lock", "evicted", "max_entries")

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.max_entries = max(1, int(max_entries))
        self._entries: OrderedDict[str, Context] = OrderedDict()
        self._lock = threading.Lock()
        self.evicted = 0
        """Entries dropped because the registry was full."""

    def __len__(self) -> int:
        return len(self._entries)

    def capture(self, request_id: object, trace_headers: Mapping[str, str] | None) -> None:
        """Remembers the parent context of ``request_id``; a no-op when there is none.

        Never raises: bad headers simply yield no parent.
        """
        if not isinstance(request_id, str):
            return
        ctx: Context | None = None
        if trace_headers:
            try:
                extracted = propagate.extract(dict(trace_headers))
            except Exception:  # noqa: BLE001 - a broken propagator must not fail add_request
                extracted = None
            if (
                extracted is not None
                and trace.get_current_span(extracted).get_span_context().is_valid
            ):
                ctx = extracted
        if ctx is None:
            current = trace.get_current_span()
            if current.get_span_context().is_valid:
                ctx = trace.set_span_in_context(current)
        if ctx is None:
            return
        with self._lock:
            self._entries[request_id] = ctx
            self._entries.move_to_end(request_id)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
                self.evicted += 1

    def pop(self, request_id: object) -> Context | None:
        """The stored parent context of ``request_id`` (removed), or ``None``."""
        if not isinstance(request_id, str):
            return None
        with self._lock:
            return self._entries.pop(request_id, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


REGISTRY = TraceContextRegistry()
"""The process-wide registry shared by the ``add_request`` wrappers and the stat loggers."""
