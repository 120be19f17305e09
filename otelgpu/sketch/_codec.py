"""Compact, versioned, checksummed binary encoding of a ``SketchState``.

Layout (version 1; integers are LEB128 varints, signed ones zig-zag encoded)::

    b"OGQS"  u8 version=1
    zigzag scale | max_buckets | zero_count | rejected
    f64 sum | f64 min | f64 max                          (little-endian IEEE-754)
    positive: n | [zigzag offset | n counts]             (store omitted when n == 0)
    negative: n | [zigzag offset | n counts]
    u32 CRC-32 of all preceding bytes                    (little-endian)

Dense bucket counts cost one byte per empty bucket and 1-3 bytes per occupied one:
a million lognormal values at scale 6 encode to about 2 KiB. Any truncation,
trailing garbage, bit flip (CRC) or impossible content raises
``otelgpu.errors.CorruptDataError``.
"""

from __future__ import annotations

import functools
import math
import struct
import sys
import zlib

from otelgpu.errors import CorruptDataError
from otelgpu.sketch import _mapping
from otelgpu.sketch._state import SketchState

MAGIC = b"OGQS"
MAX_BUCKETS_LIMIT = 1 << 24  # as accepted by the constructors (``_config``)
VERSION = 1
_F64X3 = struct.Struct("<3d")
_U32 = struct.Struct("<I")


def _put_uint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _put_int(out: bytearray, value: int) -> None:
    _put_uint(out, (value << 1) if value >= 0 else ((-value) << 1) - 1)


def encode(state: SketchState) -> bytes:
    """Encode ``state``; the inverse of ``decode``."""
    out = bytearray(MAGIC)
    out.append(VERSION)
    _put_int(out, state.scale)
    _put_uint(out, state.max_buckets)
    _put_uint(out, state.zero_count)
    _put_uint(out, state.rejected)
    out += _F64X3.pack(state.sum, state.min, state.max)
    for offset, counts in (
        (state.positive_offset, state.positive),
        (state.negative_offset, state.negative),
    ):
        _put_uint(out, len(counts))
        if counts:
            _put_int(out, offset)
            for c in counts:
                _put_uint(out, c)
    out += _U32.pack(zlib.crc32(out))
    return bytes(out)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def uint(self) -> int:
        result = 0
        shift = 0
        data = self.data
        while True:
            if self.pos >= len(data):
                raise CorruptDataError("sketch bytes are truncated (inside a varint)")
            byte = data[self.pos]
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                return result
            shift += 7
            if shift > 70:
                raise CorruptDataError("sketch bytes hold an over-long varint")

    def sint(self) -> int:
        raw = self.uint()
        return (raw >> 1) if not raw & 1 else -((raw + 1) >> 1)

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise CorruptDataError("sketch bytes are truncated")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk


def decode(data: bytes | bytearray | memoryview) -> SketchState:
    """Decode bytes made by ``encode``; raise ``CorruptDataError`` on any damage."""
    try:
        raw = bytes(data)
    except TypeError as exc:
        raise CorruptDataError(
            f"sketch data must be bytes-like, not {type(data).__name__}"
        ) from exc
    if len(raw) < len(MAGIC) + 1 + _U32.size:
        raise CorruptDataError(f"sketch bytes are too short ({len(raw)} bytes)")
    if raw[:4] != MAGIC:
        raise CorruptDataError("not otelgpu sketch bytes (bad magic)")
    if raw[4] != VERSION:
        raise CorruptDataError(f"unsupported sketch encoding version {raw[4]} (expected {VERSION})")
    body, (crc,) = raw[:-4], _U32.unpack(raw[-4:])
    if zlib.crc32(body) != crc:
        raise CorruptDataError("sketch bytes fail their CRC-32 check (corrupted)")
    reader = _Reader(body)
    reader.pos = 5
    scale = reader.sint()
    if not _mapping.MIN_SCALE <= scale <= _mapping.MAX_SCALE:
        raise CorruptDataError(f"sketch bytes hold an impossible scale {scale}")
    max_buckets = reader.uint()
    if not 2 <= max_buckets <= MAX_BUCKETS_LIMIT:
        raise CorruptDataError(f"sketch bytes hold an impossible max_buckets {max_buckets}")
    zero_count = reader.uint()
    rejected = reader.uint()
    total, vmin, vmax = _F64X3.unpack(reader.take(_F64X3.size))
    stores: list[tuple[int, list[int]]] = []
    for _ in range(2):
        n = reader.uint()
        if n > max_buckets:
            raise CorruptDataError(f"sketch bytes hold {n} buckets, over max_buckets {max_buckets}")
        offset = reader.sint() if n else 0
        counts = [reader.uint() for _ in range(n)]
        if counts and (counts[0] == 0 or counts[-1] == 0):
            raise CorruptDataError("sketch bytes hold a bucket range with empty ends")
        stores.append((offset, counts))
    if reader.pos != len(body):
        raise CorruptDataError(f"sketch bytes have {len(body) - reader.pos} trailing bytes")
    state = SketchState(
        scale=scale,
        max_buckets=max_buckets,
        sum=total,
        min=vmin,
        max=vmax,
        zero_count=zero_count,
        rejected=rejected,
        positive_offset=stores[0][0],
        positive=stores[0][1],
        negative_offset=stores[1][0],
        negative=stores[1][1],
    )
    check(state)
    return state


