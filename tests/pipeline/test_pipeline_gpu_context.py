"""GPU context over the wire: a process on the simulated GPU exports OTLP to a receiver.

The program runs in a subprocess (the simulator is per process) with
``OTELGPU_SIM=healthy-8xh100``; its steps' spans must carry the GPU context the scenario
defines (utilization from the scenario file, memory as NVML reports it), an XID injected
during one step must be a span event of exactly that step, and the resource must name
the simulated GPU.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fixtures.otel import python_env, run_python
from fixtures.otlp_receiver import (
    OtlpReceiver,
    attributes,
)

from otelgpu.metrics import catalog as names

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

SCENARIO = "healthy-8xh100"

PROGRAM = """
    import json, time
    import pynvml
    import otelgpu
    from otelgpu import sim

    handle = otelgpu.instrument(sample_interval_ms=20, metric_export_interval_ms=3_600_000)
    time.sleep(0.2)
    for i in range(3):
        with otelgpu.step(samples=8):
            time.sleep(0.1)
            if i == 1:
                sim.active().inject("xid", gpu=0, code=31)
            time.sleep(0.1)
    with otelgpu.request(model="m") as r:
        r.first_token()
        r.tokens(4)
        time.sleep(0.1)
    time.sleep(0.3)  # the XID reaches the health counter
    device = pynvml.nvmlDeviceGetHandleByIndex(0)
    # memory v2, as the sampler reads it (used without the reserved memory)
    used = pynvml.nvmlDeviceGetMemoryInfo(device, version=pynvml.nvmlMemory_v2).used
    uuid = pynvml.nvmlDeviceGetUUID(device)
    handle.shutdown()
    print(json.dumps({"used": used, "uuid": uuid if isinstance(uuid, str) else uuid.decode()}))
"""


@pytest.mark.slow
def test_pipeline_spans_carry_simulated_gpu_context(otlp_receiver: OtlpReceiver) -> None:
    from otelgpu import sim

    scenario = tomllib.loads(
        Path(sim.library_path()).parents[1].joinpath("scenarios", f"{SCENARIO}.toml").read_text()
    )
    expected_util = scenario["gpus"]["utilization"]["high"] / 100

    env = python_env(
        OTELGPU_SIM=SCENARIO,
        LOCAL_RANK="0",
        OTEL_EXPORTER_OTLP_ENDPOINT=otlp_receiver.grpc_endpoint,
        OTEL_SERVICE_NAME="sim-test",
        OTELGPU_FRAMEWORKS="none",
    )
    proc = run_python(PROGRAM, env)
    assert proc.returncode == 0, proc.stderr
    nvml = json.loads(proc.stdout.strip().splitlines()[-1])

    steps = [(res, s) for res, _, s in otlp_receiver.spans() if s.name == names.STEP_SPAN]
    assert len(steps) == 3
    resource = steps[0][0]
    assert resource["otelgpu.sim"] is True
    assert resource["otelgpu.sim.scenario"] == SCENARIO
    assert resource["otelgpu.gpu.count"] == 1
    assert "otelgpu.gpu.uuids" not in resource  # identity is on the GPU series (hw.id)
    assert "otelgpu.gpu.names" not in resource
    assert resource["otelgpu.gpu.driver_version"] == scenario["driver"]["version"]
    assert resource["otelgpu.gpu.cuda_version"] == scenario["driver"]["cuda_version"]
    assert resource["otelgpu.dist.local_rank"] == 0
    for _, span in steps:
        gpu = attributes(span.attributes)
        assert gpu["hw.id"] == nvml["uuid"]
        assert gpu["otelgpu.gpu.utilization.mean"] == pytest.approx(expected_util)
        assert gpu["otelgpu.gpu.utilization.max"] == pytest.approx(expected_util)
        assert gpu["otelgpu.gpu.memory.peak"] == nvml["used"]
        assert gpu["otelgpu.gpu.energy"] > 0
    xid_events = [[e for e in s.events if e.name == "otelgpu.gpu.xid"] for _, s in steps]
    assert [len(e) for e in xid_events] == [0, 1, 0]
    (event,) = xid_events[1]
    assert attributes(event.attributes)["otelgpu.gpu.xid"] == 31
    span = steps[1][1]
    assert span.start_time_unix_nano <= event.time_unix_nano <= span.end_time_unix_nano
    assert attributes(span.attributes)["otelgpu.gpu.xids"] == [31]

    (request,) = [s for _, _, s in otlp_receiver.spans() if s.name == "chat m"]
    assert attributes(request.attributes)["hw.id"] == nvml["uuid"]

    # ...and one WARNING log record on the otelgpu.health logger.
    logged = [line for line in proc.stderr.splitlines() if "GPU health event" in line]
    (line,) = logged
    assert line.startswith(f"otelgpu: GPU health event xid on {nvml['uuid']}: ")
    assert "31" in line

    health = otlp_receiver.last_metric(names.GPU_HEALTH_EVENTS.name)
    assert health is not None
    points = {
        attributes(p.attributes)["otelgpu.gpu.event"]: p.as_int for p in health.sum.data_points
    }
    assert points == {"xid": 1}


def test_health_event_seen_by_a_span_is_logged_before_any_collection(
    sim_scenario: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A span whose window holds a health event has it logged within the deferred
    thread's interval: no metric collection is needed (none happens here, there is no
    metric reader), so a long export interval or a host holding the GIL cannot delay it."""
    from fixtures.sim import SMALL_SCENARIO
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import otelgpu

    gpu = sim_scenario(SMALL_SCENARIO, clock="wall")
    handle = otelgpu.instrument(exporters="none", frameworks="none", sample_interval_ms=20)
    try:
        runtime = handle.runtime
        assert runtime is not None and runtime.pipeline is not None
        exporter = InMemorySpanExporter()
        runtime.pipeline.tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))  # type: ignore[attr-defined]
        uuid = runtime.sampler.devices[1].uuid
        time.sleep(0.2)
        with caplog.at_level(logging.WARNING, logger="otelgpu.health"):
            with otelgpu.step(samples=1):
                gpu.inject("ecc", gpu=1, uncorrected=2)
                deadline = time.monotonic() + 10.0  # the sampler sees it (every 20 ms)
                while time.monotonic() < deadline and not runtime.sampler.events(0, 2**62):
                    time.sleep(0.01)
                time.sleep(0.05)

            def logged() -> list[logging.LogRecord]:
                return [r for r in caplog.records if r.name == "otelgpu.health"]

            # The step's span and the health line, both from the deferred thread (the
            # step took over 2 ms): wait for the two, not for any warning.
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline and not (logged() and exporter.get_finished_spans()):
                time.sleep(0.01)
        (span,) = exporter.get_finished_spans()
        assert [e.name for e in span.events] == ["otelgpu.gpu.ecc_uncorrected"]
        (record,) = [r for r in caplog.records if r.name == "otelgpu.health"]
        assert record.getMessage().startswith(
            f"otelgpu: GPU health event ecc_uncorrected on {uuid}: 2 new uncorrected"
        )
        assert runtime.health_counts() == {("ecc_uncorrected", uuid): 1}
    finally:
        handle.shutdown()
