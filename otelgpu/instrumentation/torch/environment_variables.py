"""Environment variables of the PyTorch instrumentation (read once, at ``instrument()``).

Keyword arguments of ``TorchInstrumentor().instrument(...)`` take precedence. Invalid
values fail fast with :class:`otelgpu.errors.ConfigurationError` naming the variable.
"""

from __future__ import annotations

OTELGPU_TORCH_SPAN_EVERY = "OTELGPU_TORCH_SPAN_EVERY"
"""Integer >= 1 (default 1): emit a step span for every n-th step (steps 1, n+1, 2n+1, ...;
steps with an OOM event always get one). Metrics always cover every step.
Keyword: ``span_every``."""

OTELGPU_TORCH_RESET_PEAK = "OTELGPU_TORCH_RESET_PEAK"
"""``true``/``false`` (default ``false``): reset the CUDA allocator's peak statistics after
each step so ``otelgpu.train.cuda.memory.peak`` is a per-step peak. The peak is
process-global: other tools reading it (HF ``TrainerMemoryTracker``, Lightning
``DeviceStatsMonitor``) then see per-step peaks too. Keyword: ``reset_peak_memory``."""

OTELGPU_TORCH_HOOKS = "OTELGPU_TORCH_HOOKS"
"""Comma-separated optional hook families to install: any of ``data``, ``comm``,
``checkpoint`` (default: all three). Step detection is always on. Keywords: ``data``,
``comm``, ``checkpoints`` (booleans)."""
