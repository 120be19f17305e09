"""Model FLOPs per training step with zero code: torch's FLOP counter on one early step.

:class:`FlopsCounter` is the step tracker's ``flops`` source: the tracker calls
:meth:`FlopsCounter.step_closed` on the training thread each time a step closes once the
step rule is decided (never during warm-up), and keeps the figure it returns as the
closed step's ``flops`` (``otelgpu.train.flops`` / ``otelgpu.train.mfu`` with the peak
table of ``otelgpu.gpu_truth.peaks``). Between two closes it runs in three phases:

1. **Discover** (the first step after warm-up): global module forward hooks note the
   modules called outermost on the training thread (the model, the loss module; at
   most :data:`MAX_ROOTS`). Each then gets a wrapper of its calls in its
   ``_compiled_call_impl`` slot (:mod:`~._call_slot`, chained with the step phases'
   timing; an instance forward pre-hook where torch has no such slot, which puts every
   call of the root on torch's slow path) that records the shapes and dtypes of its
   inputs: the step's *shape signature* (all micro-batches, at most :data:`MAX_CALLS`
   calls). No roots found: the signature is empty, i.e. constant. A wrapper dropped by a
   replacement of the slot (``module.compile()``) is put back at the first step whose
   signature then misses.
2. **Count** (the next step): ``torch.utils.flop_counter.FlopCounterMode`` is entered at
   that step's start (the close of the previous one) and left at its close, so it counts
   forward and backward of every micro-batch of gradient accumulation (2·m·n·k per
   matmul; optimizer updates are no matmuls and count nothing). The figure is cached by
   the step's signature. The counted step itself carries no FLOPs: its duration includes
   the counter's overhead (a Python dispatch per op and per module call -- on CPU about
   1.5-3x a plain step, measured in ``docs/gpu-truth.md``), so its MFU would be low.
3. **Watch** (every later step): the step's signature selects the cached figure. The
   tracker looks it up itself (:meth:`FlopsCounter.attach`: its ``flops_calls`` and
   ``flops_table``, in C for the native tracker) and calls :meth:`~FlopsCounter.step_closed`
   only when it misses. The
   figures are kept per model for the whole process: a later ``instrument()`` over the
   same model goes from discovery straight to watching (no step is counted again). A step
   whose signature was never counted (a new sequence length, a new batch size) carries
   no FLOPs and the next step is counted again, at most :data:`MAX_MEASURES` signatures
   in all; then counting stops for good and that is logged once (steps of uncounted
   shapes keep carrying none -- never a wrong figure).

Never counted, logged once: a ``compiled`` or ``engine`` step rule (DeepSpeed) or any
frame compiled by ``torch.compile`` (running compiled code under a dispatch mode can
recompile it or fall back to eager). Failures -- FlopCounterMode not importable, its
entry or exit raising, a FLOP formula raising inside the step (caught in the counter,
the op's result returned unchanged), the counter no longer the innermost dispatch mode
at the step's close -- are reported once through the sink (``torch.flops``, logged and
counted by the runtime) and switch counting off; the figure of that step is discarded.

Thread-safety: phases change on the training thread (the tracker's close); the hooks
run on whatever thread calls the modules and only append to a bounded list. A counter
entered on one thread is only ever left on that thread (dispatch modes are
thread-local); at :meth:`undo` on another thread it is left in place and reported.
"""

from __future__ import annotations

import logging
import sys
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any

from otelgpu.gpu_truth.flops import shape_signature
from otelgpu.instrumentation.torch import _call_slot as call_slot
from otelgpu.instrumentation.torch._gate import GATE
from otelgpu.instrumentation.torch._patch import Sink

__all__ = ["MAX_CALLS", "MAX_MEASURES", "MAX_ROOTS", "FlopsCounter"]

_logger = logging.getLogger("otelgpu.torch")

MAX_ROOTS = 4
"""Outermost modules whose inputs make the shape signature."""

MAX_CALLS = 64
"""Root-module calls per step kept in the signature (micro-batches beyond: ignored)."""

