"""Review regressions of the pipeline: hot paths never raise on bad values, the local
recording survives its file being removed, and configuration fails fast."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from fixtures.otel import PYTHON, InMemoryOtel, python_env
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

import otelgpu
from otelgpu import _api as otelgpu_api
from otelgpu import _runtime
from otelgpu._settings import resolve
from otelgpu.errors import ConfigurationError
from otelgpu.metrics import catalog as names
from otelgpu.otel.counters import LocalCounter
from otelgpu.otel.exporters import GuardedMetricExporter, preferred_temporality
from otelgpu.otel.processor import BoundedBatchSpanProcessor
from otelgpu.otel.providers import ForkAwareMetricReader
from otelgpu.otel.recording import RecordingFile
from otelgpu.otel.stats import InternalStats

pytestmark = pytest.mark.usefixtures("reset_otel_globals")


_App = InMemoryOtel


@pytest.fixture
def review_app(otel_app: InMemoryOtel) -> InMemoryOtel:
    return otel_app


def _errors() -> dict[str, int]:
    runtime = _runtime.current()
    assert runtime is not None
    return runtime.stats.errors()


# ------------------------------------------------------------------ request tokens


@pytest.mark.parametrize("bad", [None, "many", float("nan"), float("inf"), -3])
def test_pipeline_request_token_counts_never_raise(review_app: _App, bad: object) -> None:
    with otelgpu.request(model="m") as r:
        r.first_token()
        r.tokens(2)
        r.tokens(bad)  # type: ignore[arg-type]
        r.input_tokens(bad)  # type: ignore[arg-type]
        r.tokens(3)
    assert r.output_tokens == 5
    assert r.outcome == "ok"
    (span,) = review_app.spans.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes["gen_ai.usage.output_tokens"] == 5
    assert "gen_ai.usage.input_tokens" not in span.attributes
    errors = _errors()
    assert errors["request tokens"] == 1
    assert errors["request input_tokens"] == 1


def test_pipeline_request_token_counts_without_instrument() -> None:
    with otelgpu.request(model="m") as r:
        r.tokens(None)  # type: ignore[arg-type]
        r.tokens(4)
        r.input_tokens("x")  # type: ignore[arg-type]
    assert r.output_tokens == 4


# ------------------------------------------------------------------ counters


def test_pipeline_step_with_negative_samples_keeps_counters_monotonic(review_app: _App) -> None:
    with otelgpu.step(samples=4, tokens=10):
        pass
    with otelgpu.step(samples=-4, tokens=float("nan")):
        pass
    with otelgpu.step(samples=2):
        pass
    samples = review_app.points(names.TRAIN_SAMPLES.name)
    tokens = review_app.points(names.TRAIN_TOKENS.name)
    steps = review_app.points(names.TRAIN_STEPS.name)
    assert [v for _, v in samples] == [6]
    assert [v for _, v in tokens] == [10]
    assert [v for _, v in steps] == [3]  # the step with bad counts still counts as a step
    # Rejected before the counters (never exported), counted by field and reason.
    runtime = _runtime.current()
    assert runtime is not None
    assert runtime.stats.rejected() == {("samples", "negative"): 1, ("tokens", "nan"): 1}


def test_pipeline_local_counter_never_raises() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    stats = InternalStats()
    counter = LocalCounter(provider.get_meter("t"), "c", "1", "", stats=stats)
    counter.add(2, {"a": "x"})
    counter.add(1, {"a": {"unhashable": "dict"}})  # type: ignore[dict-item]
    counter.add(-1, {"a": "x"})
    counter.add("3", {"a": "x"})  # type: ignore[arg-type]
    counter.add(True, {"a": "x"})
    counter.add(0.5, {"a": "x"})
    assert counter.value({"a": "x"}) == 2.5
    assert stats.errors() == {"counter c": 4}
    silent = LocalCounter(provider.get_meter("t"), "d", "1", "")  # no stats: dropped quietly
    silent.add(float("-inf"))
    assert silent.total() == 0.0
    provider.shutdown()


# ------------------------------------------------------------------ recording


def _lines(path: Path) -> list[str]:
    return [json.loads(x)["n"] for x in path.read_text().splitlines()] if path.exists() else []


def test_pipeline_recording_survives_its_file_being_removed(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    rec = RecordingFile(path, max_bytes=4096, backups=2)
    rec.write_line(json.dumps({"n": "a", "pad": "x" * 3000}))
    path.unlink()  # a tmp cleaner, logrotate or a user removed the file
    rec.write_line(json.dumps({"n": "b", "pad": "x" * 3000}))  # rotates: used to raise
    rec.write_line(json.dumps({"n": "c"}))  # ... and every later write was lost
    rec.close()
    assert _lines(path) == ["b", "c"]
    assert rec.rotations == 1 and rec.lines_written == 3


def test_pipeline_recording_retries_after_its_directory_vanished(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    path = directory / "rec.jsonl"
    rec = RecordingFile(path, max_bytes=4096, backups=1)
    rec.write_line(json.dumps({"n": "a", "pad": "x" * 3000}))
    path.unlink()
    directory.rmdir()
    rec.write_line(json.dumps({"n": "b", "pad": "x" * 3000}))  # recreates the directory
    rec.write_line(json.dumps({"n": "c"}))
    rec.close()
    rec.write_line(json.dumps({"n": "after close"}))  # closed on purpose: ignored
    assert _lines(path) == ["b", "c"]


def test_pipeline_recording_rotation_keeps_backups(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    rec = RecordingFile(path, max_bytes=4096, backups=2)
    for n in "abcd":
        rec.write_line(json.dumps({"n": n, "pad": "x" * 3000}))
    rec.close()
    assert _lines(path) == ["d"]
    assert _lines(path.with_name("rec.jsonl.1")) == ["c"]
    assert _lines(path.with_name("rec.jsonl.2")) == ["b"]
    assert not path.with_name("rec.jsonl.3").exists()


# ------------------------------------------------------------------ configuration


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


# ------------------------------------------------------------------ fork


def test_pipeline_forked_child_inherits_no_export_thread(tmp_path: Path) -> None:
    """The SDK restarts its periodic metric reader in a forked child; otelgpu's does not:
    a DataLoader worker runs none of the parent's collection (GPU callbacks included)."""
    code = f"""
        import os, sys, threading, time
        import otelgpu
        h = otelgpu.instrument(recording_dir={str(tmp_path)!r}, metric_export_interval_ms=50)
        assert h.runtime.sampler is not None  # the simulated GPUs are sampled
        before = sorted(t.name for t in threading.enumerate())
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            time.sleep(0.3)  # several export intervals
            names = sorted(t.name for t in threading.enumerate())
            os.write(w, repr(names).encode())
            os._exit(0)
        os.close(w)
        child = os.read(r, 4096).decode()
        os.waitpid(pid, 0)
        h.shutdown()
        print(before)
        print(child)
    """
    env = python_env(OTELGPU_SIM="healthy-8xh100")
    proc = subprocess.run(
        [PYTHON, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    parent, child = proc.stdout.strip().splitlines()[-2:]
    assert "OtelPeriodicExportingMetricReader" in parent
    assert "otelgpu-sampler" in parent
    assert child == "['MainThread']"


# ------------------------------------------------------------------ bounded shutdown


class _SlowExporter(SpanExporter):
    """A collector that takes ``delay_s`` to answer every export (e.g. a hung one)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.exported = 0
        self.shut_down = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        time.sleep(self.delay_s)
        self.exported += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.shut_down = True


def test_pipeline_span_processor_shutdown_is_bounded_by_its_deadline() -> None:
    """shutdown() used to wait for the worker to drain the whole queue into a slow
    collector (and then some): 60 s at exit with a hung OTLP endpoint."""
    stats = InternalStats()
    exporter = _SlowExporter(0.4)
    processor = BoundedBatchSpanProcessor(
        exporter,
        stats=stats,
        max_queue_size=1000,
        max_export_batch_size=10,
        schedule_delay_s=0.01,
        shutdown_timeout_s=1.0,
    )
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    for i in range(100):  # ten batches: 4 s of exports
        tracer.start_span(f"s{i}").end()
    time.sleep(0.1)  # the worker is inside an export now
    started = time.monotonic()
    provider.shutdown()
    took = time.monotonic() - started
    assert took < 1.0 + 0.4 + 0.8  # the deadline plus at most one export, plus slack
    assert exporter.shut_down
    dropped = stats.dropped().get(("traces", "shutdown"), 0)
    assert 0 < dropped < 100
    assert exporter.exported + dropped == 100  # nothing lost without being counted


def test_pipeline_span_processor_shutdown_exports_everything_in_time() -> None:
    stats = InternalStats()
    exporter = _SlowExporter(0.0)
    processor = BoundedBatchSpanProcessor(
        exporter, stats=stats, max_export_batch_size=7, schedule_delay_s=3600
    )
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    for i in range(50):
        tracer.start_span(f"s{i}").end()
    provider.shutdown()
    provider.shutdown()  # idempotent
    assert exporter.exported == 50
    assert stats.dropped() == {}


# ------------------------------------------------------------------ failed instrument()


def test_pipeline_failed_instrument_leaves_nothing_behind(tmp_path: Path) -> None:
    """A Prometheus address that cannot be bound used to raise a bare OSError after
    otelgpu's tracer provider was installed globally with its export threads running;
    the next instrument() then attached to that orphan. (A port merely in use is no
    longer an error: see test_pipeline_export_bounds.)"""
    import opentelemetry.exporter.prometheus  # noqa: F401  (a test dependency: fail, never skip)

    threads_before = {t.name for t in threading.enumerate()}
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
    assert {t.name for t in threading.enumerate()} == threads_before
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
    threads_before = {t.name for t in threading.enumerate()}
    with pytest.raises(ConfigurationError) as info:
        otelgpu.instrument(exporters="none", **overrides)
    assert info.value.setting == setting
    assert info.value.value == value
    assert "interval_s" not in info.value.accepted  # names no sampler-internal argument
    assert _runtime.current() is None
    assert {t.name for t in threading.enumerate()} == threads_before
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


def test_pipeline_fork_while_another_thread_holds_telemetry_locks(tmp_path: Path) -> None:
    """The after-fork handler used to acquire the sketch and stats locks: a fork while
    another thread held one (the metric export reading the sketches, a hot path counting
    an error) hung the child inside fork() -- a DataLoader worker that never starts. And
    a child calling instrument() hung on the API lock held by a parent thread."""
    code = f"""
        import os, signal, sys, threading, time
        import otelgpu
        from otelgpu import _api as api, _runtime
        h = otelgpu.instrument(recording_dir={str(tmp_path)!r}, gpu=False)
        rt = _runtime.current()
        from otelgpu.metrics.spec import Area, Kind, MetricSpec
        hist = rt.instrument(MetricSpec("review.hist", Kind.SKETCH, "s", "", Area.RUNTIME))
        hist.record(1.0, {{"a": "b"}})
        held, release = threading.Event(), threading.Event()

        def holder():
            with api._lock, rt.sketches._lock, hist._lock, rt.stats._lock, rt._lock:
                held.set()
                release.wait()

        t = threading.Thread(target=holder)
        t.start()
        held.wait()
        pid = os.fork()
        if pid == 0:
            # The child got here: fork() returned. It records nothing and exports nothing.
            assert _runtime.current() is None and hist.series() == []
            rt.close()  # the parent's handle used in the child: a no-op, not a hang
            mine = otelgpu.instrument(recording_dir={str(tmp_path)!r}, gpu=False)
            assert mine.runtime is not None and mine.runtime is _runtime.current()
            mine.shutdown()
            os._exit(0)
        deadline = time.monotonic() + 10
        status = None
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.02)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        release.set()
        t.join()
        h.shutdown()
        print("child status", status)
    """
    proc = subprocess.run(
        [PYTHON, "-c", textwrap.dedent(code)],
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "child status 0", proc.stdout + proc.stderr


class _RecordingShutdownExporter(MetricExporter):
    def __init__(self) -> None:
        super().__init__()
        self.shutdown_timeouts: list[float] = []

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.shutdown_timeouts.append(timeout_millis)


def test_pipeline_guarded_metric_exporter_honours_the_shutdown_deadline() -> None:
    inner = _RecordingShutdownExporter()
    guarded = GuardedMetricExporter(inner, InternalStats(), temporality=preferred_temporality())
    provider = MeterProvider(
        metric_readers=[ForkAwareMetricReader(guarded, export_interval_millis=3_600_000)]
    )
    provider.shutdown(timeout_millis=2_000)
    (timeout,) = inner.shutdown_timeouts
    assert 0 <= timeout <= 2_000  # what was left of the provider's deadline, not 30 s
