"""Sampled-out steps held a short while: a GPU health event published late still gets its
step span ("health-event steps are always exported").

The sampler stamps an event when it happened (an XID when it is read, an ECC or throttle
change at its sample) but publishes it a little later (the pure twin at the end of its
round, milliseconds later on a busy host). A step that ended in between was decided by
tail-keeping sampling without the event; if it was sampled out, the event would land on no
span. So each sampled-out step is held here, with what its span needs, for about two
sampling intervals; when the sampler's event count changes, the step recorder
:meth:`HeldSteps.claim`\\ s the held steps whose window holds one of the new events and
exports them after all.

Bounded: at most ``limit`` steps, none kept past ``horizon_ns`` after its end. Steps
leaving unclaimed are counted in ``otelgpu.internal.dropped`` (reason ``tail_sampled``) in
batches of up to 64, and all at :meth:`HeldSteps.release_all` (a flush, the shutdown), so
that counter counts exactly the steps never exported.
Thread-safe (one short lock; the claim walks at most ``limit`` steps and runs only when
new events were published).

A held step is kept as packed bytes when it is the usual one -- no attributes, devices,
name, context, events or failure on its record, no parent but the root, GPU work
attributes that are plain floats -- and as its :class:`HeldStep` otherwise. Why: a loop of
thousands of steps a second holds thousands of steps, and as objects (a record and its
tuple each) the garbage collector traversed every one of them at each young collection,
~1 ms of the GIL in whichever thread allocated (the host's too) several times a second.
Bytes are not tracked by the collector. :meth:`HeldSteps.claim` gives back the same
:class:`HeldStep`, its record rebuilt with what a late span reads.
"""

from __future__ import annotations

import collections
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from opentelemetry.context import Context

from otelgpu.runtime.records import StepRecord

__all__ = ["HeldStep", "HeldSteps"]

DEFAULT_LIMIT = 4096
_REPORT_EVERY = 64  # steps leaving unclaimed are reported in batches (one stats call each)


class HeldStep(NamedTuple):
    """A sampled-out step and what its span needs, computed when it was decided: the step
    number, the checked ``samples`` and ``tokens``, the GPU work attributes (whose
    sketches already counted the step) and the span's ``parent`` (a ``Context``; a live
    span's parent ``SpanContext``; ``None``: a root span). A tuple: built on the hot path."""

    record: StepRecord
    step: int
    samples: float | None
    tokens: float | None
    work: Mapping[str, Any]
    parent: Any


#: The GPU work attributes a packed step carries (``otelgpu.gpu_truth.work``), in order.
WORK_KEYS = (
    "otelgpu.train.energy.per_sample",
    "otelgpu.train.energy.per_token",
    "otelgpu.train.flops",
    "otelgpu.train.mfu",
)
_WORK_INDEX = {key: i for i, key in enumerate(WORK_KEYS)}
#: start_ns, end_ns, step; samples and tokens (a tag: 0 None, 1 int, 2 float; the value);
#: the work attributes present (bit i: WORK_KEYS[i]) and their values.
_PACKED = struct.Struct("<qqqBdBdBdddd")
_INT64 = 1 << 63
_EXACT = 1 << 53  # ints up to this survive a double (the checked counts are below it)
_TIMES = struct.Struct("<qq")


def _tag(value: Any) -> int:
    """A count's tag (module comment at ``_PACKED``), or -1 when it does not pack."""
    if value is None:
        return 0
    kind = type(value)
    if kind is int:
        return 1 if -_EXACT <= value <= _EXACT else -1
    return 2 if kind is float else -1


def _pack(held: HeldStep) -> bytes | None:
    """``held`` as bytes when it is the usual step (module docstring), else ``None``."""
    record = held.record
    if (
        record.attributes is not None
        or record.span_attributes is not None
        or record.devices is not None
        or record.name is not None
        or record.context is not None
        or record.failed is not None
        or record.events
    ):
        return None
    parent = held.parent
    if parent is not None and not (type(parent) is Context and not parent):
        return None  # a parent span: its context is kept as it is
    start, end, step = record.start_ns, record.end_ns, held.step
    if not (
        type(start) is int
        and type(end) is int
        and type(step) is int
        and -_INT64 <= start < _INT64
        and -_INT64 <= end < _INT64
        and -_INT64 <= step < _INT64
    ):
        return None
    samples, tokens = held.samples, held.tokens
    samples_tag, tokens_tag = _tag(samples), _tag(tokens)
    if samples_tag < 0 or tokens_tag < 0:
        return None
    mask = 0
    values = [0.0, 0.0, 0.0, 0.0]
    for key, value in held.work.items():
        i = _WORK_INDEX.get(key)
        if i is None or type(value) is not float:
            return None
        mask |= 1 << i
        values[i] = value
    samples_value = 0 if samples is None else samples  # not ``or 0``: -0.0 stays -0.0
    tokens_value = 0 if tokens is None else tokens
    return _PACKED.pack(
        start, end, step, samples_tag, samples_value, tokens_tag, tokens_value, mask, *values
    )  # fmt: skip


