"""Range checks for the numbers callers hand to ``step()``, ``request()`` and the runtime.

One out-of-range number must never reach an exporter: an integer of 2**63 or more in a
counter or a span attribute makes every later OTLP export fail ("Value out of range"),
GPU metrics included, for the life of the process. So every count and duration a caller
supplies passes through :func:`count` or :func:`duration` first. The policy is **reject**:
an invalid value is dropped (the step or request is still recorded, without that field),
counted in ``otelgpu.internal.rejected{otelgpu.field, otelgpu.reason}``, and never raised.

Reasons: ``not_a_number`` (not a real number, or a bool), ``nan``, ``infinite``,
``negative``, ``too_large`` (above :data:`MAX_COUNT` / :data:`MAX_DURATION_S`).
"""

from __future__ import annotations

import math
import numbers
from typing import Protocol

MAX_COUNT = 2**53
"""Largest count accepted per call (samples, tokens, step numbers): exact as a float, and
2**10 such calls still fit the signed 64-bit integers OTLP carries."""

MAX_DURATION_S = 31_536_000.0
"""Largest duration accepted, in seconds (one year)."""

MAX_FLOPS = 1e24
"""Largest FLOPs per step accepted (counts of a step exceed 2**53 on large models)."""


class Rejecter(Protocol):
    """Where rejections are counted (``InternalStats``)."""

    def add_rejected(self, field: str, reason: str) -> None: ...


def _reason(value: object, limit: float) -> str | None:
    if isinstance(value, bool):
        return "not_a_number"
    if isinstance(value, int):  # compared exactly (float(2**53 + 1) would round)
        return "negative" if value < 0 else "too_large" if value > limit else None
    if not isinstance(value, numbers.Real):
        return "not_a_number"
    number = float(value)
    if math.isnan(number):
        return "nan"
    if math.isinf(number):
        return "infinite"
    return "negative" if number < 0 else "too_large" if number > limit else None


def _accepted(value: object, limit: float, field: str, stats: Rejecter | None) -> bool:
    """True if ``value`` is a number in ``[0, limit]``; else its rejection is counted."""
    reason = _reason(value, limit)
    if reason is None:
        return True
    if stats is not None:
        stats.add_rejected(field, reason)
    return False


def count(value: object, field: str, stats: Rejecter | None) -> float | None:
    """``value`` if it is a count in ``[0, MAX_COUNT]``, else ``None`` (counted).

    ``None`` passes through silently (the field was not given).
    """
    if type(value) is int and 0 <= value <= MAX_COUNT:  # the common case, checked inline
        return value
    if value is None or not _accepted(value, MAX_COUNT, field, stats):
        return None
    return value  # type: ignore[return-value]


def duration(value: object, field: str, stats: Rejecter | None) -> float | None:
    """``value`` (seconds) if it is in ``[0, MAX_DURATION_S]``, else ``None`` (counted)."""
    if type(value) is float and 0.0 <= value <= MAX_DURATION_S:  # the common case (NaN fails)
        return value
    if value is None or not _accepted(value, MAX_DURATION_S, field, stats):
        return None
    return float(value)  # type: ignore[arg-type]


def flops(value: object, field: str, stats: Rejecter | None) -> float | None:
    """``value`` if it is a FLOP count in ``[0, MAX_FLOPS]``, else ``None`` (counted)."""
    if type(value) is float and 0.0 <= value <= MAX_FLOPS:  # every step's figure (NaN fails)
        return value
    if value is None or not _accepted(value, MAX_FLOPS, field, stats):
        return None
    return float(value)  # type: ignore[arg-type]


__all__ = ["MAX_COUNT", "MAX_DURATION_S", "MAX_FLOPS", "Rejecter", "count", "duration", "flops"]
