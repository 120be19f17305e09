"""What a sketch's exponential histogram implies: quantiles and classic ``le`` buckets.

Both work on an OTLP ``ExponentialHistogramDataPoint`` (``QuantileSketch.to_data_point``),
i.e. on exactly what a backend receives, so a gauge, a classic Prometheus histogram and
a backend's own ``histogram_quantile`` agree on the rule:

* **Quantile rule (nearest rank, as histograms imply):** the ``q`` quantile of ``n``
  values is the ``k``-th smallest with ``k = ceil(q * n)`` (at least 1), estimated by the
  representative value of the bucket holding it and clamped to ``[min, max]``; so with
  two values p95 and p99 are the larger one, and with ten values p99 is the maximum.
  ``histogram_quantile`` ranks the same way (``q * count`` into the cumulative buckets).
* **Classic buckets (fixed, log-spaced):** upper bounds ``2 ** (k / 2)`` -- scale
  ``CLASSIC_SCALE`` = 1, a factor of sqrt(2) per bucket -- from ``2 ** -20`` s (about
  1 µs) to ``2 ** 12`` s (68 min) for durations, and from ``2 ** -10`` to ``2 ** 40`` for
  other units. Every process uses the same bounds, so ``sum by (le)`` across ranks and
  replicas is valid. The counts are exact: at the sketch's scale (6 by default) every
  bucket lies inside one classic bucket (exponential buckets nest), so
  ``count(le=b)`` is the sum of the sketch buckets whose upper bound is at most ``b``.
  Values above the last bound are counted only in ``+Inf``.
* **Native buckets (Prometheus native histograms):** the sketch's buckets themselves.
  OTel scale ``s`` is Prometheus schema ``s`` for ``-4 <= s <= 8``; a finer sketch is
  downscaled to schema 8 exactly (buckets nest: index ``i`` becomes ``i >> (s - 8)``);
  a coarser one (below -4, only with a tiny bucket cap) has no native form. The indices
  differ by one: OTel bucket ``i`` covers ``(base**i, base**(i+1)]``, Prometheus bucket
  ``k`` covers ``(base**(k-1), base**k]``, so ``k = i + 1``. The zero bucket is
  ``[-2**-128, 2**-128]`` (the Prometheus Go client's default): the sketch's zeros plus
  any bucket wholly inside it (``2**-128`` is a bucket boundary at every schema, so
  this is exact). A threshold above 0 is also one of the signs by which Prometheus
  tells a native histogram from a classic one (an empty one has no other).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from otelgpu.sketch import _mapping

#: Scale of the classic ``le`` bounds (2 ** (1 / 2 ** CLASSIC_SCALE) per bucket).
CLASSIC_SCALE = 1
#: Bound exponents (base 2) of the classic buckets: durations in seconds, anything else.
CLASSIC_RANGE_SECONDS = (-20, 12)
CLASSIC_RANGE_OTHER = (-10, 40)
#: Schemas Prometheus native histograms support (base ``2 ** (2 ** -schema)``).
NATIVE_MIN_SCHEMA, NATIVE_MAX_SCHEMA = -4, 8
#: Exponent (base 2) of the native zero bucket's half-width.
NATIVE_ZERO_EXPONENT = -128
NATIVE_ZERO_THRESHOLD = 2.0**NATIVE_ZERO_EXPONENT
#: Empty buckets between two populated ones that stay inside one span (cheaper than a
#: new span: a delta per empty bucket against two varints per span).
_SPAN_GAP = 2


class NativeHistogram(NamedTuple):
    """A Prometheus native histogram: spans are ``(offset, length)`` (the first offset is
    the first bucket's index, later ones the gap after the previous span); deltas are
    each bucket's count minus the previous bucket's (across spans), as on the wire."""

    schema: int
    zero_threshold: float
    zero_count: int
    sample_count: int
    sample_sum: float
    positive_spans: tuple[tuple[int, int], ...]
    positive_deltas: tuple[int, ...]
    negative_spans: tuple[tuple[int, int], ...]
    negative_deltas: tuple[int, ...]


def classic_bounds(unit: str) -> tuple[float, ...]:
    """The ``le`` bounds (ascending, without ``+Inf``) for a metric in ``unit``."""
    lo, hi = CLASSIC_RANGE_SECONDS if unit == "s" else CLASSIC_RANGE_OTHER
    per = 1 << CLASSIC_SCALE
    return tuple(2.0 ** (k / per) for k in range(lo * per, hi * per + 1))


def classic_buckets(point: Any, unit: str) -> list[tuple[float, int]]:
    """Cumulative ``(le, count)`` pairs of ``point`` at the classic bounds, ending with
    ``(inf, point.count)``. Exact when the point's scale is at least ``CLASSIC_SCALE``;
    a coarser point's bucket is counted at the first bound at or above its upper edge."""
    lo, hi = CLASSIC_RANGE_SECONDS if unit == "s" else CLASSIC_RANGE_OTHER
    per = 1 << CLASSIC_SCALE
    first_k, last_k = lo * per, hi * per
    n_bounds = last_k - first_k + 1
    per_bound = [0] * n_bounds
    # Zero and negative values are below every (positive) bound.
    below = int(point.zero_count) + sum(int(c) for c in point.negative.bucket_counts)
    scale = int(point.scale)
    offset = int(point.positive.offset)
    above = 0
    for i, c in enumerate(point.positive.bucket_counts):
        if not c:
            continue
        upper_num = offset + i + 1  # bucket upper bound = 2 ** (upper_num / 2 ** scale)
        # Smallest classic k with k / per >= upper_num / 2 ** scale.
        if scale >= CLASSIC_SCALE:
            k = -((-upper_num) >> (scale - CLASSIC_SCALE))  # ceil division by a power of 2
        else:
            k = upper_num << (CLASSIC_SCALE - scale)
        if k < first_k:
            below += int(c)
        elif k > last_k:
            above += int(c)
        else:
            per_bound[k - first_k] += int(c)
    out: list[tuple[float, int]] = []
    running = below
    for j, bound in enumerate(classic_bounds(unit)):
        running += per_bound[j]
        out.append((bound, running))
    out.append((math.inf, int(point.count)))
    return out


def native_histogram(point: Any) -> NativeHistogram | None:
    """``point``'s buckets as a Prometheus native histogram (see the module docstring);
    ``None`` when its scale is below ``NATIVE_MIN_SCHEMA``."""
    scale = int(point.scale)
    if scale < NATIVE_MIN_SCHEMA:
        return None
    shift = max(scale - NATIVE_MAX_SCHEMA, 0)
    schema = scale - shift
    # Prometheus index of the bucket whose upper bound is 2 ** NATIVE_ZERO_EXPONENT.
    # 2 ** -128 is a bucket boundary at every schema >= -4 (128 is a multiple of 16).
    zero_index = (
        NATIVE_ZERO_EXPONENT * 2**schema if schema >= 0 else NATIVE_ZERO_EXPONENT // 2**-schema
    )
    pos_spans, pos_deltas, pos_folded = _native_side(point.positive, shift, zero_index)
    neg_spans, neg_deltas, neg_folded = _native_side(point.negative, shift, zero_index)
    return NativeHistogram(
        schema=schema,
        zero_threshold=NATIVE_ZERO_THRESHOLD,
        zero_count=int(point.zero_count) + pos_folded + neg_folded,
        sample_count=int(point.count),
        sample_sum=float(point.sum),
        positive_spans=pos_spans,
        positive_deltas=pos_deltas,
        negative_spans=neg_spans,
        negative_deltas=neg_deltas,
    )


def _native_side(
    buckets: Any, shift: int, zero_index: int
) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...], int]:
    """Spans, deltas and the count folded into the zero bucket of one side."""
    merged: list[list[int]] = []  # [prometheus index, count], ascending
    folded = 0
    offset = int(buckets.offset)
    for i, c in enumerate(buckets.bucket_counts):
        if not c:
            continue
        k = ((offset + i) >> shift) + 1  # downscale (flooring shift), then OTel -> Prometheus
        if k <= zero_index:
            folded += int(c)
        elif merged and merged[-1][0] == k:
            merged[-1][1] += int(c)
        else:
            merged.append([k, int(c)])
    spans: list[list[int]] = []
    deltas: list[int] = []
    last_k, last_c = 0, 0
    for k, c in merged:
        gap = k - last_k - 1
        if not spans or gap > _SPAN_GAP:
            spans.append([k if not spans else gap, 1])
        else:
            for _ in range(gap):  # empty buckets kept inside the span
                deltas.append(-last_c)
                last_c = 0
            spans[-1][1] += gap + 1
        deltas.append(c - last_c)
        last_k, last_c = k, c
    return tuple((o, n) for o, n in spans), tuple(deltas), folded


