"""Fixtures of the simulator's own tests.

``sim_gpu``/``sim_scenario`` come from tests/fixtures/sim.py (imported here so this
area works before ``fixtures.sim`` is registered suite-wide in tests/conftest.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from fixtures.sim import sim_gpu, sim_scenario

__all__ = ["nvml", "sim_gpu", "sim_scenario"]


@pytest.fixture
def nvml() -> Iterator[Any]:
    """pynvml, initialised against the active simulator; shut down afterwards."""
    import pynvml

    pynvml.nvmlInit()
    yield pynvml
    with contextlib.suppress(pynvml.NVMLError):  # the test may have unloaded the scenario
        pynvml.nvmlShutdown()
