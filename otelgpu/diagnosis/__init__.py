"""Answers, not only signals: step phases, rank stragglers with their cause, drift, memory
creep and the end-of-run verdict.

Small pure detectors (:mod:`.phases`, :mod:`.stragglers`, :mod:`.drift`, :mod:`.summary`)
take records and yield findings; :mod:`.emit` is the one place findings become span events,
counters and log lines; :mod:`.training` wires them to the torch instrumentation and
:mod:`.exchange` exchanges window summaries between ranks. What is exported and how each
answer is computed: ``docs/diagnosis.md``.

Public: :func:`verdict` (the verdict so far, on demand) and :func:`active`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from otelgpu.diagnosis.summary import Verdict
    from otelgpu.diagnosis.training import TrainingDiagnosis

__all__ = ["active", "verdict"]

_active: Any = None


def _set_active(diagnosis: Any) -> None:
    global _active
    _active = diagnosis


def active() -> TrainingDiagnosis | None:
    """The training diagnosis of the live torch instrumentation, or None."""
    return _active  # type: ignore[no-any-return]


def verdict() -> Verdict | None:
    """The run's verdict so far (``Verdict.text()`` is the one-screen summary), or None
    when the torch instrumentation is not on with diagnosis. Never raises."""
    diagnosis = _active
    if diagnosis is None:
        return None
    try:
        return diagnosis.verdict()  # type: ignore[no-any-return]
    except Exception:  # noqa: BLE001 - on demand, best effort
        return None
