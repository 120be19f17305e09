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
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from otelgpu.instrumentation.torch._batch import infer_batch
from otelgpu.instrumentation.torch._cuda_events import CudaEventTimer, GpuOp
from otelgpu.instrumentation.torch._gate import GATE, TLS
from otelgpu.instrumentation.torch._steps import StepTracker

__all__ = [
    "ErrorSink",
    "Patches",
    "Sink",
    "autograd_backward",
    "checkpoint_save",
    "collective",
    "compiled_function",
    "dataloader_iter",
    "dataloader_next",
    "engine_step",
    "fetch_ahead_iter",
    "grad_scaler_step",
    "optimizer_hooks",
    "torch_compile",
    "work_wait",
]

_MISSING = object()
_DCP_ASYNC_THREAD = (
    "AsyncCheckpointExecutor"  # torch/distributed/checkpoint/_async_thread_executor.py
)
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
        found = vars(owner).get(name, _MISSING) if isinstance(owner, type) else getattr(owner, name)
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
            if found is _MISSING:
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


def _is_compiling_fn() -> Callable[[], bool]:
    import torch

    compiler = getattr(torch, "compiler", None)
    fn = getattr(compiler, "is_compiling", None)
    return fn if fn is not None else (lambda: False)


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
    is_compiling = _is_compiling_fn()
    comptime = _comptime()

    def pre(optimizer: Any, args: Any, kwargs: Any) -> None:
        if not GATE.on or is_compiling():
            return
        TLS.opt_start_ns = clock()

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
            start = TLS.opt_start_ns
            TLS.opt_start_ns = 0
            tracker.optimizer_step(key, now, duration_ns=now - start if start else 0)
        except Exception as exc:  # noqa: BLE001 - never raise into the host
            sink.error("torch.optimizer_post_hook", exc)

    return pre, post


def autograd_backward(tracker: StepTracker, sink: Sink) -> Callable[[AnyFn], AnyFn]:
    """``torch.autograd.backward``: one outermost call per thread = one micro-batch."""

    def factory(wrapped: AnyFn) -> AnyFn:
        @functools.wraps(wrapped)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if not GATE.on or TLS.backward_depth:
                return wrapped(*args, **kwargs)
            try:
                tracker.backward_begin()
            except Exception as exc:  # noqa: BLE001 - never raise into the host
                sink.error("torch.autograd.backward", exc)
            TLS.backward_depth = 1
            try:
                return wrapped(*args, **kwargs)
            finally:
                TLS.backward_depth = 0
                try:
                    tracker.backward_end()
                except Exception as exc:  # noqa: BLE001 - never raise into the host
                    sink.error("torch.autograd.backward", exc)

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


# --------------------------------------------------------------------------- data


def dataloader_next(tracker: StepTracker, sink: Sink) -> Callable[[AnyFn], AnyFn]:
    """``_BaseDataLoaderIter.__next__``: the time the loop waited for a batch.

    The epoch-end ``StopIteration`` is not counted (it is the loader's end, not a wait).
    """
    clock = tracker.clock

    def factory(wrapped: AnyFn) -> AnyFn:
        @functools.wraps(wrapped)
        def __next__(self: Any) -> Any:
            if not GATE.on or TLS.data_depth:
                return wrapped(self)
            TLS.data_depth = 1
            start = clock()
            try:
                batch = wrapped(self)
            finally:
                TLS.data_depth = 0
            end = clock()
            try:
                # Inside a fetch-ahead loader the batch counts when it is handed over.
                samples, tokens = (None, None) if TLS.consumer_depth else infer_batch(batch)
                tracker.data_wait(start, end, samples, tokens)
            except Exception as exc:  # noqa: BLE001 - never raise into the host
                sink.error("torch.DataLoader.__next__", exc)
            return batch

        return dynamo_skip(__next__)

    return factory


def _handed_over(it: Iterator[Any], tracker: StepTracker, sink: Sink) -> Iterator[Any]:
    """Yields ``it``'s batches; each counts (samples, tokens) as it is handed to the loop.

    Fetches made while ``it`` runs (its look-ahead) record their wait but no sizes.
    """
    try:
        while True:
            TLS.consumer_depth += 1
            try:
                batch = next(it)
            except StopIteration:
                return
            finally:
                TLS.consumer_depth -= 1
            if GATE.on:
                try:
                    samples, tokens = infer_batch(batch)
                    tracker.batch_consumed(samples, tokens)
                except Exception as exc:  # noqa: BLE001 - never raise into the host
                    sink.error("torch.fetch_ahead_loader", exc)
            yield batch
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


