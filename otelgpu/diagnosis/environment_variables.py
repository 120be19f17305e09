"""Environment variables of the diagnosis package (read once, at ``instrument()``).

Defined, with their documentation, in :mod:`otelgpu.environment_variables` (otelgpu's one
table of variables); re-exported here. Keyword arguments of
``TorchInstrumentor().instrument(...)`` take precedence. Invalid values fail fast with
:class:`otelgpu.errors.ConfigurationError` naming the variable and the accepted values.
"""

from __future__ import annotations

from otelgpu.environment_variables import (
    OTELGPU_BASELINE,
    OTELGPU_DIAGNOSIS,
    OTELGPU_DIAGNOSIS_EXCHANGE_EVERY,
    OTELGPU_DIAGNOSIS_STRAGGLER_THRESHOLD,
    OTELGPU_DIAGNOSIS_VERDICT,
)

__all__ = [
    "OTELGPU_BASELINE",
    "OTELGPU_DIAGNOSIS",
    "OTELGPU_DIAGNOSIS_EXCHANGE_EVERY",
    "OTELGPU_DIAGNOSIS_STRAGGLER_THRESHOLD",
    "OTELGPU_DIAGNOSIS_VERDICT",
]
