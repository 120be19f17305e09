"""Metric definitions (``_names``) and the GPU observable instruments (``gpu``).

``otelgpu.metrics.gpu.register_gpu_metrics(meter, sampler)`` creates the ``hw.*``
and ``otelgpu.gpu.*`` instruments; every metric is documented in ``docs/metrics.md``.
"""

from __future__ import annotations

from otelgpu.metrics._names import BY_NAME, GPU_METRICS, SAMPLER_METRICS, MetricSpec

__all__ = ["BY_NAME", "GPU_METRICS", "SAMPLER_METRICS", "MetricSpec"]
