"""GPM (GPU Performance Monitoring) part of the simulator's scenario model.

A scenario may give any GPM activity as a percent pattern (device keys below, e.g.
``tensor_activity = 10``); an activity it leaves out is ``ratio x utilization`` with
the ratio of :data:`DEFAULT_RATIOS` (a typical mixed-precision training step). The C
library (``src_ext/sim/sim_gpm.c``) turns them into ``nvmlGpmMetricsGet`` values: the
time average between two GPM samples. Devices older than Hopper, or listing ``"gpm"``
in ``unsupported``, report GPM as unsupported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Scenario device key -> name in the normalized config (index order of sim.h's enum).
GPM_KEYS: dict[str, str] = {
    "sm_activity": "sm_active",
    "sm_occupancy": "sm_occupancy",
    "tensor_activity": "tensor",
    "hmma_activity": "hmma",
    "imma_activity": "imma",
    "dfma_activity": "dfma",
    "dmma_activity": "dmma",
    "dram_activity": "dram",
    "fp16_activity": "fp16",
    "fp32_activity": "fp32",
    "fp64_activity": "fp64",
    "integer_activity": "integer",
}

#: Share of utilization each activity takes when the scenario gives no pattern.
DEFAULT_RATIOS: dict[str, float] = {
    "sm_activity": 0.85,
    "sm_occupancy": 0.45,
    "tensor_activity": 0.55,
    "hmma_activity": 0.55,
    "imma_activity": 0.0,
    "dfma_activity": 0.0,
    "dmma_activity": 0.0,
    "dram_activity": 0.35,
    "fp16_activity": 0.05,
    "fp32_activity": 0.15,
    "fp64_activity": 0.0,
    "integer_activity": 0.1,
}

#: Device key: GPM calls answer NVML_ERROR_NO_PERMISSION (a host restricting profiling).
NO_PERMISSION_KEY = "gpm_no_permission"


def gpm_config(dev: Mapping[str, Any]) -> dict[str, str]:
    """Normalized ``gpu.<i>.*`` lines for a resolved device's GPM activities."""
    out: dict[str, str] = {}
    if dev.get(NO_PERMISSION_KEY):
        out["gpm_no_permission"] = "1"
    for key, name in GPM_KEYS.items():
        pattern = dev.get(key)
        if pattern is not None:
            out[f"gpm.{name}"] = pattern.to_config()
        else:
            out[f"gpm_ratio.{name}"] = repr(DEFAULT_RATIOS[key])
    return out
