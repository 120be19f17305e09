"""What the vLLM instrumentation instruments, as data (read by ``BaseInstrumentor``)."""

from __future__ import annotations

_instruments = ("vllm >= 0.10",)
"""Requirement checked by ``opentelemetry-instrument`` before ``VllmInstrumentor`` loads."""

TESTED_VERSIONS = ("0.34.0",)
"""vLLM releases the contract tests (tests/vllm/) ran against with vLLM's real classes."""

SUPPORTED_RANGE = ">=0.10, <0.35"
"""Releases the stat logger is written for: the V1 ``StatLoggerBase`` interface exists from
0.10; later releases may change the stats fields (each mismatch is warned about once)."""
