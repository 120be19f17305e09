"""The GPU metrics reach the wire the same way whichever path builds them.

otelgpu's own meter provider builds them as data points (``otelgpu.metrics.direct``);
attached to an application's meter provider they are SDK observable instruments (the
application's views may apply there). Here one process has both, over the same sampler
and samples: the runtime's (direct) and ``register_gpu_metrics`` on an application meter
(SDK), each exported over real OTLP gRPC to a live receiver. Every GPU metric has the same
name, unit, description, kind, temporality, monotonicity and points.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from fixtures.otlp_receiver import OtlpReceiver, attributes
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

import otelgpu
from otelgpu import sim
from otelgpu.metrics import catalog as N
from otelgpu.metrics.gpu import register_gpu_metrics
from otelgpu.sampler._startup import gpu_inventory

pytestmark = pytest.mark.usefixtures("reset_otel_globals")

SCENARIO = {
    "version": 1,
    "name": "two-busy",
    "gpus": {"count": 2, "model": "H100-SXM", "utilization": 70},
}


@pytest.fixture
def virtual_sim() -> Iterator[sim.SimGpu]:
    gpu = sim.activate(SCENARIO, clock="virtual")
    yield gpu
    sim.deactivate()


def _gpu_metrics(receiver: OtlpReceiver, scope: str) -> dict[str, Any]:
    """{name: (unit, description, kind, temporality, monotonic, sorted points)} of
    ``scope``'s first collection."""
    out: dict[str, Any] = {}
    gpu_names = {spec.name for spec in N.GPU_METRICS}
    for _resource, scope_name, metric in receiver.metrics("grpc"):
        if scope_name != scope or metric.name not in gpu_names or metric.name in out:
            continue
        kind = metric.WhichOneof("data")
        data = getattr(metric, kind)
        assert all(p.start_time_unix_nano <= p.time_unix_nano for p in data.data_points)
        points = sorted(
            (sorted(attributes(p.attributes).items(), key=str), p.as_int or p.as_double)
            for p in data.data_points
        )
        out[metric.name] = (
            metric.unit,
            metric.description,
            kind,
            getattr(data, "aggregation_temporality", None),
            getattr(data, "is_monotonic", None),
            points,
        )
    return out


def test_direct_and_sdk_gpu_metrics_are_the_same_on_the_wire(
    otlp_receiver: OtlpReceiver, virtual_sim: sim.SimGpu
) -> None:
    exporter = OTLPMetricExporter(endpoint=otlp_receiver.grpc_endpoint, insecure=True)
    app = MeterProvider(metric_readers=[PeriodicExportingMetricReader(exporter, 3_600_000)])
    handle = otelgpu.instrument(
        exporters="otlp",
        otlp_endpoint=otlp_receiver.grpc_endpoint,
        otlp_protocol="grpc",
        otlp_insecure=True,
        frameworks="none",
        gpu_startup_wait_ms=10_000,
        metric_export_interval_ms=3_600_000,
    )
    try:
        runtime = handle.runtime
        assert runtime is not None and runtime.pipeline is not None
        assert runtime.pipeline.direct_metrics is not None  # otelgpu owns its provider
        sampler = runtime.sampler
        sampler.stop()  # only the samples below
        # As the runtime registers its own: with the inventory's device attributes.
        register_gpu_metrics(app.get_meter("sdk-path"), sampler, gpu_inventory(sampler).devices)
        # GPM metrics need two samples at least 100 ms apart on the sampler's (wall) clock.
        for _ in range(3):
            virtual_sim.advance(0.5)
            time.sleep(0.11)
            sampler.sample_once()
        virtual_sim.inject("throttle", gpu=1, reason="hw_slowdown", duration_s=5.0)
        virtual_sim.advance(0.5)
        time.sleep(0.11)
        sampler.sample_once()
        # The same virtual time for both collections: the same windows.
        runtime.pipeline.force_flush()
        app.force_flush()
    finally:
        handle.shutdown()
        app.shutdown()
    direct = _gpu_metrics(otlp_receiver, "otelgpu")
    via_sdk = _gpu_metrics(otlp_receiver, "sdk-path")
    assert len(direct) > 20
    assert direct == via_sdk
    # Both saw both GPUs, the GPM activities, and the hardware throttle on the second GPU.
    assert N.SM_ACTIVITY.name in direct
    degraded = [
        value for attrs, value in direct[N.STATUS.name][5] if dict(attrs)["hw.state"] == "degraded"
    ]
    assert sorted(degraded) == [0, 1]
