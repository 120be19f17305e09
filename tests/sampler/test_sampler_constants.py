"""The C header and the pure twin share one contract: field bits, field table, masks."""

from __future__ import annotations

import re
from pathlib import Path

from otelgpu.sampler import _fields as F

HEADER = (Path(__file__).resolve().parents[2] / "src_ext" / "sampler" / "otg_sampler.h").read_text()


def _define(name: str) -> int:
    m = re.search(rf"#define {name} \(?([0-9a-fA-Fx]+)u?(?: << (\d+))?\)?", HEADER)
    assert m, name
    value = int(m.group(1).rstrip("ul"), 0)
    return value << int(m.group(2)) if m.group(2) else value


def test_field_bits_agree() -> None:
    for name in (
        "UTIL", "MEMORY", "POWER", "ENERGY", "TEMP", "SM_CLOCK", "MEM_CLOCK", "REASONS",
        "THR0", "PCIE_TX", "PCIE_RX", "NVLINK_TX", "NVLINK_RX", "ECC_CORR", "ECC_UNCORR",
        "FAN", "PSTATE", "ALL",
    ):  # fmt: skip
        assert _define(f"OTG_F_{name}") == getattr(F, f"F_{name}"), name
    assert _define("OTG_THROTTLE_MASK") == F.THROTTLE_MASK
    assert _define("OTG_ENERGY_MIN_SPAN_NS") == F.ENERGY_MIN_SPAN_NS
    assert _define("OTG_WAIT_MS") == F.WAIT_MS
    for k, kind in enumerate(("XID", "ECC_UNCORRECTED", "DEVICE_LOST", "THROTTLE_START")):
        assert _define(f"OTG_EV_{kind}") == k == getattr(F, f"EV_{kind}")


def test_field_table_agrees() -> None:
    table = HEADER[HEADER.index("OTG_FIELD_TABLE[OTG_NFIELDS] = {") :]
    table = table[: table.index("};")]
    entries = re.findall(r"\{(\d+), (0|OTG_SCOPE_ALL_LINKS), (OTG_F_\w+(?: << \d)?)\}", table)
    assert len(entries) == len(F.FIELD_TABLE) == _define("OTG_NFIELDS")
    for (fid, scope, bit), (pid, pscope, pbit) in zip(entries, F.FIELD_TABLE, strict=True):
        assert int(fid) == pid
        assert (F.SCOPE_ALL_LINKS if scope != "0" else 0) == pscope
        name, _, shift = bit.partition(" << ")
        assert _define(name) << int(shift or 0) == pbit
    assert F.reason_names(0x48) == ("hw_slowdown", "hw_thermal_slowdown")
    assert F.reason_names(0x1000) == ("0x1000",)
