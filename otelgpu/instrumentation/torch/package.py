"""What ``TorchInstrumentor`` instruments (checked without importing torch)."""

from __future__ import annotations

_instruments: tuple[str, ...] = ("torch >= 2.1",)