def _count(tag: int, value: float) -> float | None:
    return None if tag == 0 else int(value) if tag == 1 else value


def _unpack(packed: bytes) -> HeldStep:
    """The :class:`HeldStep` of :func:`_pack`'s bytes (its record: what a late span reads)."""
    start, end, step, s_tag, samples, t_tag, tokens, mask, *values = _PACKED.unpack(packed)
    work = {key: values[i] for i, key in enumerate(WORK_KEYS) if mask >> i & 1}
    counts = _count(s_tag, samples), _count(t_tag, tokens)
    record = StepRecord(start, end, step=step, samples=counts[0], tokens=counts[1])
    return HeldStep(record, step, counts[0], counts[1], work, None)


def _times(entry: bytes | HeldStep) -> tuple[int, int]:
    """``(start_ns, end_ns)`` of a held entry, packed or not."""
    if isinstance(entry, bytes):
        start, end = _TIMES.unpack_from(entry)
        return start, end
    record = entry.record
    return record.start_ns, record.end_ns


class HeldSteps:
    """The held sampled-out steps, oldest first (see the module docstring)."""

    def __init__(
        self, horizon_ns: int, on_released: Callable[[int], None], limit: int = DEFAULT_LIMIT
    ) -> None:
        self.horizon_ns = int(horizon_ns)
        self.limit = max(int(limit), 1)
        self._on_released = on_released
        #: held steps, oldest first: packed bytes (the usual step) or a HeldStep
        self._steps: collections.deque[bytes | HeldStep] = collections.deque()
        self._lock = threading.Lock()
        self._unreported = 0  # steps that left and are not yet counted (under the lock)

    def __len__(self) -> int:
        return len(self._steps)

    def hold(self, held: HeldStep) -> None:
        """Hold ``held``; steps past the horizon (measured from its end) or the limit
        leave, counted as never exported. Hot path: an append, and a look at the oldest."""
        released = 0
        oldest_end = held.record.end_ns - self.horizon_ns
        entry = _pack(held) or held
        with self._lock:
            steps = self._steps
            steps.append(entry)
            gone = 0
            while steps and (len(steps) > self.limit or _times(steps[0])[1] < oldest_end):
                steps.popleft()
                gone += 1
            if gone:
                self._unreported += gone
                if self._unreported >= _REPORT_EVERY:
                    released, self._unreported = self._unreported, 0
        if released:
            self._on_released(released)

    def span(self) -> tuple[int, int] | None:
        """``(earliest start, latest end)`` of the held steps (ns); ``None`` when none."""
        with self._lock:
            steps = list(self._steps)
        if not steps:
            return None
        times = [_times(entry) for entry in steps]
        return min(t[0] for t in times), max(t[1] for t in times)

    def claim(self, events: Sequence[Any]) -> list[HeldStep]:
        """Take out and return the held steps whose window ``[start_ns, end_ns]`` holds one
        of ``events`` (``GpuEvent``-like: ``time_ns``, ``uuid``) of their GPUs (a step's
        ``devices``, or any GPU)."""
        found = [(int(e.time_ns), getattr(e, "uuid", None)) for e in events]
        if not found:
            return []
        first = min(t for t, _ in found)
        last = max(t for t, _ in found)
        with self._lock:
            claimed = []
            kept: collections.deque[bytes | HeldStep] = collections.deque()
            for entry in self._steps:
                start, end = _times(entry)
                if end >= first and start <= last:
                    held = _unpack(entry) if type(entry) is bytes else entry
                    if _holds(held.record, found):  # type: ignore[union-attr]
                        claimed.append(held)
                        continue
                kept.append(entry)
            if claimed:
                self._steps = kept
        return claimed  # type: ignore[return-value]

    def release_all(self) -> int:
        """Let every held step go; counts them (and those that left but were not counted
        yet) as never exported. Returns how many were held."""
        with self._lock:
            count = len(self._steps)
            released = count + self._unreported
            self._steps.clear()
            self._unreported = 0
        if released:
            self._on_released(released)
        return count

    def after_fork_in_child(self) -> None:
        """Forget the parent's steps; replace the lock (never acquire it inside ``fork()``)."""
        self._lock = threading.Lock()
        self._steps = collections.deque()
        self._unreported = 0


def _holds(record: StepRecord, events: list[tuple[int, Any]]) -> bool:
    devices = record.devices
    return any(
        record.start_ns <= t <= record.end_ns and (devices is None or uuid in devices)
        for t, uuid in events
    )