def fetch_ahead_iter(tracker: StepTracker, sink: Sink) -> Callable[[AnyFn], AnyFn]:
    """``__iter__`` of a loader that fetches one batch ahead (accelerate's
    ``DataLoaderShard``/``DataLoaderDispatcher``): samples and tokens count when a batch is
    handed to the loop, so a prefetched batch never trained on (``max_steps`` reached
    mid-epoch) is not counted, and each step gets its own batches' sizes."""

    def factory(wrapped: AnyFn) -> AnyFn:
        dynamo_skip(_handed_over)  # here, not at import: that would import torch

        @functools.wraps(wrapped)
        def __iter__(self: Any) -> Iterator[Any]:
            if not GATE.on:
                return wrapped(self)  # type: ignore[no-any-return]
            return _handed_over(wrapped(self), tracker, sink)

        return dynamo_skip(__iter__)

    return factory


def dataloader_iter(tracker: StepTracker, sink: Sink) -> Callable[[AnyFn], AnyFn]:
    """``DataLoader.__iter__`` with workers: worker start-up and first prefetch."""
    clock = tracker.clock

    def factory(wrapped: AnyFn) -> AnyFn:
        @functools.wraps(wrapped)
        def __iter__(self: Any) -> Iterator[Any]:
            if not GATE.on or not getattr(self, "num_workers", 0):
                return wrapped(self)  # type: ignore[no-any-return]
            start = clock()
            it = wrapped(self)
            end = clock()
            try:
                tracker.loader_startup(start, end)
                sink.loader_startup(start, end)
            except Exception as exc:  # noqa: BLE001 - never raise into the host
                sink.error("torch.DataLoader.__iter__", exc)
            return it  # type: ignore[no-any-return]

        return dynamo_skip(__iter__)

    return factory


# --------------------------------------------------------------------------- collectives


def collective(
    op: str, tracker: StepTracker, sink: Sink, gpu: CudaEventTimer | None = None
) -> Callable[[AnyFn], AnyFn]:
    """A ``torch.distributed`` collective: host time of the outermost call.

    With ``async_op=True`` this is the launch; the wait is measured by ``work_wait``.
    On gloo the host time is the real wait; on NCCL it is about the launch time
    (NCCL collectives are asynchronous on the host) — documented in
    docs/metrics-torch.md. With ``gpu``, a collective on a CUDA tensor also gets a pair
    of CUDA timing events around it (``_cuda_events``), never a synchronisation unless
    that timer was built with ``sync``.
    """
    clock = tracker.clock
    is_compiling = _is_compiling_fn()

    def factory(wrapped: AnyFn) -> AnyFn:
        @functools.wraps(wrapped)
        def call(*args: Any, **kwargs: Any) -> Any:
            if not GATE.on or TLS.comm_depth or is_compiling():
                return wrapped(*args, **kwargs)
            TLS.comm_depth = 1
            start = clock()
            mark: GpuOp | None = None
            if gpu is not None:
                try:
                    mark = gpu.begin(op, start, args, kwargs)
                except Exception as exc:  # noqa: BLE001 - never raise into the host
                    sink.error("torch.cuda_events." + op, exc)
            result: Any = _MISSING
            try:
                result = wrapped(*args, **kwargs)
                return result
            finally:
                TLS.comm_depth = 0
                end = clock()
                try:
                    if mark is not None and gpu is not None:
                        gpu.end(mark, result, ok=result is not _MISSING)
                except Exception as exc:  # noqa: BLE001 - never raise into the host
                    sink.error("torch.cuda_events." + op, exc)
                try:
                    tracker.comm_wait(op, start, end)
                    sink.comm(op, start, end)
                except Exception as exc:  # noqa: BLE001 - never raise into the host
                    sink.error("torch.distributed." + op, exc)

        return dynamo_skip(call)

    return factory


def work_wait(
    tracker: StepTracker, sink: Sink, gpu: CudaEventTimer | None = None
) -> Callable[[AnyFn], AnyFn]:
    """``Work.wait`` of an ``async_op=True`` collective, outside our collective wrappers."""
    return collective("wait", tracker, sink, gpu)


# --------------------------------------------------------------------------- checkpoints


def _path_size(path: Any) -> int | None:
    """Bytes of a file, or of all files under a directory (at most 10 000 files)."""
    try:
        p = os.fspath(path)
    except TypeError:
        return None
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if os.path.isfile(p):
        return os.path.getsize(p)
    if not os.path.isdir(p):
        return None
    total = 0
    seen = 0
    for root, _dirs, files in os.walk(p):
        for name in files:
            seen += 1
            if seen > 10_000:
                return total
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, name))
    return total


