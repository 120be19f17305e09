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

OTELGPU_TORCH_CUDA_EVENTS = "OTELGPU_TORCH_CUDA_EVENTS"
"""``true``/``false`` (default ``true``): time collectives on CUDA tensors (NCCL) on the GPU
with a pair of CUDA timing events on the current stream, resolved later without blocking
(``otelgpu.train.comm.gpu.duration``, span attribute ``otelgpu.train.comm.gpu``). Inert on
CPU tensors. Keyword: ``cuda_events``."""

OTELGPU_TORCH_GPU_STEP_TIME = "OTELGPU_TORCH_GPU_STEP_TIME"
"""``true``/``false`` (default ``false``): record a CUDA timing event at each step end and
report the GPU time between consecutive step ends (``otelgpu.train.step.gpu.duration``, span
attribute ``otelgpu.train.step.gpu``). Keyword: ``gpu_step_time``."""

OTELGPU_TORCH_CUDA_SYNC = "OTELGPU_TORCH_CUDA_SYNC"
"""``true``/``false`` (default ``false``): wait for each timed collective's end event
(``Event.synchronize()``) so its GPU duration is known at once. This blocks the training loop
until the collective finished on the GPU: a diagnostic setting, never a default.
Keyword: ``cuda_sync``."""

OTELGPU_TORCH_FLOPS_PER_STEP = "OTELGPU_TORCH_FLOPS_PER_STEP"
"""Model FLOPs of one optimizer step (a number > 0, e.g. ``6 * params * tokens_per_step`` or
the count of ``otelgpu.gpu_truth.flops.count_flops``); enables ``otelgpu.train.mfu`` on step
spans and its sketch. Keyword: ``flops_per_step``. Set, it wins over the counted figure
(``OTELGPU_TORCH_COUNT_FLOPS``): nothing is counted."""

OTELGPU_TORCH_COUNT_FLOPS = "OTELGPU_TORCH_COUNT_FLOPS"
"""``true``/``false`` (default ``true``): without ``OTELGPU_TORCH_FLOPS_PER_STEP``, count the
model FLOPs of one early step with ``torch.utils.flop_counter.FlopCounterMode`` (again
when the input shapes change, at most 8 shapes) for ``otelgpu.train.mfu``. The counted step
runs about 1.5-3x slower on CPU; it carries no MFU itself. Not counted (logged once) under
``torch.compile`` or DeepSpeed. Keyword: ``count_flops``."""
