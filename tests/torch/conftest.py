"""Fixtures of the torch instrumentation tests: a hook session with a recording sink,
an otelgpu Runtime over in-memory OpenTelemetry providers, and the shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fixtures.otel import reset_otel_globals
from fixtures.otlp_receiver import otlp_receiver
from fixtures.sim import sim_gpu, sim_scenario
from fixtures.torch_runtime import Recorder, harness

from otelgpu.instrumentation.torch._session import Session

__all__ = ["harness", "otlp_receiver", "reset_otel_globals", "sim_gpu", "sim_scenario"]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def hooks(recorder: Recorder) -> Iterator[Session]:
    """Torch hooks live for one test, reporting into ``recorder``; restored after."""
    session = Session(recorder.on_step, recorder)
    session.start()
    try:
        yield session
    finally:
        session.stop()
    assert recorder.errors == [], recorder.errors
