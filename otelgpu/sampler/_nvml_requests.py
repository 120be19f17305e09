"""Reusable NVML request buffers for the pure sampler core's two batched reads.

``nvmlDeviceGetFieldValues`` and ``nvmlGpmMetricsGet`` take arrays of ``_PrintableStructure``
records in pynvml, and every attribute read or write on those goes through pynvml's
Python-level ``__getattribute__``/``__setattr__``: building a request of ~20 fields and
reading it back cost ~110 µs of Python per GPU per round, more than every other NVML read
together, all of it holding the GIL the host wants. Here each request is built once per
device (pynvml's own structures and library handle, so the layout and the library are
pynvml's), and the answers are read in one ``struct`` pass over the buffer's bytes -- what
the native core does in C with the same arrays.

Values are decoded as ``_core_py._field_u64`` does (a non-negative int per ``valueType``);
a test compares the two for every value type.

Thread-safety: a request belongs to one device and is used by the sampling round only
(under the core's ``_tick_lock``).
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Any

__all__ = ["FieldRequest", "GpmRequest", "decode_field"]

_DOUBLE = struct.Struct("<d")
_ULONG_MASK = (1 << (8 * ctypes.sizeof(ctypes.c_ulong))) - 1


def decode_field(value_type: int, raw: int) -> int:
    """A field value's 8 raw bytes (little-endian u64) as a non-negative int, by NVML
    ``valueType`` (0 double, 1 uint, 2 ulong, 3 ulonglong, 4 longlong, 5 int, 6 ushort)."""
    if value_type == 3:
        return raw
    if value_type == 1:
        return raw & 0xFFFFFFFF
    if value_type == 0:
        d = _DOUBLE.unpack(raw.to_bytes(8, "little"))[0]
        return int(d) if d > 0 else 0
    if value_type == 2:
        return raw & _ULONG_MASK
    if value_type == 4:
        return raw if raw < 1 << 63 else 0
    if value_type == 5:
        low = raw & 0xFFFFFFFF
        return low if low < 1 << 31 else 0
    if value_type == 6:
        return raw & 0xFFFF
    return raw


def _function(nv: Any, name: str) -> Any:
    """pynvml's own function pointer (its library handle and lookup cache)."""
    return nv._nvmlGetFunctionPointer(name)


class FieldRequest:
    """One device's ``nvmlDeviceGetFieldValues`` request of ``fields`` ((field id,
    scope id) pairs), built once.

    :meth:`read` returns ``[(nvmlReturn, value), ...]`` in request order, the value
    decoded by :func:`decode_field` (0 where ``nvmlReturn`` is not 0); a failing call
    raises pynvml's ``NVMLError`` as ``pynvml.nvmlDeviceGetFieldValues`` does.
    """

    __slots__ = ("_arr", "_count", "_fn", "_nv", "_size", "_unpack", "fields")

    def __init__(self, nv: Any, fields: Sequence[tuple[int, int]]) -> None:
        rec = nv.c_nvmlFieldValue_t
        n = len(fields)
        arr = (rec * n)()
        for i, (fid, scope) in enumerate(fields):
            arr[i].fieldId, arr[i].scopeId = fid, scope
        vt, ret, val = rec.valueType.offset, rec.nvmlReturn.offset, rec.value.offset
        size = ctypes.sizeof(rec)
        if ret != vt + 4 or val < ret + 4 or val + 8 > size:
            raise ValueError("unexpected c_nvmlFieldValue_t layout")
        fmt = f"<{vt}xII{val - ret - 4}xQ{size - val - 8}x"
        self._unpack = struct.Struct(fmt).iter_unpack
        self._arr, self._count, self._size = arr, ctypes.c_int32(n), size * n
        self._fn = _function(nv, "nvmlDeviceGetFieldValues")
        self._nv = nv
        self.fields = tuple(fields)

    def read(self, handle: Any) -> list[tuple[int, int]]:
        arr = self._arr
        code = self._fn(handle, self._count, ctypes.byref(arr))
        if code:
            raise self._nv.NVMLError(code)
        data = ctypes.string_at(ctypes.addressof(arr), self._size)
        return [
            (ret, decode_field(vt, raw) if ret == 0 else 0) for vt, ret, raw in self._unpack(data)
        ]


class GpmRequest:
    """One device's ``nvmlGpmMetricsGet`` request between its two alternating GPM samples.

    Built for the metric ids ``ids``; ``request(cur)`` is the prepared request whose
    ``sample2`` is ``samples[cur]`` (the newer sample) and ``sample1`` the other.
    :meth:`get` returns ``[(nvmlReturn, value), ...]`` in the order of ``ids``; a failing
    call raises pynvml's ``NVMLError``.
    """

    __slots__ = ("_fn", "_metrics_at", "_nv", "_requests", "_size", "_unpack", "ids")

    def __init__(self, nv: Any, samples: Sequence[Any], ids: Sequence[int]) -> None:
        requests = []
        for cur in (0, 1):
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.sample1, mg.sample2 = samples[1 - cur], samples[cur]
            mg.numMetrics = len(ids)
            for j, mid in enumerate(ids):
                mg.metrics[j].metricId = mid
            requests.append(mg)
        rec = nv.c_nvmlGpmMetric_t
        ret, val, size = rec.nvmlReturn.offset, rec.value.offset, ctypes.sizeof(rec)
        if val < ret + 4 or val + 8 > size:
            raise ValueError("unexpected c_nvmlGpmMetric_t layout")
        self._unpack = struct.Struct(f"<{ret}xI{val - ret - 4}xd{size - val - 8}x").iter_unpack
        self._metrics_at = nv.c_nvmlGpmMetricsGet_t.metrics.offset
        self._size = size * len(ids)
        self._requests = requests
        self._fn = _function(nv, "nvmlGpmMetricsGet")
        self._nv = nv
        self.ids = tuple(ids)

    def get(self, cur: int) -> list[tuple[int, float]]:
        mg = self._requests[cur]
        code = self._fn(ctypes.byref(mg))
        if code:
            raise self._nv.NVMLError(code)
        data = ctypes.string_at(ctypes.addressof(mg) + self._metrics_at, self._size)
        return list(self._unpack(data))
