"""Reversible patches and the wrapper factories installed on torch.

Every wrapper follows the same contract:

* ``GATE.on`` False (not instrumented, or a forked child) → call straight through;
* the wrapped callable is called exactly once with the caller's arguments; its result is
  returned and its exception propagates untouched;
* our own bookkeeping runs in ``try/except Exception`` and failures go to
  ``sink.error(where, exc)`` — nothing of ours ever raises into the training loop;
* re-entrant calls (``all_gather_object`` calling ``all_gather``, DCP calling
  ``torch.save`` once per tensor) are counted once, at the outermost call, per thread.

Factories are named after the callable they wrap, so a traceback names what was wrapped.
This module holds the contract's pieces (:class:`Sink`, :class:`Patches`,
:func:`dynamo_skip`) and the wrappers that detect steps; the wrappers that measure data
loading, collectives and checkpoints are in ``_patch_io``, under the same contract.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

from otelgpu.instrumentation.torch._gate import GATE, TLS
from otelgpu.instrumentation.torch._steps import StepTracker

__all__ = [
    "MISSING",
    "AnyFn",
    "ErrorSink",
    "Patches",
    "Sink",
    "autograd_backward",
    "compiled_function",
    "engine_step",
    "grad_scaler_step",
    "is_compiling_fn",
    "is_dynamo_compiling_fn",
    "optimizer_hooks",
    "torch_compile",
]

MISSING = object()
"""No value (an attribute absent, a call that raised); distinct from None."""
AnyFn = Callable[..., Any]


class ErrorSink(Protocol):
    """Where our own errors go."""

    def error(self, where: str, exc: BaseException) -> None:
        """Our own code failed at ``where``; report once, never raise."""


class Sink(ErrorSink, Protocol):
    """Where per-operation measurements go (the runtime, or a test recorder)."""

    def comm(self, op: str, start_ns: int, end_ns: int) -> None:
        """One outermost collective (or ``Work.wait``) took ``end - start`` ns."""

    def checkpoint(self, kind: str, start_ns: int, end_ns: int, size_bytes: int | None) -> None:
        """One outermost checkpoint save; ``size_bytes`` None when unknown."""

    def loader_startup(self, start_ns: int, end_ns: int) -> None:
        """``iter(DataLoader)`` with workers took ``end - start`` ns."""


class Patches:
    """Undo log of attribute replacements and hook handles.

    ``replace`` remembers the attribute exactly as found in the owner's ``__dict__`` (so
    class attributes inherited from a base are deleted again, not shadowed), and
    ``undo`` restores in reverse order. Not thread-safe: used at (un)instrument time.
    """

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any]] = []
        self._handles: list[Any] = []

    def replace(self, owner: Any, name: str, new: Any) -> None:
        """Sets ``owner.name = new`` and records how to undo it."""
        found = vars(owner).get(name, MISSING) if isinstance(owner, type) else getattr(owner, name)
        setattr(owner, name, new)
        self._undo.append((owner, name, found))

    def wrap(self, owner: Any, name: str, factory: Callable[[AnyFn], AnyFn]) -> bool:
        """Replaces ``owner.name`` by ``factory(original)``; False if it does not exist."""
        original = getattr(owner, name, None)
        if original is None:
            return False
        self.replace(owner, name, factory(original))
        return True

    def handle(self, handle: Any) -> None:
        """Keeps a ``RemovableHandle`` to ``remove()`` on undo."""
        self._handles.append(handle)

    def undo(self) -> None:
        """Restores everything, newest first; safe to call twice."""
        for handle in reversed(self._handles):
            handle.remove()
        self._handles.clear()
        for owner, name, found in reversed(self._undo):
            if found is MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, found)
        self._undo.clear()

    def __len__(self) -> int:
        return len(self._undo) + len(self._handles)


def dynamo_skip(fn: AnyFn) -> AnyFn:
    """Tells Dynamo never to compile ``fn``'s frame, nor frames it calls.

    Our eager wrappers run after a graph break (``loss.backward()`` inside a compiled
    train step); without this Dynamo would try, and fail, to compile them on every
    call. Inlining during a trace is unaffected. Private API: no-op where absent.
    """
    try:
        from torch._C._dynamo import eval_frame as ef

        action = ef._FrameAction.SKIP
        ef.set_code_exec_strategy(fn.__code__, ef._FrameExecStrategy(action, action))
    except Exception:  # noqa: BLE001 -older/newer torch: Dynamo will merely try and skip itself
        pass
    return fn


def is_compiling_fn() -> Callable[[], bool]:
    """``torch.compiler.is_compiling`` (False where this torch has none)."""
    import torch

    compiler = getattr(torch, "compiler", None)
    fn = getattr(compiler, "is_compiling", None)
    return fn if fn is not None else (lambda: False)


def is_dynamo_compiling_fn() -> Callable[[], bool]:
    """``torch.compiler.is_dynamo_compiling`` where this torch has it (one frame at run
    time, where ``is_compiling`` is two: it asks TorchScript first), else
    :func:`is_compiling_fn`'s. For hooks that only Dynamo traces (an optimizer step is
    never scripted, and a non-strict ``torch.export`` of one is no training step)."""
    import torch

    fn = getattr(getattr(torch, "compiler", None), "is_dynamo_compiling", None)
    return fn if fn is not None else is_compiling_fn()


def _comptime() -> Callable[..., Any] | None:
    """Dynamo's ``comptime``: runs a function while Dynamo traces, nothing at run time."""
    try:
        from torch._dynamo.comptime import comptime
    except Exception:  # noqa: BLE001 - no Dynamo: compiled optimizer steps stay unseen
        return None
    return comptime


