"""Contract tests against vLLM's real classes (CPU): plugin discovery, stats -> telemetry.

Everything vLLM-side is vLLM's own code: the entry-point loader
(``load_stat_logger_plugin_factories``), the per-engine adapter ``StatLoggerManager`` wraps
our factory in (``PerEngineStatLoggerAdapter``), ``VllmConfig``/``ParallelConfig``, and the
``SchedulerStats``/``IterationStats``/``FinishedRequestStats`` that vLLM's own
``IterationStats.update_from_*`` methods fill from scripted engine outputs. The telemetry is
checked where a user sees it: at an OTLP receiver, after ``otelgpu.instrument()`` exported
over OTLP/HTTP, with GPU context from the simulated GPUs.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from vllm_script import ScriptedRequest, batches, vllm_config
from vllm_support import Instrumented, wait_for_samples

from otelgpu.instrumentation.vllm import _context, _names, _patch
from otelgpu.metrics import catalog

pytestmark = pytest.mark.usefixtures("reset_otel_globals")

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def _stat_logger_class() -> Any:
    from otelgpu.instrumentation.vllm.stat_logger import OtelGpuStatLogger

    return OtelGpuStatLogger


def test_vllm_plugin_loader_finds_the_stat_logger(
    vllm_api: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls = _stat_logger_class()
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    assert cls in vllm_api.load_stat_logger_plugin_factories()
    # The VLLM_PLUGINS allowlist names plugins, not modules: ours is "otelgpu".
    monkeypatch.setenv("VLLM_PLUGINS", "otelgpu")
    assert vllm_api.load_plugins_by_group(vllm_api.STAT_LOGGER_PLUGINS_GROUP)["otelgpu"] is cls
    monkeypatch.setenv("VLLM_PLUGINS", "some_other_plugin")
    assert cls not in vllm_api.load_stat_logger_plugin_factories()


def _requests(now: float) -> list[ScriptedRequest]:
    """Four requests ending in the last ~0.2 s: stop, length, error, and an abort in queue."""
    return [
        ScriptedRequest(
            "req-a",
            now - 0.20,
            0.010,
            0.030,
            [0.010] * 4,
            "stop",
            prompt_tokens=100,
            cached_tokens=16,
            trace_headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"},
        ),
        ScriptedRequest("req-b", now - 0.18, 0.020, 0.040, [0.012] * 9, "length", 50),
        ScriptedRequest("req-c", now - 0.15, 0.005, 0.020, [0.010], "error", 30),
        ScriptedRequest("req-d", now - 0.12, 0.050, 0.0, [], "abort", 70, scheduled=False),
    ]


def _engine() -> Any:
    """An ``AsyncLLM`` whose engine was never started (``__init__`` and ``__del__`` skipped).

    Calling its real ``add_request`` creates the coroutine -- our wrapper runs at call time,
    before vLLM's body would drop ``trace_headers`` -- which the caller closes unrun.
    """
    from vllm.v1.engine.async_llm import AsyncLLM

    class _IdleEngine(AsyncLLM):  # type: ignore[misc]
        def __init__(self) -> None:
            pass

        def __del__(self) -> None:
            pass

    return _IdleEngine()


def _capture_trace_context(vllm_api: SimpleNamespace, requests: list[ScriptedRequest]) -> None:
    """What the OpenAI server does per request: ``engine.add_request(..., trace_headers=)``."""
    engine = _engine()
    for r in requests:
        engine.add_request(r.request_id, "prompt", None, trace_headers=r.trace_headers).close()


def _drive(
    vllm_api: SimpleNamespace, tp: int = 2, dp: int = 2, engine: int = 1
) -> tuple[Any, list[ScriptedRequest], list[Any]]:
    """Builds the loggers through vLLM's adapter and records the scripted batches."""
    cls = vllm_api.load_stat_logger_plugin_factories()
    (factory,) = [c for c in cls if c is _stat_logger_class()]
    adapter = vllm_api.PerEngineStatLoggerAdapter(
        vllm_config(vllm_api, tp=tp, dp=dp), list(range(dp)), factory
    )
    adapter.log_engine_initialized()
    now = time.time()
    requests = _requests(now)
    _capture_trace_context(vllm_api, requests)
    recorded = batches(vllm_api, requests)
    for b in recorded:
        adapter.record(b.scheduler_stats, b.iteration_stats, None, engine_idx=engine)
    return adapter, requests, recorded


