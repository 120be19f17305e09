"""NVML lifecycle across ``instrument()``/``shutdown()`` cycles in one process.

``shutdown()`` must release every NVML resource it took (the sampler's ``nvmlInit``
and its XID event set) before it returns, so nothing is left for the garbage collector
to release later. A late ``nvmlShutdown()`` from a collected runtime would otherwise
cancel the *next* run's init -- device reads then answer UNINITIALIZED and faults go
unseen. Each cycle forces ``gc.collect()`` while it runs and injects an XID 48 and a
GPU loss, which must both be seen, in both twins.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator

import pytest
from fixtures.sim import SMALL_SCENARIO

import otelgpu
from otelgpu import sim

pytestmark = pytest.mark.usefixtures("reset_otel_globals")


@pytest.fixture
def unload_sim() -> Iterator[None]:
    yield
    sim.deactivate()


def _wait(predicate: object, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


@pytest.mark.usefixtures("unload_sim")
def test_pipeline_three_instrument_shutdown_cycles_see_every_fault() -> None:
    for cycle in range(3):
        gpu = sim.activate(SMALL_SCENARIO, clock="virtual")
        gpu.advance(5.0)
        refs_before = gpu.nvml_refcount()
        handle = otelgpu.instrument(
            exporters="none",
            frameworks="none",
            sample_interval_ms=20,
            service_name=f"lifecycle-{cycle}",
        )
        runtime = handle.runtime
        assert runtime is not None
        sampler = runtime.sampler
        assert _wait(lambda s=sampler: len(s.devices) == 2), f"cycle {cycle}: no GPUs"
        devices = sorted(sampler.devices, key=lambda d: d.nvml_index)
        healthy, lost = devices[0].uuid, devices[1].uuid
        gc.collect()  # whatever an earlier cycle left behind is collected now

        gpu.inject("xid", gpu=0, code=48)
        gpu.inject("gpu_lost", gpu=1)
        gpu.advance(1.0)
        gc.collect()

        assert _wait(lambda s=sampler, u=lost: s.lost(u)), f"cycle {cycle}: GPU loss unseen"
        assert _wait(
            lambda s=sampler, u=healthy: any(
                e.kind == "xid" and e.code == 48 and e.uuid == u for e in s.events(0, 2**62)
            )
        ), f"cycle {cycle}: XID 48 unseen"
        assert not sampler.lost(healthy)
        counts = runtime.health_counts()
        assert counts.get(("xid", healthy), 0) >= 1, (cycle, counts)
        assert counts.get(("device_lost", lost), 0) >= 1, (cycle, counts)

        handle.shutdown()
        # Released deterministically: nothing is left for the garbage collector.
        assert gpu.nvml_refcount() == refs_before, f"cycle {cycle}: NVML init leaked"
        assert not sampler.running
        del handle, runtime, sampler
        sim.deactivate()
