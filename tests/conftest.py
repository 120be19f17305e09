"""Suite-wide fixtures. Area fixtures live in tests/<area>/conftest.py; fixtures shared
across areas live in tests/fixtures/ and are loaded here."""

from __future__ import annotations

import os

import pytest

from otelgpu import _impl

pytest_plugins = [
    "fixtures.sim",
    "fixtures.otlp_receiver",
    "fixtures.otel",
    "fixtures.reliability",
    "fixtures.thread_audit",
]

NO_EXTENSIONS = _impl.NO_EXTENSIONS


@pytest.fixture(scope="session")
def native_enabled() -> bool:
    """False in the ``OTELGPU_NO_EXTENSIONS=1`` run of the suite."""
    return not NO_EXTENSIONS and os.environ.get("OTELGPU_NO_EXTENSIONS", "") in ("", "0")
