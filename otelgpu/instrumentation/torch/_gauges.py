"""The torch gauges: step-time shares and jitter, allocator memory, DDP's own timing.

Nothing here runs per step on the training thread: the telemetry thread adds each step
to a bounded ring of the last :data:`RATIO_WINDOW` steps, keeps the latest allocator
snapshot and reads DDP's averages now and then (:data:`DDP_READ_EVERY`); the ratios and
jitter are computed at metric collection, in the gauge callbacks.

Callbacks are bound weakly to their :class:`TorchGauges` (a dropped one reports
nothing) and stay registered after ``uninstrument()`` -- the runtime's final collection
reports the last values -- until the next :class:`TorchGauges` registers
(:meth:`TorchGauges.register` retires the previous one's).

Thread-safety: the ring, the snapshot and the DDP values are guarded by one lock shared
with the collection callbacks.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from otelgpu.instrumentation.torch import _names as N
from otelgpu.instrumentation.torch._memory import MemorySnapshot
from otelgpu.metrics import catalog as C
from otelgpu.metrics.spec import MetricSpec
from otelgpu.runtime.api import RuntimeAPI

__all__ = ["DDP_READ_EVERY", "RATIO_WINDOW", "TorchGauges"]

RATIO_WINDOW = 512
"""Steps the data-wait share, comm-wait share and jitter gauges are computed over."""

DDP_READ_EVERY = 10
"""Read DDP's own timing (``_get_ddp_logging_data``, ~tens of µs) on each of the first
this many steps, then every this many steps (DDP samples its first 10 iterations, then
every 100th)."""

_DDP_KEYS = (
    "avg_backward_comm_time",
    "avg_backward_compute_time",
    "avg_backward_compute_comm_overlap_time",
)

_GAUGES: tuple[tuple[MetricSpec, str, str], ...] = (
    (C.DATA_WAIT_RATIO, "observe_ratio", "data"),
    (C.COMM_WAIT_RATIO, "observe_ratio", "comm"),
    (C.STEP_JITTER, "observe_ratio", "jitter"),
    (C.MEMORY_ALLOCATED, "observe_memory", "allocated_bytes"),
    (C.MEMORY_RESERVED, "observe_memory", "reserved_bytes"),
    (C.MEMORY_PEAK, "observe_memory", "peak_allocated_bytes"),
    (C.DDP_COMM, "observe_ddp", _DDP_KEYS[0]),
    (C.DDP_COMPUTE, "observe_ddp", _DDP_KEYS[1]),
    (C.DDP_OVERLAP, "observe_ddp", _DDP_KEYS[2]),
)
"""Each torch gauge and the :class:`TorchGauges` method (and its argument) observing it."""

ErrorReport = Callable[[str, BaseException], None]


class _Gauge:
    """A gauge callback bound weakly to its TorchGauges."""

    __slots__ = ("_arg", "_method", "_owner")

    def __init__(self, owner: TorchGauges, method: str, arg: str) -> None:
        self._owner = weakref.ref(owner)
        self._method = method
        self._arg = arg

    def __call__(self, _options: CallbackOptions) -> Iterable[Observation]:
        # An uninstrumented owner still reports its final values: ``shutdown()``
        # uninstruments the frameworks before the runtime's final collection.
        owner = self._owner()
        if owner is None or owner.forked:
            return []
        try:
            return getattr(owner, self._method)(self._arg)  # type: ignore[no-any-return]
        except Exception as exc:  # noqa: BLE001 - never raise into the host
            owner.on_collect_error("torch.metrics." + self._method, exc)
            return []


_owner: weakref.ref[TorchGauges] | None = None
_owner_lock = threading.Lock()


def _retire_previous(new: TorchGauges) -> None:
    """Removes the callbacks of the previous (closed) TorchGauges, if another."""
    global _owner
    with _owner_lock:
        previous = _owner() if _owner is not None else None
        _owner = weakref.ref(new)
    if previous is not None and previous is not new:
        previous.remove()


def _quantile(sorted_values: list[int], q: float) -> float:
    """Nearest-rank quantile of a sorted, non-empty list."""
    i = min(len(sorted_values) - 1, max(0, int(q * len(sorted_values) + 0.5) - 1))
    return float(sorted_values[i])


class TorchGauges:
    """The state behind the torch gauges and their callbacks.

    Args:
        ddp_modules: the live DDP modules (filled as they are built) whose timing is read.
        on_collect_error: receives a failing callback's ``(where, exception)``.
        on_ddp_error: receives a failing DDP read's ``(where, exception)``.
    """

    def __init__(
        self,
        ddp_modules: Iterable[Any],
        *,
        on_collect_error: ErrorReport,
        on_ddp_error: ErrorReport,
    ) -> None:
        self._ddp_modules = ddp_modules
        self.on_collect_error = on_collect_error
        self._on_ddp_error = on_ddp_error
        self._lock = threading.Lock()
        self._ring: deque[tuple[int, int, int]] = deque(maxlen=RATIO_WINDOW)
        self._last_memory: MemorySnapshot | None = None
        self._ddp: dict[str, float] = {}
        self._ddp_iteration: dict[int, int] = {}
        self._callbacks: list[tuple[Any, _Gauge]] = []
        #: True in a forked child's copy: the callbacks report nothing.
        self.forked = False

    # ------------------------------------------------------------------ registration

    def register(self, rt: RuntimeAPI) -> None:
        """Adds the callbacks to ``rt``'s observable gauges, replacing earlier ones."""
        self.remove()
        _retire_previous(self)
        self._callbacks = [
            (rt.instrument(spec), _Gauge(self, method, arg)) for spec, method, arg in _GAUGES
        ]
        for observable, callback in self._callbacks:
            observable.add(callback)

    def remove(self) -> None:
        """Removes this object's callbacks (idempotent)."""
        callbacks, self._callbacks = self._callbacks, []
        for observable, callback in callbacks:
            observable.remove(callback)

    # ------------------------------------------------------------------ inputs

    def add_step(self, duration_ns: int, data_wait_ns: int, comm_wait_ns: int) -> None:
        """One finished step into the ratio ring."""
        with self._lock:
            self._ring.append((duration_ns, data_wait_ns, comm_wait_ns))

    def add_steps(self, rows: list[tuple[int, int, int]]) -> None:
        """Finished steps ``(duration, data wait, comm wait)`` (ns), in order, into the
        ratio ring: :meth:`add_step` for each, under one lock."""
        if rows:
            with self._lock:
                self._ring.extend(rows)

    def set_memory(self, snapshot: MemorySnapshot) -> None:
        """The latest allocator snapshot."""
        with self._lock:
            self._last_memory = snapshot

    def read_ddp(self, step: int) -> None:
        """Reads DDP's averages at ``step`` if due (:data:`DDP_READ_EVERY`)."""
        if step > DDP_READ_EVERY and step % DDP_READ_EVERY != 0:
            return
        if not self._ddp_modules:  # no DDP: nothing to copy and walk
            return
        for module in list(self._ddp_modules):
            try:
                data = module._get_ddp_logging_data()
            except Exception as exc:  # noqa: BLE001 - never raise into the host
                self._on_ddp_error("torch.ddp.logging_data", exc)
                continue
            iteration = data.get("iteration")
            if not isinstance(iteration, int) or self._ddp_iteration.get(id(module)) == iteration:
                continue
            self._ddp_iteration[id(module)] = iteration
            with self._lock:
                for key in _DDP_KEYS:
                    value = data.get(key)
                    if isinstance(value, int | float) and value > 0:
                        self._ddp[key] = value / 1e9

    # ------------------------------------------------------------------ outputs

    def ratios(self) -> tuple[float, float, float] | None:
        """(data-wait share, comm-wait share, p99/p50 of step time) over the ring."""
        with self._lock:
            ring = list(self._ring)
        total = sum(r[0] for r in ring)
        if not ring or total <= 0:
            return None
        durations = sorted(r[0] for r in ring)
        p50 = _quantile(durations, 0.5)
        jitter = _quantile(durations, 0.99) / p50 if p50 > 0 else float("nan")
        return (
            sum(r[1] for r in ring) / total,
            sum(r[2] for r in ring) / total,
            jitter,
        )

    def observe_ratio(self, which: str) -> list[Observation]:
        """Gauge callback body: ``data``/``comm`` share or step ``jitter``."""
        r = self.ratios()
        if r is None:
            return []
        value = {"data": r[0], "comm": r[1], "jitter": r[2]}[which]
        return [] if value != value else [Observation(value)]  # NaN: no point

    def observe_memory(self, field: str) -> list[Observation]:
        """Gauge callback body: one allocator field of the latest snapshot."""
        snap = self._last_memory
        if snap is None:
            return []
        return [Observation(getattr(snap, field), {N.ATTR_DEVICE: snap.device})]

    def observe_ddp(self, key: str) -> list[Observation]:
        """Gauge callback body: DDP's latest average (s)."""
        value = self._ddp.get(key)
        return [] if value is None else [Observation(value)]
