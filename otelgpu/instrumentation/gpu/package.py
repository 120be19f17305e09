"""What ``GpuMetricsInstrumentor`` instruments: nothing but the process (no framework)."""

from __future__ import annotations

_instruments: tuple[str, ...] = ()
