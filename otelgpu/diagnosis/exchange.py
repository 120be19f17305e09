"""The rank exchange: every N steps each rank publishes its window summary and reads all.

It rides on the job's own ``torch.distributed`` key-value store (the rendezvous
``TCPStore`` every process group is built on, so it works across nodes), never on a
collective of the job's process groups and never on a network service of our own:

* **off the training thread**: a daemon thread does ``set`` + ``wait`` + ``multi_get``; the
  training thread and the telemetry thread only hand it a summary (a queue put);
* **no ordering hazard**: a collective issued by a monitoring tool must match the job's
  own collective sequence on every rank; a store key cannot mismatch, a rank that never
  publishes only times the window out (counted; three timeouts in a row end the exchange);
* **bounded**: one key per rank per window under ``otelgpu/diagnosis/``; a rank deletes its
  key of window k-2 once window k-1 is complete (by then every rank has read it).

Cost per window and rank: one ``set`` of ~300 bytes and one ``multi_get`` of the world's
summaries (world size x ~300 bytes), i.e. O(world) bytes per rank and O(world²) at the
store's host per window: fine to a few hundred ranks at the default 50 steps; larger jobs
raise ``exchange_every`` or rely on the Prometheus rules.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import queue
import threading
from collections.abc import Callable
from typing import Protocol

from otelgpu.diagnosis.stragglers import RankSummary

__all__ = ["Exchange", "KeyValueStore", "torch_store"]

_logger = logging.getLogger("otelgpu.diagnosis")

PREFIX = "otelgpu/diagnosis/"
MAX_TIMEOUTS = 3


class KeyValueStore(Protocol):
    """The part of ``torch.distributed.Store`` used here."""

    def set(self, key: str, value: bytes) -> None: ...

    def wait(self, keys: list[str], timeout: datetime.timedelta) -> None: ...

    def multi_get(self, keys: list[str]) -> list[bytes]: ...

    def delete_key(self, key: str) -> bool: ...


def torch_store() -> tuple[KeyValueStore, int, int] | None:
    """(store, rank, world size) of the initialised default process group, else None."""
    import sys

    dist = getattr(sys.modules.get("torch"), "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    world = dist.get_world_size()
    if world < 2:
        return None
    store = dist.distributed_c10d._get_default_store()
    return store, dist.get_rank(), world


class Exchange:
    """Background exchange of :class:`RankSummary` windows.

    Args:
        store, rank, world_size: the transport (see :func:`torch_store`).
        on_window: called on the exchange thread with (window index, all ranks' summaries).
        timeout_s: how long one window waits for the slowest rank.
        on_error: receives our own failures (never raised).
    """

    def __init__(
        self,
        store: KeyValueStore,
        rank: int,
        world_size: int,
        on_window: Callable[[int, list[RankSummary]], None],
        *,
        timeout_s: float = 120.0,
        on_error: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self._on_window = on_window
        self._on_error = on_error
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self._queue: queue.Queue[tuple[int, RankSummary] | None] = queue.Queue(maxsize=4)
        self._thread: threading.Thread | None = None
        self.skipped = 0
        self.timeouts = 0
        self.completed = 0
        self.closed = False

    def submit(self, window: int, summary: RankSummary) -> bool:
        """Hands this rank's summary of ``window`` over (never blocks; False when full/closed)."""
        if self.closed:
            return False
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="otelgpu-diagnosis-exchange", daemon=True
            )
            self._thread.start()
        try:
            self._queue.put_nowait((window, summary))
        except queue.Full:
            self.skipped += 1
            return False
        return True

    def close(self, timeout_s: float = 1.0) -> None:
        """Stops the thread (bounded wait: it may be waiting for another rank)."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _key(self, window: int, rank: int) -> str:
        return f"{PREFIX}{window}/{rank}"

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None or self.closed:
                return
            window, summary = item
            try:
                rows = self.exchange(window, summary)
            except Exception as exc:  # noqa: BLE001 - a store error or timeout: skip the window
                if "timeout" in repr(exc).lower() or "timed out" in repr(exc).lower():
                    self.timeouts += 1
                    if self.timeouts >= MAX_TIMEOUTS:
                        _logger.warning(
                            "otelgpu: rank exchange stopped: %d windows in a row timed out "
                            "(a rank does not publish; is diagnosis off on some ranks?)",
                            self.timeouts,
                        )
                        self.closed = True
                        return
                elif self._on_error is not None:
                    self._on_error("diagnosis.exchange", exc)
                continue
            self.timeouts = 0
            self.completed += 1
            try:
                self._on_window(window, rows)
            except Exception as exc:  # noqa: BLE001 - never raise
                if self._on_error is not None:
                    self._on_error("diagnosis.exchange.window", exc)

    def exchange(self, window: int, summary: RankSummary) -> list[RankSummary]:
        """Publishes, waits for every rank, reads all (blocking; the exchange thread)."""
        store = self.store
        store.set(self._key(window, self.rank), summary.to_bytes())
        keys = [self._key(window, r) for r in range(self.world_size)]
        store.wait(keys, self.timeout)
        raw = store.multi_get(keys)
        if window >= 2:
            with contextlib.suppress(Exception):  # cleanup is best effort
                store.delete_key(self._key(window - 2, self.rank))
        return [RankSummary.from_bytes(bytes(v)) for v in raw]
