"""Out-of-range numbers from the caller never reach an exporter (issue: one value of
2**63 in a counter made every later OTLP export fail, GPU metrics included).

Each bad value is dropped, counted in ``otelgpu.internal.rejected`` by field and reason,
and the step or request itself is still recorded; nothing is raised to the host.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.otel import python_env, run_python
from fixtures.otlp_receiver import OtlpReceiver, attributes

from otelgpu import _values
from otelgpu.metrics import catalog

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
    import json, time
    import otelgpu

    handle = otelgpu.instrument(sample_interval_ms=20, metric_export_interval_ms=3_600_000)
    time.sleep(0.2)
    with otelgpu.step(samples=2**63):
        pass
    with otelgpu.step(samples=-1, tokens=float("nan"), step=2**64):
        pass
    with otelgpu.request(model="m", queue_time_s=float("inf")) as r:
        r.first_token()
        r.tokens(2**63)
        r.input_tokens(10**30)
    handle.force_flush()
    with otelgpu.step(samples=8, tokens=16):
        time.sleep(0.05)
    handle.force_flush()
    handle.shutdown()
    print(json.dumps("done"))
"""


def _points(receiver: OtlpReceiver) -> dict[str, list[tuple[dict[str, object], object]]]:
    """The last exported value of every metric data point, by metric name."""
    out: dict[str, dict[tuple[tuple[str, str], ...], tuple[dict[str, object], object]]] = {}
    for _resource, _scope, metric in receiver.metrics():
        kind = metric.WhichOneof("data")
        if kind not in ("sum", "gauge"):
            continue
        for dp in getattr(metric, kind).data_points:
            attrs = attributes(dp.attributes)
            key = tuple(sorted((k, str(v)) for k, v in attrs.items()))
            value = dp.as_int if dp.HasField("as_int") else dp.as_double
            out.setdefault(metric.name, {})[key] = (attrs, value)
    return {name: list(points.values()) for name, points in out.items()}


@pytest.mark.slow
def test_pipeline_out_of_range_values_do_not_poison_export(otlp_receiver: OtlpReceiver) -> None:
    env = python_env(
        OTELGPU_SIM="healthy-8xh100",
        LOCAL_RANK="0",
        OTEL_EXPORTER_OTLP_ENDPOINT=otlp_receiver.grpc_endpoint,
        OTELGPU_FRAMEWORKS="none",
    )
    proc = run_python(PROGRAM, env)
    assert proc.returncode == 0, proc.stderr
    assert "Value out of range" not in proc.stderr
    assert "Traceback" not in proc.stderr

    points = _points(otlp_receiver)
    # The export after the bad values still carries the GPU and step metrics.
    assert points[catalog.POWER.name]
    assert [v for _, v in points[catalog.TRAIN_STEPS.name]] == [3]
    assert [v for _, v in points[catalog.TRAIN_SAMPLES.name]] == [8]
    assert [v for _, v in points[catalog.TRAIN_TOKENS.name]] == [16]
    rejected = {
        (a["otelgpu.field"], a["otelgpu.reason"]): v
        for a, v in points[catalog.INTERNAL_REJECTED.name]
    }
    assert rejected == {
        ("samples", "too_large"): 1,
        ("samples", "negative"): 1,
        ("tokens", "nan"): 1,
        ("step", "too_large"): 1,
        ("output_tokens", "too_large"): 1,
        ("input_tokens", "too_large"): 1,
        ("queue_time_s", "infinite"): 1,
    }
    # Every span arrived, the bad fields left out.
    steps = [attributes(s.attributes) for _, _, s in otlp_receiver.spans()
             if s.name == catalog.STEP_SPAN]  # fmt: skip
    assert len(steps) == 3
    assert "otelgpu.train.samples" not in steps[0]
    assert steps[2]["otelgpu.train.samples"] == 8
    (request,) = [attributes(s.attributes) for _, _, s in otlp_receiver.spans()
                  if s.name == "chat m"]  # fmt: skip
    assert "gen_ai.usage.output_tokens" not in request
    assert "otelgpu.request.queue_time" not in request


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (2**63, "too_large"),
        (-1, "negative"),
        (float("nan"), "nan"),
        (float("inf"), "infinite"),
        ("12", "not_a_number"),
        (True, "not_a_number"),
    ],
)
def test_pipeline_values_reject_and_count(value: object, reason: str) -> None:
    seen: list[tuple[str, str]] = []

    class Stats:
        def add_rejected(self, field: str, why: str) -> None:
            seen.append((field, why))

    assert _values.count(value, "samples", Stats()) is None
    assert _values.duration(value, "queue_time_s", Stats()) is None
    assert seen == [("samples", reason), ("queue_time_s", reason)]


def test_pipeline_values_accept_in_range() -> None:
    assert _values.count(0, "x", None) == 0
    assert _values.count(_values.MAX_COUNT, "x", None) == _values.MAX_COUNT
    assert _values.count(2.5, "x", None) == 2.5
    assert _values.duration(0.25, "x", None) == 0.25
    assert _values.duration(None, "x", None) is None


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (float("nan"), "nan"),
        (float("inf"), "infinite"),
        (-1.0, "negative"),
        (1e25, "too_large"),
        (True, "not_a_number"),
    ],
)
def test_pipeline_values_float_fast_path_still_rejects(value: object, reason: str) -> None:
    """The float fast path of ``flops``/``duration`` lets only in-range floats through."""
    seen: list[tuple[str, str]] = []

    class Stats:
        def add_rejected(self, field: str, why: str) -> None:
            seen.append((field, why))

    assert _values.flops(value, "flops", Stats()) is None
    assert seen == [("flops", reason)]
    if value != 1e25:  # 1e25 s is too large too, 1e25 FLOPs the FLOP limit only
        assert _values.duration(value, "queue_time_s", Stats()) is None


def test_pipeline_values_float_fast_path_accepts_the_bounds() -> None:
    assert _values.flops(0.0, "x", None) == 0.0
    assert _values.flops(_values.MAX_FLOPS, "x", None) == _values.MAX_FLOPS
    assert _values.flops(3, "x", None) == 3.0
    assert type(_values.flops(3, "x", None)) is float
    assert _values.duration(_values.MAX_DURATION_S, "x", None) == _values.MAX_DURATION_S
    assert _values.duration(float(_values.MAX_DURATION_S) * 2, "x", None) is None
