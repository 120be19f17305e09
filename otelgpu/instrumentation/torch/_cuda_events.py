"""GPU-side durations from CUDA events, resolved later without blocking.

Host time of an NCCL collective is about its launch time: with ``async_op=False`` the
call returns once the work is enqueued, and the work runs on the GPU afterwards. Here a
pair of ``torch.cuda.Event(enable_timing=True)`` is recorded on the current stream around
each collective on a CUDA tensor (and around ``Work.wait()`` of an ``async_op=True`` one),
and, optionally, one event at each step boundary. Nothing waits for them: the pairs sit
in a bounded FIFO and :meth:`CudaEventTimer.poll` (the telemetry background thread)
resolves those whose end event reports done through the non-blocking ``Event.query()``,
into
``start.elapsed_time(end)``. What a pair measures: when the current stream reached the
collective until it could go on past it — the *exposed* GPU wait, including waiting for
peers (NCCL synchronises the compute stream with its own stream around the call).

Only with the opt-in ``sync`` is ``Event.synchronize()`` called (right after the end
event, blocking the host until the collective finished); nothing in this module ever
calls ``torch.cuda.synchronize()``.

Events are reached through the tiny :class:`TimingEvent` interface (record / query /
elapsed_time / synchronize) made by an :data:`EventFactory`, so the queueing, resolution,
bounding and drop logic runs with any event implementation (tests use a deterministic
double).

Order: events on one stream complete in the order recorded, so :meth:`poll` stops at the
first pending pair that is not done (a cheap scan; pairs recorded on another stream may
wait for an earlier one, never resolve wrongly).

Thread-safety: ``begin``/``end``/``boundary`` run on training threads, ``poll`` on one
background thread; the queues are guarded by one short lock (no CUDA call is made while
holding it, except the non-blocking ``query`` of ``poll``).
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

__all__ = [
    "PENDING_LIMIT",
    "CudaEventTimer",
    "EventFactory",
    "GpuOp",
    "PollResult",
    "Resolved",
    "TimingEvent",
    "find_cuda_tensor",
    "torch_capturing",
    "torch_cuda_ready",
    "torch_event_factory",
]

PENDING_LIMIT = 1024
"""Event pairs (and step-boundary events) waiting to resolve at most; more are dropped
and counted."""

_WORKS_LIMIT = 1024
"""``async_op=True`` works on CUDA tensors remembered until their ``wait()``."""

_TENSOR_KEYS = ("tensor", "output_tensor", "input_tensor", "tensor_list", "output", "input")


class TimingEvent(Protocol):
    """The part of ``torch.cuda.Event(enable_timing=True)`` used here."""

    def record(self) -> None:
        """Enqueues the event on the current stream (asynchronous)."""

    def query(self) -> bool:
        """True when the GPU has passed the event (non-blocking)."""

    def elapsed_time(self, end: Any) -> float:
        """Milliseconds from this event to ``end`` (both must be done)."""

    def synchronize(self) -> None:
        """Blocks the host until the GPU passed the event (opt-in only)."""


EventFactory = Callable[[], TimingEvent]


def torch_event_factory(torch: Any = None) -> EventFactory:
    """Timing CUDA events (recorded on the current device's current stream).

    ``torch`` None: the imported ``torch`` module is looked up at each call (events are
    only made once a CUDA tensor was seen, so torch is imported by then).
    """

    def make() -> TimingEvent:
        module = torch if torch is not None else sys.modules["torch"]
        return module.cuda.Event(enable_timing=True)  # type: ignore[no-any-return]

    return make


def torch_cuda_ready() -> bool:
    """True once the program initialised CUDA (never initialises it itself)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    ready = getattr(getattr(torch, "cuda", None), "is_initialized", None)
    return bool(ready()) if ready is not None else False


def torch_capturing() -> bool:
    """True while the current CUDA stream is being captured into a CUDA graph.

    A timing event recorded during capture would invalidate the user's capture.
    """
    torch = sys.modules.get("torch")
    fn = getattr(getattr(torch, "cuda", None), "is_current_stream_capturing", None)
    return bool(fn()) if fn is not None else False


def _is_cuda(obj: Any) -> bool:
    if isinstance(obj, list | tuple):
        obj = obj[0] if obj else None
    return getattr(obj, "is_cuda", False) is True


def find_cuda_tensor(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """True when a collective's tensor argument (or first tensor of a list) is on CUDA.

    Looks at the first two positional arguments and the usual tensor keywords only: a
    few attribute reads, so the check costs well under a microsecond on CPU tensors.
    """
    for obj in args[:2]:
        if _is_cuda(obj):
            return True
    if kwargs:
        for key in _TENSOR_KEYS:
            if key in kwargs and _is_cuda(kwargs[key]):
                return True
    return False


@dataclass(slots=True)
class GpuOp:
    """One collective whose start event is recorded (returned by ``begin``)."""

    op: str
    host_start_ns: int
    start: TimingEvent


@dataclass(frozen=True, slots=True)
class Resolved:
    """A collective's GPU-side duration (s), with the host time its call began."""

    op: str
    host_start_ns: int
    gpu_s: float


@dataclass
class PollResult:
    """What one :meth:`CudaEventTimer.poll` resolved."""

    ops: list[Resolved] = field(default_factory=list)
    steps: dict[int, float] = field(default_factory=dict)  # step number → GPU time (s)


class CudaEventTimer:
    """Bounded, non-blocking GPU timing of collectives and (optionally) steps.

    Args:
        factory: makes one timing event; called only when a CUDA tensor is seen (or at
            a step boundary with ``steps``).
        sync: opt-in: synchronise on each collective's end event and resolve it at
            once (blocks the training loop until the collective finished).
        comm: time collectives (off: only step boundaries, with ``steps``).
        steps: record one event per step boundary (GPU step time).
        limit: pending pairs/boundaries kept at most; beyond that new ones are dropped
            and counted in :attr:`dropped`.
        cuda_ready: whether the program has initialised CUDA (boundary events are only
            recorded then, so a CPU-only loop never touches CUDA).
        capturing: whether the current stream is being captured into a CUDA graph;
            nothing is recorded then (only asked once a CUDA tensor was seen).
    """

    def __init__(
        self,
        factory: EventFactory,
        *,
        sync: bool = False,
        comm: bool = True,
        steps: bool = False,
        limit: int = PENDING_LIMIT,
        cuda_ready: Callable[[], bool] | None = None,
        capturing: Callable[[], bool] | None = None,
    ) -> None:
        self._factory = factory
        self.sync = sync
        self.comm = comm
        self.steps = steps
        self.limit = limit
        self._cuda_ready = cuda_ready
        self._capturing = capturing
        self._lock = threading.Lock()
        self._pending: deque[tuple[GpuOp, TimingEvent]] = deque()
        self._done: list[Resolved] = []  # resolved synchronously (sync mode)
        self._boundaries: deque[tuple[int, TimingEvent]] = deque()
        self._last_boundary: tuple[int, TimingEvent] | None = None
        self._works: OrderedDict[int, None] = OrderedDict()
        self.dropped = 0
        self.resolved = 0
        # Host start times of the latest dropped pairs: a step with one is incomplete.
        self._dropped_at: deque[int] = deque(maxlen=256)

    # ------------------------------------------------------------ training thread

    def begin(
        self, op: str, host_start_ns: int, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> GpuOp | None:
        """Records the start event when ``op`` runs on a CUDA tensor; else None (no-op).

        For ``wait`` (``Work.wait``), ``args[0]`` is the work: timed only when it came
        from an ``async_op=True`` collective on a CUDA tensor (see :meth:`end`).
        """
        if not self.comm:
            return None
        if op == "wait":
            key = id(args[0]) if args else None
            with self._lock:
                if key is None or key not in self._works:
                    return None
                del self._works[key]
        elif not find_cuda_tensor(args, kwargs):
            return None
        if self._capturing is not None and self._capturing():
            return None
        start = self._factory()
        start.record()
        return GpuOp(op, host_start_ns, start)

    def end(self, mark: GpuOp, result: Any, *, ok: bool = True) -> None:
        """Records the end event and queues the pair (or resolves it, with ``sync``).

        ``result`` is what the collective returned: a work object (``async_op=True``)
        means the GPU work only started, so the pair is discarded and the work's
        ``wait()`` is timed instead. ``ok`` False (the call raised): discarded.
        """
        if not ok:
            return
        if result is not None and callable(getattr(result, "wait", None)):
            with self._lock:
                self._works[id(result)] = None
                while len(self._works) > _WORKS_LIMIT:
                    self._works.popitem(last=False)
            return
        end = self._factory()
        end.record()
        if self.sync:
            end.synchronize()
            gpu_s = mark.start.elapsed_time(end) / 1e3
            with self._lock:
                self._done.append(Resolved(mark.op, mark.host_start_ns, gpu_s))
                if len(self._done) > self.limit:
                    self._dropped_at.append(self._done.pop(0).host_start_ns)
                    self.dropped += 1
            return
        with self._lock:
            if len(self._pending) >= self.limit:
                self._dropped_at.append(mark.host_start_ns)
                self.dropped += 1
                return
            self._pending.append((mark, end))

    def boundary(self, index: int) -> None:
        """Step ``index`` just closed: records its end event (with ``steps``, CUDA up).

        Step *k*'s GPU time is boundary *k-1* → *k*, so the first step has none.
        """
        event = self.step_event()
        if event is not None:
            self.add_boundary(index, event)

    def step_event(self) -> Any:
        """Records a step-end event on the current stream now (None when off or not ready).

        For a step whose number is known only later (the step rule's warm-up): pass it
        to :meth:`add_boundary` then, in step order.
        """
        if not self.steps:
            return None
        if self._cuda_ready is not None and not self._cuda_ready():
            return None
        if self._capturing is not None and self._capturing():
            return None
        event = self._factory()
        event.record()
        return event

    def add_boundary(self, index: int, event: Any) -> None:
        """Step ``index`` ended at ``event`` (from :meth:`step_event`)."""
        with self._lock:
            if len(self._boundaries) >= self.limit:
                self.dropped += 1
                return
            self._boundaries.append((index, event))

    # ------------------------------------------------------------ background thread

    def poll(self) -> PollResult:
        """Resolves every pair and boundary that is done, oldest first; never blocks."""
        out = PollResult()
        with self._lock:
            if self._done:
                out.ops, self._done = self._done, []
            for mark, end in _take_done(self._pending):
                out.ops.append(
                    Resolved(mark.op, mark.host_start_ns, mark.start.elapsed_time(end) / 1e3)
                )
            for index, event in _take_done(self._boundaries):
                last = self._last_boundary
                # A gap (dropped boundary, CUDA not yet up) pairs nothing across it.
                if last is not None and last[0] == index - 1:
                    out.steps[index] = last[1].elapsed_time(event) / 1e3
                self._last_boundary = (index, event)
        self.resolved += len(out.ops) + len(out.steps)
        return out

    def oldest_pending_ns(self) -> int | None:
        """Host start time of the oldest unresolved pair (None when none is pending)."""
        with self._lock:
            return self._pending[0][0].host_start_ns if self._pending else None

    def complete(self, start_ns: int, end_ns: int) -> bool:
        """True when no pair that began in ``[start_ns, end_ns)`` is pending or was dropped."""
        with self._lock:
            if self._pending and self._pending[0][0].host_start_ns < end_ns:
                return False
            return not any(start_ns <= t < end_ns for t in self._dropped_at)

    def take_dropped(self) -> int:
        """Drops counted since the previous call."""
        with self._lock:
            dropped, self.dropped = self.dropped, 0
        return dropped


_K = TypeVar("_K")


def _take_done(queue: deque[tuple[_K, TimingEvent]]) -> Iterator[tuple[_K, TimingEvent]]:
    """Pops the leading entries whose event has completed, oldest first (never blocks:
    ``Event.query()``); stops at the first one still pending on the GPU."""
    while queue and queue[0][1].query():
        yield queue.popleft()
