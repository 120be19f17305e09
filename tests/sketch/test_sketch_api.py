"""Behaviour of ``QuantileSketch`` (both twins): construction, ingest, queries, merge,
bounded memory, bytes, and the OTLP exponential-histogram conversion."""

from __future__ import annotations

import array
import math
import pickle
from typing import Any

import numpy as np
import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Buckets,
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
    InMemoryMetricReader,
    Metric,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otelgpu.errors import ConfigurationError, CorruptDataError
from otelgpu.sketch import QuantileSketch, _codec, _mapping, _sketch_py

Sketch = Any  # either twin's class


# -- construction -----------------------------------------------------------------------


def test_default_accuracy_picks_scale_6(sketch_cls: Sketch) -> None:
    s = sketch_cls()
    assert s.scale == 6  # scale 5 would be 1.08 % > 1 %
    assert s.relative_accuracy == pytest.approx(0.005415, rel=1e-3)
    assert s.max_buckets == 2048  # 32 binades: 1 us .. 4295 s
    assert _mapping.accuracy_for_scale(5) > 0.01


@pytest.mark.parametrize(
    ("accuracy", "scale"), [(0.34, 0), (0.05, 3), (0.0217, 4), (0.011, 5), (0.001, 9)]
)
def test_accuracy_to_scale(sketch_cls: Sketch, accuracy: float, scale: int) -> None:
    s = sketch_cls(accuracy)
    assert s.scale == scale
    assert s.relative_accuracy <= accuracy < _mapping.accuracy_for_scale(scale - 1)


def test_explicit_scale_wins(sketch_cls: Sketch) -> None:
    s = sketch_cls(0.5, scale=8, max_buckets=100)
    assert (s.scale, s.max_buckets) == (8, 100)


@pytest.mark.parametrize(
    ("kwargs", "setting"),
    [
        ({"relative_accuracy": 0.0}, "relative_accuracy"),
        ({"relative_accuracy": 1.0}, "relative_accuracy"),
        ({"relative_accuracy": "0.01"}, "relative_accuracy"),
        ({"relative_accuracy": math.nan}, "relative_accuracy"),
        ({"scale": 21}, "scale"),
        ({"scale": -11}, "scale"),
        ({"scale": 2.0}, "scale"),
        ({"max_buckets": 1}, "max_buckets"),
        ({"max_buckets": 1 << 30}, "max_buckets"),
        ({"max_buckets": True}, "max_buckets"),
    ],
)
def test_bad_configuration_names_the_setting(
    sketch_cls: Sketch, kwargs: dict[str, object], setting: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        sketch_cls(**kwargs)
    assert info.value.setting == setting
    assert setting in str(info.value)


# -- ingest -------------------------------------------------------------------------------


def test_empty_sketch_policy(sketch_cls: Sketch) -> None:
    s = sketch_cls()
    assert s.count == 0 and s.sum == 0.0 and s.zero_count == 0 and s.rejected == 0
    assert math.isnan(s.min) and math.isnan(s.max)
    assert math.isnan(s.quantile(0.5))
    assert all(math.isnan(v) for v in s.quantiles([0.0, 1.0]))


def test_exact_summary_statistics(sketch_cls: Sketch) -> None:
    values = [0.25, 3.0, 1e-6, 42.0, 0.0, -2.0, -1e-3, 0.0]
    s = sketch_cls()
    for v in values:
        s.add(v)
    assert s.count == len(values)
    assert s.sum == pytest.approx(sum(values))
    assert (s.min, s.max) == (-2.0, 42.0)
    assert s.zero_count == 2
    assert s.quantile(0.0) == -2.0 and s.quantile(1.0) == 42.0


def test_nan_inf_and_non_numbers_are_rejected_never_raised(sketch_cls: Sketch) -> None:
    s = sketch_cls()
    for bad in (math.nan, math.inf, -math.inf, "1.5", b"2", None, object(), 10**400, [1.0]):
        s.add(bad)
    s.add_many([1.0, math.nan, "x", 2.0])
    s.add_many(np.array([math.inf, 3.0, -math.inf]))
    assert s.rejected == 9 + 2 + 2
    assert s.count == 3 and s.sum == 6.0 and (s.min, s.max) == (1.0, 3.0)


def test_numeric_argument_types(sketch_cls: Sketch) -> None:
    s = sketch_cls()
    for v in (1.5, 2, True, np.float64(3.5), np.int64(4), np.float32(0.5)):
        s.add(v)
    assert s.count == 6 and s.rejected == 0
    assert s.sum == 1.5 + 2 + 1 + 3.5 + 4 + 0.5


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda xs: np.asarray(xs, dtype=np.float64), id="numpy"),
        pytest.param(lambda xs: np.asarray(xs, dtype=np.float64)[::-1][::-1], id="numpy-view"),
        pytest.param(lambda xs: np.repeat(np.asarray(xs), 2)[::2], id="numpy-strided"),
        pytest.param(lambda xs: array.array("d", xs), id="array-d"),
        pytest.param(lambda xs: list(xs), id="list"),
        pytest.param(lambda xs: tuple(xs), id="tuple"),
        pytest.param(lambda xs: iter(xs), id="iterator"),
        pytest.param(lambda xs: np.asarray(xs, dtype=np.float32), id="numpy-float32"),
        pytest.param(lambda xs: memoryview(array.array("d", xs)), id="memoryview"),
    ],
)
def test_add_many_equals_add_in_order(sketch_cls: Sketch, make: Any) -> None:
    values = [float(v) for v in np.random.default_rng(7).lognormal(0, 2, 500)]
    values += [0.0, -3.0, 2.0**-1074]
    if make(values).__class__.__name__ == "ndarray" and make(values).dtype == np.float32:
        values = [float(np.float32(v)) for v in values]
    one, many = sketch_cls(), sketch_cls()
    for v in values:
        one.add(v)
    many.add_many(make(values))
    assert many._state() == one._state()


