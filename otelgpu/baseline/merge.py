"""Exact merge of histogram buckets read from a store, and quantiles of the merged buckets.

A sketch metric reaches a Prometheus-compatible store as histogram buckets whose bounds
are the same in every process: on the pull path the classic ``<name>_bucket{le}`` series
at the fixed ``2 ** (k / 2)`` bounds (``otelgpu.otel.histogram_rule``), on the OTLP path
VictoriaMetrics' ``vmrange`` buckets of the exponential histogram (the sketch's own
buckets, at the sketch's scale in every process). Counts of equal buckets therefore add
up exactly across ranks, replicas, runs and time chunks -- no re-bucketing, no sketch of
sketches. What is approximate is only where inside its bucket a quantile lies: the
quantile is reported as the bucket edge on the alerting side (the upper edge for
``upper`` figures), with the bucket's relative width as the error bound.

Pure functions on plain data; thread-safe.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["Bucket", "BucketQuantile", "buckets_from_labels", "merged_quantile"]


@dataclass(frozen=True)
class Bucket:
    """Values in ``(lo, hi]`` (``hi`` may be ``inf``) and how many there were."""

    lo: float
    hi: float
    count: float


@dataclass(frozen=True)
class BucketQuantile:
    """A quantile located in its bucket.

    ``value``: the bucket edge on the alerting side (upper edge for ``upper``, lower edge
    for ``lower``; the other edge when that one is infinite). ``resolution``: the relative
    error bound -- the true quantile lies between ``value`` and ``value x (1 -
    resolution)`` (upper) or ``value / (1 - resolution)`` (lower); ``None`` for an
    unbounded bucket.
    """

    value: float
    lo: float
    hi: float
    resolution: float | None


def _vmrange(text: str) -> tuple[float, float]:
    lo, sep, hi = text.partition("...")
    if not sep:
        raise ValueError(f"not a vmrange: {text!r}")
    return float(lo), float(hi)


def buckets_from_labels(counts: Mapping[tuple[str, str], float]) -> list[Bucket]:
    """Non-cumulative buckets, ascending, from ``{(le, vmrange): count}``.

    Classic buckets (``le`` set) are cumulative counts at upper bounds; VictoriaMetrics
    buckets (``vmrange`` = ``"lo...hi"``) are per-range counts. A store's ``increase()``
    may break the cumulative counts' monotony by a rounding hair; a negative difference
    counts as 0.
    """
    classic = sorted((float(le), c) for (le, vr), c in counts.items() if le and not vr)
    out: list[Bucket] = []
    previous_bound, previous_count = 0.0, 0.0
    for bound, cumulative in classic:
        out.append(Bucket(previous_bound, bound, max(0.0, cumulative - previous_count)))
        previous_bound, previous_count = bound, max(previous_count, cumulative)
    ranges: dict[tuple[float, float], float] = {}
    for (_le, vr), c in counts.items():
        if vr:
            key = _vmrange(vr)
            ranges[key] = ranges.get(key, 0.0) + c
    out.extend(Bucket(lo, hi, c) for (lo, hi), c in sorted(ranges.items()))
    return sorted(out, key=lambda b: (b.lo, b.hi))


def merged_quantile(buckets: Iterable[Bucket], q: float, direction: str) -> BucketQuantile | None:
    """The ``q`` quantile (nearest rank, ``ceil(q x count)``) of the merged ``buckets``;
    ``None`` when they count nothing."""
    ordered = [b for b in buckets if b.count > 0]
    total = sum(b.count for b in ordered)
    if total <= 0:
        return None
    # Counts from increase() may be fractional: rank on the real line, a hair of slack.
    rank = max(q * total, min(1.0, total)) - 1e-9 * total
    running = 0.0
    chosen = ordered[-1]
    for b in ordered:
        running += b.count
        if running >= rank:
            chosen = b
            break
    lo, hi = chosen.lo, chosen.hi
    if math.isinf(hi):
        return BucketQuantile(lo, lo, hi, None)
    value = hi if direction == "upper" or lo <= 0 else lo
    resolution = (hi - lo) / hi if hi > 0 else None
    return BucketQuantile(value, lo, hi, resolution)
