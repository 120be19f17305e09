"""otelgpu's periodic metric reader: no thread in a forked child, a collection in slices.

:class:`ForkAwareMetricReader` is the SDK's ``PeriodicExportingMetricReader`` with two
changes:

* a forked child gets no export thread (see :meth:`ForkAwareMetricReader._at_fork_reinit`);
* its collections hand the GIL back between instruments. The SDK's collection is one
  call under the meter provider's locks: every observable callback, then every
  instrument's aggregations turned into data points (``MetricReaderStorage.collect``,
  1-3 ms with eight GPUs), with the GIL held throughout. Observable instruments built by
  otelgpu already yield between observations (``otelgpu.metrics.instruments``); before
  each collection this reader makes every instrument's aggregation step of its storage
  (the SDK's ``_ViewInstrumentMatch.collect``, one per instrument and view) begin with
  :func:`otelgpu.otel.slicing.tick`, so the storage step is cut per instrument as well.
  The data collected is unchanged: same instruments, order, points and timestamps.

The storage step's pauses happen while the SDK holds that storage's lock; the host takes
it only the first time it records on an instrument (a new instrument then waits for the
collection, as it does without slicing, only for longer). No pause holds an aggregation's
own lock (the host's recordings never wait for one).

The hook reaches into SDK internals (reader -> measurement consumer -> reader storage);
if their shape differs (another SDK version), the collection runs unsliced, as the SDK's.
Thread-safety: the reader's own thread (and ``force_flush``/``shutdown`` callers) collect;
wrapping is idempotent and the SDK's lists are copied before being walked.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

from otelgpu.otel import host_work, slicing

_logger = logging.getLogger("otelgpu")


def _ticking(
    tick: Callable[[], None], collect: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    tick()
    return collect(*args, **kwargs)


def slice_collection(reader: Any, tick: Callable[[], None] = slicing.tick) -> int:
    """Make every instrument's aggregation step in ``reader``'s storage begin with
    ``tick`` (:func:`slicing.tick`); returns how many were wrapped now (0 when the SDK's
    internals are not as expected, or all were wrapped before)."""
    consumer = getattr(getattr(reader, "_collect", None), "__self__", None)
    storages = getattr(consumer, "_reader_storages", None)
    storage = storages.get(reader) if isinstance(storages, dict) else None
    matches = getattr(storage, "_instrument_view_instrument_matches", None)
    if not isinstance(matches, dict):
        return 0
    wrapped = 0
    # list() copies are atomic under the GIL: the host may add instruments meanwhile.
    for view_matches in list(matches.values()):
        for match in list(view_matches):
            state = getattr(match, "__dict__", None)
            if state is None or "collect" in state or not callable(getattr(match, "collect", None)):
                continue
            match.collect = functools.partial(_ticking, tick, match.collect)
            wrapped += 1
    return wrapped


class ForkAwareMetricReader(PeriodicExportingMetricReader):
    """The SDK's periodic reader, except that a forked child gets no export thread and
    collections hand the GIL back between instruments (module docstring)."""

    def _at_fork_reinit(self) -> None:
        # The SDK restarts the reader's thread in every forked child, so each DataLoader
        # worker would run the parent's metric collection -- every observable callback,
        # GPU ones included -- forever, only for the guarded exporter to drop it.
        # otelgpu's rule: a child inherits no running thread and exports nothing of the
        # parent's state; a child that wants telemetry calls ``instrument()`` itself.
        # Runs in the child after fork(): the parent's thread does not exist here.
        self._daemon_thread = None

    @property
    def running(self) -> bool:
        """Whether its thread still runs. After a shutdown: its final collection (or that
        collection's export) missed the deadline -- the SDK's shutdown stops waiting for
        it and returns, and it goes on to an exporter already shut down -- or the
        deadline had passed before the provider reached this reader (see :meth:`stop`)."""
        thread = getattr(self, "_daemon_thread", None)
        return thread is not None and thread.is_alive()

    @property
    def exporting(self) -> bool:
        """Whether its exporter is sending now (an otelgpu guarded exporter tells;
        otherwise ``False``)."""
        return bool(getattr(self._exporter, "exporting", False))

    def stop(self) -> None:
        """Shut down now (no wait) if the provider's shutdown never got to this reader:
        its thread runs one last collection and ends."""
        if getattr(self, "_shutdown", True):  # done, or an SDK that keeps no such flag
            return
        try:
            self.shutdown(timeout_millis=0)
        except Exception as exc:  # noqa: BLE001 - called while otelgpu shuts down: never raise
            _logger.debug("otelgpu: metric reader not stopped: %r", exc)

    # ``collect`` is marked final in the SDK (for type checkers only): this override only
    # prepares the storage, then runs the SDK's own collection unchanged.
    def collect(self, timeout_millis: float = 10_000) -> None:  # type: ignore[misc]
        try:
            slice_collection(self)
        except Exception as exc:  # noqa: BLE001 - slicing is an optimisation only
            _logger.debug("otelgpu: metric collection not sliced: %r", exc)
        if threading.current_thread() is getattr(self, "_daemon_thread", None):
            host_work.mark_background()  # the reader's own thread (not a flush's caller)
        # The previous export's tail (sending, writing) and this walk end a slice: the
        # collection starts a fresh one.
        slicing.tick()
        slicing.starting()  # clear of the host's requests and step boundaries
        super().collect(timeout_millis=timeout_millis)


__all__ = ["ForkAwareMetricReader", "slice_collection"]
