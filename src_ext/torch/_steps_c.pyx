# cython: language_level=3
"""Native twin of ``otelgpu.instrumentation.torch._steps.PyStepTracker``.

The same rules, line for line (the rules and their reasons are in ``_steps.py``'s
docstring; keep both in step), with the accumulators and the anchor window as C fields:
every hook of a training step calls into the tracker on the training thread, and the
pure twin's attribute and dict traffic was most of the instrumentation's cost there.

Records are the pure twin's :class:`~otelgpu.instrumentation.torch._records.StepRecord`
(the same Python dataclass); ``emit``, ``probe``, ``flops`` and ``clock`` are Python
callables, called exactly where the twin calls them. Thread-safety: every method takes
one lock (a ``threading.Lock``); the callbacks run outside it.
"""

from cpython.pythread cimport (
    NOWAIT_LOCK,
    WAIT_LOCK,
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_release_lock,
    PyThread_type_lock,
)
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

import logging
import time

from otelgpu.instrumentation.torch._records import (
    RULE_BACKWARD,
    RULE_COMPILED,
    RULE_ENGINE,
    RULE_OPTIMIZER,
    RULE_STEP_OPTIMIZER,
    RULE_TEXT,
    StepRecord,
)

_logger = logging.getLogger("otelgpu.torch")

_BACKWARD_MARK = "backward"