def test_vllm_stats_become_documented_metrics_and_spans(
    vllm_api: SimpleNamespace, instrumented: Callable[..., Instrumented]
) -> None:
    run = instrumented()
    runtime = run.runtime
    wait_for_samples(runtime)
    adapter, requests, recorded = _drive(vllm_api)
    recorder = adapter.per_engine_stat_loggers[1].recorder
    assert recorder.placement.cuda_indices == (2, 3)
    uuids = tuple(d.uuid for d in runtime.sampler.devices)
    assert recorder.gpu_uuids == uuids[2:4]
    assert adapter.per_engine_stat_loggers[0].recorder.gpu_uuids == uuids[0:2]
    time.sleep(0.05)  # the sampler covers the last request's end
    run.finish()

    # ---- spans: one per finished request, joined to the caller's trace when it sent one
    spans = {_attrs(s)["gen_ai.response.id"]: s for s in _request_spans(run)}
    assert set(spans) == {"req-a", "req-b", "req-c", "req-d"}
    ipc = 0.0003
    for r in requests:
        span, attrs = spans[r.request_id], _attrs(spans[r.request_id])
        assert span.name == "text_completion"
        assert span.kind == 2  # SERVER
        assert span.start_time_unix_nano == pytest.approx(r.arrival * 1e9, abs=2_000)
        assert span.end_time_unix_nano == pytest.approx((r.end + ipc) * 1e9, abs=2_000)
        assert attrs["gen_ai.response.finish_reasons"] == [r.finish_reason]
        assert attrs["gen_ai.usage.input_tokens"] == r.prompt_tokens
        assert attrs.get("gen_ai.usage.output_tokens", 0) == r.output_tokens
        assert attrs["otelgpu.vllm.engine"] == 1
        # GPU context of the simulated GPUs over the request's lifetime
        assert set(attrs["otelgpu.gpu.ids"]) <= set(uuids)
        assert 0.0 < attrs["otelgpu.gpu.utilization.mean"] <= 1.0
    a = _attrs(spans["req-a"])
    assert spans["req-a"].trace_id.hex() == TRACE_ID
    assert spans["req-a"].parent_span_id.hex() == PARENT_ID
    assert spans["req-b"].trace_id.hex() != TRACE_ID and not spans["req-b"].parent_span_id
    assert a["otelgpu.request.outcome"] == "ok"
    assert a["gen_ai.usage.cache_read.input_tokens"] == 16
    assert a["otelgpu.request.queue_time"] == pytest.approx(0.010, abs=1e-6)
    assert a["otelgpu.vllm.prefill_time"] == pytest.approx(0.030, abs=1e-6)
    assert a["otelgpu.vllm.decode_time"] == pytest.approx(0.040, abs=1e-6)
    assert a["otelgpu.request.time_per_output_token"] == pytest.approx(0.010, abs=1e-6)
    ttft = requests[0].first_token + ipc - requests[0].arrival
    assert a["otelgpu.request.time_to_first_token"] == pytest.approx(ttft, abs=1e-6)
    c, d = _attrs(spans["req-c"]), _attrs(spans["req-d"])
    assert (c["otelgpu.request.outcome"], c["error.type"]) == ("error", "error")
    assert spans["req-c"].status.code == 2  # ERROR
    assert (d["otelgpu.request.outcome"], d["error.type"]) == ("error", "abort")
    # never scheduled: vLLM reports 0 - queued_ts as its queue time; we drop it
    assert "otelgpu.request.queue_time" not in d and "otelgpu.vllm.prefill_time" not in d

    # ---- the engine's cold-start span and gauge
    startups = run.spans(_names.STARTUP_SPAN_NAME)
    assert sorted(_attrs(s)["otelgpu.vllm.engine"] for s in startups) == [0, 1]
    assert all(_attrs(s)["otelgpu.vllm.tensor_parallel_size"] == 2 for s in startups)
    startup_points = run.points(catalog.STARTUP_DURATION.name)
    assert {p[0]["otelgpu.vllm.engine"] for p in startup_points} == {0, 1}
    assert all(p.as_double > 0 for _, p in startup_points)

    # ---- metrics, as documented (names, units)
    metrics = run.metrics()
    for metric in catalog.VLLM_METRICS:
        if metric.name in metrics:
            assert metrics[metric.name].unit == metric.unit, metric.name
    last = recorded[-1].scheduler_stats
    assert _engine_value(run, catalog.REQUESTS_RUNNING.name) == last.num_running_reqs
    assert _engine_value(run, catalog.REQUESTS_WAITING.name) == last.num_waiting_reqs
    assert _engine_value(run, catalog.KV_CACHE_USAGE.name) == pytest.approx(last.kv_cache_usage)
    peak = max(b.scheduler_stats.kv_cache_usage for b in recorded)
    assert _engine_value(run, catalog.KV_CACHE_USAGE_PEAK.name) == pytest.approx(peak)
    assert peak > 0
    prefix_q = sum(b.scheduler_stats.prefix_cache_stats.queries for b in recorded)
    prefix_h = sum(b.scheduler_stats.prefix_cache_stats.hits for b in recorded)
    assert _engine_value(run, catalog.PREFIX_CACHE_QUERIES.name) == prefix_q == 180
    assert _engine_value(run, catalog.PREFIX_CACHE_HITS.name) == prefix_h == 16
    assert _engine_value(run, catalog.PREFIX_CACHE_HIT_RATIO.name) == pytest.approx(16 / 180)
    finished = {
        attrs["otelgpu.vllm.finish_reason"]: p.as_int
        for attrs, p in run.points(catalog.REQUESTS_FINISHED.name)
        if attrs["otelgpu.vllm.engine"] == 1
    }
    assert finished == {"stop": 1, "length": 1, "error": 1, "abort": 1}
    tokens = {
        attrs["gen_ai.token.type"]: p.as_int
        for attrs, p in run.points(catalog.TOKENS.name)
        if attrs["otelgpu.vllm.engine"] == 1
    }
    assert tokens == {"input": 100 + 50 + 30, "output": 5 + 10 + 2}
    itl = run.metrics()[catalog.INTER_TOKEN_LATENCY.name].exponential_histogram.data_points
    assert sum(p.count for p in itl) == 4 + 9 + 1
    assert _engine_value(run, catalog.REQUEST_RATE.name) > 0
    outcomes = {
        attrs["otelgpu.request.outcome"]: p.as_int
        for attrs, p in run.points("otelgpu.inference.requests")
        if attrs.get("gen_ai.provider.name") == "vllm"
    }
    assert outcomes == {"ok": 2, "error": 2}
    durations = run.metrics()["gen_ai.server.request.duration"].exponential_histogram
    by_error = {
        _point_attrs(p).get("error.type", ""): p.count
        for p in durations.data_points
        if _point_attrs(p).get("gen_ai.provider.name") == "vllm"
    }
    assert by_error == {"": 2, "error": 1, "abort": 1}
    assert runtime.stats.errors() == {}