def _is_state(obj: Any) -> bool:
    """A model/optimizer state: a mapping, or anything with ``state_dict``."""
    return isinstance(obj, Mapping) or hasattr(obj, "state_dict")


SizeOf = Callable[[tuple[Any, ...], dict[str, Any], Any], "int | None"]


def torch_save_size(args: tuple[Any, ...], kwargs: dict[str, Any], before: Any) -> int | None:
    """Size written by ``torch.save(obj, f)``: the file, or the stream's advance."""
    f = args[1] if len(args) > 1 else kwargs.get("f")
    if isinstance(f, str | bytes | os.PathLike):
        return _path_size(f)
    tell = getattr(f, "tell", None)
    if tell is not None and isinstance(before, int):
        after = tell()
        return int(after - before) if isinstance(after, int) else None
    return None


def lightning_save_size(args: tuple[Any, ...], kwargs: dict[str, Any], before: Any) -> int | None:
    """Size of ``Trainer.save_checkpoint(self, filepath, ...)``'s file."""
    path = args[1] if len(args) > 1 else kwargs.get("filepath")
    return None if path is None else _path_size(path)


def hf_save_size(args: tuple[Any, ...], kwargs: dict[str, Any], before: Any) -> int | None:
    """Size of ``<output_dir>/checkpoint-<global_step>`` after ``Trainer._save_checkpoint``."""
    trainer = args[0] if args else None
    out = getattr(getattr(trainer, "args", None), "output_dir", None)
    step = getattr(getattr(trainer, "state", None), "global_step", None)
    if out is None or step is None:
        return None
    return _path_size(os.path.join(os.fspath(out), f"checkpoint-{step}"))


def dcp_save_size(args: tuple[Any, ...], kwargs: dict[str, Any], before: Any) -> int | None:
    """Size of a DCP checkpoint directory (``checkpoint_id`` or the writer's path)."""
    target = kwargs.get("checkpoint_id")
    if target is None:
        target = getattr(kwargs.get("storage_writer"), "path", None)
    return None if target is None else _path_size(target)


def checkpoint_save(
    kind: str,
    tracker: StepTracker,
    sink: Sink,
    size_of: SizeOf | None = None,
    *,
    only_state: bool = False,
    method: bool = False,
) -> Callable[[AnyFn], AnyFn]:
    """A checkpoint save: duration (and size) of the outermost save per thread.

    Args:
        kind: the ``checkpoint.kind`` attribute (``torch.save``, ``dcp.save``...).
        tracker: receives the blocking time.
        sink: receives the measurement.
        size_of: ``(args, kwargs, before)`` → bytes (``args`` as called, ``self``
            included for methods); ``before`` is the stream position for ``torch.save``
            to a file object.
        only_state: count only when the saved object is a state (``torch.save``).
        method: the wrapped callable is a method (``self`` excluded from ``args``).
    """
    clock = tracker.clock

    def factory(wrapped: AnyFn) -> AnyFn:
        @functools.wraps(wrapped)
        def save(*args: Any, **kwargs: Any) -> Any:
            if not GATE.on or TLS.ckpt_depth:
                return wrapped(*args, **kwargs)
            call_args = args[1:] if method else args
            if only_state:
                obj = call_args[0] if call_args else kwargs.get("obj")
                if not _is_state(obj):
                    return wrapped(*args, **kwargs)
            before: Any = None
            if kind == "torch.save":
                f = call_args[1] if len(call_args) > 1 else kwargs.get("f")
                tell = getattr(f, "tell", None)
                if tell is not None:
                    try:
                        before = tell()
                    except Exception:  # noqa: BLE001 - never raise into the host
                        before = None
            # DCP's async_save runs save() on its own executor thread: that is the
            # upload of an async save (measured apart), not a loop-blocking save.
            upload = kind == "dcp.save" and threading.current_thread().name.startswith(
                _DCP_ASYNC_THREAD
            )
            TLS.ckpt_depth = 1
            start = clock()
            ok = False
            try:
                result = wrapped(*args, **kwargs)
                ok = True
                return result
            finally:
                TLS.ckpt_depth = 0
                end = clock()
                if ok:
                    try:
                        size = size_of(args, kwargs, before) if size_of else None
                        if not upload:
                            tracker.checkpoint(start, end)
                        sink.checkpoint(
                            "dcp.async_save.upload" if upload else kind, start, end, size
                        )
                    except Exception as exc:  # noqa: BLE001 - never raise into the host
                        sink.error("torch.checkpoint." + kind, exc)

        return dynamo_skip(save)

    return factory
