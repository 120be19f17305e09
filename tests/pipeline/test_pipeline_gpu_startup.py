"""GPU start-up never holds the caller: discovery, inventory and the sampler's NVML
session run off ``instrument()``'s thread, bounded by ``gpu_startup_wait_ms``.

* a degraded driver (50 ms per NVML call, 8 GPUs: about 10 s of calls) must not block
  ``instrument()`` beyond the bound; the GPU metrics appear when discovery ends;
* a GPU already lost at start keeps the others' resource attributes and raises a
  health signal of its own;
* ``OTELGPU_SIM`` announces itself once, loudly; an unknown scenario fails fast naming
  the setting and the built-in scenarios; a clock typo names ``OTELGPU_SIM_CLOCK``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fixtures.otel import attributes_of, metrics_data, point_value
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

import otelgpu
from otelgpu import sim
from otelgpu.errors import ConfigurationError

pytestmark = pytest.mark.usefixtures("reset_otel_globals")


def _scenario(count: int, **driver: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "name": f"startup-{count}",
        "driver": driver,
        "gpus": {"count": count, "model": "H100-SXM", "utilization": 50},
    }


@pytest.fixture
def unload_sim() -> Iterator[None]:
    yield
    sim.deactivate()


def _metric_names(reader: InMemoryMetricReader) -> set[str]:
    data = reader.get_metrics_data()
    if data is None:
        return set()
    return {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


@pytest.mark.usefixtures("unload_sim")
def test_pipeline_slow_driver_does_not_block_instrument() -> None:
    gpu = sim.activate(_scenario(8), clock="wall")
    # 50 ms per device call for 3 s: all of discovery (~200 calls, ~10 s) would be slow;
    # the driver recovers after 3 s so the test need not wait for 10 s of calls.
    gpu.inject("slow", gpu="all", latency_ms=50, duration_s=3.0)
    reader = InMemoryMetricReader()
    begin = time.monotonic()
    handle = otelgpu.instrument(
        exporters="none",
        frameworks="none",
        gpu_startup_wait_ms=200,
        meter_provider=MeterProvider(metric_readers=[reader]),
    )
    took = time.monotonic() - begin
    try:
        # 200 ms of waiting plus the pipeline's own set-up.
        assert took < 1.5, f"instrument() blocked {took:.2f} s on a 50 ms/call driver"
        runtime = handle.runtime
        assert runtime is not None and runtime.sampler is not None
        assert runtime.sampler.devices == ()  # still discovering: no devices yet
        assert "hw.gpu.utilization" not in _metric_names(reader)
        with otelgpu.step(samples=1):  # the host works meanwhile
            pass
        # ... and the GPU metrics appear once discovery ends.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(runtime.sampler.devices) < 8:
            time.sleep(0.1)
        assert len(runtime.sampler.devices) == 8
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "hw.gpu.utilization" not in _metric_names(reader):
            time.sleep(0.2)
        assert "hw.gpu.utilization" in _metric_names(reader)
    finally:
        handle.shutdown()
    assert handle.runtime is not None and not handle.runtime.sampler.running


@pytest.mark.usefixtures("unload_sim")
def test_pipeline_shutdown_during_discovery_releases_nvml() -> None:
    gpu = sim.activate(_scenario(8, latency_ms=5), clock="wall")
    held = gpu.nvml_refcount()
    handle = otelgpu.instrument(exporters="none", frameworks="none", gpu_startup_wait_ms=0)
    handle.shutdown()  # discovery still running: waits (bounded), then releases NVML
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and gpu.nvml_refcount() != held:
        time.sleep(0.05)
    assert gpu.nvml_refcount() == held
    runtime = handle.runtime
    assert runtime is not None and not runtime.sampler.running


def _lost_at_start() -> dict[str, Any]:
    scenario = _scenario(3)
    scenario["event"] = [{"at_s": 0, "kind": "gpu_lost", "gpu": 1}]
    return scenario


@pytest.mark.usefixtures("unload_sim")
def test_pipeline_gpu_lost_at_start_keeps_the_others_and_signals_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sim.activate(_lost_at_start(), clock="virtual")
    caplog.set_level(logging.WARNING)
    reader = InMemoryMetricReader()
    handle = otelgpu.instrument(
        exporters="none",
        frameworks="none",
        gpu_startup_wait_ms=10_000,
        meter_provider=MeterProvider(metric_readers=[reader]),
    )
    try:
        runtime = handle.runtime
        assert runtime is not None and runtime.pipeline is not None
        provider = runtime.pipeline.tracer_provider
        assert isinstance(provider, TracerProvider)
        attrs = provider.resource.attributes
        assert attrs["otelgpu.gpu.count"] == 2
        assert "otelgpu.gpu.names" not in attrs and "otelgpu.gpu.uuids" not in attrs
        assert attrs["otelgpu.gpu.driver_version"]
        sampler = runtime.sampler
        assert len(sampler.devices) == 2
        # The two healthy GPUs keep their identity attributes on their series.
        sim.active().advance(1.0)  # type: ignore[union-attr]
        sampler.sample_once()
        data = metrics_data(reader)
        points = [
            attributes_of(p)
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == "hw.gpu.utilization"
            for p in m.data.data_points
        ]
        assert {p["hw.id"] for p in points} == {d.uuid for d in sampler.devices}
        assert {p.get("hw.model") for p in points} == {"NVIDIA H100 80GB HBM3"}
        # The lost GPU has no sampled series but its own hw.status, in the failed state.
        status = {
            (attributes_of(p)["hw.id"], attributes_of(p)["hw.state"]): point_value(p)
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == "hw.status"
            for p in m.data.data_points
        }
        assert status[("nvml-index-1", "failed")] == 1
        assert status[("nvml-index-1", "ok")] == 0
        assert {h for h, _ in status} == {d.uuid for d in sampler.devices} | {"nvml-index-1"}
        assert sampler.lost("nvml-index-1")
        counts = runtime.health_counts()
        assert counts.get(("device_lost", "nvml-index-1")) == 1, counts
        events = runtime.gpu_events(0, 2**62)
        assert [(e.kind, e.uuid, e.code) for e in events] == [
            ("device_lost", "nvml-index-1", 15)  # NVML_ERROR_GPU_IS_LOST
        ]
        # logged by the start-up thread after it woke instrument(): give it time
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
            "NVML index 1 is lost" in r.getMessage() for r in caplog.records
        ):
            time.sleep(0.01)
        assert any("NVML index 1 is lost" in r.getMessage() for r in caplog.records)
    finally:
        handle.shutdown()


@pytest.mark.usefixtures("unload_sim")
def test_pipeline_shutdown_waits_for_the_startup_thread() -> None:
    """The start-up thread logs its lost GPUs after waking instrument(): shutdown() waits
    for it (bounded) rather than leave it running past the runtime."""

    class SlowHandler(logging.Handler):
        """Holds the start-up thread in its lost-GPU warning for a while."""

        def handle(self, record: logging.LogRecord) -> bool:  # no handler lock held
            if threading.current_thread().name == "otelgpu-gpu-startup":
                time.sleep(0.6)  # twice: well within close()'s 2 s
            return True

    handler = SlowHandler(logging.WARNING)
    logger = logging.getLogger("otelgpu")
    logger.addHandler(handler)
    try:
        sim.activate(_lost_at_start(), clock="virtual")
        handle = otelgpu.instrument(exporters="none", frameworks="none", gpu_startup_wait_ms=10_000)
        runtime = handle.runtime
        assert runtime is not None
        thread = runtime.sampler._thread
        assert thread is not None and thread.name == "otelgpu-gpu-startup"
        handle.shutdown()
        assert not thread.is_alive()
    finally:
        logger.removeHandler(handler)


def test_pipeline_sim_unknown_scenario_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTELGPU_SIM", "no-such-scenario")
    with pytest.raises(ConfigurationError) as err:
        otelgpu.instrument(exporters="none", frameworks="none")
    message = str(err.value)
    assert err.value.setting == "OTELGPU_SIM"
    assert "no-such-scenario" in message
    for name in sim.list_scenarios():
        assert name in message


def test_pipeline_sim_bad_clock_names_its_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTELGPU_SIM", "healthy-8xh100")
    monkeypatch.setenv("OTELGPU_SIM_CLOCK", "sundial")
    with pytest.raises(ConfigurationError) as err:
        otelgpu.instrument(exporters="none", frameworks="none")
    assert err.value.setting == "OTELGPU_SIM_CLOCK"


@pytest.mark.usefixtures("unload_sim")
def test_pipeline_sim_activation_warns_once_loudly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from otelgpu.sim import _runtime as sim_runtime

    monkeypatch.setattr(sim_runtime, "_warned", False)
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cuda")  # the launcher guard leaves it alone
    monkeypatch.setenv("OTELGPU_SIM", "healthy-8xh100")
    monkeypatch.setenv("OTELGPU_SIM_CLOCK", "virtual")
    caplog.set_level(logging.WARNING, logger="otelgpu.sim")
    for _ in range(2):
        otelgpu.instrument(exporters="none", frameworks="none").shutdown()
    lines = [r for r in caplog.records if "SIMULATED GPUs" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].levelno == logging.WARNING
    text = lines[0].getMessage()
    assert "OTELGPU_SIM=healthy-8xh100" in text and "whole process" in text
    assert "8 simulated" in text


@pytest.mark.usefixtures("unload_sim")
def test_pipeline_xid_storm_is_counted_exactly_and_logged_in_a_burst(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 200 XIDs on one GPU within a second: every one counted, the log keeps a short burst
    # and one line saying the rest are counted only.
    scenario = _scenario(2)
    scenario["event"] = [
        {"at_s": 1 + i / 1000, "kind": "xid", "gpu": 0, "code": 13} for i in range(200)
    ]
    sim.activate(scenario, clock="virtual")
    caplog.set_level(logging.WARNING, logger="otelgpu.health")
    handle = otelgpu.instrument(exporters="none", frameworks="none", gpu_startup_wait_ms=10_000)
    try:
        runtime = handle.runtime
        assert runtime is not None
        sim.active().advance(2.0)  # type: ignore[union-attr]
        runtime.sampler.sample_once()
        deadline = time.monotonic() + 10
        counts: dict[tuple[str, str], int] = {}
        while time.monotonic() < deadline:
            counts = runtime.health_counts()
            if sum(n for (kind, _), n in counts.items() if kind == "xid") >= 200:
                break
            time.sleep(0.05)
        assert sum(n for (kind, _), n in counts.items() if kind == "xid") == 200, counts
    finally:
        handle.shutdown()
    health = [r.getMessage() for r in caplog.records if r.name == "otelgpu.health"]
    per_event = [m for m in health if m.startswith("otelgpu: GPU health event xid on ")]
    assert len(per_event) == 5, health
    notices = [m for m in health if "counted in otelgpu.gpu.health.events, not logged" in m]
    assert len(notices) == 1, health
