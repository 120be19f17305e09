"""Fixtures of the diagnosis tests: an otelgpu Runtime over in-memory providers (shared
with the torch tests, from ``fixtures.torch_runtime``)."""

from __future__ import annotations

from fixtures.torch_runtime import harness

__all__ = ["harness"]