def nearest_rank(q: float, count: int) -> int:
    """The 1-based rank of the ``q`` quantile of ``count`` values (``ceil(q * count)``)."""
    k = math.ceil(round(q * count, 9))
    return min(max(k, 1), count)


def quantiles(point: Any, qs: Sequence[float]) -> list[float]:
    """The ``qs`` quantiles of ``point`` by the nearest-rank rule (``nan`` when empty)."""
    count = int(point.count)
    if count <= 0:
        return [math.nan] * len(qs)
    scale = int(point.scale)
    factor = _mapping.scale_factor(scale)
    offset = _mapping.estimate_offset(scale)
    lo, hi = float(point.min), float(point.max)
    # Buckets in ascending value order: negatives (largest index first), zeros, positives.
    neg = point.negative
    ordered: list[tuple[float, int, int]] = [
        (-1.0, neg.offset + i, int(neg.bucket_counts[i]))
        for i in range(len(neg.bucket_counts) - 1, -1, -1)
        if neg.bucket_counts[i]
    ]
    if point.zero_count:
        ordered.append((0.0, 0, int(point.zero_count)))
    pos = point.positive
    for i, c in enumerate(pos.bucket_counts):
        if c:
            ordered.append((1.0, pos.offset + i, int(c)))
    out = []
    for q in qs:
        k = nearest_rank(q, count)
        if k == 1:
            out.append(lo)
            continue
        if k == count:
            out.append(hi)
            continue
        seen = 0
        value = hi
        for sign, index, c in ordered:
            seen += c
            if seen >= k:
                value = 0.0 if sign == 0.0 else sign * _mapping.bucket_value(index, factor, offset)
                break
        out.append(min(max(value, lo), hi))
    return out
