"""The pure twin's ``add`` maps the usual value inline; it must count exactly as the
general path (``add_many``: ``_mapping.map_to_index`` and ``_Store.add`` per value) does,
at every scale, with and without folding, next to bucket boundaries and at the edges of
the inline range."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from otelgpu.sketch import _mapping, _sketch_py


def _values(scale: int, seed: int) -> list[object]:
    rng = np.random.default_rng(seed)
    vals: list[object] = [float(v) for v in rng.lognormal(0, 6, 2000)]
    vals += [float(-v) for v in rng.lognormal(-2, 1, 200)]
    edges = (_sketch_py._FAST_MIN, _sketch_py._FAST_MAX)
    vals += [e * f for e in edges for f in (1.0, 1 + 2**-52, 1 - 2**-53, 2.0, 0.5)]
    vals += [0.0, -0.0, 1.0, 2.0, 0.5, 4.0, 2.0**-1074, 1.7976931348623157e308, 3, True]
    vals += [math.nan, math.inf, -math.inf, "1", None, np.float64(2.5)]
    if scale > 0:  # values on and around bucket boundaries
        for j in range(1, min(2**scale, 64)):
            x = 2.0 ** (j / 2**scale)
            vals += [x, math.nextafter(x, 0.0), math.nextafter(x, math.inf), x * 2.0**40]
    random.Random(seed).shuffle(vals)
    return vals


@pytest.mark.parametrize("scale", [-3, 0, 1, 5, 6, 11, 20])
@pytest.mark.parametrize("cap", [7, 160, None])
def test_add_counts_as_the_general_path(scale: int, cap: int | None) -> None:
    vals = _values(scale, scale + 7)
    one_by_one = _sketch_py.QuantileSketch(scale=scale, max_buckets=cap)
    for v in vals:
        one_by_one.add(v)  # type: ignore[arg-type]
    general = _sketch_py.QuantileSketch(scale=scale, max_buckets=cap)
    general.add_many(vals)
    assert one_by_one._state() == general._state()
    assert (one_by_one.count, one_by_one.sum, one_by_one.rejected) == (
        general.count,
        general.sum,
        general.rejected,
    )
    assert one_by_one.to_bytes() == general.to_bytes()


def test_inline_range_is_where_map_to_index_needs_no_special_case() -> None:
    """Inside (_FAST_MIN, _FAST_MAX) and off powers of two, ``map_to_index`` is the plain
    ``floor(log(v) * factor)`` the inline path computes, with no clamp."""
    for scale in (1, 6, 20):
        factor = _mapping.scale_factor(scale)
        for v in (math.nextafter(_sketch_py._FAST_MIN, math.inf), 1.5, 3e299):
            assert _mapping.map_to_index(v, scale, factor) == math.floor(math.log(v) * factor)
