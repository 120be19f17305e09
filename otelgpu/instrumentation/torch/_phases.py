"""Forward/backward timing for the step phase breakdown (``otelgpu.diagnosis``).

Zero code: the outermost modules are found by themselves, then timed with instance hooks.

* **Discovery**: global module forward hooks (``register_module_forward_pre_hook`` /
  ``register_module_forward_hook(always_call=True)``) time outermost calls and note the
  modules called at depth 0 on their thread (the model, the DDP/FSDP wrapper, the loss
  module). Global hooks put *every* module call on the slow path (~10 µs each), so they
  stay only until the second ``torch.autograd.backward`` (or 64 outermost calls); then,
  outside any forward, they are removed and each root gets a timed call of its own.
  A root first called later (an evaluation model) counts as ``other``.
* **Timed call of a root**: not instance hooks. A module with any hook leaves torch's fast
  call path (~2.5 µs more per call, CPU time, torch 2.13), and hooks are part of the
  module's state: ``copy.deepcopy(model)`` and ``torch.save(model)`` would have to copy
  or pickle them (they cannot). Instead the root's ``_compiled_call_impl`` (the slot
  ``Module.__call__`` consults first, where ``module.compile()`` puts its compiled call) is
  set to a wrapper that times ``_call_impl`` (or the compiled call already there); torch
  leaves that slot out of the module's pickled and copied state, so copies and saved
  models come out plain. A ``module.compile()`` after discovery replaces the slot; the
  next backward notices and wraps the compiled call (one dict lookup per root per
  backward). Cost: ~0.5 µs per root call. Where the slot does not exist (torch older
  than 2.2) the roots get instance hooks as before.
* **Backward**: the outermost ``torch.autograd.backward`` call per thread
  (``Tensor.backward`` goes through it), timed by the step tracker's own wrapper of it
  (``_patch.autograd_backward``, given these hooks: one wrapper, one pair of clock
  readings for both), which also checks the roots' timed calls before each call.
* **Collectives**: the intervals the collective wrappers report (a tee in front of the
  telemetry sink), so communication inside forward/backward is counted once, as ``comm``.

Intervals go to bounded deques (appended on the training thread, consumed in step order
by the telemetry thread through :meth:`PhaseHooks.take`). No device synchronisation:
these are host times, like every other phase (GPU-side times come from CUDA events when
enabled). Every hook is a pass-through when ``GATE.on`` is False and never raises.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from otelgpu.diagnosis.phases import Interval, phases_of, split_step
from otelgpu.diagnosis.stragglers import COMM_SLOTS
from otelgpu.instrumentation.torch import _call_slot as call_slot
from otelgpu.instrumentation.torch._call_slot import Box
from otelgpu.instrumentation.torch._gate import GATE
from otelgpu.instrumentation.torch._patch import ErrorSink, Sink
from otelgpu.instrumentation.torch._steps import Clock, StepRecord

__all__ = ["PhaseHooks", "TeeSink"]

RING = 4096
"""Intervals kept per kind (forward, backward, collectives) until their step is processed."""

DISCOVERY_BACKWARDS = 2
DISCOVERY_ROOT_CALLS = 64


class _Local(threading.local):
    def __init__(self) -> None:
        self.fwd_depth = 0
        self.fwd_start = 0


def _take(ring: deque[Interval], end_ns: int) -> list[Interval]:
    """Intervals that began before ``end_ns``; those that also ended by then are removed."""
    out: list[Interval] = []
    while ring:
        a, b = ring[0]
        if a >= end_ns:
            break
        out.append((a, b))
        if b > end_ns:
            break  # crosses into the next step: keep it for that one
        ring.popleft()
    return out


def _take_total(ring: deque[Interval], start_ns: int, end_ns: int) -> int:
    """``sum of clip(_take(ring, end_ns), start_ns, end_ns)`` in one pass, no list (the
    common step: no collective to subtract)."""
    got = 0
    while ring:
        a, b = ring[0]
        if a >= end_ns:
            break
        lo = a if a > start_ns else start_ns
        hi = b if b < end_ns else end_ns
        if hi > lo:
            got += hi - lo
        if b > end_ns:
            break  # crosses into the next step: keep it for that one
        ring.popleft()
    return got


class TeeSink:
    """Forwards every measurement to ``inner`` and keeps collective intervals for phases."""

    def __init__(self, inner: Sink, comm: deque[Interval]) -> None:
        self.inner = inner
        self._comm = comm

    def comm(self, op: str, start_ns: int, end_ns: int) -> None:
        self._comm.append((start_ns, end_ns))
        self.inner.comm(op, start_ns, end_ns)

    def checkpoint(self, kind: str, start_ns: int, end_ns: int, size_bytes: int | None) -> None:
        self.inner.checkpoint(kind, start_ns, end_ns, size_bytes)

    def loader_startup(self, start_ns: int, end_ns: int) -> None:
        self.inner.loader_startup(start_ns, end_ns)

    def error(self, where: str, exc: BaseException) -> None:
        self.inner.error(where, exc)


_HAS_SLOT = False
"""Set at install: torch's ``Module`` has the ``_compiled_call_impl`` slot and drops it
from the pickled state (:func:`~._call_slot.has_slot`)."""


class _TimedCall:
    """The timed call of one root, chained in its slot (:mod:`~._call_slot`); restorable."""

    __slots__ = ("__weakref__", "call", "hooks", "module")

    def __init__(self, hooks: PhaseHooks, module: Any) -> None:
        self.hooks = hooks
        self.module = weakref.ref(module)
        self.call: Any = None
        self._wrap(module)

    def _wrap(self, module: Any) -> None:
        ref = self.module
        hooks = self.hooks
        tls, clock, forward = hooks.tls, hooks.clock, hooks.forward

        def make(box: Box) -> Callable[..., Any]:
            def timed_call(*args: Any, **kwargs: Any) -> Any:
                inner = box[0]
                if not GATE.on:
                    target = inner if inner is not None else ref()._call_impl  # type: ignore[union-attr]
                    return target(*args, **kwargs)
                # PhaseHooks._enter/_exit, inlined: every call of the model pays for them
                depth = tls.fwd_depth
                tls.fwd_depth = depth + 1
                if not depth:
                    tls.fwd_start = clock()
                try:
                    if inner is not None:
                        return inner(*args, **kwargs)
                    return ref()._call_impl(*args, **kwargs)  # type: ignore[union-attr]
                finally:
                    depth = tls.fwd_depth
                    if depth > 0:
                        tls.fwd_depth = depth - 1
                        if depth == 1:
                            forward.append((tls.fwd_start, clock()))

            return timed_call

        self.call = call_slot.link(module, make)

    def check(self) -> None:
        module = self.module()
        if module is not None and not call_slot.linked(module, self.call):
            self._wrap(module)  # replaced while we were on: wrap the new call

    def restore(self) -> None:
        module = self.module()
        if module is not None:
            call_slot.unlink(module, self.call)  # not linked: gone, theirs now


class PhaseHooks:
    """Forward/backward/collective intervals of the training loop; see the module docstring.

    Args:
        clock: the step tracker's ns clock (phases must share the steps' clock).
        sink: where our own errors go.
    """

    phases_in_order = True
    """:meth:`take` gives every phase of ``names.PHASES``, in that order (``split_step``)."""

    def __init__(self, clock: Clock, sink: ErrorSink) -> None:
        self.clock = clock
        self.forward: deque[Interval] = deque(maxlen=RING)
        self.backward: deque[Interval] = deque(maxlen=RING)
        self.comm: deque[Interval] = deque(maxlen=RING)
        self._sink = sink
        self.tls = _Local()
        #: ``tls.fwd_start`` when a backward last found the roots' timed calls in place
        self.checked_forward = 0
        self._global: list[Any] = []
        self._instance: list[Any] = []
        self.timed_roots: list[_TimedCall] = []
        self.roots: weakref.WeakSet[Any] = weakref.WeakSet()
        self._pending_roots: list[Any] = []
        self._backwards = 0
        self._root_calls = 0
        self.discovering = False

    def tee(self, inner: Sink) -> TeeSink:
        """The sink to give the hooks: collective intervals are kept here too."""
        return TeeSink(inner, self.comm)

    # ------------------------------------------------------------------ install
    def install(self, torch: Any) -> None:
        """Global discovery hooks and the backward wrapper (torch just imported)."""
        global _HAS_SLOT
        _HAS_SLOT = call_slot.has_slot()
        mm = torch.nn.modules.module
        self._global = [
            mm.register_module_forward_pre_hook(self._global_pre),
            mm.register_module_forward_hook(self._global_post, always_call=True),
        ]
        self.discovering = True

    def undo(self) -> None:
        """Removes every hook and wrapper. Idempotent."""
        for handle in self._global + self._instance:
            with contextlib.suppress(Exception):  # a module gone with its hooks
                handle.remove()
        for timed in self.timed_roots:
            with contextlib.suppress(Exception):  # a module gone, or its slot replaced
                timed.restore()
        self._global, self._instance, self.timed_roots = [], [], []
        self.discovering = False

    # ------------------------------------------------------------------ forward
    def _enter(self) -> None:
        tls = self.tls
        tls.fwd_depth += 1
        if tls.fwd_depth == 1:
            tls.fwd_start = self.clock()

    def _exit(self) -> bool:
        tls = self.tls
        if tls.fwd_depth <= 0:
            return False
        tls.fwd_depth -= 1
        if tls.fwd_depth == 0:
            self.forward.append((tls.fwd_start, self.clock()))
            return True
        return False

    def _global_pre(self, module: Any, args: Any) -> None:
        if not GATE.on:
            return
        try:
            if self.tls.fwd_depth == 0:
                if self._root_calls >= DISCOVERY_ROOT_CALLS:
                    # Pre-hooks run from a snapshot: removing them here is safe (this one
                    # call goes untimed). Never from the post-hook: on an exception torch
                    # iterates the live global dict.
                    self._finish_discovery()
                    return
                if module not in self.roots:
                    self.roots.add(module)
                    self._pending_roots.append(module)
            self._enter()
        except Exception as exc:  # noqa: BLE001 - never raise into the host
            self._sink.error("torch.phases.forward", exc)

    def _global_post(self, module: Any, args: Any, output: Any) -> None:
        if not GATE.on:
            return
        try:
            if self._exit():
                self._root_calls += 1
        except Exception as exc:  # noqa: BLE001 - never raise into the host
            self._sink.error("torch.phases.forward", exc)

    def _root_pre(self, module: Any, args: Any) -> None:
        if GATE.on:
            self._enter()

    def _root_post(self, module: Any, args: Any, output: Any) -> None:
        if GATE.on:
            self._exit()

    def _finish_discovery(self) -> None:
        """Global hooks off, instance hooks on the roots (called outside any forward)."""
        if not self.discovering or self.tls.fwd_depth:
            return
        self.discovering = False
        for handle in self._global:
            handle.remove()
        self._global = []
        for module in self._pending_roots:
            if _HAS_SLOT:
                self.timed_roots.append(_TimedCall(self, module))
                continue
            self._instance.append(module.register_forward_pre_hook(self._root_pre))
            self._instance.append(module.register_forward_hook(self._root_post, always_call=True))
        self._pending_roots = []

    def _check_slots(self) -> None:
        """Re-wraps a root whose slot was replaced (``module.compile()`` after discovery)."""
        for timed in self.timed_roots:
            timed.check()

    # ------------------------------------------------------------------ backward
    # The backward wrapper is the step tracker's (``_patch.autograd_backward`` given
    # these hooks): it appends each outermost call's interval to :attr:`backward` and,
    # before the call, checks the roots (the two methods below, off the common path).

    def recheck_roots(self) -> None:
        """Wraps again a root whose slot was replaced (``module.compile()`` after
        discovery); the backward wrapper calls it when no timed call ran since the last
        backward, or when there are several roots."""
        try:
            self._check_slots()
        except Exception as exc:  # noqa: BLE001 - never raise into the host
            self._sink.error("torch.phases.roots", exc)

    def discovery_backward(self) -> None:
        """A backward during discovery: the ``DISCOVERY_BACKWARDS``-th ends it."""
        self._backwards += 1
        if self._backwards >= DISCOVERY_BACKWARDS:
            try:
                self._finish_discovery()
            except Exception as exc:  # noqa: BLE001 - never raise into the host
                self._sink.error("torch.phases.discovery", exc)

    # ------------------------------------------------------------------ consume
    def take(self, record: StepRecord) -> tuple[dict[str, int], list[int]]:
        """Phases of ``record`` (ns, summing to its duration) and its collective slots.

        Called in step order (the telemetry thread); consumes the intervals it used.
        """
        s, e = record.start_ns, record.end_ns
        ring = self.comm
        comm = (
            [(max(a, s), min(b, e)) for a, b in _take(ring, e) if min(b, e) > max(a, s)]
            if ring
            else []
        )
        if not comm:  # the common step: totals straight from the rings
            fwd, bwd = self.forward, self.backward
            return phases_of(
                e - s,
                record.data_wait_ns,
                _take_total(fwd, s, e) if fwd else 0,
                _take_total(bwd, s, e) if bwd else 0,
                record.optimizer_ns,
                record.comm_wait_ns,
                record.checkpoint_ns,
            ), []
        phases = split_step(
            s,
            e,
            data_ns=record.data_wait_ns,
            comm_ns=record.comm_wait_ns,
            checkpoint_ns=record.checkpoint_ns,
            optimizer_ns=record.optimizer_ns,
            forward=_take(self.forward, e) if self.forward else (),
            backward=_take(self.backward, e) if self.backward else (),
            comm=comm,
        )
        slots = [b - a for a, b in comm[: COMM_SLOTS - 1]]
        if len(comm) >= COMM_SLOTS:
            slots.append(sum(b - a for a, b in comm[COMM_SLOTS - 1 :]))
        return phases, slots
