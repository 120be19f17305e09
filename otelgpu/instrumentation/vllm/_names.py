"""Attribute and span names of the vLLM instrumentation.

The vLLM metrics themselves are rows of ``otelgpu.metrics.catalog`` (``VLLM_METRICS``, and
``VLLM_RUNTIME_SOURCES`` for the request metrics it feeds); docs/metrics-vllm.md documents
them, checked by the tests.
"""

from __future__ import annotations

from typing import Final

# --- attributes ---
ATTR_PROVIDER: Final = "gen_ai.provider.name"
ATTR_MODEL: Final = "gen_ai.request.model"
ATTR_ENGINE: Final = "otelgpu.vllm.engine"
ATTR_FINISH_REASON: Final = "otelgpu.vllm.finish_reason"
ATTR_TOKEN_TYPE: Final = "gen_ai.token.type"

PROVIDER: Final = "vllm"
STARTUP_SPAN_NAME: Final = "vllm.engine.startup"
