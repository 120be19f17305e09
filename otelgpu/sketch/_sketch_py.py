"""Pure-Python twin of the quantile sketch: the readable specification.

``QuantileSketch`` is a streaming quantile sketch with a relative-error guarantee whose
buckets are OpenTelemetry exponential-histogram buckets (see ``_mapping``): a value
``v > 0`` is counted in bucket ``i`` with ``base**i < v <= base**(i+1)``, ``base =
2 ** (2 ** -scale)``; negative values in a separate negative store by ``|v|`` (as OTLP
does); zeros in ``zero_count``. Exporting to OTLP therefore copies counts, no re-binning.

Guarantee: while no bucket was collapsed, every quantile estimate is within
``relative_accuracy`` (``(base - 1) / (base + 1)``) of the exact lower-rank quantile
``sorted(values)[int(q * (count - 1))]``. ``relative_accuracy=0.01`` picks scale 6
(0.54 %), because scale 5 would be 1.08 %.

Bounded memory -- collapse the lowest buckets: each store (positive, negative) keeps at
most ``max_buckets`` consecutive bucket indices. When a new value would widen a store
beyond that, the buckets of the smallest magnitudes are merged into the lowest kept
bucket. We collapse rather than down-scale because (a) latency/step-time users care
about the upper tail (p95..p99.9), which collapsing never touches, while down-scaling
would double the error of *every* quantile and break the accuracy the caller asked for;
(b) the default cap (32 binades, 2048 buckets at scale 6: 1 us .. 4000 s at 0.54 %) is
wide enough that collapse only happens for pathological ranges; (c) the result of
collapsing depends only on the multiset of values, not on their order, so ``merge`` stays
exact and associative. (Merging sketches of *different* scales down-scales to the
coarser one, which is exact because OTLP buckets nest.) Memory is at most
``2 * max_buckets`` counters (8 bytes each in the native twin: at most 32 KiB by default).

A value at a collapsed (too small) magnitude is still counted, in the lowest kept bucket,
so ``count``/``sum``/``min``/``max`` stay exact. One wild outlier (a timestamp passed as a
duration) can collapse the low end of a sketch; that is the price of a tail that stays
exact, and why the default cap is wide.

Rejected values: NaN, +-inf and anything not convertible to a float are counted in
``rejected``, never stored and never raised -- ``add`` is called on hot paths.
``add_many`` raises ``TypeError`` only when its argument is not iterable at all.
``quantile`` raises ``ValueError`` for ``q`` outside [0, 1]; ``from_bytes`` raises
``otelgpu.errors.CorruptDataError`` (a ``ValueError``) for damaged data.

Empty-sketch policy: ``quantile`` returns ``nan``, ``min``/``max`` are ``nan``, ``sum`` 0.

Thread-safety: every method is safe to call from many threads; mutations of this twin
hold an internal ``threading.Lock`` (``add_many`` holds it once for the whole batch).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from typing import Any, cast

from opentelemetry.sdk.metrics.export import ExponentialHistogramDataPoint
from opentelemetry.util.types import AttributeValue

from otelgpu.sketch import _codec, _config, _mapping, _otlp
from otelgpu.sketch._state import SketchState

_frexp, _floor, _log = math.frexp, math.floor, math.log
#: The values ``add`` maps inline: above the smallest normal float (smaller ones have a
#: bucket of their own) and below 2**1000 (far from the clamp at the largest bucket).
_FAST_MIN, _FAST_MAX = _mapping.MIN_NORMAL_VALUE, 2.0**1000

__all__ = ["QuantileSketch"]

_FLOAT_BUFFER_FORMATS = ("d", "<d", "=d", "@d")


class _Store:
    """Counts per bucket index for one sign; keeps at most ``limit`` consecutive indices."""

    __slots__ = ("counts", "hi", "limit", "lo", "total")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.counts: dict[int, int] = {}
        self.lo = 0
        self.hi = -1
        self.total = 0

    def add(self, index: int, n: int = 1) -> None:
        if self.total == 0:
            self.lo = self.hi = index
        elif index > self.hi:
            self.hi = index
            floor = index - self.limit + 1
            if floor > self.lo:  # too wide: fold the lowest buckets into `floor`
                folded = 0
                for k in [k for k in self.counts if k < floor]:
                    folded += self.counts.pop(k)
                self.counts[floor] = self.counts.get(floor, 0) + folded
                self.lo = floor
        elif index < self.lo:
            index = max(index, self.hi - self.limit + 1)  # collapse into the lowest kept
            self.lo = index
        self.counts[index] = self.counts.get(index, 0) + n
        self.total += n

    def dense(self) -> tuple[int, list[int]]:
        if self.total == 0:
            return 0, []
        return self.lo, [self.counts.get(i, 0) for i in range(self.lo, self.hi + 1)]

    def ascending(self) -> list[tuple[int, int]]:
        return sorted(self.counts.items())


def _validate_q(q: object) -> float:
    if isinstance(q, bool) or not isinstance(q, (int, float)):
        try:
            q = float(q)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(f"quantile q must be a number in [0, 1], got {q!r}") from None
    qf = float(q)
    if not 0.0 <= qf <= 1.0:  # also rejects NaN
        raise ValueError(f"quantile q must be in [0, 1], got {q!r}")
    return qf


def _to_float(value: object) -> float | None:
    """``value`` as a float, or ``None`` when it is not a real number (str is not)."""
    if isinstance(value, float):
        return float(value)
    if isinstance(value, (str, bytes, bytearray)):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - any failing __float__ is a rejected value, never raised
        return None


class QuantileSketch:
    """Streaming quantiles with relative error; buckets are OTLP exponential buckets.

    ``QuantileSketch(relative_accuracy=0.01, *, scale=None, max_buckets=None)``: give
    either the accuracy (the coarsest scale meeting it is chosen) or the ``scale``
    (-10..20) itself. ``max_buckets`` bounds each sign's bucket range (default: 32
    binades, 2048 at scale 6). Invalid arguments raise ``ConfigurationError``.
    """

    def __init__(
        self,
        relative_accuracy: float = 0.01,
        *,
        scale: int | None = None,
        max_buckets: int | None = None,
    ) -> None:
        """See the class docstring; ``ConfigurationError`` names a bad argument."""
        scale, max_buckets = _config.resolve(relative_accuracy, scale, max_buckets)
        self._lock = threading.Lock()
        self._set_scale(scale)
        self._max_buckets: int = max_buckets
        self._clear()

    def _set_scale(self, scale: int) -> None:
        self._scale = scale
        self._factor = _mapping.scale_factor(scale)
        self._offset = _mapping.estimate_offset(scale)

    def _clear(self) -> None:
        self._pos = _Store(self._max_buckets)
        self._neg = _Store(self._max_buckets)
        self._zero = 0
        self._sum = 0.0
        self._min = math.inf
        self._max = -math.inf
        self._rejected = 0

    # -- ingest ---------------------------------------------------------------------

    def _add_locked(self, value: float) -> None:
        if value > 0.0:
            if value == math.inf:
                self._rejected += 1
                return
            self._pos.add(_mapping.map_to_index(value, self._scale, self._factor))
        elif value < 0.0:
            if value == -math.inf:
                self._rejected += 1
                return
            self._neg.add(_mapping.map_to_index(-value, self._scale, self._factor))
        elif value == 0.0:
            self._zero += 1
        else:  # NaN
            self._rejected += 1
            return
        self._sum += value
        if value < self._min:
            self._min = value
        if value > self._max:
            self._max = value

    def add(self, value: float) -> None:
        """Count one value. NaN, +-inf and non-numbers are counted in ``rejected``."""
        # The usual value -- a positive normal float, not a power of two, at a positive
        # scale -- inlined: the bucket of ``_mapping.map_to_index`` and the update of
        # ``_Store.add`` for an index inside the kept range, without their calls (this is
        # the pure twin's per-measurement cost on the host's thread, ~35 % of it).
        if type(value) is float and _FAST_MIN < value < _FAST_MAX and _frexp(value)[0] != 0.5:
            with self._lock:
                if self._scale > 0:
                    index = _floor(_log(value) * self._factor)
                    pos = self._pos
                    if pos.total and pos.lo <= index <= pos.hi:
                        counts = pos.counts
                        counts[index] = counts.get(index, 0) + 1
                        pos.total += 1
                    else:
                        pos.add(index)
                    self._sum += value
                    if value < self._min:
                        self._min = value
                    if value > self._max:
                        self._max = value
                    return
                self._add_locked(value)
            return
        x = _to_float(value)
        with self._lock:
            if x is None:
                self._rejected += 1
            else:
                self._add_locked(x)

    def add_many(self, values: Iterable[float] | Any) -> None:
        """Count every value of a float64 buffer (numpy array, ``array('d')``) or iterable.

        Same result as calling ``add`` for each value in order.
        """
        items: Iterable[Any] = values
        try:
            view = memoryview(cast(Any, values))
        except TypeError:
            pass
        else:
            if view.format in _FLOAT_BUFFER_FORMATS and view.ndim == 1:
                items = view.tolist()
        floats = [_to_float(v) for v in items]
        with self._lock:
            for x in floats:
                if x is None:
                    self._rejected += 1
                else:
                    self._add_locked(x)

    # -- queries --------------------------------------------------------------------

    @property
    def scale(self) -> int:
        """OTLP exponential-histogram scale: base ``2 ** (2 ** -scale)``."""
        return self._scale

    @property
    def relative_accuracy(self) -> float:
        """Guaranteed relative error of quantile estimates at this scale."""
        return _mapping.accuracy_for_scale(self._scale)

    @property
    def max_buckets(self) -> int:
        """Most consecutive buckets kept per sign before the lowest are collapsed."""
        return self._max_buckets

    @property
    def count(self) -> int:
        """Number of stored values (``rejected`` ones excluded)."""
        return self._zero + self._pos.total + self._neg.total

    @property
    def sum(self) -> float:
        """Sum of stored values (0.0 when empty)."""
        return self._sum

    @property
    def min(self) -> float:
        """Smallest stored value, exact (``nan`` when empty)."""
        return self._min if self.count else math.nan

    @property
    def max(self) -> float:
        """Largest stored value, exact (``nan`` when empty)."""
        return self._max if self.count else math.nan

    @property
    def zero_count(self) -> int:
        """Number of stored zeros."""
        return self._zero

    @property
    def rejected(self) -> int:
        """Number of NaN, +-inf or non-numeric values passed to ``add``/``add_many``."""
        return self._rejected

    def _quantiles_locked(self, qs: list[float]) -> list[float]:
        count = self.count
        if count == 0:
            return [math.nan] * len(qs)
        # buckets in ascending value order: negatives by decreasing index, zeros, positives
        ordered = [(-1.0, i, c) for i, c in reversed(self._neg.ascending())]
        ordered.append((0.0, 0, self._zero))
        ordered += [(1.0, i, c) for i, c in self._pos.ascending()]
        return [self._pick(q * (count - 1), count, ordered) for q in qs]

    def _pick(self, rank: float, count: int, ordered: list[tuple[float, int, int]]) -> float:
        """Estimate of sorted element ``int(rank)``: its bucket's value, clamped."""
        if rank < 1.0:  # the smallest value: known exactly
            return self._min
        if rank >= count - 1:  # the largest value: known exactly
            return self._max
        seen = 0
        for sign, index, c in ordered:
            seen += c
            if seen > rank:
                if sign == 0.0:
                    return 0.0
                est = sign * _mapping.bucket_value(index, self._factor, self._offset)
                return min(max(est, self._min), self._max)
        return self._max  # unreachable unless counts are inconsistent

    def quantile(self, q: float) -> float:
        """Estimate of the lower-rank quantile ``sorted(v)[int(q * (count - 1))]``.

        ``nan`` when empty; ``ValueError`` unless ``0 <= q <= 1``. Clamped to
        [``min``, ``max``], so ``quantile(0) == min`` and ``quantile(1) == max``.
        """
        qf = _validate_q(q)
        with self._lock:
            return self._quantiles_locked([qf])[0]

    def quantiles(self, qs: Iterable[float]) -> list[float]:
        """``[quantile(q) for q in qs]``, from one consistent snapshot."""
        checked = [_validate_q(q) for q in qs]
        with self._lock:
            return self._quantiles_locked(checked)

    # -- combination ----------------------------------------------------------------

    def _downscale_locked(self, scale: int) -> None:
        shift = self._scale - scale
        if shift <= 0:
            return
        old_pos, old_neg = self._pos, self._neg
        self._pos = _Store(self._max_buckets)
        self._neg = _Store(self._max_buckets)
        for index, c in old_pos.ascending():
            self._pos.add(index >> shift, c)
        for index, c in old_neg.ascending():
            self._neg.add(index >> shift, c)
        self._set_scale(scale)

    def merge(self, other: QuantileSketch | Any) -> None:
        """Add all of ``other``'s values (either twin) into this sketch.

        If the scales differ, the finer sketch's buckets are down-scaled to the
        coarser scale (exact, OTLP buckets nest). ``other`` is not modified.
        """
        if not callable(getattr(other, "_state", None)):
            raise TypeError(f"can only merge a QuantileSketch, not {type(other).__name__}")
        state: SketchState = other._state()
        with self._lock:
            self._merge_state_locked(state)

    def _merge_state_locked(self, state: SketchState) -> None:
        if state.scale < self._scale:
            self._downscale_locked(state.scale)
        shift = state.scale - self._scale
        for i, c in enumerate(state.positive):
            if c:
                self._pos.add((state.positive_offset + i) >> shift, c)
        for i, c in enumerate(state.negative):
            if c:
                self._neg.add((state.negative_offset + i) >> shift, c)
        self._zero += state.zero_count
        self._rejected += state.rejected
        self._sum += state.sum
        self._min = min(self._min, state.min)
        self._max = max(self._max, state.max)

    def reset(self) -> None:
        """Forget every value (the scale and ``max_buckets`` are kept)."""
        with self._lock:
            self._clear()

    def copy(self) -> QuantileSketch:
        """An independent sketch with the same contents."""
        return type(self)._from_state(self._state())

    # -- snapshots, bytes, OTLP -------------------------------------------------------

    def _state(self) -> SketchState:
        with self._lock:
            # SketchState's fields in their order; dense() is (offset, bucket counts).
            totals = (self._sum, self._min, self._max, self._zero, self._rejected)
            return SketchState(
                self._scale, self._max_buckets, *totals, *self._pos.dense(), *self._neg.dense()
            )

    @classmethod
    def _from_state(cls, state: SketchState) -> QuantileSketch:
        sketch = cls(scale=state.scale, max_buckets=state.max_buckets)
        with sketch._lock:
            sketch._merge_state_locked(state)
        return sketch

    def to_bytes(self) -> bytes:
        """Compact versioned, checksummed encoding (see ``otelgpu.sketch._codec``)."""
        return _codec.encode(self._state())

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> QuantileSketch:
        """Inverse of ``to_bytes``; ``CorruptDataError`` if ``data`` is damaged."""
        return cls._from_state(_codec.decode(data))

    def to_data_point(
        self,
        start_time_unix_nano: int,
        time_unix_nano: int,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> ExponentialHistogramDataPoint:
        """This sketch as an OTel SDK ``ExponentialHistogramDataPoint`` (same buckets)."""
        return _otlp.to_data_point(self._state(), start_time_unix_nano, time_unix_nano, attributes)

    @classmethod
    def from_data_point(cls, dp: ExponentialHistogramDataPoint) -> QuantileSketch:
        """A sketch holding exactly ``dp``'s buckets; ``ValueError`` if inconsistent."""
        return cls._from_state(_otlp.from_data_point(dp))

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return (type(self).from_bytes, (self.to_bytes(),))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(scale={self._scale}, count={self.count}, "
            f"min={self.min!r}, max={self.max!r}, rejected={self._rejected})"
        )
