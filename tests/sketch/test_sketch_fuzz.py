"""Hostile sketch bytes: structure-aware fuzzing with the checksum fixed up.

Random bytes almost never get past the CRC, so they exercise nothing but the CRC.
These inputs are built field by field (scale, max_buckets, counts, offsets, min/max/sum)
from values at and beyond every limit, optionally damaged, and then given a valid
CRC-32: they reach the decoder's field checks and the twins' bucket stores. Both twins
must agree on accept/reject and, when they accept, on the decoded sketch. Never a crash,
never an exception other than ``CorruptDataError``.
"""

from __future__ import annotations

import math
import pickle
import random
import struct
import sys
import zlib
from typing import Any

import pytest

from otelgpu import _impl
from otelgpu.errors import CorruptDataError
from otelgpu.sketch import _codec, _sketch_py
from otelgpu.sketch._state import SketchState

NATIVE = _impl.native_module("otelgpu.sketch._sketch_c")
TWINS: list[Any] = [_sketch_py.QuantileSketch]
if NATIVE is not None:
    TWINS.append(NATIVE.QuantileSketch)

INT64_MAX = (1 << 63) - 1
FLOATS = [0.0, -0.0, 1.0, -1.0, 2.5, 1e-300, 5e-324, 1e308, sys.float_info.max]
FLOATS += [math.inf, -math.inf, math.nan]
BIG = [0, 1, 2, 255, 1 << 32, INT64_MAX, 1 << 63, (1 << 64) - 1, 1 << 64, 1 << 70]


def _with_crc(body: bytes | bytearray) -> bytes:
    return bytes(body) + struct.pack("<I", zlib.crc32(body))


def _offset(rng: random.Random, scale: int, n: int) -> int:
    lo, hi = _codec.index_bounds(max(min(scale, 20), -10))
    return rng.choice(
        [
            0,
            lo,
            lo - 1,
            hi,
            hi - n + 1,
            hi - n + 2,
            INT64_MAX,
            -INT64_MAX - 1,
            1 << 63,
            -(1 << 64),
            rng.randint(lo, hi),
            rng.randint(-(1 << 40), 1 << 40),
        ]
    )


def _counts(rng: random.Random) -> list[int]:
    n = rng.choice([0, 0, 1, 2, 3, 5, 17, 64])
    return [rng.choice([0, 1, 1, 7, rng.randint(0, 1 << 20), *BIG]) for _ in range(n)]


def _state(rng: random.Random) -> SketchState:
    scale = rng.choice([-11, -10, -3, 0, 1, 6, 10, 20, 21, rng.randint(-12, 22)])
    pos, neg = _counts(rng), _counts(rng)
    return SketchState(
        scale=scale,
        max_buckets=rng.choice([0, 1, 2, 3, 16, 160, 2048, 1 << 24, (1 << 24) + 1]),
        sum=rng.choice(FLOATS),
        min=rng.choice(FLOATS),
        max=rng.choice(FLOATS),
        zero_count=rng.choice([0, 0, 1, 3, *BIG]),
        rejected=rng.choice([0, 0, 1, *BIG]),
        positive_offset=_offset(rng, scale, len(pos)),
        positive=pos,
        negative_offset=_offset(rng, scale, len(neg)),
        negative=neg,
    )


def _plausible(rng: random.Random) -> SketchState:
    """A state that is mostly valid, so damage lands in accepted territory too."""
    sketch = _sketch_py.QuantileSketch(scale=rng.choice([-2, 0, 3, 6]))
    sketch.add_many([rng.lognormvariate(0, 3) * rng.choice([1, -1, 0]) for _ in range(20)])
    return sketch._state()


def _damage(rng: random.Random, body: bytes) -> bytes:
    data = bytearray(body)
    kind = rng.randrange(4)
    i = rng.randrange(5, len(data))  # keep magic + version: the field checks are the target
    if kind == 0:
        data[i] ^= 1 << rng.randrange(8)
    elif kind == 1:
        data[i] = rng.choice([0x00, 0x7F, 0x80, 0xFF])
    elif kind == 2:
        data[i:i] = bytes([rng.choice([0x80, 0xFF, 0x01])] * rng.randint(1, 10))
    else:
        del data[i : i + rng.randint(1, 4)]
    return bytes(data)


def _inputs(seed: int, n: int) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        state = _state(rng) if rng.random() < 0.6 else _plausible(rng)
        body = _codec.encode(state)[:-4]
        if rng.random() < 0.4:
            body = _damage(rng, body)
        out.append(_with_crc(body))
    return out


def _outcome(cls: Any, data: bytes) -> tuple[str, Any]:
    try:
        sketch = cls.from_bytes(data)
    except CorruptDataError as exc:
        return ("rejected", type(exc).__name__)
    state = sketch._state()
    # an accepted sketch is usable: quantiles, round trip, pickling
    sketch.quantiles([0.0, 0.5, 0.99, 1.0])
    assert cls.from_bytes(sketch.to_bytes())._state() == state
    return ("accepted", state)


class _Forged:
    """Pickles as ``loader(data)``: what an attacker-supplied pickle of a sketch does."""

    def __init__(self, loader: Any, data: bytes) -> None:
        self.loader, self.data = loader, data

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return (self.loader, (self.data,))


def test_the_51_byte_offset_overflow_is_rejected_by_both_twins() -> None:
    """The input that crashed the native twin: a valid CRC, bucket offset INT64_MAX."""
    state = SketchState(0, 16, 3.0, 1.0, 2.0, 0, 0, INT64_MAX, [1, 1], 0, [])
    data = _codec.encode(state)
    for cls in TWINS:
        with pytest.raises(CorruptDataError, match="outside the indexes"):
            cls.from_bytes(data)

        with pytest.raises(CorruptDataError):
            pickle.loads(pickle.dumps(_Forged(cls.from_bytes, data)))


@pytest.mark.parametrize("counts", [[1 << 64], [1 << 63, 1 << 63], [(1 << 64) - 1, 1]])
def test_counts_of_2_64_or_more_are_corrupt_data_not_overflow(counts: list[int]) -> None:
    state = SketchState(0, 16, 3.0, 1.0, 2.0, 0, 0, 0, counts, 0, [])
    for cls in TWINS:
        with pytest.raises(CorruptDataError, match=r"2\*\*64"):
            cls.from_bytes(_codec.encode(state))
    zeros = SketchState(0, 16, 0.0, 0.0, 0.0, 1 << 64, 0, 0, [], 0, [])
    for cls in TWINS:
        with pytest.raises(CorruptDataError):
            cls.from_bytes(_codec.encode(zeros))


def test_extreme_but_valid_bucket_ranges_are_accepted_by_both_twins() -> None:
    for scale in (-10, 0, 6, 20):
        lo, hi = _codec.index_bounds(scale)
        state = SketchState(scale, 16, 0.0, -1e308, 1e308, 0, 0, hi - 1, [1, 1], lo, [1])
        for cls in TWINS:
            assert cls.from_bytes(_codec.encode(state))._state() == state


@pytest.mark.parametrize("seed", range(4))
def test_twins_agree_on_structured_hostile_bytes(seed: int) -> None:
    accepted = rejected = 0
    for data in _inputs(seed, 3000):
        outcomes = [_outcome(cls, data) for cls in TWINS]
        assert all(o == outcomes[0] for o in outcomes), (data.hex(), outcomes)
        accepted += outcomes[0][0] == "accepted"
        rejected += outcomes[0][0] == "rejected"
    # the generator reaches both sides of every check, not only the CRC
    assert accepted > 300 and rejected > 300
