"""Value -> bucket-index mapping shared (as a specification) by both sketch twins.

The buckets are OpenTelemetry exponential-histogram buckets: at scale ``s`` the base
is ``2 ** (2 ** -s)`` and bucket ``i`` covers ``(base**i, base**(i+1)]`` (upper bound
inclusive). The index is computed exactly as the OpenTelemetry Python SDK's
``LogarithmMapping`` (scales 1..20) and ``ExponentMapping`` (scales -10..0) do:

* ``s > 0``: ``floor(log(v) * scale_factor)`` with ``scale_factor = ldexp(1/log(2), s)``;
  an exact power of two ``2**e`` gets its own branch, ``(e << s) - 1``, so boundaries
  that are powers of two are exact; values ``<= 2**-1022`` (subnormals) map to
  ``(-1022 << s) - 1``; the result is capped at ``((1023 + 1) << s) - 1``.
* ``s <= 0``: the IEEE-754 exponent, minus one for exact powers of two, shifted right
  by ``-s`` (an arithmetic, i.e. flooring, shift).

The native twin (``src_ext/sketch/_sketch_c.pyx``) uses the very same formulas, with
``scale_factor`` computed here, in Python, and handed to C, so both twins (and the SDK)
agree bucket for bucket. Because ``scale_factor(s) == 2 * scale_factor(s - 1)``
exactly, an index at scale ``s`` shifted right by one is the index at scale ``s - 1``
of the same value: buckets nest, and down-scaling is an exact shift.

Relative accuracy: a value in bucket ``i`` is estimated as ``2 * base**(i+1) /
(base + 1)``, whose relative error is at most ``(base - 1) / (base + 1)``.
"""

from __future__ import annotations

import math
import sys

MIN_SCALE = -10
MAX_SCALE = 20
MIN_NORMAL_VALUE = sys.float_info.min  # 2**-1022
MIN_NORMAL_EXPONENT = -1022
MAX_NORMAL_EXPONENT = 1023


def log_base(scale: int) -> float:
    """``log(base)`` with ``base = 2 ** (2 ** -scale)`` (finite even where base is not)."""
    return math.ldexp(math.log(2.0), -scale)


def estimate_offset(scale: int) -> float:
    """``log(2 / (base + 1))``: the log-space shift from a bucket's upper bound to its estimate."""
    lb = log_base(scale)
    return math.log(2.0) - (lb + math.log1p(math.exp(-lb)))


def scale_factor(scale: int) -> float:
    """``2**scale / log(2)``: multiplies ``log(v)`` into a (fractional) bucket index."""
    return math.ldexp(1.0 / math.log(2.0), scale)


def accuracy_for_scale(scale: int) -> float:
    """Largest relative error of a quantile estimate at ``scale``: ``(b - 1) / (b + 1)``."""
    return math.tanh(log_base(scale) / 2.0)  # == (base - 1) / (base + 1)


def scale_for_accuracy(relative_accuracy: float) -> int:
    """The coarsest scale whose relative error is at most ``relative_accuracy``.

    ``0.01 -> 6`` (scale 5 would be 1.08 %). Accuracies tighter than scale 20's
    (about 3.3e-7) are clamped to scale 20, looser than scale -10's to -10.
    """
    for scale in range(MIN_SCALE, MAX_SCALE + 1):
        if accuracy_for_scale(scale) <= relative_accuracy:
            return scale
    return MAX_SCALE


DEFAULT_MAX_BUCKETS_CAP = 16384


def default_max_buckets(scale: int) -> int:
    """Buckets per sign spanning 32 binades (9.6 decades): 2048 at scale 6.

    At least 16, at most 16384 (128 KiB of counters per sign in the native twin), so
    scales above 9 cover fewer binades by default.
    """
    binades32 = 32 << scale if scale >= 0 else 32 >> -scale
    return min(max(binades32, 16), DEFAULT_MAX_BUCKETS_CAP)


def map_to_index(value: float, scale: int, factor: float) -> int:
    """Bucket index of a finite ``value > 0`` at ``scale`` (``factor = scale_factor(scale)``)."""
    mantissa, exponent = math.frexp(value)  # value = mantissa * 2**exponent, 0.5 <= m < 1
    if scale > 0:
        if value <= MIN_NORMAL_VALUE:
            return (MIN_NORMAL_EXPONENT << scale) - 1
        if mantissa == 0.5:  # exact power of two, 2**(exponent - 1)
            return ((exponent - 1) << scale) - 1
        return min(math.floor(math.log(value) * factor), ((MAX_NORMAL_EXPONENT + 1) << scale) - 1)
    if value < MIN_NORMAL_VALUE:
        return (MIN_NORMAL_EXPONENT >> -scale) - (1 if -scale < 2 else 0)
    # IEEE exponent is exponent - 1; exact powers of two belong to the bucket below.
    return (exponent - 1 - (1 if mantissa == 0.5 else 0)) >> -scale


def bucket_value(index: int, factor: float, offset: float) -> float:
    """Estimate for values in bucket ``index``: ``2 * base**(index+1) / (base + 1)``.

    Computed as ``exp((index + 1) / factor + offset)`` with ``factor =
    scale_factor(scale)`` and ``offset = estimate_offset(scale)``; may overflow to
    ``inf`` (or underflow to 0) at the extremes -- callers clamp to the observed min/max.
    """
    try:
        return math.exp((index + 1) / factor + offset)
    except OverflowError:
        return math.inf
