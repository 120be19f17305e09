"""Fixtures of the pipeline tests. The shared ones live in tests/fixtures/ (once the root
conftest lists them in ``pytest_plugins``, these imports become redundant but harmless)."""

from __future__ import annotations

from fixtures.otel import reset_otel_globals, rotel
from fixtures.otlp_receiver import otlp_receiver

__all__ = ["otlp_receiver", "reset_otel_globals", "rotel"]
