"""Co-existence: the application's providers, opentelemetry-instrument, OTEL_SDK_DISABLED,
a collector that is down (and comes back), and fork."""

from __future__ import annotations

import json
import subprocess
import textwrap
import threading
from pathlib import Path

import pytest
from fixtures.otel import (
    PYTHON,
    metrics_data,
    point_value,
    python_env,
    reset_otel_globals,  # noqa: F401 - pytest fixtures,
    zero_code_env,
)
from fixtures.otlp_receiver import (
    OtlpReceiver,
    attributes,
)
from fixtures.processes import free_port
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otelgpu
from otelgpu import _runtime
from otelgpu.metrics import catalog as names

pytestmark = pytest.mark.usefixtures("reset_otel_globals")
ROOT = Path(__file__).resolve().parents[2]


def test_pipeline_attaches_to_application_providers(otlp_receiver: OtlpReceiver) -> None:
    spans = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    trace.set_tracer_provider(tp)
    metrics.set_meter_provider(mp)

    handle = otelgpu.instrument(
        otlp_endpoint=otlp_receiver.http_endpoint,
        otlp_protocol="http/protobuf",
        metric_export_interval_ms=3_600_000,
        gpu=False,
    )
    runtime = handle.runtime
    assert runtime is not None and runtime.pipeline is not None
    assert runtime.pipeline.tracer_provider is tp and not runtime.pipeline.owns_tracer_provider
    assert runtime.pipeline.meter_provider is mp and not runtime.pipeline.owns_meter_provider
    for _ in range(4):
        with otelgpu.step(samples=2):
            pass
    handle.shutdown()

    # Spans went to the application's provider, not to otelgpu's exporters.
    assert len([s for s in spans.get_finished_spans() if s.name == names.STEP_SPAN]) == 4
    assert not otlp_receiver.spans()
    # Counters and quantile gauges are on the application's meter...
    got = {
        m.name: m
        for rm in metrics_data(reader).resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert point_value(got[names.TRAIN_STEPS.name].data.data_points[0]) == 4
    assert names.TRAIN_STEP_DURATION.name + ".quantile" in got
    # ...and the exponential histogram reached otelgpu's exporter.
    hist = otlp_receiver.last_metric(names.TRAIN_STEP_DURATION.name)
    assert hist is not None and hist.exponential_histogram.data_points[0].count == 4
    # otelgpu did not shut the application's providers down.
    with tp.get_tracer("app").start_as_current_span("after"):
        pass
    assert spans.get_finished_spans()[-1].name == "after"
    tp.shutdown()
    mp.shutdown()


def test_pipeline_sdk_disabled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    before = set(threading.enumerate())
    handle = otelgpu.instrument(recording_dir=str(tmp_path))
    assert not handle.enabled and _runtime.current() is None
    with otelgpu.step(samples=1) as s, otelgpu.request(model="m") as r:
        r.tokens(1)
    assert s.duration_s is not None
    # no thread started (an earlier test's thread ending meanwhile is not this one's)
    assert [t.name for t in set(threading.enumerate()) - before] == []
    assert list(tmp_path.iterdir()) == []
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    handle.shutdown()


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_pipeline_collector_down_then_back(protocol: str) -> None:
    port = free_port()
    handle = otelgpu.instrument(
        otlp_endpoint=f"http://127.0.0.1:{port}",
        otlp_protocol=protocol,
        otlp_timeout_ms=300,
        span_queue_size=64,
        span_export_batch_size=32,
        span_schedule_delay_ms=50,
        metric_export_interval_ms=3_600_000,
        step_spans_per_second=0,  # every step span: this is about the queue, not sampling
        gpu=False,
    )
    runtime = handle.runtime
    assert runtime is not None and runtime.pipeline is not None
    (processor,) = runtime.pipeline.tracer_provider._active_span_processor._span_processors  # type: ignore[attr-defined]
    for _ in range(2000):
        with otelgpu.step(samples=1):
            pass
        assert processor.queued <= 64  # bounded while the collector is down
    handle.force_flush(timeout_millis=2000)
    dropped = runtime.stats.dropped()
    # Every lost span is counted: at the full queue, or at the failed export (a thread
    # falling behind is handed the GIL by span ends, so it may keep up with the failures).
    assert dropped.get(("traces", "export_failed"), 0) > 0
    total = dropped.get(("traces", "queue_full"), 0) + dropped[("traces", "export_failed")]
    assert 1900 <= total <= 2000

    receiver = OtlpReceiver()
    if protocol == "grpc":
        receiver.grpc_port = port
    else:
        receiver.http_port = port
    receiver.start()
    try:
        for _ in range(5):
            with otelgpu.step(samples=1, attributes={"phase": "after"}):
                pass
        handle.force_flush()
        after = [
            s for _, _, s in receiver.spans() if attributes(s.attributes).get("phase") == "after"
        ]
        assert len(after) == 5
        handle.shutdown()
        errors = receiver.last_metric(names.INTERNAL_DROPPED.name)
        assert errors is not None
        reasons = {
            attributes(p.attributes)["otelgpu.reason"]: p.as_int for p in errors.sum.data_points
        }
        assert reasons.get("queue_full", 0) == dropped.get(("traces", "queue_full"), 0)
        assert reasons["export_failed"] > 0
    finally:
        receiver.stop()


def _run(code: str, env: dict[str, str], *args: str, timeout: float = 120) -> str:
    proc = subprocess.run(
        [*args, PYTHON, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_pipeline_under_opentelemetry_instrument(otlp_receiver: OtlpReceiver) -> None:
    code = """
        import otelgpu
        from otelgpu import _runtime
        assert _runtime.current() is not None, "the instrumentor did not run"
        for _ in range(3):
            with otelgpu.step(samples=4):
                pass
        print("ok")
    """
    env = zero_code_env(
        otlp_receiver,
        "zero-code",
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="otelgpu_torch,otelgpu_vllm",
    )
    instrument = str(Path(PYTHON).parent / "opentelemetry-instrument")
    assert _run(code, env, instrument).strip() == "ok"

    steps = [(res, s) for res, _, s in otlp_receiver.spans() if s.name == names.STEP_SPAN]
    assert len(steps) == 3
    assert all(res["service.name"] == "zero-code" for res, _ in steps)
    hist = otlp_receiver.last_metric(names.TRAIN_STEP_DURATION.name)
    assert hist is not None and hist.exponential_histogram.data_points[0].count == 3
    counter = otlp_receiver.last_metric(names.TRAIN_SAMPLES.name)
    assert counter is not None and counter.sum.data_points[0].as_int == 12


def test_pipeline_forked_child_exports_nothing_of_parent(tmp_path: Path) -> None:
    code = f"""
        import os, sys, time
        import otelgpu
        h = otelgpu.instrument(recording_dir={str(tmp_path)!r}, gpu=False,
                               metric_export_interval_ms=100, span_schedule_delay_ms=50)
        for _ in range(3):
            with otelgpu.step(samples=1):
                pass
        pid = os.fork()
        if pid == 0:
            for _ in range(5):
                with otelgpu.step(samples=1):
                    pass
            time.sleep(0.5)   # the SDK's metric reader restarts in the child: must not export
            sys.exit(0)       # runs atexit handlers inherited from the parent
        os.waitpid(pid, 0)
        h.shutdown()
        print(h.recording_path)
    """
    path = Path(_run(code, python_env()).strip().splitlines()[-1])
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    pids = set()
    step_spans = 0
    step_counts = []
    for line in lines:
        for rs in line.get("resourceSpans", []):
            pids |= {
                a["value"]["intValue"]
                for a in rs["resource"]["attributes"]
                if a["key"] == "process.pid"
            }
            step_spans += sum(len(ss["spans"]) for ss in rs["scopeSpans"])
        for rm in line.get("resourceMetrics", []):
            for sm in rm["scopeMetrics"]:
                for m in sm["metrics"]:
                    if m["name"] == names.TRAIN_STEPS.name:
                        step_counts.append(int(m["sum"]["dataPoints"][0]["asInt"]))
    assert len(pids) == 1
    assert step_spans == 3
    assert step_counts and max(step_counts) == 3


def test_pipeline_forked_child_can_instrument_itself(tmp_path: Path) -> None:
    """A pre-fork server's worker that calls instrument() gets telemetry of its own."""
    code = f"""
        import os, sys
        import otelgpu
        otelgpu.instrument(recording_dir={str(tmp_path)!r}, gpu=False, service_name="parent")
        pid = os.fork()
        if pid == 0:
            h = otelgpu.instrument(recording_dir={str(tmp_path)!r}, gpu=False,
                                   service_name="worker")
            with otelgpu.step(samples=1, attributes={{"who": "worker"}}):
                pass
            h.shutdown()
            os._exit(0)
        os.waitpid(pid, 0)
        otelgpu.shutdown()
    """
    _run(code, python_env())
    files = sorted(tmp_path.glob("*.otlp.jsonl"))
    assert [f.name.split("-")[0] for f in files] == ["parent", "worker"]
    worker = files[1].read_text()
    assert '"who"' in worker and "otelgpu.train.step" in worker
    assert "otelgpu.train.step" not in files[0].read_text()


def test_pipeline_flush_at_exit_console_and_recording(tmp_path: Path) -> None:
    """No shutdown() call: the at-exit hook flushes every exporter."""
    code = f"""
        import otelgpu
        otelgpu.instrument(exporters="console,recording", recording_dir={str(tmp_path)!r},
                           gpu=False, metric_export_interval_ms=3_600_000,
                           span_schedule_delay_ms=3_600_000)
        with otelgpu.step(samples=5):
            pass
    """
    out = _run(code, python_env())
    assert '"name": "otelgpu.train.step"' in out  # ConsoleSpanExporter
    assert '"name": "otelgpu.train.step.duration"' in out  # ConsoleMetricExporter + sketch
    (recording,) = tmp_path.glob("*.otlp.jsonl")
    text = recording.read_text()
    assert '"name":"otelgpu.train.step"' in text
    assert '"exponentialHistogram"' in text
