"""Sampler-area fixtures: both sampler twins against the simulated NVML.

``sampler_cls`` runs a test once per twin (pure Python always; native unless
``OTELGPU_NO_EXTENSIONS`` is set). ``make_sampler`` builds samplers that are closed
at teardown, before the simulator is unloaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fixtures.sim import SMALL_SCENARIO, sim_gpu, sim_scenario, twins  # noqa: F401 - fixtures

from otelgpu import _impl
from otelgpu.sampler import BaseGpuSampler, NativeGpuSampler, PyGpuSampler

TWINS: list[Any] = [pytest.param(PyGpuSampler, id="py")]
if not _impl.NO_EXTENSIONS:
    TWINS.append(pytest.param(NativeGpuSampler, id="native"))


@pytest.fixture(params=TWINS)
def sampler_cls(request: pytest.FixtureRequest) -> type[BaseGpuSampler]:
    """Each sampler twin in turn."""
    cls = request.param
    assert cls is not None, "native sampler did not load although extensions are enabled"
    return cls  # type: ignore[no-any-return]


@pytest.fixture
def make_sampler(
    sampler_cls: type[BaseGpuSampler],
) -> Iterator[Callable[..., BaseGpuSampler]]:
    """Factory ``make_sampler(**kwargs)``; every sampler is closed at teardown."""
    made: list[BaseGpuSampler] = []

    def _make(*args: Any, **kwargs: Any) -> BaseGpuSampler:
        sampler = sampler_cls(*args, **kwargs)
        made.append(sampler)
        return sampler

    yield _make
    for sampler in made:
        assert sampler.stop(timeout_s=5.0)
        sampler.close()
