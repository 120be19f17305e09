"""Sketch fixtures: every test runs against each twin that is available.

In the ``OTELGPU_NO_EXTENSIONS=1`` run only the pure-Python twin is tested; otherwise
both (``test_sketch_native.py`` fails if the native one did not load).
"""

from __future__ import annotations

import pytest

from otelgpu import _impl
from otelgpu.sketch import _sketch_py

IMPLS = [pytest.param(_sketch_py.QuantileSketch, id="py")]
NATIVE = _impl.native_module("otelgpu.sketch._sketch_c")
if NATIVE is not None:
    IMPLS.append(pytest.param(NATIVE.QuantileSketch, id="c"))


@pytest.fixture(params=IMPLS)
def sketch_cls(request: pytest.FixtureRequest) -> type:
    """A ``QuantileSketch`` class: the Python twin, then the native one if loaded."""
    return request.param  # type: ignore[no-any-return]