def _traced_optimizer_step(ctx: Any = None) -> None:
    """Dynamo is tracing an optimizer step into the graph of the current compiled call."""
    frame = TLS.compiled
    if frame is not None:
        frame.traced += 1


# --------------------------------------------------------------------------- steps


def optimizer_hooks(
    tracker: StepTracker, sink: Sink, names: dict[int, str]
) -> tuple[Callable[[Any, Any, Any], None], Callable[[Any, Any, Any], None]]:
    """Global optimizer step (pre, post) hooks feeding ``tracker``.

    Under Dynamo tracing they return at once: Python side effects in a traced hook
    would be guarded on and recompile every call. The post-hook
    first notes, at trace time only (``comptime``), that an optimizer step is being
    compiled into the graph of the current compiled call (:func:`compiled_function`).
    """
    clock = tracker.clock
    is_compiling = is_dynamo_compiling_fn()
    comptime = _comptime()
    # Start times by optimizer id() (a dict item: a thread-local attribute costs several
    # times more, every step). An optimizer stepped inside another's step (a ZeRO
    # wrapper's inner one) reports no duration of its own: the outer one's covers it.
    # Bounded by the optimizers in a step at once (an entry lives from pre to post).
    starts: dict[int, int] = {}

    def pre(optimizer: Any, args: Any, kwargs: Any) -> None:
        if GATE.on and not is_compiling():
            starts[id(optimizer)] = clock()

    def post(optimizer: Any, args: Any, kwargs: Any) -> None:
        if not GATE.on:
            return
        if is_compiling():
            if comptime is not None:
                comptime(_traced_optimizer_step)
            return
        now = clock()
        try:
            key = id(optimizer)
            if key not in names:
                names[key] = type(optimizer).__name__
            start = starts.pop(key, 0)
            if starts:  # nested in another optimizer's step, which times the whole
                start = 0
            tracker.optimizer_step(key, now, duration_ns=now - start if start else 0)
        except Exception as exc:  # noqa: BLE001 - never raise into the host
            sink.error("torch.optimizer_post_hook", exc)

    return pre, post


def autograd_backward(
    tracker: StepTracker, sink: Sink, phases: Any = None
) -> Callable[[AnyFn], AnyFn]:
    """``torch.autograd.backward``: one outermost call per thread = one micro-batch.

    With ``phases`` (the step phases' ``PhaseHooks``) the same wrapper times the call for
    them: its interval goes to ``phases.backward``, and before it the roots' timed calls
    are checked (a replaced slot is wrapped again) or their discovery advanced. One
    wrapper for both: a second one was a second frame, thread-local depth and clock
    reading on every step.
    """
    clock = tracker.clock

    def factory(wrapped: AnyFn) -> AnyFn:
        @functools.wraps(wrapped)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if not GATE.on or TLS.backward_depth:
                return wrapped(*args, **kwargs)
            if phases is not None:
                roots = phases.timed_roots
                if roots:
                    # One root whose timed call ran since the last backward (a new
                    # forward start) is still in its slot: no chain walk.
                    started = phases.tls.fwd_start
                    if len(roots) > 1 or started == phases.checked_forward:
                        phases.recheck_roots()
                    phases.checked_forward = started
                elif phases.discovering:
                    phases.discovery_backward()
            start = clock()
            try:
                tracker.backward_begin(start)
            except Exception as exc:  # noqa: BLE001 - never raise into the host
                sink.error("torch.autograd.backward", exc)
            TLS.backward_depth = 1
            try:
                return wrapped(*args, **kwargs)
            finally:
                TLS.backward_depth = 0
                end = clock()
                try:
                    tracker.backward_end(end)
                except Exception as exc:  # noqa: BLE001 - never raise into the host
                    sink.error("torch.autograd.backward", exc)
                if phases is not None:
                    phases.backward.append((start, end))

        return dynamo_skip(backward)

    return factory


