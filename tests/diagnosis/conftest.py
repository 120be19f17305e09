"""Fixtures of the diagnosis tests: an otelgpu Runtime over in-memory providers (shared
with the torch tests' helpers)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch"))

from torch_helpers import RuntimeHarness


@pytest.fixture
def harness() -> Iterator[RuntimeHarness]:
    """A Runtime (no GPU) on in-memory providers; TorchInstrumentor off afterwards."""
    h = RuntimeHarness()
    try:
        yield h
    finally:
        h.close()
