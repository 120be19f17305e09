"""Training-step detection: turns hook events into step boundaries.

This module imports nothing from torch, so its rules are testable with any event
sequence. The instrumentation hooks (``_hooks.py``) feed it; a callback receives one
:class:`StepRecord` per detected step.

The rule (verified in ``/work/shared/reference/torch.md`` §1.4):

* A *step* (one training iteration) ends at the post-hook of the **anchor** optimizer:
  the least frequently stepping optimizer among the last ``window`` optimizer steps; on a
  tie, the one that stepped most recently. One optimizer: every step. Gradient
  accumulation: the optimizer steps once per N backward calls. GAN (D and G): G anchors.
  WGAN with ``n_critic=5``: G anchors after one transient. Nested optimizers (ZeRO
  wrappers, the inner one fires first): the outer one wins the tie.
* Micro-batches are ``torch.autograd.backward`` calls since the previous step.
* A GradScaler-skipped step fires no optimizer hooks; the hooks layer reports it via
  :meth:`StepTracker.optimizer_step` with ``skipped=True``, so it still counts.
* Repeated firings of the anchor with no backward call in between (an engine stepping its
  optimizer once per parameter sub-group) are absorbed into the same step: a step's end
  is therefore *pending* until the next backward, data fetch, collective or checkpoint
  begins (or :meth:`flush`), and the span is emitted then, with its original end time.
* Engines that know their own step (DeepSpeed's ``engine.step``) bracket their work with
  :meth:`engine_begin`/:meth:`engine_end`; optimizer hooks inside only count.
* Several optimizers stepping back to back after one backward (encoder/decoder
  optimizers, nested wrappers, optimizer-in-backward with one optimizer per parameter)
  are absorbed by the same rule: one step per iteration, ``optimizer_steps`` counts them.
* An explicit ``step_optimizer`` (its ``id()``) overrides the anchor rule.
* No optimizer hook at all after ``backward_only_after`` backward calls (an optimizer
  step compiled inside a ``torch.compile``d train step — Dynamo does not run global
  optimizer hooks there — or an optimizer not derived from ``torch.optim.Optimizer``):
  every backward call ends a step, until an optimizer hook is seen again. The calls
  before the switch form one step.

Clock: integer nanoseconds from an injectable ``clock`` (default: ``time.perf_counter_ns``
shifted onto the ``time.time_ns`` epoch once, so values are monotonic *and* comparable
with the GPU sampler's timestamps).

Thread-safety: every method takes one short lock; the callback runs outside it. Costs:
about 1-2 µs per event in CPython.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Clock", "StepRecord", "StepTracker", "epoch_clock"]

Clock = Callable[[], int]


def epoch_clock() -> Clock:
    """A monotonic nanosecond clock on the ``time.time_ns()`` epoch (offset fixed once)."""
    offset = time.time_ns() - time.perf_counter_ns()
    perf = time.perf_counter_ns

    def now() -> int:
        return perf() + offset

    return now


@dataclass(slots=True)
class StepRecord:
    """One training step (iteration). Times are ns on the tracker's clock.

    ``samples``/``tokens`` are ``None`` when neither inferred from batches nor given.
    ``comm_wait_by_op_ns`` maps a collective name (``all_reduce``) to its host wait.
    """

    step: int
    start_ns: int
    end_ns: int
    optimizer_steps: int = 0
    skipped_optimizer_steps: int = 0
    micro_batches: int = 0
    data_wait_ns: int = 0
    data_fetches: int = 0
    loader_startup_ns: int = 0
    comm_wait_ns: int = 0
    comm_wait_by_op_ns: dict[str, int] = field(default_factory=dict)
    checkpoint_ns: int = 0
    optimizer_ns: int = 0
    samples: int | None = None
    tokens: int | None = None
    events: list[tuple[str, int, dict[str, object]]] = field(default_factory=list)
    probe: object = None

    @property
    def duration_ns(self) -> int:
        """End minus start (ns)."""
        return self.end_ns - self.start_ns

    @property
    def skipped(self) -> bool:
        """True when every optimizer step in this step was skipped (inf/NaN gradients)."""
        return self.optimizer_steps > 0 and self.skipped_optimizer_steps == self.optimizer_steps

    @property
    def compute_ns(self) -> int:
        """Host time not spent waiting for data, collectives or checkpoints (>= 0)."""
        waits = self.data_wait_ns + self.comm_wait_ns + self.checkpoint_ns
        return max(0, self.duration_ns - waits)


class _Accum:
    """Mutable accumulators of the step in progress."""

    __slots__ = (
        "checkpoint_ns",
        "comm_by_op",
        "comm_ns",
        "data_fetches",
        "data_ns",
        "events",
        "explicit_samples",
        "explicit_tokens",
        "inferred_samples",
        "inferred_tokens",
        "loader_startup_ns",
        "micro_batches",
        "optimizer_ns",
        "optimizer_steps",
        "probe",
        "skipped",
    )

    def __init__(self) -> None:
        self.optimizer_steps = 0
        self.skipped = 0
        self.micro_batches = 0
        self.data_ns = 0
        self.data_fetches = 0
        self.loader_startup_ns = 0
        self.comm_ns = 0
        self.comm_by_op: dict[str, int] = {}
        self.checkpoint_ns = 0
        self.optimizer_ns = 0
        self.explicit_samples: int | None = None
        self.explicit_tokens: int | None = None
        self.inferred_samples: int | None = None
        self.inferred_tokens: int | None = None
        self.events: list[tuple[str, int, dict[str, object]]] = []
        self.probe: object = None


def _add(total: int | None, value: int | None) -> int | None:
    if value is None:
        return total
    return value if total is None else total + value


class StepTracker:
    """Detects step boundaries from hook events and emits :class:`StepRecord`s.

    Args:
        emit: called with each finished step, outside the tracker's lock. Exceptions
            from it propagate to the caller of the event method (the hooks layer
            catches and reports them).
        clock: ns clock used when an event method gets no explicit time.
        window: number of recent optimizer steps the anchor rule looks at.
        step_optimizer: ``id()`` of the optimizer whose steps define steps (overrides
            the anchor rule), or ``None``.
        backward_only_after: backward calls without any optimizer step after which
            each backward call ends a step.
        probe: called (outside the lock) the moment a step closes; its result is kept
            as :attr:`StepRecord.probe` (e.g. allocator statistics at the step's end,
            before the next forward allocates activations). Exceptions propagate.
    """

    def __init__(
        self,
        emit: Callable[[StepRecord], None],
        *,
        clock: Clock | None = None,
        window: int = 64,
        step_optimizer: int | None = None,
        backward_only_after: int = 32,
        probe: Callable[[], object] | None = None,
    ) -> None:
        self._emit = emit
        self.probe = probe
        self._probe_due = False
        self.clock: Clock = clock if clock is not None else epoch_clock()
        self._lock = threading.Lock()
        self._window: deque[int] = deque(maxlen=window)
        self._counts: dict[int, int] = {}
        self._last_seen: dict[int, int] = {}
        self._seq = 0
        self.step_optimizer = step_optimizer
        self._steps = 0
        self._start_ns: int | None = None
        self._acc = _Accum()
        self._pending: tuple[int, _Accum] | None = None  # (end_ns, accumulators)
        self._backward_depth = 0
        self._backward_seen = False
        self._pending_absorbs = False
        self._backward_only_after = backward_only_after
        self._backwards_without_optimizer = 0
        self.backward_only = False
        self._engine_depth = 0
        self._engine_posts = 0
        self.total_optimizer_steps = 0

    # -- properties -------------------------------------------------------------------

    @property
    def steps(self) -> int:
        """Number of steps emitted so far (the pending one excluded)."""
        return self._steps

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
        done = None
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
        with self._lock:
            self._backward_depth = max(0, self._backward_depth - 1)
            if self._backward_depth or self.total_optimizer_steps:
                return
            self._backwards_without_optimizer += 1
            if self._backwards_without_optimizer >= self._backward_only_after:
                self.backward_only = True
            if self.backward_only and self._engine_depth == 0:
                self._close_locked(t)
        self._run_probe()

    def optimizer_step(
        self,
        key: int,
        now_ns: int | None = None,
        *,
        skipped: bool = False,
        duration_ns: int = 0,
    ) -> None:
        """An optimizer finished ``step()`` (post-hook), or a scaler skipped it.

        Args:
            key: the optimizer's ``id()``.
            now_ns: end time of the optimizer step.
            skipped: True when GradScaler skipped the update (no hooks fired).
            duration_ns: time spent inside ``optimizer.step`` (0 when unknown).
        """
        t = self.clock() if now_ns is None else now_ns
        with self._lock:
            self.total_optimizer_steps += 1
            self.backward_only = False
            if self._start_ns is None and self._pending is None:
                self._start_ns = t - duration_ns
            pending = self._pending
            if (
                pending is not None
                and self._pending_absorbs
                and self._backward_seen
                and self._engine_depth == 0
            ):
                # A repeated firing with no backward in between: same step.
                acc = pending[1]
                acc.optimizer_steps += 1
                acc.skipped += skipped
                acc.optimizer_ns += duration_ns
                self._pending = (t, acc)
                return
            done = self._settle_locked()
            acc = self._acc
            acc.optimizer_steps += 1
            acc.skipped += skipped
            acc.optimizer_ns += duration_ns
            if self._engine_depth:
                self._engine_posts += 1
            else:
                self._observe_locked(key)
                if self._is_boundary_locked(key):
                    self._close_locked(t)
        self._deliver(done)
        self._run_probe()

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
        with self._lock:
            self._engine_depth = max(0, self._engine_depth - 1)
            if self._engine_depth:
                return
            if stepped is None:
                stepped = self._engine_posts > 0
            if stepped:
                if self._start_ns is None:
                    self._start_ns = t
                self._close_locked(t)
                # The engine knows its boundary: never absorb further firings into it.
                self._pending_absorbs = False
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
            acc.inferred_samples = _add(acc.inferred_samples, samples)
            acc.inferred_tokens = _add(acc.inferred_tokens, tokens)
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
        """The host blocked ``end - start`` ns in collective ``op`` (outermost call)."""
        with self._lock:
            done = self._settle_locked() if self._start_after_pending(start_ns) else None
            if self._start_ns is None:
                self._start_ns = start_ns
            acc = self._acc
            d = end_ns - start_ns
            acc.comm_ns += d
            acc.comm_by_op[op] = acc.comm_by_op.get(op, 0) + d
        self._deliver(done)

    def checkpoint(self, start_ns: int, end_ns: int) -> None:
        """A checkpoint save blocked the loop for ``end - start`` ns."""
        with self._lock:
            done = self._settle_locked() if self._start_after_pending(start_ns) else None
            if self._start_ns is None:
                self._start_ns = start_ns
            self._acc.checkpoint_ns += end_ns - start_ns
        self._deliver(done)

    def add_batch(self, samples: int | None = None, tokens: int | None = None) -> None:
        """User-given batch size: replaces inferred values for the step in progress."""
        with self._lock:
            acc = self._acc
            acc.explicit_samples = _add(acc.explicit_samples, samples)
            acc.explicit_tokens = _add(acc.explicit_tokens, tokens)

    def add_event(
        self, name: str, attributes: dict[str, object], now_ns: int | None = None
    ) -> None:
        """Attaches an event (e.g. an OOM) to the step in progress."""
        t = self.clock() if now_ns is None else now_ns
        with self._lock:
            self._acc.events.append((name, t, attributes))
            del self._acc.events[:-16]  # bounded: a storm of events keeps the last 16

    def flush(self) -> None:
        """Emits the pending step, if any (end of training, uninstrument, exit)."""
        with self._lock:
            done = self._settle_locked()
        self._deliver(done)

    # -- internals (lock held) ---------------------------------------------------------

    def _start_after_pending(self, start_ns: int) -> bool:
        return self._pending is not None and start_ns >= self._pending[0]

    def _observe_locked(self, key: int) -> None:
        window = self._window
        if len(window) == window.maxlen:
            old = window[0]
            c = self._counts[old] - 1
            if c:
                self._counts[old] = c
            else:
                del self._counts[old]
                self._last_seen.pop(old, None)
        window.append(key)
        self._counts[key] = self._counts.get(key, 0) + 1
        self._seq += 1
        self._last_seen[key] = self._seq

    def _anchor_locked(self) -> int | None:
        if self.step_optimizer is not None:
            return self.step_optimizer
        best: int | None = None
        best_rank = (0, 0)
        for key, count in self._counts.items():
            rank = (count, -self._last_seen[key])
            if best is None or rank < best_rank:
                best, best_rank = key, rank
        return best

    def _is_boundary_locked(self, key: int) -> bool:
        if self.step_optimizer is not None:
            return key == self.step_optimizer
        return self._anchor_locked() == key

    def _close_locked(self, end_ns: int) -> None:
        """Ends the step in progress at ``end_ns``; it stays pending until settled."""
        self._pending = (end_ns, self._acc)
        self._probe_due = self.probe is not None
        self._acc = _Accum()
        # Until the next step's work begins, further optimizer firings belong here.
        self._pending_absorbs = True

    def _settle_locked(self) -> StepRecord | None:
        """Finalises the pending step (called when the next step's work begins)."""
        if self._pending is None:
            return None
        end_ns, acc = self._pending
        self._pending = None
        start = self._start_ns if self._start_ns is not None else end_ns
        self._start_ns = end_ns
        self._steps += 1
        samples = acc.explicit_samples if acc.explicit_samples is not None else acc.inferred_samples
        tokens = acc.explicit_tokens if acc.explicit_tokens is not None else acc.inferred_tokens
        return StepRecord(
            step=self._steps,
            start_ns=start,
            end_ns=end_ns,
            optimizer_steps=acc.optimizer_steps,
            skipped_optimizer_steps=acc.skipped,
            micro_batches=acc.micro_batches,
            data_wait_ns=acc.data_ns,
            data_fetches=acc.data_fetches,
            loader_startup_ns=acc.loader_startup_ns,
            comm_wait_ns=acc.comm_ns,
            comm_wait_by_op_ns=acc.comm_by_op,
            checkpoint_ns=acc.checkpoint_ns,
            optimizer_ns=acc.optimizer_ns,
            samples=samples,
            tokens=tokens,
            events=acc.events,
            probe=acc.probe,
        )

    def _run_probe(self) -> None:
        """Runs the probe for a step that just closed (lock not held)."""
        if not self._probe_due or self.probe is None:
            return
        self._probe_due = False
        value = self.probe()
        with self._lock:
            if self._pending is not None:
                self._pending[1].probe = value

    def _deliver(self, record: StepRecord | None) -> None:
        if record is not None:
            self._emit(record)