def grad_scaler_step(
    tracker: StepTracker, sink: Sink, names: dict[int, str]
) -> Callable[[AnyFn], AnyFn]:
    """``GradScaler.step``: a call in which the optimizer did not step was skipped.

    On inf/NaN gradients GradScaler skips ``optimizer.step()``, so no optimizer hook
    fires (it returns before calling the optimizer); this reports the skipped step so it is counted.
    """

    def factory(wrapped: AnyFn) -> AnyFn:
        @functools.wraps(wrapped)
        def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if not GATE.on:
                return wrapped(self, optimizer, *args, **kwargs)
            before = tracker.total_optimizer_steps
            result = wrapped(self, optimizer, *args, **kwargs)
            try:
                if tracker.total_optimizer_steps == before:
                    key = id(optimizer)
                    names.setdefault(key, type(optimizer).__name__)
                    tracker.optimizer_step(key, skipped=True)
            except Exception as exc:  # noqa: BLE001 - never raise into the host
                sink.error("torch.GradScaler.step", exc)
            return result

        return dynamo_skip(step)

    return factory


def engine_step(tracker: StepTracker, sink: Sink, counter: str) -> Callable[[AnyFn], AnyFn]:
    """An engine's ``step`` method (DeepSpeed): its counter attribute decides the step.

    Inside, optimizer hooks only count (ZeRO-3 steps its optimizer once per sub-group);
    the step ends when ``getattr(engine, counter)`` advanced.
    """

    def factory(wrapped: AnyFn) -> AnyFn:
        @functools.wraps(wrapped)
        def step(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not GATE.on:
                return wrapped(self, *args, **kwargs)
            before = getattr(self, counter, None)
            tracker.engine_begin()
            stepped: bool | None = None
            try:
                return wrapped(self, *args, **kwargs)
            finally:
                try:
                    after = getattr(self, counter, None)
                    if isinstance(before, int) and isinstance(after, int):
                        stepped = after != before
                    tracker.engine_end(stepped)
                except Exception as exc:  # noqa: BLE001 - never raise into the host
                    sink.error("torch.engine.step", exc)

        return dynamo_skip(step)

    return factory


class _CompiledCall:
    """One outermost call of a compiled function: optimizer steps traced during it."""

    __slots__ = ("traced",)

    def __init__(self) -> None:
        self.traced = 0


def compiled_function(fn: AnyFn, tracker: StepTracker, sink: Sink) -> AnyFn:
    """Wraps what ``torch.compile(fn)`` returned: its calls feed the ``compiled`` rule.

    While Dynamo compiles ``fn`` (inside a call), the optimizer post-hook counts the
    optimizer steps traced into its graphs; those steps run inside the graph without
    hooks, so each later call reports them to ``tracker`` at its end. Attributes of
    the compiled callable are kept (``functools.wraps``).
    """
    traced = [0]

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not GATE.on or TLS.compiled is not None:
            return fn(*args, **kwargs)
        frame = _CompiledCall()
        TLS.compiled = frame
        try:
            tracker.compiled_begin()
        except Exception as exc:  # noqa: BLE001 - never raise into the host
            sink.error("torch.compile.call", exc)
        try:
            return fn(*args, **kwargs)
        finally:
            TLS.compiled = None
            try:
                if frame.traced:  # (re)compiled during this call
                    traced[0] = frame.traced
                tracker.compiled_end(id(call), traced[0])
            except Exception as exc:  # noqa: BLE001 - never raise into the host
                sink.error("torch.compile.call", exc)

    return dynamo_skip(call)


def torch_compile(tracker: StepTracker, sink: Sink) -> Callable[[AnyFn], AnyFn]:
    """``torch.compile``: compiled functions (not modules) get :func:`compiled_function`.

    The decorator form (``torch.compile(backend=...)``) calls ``torch.compile`` again
    with the function, so it is covered too. Modules are returned untouched: an
    optimizer step inside ``forward`` is not a pattern to support.
    """

    def factory(wrapped: AnyFn) -> AnyFn:
        @functools.wraps(wrapped)
        def compile_(model: Any = None, *args: Any, **kwargs: Any) -> Any:
            compiled = wrapped(model, *args, **kwargs)
            if model is None or not GATE.on:
                return compiled
            try:
                import torch

                if isinstance(model, torch.nn.Module) or not callable(compiled):
                    return compiled
                return compiled_function(compiled, tracker, sink)
            except Exception as exc:  # noqa: BLE001 - never raise into the host
                sink.error("torch.compile", exc)
                return compiled

        return dynamo_skip(compile_)

    return factory