def test_vllm_request_gpu_context_is_the_engines_gpus(
    vllm_api: SimpleNamespace, instrumented: Callable[..., Instrumented]
) -> None:
    run = instrumented()
    wait_for_samples(run.runtime)
    adapter, _, _ = _drive(vllm_api, tp=2, dp=2, engine=1)
    expected = list(adapter.per_engine_stat_loggers[1].recorder.gpu_uuids)
    time.sleep(0.05)
    run.finish()
    spans = _request_spans(run)
    assert spans
    for span in spans:
        attrs = _attrs(span)
        assert attrs["otelgpu.gpu.ids"] == expected
        # GPUs 2-3 of the scenario run at 80 %, GPUs 0-1 at 10 %
        assert attrs["otelgpu.gpu.utilization.mean"] == pytest.approx(0.80, abs=0.05)


def test_vllm_unstable_stats_fields_warn_once_and_never_raise(
    vllm_api: SimpleNamespace,
    instrumented: Callable[..., Instrumented],
    caplog: pytest.LogCaptureFixture,
) -> None:
    run = instrumented()
    cls = _stat_logger_class()
    logger = cls(vllm_config(vllm_api), 0)
    real = vllm_api.SchedulerStats(num_running_reqs=3, num_waiting_reqs=2, kv_cache_usage=0.5)
    # A future vLLM: one field renamed away, one of a new type, one added.
    fields = {k: v for k, v in vars(real).items() if k != "num_waiting_reqs"}
    fields["kv_cache_usage"] = "50%"
    fields["brand_new_field"] = 42
    future = _like("SchedulerStats", **fields)
    it = vllm_api.IterationStats()
    it.finished_requests.append(
        vllm_api.FinishedRequestStats(finish_reason=vllm_api.FinishReason.STOP, e2e_latency=0.5)
    )
    del it.inter_token_latencies_iter  # a removed list
    caplog.set_level("WARNING", logger="otelgpu.instrumentation.vllm")
    for _ in range(3):
        logger.record(future, it)
    # garbage where vLLM's objects should be, and a stats object that raises on access
    logger.record(object(), SimpleNamespace(finished_requests=[object()]))
    logger.record(None, _Exploding())
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    mismatches = [w for w in warnings if "otelgpu: vLLM" in w]
    assert any("SchedulerStats.num_waiting_reqs is missing" in w for w in mismatches)
    assert any("SchedulerStats.kv_cache_usage is a str" in w for w in mismatches)
    assert any("IterationStats.inter_token_latencies_iter is missing" in w for w in mismatches)
    assert len(mismatches) == len(set(mismatches))  # once per (class, field)
    assert not any("brand_new_field" in w for w in warnings)
    recorder = logger.recorder
    assert recorder.running == 3  # what could be read was recorded
    assert recorder.finished == {"stop": 3, "unknown": 1}
    assert run.runtime.stats.errors() == {"vllm.record": 1}