MAX_MEASURES = 8
"""Distinct shape signatures counted at most; then counting stops (logged once)."""

_WHERE = "torch.flops"
_START, _DISCOVER, _COUNT, _WATCH, _OFF = "start", "discover", "count", "watch", "off"
_UNCOUNTED_RULES = frozenset({"compiled", "engine"})

_COUNTED: weakref.WeakKeyDictionary[Any, dict[Hashable, int]] = weakref.WeakKeyDictionary()
"""Figures already counted in this process, per first root module (the model): a later
``instrument()`` over the same model (a notebook re-run, a second ``Trainer.train``)
reuses them instead of counting again. Weak: a model that is gone takes its figures."""


class FlopsCounter:
    """The step tracker's ``flops`` source (see the module docstring).

    Args:
        sink: receives our own failures (``torch.flops``).
        rule: returns the tracker's step rule (counting is refused under ``compiled`` and
            ``engine``).
        max_measures: distinct shape signatures counted at most.
    """

    def __init__(
        self,
        sink: Sink,
        rule: Callable[[], str | None],
        *,
        max_measures: int = MAX_MEASURES,
    ) -> None:
        self._sink = sink
        self._rule = rule
        self.max_measures = max_measures
        self._torch: Any = None
        self.phase = _START
        self.measured = 0
        self.by_signature: dict[Hashable, int] = {}
        self.failure: str | None = None
        self._calls: list[Hashable] = []
        self._roots: dict[int, weakref.ref[Any]] = {}
        self._handles: list[Any] = []
        #: (root, its wrapper) of the roots signed through their call slot
        self._linked: list[tuple[weakref.ref[Any], Callable[..., Any]]] = []
        self._has_slot = False
        self._signing = False  # the slot wrappers record (False: pass-through)
        self._global: list[Any] = []
        self._depth = threading.local()
        self._mode: Any = None
        self._mode_thread = 0
        self._gave_up = False
        self._tracker: Any = None

    def attach(self, tracker: Any) -> None:
        """The step tracker whose ``flops`` this is: while watching, it looks the step's
        signature up itself (its ``flops_calls``/``flops_table``) and calls
        :meth:`step_closed` only on a miss -- no Python call per step."""
        self._tracker = tracker
        self._set_phase(self.phase)

    def _set_phase(self, phase: str) -> None:
        self.phase = phase
        tracker = self._tracker
        if tracker is not None:
            watching = phase == _WATCH
            tracker.flops_table = self.by_signature if watching else None
            tracker.flops_calls = self._calls if watching else None

    # -- extension protocol (Session.extensions) ----------------------------------------

    def install(self, torch: Any) -> None:
        """torch was imported: counting can start at the next step close."""
        self._torch = torch
        self._has_slot = call_slot.has_slot()

    def undo(self) -> None:
        """Hooks off; a counter still entered is left (on its own thread only)."""
        self._remove(self._global)
        self._remove(self._handles)
        self._signing = False
        for ref, call in self._linked:
            module = ref()
            if module is not None:
                call_slot.unlink(module, call)  # not linked: left a pass-through
        self._linked = []
        if self._mode is not None:
            if threading.get_ident() == self._mode_thread:
                self._leave()
            else:
                self._fail("the counted step was in progress on another thread at uninstrument")
        self._set_phase(_OFF)

    # -- the tracker's flops source ----------------------------------------------------

    def step_closed(self) -> float | None:
        """A step closed: its FLOPs (``None``: unknown); moves to the next phase."""
        signature = tuple(self._calls)
        self._calls.clear()
        phase = self.phase
        if phase == _OFF or self._torch is None:
            return None
        if phase == _WATCH:
            flops = self.by_signature.get(signature)
            if flops is not None:
                return float(flops)
            if self._relink():  # a root's slot was replaced: its calls were not signed
                return None
            self._remeasure()
        elif phase == _START:
            if self._usable():
                self._discover_begin()
                self._set_phase(_DISCOVER)
        elif phase == _DISCOVER:
            self._discover_end()
            if self._reuse_counted():
                self._set_phase(_WATCH)
            else:
                self._count_next()
        else:  # _COUNT; the counted step's own duration includes the counter's overhead
            counted = self._leave()
            if counted is not None:
                self.by_signature[signature] = counted
                self.measured += 1
                self._set_phase(_WATCH)
        return None

    # -- phases ------------------------------------------------------------------------

    def _usable(self) -> bool:
        """False (logged once, hooks off) where counting is refused."""
        rule = self._rule()
        reason = None
        if rule in _UNCOUNTED_RULES:
            reason = f"step rule {rule!r}"
        else:
            dynamo = sys.modules.get("torch._dynamo.utils")
            counters = getattr(dynamo, "counters", None)
            if counters is not None and counters["frames"].get("ok", 0):
                reason = "torch.compile'd code runs (a dispatch mode would recompile it)"
        if reason is None:
            return True
        _logger.info(
            "otelgpu torch: model FLOPs not counted: %s; set OTELGPU_TORCH_FLOPS_PER_STEP "
            "to give them",
            reason,
        )
        self.failure = reason
        self.undo()
        return False

    def _reuse_counted(self) -> bool:
        """Share the process-wide figures of the discovered model (``_COUNTED``); True if
        an earlier instrumentation counted it already (then no step is counted now)."""
        ref = next(iter(self._roots.values()), None)
        model = None if ref is None else ref()
        if model is None:
            return False
        try:
            self.by_signature = _COUNTED.setdefault(model, self.by_signature)
        except TypeError:  # not weakly referenceable: keep this instance's own figures
            return False
        return bool(self.by_signature)

    def _count_next(self) -> None:
        """Enters the FLOP counter at the start of the next step."""
        if not self._usable():
            return
        try:
            from torch.utils.flop_counter import FlopCounterMode

            mode = _safe_counter_class(FlopCounterMode)(display=False)
            mode.__enter__()
        except Exception as exc:  # noqa: BLE001 - never raise into the host
            self._fail(f"FlopCounterMode could not start: {exc!r}", exc)
            return
        self._mode = mode
        self._mode_thread = threading.get_ident()
        self._set_phase(_COUNT)

    def _leave(self) -> int | None:
        """Leaves the counter at the counted step's close: its FLOPs, or None on failure."""
        mode, self._mode = self._mode, None
        if mode is None:
            return None
        try:
            from torch.utils._python_dispatch import _get_current_dispatch_mode

            if _get_current_dispatch_mode() is not getattr(mode, "mode", mode):
                # Another dispatch mode entered inside the step is still open: leaving
                # ours would pop that one instead.
                self._mode = mode
                self._fail("another torch dispatch mode was still open at the step's end")
                return None
            mode.__exit__(None, None, None)
        except Exception as exc:  # noqa: BLE001 - never raise into the host
            self._fail(f"FlopCounterMode could not stop: {exc!r}", exc)
            return None
        error = getattr(mode, "otelgpu_error", None)
        if error is not None:
            self._fail(f"a FLOP formula failed: {error!r}", error)
            return None
        return int(mode.get_total_flops())

    def _remeasure(self) -> None:
        """A step of a signature never counted: count the next one (bounded)."""
        if self.measured < self.max_measures:
            self._count_next()
            return
        if not self._gave_up:
            self._gave_up = True
            _logger.info(
                "otelgpu torch: input shapes changed after %d FLOP counts; steps of other "
                "shapes carry no MFU (set OTELGPU_TORCH_FLOPS_PER_STEP to give the figure)",
                self.measured,
            )

    def _fail(self, reason: str, exc: BaseException | None = None) -> None:
        self.failure = reason
        self._set_phase(_OFF)
        self._sink.error(_WHERE, exc if exc is not None else RuntimeError(reason))

    # -- root discovery and the shape signature ------------------------------------------

    def _discover_begin(self) -> None:
        mm = self._torch.nn.modules.module
        self._global = [
            mm.register_module_forward_pre_hook(self._global_pre),
            mm.register_module_forward_hook(self._global_post, always_call=True),
        ]

    def _discover_end(self) -> None:
        self._remove(self._global)
        self._signing = True
        for ref in self._roots.values():
            module = ref()
            if module is None:
                continue
            if self._has_slot:
                self._linked.append((ref, call_slot.link(module, self._signed_call(ref))))
            else:
                self._handles.append(
                    module.register_forward_pre_hook(self._root_pre, with_kwargs=True)
                )

    def _relink(self) -> bool:
        """Wraps again the roots whose slot was replaced since; True if there was one."""
        found = False
        for i, (ref, call) in enumerate(self._linked):
            module = ref()
            if module is not None and not call_slot.linked(module, call):
                self._linked[i] = (ref, call_slot.link(module, self._signed_call(ref)))
                found = True
        return found

    def _signed_call(self, ref: weakref.ref[Any]) -> Callable[[call_slot.Box], Any]:
        """The slot wrapper of root ``ref``: its input shapes into the signature (as
        :meth:`_root_pre`), then the call it wraps."""
        calls = self._calls
        tensor = self._torch.Tensor

        def make(box: call_slot.Box) -> Callable[..., Any]:
            def signed_call(*args: Any, **kwargs: Any) -> Any:
                if GATE.on and self._signing and len(calls) < MAX_CALLS:
                    try:
                        if not kwargs and len(args) == 1 and type(args[0]) is tensor:
                            # the usual model(x): one (shape, dtype) pair (not
                            # shape_signature's tuple of pairs: one tuple less per call)
                            x = args[0]
                            calls.append((x.shape, x.dtype))
                        else:
                            calls.append(
                                shape_signature(*args, *kwargs.values())
                                if kwargs
                                else shape_signature(*args)
                            )
                    except Exception as exc:  # noqa: BLE001 - never raise into the host
                        self._fail(f"shape signature failed: {exc!r}", exc)
                inner = box[0]
                if inner is not None:
                    return inner(*args, **kwargs)
                return ref()._call_impl(*args, **kwargs)  # type: ignore[union-attr]

            return signed_call

        return make

    def _global_pre(self, module: Any, args: Any) -> None:
        depth = getattr(self._depth, "n", 0)
        self._depth.n = depth + 1
        if depth == 0 and GATE.on and len(self._roots) < MAX_ROOTS:
            self._roots.setdefault(id(module), weakref.ref(module))

    def _global_post(self, module: Any, args: Any, output: Any) -> None:
        self._depth.n = max(0, getattr(self._depth, "n", 1) - 1)

    def _root_pre(self, module: Any, args: Any, kwargs: Any) -> None:
        if GATE.on and len(self._calls) < MAX_CALLS:
            try:
                self._calls.append(
                    shape_signature(*args, *kwargs.values()) if kwargs else shape_signature(*args)
                )
            except Exception as exc:  # noqa: BLE001 - never raise into the host
                self._fail(f"shape signature failed: {exc!r}", exc)

    @staticmethod
    def _remove(handles: list[Any]) -> None:
        for handle in handles:
            handle.remove()
        handles.clear()


_SAFE: dict[type, type] = {}


def _safe_counter_class(base: type) -> type:
    """``FlopCounterMode`` whose FLOP formulas never raise into the host's step.

    A formula that raises (an op with shapes it does not expect) is remembered as
    ``otelgpu_error`` and the op's result is returned unchanged; the step goes on and
    the figure is discarded when the counter is left.
    """
    cls = _SAFE.get(base)
    if cls is not None:
        return cls

    class SafeFlopCounterMode(base):  # type: ignore[misc]
        otelgpu_error: BaseException | None = None

        def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
            try:
                return super()._count_flops(func_packet, out, args, kwargs)
            except Exception as exc:  # noqa: BLE001 - never raise into the host
                if self.otelgpu_error is None:
                    self.otelgpu_error = exc
                return out

    _SAFE[base] = SafeFlopCounterMode
    return SafeFlopCounterMode
