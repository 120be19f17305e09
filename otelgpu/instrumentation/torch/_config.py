"""Settings of the torch instrumentation: keyword > ``OTELGPU_TORCH_*`` variable > default.

The same mechanism as ``instrument()``'s settings: rows of ``otelgpu._settings.Setting``
resolved by ``otelgpu._settings.resolve_table``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from otelgpu._settings import Setting, _bool, _float_range, _int_range, resolve_table
from otelgpu.errors import ConfigurationError
from otelgpu.instrumentation.torch import environment_variables as ev

__all__ = ["HOOK_FAMILIES", "SETTINGS", "TorchSettings", "resolve"]

HOOK_FAMILIES = ("data", "comm", "checkpoint")


@dataclass(frozen=True)
class TorchSettings:
    """Resolved settings (immutable)."""

    span_every: int = 1
    reset_peak_memory: bool = False
    data: bool = True
    comm: bool = True
    checkpoints: bool = True
    step_optimizer: object | None = None
    cuda_events: bool = True
    gpu_step_time: bool = False
    cuda_sync: bool = False
    flops_per_step: float | None = None
    count_flops: bool = True


#: The settings table (the pattern of ``otelgpu._settings``): keyword, variable, parser.
SETTINGS: tuple[Setting, ...] = (
    Setting("span_every", ev.OTELGPU_TORCH_SPAN_EVERY, None, _int_range(1),
            "an integer >= 1", "Emit a span for every n-th step."),
    Setting("reset_peak_memory", ev.OTELGPU_TORCH_RESET_PEAK, None, _bool, "true or false",
            "Reset the allocator's peak after each step."),
    Setting("cuda_events", ev.OTELGPU_TORCH_CUDA_EVENTS, None, _bool, "true or false",
            "Time collectives on CUDA tensors with CUDA events."),
    Setting("gpu_step_time", ev.OTELGPU_TORCH_GPU_STEP_TIME, None, _bool, "true or false",
            "Time each step on the GPU with CUDA events."),
    Setting("cuda_sync", ev.OTELGPU_TORCH_CUDA_SYNC, None, _bool, "true or false",
            "Synchronize to resolve CUDA events (exact, slower)."),
    Setting("flops_per_step", ev.OTELGPU_TORCH_FLOPS_PER_STEP, None,
            _float_range(0.0, 1e24, lo_open=True, hi_open=False),
            "a number of FLOPs in (0, 1e24]", "Model FLOPs of one step (for MFU)."),
    Setting("count_flops", ev.OTELGPU_TORCH_COUNT_FLOPS, None, _bool, "true or false",
            "Count one step's model FLOPs with torch's FLOP counter (for MFU)."),
)  # fmt: skip

_HOOK_KEYWORDS = (("data", "data"), ("comm", "comm"), ("checkpoints", "checkpoint"))


def _hook_families(env: Mapping[str, str]) -> set[str]:
    raw = env.get(ev.OTELGPU_TORCH_HOOKS)
    if raw is None or not raw.strip():
        return set(HOOK_FAMILIES)
    families = {p.strip().lower() for p in raw.split(",") if p.strip()}
    if not families <= set(HOOK_FAMILIES) and families != {"none"}:
        raise ConfigurationError(
            ev.OTELGPU_TORCH_HOOKS,
            raw,
            "a comma-separated subset of data, comm, checkpoint, or none",
        )
    return families


def resolve(kwargs: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> TorchSettings:
    """Builds the settings from ``instrument()`` keywords and the environment.

    Raises:
        ConfigurationError: a value is invalid (names the keyword or the variable).
    """
    env = os.environ if environ is None else environ
    values = resolve_table(SETTINGS, kwargs, env)
    families = _hook_families(env)
    for key, family in _HOOK_KEYWORDS:
        raw = kwargs.get(key)
        values[key] = _bool_setting(raw, key) if raw is not None else family in families
    step_optimizer = kwargs.get("step_optimizer")
    if step_optimizer is not None and not callable(getattr(step_optimizer, "step", None)):
        raise ConfigurationError(
            "step_optimizer", step_optimizer, "an optimizer (an object with step())"
        )
    return TorchSettings(step_optimizer=step_optimizer, **values)


def _bool_setting(raw: object, name: str) -> bool:
    try:
        return _bool(raw)
    except ValueError:
        raise ConfigurationError(name, raw, "true or false") from None
