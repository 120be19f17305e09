"""Environment variables of the vLLM instrumentation (read once, when a stat logger starts).

Invalid values fail fast with :class:`otelgpu.errors.ConfigurationError` naming the variable:
a stat logger is built while vLLM starts its engine, before any request is served.
"""

from __future__ import annotations

OTELGPU_VLLM_TIMEOUT_S = "OTELGPU_VLLM_TIMEOUT_S"
"""Seconds; a finished request whose end-to-end time reached this value gets the outcome
``timeout`` (``otelgpu.inference.requests{otelgpu.request.outcome=timeout}``, span status
ERROR, ``error.type=timeout``) whatever its finish reason. Unset (default): never.

vLLM itself has no timeout finish reason: a proxy or client that gives up makes vLLM abort
the request, so set this to the timeout your clients or gateway use."""

OTELGPU_VLLM_TRACE_CONTEXT = "OTELGPU_VLLM_TRACE_CONTEXT"
"""``true`` (default) / ``false``: wrap vLLM's ``add_request`` to remember each request's
incoming trace context (W3C ``traceparent`` headers, or the caller's active span) so the
request span joins the caller's trace."""
