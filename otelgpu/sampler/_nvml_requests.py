"""Reusable NVML requests for the pure sampler core: its two batched reads, and its
scalar reads bound once per device (:class:`DeviceReads`).

``nvmlDeviceGetFieldValues`` and ``nvmlGpmMetricsGet`` take arrays of ``_PrintableStructure``
records in pynvml, and every attribute read or write on those goes through pynvml's
Python-level ``__getattribute__``/``__setattr__``: building a request of ~20 fields and
reading it back cost ~110 µs of Python per GPU per round, more than every other NVML read
together, all of it holding the GIL the host wants. Here each request is built once per
device (pynvml's own structures and library handle, so the layout and the library are
pynvml's), and the answers are read in one ``struct`` pass over the buffer's bytes -- what
the native core does in C with the same arrays.

The scalar reads (utilization, memory, power, clocks...) call pynvml's own function
pointers with buffers laid out as pynvml's structures: 12 reads per GPU per round went
from ~0.9-1.5 µs each to ~0.4 µs; with the sample filled in RawSample's order, a whole
8-GPU round went from ~390 to ~240 µs of Python (``_core_py._tick``, uncontended).

Values are decoded as ``_core_py._field_u64`` does (a non-negative int per ``valueType``);
a test compares the two for every value type.

Thread-safety: a request belongs to one device and is used by the sampling round only
(under the core's ``_tick_lock``).
"""

from __future__ import annotations

import ctypes
import functools
import struct
from collections.abc import Sequence
from typing import Any

