"""step() / request() / Runtime: semantics, context propagation, safety on hot paths."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from fixtures.otel import InMemoryOtel, attributes_of, metrics_data, point_value, sketch_spec
from opentelemetry.trace import StatusCode

import otelgpu
from otelgpu import _runtime
from otelgpu.metrics import catalog as names
from otelgpu.runtime.records import RequestRecord, StepRecord

pytestmark = pytest.mark.usefixtures("reset_otel_globals")


App = InMemoryOtel


@pytest.fixture
def app(otel_app: InMemoryOtel) -> InMemoryOtel:
    return otel_app


def _runtime_now() -> _runtime.Runtime:
    runtime = _runtime.current()
    assert runtime is not None
    return runtime


def test_pipeline_instrument_is_idempotent(app: App) -> None:
    first = otelgpu.instrument()
    assert otelgpu.instrument(service_name="ignored") is first
    assert first.runtime is _runtime.current()


def test_pipeline_step_numbers_nesting_and_errors(app: App) -> None:
    tracer = app.tracer_provider.get_tracer("user")
    with otelgpu.step(samples=8) as s:
        with tracer.start_as_current_span("forward"):
            time.sleep(0.002)
        s.tokens = 100
    with pytest.raises(ZeroDivisionError), otelgpu.step():
        _ = 1 / 0
    with otelgpu.step(step=42):
        pass
    steps = app.finished(names.STEP_SPAN)
    assert [x.attributes["otelgpu.train.step"] for x in steps] == [1, 2, 42]
    forward = app.finished("forward")[0]
    assert forward.parent is not None and forward.parent.span_id == steps[0].context.span_id
    assert steps[0].attributes["otelgpu.train.tokens"] == 100
    assert steps[0].end_time - steps[0].start_time >= 2_000_000
    assert s.duration_s is not None and s.duration_s >= 0.002
    assert steps[1].status.status_code is StatusCode.ERROR
    assert steps[1].events[0].name == "exception"
    sketch = _runtime_now().step_duration.merged()
    assert sketch.count == 3
    assert sketch.max == pytest.approx(max((x.end_time - x.start_time) / 1e9 for x in steps))


def test_pipeline_request_outcomes(app: App) -> None:
    with otelgpu.request(model="m") as r:
        r.input_tokens(12)
        r.first_token()
        r.tokens(1)
        r.tokens(9)
    with pytest.raises(TimeoutError), otelgpu.request(model="m"):
        raise TimeoutError
    with pytest.raises(KeyError), otelgpu.request(model="m"):
        raise KeyError("x")
    with otelgpu.request(model="m", queue_time_s=0.25) as r:
        r.error("overloaded")
    ok, timeout, keyerror, overloaded = (s.attributes for s in app.finished("chat m"))
    assert ok["otelgpu.request.outcome"] == "ok"
    assert ok["gen_ai.usage.output_tokens"] == 10
    assert ok["gen_ai.usage.input_tokens"] == 12
    assert ok["gen_ai.request.model"] == "m"
    assert timeout["otelgpu.request.outcome"] == "timeout"
    assert keyerror["otelgpu.request.outcome"] == "error"
    assert keyerror["error.type"] == "KeyError"
    assert overloaded["error.type"] == "overloaded"
    assert overloaded["otelgpu.request.queue_time"] == 0.25
    runtime = _runtime_now()
    assert runtime.request_duration.merged().count == 4
    assert runtime.ttft.merged().count == 1
    assert runtime.tpot.merged().count == 1
    assert runtime.queue_duration.merged().max == pytest.approx(0.25, rel=0.01)
    errors = {dict(attrs).get("error.type") for attrs, _ in runtime.request_duration.series()}
    assert errors == {None, "timeout", "KeyError", "overloaded"}


def test_pipeline_time_per_output_token_formula(app: App) -> None:
    runtime = _runtime_now()
    start = time.time_ns()
    span = runtime.record_request(
        RequestRecord(
            start,
            start + 1_100_000_000,
            model="m",
            first_token_ns=start + 100_000_000,
            output_tokens=11,
        )
    )
    attrs = span.attributes  # type: ignore[attr-defined]
    assert attrs["otelgpu.request.time_to_first_token"] == pytest.approx(0.1)
    # (duration - TTFT) / (tokens - 1) = 1.0 s / 10
    assert attrs["otelgpu.request.time_per_output_token"] == pytest.approx(0.1)
    assert runtime.tpot.merged().quantile(0.5) == pytest.approx(0.1, rel=0.011)


def test_pipeline_record_step_contract(app: App) -> None:
    runtime = _runtime_now()
    start = time.time_ns()
    span = runtime.record_step(
        StepRecord(
            start,
            start + 50_000_000,
            samples=64,
            span_attributes={"otelgpu.train.data_wait_s": 0.01, "custom.key": "v"},
        )
    )
    (finished,) = app.finished(names.STEP_SPAN)
    assert finished.context.span_id == span.get_span_context().span_id
    assert finished.start_time == start and finished.end_time == start + 50_000_000
    assert finished.attributes["otelgpu.train.samples_per_second"] == pytest.approx(1280.0)
    assert finished.attributes["otelgpu.train.data_wait_s"] == 0.01
    assert finished.attributes["custom.key"] == "v"
    hist = runtime.instrument(sketch_spec("otelgpu.torch.dataloader.wait", "s", "x"))
    assert runtime.instrument(sketch_spec("otelgpu.torch.dataloader.wait", "s", "x")) is hist
    hist.record(0.5, {"rank": 0})
    assert hist.merged().count == 1


def test_pipeline_asyncio_requests_keep_their_own_context(app: App) -> None:
    tracer = app.tracer_provider.get_tracer("user")

    async def one(i: int) -> None:
        async with otelgpu.request(model=f"m{i}") as r:
            await asyncio.sleep(0.01 * (5 - i))
            with tracer.start_as_current_span(f"decode{i}"):
                r.first_token()
                r.tokens(3)
            await asyncio.sleep(0.001)

    async def main() -> None:
        await asyncio.gather(*(one(i) for i in range(5)))

    asyncio.run(main())
    for i in range(5):
        (req,) = app.finished(f"chat m{i}")
        (child,) = app.finished(f"decode{i}")
        assert child.parent is not None and child.parent.span_id == req.context.span_id
        assert req.attributes["gen_ai.usage.output_tokens"] == 3


def test_pipeline_threads_count_exactly(app: App) -> None:
    def work() -> None:
        for _ in range(100):
            with otelgpu.step(samples=1):
                pass

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _runtime_now().step_duration.merged().count == 600
    assert len(app.finished(names.STEP_SPAN)) == 600
    numbers = {s.attributes["otelgpu.train.step"] for s in app.finished(names.STEP_SPAN)}
    assert numbers == set(range(1, 601))


class BrokenSampler:
    devices = ()

    def windows(self, start_ns: int, end_ns: int) -> Any:
        raise RuntimeError("NVML exploded")

    def events(self, start_ns: int, end_ns: int) -> Any:
        raise RuntimeError("NVML exploded")

    def stop(self) -> None:
        pass


def test_pipeline_broken_sampler_never_raises(app: App) -> None:
    runtime = _runtime_now()
    runtime.sampler = BrokenSampler()
    for _ in range(3):
        with otelgpu.step(samples=1):
            pass
    with otelgpu.request(model="m"):
        pass
    assert len(app.finished(names.STEP_SPAN)) == 3
    assert runtime.stats.errors()["gpu window"] == 4
    assert runtime.step_duration.merged().count == 3


def test_pipeline_quantile_gauges_on_app_meter(app: App) -> None:
    hist = _runtime_now().instrument(sketch_spec("otelgpu.test.q", "s", "q"))
    for v in range(1, 1001):
        hist.record(v / 1000)
    data = metrics_data(app.reader)
    points = {
        attributes_of(p)["quantile"]: point_value(p)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "otelgpu.test.q.quantile"
        for p in m.data.data_points
    }
    assert points[0.5] == pytest.approx(0.5, rel=0.01)
    assert points[0.95] == pytest.approx(0.95, rel=0.01)
    assert points[0.99] == pytest.approx(0.99, rel=0.01)


def test_pipeline_series_cap_folds_into_overflow(reset_otel_globals: None) -> None:
    otelgpu.instrument(exporters="none", gpu=False, max_series=3)
    hist = _runtime_now().instrument(sketch_spec("otelgpu.test.cap", "s", ""))
    for i in range(10):
        hist.record(1.0, {"id": i})
    series = {frozenset(a.items()): s.count for a, s in hist.series()}
    assert len(series) == 4
    assert series[frozenset({("otel.metric.overflow", True)})] == 7
    otelgpu.shutdown()


def test_pipeline_without_instrument_only_times() -> None:
    assert _runtime.current() is None
    with otelgpu.step(samples=3) as s:
        pass
    with otelgpu.request(model="m") as r:
        r.first_token()
        r.tokens(2)
    assert s.duration_s is not None and r.duration_s is not None
    assert r.ttft_s is not None and r.output_tokens == 2


def test_pipeline_instrument_again_after_shutdown(tmp_path: Any) -> None:
    from opentelemetry import trace

    first = otelgpu.instrument(recording_dir=str(tmp_path), gpu=False, service_name="one")
    first.shutdown()
    second = otelgpu.instrument(recording_dir=str(tmp_path), gpu=False, service_name="two")
    assert second is not first and second.runtime is not None
    assert second.runtime.pipeline is not None
    assert second.runtime.pipeline.owns_tracer_provider  # not the dead first provider
    with otelgpu.step(samples=1):
        pass
    second.shutdown()
    assert second.recording_path is not None
    assert "otelgpu.train.step" in second.recording_path.read_text()
    # The global provider is still the first one (set-once): otelgpu kept using its own.
    assert trace.get_tracer_provider() is first.runtime.pipeline.tracer_provider  # type: ignore[union-attr]


def test_pipeline_concurrent_instrument_returns_one_handle() -> None:
    handles: list[Any] = []
    barrier = threading.Barrier(6)

    def go() -> None:
        barrier.wait()
        handles.append(otelgpu.instrument(exporters="none", gpu=False, frameworks="none"))

    threads = [threading.Thread(target=go) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(h) for h in handles}) == 1
    handles[0].shutdown()


def test_pipeline_gpu_instrumentor_uses_given_providers() -> None:
    from otelgpu.instrumentation.gpu import GpuMetricsInstrumentor

    a = App()
    instrumentor = GpuMetricsInstrumentor()
    assert tuple(instrumentor.instrumentation_dependencies()) == ()
    instrumentor.instrument(
        tracer_provider=a.tracer_provider, meter_provider=a.meter_provider, gpu=False
    )
    try:
        runtime = _runtime_now()
        assert runtime.pipeline is not None
        assert runtime.pipeline.tracer_provider is a.tracer_provider
        assert runtime.settings.frameworks == ()  # the loader starts framework entry points
        with otelgpu.step(samples=1):
            pass
        assert len(a.finished(names.STEP_SPAN)) == 1
    finally:
        instrumentor.uninstrument()
    assert _runtime.current() is None


def _window(uuid: str, util: float, start: int, end: int) -> Any:
    from otelgpu.sampler import WindowStats

    fields: dict[str, Any] = dict.fromkeys(WindowStats._fields)
    fields.update(
        uuid=uuid, start_ns=start, end_ns=end, samples=5, lost=False,
        gpu_util_mean_pct=util, gpu_util_max_pct=util, memory_used_peak_bytes=1 << 30,
        energy_j=10.0, throttle_reason_names=(), xids=(),
    )  # fmt: skip
    return WindowStats(**fields)


class TwoGpuSampler:
    """Stands in for GpuSampler with fixed windows (real WindowStats/GpuEvent types)."""

    devices = ()

    def windows(self, start_ns: int, end_ns: int) -> Any:
        return {
            "GPU-a": _window("GPU-a", 10.0, start_ns, end_ns),
            "GPU-b": _window("GPU-b", 80.0, start_ns, end_ns),
            "GPU-c": _window("GPU-c", 90.0, start_ns, end_ns),
        }

    def events(self, start_ns: int, end_ns: int) -> Any:
        from otelgpu.sampler import GpuEvent

        mid = (start_ns + end_ns) // 2
        return [GpuEvent(mid, "GPU-a", "xid", 13, "a"), GpuEvent(mid, "GPU-c", "xid", 31, "c")]

    def stop(self) -> None:
        pass


def test_pipeline_gpu_context_restricted_to_devices(app: App) -> None:
    runtime = _runtime_now()
    runtime.sampler = TwoGpuSampler()
    start = time.time_ns()
    everything = runtime.gpu_attributes(start, start + 10**6)
    assert everything["otelgpu.gpu.ids"] == ["GPU-a", "GPU-b", "GPU-c"]
    assert everything["otelgpu.gpu.utilization.mean"] == pytest.approx(0.6)
    assert everything["otelgpu.gpu.energy"] == pytest.approx(30.0)
    runtime.record_request(
        RequestRecord(start, start + 10**6, model="m", devices=["GPU-c", "GPU-b"])
    )
    (span,) = app.finished("chat m")
    assert span.attributes["otelgpu.gpu.ids"] == ("GPU-c", "GPU-b")
    assert span.attributes["otelgpu.gpu.utilization.mean"] == pytest.approx(0.85)
    assert [e.attributes["hw.id"] for e in span.events] == ["GPU-c"]
    runtime.record_step(StepRecord(start, start + 10**6, devices=["GPU-a"]))
    (step,) = app.finished(names.STEP_SPAN)
    assert step.attributes["hw.id"] == "GPU-a"
    assert step.attributes["otelgpu.gpu.utilization.max"] == pytest.approx(0.1)
    assert [e.attributes["otelgpu.gpu.xid"] for e in step.events] == [13]
    runtime.sampler = None


def test_pipeline_request_genai_attributes(app: App) -> None:
    """gen_ai.provider.name names the serving system (default: the fallback _OTHER, never
    "otelgpu"); response id/model on the span; server.address/port on span and metrics."""
    with otelgpu.request(model="m") as r:
        r.response(id="cmpl-1", model="m-2024")
    with otelgpu.request(
        model="m", provider="sglang", server_address="10.0.0.7", server_port=30000
    ):
        pass
    default, sglang = (s.attributes for s in app.finished("chat m"))
    assert default["gen_ai.provider.name"] == "_OTHER"
    assert default["gen_ai.response.id"] == "cmpl-1"
    assert default["gen_ai.response.model"] == "m-2024"
    assert "server.address" not in default
    assert sglang["gen_ai.provider.name"] == "sglang"
    assert (sglang["server.address"], sglang["server.port"]) == ("10.0.0.7", 30000)
    series = {
        (a.get("gen_ai.provider.name"), a.get("server.port"))
        for a, _ in _runtime_now().request_duration.series()
    }
    assert series == {("_OTHER", None), ("sglang", 30000)}
