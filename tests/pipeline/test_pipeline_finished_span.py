"""A kept step span built ended (``otelgpu.otel.finished_span``) is what the SDK's path
gives, byte for byte on the wire and in the recording, and is only built where no one can
tell: otelgpu's processor alone, the SDK's default sampler, a root span within its limits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fixtures.otlp_receiver import OtlpReceiver
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor

import otelgpu
from otelgpu.otel.finished_span import FinishedSpans
from otelgpu.otel.recording import read_recording
from otelgpu.runtime.records import StepRecord

pytestmark = pytest.mark.usefixtures("reset_otel_globals")

T0 = 1_700_000_000_000_000_000


def _rows(n: int = 40) -> list[StepRecord]:
    """Steps as the torch step thread hands them over: span attributes, counts, FLOPs."""
    rows = []
    for i in range(n):
        start = T0 + i * 5_000_000
        rows.append(
            StepRecord(
                start,
                start + 4_000_000 + i * 1000,
                step=i + 1,
                samples=8,
                tokens=512 if i % 2 else None,
                flops=2e9,
                span_attributes={
                    "otelgpu.train.step.rule": "optimizer",
                    "otelgpu.train.data.wait": 0.001 * i,
                    "otelgpu.train.optimizer_steps": 1,
                },
            )
        )
    return rows


def _keep_all(runtime: Any, rows: list[StepRecord]) -> int:
    """Every row through the runtime's bulk path, each kept; how many spans were built
    ended (``FinishedSpans.emit`` returned True)."""
    built = 0
    emit = FinishedSpans.emit

    def counting(self: Any, *args: Any, **kwargs: Any) -> bool:
        nonlocal built
        done = emit(self, *args, **kwargs)
        built += done
        return done

    FinishedSpans.emit = counting  # type: ignore[method-assign]
    try:
        lane = runtime.step_lane()
        assert lane is not None
        for row in rows:
            lane.keep(row)
        lane.publish()
    finally:
        FinishedSpans.emit = emit  # type: ignore[method-assign]
    return built


def _masked(span: Any) -> bytes:
    """The span message without its ids (random in each run)."""
    copy = type(span)()
    copy.CopyFrom(span)
    copy.trace_id = b""
    copy.span_id = b""
    return copy.SerializeToString()  # type: ignore[no-any-return]


def _wire(
    finished: bool, monkeypatch: pytest.MonkeyPatch, **settings: Any
) -> tuple[list[bytes], int]:
    receiver = OtlpReceiver()
    receiver.start()
    try:
        with monkeypatch.context() as m:
            if not finished:
                m.setattr(FinishedSpans, "target", lambda self: None)
            handle = otelgpu.instrument(
                otlp_endpoint=receiver.grpc_endpoint,
                otlp_protocol="grpc",
                span_schedule_delay_ms=50,
                metric_export_interval_ms=3_600_000,
                frameworks="none",
                gpu=False,
                step_spans_per_second=1000,
                peak_flops=1e12,
                **settings,
            )
            built = _keep_all(handle.runtime, _rows())
            handle.shutdown()
        spans = sorted(
            (s for _, _, s in receiver.spans() if s.name == "otelgpu.train.step"),
            key=lambda s: s.start_time_unix_nano,
        )
        return [_masked(s) for s in spans], built
    finally:
        receiver.stop()


def test_a_finished_span_is_the_sdk_paths_span_on_the_wire(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ours, built = _wire(True, monkeypatch)
    sdk, none_built = _wire(False, monkeypatch)
    assert built == 40 and none_built == 0
    assert len(ours) == 40
    assert ours == sdk


def test_over_the_attribute_count_limit_the_sdk_path_drops_as_it_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "4")
    ours, built = _wire(True, monkeypatch)
    sdk, _ = _wire(False, monkeypatch)
    assert built == 0  # every span went the SDK's way
    assert ours == sdk and len(ours) == 40


def _recorded_steps(directory: Path) -> list[Any]:
    """The step spans of the recording in ``directory``."""
    return [
        span
        for path in sorted(directory.glob("*.jsonl"))
        for request in read_recording(path)
        for rs in getattr(request, "resource_spans", ())
        for ss in rs.scope_spans
        for span in ss.spans
        if span.name == "otelgpu.train.step"
    ]


def _recorded(
    tmp_path: Path, finished: bool, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[bytes], int]:
    with monkeypatch.context() as m:
        if not finished:
            m.setattr(FinishedSpans, "target", lambda self: None)
        handle = otelgpu.instrument(
            recording_dir=str(tmp_path),
            gpu=False,
            service_name="f",
            step_spans_per_second=1000,
            frameworks="none",
        )
        built = _keep_all(handle.runtime, _rows())
        handle.shutdown()
    spans = _recorded_steps(tmp_path)
    return [_masked(s) for s in sorted(spans, key=lambda s: s.start_time_unix_nano)], built


def test_a_finished_span_is_the_sdk_paths_span_in_the_recording(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, built = _recorded(tmp_path / "ours", True, monkeypatch)
    sdk, _ = _recorded(tmp_path / "sdk", False, monkeypatch)
    assert built == 40
    assert len(ours) == 40 and ours == sdk


class _AppProcessor(SpanProcessor):
    def __init__(self) -> None:
        self.ended: list[Any] = []

    def on_end(self, span: Any) -> None:
        self.ended.append(span)


def test_an_applications_processor_sees_the_sdks_span(tmp_path: Path) -> None:
    handle = otelgpu.instrument(
        recording_dir=str(tmp_path), gpu=False, step_spans_per_second=1000, frameworks="none"
    )
    try:
        app = _AppProcessor()
        trace.get_tracer_provider().add_span_processor(app)  # type: ignore[attr-defined]
        assert _keep_all(handle.runtime, _rows(4)) == 0
        assert [s.name for s in app.ended] == ["otelgpu.train.step"] * 4
    finally:
        handle.shutdown()


def test_a_step_under_a_current_span_is_its_child(tmp_path: Path) -> None:
    handle = otelgpu.instrument(
        recording_dir=str(tmp_path), gpu=False, step_spans_per_second=1000, frameworks="none"
    )
    try:
        with trace.get_tracer("app").start_as_current_span("app.epoch") as epoch:
            assert _keep_all(handle.runtime, _rows(2)) == 0
    finally:
        handle.shutdown()
    spans = _recorded_steps(tmp_path)
    parent = epoch.get_span_context().span_id.to_bytes(8, "big")
    assert len(spans) == 2 and all(s.parent_span_id == parent for s in spans)


def test_not_with_another_sampler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "1.0")
    handle = otelgpu.instrument(
        recording_dir=str(tmp_path), gpu=False, step_spans_per_second=1000, frameworks="none"
    )
    try:
        assert _keep_all(handle.runtime, _rows(3)) == 0
    finally:
        handle.shutdown()
