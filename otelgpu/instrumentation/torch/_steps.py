"""Training-step detection: turns hook events into step boundaries.

This module imports nothing from torch, so its rules are testable with any event
sequence. The instrumentation hooks (``_patch.py``) feed it; a callback receives one
:class:`StepRecord` per detected step (records and rule names: ``_records.py``; the
anchor rule's window: ``_anchor.py``).

Rules (which one is in force is :attr:`StepTracker.rule`, logged once when it is decided
or changes, and carried by every step span as ``otelgpu.train.step.rule``):

* ``optimizer`` -- a step (one training iteration) ends at the post-hook of the
  **anchor** optimizer: the least frequently stepping optimizer among the last ``window``
  optimizer steps; on a tie, the one that stepped most recently (the generator in a GAN). One
  optimizer: every step. Gradient accumulation: the optimizer steps once per N backward
  calls. GAN (D and G): G anchors. WGAN with ``n_critic=5``: G anchors. Nested optimizers
  (ZeRO wrappers, the inner one fires first): the outer one wins the tie.
* ``step_optimizer`` -- an explicit optimizer (its ``id()``) defines steps.
* ``compiled`` -- the optimizer step is compiled into a ``torch.compile``d function
  (Dynamo runs no global optimizer hook inside a graph): the hooks layer sees the
  optimizer steps traced into the function while it compiles, and each later call of it
  counts as those optimizer steps at the call's end, keyed by the function
  (:meth:`compiled_end`). The anchor rule then applies as above; ``compiled`` is reported
  when the anchor is such a function (a compiled train step: one step per call).
* ``backward`` -- no optimizer hook at all (an optimizer not derived from
  ``torch.optim.Optimizer``, or a compiled step whose compilation could not be seen):
  every outermost backward call ends a step, once ``backward_only_after`` of them came
  without an optimizer step. An optimizer hook switches back to ``optimizer``.
* ``engine`` -- engines that know their own step (DeepSpeed's ``engine.step``) bracket
  their work with :meth:`engine_begin`/:meth:`engine_end`; optimizer hooks inside count.

**Warm-up.** The anchor cannot be known from the first optimizer steps (a WGAN's critic
steps five times before the generator's first step). Until the rule is decided, closed
pieces of work (*segments*: up to an optimizer step, or a backward call while no
optimizer stepped yet) are buffered and nothing is emitted. The rule is decided when the
anchor has stepped twice among at least ``warmup`` optimizer steps (16, or ``window`` if
smaller), after ``backward_only_after`` backward calls without one, or -- with the best
rule known then -- when ``max_segments`` segments or ``max_warmup_ns`` of time are
buffered, and at :meth:`flush`. The buffered segments are then cut into steps by that
rule and emitted with their own times: the first step is right from the first iteration.

Other details:

* Micro-batches are ``torch.autograd.backward`` calls since the previous step.
* A GradScaler-skipped step fires no optimizer hooks; the hooks layer reports it via
  :meth:`StepTracker.optimizer_step` with ``skipped=True``, so it still counts.
* Repeated firings with no work in between (an engine stepping its optimizer once per
  parameter sub-group, several optimizers stepped back to back after one backward) are
  absorbed into the same step: a step's end is therefore *pending* until the next
  backward, data fetch or optimizer step begins (or :meth:`flush`), and the span is
  emitted then, with its original end time.
* Work after the last step that is no step (the final checkpoint save, a closing
  collective) is attached to the last step at :meth:`flush`: its end moves to the end
  of that work. Batches fetched but never trained on are not counted there.
* Samples and tokens come from the batches fetched (or, for loaders that fetch ahead,
  handed to the loop: :meth:`batch_consumed`) during the step, unless given explicitly.

Clock: integer nanoseconds from an injectable ``clock`` (default: ``time.perf_counter_ns``
shifted onto the ``time.time_ns`` epoch once, so values are monotonic *and* comparable
with the GPU sampler's timestamps).

Thread-safety: every method takes one short lock; the callback runs outside it. Costs:
about 1-2 µs per event for the pure twin (:class:`PyStepTracker`); memory bounded by
``max_segments`` and ``window``.

:data:`StepTracker` is the native twin (``src_ext/torch/_steps_c.pyx``: the same rules
with its accumulators as C fields) where it loaded, else :class:`PyStepTracker`. Every
hook of a training step calls the tracker on the training thread, so its cost is paid in
the host's step time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from otelgpu import _impl
from otelgpu.instrumentation.torch._anchor import AnchorWindow
from otelgpu.instrumentation.torch._records import (
    RULE_BACKWARD,
    RULE_COMPILED,
    RULE_ENGINE,
    RULE_OPTIMIZER,
    RULE_STEP_OPTIMIZER,
    RULE_TEXT,
    RULES,
    Accum,
    Clock,
    Records,
    StepRecord,
    add,
    epoch_clock,
)

__all__ = ["RULES", "Clock", "PyStepTracker", "StepRecord", "StepTracker", "epoch_clock"]

_logger = logging.getLogger("otelgpu.torch")

_BACKWARD_MARK = "backward"


class PyStepTracker:
    """Detects step boundaries from hook events and emits :class:`StepRecord`s (the
    pure-Python twin; ``_steps_c.StepTracker`` is the native one, with the same API).

    Args:
        emit: called with each finished step, outside the tracker's lock. Exceptions
            from it go to ``on_error`` (``torch.step``), or without one propagate to the
            caller of the event method.
        clock: ns clock used when an event method gets no explicit time.
        window: number of recent optimizer steps the anchor rule looks at.
        step_optimizer: ``id()`` of the optimizer whose steps define steps (overrides
            the anchor rule), or ``None``.
        backward_only_after: backward calls without any optimizer step after which
            each backward call ends a step.
        warmup: optimizer steps seen before the anchor rule is decided (at most ``window``).
        max_segments: warm-up segments buffered at most before a rule is forced.
        max_warmup_ns: warm-up time (ns) after which a rule is forced (the GPU sampler's
            history must still cover the first steps when they are emitted).
        probe: called (outside the lock) the moment a step or segment closes; its result
            is kept as :attr:`StepRecord.probe` (e.g. allocator statistics at the step's
            end, before the next forward allocates activations). Exceptions: as ``emit``'s.
        flops: called (outside the lock, on the thread that closed it, after ``probe``)
            the moment a *step* closes once the rule is decided -- never for warm-up
            segments; its result is kept as :attr:`StepRecord.flops` when it is a number
            (an ``int`` or ``float``; else None: the FLOP counter of ``_flops.py``
            counts between two calls). Exceptions: as ``emit``'s.
        on_error: receives ``(where, exception)`` of a failing ``emit``, ``probe``
            (``torch.step_probe``) or ``flops`` (``torch.flops``; the step then carries
            none) instead of the caller; must not raise. The session's error sink: the
            callbacks run on the training thread at every step's close, and catching
            here spares each a wrapper's frame.
        deferred: ``emit`` gets each finished step's accumulator instead of its record;
            its ``finish()`` (on any thread, once emitted) builds the same
            :class:`StepRecord`. The step queue's consumer does, off the training thread:
            building a record is the costliest part of a step's close there.

    Attributes:
        flops_calls, flops_table: a lookup that spares the ``flops`` call when both are
            set (the FLOP counter sets them while it only looks figures up): at a step's
            close ``flops_table.get(tuple(flops_calls))`` is the step's FLOPs, and
            ``flops_calls`` is cleared; a miss (or a lookup that raises) calls ``flops``
            as without them, the list left as it was.
    """

    def __init__(
        self,
        emit: Callable[[Any], None],
        *,
        clock: Clock | None = None,
        window: int = 64,
        step_optimizer: int | None = None,
        backward_only_after: int = 32,
        warmup: int = 16,
        max_segments: int = 128,
        max_warmup_ns: int = 60_000_000_000,
        probe: Callable[[], object] | None = None,
        flops: Callable[[], float | None] | None = None,
        on_error: Callable[[str, BaseException], None] | None = None,
        deferred: bool = False,
    ) -> None:
        self._emit = emit
        self._on_error = on_error
        self._deferred = deferred
        self.probe = probe
        self._probe_target: Accum | None = None
        self.flops = flops
        self._flops_target: Accum | None = None
        self.flops_calls: list[Any] | None = None
        self.flops_table: dict[Any, Any] | None = None
        self.clock: Clock = clock if clock is not None else epoch_clock()
        self._lock = threading.Lock()
        self._anchors = AnchorWindow(window)
        self.step_optimizer = step_optimizer
        self._steps = 0
        self._start_ns: int | None = None
        self._acc = Accum()
        self._pending: tuple[int, Accum] | None = None  # (end_ns, accumulators)
        self._segments: list[Accum] = []
        self._rule: str | None = RULE_STEP_OPTIMIZER if step_optimizer is not None else None
        self._announce: str | None = None
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
        self._compiled_keys: set[int] = set()
        self._announced: str | None = None
        self.total_optimizer_steps = 0
        self.compiled_optimizer_steps = 0

    # -- properties -------------------------------------------------------------------

    @property
    def steps(self) -> int:
        """Number of steps emitted so far (the pending one excluded)."""
        return self._steps

    @property
    def rule(self) -> str | None:
        """The step rule in force (one of :data:`RULES`); None while warming up."""
        return self._rule

    @property
    def backward_only(self) -> bool:
        """True while every backward call ends a step (rule ``backward``)."""
        return self._rule == RULE_BACKWARD

    def anchor(self) -> int | None:
        """``id()`` of the optimizer that currently defines step ends, if any."""
        with self._lock:
            return self._anchor_locked()

    # -- event methods (called by the hooks) ------------------------------------------

    def activity(self, now_ns: int | None = None) -> None:
        """Marks training activity (e.g. an optimizer pre-hook): opens the first step."""
        t = self.clock() if now_ns is None else now_ns
        with self._lock:
            if self._start_ns is None:
                self._start_ns = t

    def backward_begin(self, now_ns: int | None = None) -> None:
        """An outermost ``torch.autograd.backward`` call begins: one micro-batch."""
        t = self.clock() if now_ns is None else now_ns
        with self._lock:
            done = self._settle_locked()
            if self._start_ns is None:
                self._start_ns = t
            self._backward_depth += 1
            if self._backward_depth == 1:
                self._acc.micro_batches += 1
                self._backward_seen = True
        self._deliver(done)

    def backward_end(self, now_ns: int | None = None) -> None:
        """The outermost ``torch.autograd.backward`` call returned (or raised)."""
        t = self.clock() if now_ns is None else now_ns
        done: Records = ()
        with self._lock:
            self._backward_depth = max(0, self._backward_depth - 1)
            if self._backward_depth or self.total_optimizer_steps or self._engine_depth:
                return
            self._backwards_without_optimizer += 1
            if self._rule is None:
                self._close_segment_locked(t, _BACKWARD_MARK)
                done = self._try_decide_locked(t)
            elif self._rule == RULE_BACKWARD:
                self._close_locked(t)
        self._deliver(done)
        self._run_probe()

    def optimizer_step(
        self,
        key: int,
        now_ns: int | None = None,
        *,
        skipped: bool = False,
        duration_ns: int = 0,
        count: int = 1,
    ) -> None:
        """An optimizer finished ``step()`` (post-hook), or a scaler skipped it.

        Args:
            key: the optimizer's ``id()``.
            now_ns: end time of the optimizer step.
            skipped: True when GradScaler skipped the update (no hooks fired).
            duration_ns: time spent inside ``optimizer.step`` (0 when unknown).
            count: optimizer steps this firing stands for (a compiled call: several).
        """
        t = self.clock() if now_ns is None else now_ns
        with self._lock:
            self.total_optimizer_steps += count
            if self._start_ns is None and self._pending is None:
                self._start_ns = t - duration_ns
            if self._engine_depth == 0 and self._rule == RULE_BACKWARD:
                self._set_rule_locked(RULE_OPTIMIZER)  # an optimizer hook after all
            if self._absorb_locked(key, t, skipped, duration_ns, count):
                return
            done: Records = self._settle_locked()
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
                    done = (*done, *self._try_decide_locked(t))
                elif self._is_boundary_locked(key):
                    self._close_locked(t)
        self._deliver(done)
        self._run_probe()

    def compiled_begin(self) -> None:
        """An outermost call of a ``torch.compile``d function begins."""
        with self._lock:
            self._compiled_depth += 1
            if self._compiled_depth == 1:
                self._compiled_opt_before = self.total_optimizer_steps

    def compiled_end(
        self, key: int, traced_optimizer_steps: int, now_ns: int | None = None
    ) -> None:
        """That call returned (or raised).

        When optimizer steps were traced into the function (Dynamo runs no optimizer
        hook inside a graph) and no hook fired during the call, the call's end counts
        as those optimizer steps, keyed by the function (rule ``compiled``).

        Args:
            key: ``id()`` of the compiled function.
            traced_optimizer_steps: optimizer steps traced into its graphs; 0 if unknown.
            now_ns: end time.
        """
        t = self.clock() if now_ns is None else now_ns
        with self._lock:
            self._compiled_depth = max(0, self._compiled_depth - 1)
            if (
                self._compiled_depth
                or traced_optimizer_steps <= 0
                or self.total_optimizer_steps != self._compiled_opt_before
            ):
                return
            self._compiled_keys.add(key)
            self.compiled_optimizer_steps += traced_optimizer_steps
        self.optimizer_step(key, t, count=traced_optimizer_steps)

    def engine_begin(self) -> None:
        """An engine's own ``step()`` begins (DeepSpeed): hooks inside only count."""
        with self._lock:
            self._engine_depth += 1
            if self._engine_depth == 1:
                self._engine_posts = 0

    def engine_end(self, stepped: bool | None, now_ns: int | None = None) -> None:
        """The engine's ``step()`` returned.

        Args:
            stepped: whether it completed an update (e.g. its global step counter
                advanced); ``None``: decide from optimizer hooks seen inside.
            now_ns: end time.
        """
        t = self.clock() if now_ns is None else now_ns
        done: Records = ()
        with self._lock:
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
                self._set_rule_locked(RULE_ENGINE)
                done = self._settle_locked()
                self._close_locked(t)
                # The engine knows its boundary: never absorb further firings into it.
                self._absorbing = False
        self._deliver(done)
        self._run_probe()

    def data_wait(
        self,
        start_ns: int,
        end_ns: int,
        samples: int | None = None,
        tokens: int | None = None,
    ) -> None:
        """The loop waited ``end - start`` ns for one batch (``DataLoader.__next__``)."""
        with self._lock:
            done = self._settle_locked()
            if self._start_ns is None:
                self._start_ns = start_ns
            acc = self._acc
            acc.data_ns += end_ns - start_ns
            acc.data_fetches += 1
            acc.inferred_samples = add(acc.inferred_samples, samples)
            acc.inferred_tokens = add(acc.inferred_tokens, tokens)
        self._deliver(done)

    def batch_consumed(self, samples: int | None, tokens: int | None) -> None:
        """A batch was handed to the loop by a loader that fetches ahead (its fetch was
        reported by :meth:`data_wait` without sizes): its samples count now."""
        with self._lock:
            done = self._settle_locked()
            acc = self._acc
            acc.inferred_samples = add(acc.inferred_samples, samples)
            acc.inferred_tokens = add(acc.inferred_tokens, tokens)
        self._deliver(done)

    def loader_startup(self, start_ns: int, end_ns: int) -> None:
        """``iter(DataLoader)`` took ``end - start`` ns (worker start-up, first prefetch)."""
        with self._lock:
            done = self._settle_locked()
            if self._start_ns is None:
                self._start_ns = start_ns
            self._acc.loader_startup_ns += end_ns - start_ns
        self._deliver(done)

    def comm_wait(self, op: str, start_ns: int, end_ns: int) -> None:
        """The host blocked ``end - start`` ns in collective ``op`` (outermost call).

        It belongs to the step in progress; it does not end a pending one, so a closing
        collective after the last step can still be attached to it at :meth:`flush`.
        """
        with self._lock:
            self._absorbing = False
            if self._start_ns is None:
                self._start_ns = start_ns
            acc = self._acc
            d = end_ns - start_ns
            acc.comm_ns += d
            acc.comm_by_op[op] = acc.comm_by_op.get(op, 0) + d
            acc.tail_end_ns = max(acc.tail_end_ns, end_ns)

    def checkpoint(self, start_ns: int, end_ns: int) -> None:
        """A checkpoint save blocked the loop for ``end - start`` ns (see :meth:`comm_wait`)."""
        with self._lock:
            self._absorbing = False
            if self._start_ns is None:
                self._start_ns = start_ns
            self._acc.checkpoint_ns += end_ns - start_ns
            self._acc.tail_end_ns = max(self._acc.tail_end_ns, end_ns)

    def add_batch(self, samples: int | None = None, tokens: int | None = None) -> None:
        """User-given batch size: replaces inferred values for the step in progress."""
        with self._lock:
            acc = self._acc
            acc.explicit_samples = add(acc.explicit_samples, samples)
            acc.explicit_tokens = add(acc.explicit_tokens, tokens)

    def add_event(
        self, name: str, attributes: dict[str, object], now_ns: int | None = None
    ) -> None:
        """Attaches an event (e.g. an OOM) to the step in progress."""
        t = self.clock() if now_ns is None else now_ns
        with self._lock:
            self._acc.events.append((name, t, attributes))
            del self._acc.events[:-16]  # bounded: a storm of events keeps the last 16

    def flush(self) -> None:
        """Emits what is buffered or pending (end of training, uninstrument, exit).

        Decides the rule if still warming up; work after the last step that trained
        nothing (a final checkpoint save) is attached to the last step.
        """
        with self._lock:
            done: Records = ()
            if self._rule is None and self._segments:
                done = self._decide_locked(self._best_rule_locked())
            pending = self._pending
            tail = self._acc
            if pending is not None and not tail.trains and tail.tail_end_ns > pending[0]:
                # Fetched batches never trained on are not the last step's samples.
                tail.inferred_samples = tail.inferred_tokens = None
                acc = pending[1]
                events = acc.events + tail.events
                tail.events = []
                acc.absorb_earlier(tail)  # sums; ``acc`` keeps its probe (taken at its end)
                acc.events = events[-16:]
                self._pending = (tail.tail_end_ns, acc)
                self._acc = Accum()
            done = (*done, *self._settle_locked())
        self._deliver(done)

    # -- internals (lock held) ---------------------------------------------------------

    def _absorb_locked(self, key: int, t: int, skipped: bool, duration_ns: int, count: int) -> bool:
        """A repeated firing with no work since the last close joins that close."""
        if not (self._absorbing and self._backward_seen and self._engine_depth == 0):
            return False
        if self._pending is not None:
            acc = self._pending[1]
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
            self._pending = (t, acc)
        return True

    def _anchor_locked(self) -> int | None:
        if self.step_optimizer is not None:
            return self.step_optimizer
        return self._anchors.anchor()

    def _is_boundary_locked(self, key: int) -> bool:
        if self.step_optimizer is not None:
            return key == self.step_optimizer
        return self._anchor_locked() == key

    def _set_rule_locked(self, rule: str) -> None:
        self._rule = rule

    def _close_locked(self, end_ns: int) -> None:
        """Ends the step in progress at ``end_ns``; it stays pending until settled."""
        acc = self._acc
        acc.end_ns = end_ns
        self._pending = (end_ns, acc)
        self._probe_target = acc if self.probe is not None else None
        self._flops_target = acc if self.flops is not None else None
        self._acc = Accum()
        # Until the next step's work begins, further optimizer firings belong here.
        self._absorbing = True

    def _close_segment_locked(self, end_ns: int, mark: object) -> None:
        """Warm-up: ends the segment in progress at ``end_ns`` and buffers it."""
        acc = self._acc
        acc.end_ns = end_ns
        acc.marks += (mark,)
        self._segments.append(acc)
        self._probe_target = acc if self.probe is not None else None
        self._acc = Accum()
        self._absorbing = False

    def _best_rule_locked(self) -> str:
        return RULE_OPTIMIZER if self.total_optimizer_steps else RULE_BACKWARD

    def _effective_rule_locked(self) -> str:
        """The rule as reported: ``compiled`` when the anchor is a compiled function."""
        rule = self._rule or ""
        if rule == RULE_OPTIMIZER and self._anchor_locked() in self._compiled_keys:
            return RULE_COMPILED
        return rule

    def _try_decide_locked(self, now_ns: int) -> Records:
        """Warm-up: decides the rule when the evidence suffices (or the buffer is full)."""
        segments = self._segments
        forced = len(segments) >= self._max_segments or (
            self._start_ns is not None and now_ns - self._start_ns >= self._max_warmup_ns
        )
        if self.total_optimizer_steps:
            anchor = self._anchor_locked()
            anchors = self._anchors
            if forced or (
                anchor is not None and anchors.count(anchor) >= 2 and anchors.seen >= self._warmup
            ):
                return self._decide_locked(RULE_OPTIMIZER)
        elif forced or self._backwards_without_optimizer >= self._backward_only_after:
            return self._decide_locked(RULE_BACKWARD)
        return []

    def _decide_locked(self, rule: str) -> list[StepRecord | Accum]:
        """Cuts the buffered segments into steps by ``rule``; returns the finished ones.

        The last step stays pending (it may still absorb firings); work after it joins
        the step in progress.
        """
        self._set_rule_locked(rule)
        anchor = self._anchor_locked()
        boundary: object = ("opt", anchor) if rule == RULE_OPTIMIZER else _BACKWARD_MARK
        done: list[StepRecord | Accum] = []
        absorbing = self._absorbing
        current: Accum | None = None
        for segment in self._segments:
            if current is not None:
                segment.absorb_earlier(current)
            current = segment
            if boundary in segment.marks:
                done.extend(self._settle_locked())
                self._pending = (segment.end_ns, segment)
                current = None
        self._segments.clear()
        if current is not None:
            self._acc.absorb_earlier(current)
        # Firings right after the deciding one (no work since) still join its step.
        self._absorbing = absorbing and current is None
        return done

    def _settle_locked(self) -> Records:
        """Finalises the pending step (called when the next step's work begins)."""
        self._absorbing = False
        if self._pending is None:
            return ()
        end_ns, acc = self._pending
        self._pending = None
        start = self._start_ns if self._start_ns is not None else end_ns
        self._start_ns = end_ns
        self._steps += 1
        rule = self._rule or ""
        if rule == RULE_OPTIMIZER and self._compiled_keys:
            rule = self._effective_rule_locked()
        if rule != self._announced:
            self._announced = self._announce = rule
        if self._deferred:  # the consumer builds the record (``finish()``), off this thread
            acc.settled = (self._steps, start, end_ns, rule)
            return [acc]
        return [acc.record(self._steps, start, end_ns, rule)]

    def _run_probe(self) -> None:
        """Runs the probe for a step or segment that just closed, then the FLOPs source
        for a step that did (lock not held)."""
        probed, self._probe_target = self._probe_target, None
        counted, self._flops_target = self._flops_target, None
        self._fill(probed, self.probe, "probe", "torch.step_probe")
        if counted is not None and self._looked_up(counted):
            return
        self._fill(counted, self.flops, "flops", "torch.flops")

    def _looked_up(self, target: Accum) -> bool:
        """The ``flops_table`` lookup; True on a hit (``target.flops`` set)."""
        calls, table = self.flops_calls, self.flops_table
        if calls is None or table is None or self.flops is None:
            return False
        try:
            value = table.get(tuple(calls))
        except Exception:  # noqa: BLE001 - an unhashable signature: the flops call decides
            return False
        if not isinstance(value, float | int):
            return False
        calls.clear()
        with self._lock:
            target.flops = float(value)
        return True

    def _fill(
        self, target: Accum | None, source: Callable[[], object] | None, name: str, where: str
    ) -> None:
        if target is None or source is None:
            return
        try:
            value = source()
        except Exception as exc:
            if self._on_error is None:
                raise
            self._on_error(where, exc)
            value = None
        if name == "flops" and not isinstance(value, float | int):
            value = None
        with self._lock:
            setattr(target, name, value)

    def _deliver(self, records: Records) -> None:
        if not records:
            return
        announce = self._announce
        if announce is not None:
            self._announce = None
            _logger.info("otelgpu torch: training steps end %s", RULE_TEXT.get(announce, announce))
        on_error = self._on_error
        for record in records:
            if on_error is None:
                self._emit(record)
                continue
            try:
                self._emit(record)
            except Exception as exc:  # noqa: BLE001 - reported; the next records go on
                on_error("torch.step", exc)


if TYPE_CHECKING:
    StepTracker = PyStepTracker
else:
    _native = _impl.native_module("otelgpu.instrumentation.torch._steps_c")
    StepTracker = _native.StepTracker if _native is not None else PyStepTracker
    if _native is not None:  # the same clock as a C callable (the hooks read it often)
        epoch_clock = _native.epoch_clock
