"""The local recording: OTLP/JSON lines in the collector file-exporter format, rotated."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from google.protobuf import json_format  # type: ignore[import-untyped]  # no protobuf stubs in the test extras
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otelgpu
from otelgpu.otel import providers
from otelgpu.otel.recording import RecordingFile, read_recording, to_json_line

pytestmark = pytest.mark.usefixtures("reset_otel_globals")


def _spans(n: int) -> list:  # type: ignore[type-arg]
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = tp.get_tracer("t")
    for i in range(n):
        with tracer.start_as_current_span(f"s{i}"), tracer.start_as_current_span("child"):
            pass
    return list(exporter.get_finished_spans())


def test_pipeline_json_line_is_otlp_json() -> None:
    spans = _spans(1)
    message = encode_spans(spans)
    line = to_json_line(message)
    data = json.loads(line)
    span = data["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    # OTLP/JSON: hex ids, integer enums, 64-bit integers as strings, camelCase keys.
    assert span["traceId"] == format(spans[0].context.trace_id, "032x")
    assert span["spanId"] == format(spans[0].context.span_id, "016x")
    assert span["parentSpanId"] == format(spans[0].parent.span_id, "016x")
    assert span["kind"] == 1
    assert span["startTimeUnixNano"] == str(spans[0].start_time)
    assert "\n" not in line


def test_pipeline_recording_round_trip(tmp_path: Path) -> None:
    spans = _spans(3)
    rec = RecordingFile(tmp_path / "r.jsonl", max_bytes=1 << 20, backups=1)
    rec.write_line(to_json_line(encode_spans(spans)))
    rec.close()
    (message,) = list(read_recording(tmp_path / "r.jsonl"))
    assert isinstance(message, ExportTraceServiceRequest)
    assert message == encode_spans(spans)


def test_pipeline_recording_rotates_and_stays_bounded(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    rec = RecordingFile(path, max_bytes=8192, backups=2)
    line = to_json_line(encode_spans(_spans(2)))
    for _ in range(200):
        rec.write_line(line)
    rec.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["r.jsonl", "r.jsonl.1", "r.jsonl.2"]
    for p in tmp_path.iterdir():
        assert p.stat().st_size <= 8192
        assert all(json.loads(x) for x in p.read_text().splitlines())
    assert rec.rotations > 2
    assert rec.lines_written == 200


def test_pipeline_default_recording_announced_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTELGPU_EXPORTERS", "OTELGPU_OTLP_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(providers, "_announced", False)
    caplog.set_level(logging.WARNING, logger="otelgpu")
    handle = otelgpu.instrument(recording_dir=str(tmp_path), gpu=False, service_name="svc/a")
    path = handle.recording_path
    assert path is not None and path.parent == tmp_path.resolve()
    assert path.name.startswith("svc_a-")
    for _ in range(3):
        with otelgpu.step(samples=2):
            pass
    handle.shutdown()
    otelgpu.instrument(recording_dir=str(tmp_path), gpu=False).shutdown()
    announcements = [r for r in caplog.records if "recording telemetry to" in r.getMessage()]
    assert len(announcements) == 1
    assert str(path) in announcements[0].getMessage()
    messages = list(read_recording(path))
    traces = [m for m in messages if isinstance(m, ExportTraceServiceRequest)]
    metrics = [m for m in messages if isinstance(m, ExportMetricsServiceRequest)]
    assert (
        sum(len(ss.spans) for m in traces for rs in m.resource_spans for ss in rs.scope_spans) == 3
    )
    names = {
        metric.name
        for m in metrics
        for rm in m.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    }
    assert "otelgpu.train.step.duration" in names
    as_dict = json_format.MessageToDict(metrics[-1])
    assert as_dict["resourceMetrics"][0]["resource"]["attributes"]
