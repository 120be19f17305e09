"""Unit tests of the vLLM instrumentation's pure parts (no vLLM objects needed)
plus the import-isolation and entry-point checks."""

from __future__ import annotations

import importlib.metadata
import logging
import subprocess
from types import SimpleNamespace
from typing import Any

import pytest
from fixtures.otel import PYTHON, python_env
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from otelgpu.errors import ConfigurationError
from otelgpu.instrumentation.vllm import _devices, _setup
from otelgpu.instrumentation.vllm._context import TraceContextRegistry
from otelgpu.instrumentation.vllm._fields import FieldReader


def _config(**parallel: Any) -> Any:
    return SimpleNamespace(parallel_config=SimpleNamespace(**parallel))


def _devices_list(n: int) -> list[Any]:
    return [SimpleNamespace(uuid=f"GPU-{i:04d}", cuda_index=i) for i in range(n)]


@pytest.mark.parametrize(
    ("parallel", "engine", "visible", "expected"),
    [
        ({}, 0, 4, (0,)),  # TP=1: the first visible GPU
        ({"tensor_parallel_size": 2}, 0, 4, (0, 1)),
        ({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, 0, 8, (0, 1, 2, 3)),
        # DP=2 on one node: engine 1 takes the second slice
        ({"tensor_parallel_size": 2, "data_parallel_size_local": 2}, 1, 4, (2, 3)),
        # global DP rank 3 on a node with 2 local engines -> local engine 1
        ({"tensor_parallel_size": 2, "data_parallel_size_local": 2}, 3, 4, (2, 3)),
        # TP spans two nodes: only this node's GPUs can be sampled
        ({"tensor_parallel_size": 16}, 0, 8, tuple(range(8))),
        # context parallelism counted by vLLM's world_size
        ({"tensor_parallel_size": 2, "world_size": 4}, 0, 8, (0, 1, 2, 3)),
    ],
)
def test_vllm_engine_placement_follows_vllms_rules(
    parallel: dict[str, int], engine: int, visible: int, expected: tuple[int, ...]
) -> None:
    placement = _devices.engine_placement(_config(**parallel), engine, visible)
    assert placement.cuda_indices == expected
    uuids = _devices.resolve_uuids(placement.cuda_indices, _devices_list(visible))
    assert uuids == tuple(f"GPU-{i:04d}" for i in expected)


def test_vllm_engine_placement_with_inconsistent_config_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = _config(tensor_parallel_size=4, data_parallel_size_local=2)
    with caplog.at_level(logging.WARNING):
        placement = _devices.engine_placement(config, 1, 4)
    assert placement.cuda_indices == (0, 1, 2, 3)
    assert "only 4 are visible" in caplog.text


def test_vllm_resolve_uuids_uses_cuda_order_not_nvml_order() -> None:
    # CUDA_VISIBLE_DEVICES=3,1: CUDA ordinal 0 is NVML GPU 3
    devices = [
        SimpleNamespace(uuid="GPU-c", cuda_index=0, nvml_index=3),
        SimpleNamespace(uuid="GPU-a", cuda_index=1, nvml_index=1),
        SimpleNamespace(uuid="GPU-x", cuda_index=None, nvml_index=0),  # named, not visible
    ]
    assert _devices.visible_count(devices) == 2
    assert _devices.resolve_uuids((1, 0), devices) == ("GPU-a", "GPU-c")


def test_vllm_field_reader_tolerates_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    reader = FieldReader({"Thing": frozenset({"a"})})
    thing = type("Thing", (), {})()
    thing.__dict__.update(a=1, b=True, c="x", d=[1.5], e=None, extra=3)
    with caplog.at_level(logging.DEBUG, logger="otelgpu.instrumentation.vllm"):
        reader.inspect(thing)
        for _ in range(3):
            assert reader.integer(thing, "a") == 1
            assert reader.integer(thing, "b", default=-1) == -1  # bool is not a number
            assert reader.number(thing, "c") is None
            assert reader.sequence(thing, "d") == [1.5]
            assert reader.number(thing, "e", default=2.0) == 2.0  # None: not measured
            assert reader.maybe_integer(thing, "missing") is None
            assert reader.sequence(thing, "c") == ()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == reader.mismatches == 3  # once per field: b, c, missing
    assert "ignoring vLLM Thing fields b, c, d, e, extra" in caplog.text


def test_vllm_trace_context_registry_is_bounded_and_respects_headers() -> None:
    registry = TraceContextRegistry(max_entries=3)
    header = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    registry.capture("a", header)
    registry.capture("b", {"traceparent": "garbage"})  # invalid: no parent, nothing stored
    registry.capture(42, header)  # not a request id
    assert len(registry) == 1
    ctx = registry.pop("a")
    assert ctx is not None
    span_context = trace.get_current_span(ctx).get_span_context()
    assert span_context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert span_context.is_remote
    assert registry.pop("a") is None
    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("caller"):
        for i in range(5):
            registry.capture(f"r{i}", None)  # the caller's active span
    assert len(registry) == 3 and registry.evicted == 2
    assert registry.pop("r0") is None and registry.pop("r4") is not None


def test_vllm_options_fail_fast_naming_the_variable() -> None:
    assert _setup.read_options({}).timeout_s is None
    assert _setup.read_options({"OTELGPU_VLLM_TIMEOUT_S": "30"}).timeout_s == 30.0
    for bad in ("soon", "-1", "0", "inf", "nan"):
        with pytest.raises(ConfigurationError, match="OTELGPU_VLLM_TIMEOUT_S"):
            _setup.read_options({"OTELGPU_VLLM_TIMEOUT_S": bad})
    assert _setup.trace_context_enabled({"OTELGPU_VLLM_TRACE_CONTEXT": "off"}) is False
    with pytest.raises(ConfigurationError, match="OTELGPU_VLLM_TRACE_CONTEXT"):
        _setup.trace_context_enabled({"OTELGPU_VLLM_TRACE_CONTEXT": "maybe"})


def test_vllm_model_name_from_config() -> None:
    assert _setup.model_name(SimpleNamespace(model_config=None)) is None
    served = SimpleNamespace(model_config=SimpleNamespace(served_model_name=["llama", "alias"]))
    assert _setup.model_name(served) == "llama"
    fallback = SimpleNamespace(model_config=SimpleNamespace(served_model_name=None, model="m"))
    assert _setup.model_name(fallback) == "m"


def test_vllm_instrumentation_never_imports_vllm_itself() -> None:
    """otelgpu's core and VllmInstrumentor().instrument() leave vLLM unimported."""
    code = (
        "import sys, otelgpu\n"
        "from otelgpu.instrumentation.vllm import VllmInstrumentor\n"
        "VllmInstrumentor().instrument()\n"
        "assert 'vllm' not in sys.modules, 'vllm imported'\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    result = subprocess.run(
        [PYTHON, "-c", code], env=python_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_vllm_entry_points_are_declared() -> None:
    """The installed distribution declares both entry points (pyproject.toml)."""
    instrumentors = importlib.metadata.entry_points(group="opentelemetry_instrumentor")
    (vllm_ep,) = [ep for ep in instrumentors if ep.name == "otelgpu_vllm"]
    from otelgpu.instrumentation.vllm import VllmInstrumentor

    assert vllm_ep.load() is VllmInstrumentor
    plugins = importlib.metadata.entry_points(group="vllm.stat_logger_plugins")
    (ours,) = [ep for ep in plugins if ep.name == "otelgpu"]
    assert ours.value == "otelgpu.instrumentation.vllm.stat_logger:OtelGpuStatLogger"
