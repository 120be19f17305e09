"""The fleet property: histograms exported by several processes, merged downstream, give
the same quantiles as one sketch fed every value (brief, "Scale")."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fixtures.otel import python_env
from fixtures.otlp_receiver import (
    OtlpReceiver,
)

from otelgpu.sketch import QuantileSketch

ROOT = Path(__file__).resolve().parents[2]
RANKS = 3
PROGRAM = """
    import random, sys
    import otelgpu
    from otelgpu import _runtime
    rank, RANKS = int(sys.argv[1]), int(sys.argv[2])
    otelgpu.instrument(gpu=False, frameworks="none", metric_export_interval_ms=3_600_000,
                       resource_attributes={"rank": str(rank)})
    from otelgpu.metrics.spec import Area, Kind, MetricSpec
    spec = MetricSpec("otelgpu.test.step", Kind.SKETCH, "s", "merge test", Area.RUNTIME)
    hist = _runtime.current().instrument(spec)
    values = [random.Random(11).lognormvariate(-3.5, 0.8) for _ in range(3000)]
    for v in values[rank::RANKS]:
        hist.record(v)
    otelgpu.shutdown()
"""


@pytest.mark.slow
def test_pipeline_exported_histograms_merge_like_one_sketch(otlp_receiver: OtlpReceiver) -> None:
    env = python_env(OTEL_EXPORTER_OTLP_ENDPOINT=otlp_receiver.grpc_endpoint)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(PROGRAM), str(rank), str(RANKS)],
            env=env,
            cwd=ROOT,
        )
        for rank in range(RANKS)
    ]
    assert [p.wait(120) for p in procs] == [0] * RANKS

    points = {}
    for resource, _, metric in otlp_receiver.metrics():
        if metric.name == "otelgpu.test.step":
            (dp,) = metric.exponential_histogram.data_points
            points[resource["rank"]] = dp
    assert sorted(points) == ["0", "1", "2"]
    merged = QuantileSketch(relative_accuracy=0.01)
    for dp in points.values():
        merged.merge(QuantileSketch.from_data_point(dp))

    single = QuantileSketch(relative_accuracy=0.01)
    values = [random.Random(11).lognormvariate(-3.5, 0.8) for _ in range(3000)]
    for v in values:
        single.add(v)
    a, b = merged.to_data_point(0, 1), single.to_data_point(0, 1)
    assert (a.scale, a.positive.offset, list(a.positive.bucket_counts)) == (
        b.scale,
        b.positive.offset,
        list(b.positive.bucket_counts),
    )
    qs = [0.5, 0.9, 0.95, 0.99, 0.999]
    assert merged.quantiles(qs) == single.quantiles(qs)
    exact = sorted(values)
    for q, est in zip(qs, single.quantiles(qs), strict=True):
        truth = exact[int(q * (len(exact) - 1))]
        assert abs(est - truth) <= 0.0101 * truth
