"""``TorchInstrumentor``: PyTorch training steps, data wait, collectives, checkpoints, memory.

Turned on by ``otelgpu.instrument()`` (when torch is installed), by
``opentelemetry-instrument python train.py`` (entry point ``otelgpu_torch``) and by
``otelgpu run -- python train.py``; or by hand::

    from otelgpu.instrumentation.torch import TorchInstrumentor
    TorchInstrumentor().instrument()            # uses otelgpu._runtime.current()
    TorchInstrumentor().instrument(runtime=rt, span_every=10, step_optimizer=opt_g)

Keywords: ``runtime`` (a Runtime, or None for ``otelgpu._runtime.current()`` looked up at
the first step), ``span_every``, ``reset_peak_memory``, ``step_optimizer``, ``data``,
``comm``, ``checkpoints``, ``cuda_events``, ``gpu_step_time``, ``cuda_sync`` (see
:mod:`.environment_variables`); ``diagnosis``, ``exchange_every``,
``straggler_threshold``, ``verdict_log`` (step phases, stragglers, drift, verdict: see
:mod:`otelgpu.diagnosis.environment_variables`).

Importing this module does not import torch (it only checks that torch is installed,
raising ``ModuleNotFoundError`` otherwise, which auto-instrumentation skips quietly);
the hooks are installed right after the program imports torch. Every change to torch is
undone by ``uninstrument()``. Nothing here raises into the training loop: failures in
our hooks go to ``Runtime.report_error`` and are swallowed. Forked children (DataLoader
workers) record nothing.

What is measured, and how, is documented in ``docs/metrics-torch.md``.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import sys
import weakref
from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)

from otelgpu.instrumentation.torch._config import TorchSettings, resolve
from otelgpu.instrumentation.torch._cuda_events import (
    CudaEventTimer,
    torch_capturing,
    torch_cuda_ready,
    torch_event_factory,
)
from otelgpu.instrumentation.torch._flops import FlopsCounter
from otelgpu.instrumentation.torch._memory import CudaMemory
from otelgpu.instrumentation.torch._runtime_ref import RuntimeRef
from otelgpu.instrumentation.torch._session import Session
from otelgpu.instrumentation.torch._steps import epoch_clock
from otelgpu.instrumentation.torch._telemetry import StepObserver, Telemetry
from otelgpu.instrumentation.torch.package import _instruments
from otelgpu.runtime.api import RuntimeAPI

if importlib.util.find_spec("torch") is None:  # pragma: no cover - depends on the machine
    raise ModuleNotFoundError("No module named 'torch'", name="torch")

__all__ = ["TorchInstrumentor", "flush", "record_batch"]

_active: tuple[Session, Telemetry] | None = None
_diagnosis: Any = None  # otelgpu.diagnosis.training.TrainingDiagnosis of the live session
_atexit_registered = False


def record_batch(samples: int | None = None, tokens: int | None = None) -> None:
    """Tells otelgpu the size of the batch just processed (adds to the current step).

    Given values replace what was inferred from DataLoader batches for this step. No-op
    when not instrumented; never raises.
    """
    active = _active
    if active is None:
        return
    try:
        active[0].tracker.add_batch(samples, tokens)
    except Exception as exc:  # noqa: BLE001 - never raise into the host
        active[1].error("torch.record_batch", exc)


def flush() -> None:
    """Emits the step still pending (its end is final once the next step begins).

    Call before ``otelgpu.shutdown()`` at the end of training; registered with ``atexit``
    too. Never raises.
    """
    active = _active
    if active is None:
        return
    try:
        active[0].tracker.flush()
    except Exception as exc:  # noqa: BLE001 - never raise into the host
        active[1].error("torch.flush", exc)
    _drain()


def _drain() -> None:
    """Records the finished steps still queued for the background thread, now (the step
    in progress stays open: its end is the next step's start). ``force_flush()`` of
    ``otelgpu.instrument()``'s handle calls it. Never raises."""
    active = _active
    if active is None:
        return
    try:
        active[1].drain()
        diagnosis = _diagnosis
        if diagnosis is not None:
            diagnosis.flush()  # its buffered steps into the phase sketch and the summary
    except Exception as exc:  # noqa: BLE001 - never raise into the host
        active[1].error("torch.flush", exc)


def _after_fork_in_child() -> None:
    """A forked child starts clean: the parent's patches are removed, not just gated off.

    DataLoader workers then run torch untouched, and a forked training worker may call
    ``instrument()`` for itself. Nothing is flushed: the parent's pending step is the
    parent's (``_gate`` has already turned every hook off).
    """
    global _active, _diagnosis
    active = _active
    _active = None
    _diagnosis = None
    if active is None:
        return
    try:
        from otelgpu.diagnosis import _set_active
        from otelgpu.instrumentation.torch._install import clear_handlers

        _set_active(None)  # the parent's run

        clear_handlers()
        active[1].after_fork()
        active[0].started = False
        for extension in reversed(active[0].extensions):
            extension.undo()
        active[0].installation.undo()
        TorchInstrumentor()._is_instrumented_by_opentelemetry = False
    except Exception:  # noqa: BLE001 - never fail a fork
        return


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _memory_factory(settings: TorchSettings) -> Any:
    def make(on_oom: Any) -> CudaMemory | None:
        torch = sys.modules.get("torch")
        return (
            None
            if torch is None
            else CudaMemory(torch, on_oom, reset_peak=settings.reset_peak_memory)
        )

    return make


def _gpu_timer(settings: TorchSettings) -> CudaEventTimer | None:
    """CUDA-event timing (inert until a collective runs on a CUDA tensor), or None."""
    if not (settings.cuda_events or settings.gpu_step_time):
        return None
    return CudaEventTimer(
        torch_event_factory(),
        sync=settings.cuda_sync,
        comm=settings.cuda_events,
        steps=settings.gpu_step_time,
        cuda_ready=torch_cuda_ready,
        capturing=torch_capturing,
    )


def _rule(session: Session) -> str | None:
    """The step rule as the FLOP counter needs it (``compiled`` once a compiled step ran)."""
    tracker = session.tracker
    return "compiled" if tracker.compiled_optimizer_steps else tracker.rule


class TorchInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """PyTorch training auto-instrumentation (see the module docstring)."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        global _active, _atexit_registered, _diagnosis
        from otelgpu.diagnosis import _set_active
        from otelgpu.diagnosis.settings import resolve as resolve_diagnosis

        settings = resolve(kwargs)
        runtime: RuntimeAPI | None = kwargs.get("runtime")
        diagnosis_settings = resolve_diagnosis(kwargs)
        ref = RuntimeRef(None if runtime is None else (lambda: runtime))
        gpu_timer = _gpu_timer(settings)
        clock = epoch_clock()
        ddp_modules: weakref.WeakSet[Any] = weakref.WeakSet()
        phases = None
        observers: list[StepObserver] = []
        if diagnosis_settings.enabled:
            from otelgpu.diagnosis.training import TrainingDiagnosis
            from otelgpu.instrumentation.torch._phases import PhaseHooks

            phases = PhaseHooks(clock, ref)
            _diagnosis = TrainingDiagnosis(ref.current, diagnosis_settings, phases)
            observers.append(_diagnosis.observe_step)

        def add_event(name: str, attributes: dict[str, object]) -> None:
            # The OOM observer is attached at the first probe, once the session exists.
            session.tracker.add_event(name, attributes)

        telemetry = Telemetry(
            ref,
            span_every=settings.span_every,
            flops_per_step=settings.flops_per_step,
            memory_factory=_memory_factory(settings),
            gpu_timer=gpu_timer,
            ddp_modules=ddp_modules,
            add_event=add_event,
            step_observers=observers,
        )
        counter = None
        if settings.count_flops and settings.flops_per_step is None:  # the setting wins
            counter = FlopsCounter(telemetry, lambda: _rule(session))
        session = Session(
            telemetry.on_step,
            telemetry if phases is None else phases.tee(telemetry),
            clock=clock,
            step_optimizer=settings.step_optimizer,
            data=settings.data,
            comm=settings.comm,
            checkpoints=settings.checkpoints,
            probe=telemetry.probe,
            gpu_timer=gpu_timer,
            ddp_modules=ddp_modules,
            flops=None if counter is None else counter.step_closed,
            phases=phases,
            deferred=True,  # the telemetry's drain builds each step's record
        )
        # A CPU build of torch has no allocator statistics: the tracker stops probing
        # (a call per step) once the telemetry knows it.
        telemetry.on_probe_idle = lambda: setattr(session.tracker, "probe", None)
        if counter is not None:
            counter.attach(session.tracker)
            session.extensions.append(counter)
        if phases is not None:
            session.extensions.append(phases)
        _set_active(_diagnosis)
        session.start()
        _active = (session, telemetry)
        if not _atexit_registered:
            atexit.register(flush)
            _atexit_registered = True

    def drain(self) -> None:
        """The finished steps still queued for the background thread, recorded now (the
        step in progress stays open); ``force_flush()`` of ``otelgpu.instrument()``'s
        handle calls it. Never raises."""
        _drain()

    def _uninstrument(self, **kwargs: Any) -> None:
        global _active, _diagnosis
        active = _active
        diagnosis = _diagnosis
        _active = None
        _diagnosis = None
        if active is None:
            return
        session, telemetry = active
        try:
            session.stop()
            telemetry.close()
            if diagnosis is not None:
                try:
                    diagnosis.close()  # the verdict span, while the runtime still exports
                except Exception as exc:  # noqa: BLE001 - shutdown goes on
                    telemetry.error("diagnosis.close", exc)
        finally:
            telemetry.enabled = False

    @property
    def session(self) -> Session | None:
        """The live session (tests and ``otelgpu doctor`` inspect it); None when off."""
        return None if _active is None else _active[0]

    @property
    def telemetry(self) -> Telemetry | None:
        """The live telemetry bridge; None when off."""
        return None if _active is None else _active[1]
