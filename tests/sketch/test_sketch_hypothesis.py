"""Property tests (bounded, derandomized): the error bound, exact merges, bytes and
OTLP round trips, on both twins."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from otelgpu.sketch import _mapping

# The only function-scoped fixture is the (stateless) twin class.
PROPS = settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

finite = st.floats(allow_nan=False, allow_infinity=False)
durations = st.floats(min_value=1e-9, max_value=1e6, allow_nan=False)
values_lists = st.lists(st.one_of(finite, durations, st.just(0.0)), max_size=60)
scales = st.integers(min_value=-3, max_value=12)


def _sketch(cls: Any, values: list[float], **kwargs: Any) -> Any:
    s = cls(**kwargs)
    for v in values:
        s.add(v)
    return s


@PROPS
@given(
    xs=st.lists(st.one_of(durations, finite), min_size=1, max_size=80),
    scale=st.integers(min_value=-3, max_value=8),  # full float range <= 524k buckets
)
@example(xs=[1.0, 2.0, 4.0, 0.5], scale=6)
@example(xs=[5e-324, 2.2250738585072014e-308, 1.7976931348623157e308], scale=6)
@example(xs=[0.0, -0.0, -1.0, 1.0], scale=0)
def test_quantile_error_bound(sketch_cls: Any, xs: list[float], scale: int) -> None:
    s = sketch_cls(scale=scale, max_buckets=1 << 24)  # no collapse: the full guarantee
    s.add_many(xs)
    ordered = sorted(xs)
    alpha = _mapping.accuracy_for_scale(scale)
    for q in (0.0, 0.1, 0.25, 0.5, 0.9, 0.99, 1.0):
        exact = ordered[int(q * (len(ordered) - 1))]
        est = s.quantile(q)
        assert abs(est - exact) <= alpha * abs(exact) * (1 + 1e-9) + 1e-300, (q, est, exact)
    assert s.count == len(xs) and s.min == ordered[0] and s.max == ordered[-1]


@PROPS
@given(a=values_lists, b=values_lists, c=values_lists, cap=st.sampled_from([3, 40, 4096]))
def test_merge_is_exact_and_associative(
    sketch_cls: Any, a: list[float], b: list[float], c: list[float], cap: int
) -> None:
    def make(xs: list[float]) -> Any:
        return _sketch(sketch_cls, xs, max_buckets=cap)

    left = make(a)
    left.merge(make(b))
    left.merge(make(c))  # (a + b) + c
    bc = make(b)
    bc.merge(make(c))
    right = make(a)
    right.merge(bc)  # a + (b + c)
    everything = make(a + b + c)  # one sketch, values added one by one
    magnitude = math.fsum(abs(x) for x in a + b + c)
    for merged in (left, right):
        got, want = merged._state(), everything._state()
        assert got._replace(sum=0.0) == want._replace(sum=0.0)  # bucket for bucket
        if math.isfinite(magnitude):  # float sums depend on association: bound by sum |x|
            assert abs(got.sum - want.sum) <= 1e-12 * magnitude


@PROPS
@given(xs=values_lists, scale=scales, cap=st.sampled_from([2, 17, 2048]))
def test_bytes_round_trip_is_exact(sketch_cls: Any, xs: list[float], scale: int, cap: int) -> None:
    s = _sketch(sketch_cls, [*xs, math.nan], scale=scale, max_buckets=cap)
    data = s.to_bytes()
    back = sketch_cls.from_bytes(data)
    assert back._state() == s._state()
    assert back.to_bytes() == data


@PROPS
@given(xs=values_lists, scale=scales)
def test_otlp_round_trip_preserves_counts(sketch_cls: Any, xs: list[float], scale: int) -> None:
    s = _sketch(sketch_cls, xs, scale=scale)
    dp = s.to_data_point(1, 2, {"k": 1})
    assert dp.count == len(xs) == s.count
    assert dp.zero_count + sum(dp.positive.bucket_counts) + sum(dp.negative.bucket_counts) == (
        dp.count
    )
    back = sketch_cls.from_data_point(dp)
    assert back._state()._replace(max_buckets=0) == s._state()._replace(max_buckets=0)
