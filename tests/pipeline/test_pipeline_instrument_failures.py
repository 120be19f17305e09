"""Configuration fails fast at ``instrument()`` and a failed ``instrument()`` leaves
nothing behind."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

import otelgpu
from otelgpu import _api as otelgpu_api
from otelgpu import _runtime
from otelgpu._settings import resolve
from otelgpu.errors import ConfigurationError

pytestmark = pytest.mark.usefixtures("reset_otel_globals")


# ------------------------------------------------------------------ configuration


def _left_running(before: set[threading.Thread]) -> list[str]:
    """Threads started since ``before`` still running once given 5 s to end (the GPU
    start-up thread that failed wakes instrument() and then ends on its own)."""
    new = set(threading.enumerate()) - before
    for thread in new:
        thread.join(5)
    return [t.name for t in new if t.is_alive()]


def test_pipeline_missing_certificate_fails_at_instrument(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(ConfigurationError) as info:
        otelgpu.instrument(otlp_certificate=missing, exporters="otlp", gpu=False)
    assert info.value.setting == "otlp_certificate"
    assert "readable PEM file" in str(info.value)
    assert _runtime.current() is None
    with pytest.raises(ConfigurationError) as info:
        resolve({}, {"OTEL_EXPORTER_OTLP_CERTIFICATE": missing})
    assert info.value.setting == "OTEL_EXPORTER_OTLP_CERTIFICATE"
    pem = tmp_path / "ca.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    assert resolve({"otlp_certificate": pem}, {}).otlp_certificate == os.fspath(pem)


# ------------------------------------------------------------------ failed instrument()


def test_pipeline_failed_instrument_leaves_nothing_behind(tmp_path: Path) -> None:
    """A Prometheus address that cannot be bound used to raise a bare OSError after
    otelgpu's tracer provider was installed globally with its export threads running;
    the next instrument() then attached to that orphan. (A port merely in use is no
    longer an error: see test_pipeline_export_bounds.)"""
    import opentelemetry.exporter.prometheus  # noqa: F401  (a test dependency: fail, never skip)

    threads_before = set(threading.enumerate())
    with pytest.raises(ConfigurationError) as info:
        otelgpu.instrument(
            exporters="prometheus,recording",
            prometheus_host="192.0.2.1",  # TEST-NET-1: never a local address
            prometheus_port=9464,
            recording_dir=str(tmp_path),
            gpu=False,
        )
    assert info.value.setting == "prometheus_port"
    assert "192.0.2.1" in str(info.value)
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    # none left running (an earlier test's thread ending meanwhile is not this one's)
    assert _left_running(threads_before) == []
    assert list(tmp_path.iterdir()) == []  # no empty recording left behind
    assert otelgpu_api.instrumentation() is None and _runtime.current() is None

    handle = otelgpu.instrument(
        exporters="prometheus,recording", prometheus_port=0, recording_dir=str(tmp_path), gpu=False
    )
    try:
        runtime = handle.runtime
        assert runtime is not None and runtime.pipeline is not None
        assert runtime.pipeline.owns_tracer_provider
        assert trace.get_tracer_provider() is runtime.pipeline.tracer_provider
        assert runtime.pipeline.prometheus_address is not None
    finally:
        handle.shutdown()


@pytest.mark.parametrize(
    ("overrides", "setting", "value"),
    [
        ({"devices": "GPU-does-not-exist"}, "devices", "GPU-does-not-exist"),
        ({"devices": "0,7"}, "devices", 7),  # the simulated node has GPUs 0 and 1
        ({"sample_interval_ms": 5000, "sampler_history_s": 2}, "sampler_history_s", 2.0),
    ],
)
def test_pipeline_gpu_settings_that_match_no_gpu_fail_at_instrument(
    sim_gpu: Any, overrides: dict[str, Any], setting: str, value: object
) -> None:
    """They used to be swallowed (an INFO log, no GPU context, no hw.* metrics)."""
    threads_before = set(threading.enumerate())
    with pytest.raises(ConfigurationError) as info:
        otelgpu.instrument(exporters="none", **overrides)
    assert info.value.setting == setting
    assert info.value.value == value
    assert "interval_s" not in info.value.accepted  # names no sampler-internal argument
    assert _runtime.current() is None
    # none left running (an earlier test's thread ending meanwhile is not this one's)
    assert _left_running(threads_before) == []
    handle = otelgpu.instrument(exporters="none", devices="1")  # a valid choice works
    try:
        assert handle.runtime is not None and handle.runtime.sampler is not None
        assert [d.cuda_index for d in handle.runtime.sampler.devices] == [1]
    finally:
        handle.shutdown()


def test_pipeline_nvml_library_that_does_not_exist_fails_at_instrument(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = str(tmp_path / "libnvidia-ml.so.1")
    monkeypatch.setenv("OTELGPU_NVML_LIBRARY", missing)
    with pytest.raises(ConfigurationError) as info:
        otelgpu.instrument(exporters="none")
    assert info.value.setting == "OTELGPU_NVML_LIBRARY"
    assert info.value.value == missing
    assert _runtime.current() is None
    # Without GPU sampling the library is never looked at.
    handle = otelgpu.instrument(exporters="none", gpu=False)
    assert handle.runtime is not None
    handle.shutdown()