def _like(class_name: str, **fields: Any) -> Any:
    """An object of a class named like vLLM's, holding exactly ``fields``."""
    obj = type(class_name, (), {})()
    obj.__dict__.update(fields)
    return obj


class _Exploding:
    @property
    def num_generation_tokens(self) -> int:
        raise RuntimeError("a vLLM property that fails")


def test_vllm_duplicate_stat_logger_for_one_engine_records_nothing(
    vllm_api: SimpleNamespace, instrumented: Callable[..., Instrumented]
) -> None:
    instrumented()
    cls = _stat_logger_class()
    config = vllm_config(vllm_api)
    first, second = cls(config, 0), cls(config, 0)
    assert first.recorder is not None and second.recorder is None
    assert cls(vllm_config(vllm_api), 0).recorder is not None  # another engine config


def test_vllm_instrumentor_injects_the_logger_into_offline_engines(
    vllm_api: SimpleNamespace,
    instrumented: Callable[..., Instrumented],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm.v1.engine import llm_engine

    from otelgpu.instrumentation.vllm import VllmInstrumentor

    original = llm_engine.LLMEngine.__dict__["from_vllm_config"]
    built: list[dict[str, Any]] = []

    def fake_init(self: Any, **kwargs: Any) -> None:
        built.append(kwargs)

    configs = [vllm_config(vllm_api), vllm_config(vllm_api)]
    monkeypatch.setattr(llm_engine.LLMEngine, "__init__", fake_init)
    executor = llm_engine.Executor  # type: ignore[attr-defined]  # vLLM re-exports it, no __all__
    monkeypatch.setattr(executor, "get_class", staticmethod(lambda _config: object))
    instrumentor = VllmInstrumentor()
    assert tuple(instrumentor.instrumentation_dependencies()) == ("vllm >= 0.10",)
    instrumentor.instrument()
    try:
        cls = _stat_logger_class()
        # What LLM(...) does: stats off by default, no stat_loggers.
        llm_engine.LLMEngine.from_vllm_config(configs[0], disable_log_stats=True)
        # the positional form (vllm_config, usage_context, stat_loggers); None: no context
        llm_engine.LLMEngine.from_vllm_config(configs[1], None, [cls])  # type: ignore[arg-type]
        assert built[0]["log_stats"] is True and built[0]["stat_loggers"] == [cls]
        assert built[1]["stat_loggers"] == [cls]  # not added twice
        # applied now, or by the post-import hook the moment vLLM imports the module
        importlib.import_module("vllm.v1.engine.async_llm")
        assert _patch.is_applied(("vllm.v1.engine.async_llm", "AsyncLLM", "add_request"))
    finally:
        instrumentor.uninstrument()
    assert llm_engine.LLMEngine.__dict__["from_vllm_config"] is original
    assert not _patch.is_applied(("vllm.v1.engine.async_llm", "AsyncLLM", "add_request"))


def test_vllm_trace_context_from_the_callers_active_span(
    vllm_api: SimpleNamespace, instrumented: Callable[..., Instrumented]
) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    run = instrumented()
    cls = _stat_logger_class()
    logger = cls(vllm_config(vllm_api), 0)  # installs the add_request wrappers
    caller = TracerProvider().get_tracer("http-server")
    with caller.start_as_current_span("POST /v1/completions") as server_span:
        _engine().add_request("req-x", "p", None).close()
    it = vllm_api.IterationStats()
    it.finished_requests.append(
        vllm_api.FinishedRequestStats(
            finish_reason=vllm_api.FinishReason.STOP, request_id="req-x", e2e_latency=0.25
        )
    )
    logger.record(None, it)
    assert len(_context.REGISTRY) == 0  # consumed
    run.finish()
    (span,) = [s for s in run.spans() if _attrs(s).get("gen_ai.response.id") == "req-x"]
    ctx = server_span.get_span_context()
    assert span.trace_id == ctx.trace_id.to_bytes(16, "big")
    assert span.parent_span_id == ctx.span_id.to_bytes(8, "big")
    assert trace.get_current_span() is trace.INVALID_SPAN


def _request_spans(run: Instrumented) -> list[Any]:
    return [s for s in run.spans() if "gen_ai.response.id" in _attrs(s)]


def _attrs(span: Any) -> dict[str, Any]:
    from fixtures.otlp_receiver import attributes

    return attributes(span.attributes)


def _point_attrs(point: Any) -> dict[str, Any]:
    from fixtures.otlp_receiver import attributes

    return attributes(point.attributes)


def _engine_value(run: Instrumented, name: str, engine: int = 1) -> float:
    values = [
        p.as_double if p.HasField("as_double") else p.as_int
        for attrs, p in run.points(name)
        if attrs.get("otelgpu.vllm.engine") == engine
    ]
    assert len(values) == 1, (name, values)
    return float(values[0])


def test_vllm_plugin_starts_otelgpu_itself_from_the_environment(
    vllm_api: SimpleNamespace,
    instrumented: Callable[..., Instrumented],
    otlp_receiver: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``vllm serve`` with only the plugin: no instrument() call, settings from OTELGPU_*."""
    from otelgpu import _runtime

    monkeypatch.setenv("OTELGPU_OTLP_ENDPOINT", otlp_receiver.http_endpoint)
    monkeypatch.setenv("OTELGPU_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTELGPU_SERVICE_NAME", "vllm-zero-code")
    assert _runtime.current() is None
    (factory,) = [
        c for c in vllm_api.load_stat_logger_plugin_factories() if c is _stat_logger_class()
    ]
    adapter = vllm_api.PerEngineStatLoggerAdapter(vllm_config(vllm_api), [0], factory)
    runtime = _runtime.current()
    assert runtime is not None  # started by the stat logger
    it = vllm_api.IterationStats()
    it.finished_requests.append(
        vllm_api.FinishedRequestStats(
            finish_reason=vllm_api.FinishReason.LENGTH, request_id="zc-1", e2e_latency=0.1
        )
    )
    adapter.record(None, it, None, engine_idx=0)
    import otelgpu

    otelgpu.shutdown()
    spans = [s for r, _, s in otlp_receiver.spans() if r.get("service.name") == "vllm-zero-code"]
    assert [_attrs(s)["gen_ai.response.id"] for s in spans] == ["zc-1"]


def test_vllm_own_tracing_provider_is_left_alone(
    vllm_api: SimpleNamespace, instrumented: Callable[..., Instrumented]
) -> None:
    """With ``--otlp-traces-endpoint`` vLLM installs its tracer provider globally first."""
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Tracer, TracerProvider

    from otelgpu import _runtime

    vllm_provider = TracerProvider(
        resource=Resource.create({"vllm.instrumenting_module_name": "vllm.llm_engine"})
    )
    trace.set_tracer_provider(vllm_provider)
    _stat_logger_class()(vllm_config(vllm_api), 0)
    runtime = _runtime.current()
    assert runtime is not None
    assert trace.get_tracer_provider() is vllm_provider  # vLLM's stays global
    tracer = runtime.tracer
    assert isinstance(tracer, Tracer)
    assert tracer.resource is not vllm_provider.resource  # otelgpu has its own
    assert "vllm.instrumenting_module_name" not in tracer.resource.attributes
