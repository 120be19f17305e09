"""Fixtures of the vLLM instrumentation tests.

vLLM is a test dependency (``tests/requirements/vllm*.txt``, installed by ``make``): when it
cannot be imported these tests FAIL -- they never skip. It is imported once per session
(``vllm_api``), which takes a few seconds.

``instrumented`` starts otelgpu the way a user does (``otelgpu.instrument()``) with the
OTLP/HTTP exporter pointed at the in-process receiver and the GPU sampler reading the
simulated NVML (4 GPUs, see ``SCENARIO``); ``finish()`` shuts it down, which flushes every
span and one final metric collection to the receiver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from fixtures.otel import _reset_globals, reset_otel_globals
from fixtures.otlp_receiver import OtlpReceiver, otlp_receiver
from vllm_script import import_vllm
from vllm_support import Instrumented

import otelgpu
from otelgpu import _runtime
from otelgpu.instrumentation.vllm import _context, _patch

__all__ = ["otlp_receiver", "reset_otel_globals"]

# A 4-GPU inference node: GPUs 0-1 idle at 10 %, GPUs 2-3 busy at 80 %, so the GPU context
# of a request tells which GPUs it was attributed to.
SCENARIO: dict[str, Any] = {
    "version": 1,
    "name": "vllm-test-4xl4",
    "description": "4x L4, two idle and two busy",
    "gpus": {"count": 4, "model": "L4", "utilization": 10, "memory_used_gib": 1},
    "gpu": [
        {"index": 2, "utilization": 80, "memory_used_gib": 12},
        {"index": 3, "utilization": 80, "memory_used_gib": 12},
    ],
}


@pytest.fixture(scope="session")
def vllm_api() -> SimpleNamespace:
    """vLLM's real classes; a failed import fails the test (CI installs vLLM)."""
    try:
        return import_vllm()
    except Exception as exc:
        pytest.fail(
            f"vLLM is not importable ({exc!r}); install tests/requirements/vllm.txt and "
            "--no-deps tests/requirements/vllm-nodeps.txt (make deps)"
        )


@pytest.fixture
def sim_gpus(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The simulated 4-GPU node (wall clock), all devices CUDA-visible."""
    from otelgpu import sim

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("OTELGPU_SIM", raising=False)
    gpu = sim.activate(SCENARIO, clock="wall")
    try:
        yield gpu
    finally:
        sim.deactivate(gpu)


@pytest.fixture
def instrumented(
    otlp_receiver: OtlpReceiver, sim_gpus: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Instrumented]]:
    """Starts otelgpu (OTLP/HTTP to the receiver, simulated GPUs); always shut down after."""
    for var in ("OTELGPU_VLLM_TIMEOUT_S", "OTELGPU_VLLM_TRACE_CONTEXT", "VLLM_PLUGINS"):
        monkeypatch.delenv(var, raising=False)
    _reset_globals()
    _context.REGISTRY.clear()

    def start(**settings: Any) -> Instrumented:
        handle = otelgpu.instrument(
            otlp_endpoint=otlp_receiver.http_endpoint,
            otlp_protocol="http/protobuf",
            metric_export_interval_ms=3_600_000,
            sample_interval_ms=20,
            service_name="vllm-test",
            **settings,
        )
        runtime = _runtime.current()
        assert runtime is not None
        return Instrumented(otlp_receiver, handle, runtime)

    try:
        yield start
    finally:
        _reset_globals()
        _patch.uninstall_trace_context()
        _patch.uninstall_offline()
        _context.REGISTRY.clear()
