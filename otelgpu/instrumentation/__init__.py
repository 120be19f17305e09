"""OpenTelemetry instrumentors (entry points ``opentelemetry_instrumentor``).

One subpackage per target -- ``gpu`` (no dependencies), ``torch``, ``vllm`` -- each
imported only by its own entry point, so a missing framework (``import torch`` raising
``ModuleNotFoundError``) disables only that instrumentor, never the GPU metrics.
"""