__all__ = [
    "DeviceReads",
    "FieldRequest",
    "GpmRequest",
    "PublicReads",
    "decode_field",
    "device_reads",
]

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
        # unsigned long long and unsigned int, the usual types, decoded in place
        return [
            (
                ret,
                0
                if ret
                else raw
                if vt == 3
                else raw & 0xFFFFFFFF
                if vt == 1
                else decode_field(vt, raw),
            )
            for vt, ret, raw in self._unpack(data)
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


def _fixed_code(code: int) -> int:
    return code


def _bound(nv: Any, names: Sequence[str], *args: Any) -> Any:
    """A zero-argument call of the first of ``names`` pynvml's library has, with ``args``;
    where it has none, a call returning pynvml's lookup error code (as each call through
    pynvml's own function would raise it)."""
    code = 13  # NVML_ERROR_FUNCTION_NOT_FOUND
    for name in names:
        try:
            fn = _function(nv, name)
        except nv.NVMLError as exc:
            code = int(exc.value)
            continue
        return functools.partial(fn, *args)
    return functools.partial(_fixed_code, code)


def _plain(base: Any) -> Any:
    """A plain ctypes structure with the layout of pynvml's ``base``: its fields read as
    C attributes, without ``_PrintableStructure``'s Python-level ``__getattribute__``."""
    return type(base.__name__ + "_plain", (ctypes.Structure,), {"_fields_": base._fields_})


class DeviceReads:
    """One device's scalar NVML reads, bound once: pynvml's function pointers with the
    device's handle and prepared output buffers (pynvml's structure layouts).

    Each read returns ``(nvmlReturn, value)``; the value means something only when the
    return is 0. Through pynvml's public functions each read costs a function lookup
    under its lock, new ctypes objects and attribute reads through its structures'
    Python hooks, ~1 µs of the GIL more per read. Symbols are looked up as the native
    core does (``otg_nvml.h``): the clock event reasons before the older throttle reasons.
    A symbol the library lacks reads as pynvml's lookup error (``FUNCTION_NOT_FOUND``).

    Thread-safety: belongs to one device's sampling round (under the core's ``_tick_lock``).
    """

    __slots__ = (
        "_c_dec",
        "_c_enc",
        "_c_fan",
        "_c_mem1",
        "_c_mem2",
        "_c_mem_clock",
        "_c_power",
        "_c_pstate",
        "_c_reasons",
        "_c_sm_clock",
        "_c_temp",
        "_c_util",
        "_dec",
        "_enc",
        "_fan",
        "_mem1",
        "_mem2",
        "_mem2_version",
        "_mem_clock",
        "_power",
        "_pstate",
        "_reasons",
        "_sm_clock",
        "_temp",
        "_util",
        "handle",
    )  # fmt: skip

    def __init__(self, nv: Any, handle: Any) -> None:
        c_uint, byref = ctypes.c_uint, ctypes.byref
        self.handle = handle
        self._util = _plain(nv.c_nvmlUtilization_t)()
        self._mem2 = _plain(nv.c_nvmlMemory_v2_t)()
        self._mem1 = _plain(nv.c_nvmlMemory_t)()
        self._mem2_version = int(nv.nvmlMemory_v2)
        self._power, self._temp, self._fan = c_uint(), c_uint(), c_uint()
        self._sm_clock, self._mem_clock = c_uint(), c_uint()
        self._reasons = ctypes.c_ulonglong()
        self._pstate = c_uint()  # pynvml's _nvmlPstates_t is a c_uint
        self._enc, self._dec = c_uint(), c_uint()
        period = c_uint()  # the sampling periods: not used
        self._c_util = _bound(nv, ["nvmlDeviceGetUtilizationRates"], handle, byref(self._util))
        self._c_mem2 = _bound(nv, ["nvmlDeviceGetMemoryInfo_v2"], handle, byref(self._mem2))
        self._c_mem1 = _bound(nv, ["nvmlDeviceGetMemoryInfo"], handle, byref(self._mem1))
        self._c_power = _bound(nv, ["nvmlDeviceGetPowerUsage"], handle, byref(self._power))
        self._c_temp = _bound(
            nv, ["nvmlDeviceGetTemperature"], handle, c_uint(0), byref(self._temp)
        )  # 0: NVML_TEMPERATURE_GPU
        self._c_sm_clock = _bound(
            nv, ["nvmlDeviceGetClockInfo"], handle, c_uint(1), byref(self._sm_clock)
        )  # 1: NVML_CLOCK_SM
        self._c_mem_clock = _bound(
            nv, ["nvmlDeviceGetClockInfo"], handle, c_uint(2), byref(self._mem_clock)
        )  # 2: NVML_CLOCK_MEM
        self._c_reasons = _bound(
            nv,
            ["nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"],
            handle,
            byref(self._reasons),
        )
        self._c_fan = _bound(nv, ["nvmlDeviceGetFanSpeed"], handle, byref(self._fan))
        self._c_pstate = _bound(nv, ["nvmlDeviceGetPerformanceState"], handle, byref(self._pstate))
        self._c_enc = _bound(
            nv, ["nvmlDeviceGetEncoderUtilization"], handle, byref(self._enc), byref(period)
        )
        self._c_dec = _bound(
            nv, ["nvmlDeviceGetDecoderUtilization"], handle, byref(self._dec), byref(period)
        )

    def utilization(self) -> tuple[int, Any]:
        """(code, (gpu %, memory %))."""
        code = self._c_util()
        u = self._util
        return code, (u.gpu, u.memory)

    def memory_v2(self) -> tuple[int, Any]:
        """(code, (used, total, reserved) bytes): used excludes reserved."""
        m = self._mem2
        m.version = self._mem2_version
        code = self._c_mem2()
        return code, (m.used, m.total, m.reserved)

    def memory_v1(self) -> tuple[int, Any]:
        """(code, (used, total) bytes): used includes reserved."""
        code = self._c_mem1()
        m = self._mem1
        return code, (m.used, m.total)

    def power(self) -> tuple[int, int]:
        return self._c_power(), self._power.value

    def temperature(self) -> tuple[int, int]:
        return self._c_temp(), self._temp.value

    def sm_clock(self) -> tuple[int, int]:
        return self._c_sm_clock(), self._sm_clock.value

    def mem_clock(self) -> tuple[int, int]:
        return self._c_mem_clock(), self._mem_clock.value

    def reasons(self) -> tuple[int, int]:
        return self._c_reasons(), self._reasons.value

    def fan(self) -> tuple[int, int]:
        return self._c_fan(), self._fan.value

    def pstate(self) -> tuple[int, int]:
        return self._c_pstate(), self._pstate.value

    def encoder(self) -> tuple[int, int]:
        return self._c_enc(), self._enc.value

    def decoder(self) -> tuple[int, int]:
        return self._c_dec(), self._dec.value


class PublicReads:
    """:class:`DeviceReads` through pynvml's public functions, for a pynvml whose
    structures or lookup this module does not know: each failure becomes its code (an
    ``NVMLError``'s value; 13, ``FUNCTION_NOT_FOUND``, for a function pynvml lacks)."""

    __slots__ = ("_nv", "handle")

    def __init__(self, nv: Any, handle: Any) -> None:
        self._nv, self.handle = nv, handle

    def _call(self, name: str, *args: Any, **kwargs: Any) -> tuple[int, Any]:
        nv = self._nv
        try:
            return 0, getattr(nv, name)(self.handle, *args, **kwargs)
        except nv.NVMLError as exc:
            return int(exc.value), None
        except (AttributeError, TypeError):  # a pynvml without this function or argument
            return 13, None

    def utilization(self) -> tuple[int, Any]:
        code, u = self._call("nvmlDeviceGetUtilizationRates")
        return code, (int(u.gpu), int(u.memory)) if not code else None

    def memory_v2(self) -> tuple[int, Any]:
        code, m = self._call(
            "nvmlDeviceGetMemoryInfo", version=getattr(self._nv, "nvmlMemory_v2", 0)
        )
        return code, (int(m.used), int(m.total), int(m.reserved)) if not code else None

    def memory_v1(self) -> tuple[int, Any]:
        code, m = self._call("nvmlDeviceGetMemoryInfo")
        return code, (int(m.used), int(m.total)) if not code else None

    def power(self) -> tuple[int, Any]:
        return self._call("nvmlDeviceGetPowerUsage")

    def temperature(self) -> tuple[int, Any]:
        return self._call("nvmlDeviceGetTemperature", 0)

    def sm_clock(self) -> tuple[int, Any]:
        return self._call("nvmlDeviceGetClockInfo", 1)

    def mem_clock(self) -> tuple[int, Any]:
        return self._call("nvmlDeviceGetClockInfo", 2)

    def reasons(self) -> tuple[int, Any]:
        nv = self._nv
        if hasattr(nv, "nvmlDeviceGetCurrentClocksEventReasons"):
            code, value = self._call("nvmlDeviceGetCurrentClocksEventReasons")
            if code != 13:
                return code, value
        return self._call("nvmlDeviceGetCurrentClocksThrottleReasons")

    def fan(self) -> tuple[int, Any]:
        return self._call("nvmlDeviceGetFanSpeed")

    def pstate(self) -> tuple[int, Any]:
        return self._call("nvmlDeviceGetPerformanceState")

    def encoder(self) -> tuple[int, Any]:
        code, value = self._call("nvmlDeviceGetEncoderUtilization")
        return code, int(value[0]) if not code else None

    def decoder(self) -> tuple[int, Any]:
        code, value = self._call("nvmlDeviceGetDecoderUtilization")
        return code, int(value[0]) if not code else None


def device_reads(nv: Any, handle: Any) -> DeviceReads | PublicReads:
    """The device's bound reads; pynvml's public calls where they cannot be bound."""
    try:
        return DeviceReads(nv, handle)
    except (AttributeError, ValueError, TypeError):
        return PublicReads(nv, handle)
