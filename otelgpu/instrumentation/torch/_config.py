"""Settings of the torch instrumentation: keyword > ``OTELGPU_TORCH_*`` variable > default."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from otelgpu.errors import ConfigurationError
from otelgpu.instrumentation.torch import environment_variables as ev

__all__ = ["HOOK_FAMILIES", "TorchSettings", "resolve"]

HOOK_FAMILIES = ("data", "comm", "checkpoint")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


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


def _span_every(raw: object, setting: str) -> int:
    try:
        if isinstance(raw, bool):
            raise TypeError(raw)
        value = int(raw.strip()) if isinstance(raw, str) else raw
        if not isinstance(value, int) or value < 1:
            raise ValueError(raw)
    except (TypeError, ValueError):
        raise ConfigurationError(setting, raw, "an integer >= 1") from None
    return value


def _bool(raw: object, setting: str) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in _TRUE + _FALSE:
        return raw.strip().lower() in _TRUE
    raise ConfigurationError(setting, raw, "true or false")


def _flag(
    kwargs: Mapping[str, Any], env: Mapping[str, str], key: str, name: str, default: bool
) -> bool:
    """A boolean setting: keyword ``key`` > variable ``name`` > ``default``."""
    if kwargs.get(key) is not None:
        return _bool(kwargs[key], key)
    raw = env.get(name)
    if raw is not None and raw.strip():
        return _bool(raw, name)
    return default


def resolve(kwargs: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> TorchSettings:
    """Builds the settings from ``instrument()`` keywords and the environment.

    Raises:
        ConfigurationError: a value is invalid (names the keyword or the variable).
    """
    env = os.environ if environ is None else environ
    if kwargs.get("span_every") is not None:
        span_every = _span_every(kwargs["span_every"], "span_every")
    elif env.get(ev.OTELGPU_TORCH_SPAN_EVERY):
        span_every = _span_every(env[ev.OTELGPU_TORCH_SPAN_EVERY], ev.OTELGPU_TORCH_SPAN_EVERY)
    else:
        span_every = 1
    if kwargs.get("reset_peak_memory") is not None:
        reset_peak = _bool(kwargs["reset_peak_memory"], "reset_peak_memory")
    elif env.get(ev.OTELGPU_TORCH_RESET_PEAK):
        reset_peak = _bool(env[ev.OTELGPU_TORCH_RESET_PEAK], ev.OTELGPU_TORCH_RESET_PEAK)
    else:
        reset_peak = False
    families = set(HOOK_FAMILIES)
    raw_hooks = env.get(ev.OTELGPU_TORCH_HOOKS)
    if raw_hooks is not None and raw_hooks.strip():
        families = {p.strip().lower() for p in raw_hooks.split(",") if p.strip()}
        if not families <= set(HOOK_FAMILIES) and families != {"none"}:
            raise ConfigurationError(
                ev.OTELGPU_TORCH_HOOKS,
                raw_hooks,
                "a comma-separated subset of data, comm, checkpoint, or none",
            )
    flags = {}
    for key, family in (("data", "data"), ("comm", "comm"), ("checkpoints", "checkpoint")):
        raw = kwargs.get(key)
        flags[key] = _bool(raw, key) if raw is not None else family in families
    cuda = {
        key: _flag(kwargs, env, key, name, default)
        for key, name, default in (
            ("cuda_events", ev.OTELGPU_TORCH_CUDA_EVENTS, True),
            ("gpu_step_time", ev.OTELGPU_TORCH_GPU_STEP_TIME, False),
            ("cuda_sync", ev.OTELGPU_TORCH_CUDA_SYNC, False),
        )
    }
    step_optimizer = kwargs.get("step_optimizer")
    if step_optimizer is not None and not callable(getattr(step_optimizer, "step", None)):
        raise ConfigurationError(
            "step_optimizer", step_optimizer, "an optimizer (an object with step())"
        )
    return TorchSettings(
        span_every=span_every,
        reset_peak_memory=reset_peak,
        data=flags["data"],
        comm=flags["comm"],
        checkpoints=flags["checkpoints"],
        step_optimizer=step_optimizer,
        **cuda,
    )