cdef inline long long _monotonic_ns() noexcept nogil:
    """``time.perf_counter_ns()``'s clock on Linux (``CLOCK_MONOTONIC``)."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <long long>ts.tv_sec * 1_000_000_000 + ts.tv_nsec


cdef class EpochClock:
    """The pure twin's ``epoch_clock()`` as a C callable: monotonic nanoseconds on the
    ``time.time_ns()`` epoch (offset fixed once). The hooks read it ~10 times a step."""

    cdef long long offset

    def __cinit__(self):
        self.offset = time.time_ns() - _monotonic_ns()

    def __call__(self):
        return _monotonic_ns() + self.offset


def epoch_clock():
    """A monotonic nanosecond clock on the ``time.time_ns()`` epoch (see :class:`EpochClock`)."""
    return EpochClock()


cdef class _Lock:
    """A non-reentrant lock taken without a Python call; a contended acquire waits with
    the GIL released (another thread may hold the lock while it needs the GIL)."""

    cdef PyThread_type_lock lock

    def __cinit__(self):
        self.lock = PyThread_allocate_lock()
        if self.lock is NULL:
            raise MemoryError("could not allocate the step tracker's lock")

    def __dealloc__(self):
        if self.lock is not NULL:
            PyThread_free_lock(self.lock)

    cdef inline void acquire(self) noexcept:
        if PyThread_acquire_lock(self.lock, NOWAIT_LOCK):
            return
        with nogil:
            PyThread_acquire_lock(self.lock, WAIT_LOCK)

    cdef inline void release(self) noexcept:
        PyThread_release_lock(self.lock)


cdef inline object _add(object total, object value):
    if value is None:
        return total
    return value if total is None else total + value


cdef class Accum:
    """The accumulators of the step (or warm-up segment) in progress (the twin's ``Accum``)."""

    cdef public long long optimizer_steps
    cdef public long long skipped
    cdef public long long micro_batches
    cdef public long long data_ns
    cdef public long long data_fetches
    cdef public long long loader_startup_ns
    cdef public long long comm_ns
    cdef public long long checkpoint_ns
    cdef public long long optimizer_ns
    cdef public long long end_ns
    cdef public long long tail_end_ns
    cdef public dict comm_by_op
    cdef public object explicit_samples
    cdef public object explicit_tokens
    cdef public object inferred_samples
    cdef public object inferred_tokens
    cdef public list events
    cdef public object probe
    cdef public object flops
    cdef public tuple marks
    cdef public tuple settled

    def __cinit__(self):
        self.comm_by_op = {}
        self.events = []
        self.marks = ()

    cdef void absorb_earlier(self, Accum earlier):
        cdef object op
        self.optimizer_steps += earlier.optimizer_steps
        self.skipped += earlier.skipped
        self.micro_batches += earlier.micro_batches
        self.data_ns += earlier.data_ns
        self.data_fetches += earlier.data_fetches
        self.loader_startup_ns += earlier.loader_startup_ns
        self.comm_ns += earlier.comm_ns
        for op, ns in earlier.comm_by_op.items():
            self.comm_by_op[op] = self.comm_by_op.get(op, 0) + ns
        self.checkpoint_ns += earlier.checkpoint_ns
        self.optimizer_ns += earlier.optimizer_ns
        self.explicit_samples = _add(earlier.explicit_samples, self.explicit_samples)
        self.explicit_tokens = _add(earlier.explicit_tokens, self.explicit_tokens)
        self.inferred_samples = _add(earlier.inferred_samples, self.inferred_samples)
        self.inferred_tokens = _add(earlier.inferred_tokens, self.inferred_tokens)
        if earlier.events:
            self.events = (earlier.events + self.events)[-16:]
        if self.probe is None:
            self.probe = earlier.probe
        if self.flops is None:
            self.flops = earlier.flops
        if earlier.end_ns > self.end_ns:
            self.end_ns = earlier.end_ns
        if earlier.tail_end_ns > self.tail_end_ns:
            self.tail_end_ns = earlier.tail_end_ns

    cdef object record(self, long long step, long long start_ns, long long end_ns, str rule):
        samples = self.explicit_samples
        tokens = self.explicit_tokens
        return StepRecord(
            step,
            start_ns,
            end_ns,
            self.optimizer_steps,
            self.skipped,
            self.micro_batches,
            self.data_ns,
            self.data_fetches,
            self.loader_startup_ns,
            self.comm_ns,
            self.comm_by_op,
            self.checkpoint_ns,
            self.optimizer_ns,
            self.inferred_samples if samples is None else samples,
            self.inferred_tokens if tokens is None else tokens,
            self.events,
            self.probe,
            rule,
            self.flops,
        )

    def finish(self):
        """The record of a step its tracker emitted deferred (``settled`` set)."""
        if self.settled is None:
            raise RuntimeError("finish() of a step never settled")
        step, start_ns, end_ns, rule = self.settled
        return self.record(step, start_ns, end_ns, rule)

    @property
    def trains(self):
        """True when this work includes a backward call or an optimizer step."""
        return bool(self.micro_batches or self.optimizer_steps)


cdef class _Anchors:
    """The last ``window`` optimizer steps by optimizer ``id()`` (the twin's ``AnchorWindow``)."""

    cdef list _ring
    cdef Py_ssize_t _head
    cdef Py_ssize_t _size
    cdef Py_ssize_t _window
    cdef dict _counts
    cdef dict _last_seen
    cdef long long _seq

    def __cinit__(self, Py_ssize_t window):
        self._window = window if window > 0 else 1
        self._ring = [None] * self._window
        self._head = 0
        self._size = 0
        self._counts = {}
        self._last_seen = {}
        self._seq = 0

    cdef void observe(self, object key):
        cdef Py_ssize_t slot
        cdef long c
        if self._size == self._window:
            old = self._ring[self._head]
            c = self._counts[old] - 1
            if c:
                self._counts[old] = c
            else:
                del self._counts[old]
                self._last_seen.pop(old, None)
            slot = self._head
            self._head = (self._head + 1) % self._window
        else:
            slot = (self._head + self._size) % self._window
            self._size += 1
        self._ring[slot] = key
        self._counts[key] = self._counts.get(key, 0) + 1
        self._seq += 1
        self._last_seen[key] = self._seq

    cdef object anchor(self):
        cdef object best = None
        cdef long best_count = 0
        cdef long long best_last = 0
        cdef long count
        cdef long long last
        if len(self._counts) == 1:  # one optimizer: the common case
            for key in self._counts:
                return key
        for key, count in self._counts.items():
            last = self._last_seen[key]
            # rank (count, -last): fewest steps, then the latest to step
            if best is None or count < best_count or (count == best_count and last > best_last):
                best, best_count, best_last = key, count, last
        return best

    cdef long count(self, object key):
        return self._counts.get(key, 0)


cdef class StepTracker:
    """Detects step boundaries from hook events and emits step records.

    The native twin of ``_steps.PyStepTracker``: the same arguments, methods and
    attributes (see there).
    """

    cdef dict __dict__  # instance attributes, as the twin allows (tests patch methods)
    cdef object _emit
    cdef object _on_error
    cdef bint _deferred
    cdef public object probe
    cdef public object flops
    cdef public list flops_calls
    cdef public dict flops_table
    cdef public object clock
    cdef public object step_optimizer
    cdef public long long total_optimizer_steps
    cdef public long long compiled_optimizer_steps
    cdef Accum _probe_target
    cdef Accum _flops_target
    cdef _Lock _lock
    cdef _Anchors _anchors
    cdef long long _steps
    cdef object _start_ns
    cdef readonly Accum _acc
    cdef Accum _pending
    cdef long long _pending_end
    cdef list _segments
    cdef object _rule
    cdef object _announce
    cdef long _warmup
    cdef long _max_segments
    cdef long long _max_warmup_ns
    cdef long _backward_depth
    cdef bint _backward_seen
    cdef bint _absorbing
    cdef long _backward_only_after
    cdef long _backwards_without_optimizer
    cdef long _engine_depth
    cdef long _engine_posts
    cdef long _compiled_depth
    cdef long long _compiled_opt_before
    cdef set _compiled_keys
    cdef object _announced

    def __init__(
        self,
        emit,
        *,
        clock=None,
        int window=64,
        step_optimizer=None,
        int backward_only_after=32,
        int warmup=16,
        int max_segments=128,
        long long max_warmup_ns=60_000_000_000,
        probe=None,
        flops=None,
        on_error=None,
        bint deferred=False,
    ):
        self._emit = emit
        self._on_error = on_error
        self._deferred = deferred
        self.probe = probe
        self._probe_target = None
        self.flops = flops
        self._flops_target = None
        self.flops_calls = None
        self.flops_table = None
        self.clock = clock if clock is not None else epoch_clock()
        self._lock = _Lock()
        self._anchors = _Anchors(window)
        self.step_optimizer = step_optimizer
        self._steps = 0
        self._start_ns = None
        self._acc = Accum()
        self._pending = None
        self._pending_end = 0
        self._segments = []
        self._rule = RULE_STEP_OPTIMIZER if step_optimizer is not None else None
        self._announce = None
        self._warmup = max(1, min(warmup, window))
        self._max_segments = max_segments
        self._max_warmup_ns = max_warmup_ns
        self._backward_depth = 0
        self._backward_seen = False
        self._absorbing = False
        self._backward_only_after = backward_only_after
        self._backwards_without_optimizer = 0
        self._engine_depth = 0
        self._engine_posts = 0
        self._compiled_depth = 0
        self._compiled_opt_before = 0
        self._compiled_keys = set()
        self._announced = None
        self.total_optimizer_steps = 0
        self.compiled_optimizer_steps = 0

    # -- properties -------------------------------------------------------------------

    @property
    def steps(self):
        """Number of steps emitted so far (the pending one excluded)."""
        return self._steps

    @property
    def rule(self):
        """The step rule in force; None while warming up."""
        return self._rule

    @property
    def backward_only(self):
        """True while every backward call ends a step (rule ``backward``)."""
        return self._rule == RULE_BACKWARD

    def anchor(self):
        """``id()`` of the optimizer that currently defines step ends, if any."""
        self._lock.acquire()
        try:
            return self._anchor_locked()
        finally:
            self._lock.release()

    # -- event methods ------------------------------------------------------------------

    def activity(self, now_ns=None):
        """Marks training activity (e.g. an optimizer pre-hook): opens the first step."""
        t = self.clock() if now_ns is None else now_ns
        self._lock.acquire()
        try:
            if self._start_ns is None:
                self._start_ns = t
        finally:
            self._lock.release()

    def backward_begin(self, now_ns=None):
        """An outermost ``torch.autograd.backward`` call begins: one micro-batch."""
        cdef list done
        t = self.clock() if now_ns is None else now_ns
        self._lock.acquire()
        try:
            done = self._settle_locked()
            if self._start_ns is None:
                self._start_ns = t
            self._backward_depth += 1
            if self._backward_depth == 1:
                self._acc.micro_batches += 1
                self._backward_seen = True
        finally:
            self._lock.release()
        if done is not None:
            self._deliver(done)

    def backward_end(self, now_ns=None):
        """The outermost ``torch.autograd.backward`` call returned (or raised)."""
        cdef list done = None
        t = self.clock() if now_ns is None else now_ns
        self._lock.acquire()
        try:
            self._backward_depth = max(0, self._backward_depth - 1)
            if self._backward_depth or self.total_optimizer_steps or self._engine_depth:
                return
            self._backwards_without_optimizer += 1
            if self._rule is None:
                self._close_segment_locked(t, _BACKWARD_MARK)
                done = self._try_decide_locked(t)
            elif self._rule == RULE_BACKWARD:
                self._close_locked(t)
        finally:
            self._lock.release()
        self._close_done(done)

    def optimizer_step(
        self, key, now_ns=None, *, skipped=False, long long duration_ns=0, long long count=1
    ):
        """An optimizer finished ``step()`` (post-hook), or a scaler skipped it."""
        cdef list done
        cdef list decided
        cdef Accum acc
        t = self.clock() if now_ns is None else now_ns
        self._lock.acquire()
        try:
            self.total_optimizer_steps += count
            if self._start_ns is None and self._pending is None:
                self._start_ns = t - duration_ns
            if self._engine_depth == 0 and self._rule == RULE_BACKWARD:
                self._rule = RULE_OPTIMIZER  # an optimizer hook after all
            if self._absorb_locked(key, t, skipped, duration_ns, count):
                return
            done = self._settle_locked()
            acc = self._acc
            acc.optimizer_steps += count
            acc.skipped += skipped
            acc.optimizer_ns += duration_ns
            if self._engine_depth:
                self._engine_posts += 1
            else:
                self._anchors.observe(key)
                if self._rule is None:
                    self._close_segment_locked(t, ("opt", key))
                    self._absorbing = True
                    decided = self._try_decide_locked(t)
                    if decided is not None:
                        done = decided if done is None else done + decided
                elif self._is_boundary_locked(key):
                    self._close_locked(t)
        finally:
            self._lock.release()
        self._close_done(done)

    def compiled_begin(self):
        """An outermost call of a ``torch.compile``d function begins."""
        self._lock.acquire()
        try:
            self._compiled_depth += 1
            if self._compiled_depth == 1:
                self._compiled_opt_before = self.total_optimizer_steps
        finally:
            self._lock.release()

    def compiled_end(self, key, long long traced_optimizer_steps, now_ns=None):
        """That call returned (or raised); see the twin."""
        t = self.clock() if now_ns is None else now_ns
        self._lock.acquire()
        try:
            self._compiled_depth = max(0, self._compiled_depth - 1)
            if (
                self._compiled_depth
                or traced_optimizer_steps <= 0
                or self.total_optimizer_steps != self._compiled_opt_before
            ):
                return
            self._compiled_keys.add(key)
            self.compiled_optimizer_steps += traced_optimizer_steps
        finally:
            self._lock.release()
        self.optimizer_step(key, t, count=traced_optimizer_steps)

    def engine_begin(self):
        """An engine's own ``step()`` begins (DeepSpeed): hooks inside only count."""
        self._lock.acquire()
        try:
            self._engine_depth += 1
            if self._engine_depth == 1:
                self._engine_posts = 0
        finally:
            self._lock.release()

    def engine_end(self, stepped, now_ns=None):
        """The engine's ``step()`` returned; see the twin."""
        cdef list done = None
        cdef Accum segment
        t = self.clock() if now_ns is None else now_ns
        self._lock.acquire()
        try:
            self._engine_depth = max(0, self._engine_depth - 1)
            if self._engine_depth:
                return
            if stepped is None:
                stepped = self._engine_posts > 0
            if stepped:
                if self._start_ns is None:
                    self._start_ns = t
                for segment in reversed(self._segments):  # warm-up work: this step's
                    self._acc.absorb_earlier(segment)
                self._segments.clear()
                self._rule = RULE_ENGINE
                done = self._settle_locked()
                self._close_locked(t)
                # The engine knows its boundary: never absorb further firings into it.
                self._absorbing = False
        finally:
            self._lock.release()
        self._close_done(done)

    def data_wait(self, long long start_ns, long long end_ns, samples=None, tokens=None):
        """The loop waited ``end - start`` ns for one batch (``DataLoader.__next__``)."""
        cdef list done
        cdef Accum acc
        self._lock.acquire()
        try:
            done = self._settle_locked()
            if self._start_ns is None:
                self._start_ns = start_ns
            acc = self._acc
            acc.data_ns += end_ns - start_ns
            acc.data_fetches += 1
            if samples is not None:
                acc.inferred_samples = _add(acc.inferred_samples, samples)
            if tokens is not None:
                acc.inferred_tokens = _add(acc.inferred_tokens, tokens)
        finally:
            self._lock.release()
        if done is not None:
            self._deliver(done)

    def batch_consumed(self, samples, tokens):
        """A batch was handed to the loop by a loader that fetches ahead."""
        cdef list done
        cdef Accum acc
        self._lock.acquire()
        try:
            done = self._settle_locked()
            acc = self._acc
            acc.inferred_samples = _add(acc.inferred_samples, samples)
            acc.inferred_tokens = _add(acc.inferred_tokens, tokens)
        finally:
            self._lock.release()
        if done is not None:
            self._deliver(done)

    def loader_startup(self, long long start_ns, long long end_ns):
        """``iter(DataLoader)`` took ``end - start`` ns (worker start-up, first prefetch)."""
        cdef list done
        self._lock.acquire()
        try:
            done = self._settle_locked()
            if self._start_ns is None:
                self._start_ns = start_ns
            self._acc.loader_startup_ns += end_ns - start_ns
        finally:
            self._lock.release()
        if done is not None:
            self._deliver(done)

    def comm_wait(self, op, long long start_ns, long long end_ns):
        """The host blocked ``end - start`` ns in collective ``op`` (outermost call)."""
        cdef Accum acc
        cdef long long d
        self._lock.acquire()
        try:
            self._absorbing = False
            if self._start_ns is None:
                self._start_ns = start_ns
            acc = self._acc
            d = end_ns - start_ns
            acc.comm_ns += d
            acc.comm_by_op[op] = acc.comm_by_op.get(op, 0) + d
            if end_ns > acc.tail_end_ns:
                acc.tail_end_ns = end_ns
        finally:
            self._lock.release()

    def checkpoint(self, long long start_ns, long long end_ns):
        """A checkpoint save blocked the loop for ``end - start`` ns."""
        self._lock.acquire()
        try:
            self._absorbing = False
            if self._start_ns is None:
                self._start_ns = start_ns
            self._acc.checkpoint_ns += end_ns - start_ns
            if end_ns > self._acc.tail_end_ns:
                self._acc.tail_end_ns = end_ns
        finally:
            self._lock.release()

    def add_batch(self, samples=None, tokens=None):
        """User-given batch size: replaces inferred values for the step in progress."""
        cdef Accum acc
        self._lock.acquire()
        try:
            acc = self._acc
            acc.explicit_samples = _add(acc.explicit_samples, samples)
            acc.explicit_tokens = _add(acc.explicit_tokens, tokens)
        finally:
            self._lock.release()

    def add_event(self, name, attributes, now_ns=None):
        """Attaches an event (e.g. an OOM) to the step in progress."""
        t = self.clock() if now_ns is None else now_ns
        self._lock.acquire()
        try:
            self._acc.events.append((name, t, attributes))
            del self._acc.events[:-16]  # bounded: a storm of events keeps the last 16
        finally:
            self._lock.release()

    def flush(self):
        """Emits what is buffered or pending (end of training, uninstrument, exit)."""
        cdef list done = None
        cdef list settled
        cdef Accum tail
        cdef Accum acc
        self._lock.acquire()
        try:
            if self._rule is None and self._segments:
                done = self._decide_locked(self._best_rule_locked())
            tail = self._acc
            if (
                self._pending is not None
                and not (tail.micro_batches or tail.optimizer_steps)
                and tail.tail_end_ns > self._pending_end
            ):
                # Fetched batches never trained on are not the last step's samples.
                tail.inferred_samples = tail.inferred_tokens = None
                acc = self._pending
                events = acc.events + tail.events
                tail.events = []
                acc.absorb_earlier(tail)  # sums; ``acc`` keeps its probe (taken at its end)
                acc.events = events[-16:]
                self._pending_end = tail.tail_end_ns
                self._acc = Accum()
            settled = self._settle_locked()
            if settled is not None:
                done = settled if done is None else done + settled
        finally:
            self._lock.release()
        if done is not None:
            self._deliver(done)

    # -- internals (lock held) -----------------------------------------------------------

    cdef bint _absorb_locked(self, key, t, skipped, long long duration_ns, long long count):
        """A repeated firing with no work since the last close joins that close."""
        cdef Accum acc
        if not (self._absorbing and self._backward_seen and self._engine_depth == 0):
            return False
        if self._pending is not None:
            acc = self._pending
        elif self._rule is None and self._segments:
            acc = self._segments[-1]
        else:
            return False
        acc.optimizer_steps += count
        acc.skipped += skipped
        acc.optimizer_ns += duration_ns
        acc.marks += (("opt", key),)
        acc.end_ns = t
        if self._pending is not None:
            self._pending_end = t
        return True

    cdef object _anchor_locked(self):
        if self.step_optimizer is not None:
            return self.step_optimizer
        return self._anchors.anchor()

    cdef bint _is_boundary_locked(self, key):
        if self.step_optimizer is not None:
            return key == self.step_optimizer
        return self._anchor_locked() == key

    cdef void _close_locked(self, end_ns):
        """Ends the step in progress at ``end_ns``; it stays pending until settled."""
        cdef Accum acc = self._acc
        acc.end_ns = end_ns
        self._pending = acc
        self._pending_end = end_ns
        self._probe_target = acc if self.probe is not None else None
        self._flops_target = acc if self.flops is not None else None
        self._acc = Accum()
        # Until the next step's work begins, further optimizer firings belong here.
        self._absorbing = True

    cdef void _close_segment_locked(self, end_ns, mark):
        """Warm-up: ends the segment in progress at ``end_ns`` and buffers it."""
        cdef Accum acc = self._acc
        acc.end_ns = end_ns
        acc.marks += (mark,)
        self._segments.append(acc)
        self._probe_target = acc if self.probe is not None else None
        self._acc = Accum()
        self._absorbing = False

    cdef str _best_rule_locked(self):
        return RULE_OPTIMIZER if self.total_optimizer_steps else RULE_BACKWARD

    cdef object _effective_rule_locked(self):
        """The rule as reported: ``compiled`` when the anchor is a compiled function."""
        rule = self._rule or ""
        if rule == RULE_OPTIMIZER and self._anchor_locked() in self._compiled_keys:
            return RULE_COMPILED
        return rule

    cdef list _try_decide_locked(self, now_ns):
        """Warm-up: decides the rule when the evidence suffices (or the buffer is full)."""
        cdef bint forced = len(self._segments) >= self._max_segments or (
            self._start_ns is not None and now_ns - self._start_ns >= self._max_warmup_ns
        )
        if self.total_optimizer_steps:
            anchor = self._anchor_locked()
            if forced or (
                anchor is not None
                and self._anchors.count(anchor) >= 2
                and self._anchors._size >= self._warmup
            ):
                return self._decide_locked(RULE_OPTIMIZER)
        elif forced or self._backwards_without_optimizer >= self._backward_only_after:
            return self._decide_locked(RULE_BACKWARD)
        return None

    cdef list _decide_locked(self, str rule):
        """Cuts the buffered segments into steps by ``rule``; returns the finished ones."""
        cdef list done = []
        cdef list settled
        cdef Accum current = None
        cdef Accum segment
        self._rule = rule
        anchor = self._anchor_locked()
        boundary = ("opt", anchor) if rule == RULE_OPTIMIZER else _BACKWARD_MARK
        absorbing = self._absorbing
        for segment in self._segments:
            if current is not None:
                segment.absorb_earlier(current)
            current = segment
            if boundary in segment.marks:
                settled = self._settle_locked()
                if settled is not None:
                    done.extend(settled)
                self._pending = segment
                self._pending_end = segment.end_ns
                current = None
        self._segments.clear()
        if current is not None:
            self._acc.absorb_earlier(current)
        # Firings right after the deciding one (no work since) still join its step.
        self._absorbing = absorbing and current is None
        return done if done else None

    cdef list _settle_locked(self):
        """Finalises the pending step (called when the next step's work begins)."""
        cdef Accum acc
        cdef long long end_ns
        self._absorbing = False
        if self._pending is None:
            return None
        acc = self._pending
        end_ns = self._pending_end
        self._pending = None
        start = self._start_ns if self._start_ns is not None else end_ns
        self._start_ns = end_ns
        self._steps += 1
        rule = self._rule or ""
        if rule == RULE_OPTIMIZER and self._compiled_keys:
            rule = self._effective_rule_locked()
        if rule != self._announced:
            self._announced = self._announce = rule
        if self._deferred:  # the consumer builds the record (finish()), off this thread
            acc.settled = (self._steps, start, end_ns, rule)
            return [acc]
        return [acc.record(self._steps, start, end_ns, rule)]

    cdef void _close_done(self, list done) except *:
        """After an event that may close a step (lock not held): deliver the finished
        records, then run the probe and the FLOPs source for what closed."""
        if done is not None:
            self._deliver(done)
        self._run_probe()

    cdef void _run_probe(self) except *:
        """Runs the probe for a step or segment that just closed, then the FLOPs source
        for a step that did (lock not held)."""
        cdef Accum probed = self._probe_target
        cdef Accum counted = self._flops_target
        self._probe_target = None
        self._flops_target = None
        # (a field assignment cannot raise: no try/finally around these two)
        if probed is not None and self.probe is not None:
            value = self._call(self.probe, "torch.step_probe")
            self._lock.acquire()
            probed.probe = value
            self._lock.release()
        if counted is not None and self.flops is not None:
            if self._looked_up(counted):
                return
            value = self._call(self.flops, "torch.flops")
            if not isinstance(value, (float, int)):
                value = None
            self._lock.acquire()
            counted.flops = value
            self._lock.release()

    cdef bint _looked_up(self, Accum target) except -1:
        """The ``flops_table`` lookup (see the twin); True on a hit (``target.flops`` set)."""
        cdef list calls = self.flops_calls
        cdef dict table = self.flops_table
        if calls is None or table is None:
            return False
        try:
            value = table.get(tuple(calls))
        except Exception:  # an unhashable signature: the flops call decides
            return False
        if not isinstance(value, (float, int)):
            return False
        del calls[:]
        value = float(value)
        self._lock.acquire()
        target.flops = value
        self._lock.release()
        return True

    cdef object _call(self, object source, str where):
        """``source()``; what it raises goes to ``on_error`` (then None), or without one
        to the caller."""
        try:
            return source()
        except Exception as exc:
            if self._on_error is None:
                raise
            self._on_error(where, exc)
            return None

    cdef void _deliver(self, list records) except *:
        announce = self._announce
        if announce is not None:
            self._announce = None
            _logger.info(
                "otelgpu torch: training steps end %s", RULE_TEXT.get(announce, announce)
            )
        on_error = self._on_error
        for record in records:
            if on_error is None:
                self._emit(record)
                continue
            try:
                self._emit(record)
            except Exception as exc:  # reported; the next records go on
                on_error("torch.step", exc)
