"""The native twin: it loaded, it agrees with the Python twin bucket for bucket, its
fast index path equals the SDK formula, and concurrent adds lose nothing."""

from __future__ import annotations

import math
import random
import threading
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from otelgpu import _impl
from otelgpu.sketch import QuantileSketch, _mapping, _sketch_py

NATIVE = _impl.native_module("otelgpu.sketch._sketch_c")

NATIVE = _impl.native_module("otelgpu.sketch._sketch_c")
needs_native = pytest.mark.skipif(NATIVE is None, reason="pure-Python run")


@pytest.mark.skipif(_impl.NO_EXTENSIONS, reason="this run forces the pure-Python twin")
def test_native_twin_is_loaded() -> None:
    assert NATIVE is not None
    assert QuantileSketch.__module__ == "otelgpu.sketch._sketch_c"


def _values(seed: int) -> list[Any]:
    rng = np.random.default_rng(seed)
    vals: list[Any] = [float(v) for v in rng.lognormal(0, 4, 3000)]
    vals += [float(-v) for v in rng.lognormal(-2, 1, 300)]
    vals += [0.0, -0.0, 1.0, 2.0, 0.5, 2.0**-1074, 2.0**-1022, 1.7976931348623157e308]
    vals += [math.nan, math.inf, -math.inf, "1", None, 10**400, 3, np.float64(2.5), True]
    random.Random(seed).shuffle(vals)
    return vals


@needs_native
@pytest.mark.parametrize("scale", [-10, -3, 0, 1, 5, 6, 10, 11, 20])
@pytest.mark.parametrize("cap", [7, 160, None])
def test_twins_agree_bucket_for_bucket(scale: int, cap: int | None) -> None:
    assert NATIVE is not None
    vals = _values(scale + 100)
    py, c = (
        _sketch_py.QuantileSketch(scale=scale, max_buckets=cap),
        NATIVE.QuantileSketch(scale=scale, max_buckets=cap),
    )
    for v in vals:
        py.add(v)
        c.add(v)
    assert c._state() == py._state()
    assert c.to_bytes() == py.to_bytes()
    qs = [i / 200 for i in range(201)]
    assert c.quantiles(qs) == py.quantiles(qs)
    assert (c.count, c.sum, c.min, c.max, c.rejected) == (
        py.count,
        py.sum,
        py.min,
        py.max,
        py.rejected,
    )


@needs_native
@settings(max_examples=80, derandomize=True, deadline=None)
@given(
    xs=st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=50),
    scale=st.integers(min_value=-10, max_value=20),
)
@example(xs=[2.0**-1074, 2.0**-1022, 1.0, 2.0, 1e308], scale=20)
def test_twins_agree_on_any_floats(xs: list[float], scale: int) -> None:
    assert NATIVE is not None
    py = _sketch_py.QuantileSketch(scale=scale)
    c = NATIVE.QuantileSketch(scale=scale)
    py.add_many(xs)
    c.add_many(np.asarray(xs, dtype=np.float64))
    assert c._state() == py._state()
    qs = [0.0, 0.3, 0.5, 0.99, 1.0]
    assert np.array_equal(c.quantiles(qs), py.quantiles(qs), equal_nan=True)


def _near_boundaries(scale: int) -> list[float]:
    """Values at, just around, and just beyond the guard band of every bucket boundary."""
    out = []
    for j in range(1, 2**scale):
        boundary = 2.0 ** (j / 2**scale)
        for e in (-1000, -20, -1, 0, 3, 60, 1000):
            x = math.ldexp(boundary, e)
            out.append(x)
            for ulps in (1, 2, 3, 7, 100, (1 << 20) - 1, 1 << 20, (1 << 20) + 1):
                step = math.ulp(x) * ulps
                out += [x + step, x - step]
    return out


@needs_native
@pytest.mark.parametrize("scale", range(1, 11))
def test_table_fast_path_equals_the_sdk_formula(scale: int) -> None:
    """Scales 1..10 index through a lookup table with a guard band; it must give the
    SDK formula's ``floor(log(v) * factor)`` exactly, including next to boundaries."""
    assert NATIVE is not None
    factor = _mapping.scale_factor(scale)
    rng = np.random.default_rng(scale)
    values = _near_boundaries(scale) + [float(v) for v in rng.lognormal(0, 50, 5000)]
    for v in values:
        if 0.0 < v < math.inf:
            want = _mapping.map_to_index(v, scale, factor)
            assert NATIVE._map_to_index(v, scale) == want, v.hex()
            assert NATIVE._map_to_index(v, scale, False) == want, v.hex()


@needs_native
def test_forced_lock_gives_the_same_result() -> None:
    assert NATIVE is not None
    vals = _values(3)
    plain, locked = NATIVE.QuantileSketch(), NATIVE.QuantileSketch()
    locked._set_locking(True)
    for v in vals:
        plain.add(v)
        locked.add(v)
    locked.add_many(np.array([1.0, 2.0]))
    plain.add_many(np.array([1.0, 2.0]))
    assert locked._state() == plain._state()
    assert locked.copy()._state() == plain._state()


CONCURRENCY_CASES = [pytest.param(_sketch_py.QuantileSketch, False, id="py")]
if NATIVE is not None:
    CONCURRENCY_CASES += [
        pytest.param(NATIVE.QuantileSketch, False, id="c-gil"),  # the GIL is the lock
        pytest.param(NATIVE.QuantileSketch, True, id="c-spinlock"),  # free-threading's lock
    ]


@pytest.mark.parametrize(("sketch_cls", "locked"), CONCURRENCY_CASES)
def test_concurrent_adds_lose_nothing(sketch_cls: Any, locked: bool) -> None:
    threads_n, per_thread = 8, 100_000
    s = sketch_cls()
    if locked:
        s._set_locking(True)
    start = threading.Barrier(threads_n)

    def worker(k: int) -> None:
        add = s.add
        value = float(k + 1)  # exact sums: small integers
        start.wait()
        for i in range(per_thread):
            if i % 1000 == 999:
                s.add_many([value] * 10)
            else:
                add(value)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    per = per_thread - per_thread // 1000 + (per_thread // 1000) * 10
    assert s.count == threads_n * per
    assert s.sum == sum((k + 1) * per for k in range(threads_n))
    assert (s.min, s.max) == (1.0, float(threads_n))