COUNT_LIMIT = 1 << 64  # counters are uint64 in the native twin; the pure twin keeps the same bound
_SMALLEST_SUBNORMAL = 5e-324


@functools.lru_cache(maxsize=_mapping.MAX_SCALE - _mapping.MIN_SCALE + 1)
def index_bounds(scale: int) -> tuple[int, int]:
    """The lowest and highest bucket index any finite double can map to at ``scale``."""
    factor = _mapping.scale_factor(scale)
    return (
        _mapping.map_to_index(_SMALLEST_SUBNORMAL, scale, factor),
        _mapping.map_to_index(sys.float_info.max, scale, factor),
    )


def _check_store(name: str, scale: int, offset: int, counts: list[int]) -> None:
    if not counts:
        return
    lo, hi = index_bounds(scale)
    if not lo <= offset <= hi - (len(counts) - 1):
        raise CorruptDataError(
            f"sketch {name} buckets {offset}..{offset + len(counts) - 1} lie outside the "
            f"indexes {lo}..{hi} possible at scale {scale}"
        )
    if any(not 0 <= c < COUNT_LIMIT for c in counts):
        raise CorruptDataError(f"sketch {name} bucket counts must lie in 0..2**64-1")


def check(state: SketchState) -> None:
    """Reject a state no sketch could hold: fields out of range or contradicting each other.

    Every field is checked before either twin uses it (bucket indexes within the range of
    finite doubles at the state's scale, counts below 2**64, summary statistics consistent
    with the buckets), so both twins accept and reject exactly the same states.
    """
    if not _mapping.MIN_SCALE <= state.scale <= _mapping.MAX_SCALE:
        raise CorruptDataError(f"sketch holds an impossible scale {state.scale}")
    if not 2 <= state.max_buckets <= MAX_BUCKETS_LIMIT:
        raise CorruptDataError(f"sketch holds an impossible max_buckets {state.max_buckets}")
    for name, offset, counts in (
        ("positive", state.positive_offset, state.positive),
        ("negative", state.negative_offset, state.negative),
    ):
        if len(counts) > state.max_buckets:
            raise CorruptDataError(
                f"sketch holds {len(counts)} {name} buckets, over max_buckets {state.max_buckets}"
            )
        _check_store(name, state.scale, offset, counts)
    if not 0 <= state.zero_count < COUNT_LIMIT or not 0 <= state.rejected < COUNT_LIMIT:
        raise CorruptDataError("sketch zero/rejected counts must lie in 0..2**64-1")
    if state.value_count >= COUNT_LIMIT:
        raise CorruptDataError("sketch holds 2**64 values or more (its count would overflow)")
    if math.isnan(state.sum):
        raise CorruptDataError("sketch sum is NaN")
    if state.value_count == 0:
        if not (state.min == math.inf and state.max == -math.inf and state.sum == 0.0):
            raise CorruptDataError("an empty sketch must have min=inf, max=-inf, sum=0")
        return
    if not (math.isfinite(state.min) and math.isfinite(state.max) and state.min <= state.max):
        raise CorruptDataError(f"sketch min/max are impossible ({state.min!r}, {state.max!r})")
    if state.positive and state.max <= 0.0:
        raise CorruptDataError("sketch has positive buckets but max <= 0")
    if state.negative and state.min >= 0.0:
        raise CorruptDataError("sketch has negative buckets but min >= 0")
