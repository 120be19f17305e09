"""One instrumentation session: a step tracker, the installed patches, their lifetime.

``Session.start()`` arms installation for when torch is imported (at once if it already
is) and turns the hooks on; ``Session.stop()`` turns them off, emits the pending step and
restores every patched attribute. Nothing here imports torch at module import time.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

from otelgpu.instrumentation.torch._cuda_events import CudaEventTimer
from otelgpu.instrumentation.torch._gate import GATE
from otelgpu.instrumentation.torch._install import Installation, clear_handlers, on_import
from otelgpu.instrumentation.torch._patch import Sink
from otelgpu.instrumentation.torch._steps import Clock, StepTracker

__all__ = ["Session"]


class Session:
    """Step detection wired to torch.

    Args:
        on_step: receives each finished :class:`~._steps.StepRecord` (on the training thread;
            its accumulator with ``deferred``).
        sink: receives per-operation measurements and our own errors.
        clock: ns clock (default: monotonic on the ``time.time_ns`` epoch).
        step_optimizer: the optimizer whose steps define steps (anchor override).
        data, comm, checkpoints: which hook families to install.
        probe: called when a step closes (allocator statistics); errors reported (the
            step then carries none).
        gpu_timer: CUDA-event timing of collectives on CUDA tensors, or None.
        flops: model FLOPs of each step that closes (the tracker's ``flops`` source, e.g.
            ``FlopsCounter.step_closed``); errors reported, the step then carries none.
        ddp_modules: where the DDP modules built while instrumented are kept (weakly);
            default a new set.
        phases: the step phases' hooks (``_phases.PhaseHooks``), timed by the backward
            wrapper; None without the diagnosis.
        deferred: ``on_step`` gets each step's accumulator, whose ``finish()`` builds its
            record (the tracker's ``deferred``: the record built off the training thread).
    """

    def __init__(
        self,
        on_step: Callable[[Any], None],
        sink: Sink,
        *,
        clock: Clock | None = None,
        step_optimizer: object | None = None,
        data: bool = True,
        comm: bool = True,
        checkpoints: bool = True,
        probe: Callable[[], object] | None = None,
        gpu_timer: CudaEventTimer | None = None,
        flops: Callable[[], float | None] | None = None,
        ddp_modules: weakref.WeakSet[Any] | None = None,
        phases: Any = None,
        deferred: bool = False,
    ) -> None:
        self.sink = sink
        self.names: dict[int, str] = {}
        # The three callbacks run on the training thread at every step's close: the
        # tracker catches their exceptions and reports them to the sink (no wrapper
        # frame each).
        self.tracker = StepTracker(
            on_step,
            clock=clock,
            step_optimizer=None if step_optimizer is None else id(step_optimizer),
            probe=probe,
            flops=flops,
            on_error=sink.error,
            deferred=deferred,
        )
        self.installation = Installation(
            self.tracker,
            sink,
            self.names,
            data=data,
            comm=comm,
            checkpoints=checkpoints,
            gpu_timer=gpu_timer,
            ddp_modules=ddp_modules,
            phases=phases,
        )
        self.started = False
        #: Extra installers (e.g. the phase hooks): ``install(torch)`` when torch is
        #: imported, ``undo()`` on stop.
        self.extensions: list[Any] = []

    def _on_torch(self, torch: ModuleType) -> None:
        try:
            self.installation.install_torch(torch)
        except Exception as exc:  # noqa: BLE001 - never raise into the host
            self.sink.error("torch.install", exc)
        for extension in self.extensions:
            try:
                extension.install(torch)
            except Exception as exc:  # noqa: BLE001, PERF203 - never raise into the host
                self.sink.error("torch.install", exc)

    def start(self) -> None:
        """Installs now if torch is imported, else right after the program imports it."""
        if self.started:
            return
        self.started = True
        on_import("torch", self._on_torch)
        self.installation.register_late()
        GATE.enable()

    def stop(self) -> None:
        """Hooks off, pending step emitted, torch restored. Idempotent."""
        if not self.started:
            return
        self.started = False
        GATE.disable()
        clear_handlers()
        try:
            self.tracker.flush()
        finally:
            for extension in reversed(self.extensions):
                try:
                    extension.undo()
                except Exception as exc:  # noqa: BLE001, PERF203 - undo the rest anyway
                    self.sink.error("torch.uninstall", exc)
            self.installation.undo()

    @property
    def torch_installed(self) -> bool:
        """True once the torch hooks are in place."""
        return "optimizer" in self.installation.installed and "torch" in sys.modules
