"""Which torch (and framework) callables get which wrapper; installs them reversibly.

Installed when torch is imported (immediately if it already is): global optimizer
step hooks, ``torch.autograd.backward``, ``GradScaler.step``, the DataLoader iterator,
``torch.distributed`` collectives and ``Work.wait``, DDP construction (to read DDP's
own timing), ``torch.save``. Installed when their module is imported: DCP
``save``/``async_save``, Lightning's and Hugging Face's checkpoint methods, DeepSpeed's
``engine.step``, accelerate's fetch-ahead loaders; and ``torch.compile`` (compiled
functions feed the ``compiled`` step rule). Every change goes through :class:`Patches`
and is undone by :meth:`Installation.undo`.
"""

from __future__ import annotations

import importlib
import threading
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

from otelgpu.instrumentation.torch import _patch as P
from otelgpu.instrumentation.torch import _patch_io as IO
from otelgpu.instrumentation.torch._cuda_events import CudaEventTimer
from otelgpu.instrumentation.torch._steps import StepTracker

__all__ = ["COLLECTIVES", "Installation", "on_import"]

#: ``torch.distributed`` functions wrapped, where they exist (older torch lacks some).
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_object",
    "all_to_all",
    "all_to_all_single",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
    "batch_isend_irecv",
)

# ---------------------------------------------------------------- post-import dispatch
# wrapt's post-import hooks cannot be unregistered, so each module name gets one
# permanent trampoline that calls the *current* handler (None after uninstrument).
_handlers: dict[str, Callable[[ModuleType], None]] = {}
_registered: set[str] = set()
_reg_lock = threading.Lock()


def on_import(name: str, handler: Callable[[ModuleType], None]) -> None:
    """Calls ``handler(module)`` when ``name`` is imported (now, if it already is)."""
    import wrapt

    with _reg_lock:
        _handlers[name] = handler
        first = name not in _registered
        _registered.add(name)
    if first:

        def trampoline(module: ModuleType) -> None:
            current = _handlers.get(name)
            if current is not None:
                current(module)

        wrapt.register_post_import_hook(trampoline, name)
    else:
        import sys

        module = sys.modules.get(name)
        if module is not None:
            handler(module)


def clear_handlers() -> None:
    """Forgets every handler (the trampolines stay, doing nothing)."""
    with _reg_lock:
        _handlers.clear()


