"""Conversion between a ``SketchState`` and the OTel SDK's ``ExponentialHistogramDataPoint``.

No re-binning happens: sketch bucket ``i`` at scale ``s`` *is* OTLP bucket ``i`` at
scale ``s`` (both cover ``(base**i, base**(i+1)]``), so the conversion copies counts.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.metrics.export import Buckets, ExponentialHistogramDataPoint
from opentelemetry.util.types import AttributeValue

from otelgpu.errors import CorruptDataError
from otelgpu.sketch import _codec, _mapping
from otelgpu.sketch._state import SketchState


def to_data_point(
    state: SketchState,
    start_time_unix_nano: int,
    time_unix_nano: int,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> ExponentialHistogramDataPoint:
    """An OTLP exponential-histogram point holding exactly the sketch's buckets.

    An empty sketch reports ``min = max = 0.0`` (the SDK data model has no "absent").
    ``rejected`` values are not part of the point (they were never measurements).
    """
    empty = state.value_count == 0
    return ExponentialHistogramDataPoint(
        attributes=dict(attributes) if attributes else {},
        start_time_unix_nano=int(start_time_unix_nano),
        time_unix_nano=int(time_unix_nano),
        count=state.value_count,
        sum=state.sum,
        scale=state.scale,
        zero_count=state.zero_count,
        positive=Buckets(offset=state.positive_offset, bucket_counts=list(state.positive)),
        negative=Buckets(offset=state.negative_offset, bucket_counts=list(state.negative)),
        flags=0,
        min=0.0 if empty else state.min,
        max=0.0 if empty else state.max,
        exemplars=[],
    )


def _trim(offset: int, counts: list[int]) -> tuple[int, list[int]]:
    lo, hi = 0, len(counts)
    while lo < hi and counts[lo] == 0:
        lo += 1
    while hi > lo and counts[hi - 1] == 0:
        hi -= 1
    return (offset + lo, counts[lo:hi]) if lo < hi else (0, [])


def _boundary(index: int, scale: int) -> float:
    """``base ** index``, saturating instead of overflowing."""
    try:
        return math.exp(index / _mapping.scale_factor(scale))
    except OverflowError:
        return sys.float_info.max


def _bounds_from_buckets(
    scale: int, pos_offset: int, pos: list[int], neg_offset: int, neg: list[int], zeros: int
) -> tuple[float, float]:
    """Widest (min, max) the buckets allow: the outer bounds of the outermost buckets."""
    if neg:
        vmin = -_boundary(neg_offset + len(neg), scale)
    elif zeros:
        vmin = 0.0
    else:
        vmin = _boundary(pos_offset, scale)
    if pos:
        vmax = _boundary(pos_offset + len(pos), scale)
    elif zeros:
        vmax = 0.0
    else:
        vmax = -_boundary(neg_offset, scale)
    return vmin, vmax


def from_data_point(dp: Any) -> SketchState:
    """The sketch state of an ``ExponentialHistogramDataPoint`` (or one shaped like it).

    Raises ``ValueError`` for a scale outside -10..20, negative counts or a ``count``
    that disagrees with the buckets. A point without min/max (``+inf``/``-inf``, as the
    SDK writes with ``record_min_max=False``) gets the outer bounds of its buckets.
    ``max_buckets`` becomes the scale's default or the point's widest bucket range,
    whichever is larger, so no count moves.
    """
    scale = int(dp.scale)
    if not _mapping.MIN_SCALE <= scale <= _mapping.MAX_SCALE:
        raise ValueError(
            f"exponential histogram scale {scale} is outside "
            f"{_mapping.MIN_SCALE}..{_mapping.MAX_SCALE}"
        )
    pos_offset, pos = _trim(int(dp.positive.offset), [int(c) for c in dp.positive.bucket_counts])
    neg_offset, neg = _trim(int(dp.negative.offset), [int(c) for c in dp.negative.bucket_counts])
    zero_count = int(dp.zero_count)
    if zero_count < 0 or any(c < 0 for c in pos) or any(c < 0 for c in neg):
        raise ValueError("exponential histogram point has negative bucket counts")
    count = zero_count + sum(pos) + sum(neg)
    if int(dp.count) != count:
        raise ValueError(f"exponential histogram point count {dp.count} != bucket total {count}")
    vmin, vmax = (float(dp.min), float(dp.max)) if count else (math.inf, -math.inf)
    if count and not (math.isfinite(vmin) and math.isfinite(vmax)):
        # a point recorded without min/max (record_min_max=False): use bucket bounds
        vmin, vmax = _bounds_from_buckets(scale, pos_offset, pos, neg_offset, neg, zero_count)
    state = SketchState(
        scale=scale,
        max_buckets=max(_mapping.default_max_buckets(scale), len(pos), len(neg)),
        sum=float(dp.sum) if count else 0.0,
        min=vmin,
        max=vmax,
        zero_count=zero_count,
        rejected=0,
        positive_offset=pos_offset,
        positive=pos,
        negative_offset=neg_offset,
        negative=neg,
    )
    try:
        _codec.check(state)
    except CorruptDataError as exc:
        raise ValueError(f"exponential histogram point is inconsistent: {exc}") from None
    return state
