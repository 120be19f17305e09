"""Metrics-area fixtures: a sampler twin over the simulator plus an in-memory reader."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fixtures.metric_readers import DirectInMemoryReader
from fixtures.otel import reset_otel_globals  # noqa: F401 - fixture
from fixtures.sim import SMALL_SCENARIO, sim_gpu, sim_scenario  # noqa: F401 - fixtures
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otelgpu import _impl
from otelgpu.sampler import BaseGpuSampler, NativeGpuSampler, PyGpuSampler

TWINS: list[Any] = [pytest.param(PyGpuSampler, id="py")]
if not _impl.NO_EXTENSIONS:
    TWINS.append(pytest.param(NativeGpuSampler, id="native"))


@pytest.fixture(params=TWINS)
def metrics_sampler_cls(request: pytest.FixtureRequest) -> type[BaseGpuSampler]:
    """Each sampler twin in turn."""
    assert request.param is not None, "native sampler did not load"
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(params=["sdk", "direct"])
def reader(request: pytest.FixtureRequest) -> Iterator[tuple[InMemoryMetricReader, MeterProvider]]:
    """A real SDK MeterProvider with an InMemoryMetricReader (never the global one); for
    "direct", the reader also exports the metrics registered with its ``direct``."""
    reader = DirectInMemoryReader() if request.param == "direct" else InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield reader, provider
    provider.shutdown()


def points(reader: InMemoryMetricReader) -> dict[str, tuple[str, list[tuple[dict[str, Any], Any]]]]:
    """Collect once: {metric name: (unit, [(attributes, value), ...])}."""
    data = reader.get_metrics_data()
    out: dict[str, tuple[str, list[tuple[dict[str, Any], Any]]]] = {}
    if data is None:
        return out
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                rows = [
                    (dict(p.attributes or {}), getattr(p, "value", p))
                    for p in metric.data.data_points
                ]
                out[metric.name] = (metric.unit or "", rows)
    return out


@pytest.fixture
def collect() -> Any:
    """``collect(reader)`` → {name: (unit, [(attributes, value)])}."""
    return points
