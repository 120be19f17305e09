"""The native module and the pure twin share one contract: field bits, the field-value
table, GPM metric ids, masks, limits and event kinds -- compared module to module
(``_sampler_c.constants()`` reads the C header's definitions at build time)."""

from __future__ import annotations

import pytest

from otelgpu import _impl
from otelgpu.sampler import _fields as F

native = None if _impl.NO_EXTENSIONS else _impl.native_module("otelgpu.sampler._sampler_c")
needs_native = pytest.mark.skipif(
    _impl.NO_EXTENSIONS, reason="pure-Python run (OTELGPU_NO_EXTENSIONS): no native module"
)


@needs_native
def test_native_constants_equal_the_pure_twin() -> None:
    assert native is not None, "extensions are enabled but the native sampler did not load"
    c = native.constants()
    for name, value in c.items():
        if name in ("FIELD_TABLE", "GPM_IDS", "NTHROTTLE"):
            continue
        assert getattr(F, name) == value, name
    assert c["FIELD_TABLE"] == F.FIELD_TABLE
    assert c["GPM_IDS"] == F.GPM_IDS
    assert c["NTHROTTLE"] == len(F.THROTTLE_COUNTERS)
    # every bit named, and F_ALL covers exactly the named fields
    named = 0
    for bit in F.FIELD_NAMES:
        named |= bit
    assert named == F.F_ALL == c["F_ALL"]


def test_pure_contract_is_consistent() -> None:
    assert [bit for _, _, bit in F.FIELD_TABLE if bit == F.F_REMAP] == [F.F_REMAP] * 4
    assert [fid for fid, _, bit in F.FIELD_TABLE if bit == F.F_REMAP] == [
        F.REMAP_FIRST_FIELD + k for k in range(4)
    ]
    assert (1 << len(F.GPM_METRICS)) - 1 == F.GPM_ALL
    assert len(set(F.GPM_IDS)) == len(F.GPM_IDS)
    assert F.reason_names(0x48) == ("hw_slowdown", "hw_thermal_slowdown")
    assert F.reason_names(0x1000) == ("0x1000",)
    assert F.EVENT_KINDS[F.EV_XID] == "xid"
    assert F.EVENT_KINDS[F.EV_THROTTLE_START] == "throttle_start"
