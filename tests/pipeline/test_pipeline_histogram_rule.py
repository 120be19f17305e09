"""The quantile rule of the gauges and the classic buckets of the pull endpoint
(``otelgpu.otel.histogram_rule``), in both twins of the sketch."""

from __future__ import annotations

import bisect
import math
import random

import pytest
from fixtures.otel import attributes_of

from otelgpu.otel import histogram_rule
from otelgpu.otel.sketches import SketchHistogram
from otelgpu.sketch import QuantileSketch


def _exact(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[histogram_rule.nearest_rank(q, len(ordered)) - 1]


def _gauges(hist: SketchHistogram, qs: tuple[float, ...]) -> dict[float, float]:
    return {float(attributes_of(o)["quantile"]): o.value for o in hist.observe_quantiles(qs)}


def test_pipeline_quantile_gauge_two_checkpoints() -> None:
    """0.0166 s and 0.1075 s: p95 and p99 are the larger (they read 0.0166 s before)."""
    hist = SketchHistogram("x", "s", "")
    hist.record(0.0166)
    hist.record(0.1075)
    assert _gauges(hist, (0.5, 0.95, 0.99)) == {0.5: 0.0166, 0.95: 0.1075, 0.99: 0.1075}


@pytest.mark.parametrize("n", [10, 100, 1000])
def test_pipeline_quantile_gauge_nearest_rank(n: int) -> None:
    rng = random.Random(n)
    values = [rng.lognormvariate(-3, 1) for _ in range(n)]
    hist = SketchHistogram("y", "s", "")
    for v in values:
        hist.record(v)
    got = _gauges(hist, (0.5, 0.95, 0.99))
    for q, value in got.items():
        exact = _exact(values, q)
        assert abs(value - exact) <= 0.01 * exact, (q, value, exact)
    if n == 10:
        assert got[0.99] == max(values)


def test_pipeline_nearest_rank_is_float_safe() -> None:
    assert histogram_rule.nearest_rank(0.07, 100) == 7  # 0.07 * 100 = 7.000000000000001
    assert histogram_rule.nearest_rank(0.99, 2) == 2
    assert histogram_rule.nearest_rank(0.5, 10) == 5
    assert histogram_rule.nearest_rank(0.0, 10) == 1


@pytest.mark.parametrize("unit", ["s", "By"])
def test_pipeline_classic_buckets_are_exact(unit: str) -> None:
    rng = random.Random(5)
    # Within the sketch's full-accuracy span (2**32 wide: lower buckets collapse upwards).
    values = [rng.lognormvariate(-4 if unit == "s" else 10, 1.5) for _ in range(5000)]
    values += [0.0, -1.0]  # zero and negative: below every bound
    if unit == "s":
        values.append(1e5)  # above the last bound: only in +Inf
    sketch = QuantileSketch()
    for v in values:
        sketch.add(v)
    point = sketch.to_data_point(0, 1)
    buckets = histogram_rule.classic_buckets(point, unit)
    bounds = histogram_rule.classic_bounds(unit)
    assert [le for le, _ in buckets] == [*bounds, math.inf]
    ordered = sorted(values)
    for le, count in buckets:
        # Exact up to values lying within the sketch's bucket of a bound (1 % wide).
        lo = bisect.bisect_right(ordered, le / 1.02)
        hi = bisect.bisect_right(ordered, le * 1.02)
        assert lo <= count <= hi, (le, count, lo, hi)
    counts = [c for _, c in buckets]
    assert counts == sorted(counts) and counts[-1] == len(values)
    # Bounds are powers of sqrt(2): every other one is a power of two.
    assert all(math.isclose(math.log2(b) * 2, round(math.log2(b) * 2)) for b in bounds)
