"""Metric definitions and the GPU observable instruments.

``spec`` (the :class:`MetricSpec` record), ``catalog`` (every metric of otelgpu),
``instruments`` (creates instruments from specs, once each; ``Runtime.instrument``) and
``gpu`` (``register_gpu_metrics(runtime, sampler)`` feeds the ``hw.*`` and
``otelgpu.gpu.*`` instruments). Every metric is documented in ``docs/metrics*.md``.
"""

from __future__ import annotations

from otelgpu.metrics.catalog import ALL, BY_NAME, GPU_METRICS, SAMPLER_METRICS
from otelgpu.metrics.spec import Area, Kind, MetricSpec, Status

__all__ = [
    "ALL",
    "BY_NAME",
    "GPU_METRICS",
    "SAMPLER_METRICS",
    "Area",
    "Kind",
    "MetricSpec",
    "Status",
]
