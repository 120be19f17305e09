"""The wrappers that measure data loading, collectives and checkpoints.

They follow the wrapper contract written in ``_patch`` (call straight through when the
gate is off, call the wrapped callable exactly once, never raise our own failures, count
re-entrant calls once at the outermost call per thread) and report to its
:class:`~._patch.Sink`; the step tracker receives the blocking time.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from otelgpu.instrumentation.torch._batch import infer_batch
from otelgpu.instrumentation.torch._cuda_events import CudaEventTimer, GpuOp
from otelgpu.instrumentation.torch._gate import GATE, TLS
from otelgpu.instrumentation.torch._patch import MISSING, AnyFn, Sink, dynamo_skip, is_compiling_fn
from otelgpu.instrumentation.torch._steps import StepTracker

__all__ = [
    "SizeOf",
    "checkpoint_save",
    "collective",
    "dataloader_iter",
    "dataloader_next",
    "dcp_save_size",
    "fetch_ahead_iter",
    "hf_save_size",
    "lightning_save_size",
    "torch_save_size",
    "work_wait",
]

_DCP_ASYNC_THREAD = (
    "AsyncCheckpointExecutor"  # torch/distributed/checkpoint/_async_thread_executor.py
)


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
    is_compiling = is_compiling_fn()

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
            result: Any = MISSING
            try:
                result = wrapped(*args, **kwargs)
                return result
            finally:
                TLS.comm_depth = 0
                end = clock()
                try:
                    if mark is not None and gpu is not None:
                        gpu.end(mark, result, ok=result is not MISSING)
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