def test_zero_and_negative_buckets(sketch_cls: Sketch) -> None:
    s = sketch_cls()
    s.add_many([-1.0, -1.0, -10.0, 0.0, -0.0, 5.0])
    assert s.zero_count == 2
    st = s._state()
    assert sum(st.negative) == 3 and sum(st.positive) == 1
    # ascending order across signs: -10, -1, -1, 0, 0, 5
    est = s.quantiles([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert est[0] == -10.0 and est[-1] == 5.0
    assert est[1] == pytest.approx(-1.0, rel=s.relative_accuracy)
    assert est[2] == pytest.approx(-1.0, rel=s.relative_accuracy)
    assert est[3] == 0.0 and est[4] == 0.0


@pytest.mark.parametrize("q", [-0.1, 1.01, math.nan, "high", None])
def test_bad_q_raises_value_error(sketch_cls: Sketch, q: object) -> None:
    s = sketch_cls()
    s.add(1.0)
    with pytest.raises(ValueError, match="quantile q"):
        s.quantile(q)
    with pytest.raises(ValueError, match="quantile q"):
        s.quantiles([0.5, q])


def test_powers_of_two_use_upper_inclusive_buckets(sketch_cls: Sketch) -> None:
    # bucket i covers (base**i, base**(i+1)]: 1.0 == base**0 is the top of bucket -1
    for scale, value, index in [(6, 1.0, -1), (6, 2.0, 63), (0, 4.0, 1), (-2, 16.0, 0)]:
        s = sketch_cls(scale=scale)
        s.add(value)
        assert s._state().positive_offset == index


def test_reset_and_copy(sketch_cls: Sketch) -> None:
    s = sketch_cls()
    s.add_many([1.0, 2.0, -3.0, 0.0, math.nan])
    c = s.copy()
    assert c._state() == s._state() and type(c) is type(s)
    s.reset()
    assert s.count == 0 and s.rejected == 0 and math.isnan(s.quantile(0.5))
    assert c.count == 4 and c.rejected == 1  # the copy is independent
    c.add(7.0)
    assert s.count == 0
    s.add(1.0)
    assert s.count == 1 and s.scale == 6


# -- merge ----------------------------------------------------------------------------------


def test_merge_equals_adding_everything(sketch_cls: Sketch) -> None:
    a_vals = np.random.default_rng(1).lognormal(0, 1, 1000)
    b_vals = -np.random.default_rng(2).lognormal(3, 1, 1000)
    a, b, both = sketch_cls(), sketch_cls(), sketch_cls()
    a.add_many(a_vals)
    b.add_many(b_vals)
    b.add(math.nan)
    both.add_many(a_vals)
    both.add_many(b_vals)
    both.add(math.nan)
    before = b._state()
    a.merge(b)
    assert b._state() == before  # the source is untouched
    st, ref = a._state(), both._state()
    assert st._replace(sum=0.0) == ref._replace(sum=0.0)
    assert st.sum == pytest.approx(ref.sum)


def test_merge_into_itself_doubles(sketch_cls: Sketch) -> None:
    s = sketch_cls()
    s.add_many([1.0, 2.0, 3.0])
    s.merge(s)
    assert s.count == 6 and s.sum == 12.0
    ref = sketch_cls()
    ref.add_many([1.0, 1.0, 2.0, 2.0, 3.0, 3.0])
    assert s._state() == ref._state()


def test_merge_different_scales_downscales_exactly(sketch_cls: Sketch) -> None:
    values = np.random.default_rng(3).lognormal(0, 2, 2000)
    fine, coarse, ref = sketch_cls(scale=8), sketch_cls(scale=3), sketch_cls(scale=3)
    fine.add_many(values[:1000])
    coarse.add_many(values[1000:])
    ref.add_many(values)
    fine.merge(coarse)  # the finer one is down-scaled to scale 3
    assert fine.scale == 3
    assert fine._state()._replace(sum=0.0, max_buckets=0) == ref._state()._replace(
        sum=0.0, max_buckets=0
    )
    coarse2 = sketch_cls(scale=3)
    coarse2.add_many(values[1000:])
    fine2 = sketch_cls(scale=8)
    fine2.add_many(values[:1000])
    coarse2.merge(fine2)  # the finer one's buckets are shifted into scale 3
    assert coarse2.scale == 3
    assert coarse2._state().positive == ref._state().positive


def test_merge_rejects_other_types(sketch_cls: Sketch) -> None:
    with pytest.raises(TypeError, match="QuantileSketch"):
        sketch_cls().merge([1.0, 2.0])


def test_merge_across_twins() -> None:
    values = np.random.default_rng(5).lognormal(0, 1, 300)
    native, pure = QuantileSketch(), _sketch_py.QuantileSketch()
    native.add_many(values)
    pure.add_many(values)
    native.merge(pure)
    pure.merge(pure.copy())
    assert native._state() == pure._state()


# -- bounded memory -------------------------------------------------------------------------


def test_bucket_cap_collapses_lowest_and_keeps_the_tail(sketch_cls: Sketch) -> None:
    s = sketch_cls(max_buckets=5 * 64)  # five binades at scale 6
    values = np.random.default_rng(11).lognormal(0, 2, 5000)
    s.add_many(values)
    st = s._state()
    assert len(st.positive) == 5 * 64  # 20 binades of data, 5 kept
    assert s.count == 5000 and s.min == values.min() and s.max == values.max()
    ordered = np.sort(values)
    for q in (0.99, 0.999, 1.0):  # the top five binades hold these: still within 0.54 %
        exact = ordered[int(q * (len(ordered) - 1))]
        assert abs(s.quantile(q) - exact) <= s.relative_accuracy * exact * (1 + 1e-9)
    # everything up to the lowest kept bucket's upper bound is counted in that bucket
    upper = _mapping.bucket_value(st.positive_offset, _mapping.scale_factor(6), 0.0)
    assert st.positive[0] == int(np.sum(values <= upper))


def test_default_cap_covers_nine_decades_without_collapse(sketch_cls: Sketch) -> None:
    s = sketch_cls()
    values = np.geomspace(1e-6, 1e3, 20000)
    s.add_many(values)
    assert len(s._state().positive) <= s.max_buckets
    for q in (0.0, 0.001, 0.5, 0.999, 1.0):
        exact = values[int(q * (len(values) - 1))]
        assert abs(s.quantile(q) - exact) <= s.relative_accuracy * exact * (1 + 1e-9)


def test_extreme_values_stay_bounded(sketch_cls: Sketch) -> None:
    s = sketch_cls(scale=20, max_buckets=1000)
    s.add_many([5e-324, 1e-300, 1.0, 1e300, 1.7976931348623157e308, -5e-324, -1e308])
    st = s._state()
    assert len(st.positive) <= 1000 and len(st.negative) <= 1000
    assert s.count == 7 and s.quantile(1.0) == 1.7976931348623157e308


# -- bytes ------------------------------------------------------------------------------------


def test_bytes_round_trip(sketch_cls: Sketch) -> None:
    s = sketch_cls(scale=4, max_buckets=300)
    s.add_many(np.random.default_rng(9).lognormal(0, 1, 1000))
    s.add_many([0.0, -5.0, math.nan])
    data = s.to_bytes()
    back = sketch_cls.from_bytes(data)
    assert type(back) is type(s) and back._state() == s._state()
    assert back.to_bytes() == data
    assert sketch_cls.from_bytes(bytearray(data))._state() == s._state()
    assert sketch_cls.from_bytes(memoryview(data))._state() == s._state()
    assert pickle.loads(pickle.dumps(s))._state() == s._state()
    empty = sketch_cls()
    assert sketch_cls.from_bytes(empty.to_bytes())._state() == empty._state()


def test_one_million_lognormal_values_fit_in_4_kib(sketch_cls: Sketch) -> None:
    s = sketch_cls()
    s.add_many(np.random.default_rng(1).lognormal(np.log(0.05), 1.0, 1_000_000))
    assert len(s.to_bytes()) <= 4096


def test_every_corruption_is_detected(sketch_cls: Sketch) -> None:
    s = sketch_cls()
    s.add_many([0.001, 0.5, 2.0, -1.0, 0.0])
    data = s.to_bytes()
    for i in range(len(data)):
        for bit in (0x01, 0x80):
            damaged = bytearray(data)
            damaged[i] ^= bit
            with pytest.raises(CorruptDataError):
                sketch_cls.from_bytes(bytes(damaged))
    for n in range(len(data)):
        with pytest.raises(CorruptDataError):
            sketch_cls.from_bytes(data[:n])
    with pytest.raises(CorruptDataError, match=r"trailing|CRC"):
        sketch_cls.from_bytes(data + b"\x00")
    with pytest.raises(CorruptDataError, match="bytes-like"):
        sketch_cls.from_bytes(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # CorruptDataError is a ValueError
        sketch_cls.from_bytes(b"OGQS\x02" + bytes(20))


# -- OTLP ---------------------------------------------------------------------------------------


def _trim(counts: Any) -> list[int]:
    out = list(counts)
    while out and out[-1] == 0:
        out.pop()
    return out


def _sdk_point(values: np.ndarray, max_scale: int) -> ExponentialHistogramDataPoint:
    reader = InMemoryMetricReader()
    provider = MeterProvider(
        metric_readers=[reader],
        views=[
            View(
                instrument_name="latency",
                aggregation=ExponentialBucketHistogramAggregation(
                    max_size=4096, max_scale=max_scale
                ),
            )
        ],
    )
    hist = provider.get_meter("test").create_histogram("latency", unit="s")
    for v in values:
        hist.record(float(v), {"route": "/x"})
    data = reader.get_metrics_data()
    provider.shutdown()
    assert data is not None
    point = data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points[0]
    assert isinstance(point, ExponentialHistogramDataPoint)
    return point


@pytest.mark.parametrize("scale", [6, 3, 0, -2])
def test_buckets_are_the_sdk_exponential_histogram_buckets(sketch_cls: Sketch, scale: int) -> None:
    values = np.random.default_rng(scale + 20).lognormal(np.log(0.05), 1.0, 3000)
    values = np.concatenate([values, [0.0, 0.0, 1.0, 2.0, 0.25, 2.0**-20]])
    sdk = _sdk_point(values, max_scale=scale)
    s = sketch_cls(scale=scale)
    s.add_many(values)
    ours = s.to_data_point(sdk.start_time_unix_nano, sdk.time_unix_nano, {"route": "/x"})
    assert ours.scale == sdk.scale == scale
    # same offset, same counts: no re-binning (the SDK may pad trailing zero buckets)
    assert ours.positive.offset == sdk.positive.offset
    assert list(ours.positive.bucket_counts) == _trim(sdk.positive.bucket_counts)
    assert ours.zero_count == sdk.zero_count == 2
    assert (ours.count, ours.min, ours.max) == (sdk.count, sdk.min, sdk.max)
    assert ours.sum == pytest.approx(sdk.sum)
    assert dict(ours.attributes) == {"route": "/x"}
    # and the SDK's point converts back into the same sketch
    assert sketch_cls.from_data_point(sdk)._state().positive == s._state().positive


def test_data_point_round_trip(sketch_cls: Sketch) -> None:
    s = sketch_cls()
    s.add_many(np.random.default_rng(4).lognormal(0, 1, 500))
    s.add_many([-2.0, -3.0, 0.0])
    dp = s.to_data_point(10, 20, {"a": "b"})
    assert (dp.start_time_unix_nano, dp.time_unix_nano, dp.flags) == (10, 20, 0)
    assert dp.count == 503 and dp.zero_count == 1 and sum(dp.negative.bucket_counts) == 2
    back = sketch_cls.from_data_point(dp)
    assert back._state()._replace(max_buckets=0) == s._state()._replace(max_buckets=0)
    assert back.to_data_point(10, 20, {"a": "b"}) == dp


def test_data_point_encodes_as_otlp(sketch_cls: Sketch) -> None:
    s = sketch_cls()
    s.add_many([0.01, 0.02, 0.02, 1.5, 0.0])
    dp = s.to_data_point(1, 2, {"k": "v"})
    metric = Metric(
        name="x",
        description="",
        unit="s",
        data=ExponentialHistogram([dp], AggregationTemporality.CUMULATIVE),
    )
    md = MetricsData(
        [
            ResourceMetrics(
                Resource.create({}),
                [ScopeMetrics(InstrumentationScope("t"), [metric], "")],
                "",
            )
        ]
    )
    proto = encode_metrics(md)
    wire = proto.resource_metrics[0].scope_metrics[0].metrics[0].exponential_histogram
    point = wire.data_points[0]
    assert point.scale == 6 and point.count == 5 and point.zero_count == 1
    assert point.positive.offset == dp.positive.offset
    assert list(point.positive.bucket_counts) == list(dp.positive.bucket_counts)


def test_empty_sketch_data_point(sketch_cls: Sketch) -> None:
    dp = sketch_cls().to_data_point(0, 1)
    assert dp.count == 0 and dp.min == 0.0 and dp.max == 0.0 and dp.positive.bucket_counts == []
    assert sketch_cls.from_data_point(dp).count == 0


@pytest.mark.parametrize(
    ("values", "low", "high"),
    [([0.5, 3.0], 0.49, 3.1), ([-2.0, 0.0, 1.0], -2.1, 1.1), ([-4.0, -0.25], -4.1, -0.24)],
)
def test_data_point_without_min_max_gets_bucket_bounds(
    sketch_cls: Sketch, values: list[float], low: float, high: float
) -> None:
    s = sketch_cls()
    s.add_many(values)
    fields = {**s.to_data_point(0, 1).__dict__, "min": math.inf, "max": -math.inf}
    back = sketch_cls.from_data_point(ExponentialHistogramDataPoint(**fields))
    assert low <= back.min <= min(values) and max(values) <= back.max <= high
    assert back.count == len(values)


@pytest.mark.parametrize(
    "change",
    [
        {"scale": 21},
        {"count": 99},
        {"positive": Buckets(0, [1, -1])},
        {"min": 5.0, "max": 1.0},
    ],
)
def test_inconsistent_data_point_is_rejected(sketch_cls: Sketch, change: dict[str, Any]) -> None:
    s = sketch_cls()
    s.add_many([1.0, 2.0])
    fields = {**s.to_data_point(0, 1).__dict__, **change}
    with pytest.raises(ValueError):
        sketch_cls.from_data_point(ExponentialHistogramDataPoint(**fields))


def test_repr(sketch_cls: Sketch) -> None:
    s = sketch_cls()
    s.add(1.0)
    assert "scale=6" in repr(s) and "count=1" in repr(s)


def _forge(state_changes: dict[str, Any], **sketch_kwargs: Any) -> bytes:
    """Bytes with a valid CRC but impossible content (what a buggy writer could make)."""
    s = _sketch_py.QuantileSketch(**sketch_kwargs)
    s.add_many([1.0, 2.0, 3.0])
    return _codec.encode(s._state()._replace(**state_changes))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"scale": 21}, "scale"),
        ({"max_buckets": 1}, "max_buckets"),
        ({"max_buckets": 1 << 25}, "max_buckets"),
        ({"max_buckets": 2}, "over max_buckets"),
        ({"positive": [0, 1, 2]}, "empty ends"),
        ({"min": 5.0, "max": 1.0}, "min/max"),
        ({"min": math.nan}, "min/max"),
        ({"max": -1.0, "min": -2.0}, "positive buckets"),
        ({"positive": [], "positive_offset": 0, "zero_count": 0}, "empty sketch"),
    ],
)
def test_impossible_content_with_a_valid_crc_is_rejected(
    sketch_cls: Sketch, changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(CorruptDataError, match=message):
        sketch_cls.from_bytes(_forge(changes))