class Installation:
    """The patches of one ``instrument()``; ``undo()`` restores torch exactly.

    Args:
        tracker: step detection.
        sink: per-operation measurements and error reports.
        names: ``id(optimizer)`` → class name, filled by the hooks.
        data, comm, checkpoints: which families to install.
        gpu_timer: CUDA-event timing of collectives on CUDA tensors, or None.
        ddp_modules: where the DDP modules built while instrumented are kept (weakly);
            default a new set.
        phases: the step phases' hooks, timed by the ``torch.autograd.backward`` wrapper
            (``_patch.autograd_backward``); None without the diagnosis.
    """

    def __init__(
        self,
        tracker: StepTracker,
        sink: P.Sink,
        names: dict[int, str],
        *,
        data: bool = True,
        comm: bool = True,
        checkpoints: bool = True,
        gpu_timer: CudaEventTimer | None = None,
        ddp_modules: weakref.WeakSet[Any] | None = None,
        phases: Any = None,
    ) -> None:
        self.tracker = tracker
        self.phases = phases
        self.gpu_timer = gpu_timer
        self.sink = sink
        self.names = names
        self.patches = P.Patches()
        self._data = data
        self._comm = comm
        self._checkpoints = checkpoints
        self._lock = threading.Lock()
        self.ddp_modules: weakref.WeakSet[Any] = (
            weakref.WeakSet() if ddp_modules is None else ddp_modules
        )
        self.installed: list[str] = []

    # ------------------------------------------------------------------ torch core

    def install_torch(self, torch: Any) -> None:
        """Installs everything that exists once ``torch`` itself is imported."""
        with self._lock:
            t, s, p = self.tracker, self.sink, self.patches
            opt = importlib.import_module("torch.optim.optimizer")
            pre, post = P.optimizer_hooks(t, s, self.names)
            p.handle(opt.register_optimizer_step_pre_hook(pre))
            p.handle(opt.register_optimizer_step_post_hook(post))
            p.wrap(torch.autograd, "backward", P.autograd_backward(t, s, self.phases))
            scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
            if scaler is not None:
                p.wrap(scaler, "step", P.grad_scaler_step(t, s, self.names))
            self.installed += ["optimizer", "backward", "grad_scaler"]
            if p.wrap(torch, "compile", P.torch_compile(t, s)):
                self.installed.append("compile")
            if self._data:
                self._install_data(torch)
            if self._comm:
                self._install_comm(torch)
            if self._checkpoints:
                p.wrap(
                    torch,
                    "save",
                    IO.checkpoint_save("torch.save", t, s, IO.torch_save_size, only_state=True),
                )
                serialization = getattr(torch, "serialization", None)
                if serialization is not None:
                    p.replace(serialization, "save", torch.save)
                self.installed.append("torch.save")

    def _install_data(self, torch: Any) -> None:
        dl = importlib.import_module("torch.utils.data.dataloader")
        self.patches.wrap(
            dl._BaseDataLoaderIter, "__next__", IO.dataloader_next(self.tracker, self.sink)
        )
        self.patches.wrap(dl.DataLoader, "__iter__", IO.dataloader_iter(self.tracker, self.sink))
        self.installed.append("dataloader")

    def _install_comm(self, torch: Any) -> None:
        dist = getattr(torch, "distributed", None)
        if dist is None or not dist.is_available():
            return
        c10d = dist.distributed_c10d
        t, s, p = self.tracker, self.sink, self.patches
        for op in COLLECTIVES:
            original = getattr(c10d, op, None)
            if original is None:
                continue
            wrapper = IO.collective(op, t, s, self.gpu_timer)(original)
            p.replace(c10d, op, wrapper)
            # torch.distributed re-exports the same function object: patch both names.
            if getattr(dist, op, None) is original:
                p.replace(dist, op, wrapper)
        work = getattr(c10d, "Work", None)
        if work is not None and hasattr(work, "wait"):
            p.wrap(work, "wait", IO.work_wait(t, s, self.gpu_timer))
        ddp_cls = getattr(getattr(torch.nn, "parallel", None), "DistributedDataParallel", None)
        if ddp_cls is not None:
            p.wrap(ddp_cls, "__init__", self._ddp_init)
        self.installed.append("distributed")

    def _ddp_init(self, wrapped: P.AnyFn) -> P.AnyFn:
        modules = self.ddp_modules
        sink = self.sink

        def __init__(module: Any, *args: Any, **kwargs: Any) -> None:
            wrapped(module, *args, **kwargs)
            try:
                modules.add(module)
            except Exception as exc:  # noqa: BLE001 - never raise into the host
                sink.error("torch.DistributedDataParallel.__init__", exc)

        __init__.__wrapped__ = wrapped  # type: ignore[attr-defined]
        return __init__

    # ------------------------------------------------------------------ late modules

    def install_dcp(self, module: ModuleType) -> None:
        """``torch.distributed.checkpoint.save``/``async_save`` (and their home module)."""
        if not self._checkpoints:
            return
        with self._lock:
            t, s, p = self.tracker, self.sink, self.patches
            saver = getattr(module, "state_dict_saver", None)
            for name in ("save", "async_save"):
                original = getattr(module, name, None)
                if original is None:
                    continue
                wrapper = IO.checkpoint_save("dcp." + name, t, s, IO.dcp_save_size)(original)
                p.replace(module, name, wrapper)
                if saver is not None and getattr(saver, name, None) is original:
                    p.replace(saver, name, wrapper)
            self.installed.append("dcp")

    def install_lightning(self, module: ModuleType) -> None:
        """Lightning's ``Trainer.save_checkpoint`` (``lightning`` or ``pytorch_lightning``)."""
        self._install_trainer_checkpoint(
            module, "save_checkpoint", "lightning", IO.lightning_save_size
        )

    def install_transformers(self, module: ModuleType) -> None:
        """Hugging Face ``Trainer._save_checkpoint``."""
        self._install_trainer_checkpoint(
            module, "_save_checkpoint", "transformers", IO.hf_save_size
        )

    def _install_trainer_checkpoint(
        self, module: ModuleType, method: str, label: str, size_of: Any
    ) -> None:
        """Wrap ``module.Trainer.<method>`` as a checkpoint save named ``label``."""
        trainer = getattr(module, "Trainer", None)
        if trainer is None or not self._checkpoints:
            return
        with self._lock:
            self.patches.wrap(
                trainer,
                method,
                IO.checkpoint_save(label, self.tracker, self.sink, size_of, method=True),
            )
            self.installed.append(label)

    def install_deepspeed(self, module: ModuleType) -> None:
        """DeepSpeed ``DeepSpeedEngine.step``: the engine's ``global_steps`` decides."""
        engine = getattr(module, "DeepSpeedEngine", None)
        if engine is None:
            return
        with self._lock:
            self.patches.wrap(
                engine, "step", P.engine_step(self.tracker, self.sink, "global_steps")
            )
            self.installed.append("deepspeed")

    def install_accelerate(self, module: ModuleType) -> None:
        """accelerate's fetch-ahead loaders: batches count when handed to the loop."""
        if not self._data:
            return
        with self._lock:
            for name in ("DataLoaderShard", "DataLoaderDispatcher"):
                cls = getattr(module, name, None)
                if cls is not None and "__iter__" in vars(cls):
                    self.patches.wrap(cls, "__iter__", IO.fetch_ahead_iter(self.tracker, self.sink))
            self.installed.append("accelerate")

    def register_late(self) -> None:
        """Arms the post-import hooks for the optional modules."""
        on_import("torch.distributed.checkpoint", self.install_dcp)
        on_import("lightning.pytorch.trainer.trainer", self.install_lightning)
        on_import("pytorch_lightning.trainer.trainer", self.install_lightning)
        on_import("transformers.trainer", self.install_transformers)
        on_import("accelerate.data_loader", self.install_accelerate)
        on_import("deepspeed.runtime.engine", self.install_deepspeed)

    def undo(self) -> None:
        """Restores every patched attribute and removes the hooks."""
        with self._lock:
            self.patches.undo()
            self.installed.clear()
