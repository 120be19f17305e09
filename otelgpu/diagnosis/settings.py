"""Settings of the diagnosis package: keyword > ``OTELGPU_DIAGNOSIS_*`` variable > default."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from otelgpu.diagnosis import environment_variables as ev
from otelgpu.errors import ConfigurationError

__all__ = ["DEFAULT_EXCHANGE_EVERY", "DiagnosisSettings", "resolve"]

DEFAULT_EXCHANGE_EVERY = 50
"""Steps between two rank exchanges. Measured (``benchmarks/bench_diagnosis.py``): the
exchange runs on its own thread, so its host cost is a summary build and a queue hand-off
per window; at 5 ms steps and 50 steps the window is 250 ms, long enough for the GPU
sampler (10 Hz) to have a few samples per rank in each window."""

_N = TypeVar("_N", int, float)
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class DiagnosisSettings:
    """Resolved settings (immutable)."""

    enabled: bool = True
    exchange_every: int = DEFAULT_EXCHANGE_EVERY
    straggler_threshold: float = 0.10
    verdict_log: bool = True
    baseline: str | None = None  # baseline file for the drift detectors (validated)


def _raw(kwargs: Mapping[str, Any], env: Mapping[str, str], key: str, var: str) -> tuple[Any, str]:
    if kwargs.get(key) is not None:
        return kwargs[key], key
    raw = env.get(var)
    if raw is not None and raw.strip():
        return raw.strip(), var
    return None, key


def _bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
        return value.lower() in _TRUE
    raise ConfigurationError(where, value, "true or false")


def _number(
    value: Any, where: str, kind: Callable[[Any], _N], expected: str, ok: Callable[[_N], bool]
) -> _N:
    """``value`` (not a bool) as a ``kind`` that is ``ok``, else ``ConfigurationError``."""
    try:
        if isinstance(value, bool):
            raise TypeError(value)
        number = kind(value)
    except (TypeError, ValueError):
        number = None
    if number is None or not ok(number):
        raise ConfigurationError(where, value, expected)
    return number


def resolve(
    kwargs: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> DiagnosisSettings:
    """Builds the settings; raises ``ConfigurationError`` naming a bad keyword or variable."""
    env = os.environ if environ is None else environ
    d = DiagnosisSettings()
    value, where = _raw(kwargs, env, "diagnosis", ev.OTELGPU_DIAGNOSIS)
    enabled = d.enabled if value is None else _bool(value, where)
    value, where = _raw(kwargs, env, "verdict_log", ev.OTELGPU_DIAGNOSIS_VERDICT)
    verdict_log = d.verdict_log if value is None else _bool(value, where)
    value, where = _raw(kwargs, env, "exchange_every", ev.OTELGPU_DIAGNOSIS_EXCHANGE_EVERY)
    every = d.exchange_every
    if value is not None:
        every = _number(value, where, int, "an integer >= 0 (0: no exchange)", lambda n: n >= 0)
    var = ev.OTELGPU_DIAGNOSIS_STRAGGLER_THRESHOLD
    value, where = _raw(kwargs, env, "straggler_threshold", var)
    threshold = d.straggler_threshold
    if value is not None:  # NaN is not > 0
        threshold = _number(value, where, float, "a number > 0 (e.g. 0.1)", lambda t: t > 0)
    value, where = _raw(kwargs, env, "baseline", ev.OTELGPU_BASELINE)
    baseline = None
    if value is not None:
        from otelgpu.baseline.drift import check_file

        try:
            baseline = check_file(os.fspath(value))
        except (ValueError, TypeError):
            raise ConfigurationError(
                where,
                value,
                "a baseline file with a recorded distribution "
                "(otelgpu baseline learn --recording FILE... --out FILE)",
            ) from None
    return DiagnosisSettings(enabled, every, threshold, verdict_log, baseline)
