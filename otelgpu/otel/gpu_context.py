"""GPU context of a time window as span attributes and span events.

Reads ``GpuSampler.windows(start_ns, end_ns)`` (per-GPU ``WindowStats``) and
``GpuSampler.events(start_ns, end_ns)`` and turns them into attributes:

====================================== ======== =============================================
attribute                              unit     meaning (over the window, all sampled GPUs)
====================================== ======== =============================================
``otelgpu.gpu.utilization.mean``       1        mean GPU utilization (fraction; mean over GPUs)
``otelgpu.gpu.utilization.max``        1        highest sample (fraction)
``otelgpu.gpu.memory.utilization.mean`` 1       mean memory-controller utilization (fraction)
``otelgpu.gpu.memory.peak``            By       highest framebuffer memory used (max over GPUs)
``otelgpu.gpu.energy``                 J        energy consumed (sum over GPUs)
``otelgpu.gpu.energy.source``          string   ``counter`` or ``power`` (integrated power)
``otelgpu.gpu.temperature.max``        Cel      highest GPU temperature sample
``otelgpu.gpu.throttled_fraction``     1        share of samples throttled (only when > 0)
``otelgpu.gpu.throttle_reasons``       string[] clock-throttle reasons seen
``otelgpu.gpu.xids``                   int[]    XID error codes seen
``otelgpu.gpu.ecc.uncorrected``        {error}  new uncorrected ECC errors (only when > 0)
``otelgpu.gpu.lost``                   bool     a GPU was lost (e.g. XID 79)
``otelgpu.gpu.sm.activity``           1        GPM SM activity (fraction; mean over GPUs)
``otelgpu.gpu.sm.occupancy``          1        GPM SM occupancy (fraction)
``otelgpu.gpu.tensor.activity``       1        GPM tensor-pipe activity, any pipe (fraction)
``otelgpu.gpu.dram.activity``         1        GPM DRAM bandwidth utilization (fraction)
``otelgpu.gpu.fp16.activity`` …       1        GPM FP16 / FP32 / FP64 pipe activity (fraction)
``otelgpu.gpu.samples``                1        samples the window statistics are based on
``hw.id`` / ``otelgpu.gpu.ids``        string   UUID of the GPU (one) / UUIDs (several)
====================================== ======== =============================================

Missing readings are omitted, never zero-filled. The sampler's window statistics are
read by field name (``otelgpu.sampler.WindowStats``); a ``None`` field (e.g. energy on a
GPU without an energy counter) leaves its attribute out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

#: attribute -> (WindowStats field, combine over GPUs, factor to the attribute's unit)
_FIELDS: tuple[tuple[str, str, str, float], ...] = (
    # NVML reports percent; the attribute is a fraction (as hw.gpu.utilization).
    ("otelgpu.gpu.utilization.mean", "gpu_util_mean_pct", "mean", 0.01),
    ("otelgpu.gpu.utilization.max", "gpu_util_max_pct", "max", 0.01),
    ("otelgpu.gpu.memory.utilization.mean", "memory_util_mean_pct", "mean", 0.01),
    ("otelgpu.gpu.memory.peak", "memory_used_peak_bytes", "max", 1.0),
    ("otelgpu.gpu.energy", "energy_j", "sum", 1.0),
    ("otelgpu.gpu.temperature.max", "temperature_max_c", "max", 1.0),
    ("otelgpu.gpu.throttled_fraction", "throttled_fraction", "max", 1.0),
    ("otelgpu.gpu.ecc.uncorrected", "ecc_uncorrected_delta", "sum", 1.0),
    ("otelgpu.gpu.samples", "samples", "sum", 1.0),
    # GPM (Hopper and newer; absent elsewhere): what "utilization" hides.
    ("otelgpu.gpu.sm.activity", "sm_activity_pct", "mean", 0.01),
    ("otelgpu.gpu.sm.occupancy", "sm_occupancy_pct", "mean", 0.01),
    ("otelgpu.gpu.tensor.activity", "tensor_activity_pct", "mean", 0.01),
    ("otelgpu.gpu.dram.activity", "dram_activity_pct", "mean", 0.01),
    ("otelgpu.gpu.fp16.activity", "fp16_activity_pct", "mean", 0.01),
    ("otelgpu.gpu.fp32.activity", "fp32_activity_pct", "mean", 0.01),
    ("otelgpu.gpu.fp64.activity", "fp64_activity_pct", "mean", 0.01),
)
_INTEGER = frozenset(
    {"otelgpu.gpu.memory.peak", "otelgpu.gpu.ecc.uncorrected", "otelgpu.gpu.samples"}
)
#: Attributes left out when zero (the common case; keeps spans small and cheap).
_SPARSE = frozenset({"otelgpu.gpu.throttled_fraction", "otelgpu.gpu.ecc.uncorrected"})
#: The one-GPU hot path's view of _FIELDS: (attribute, field, scale, integer, sparse),
#: so no set lookups per field and window.
_SINGLE: tuple[tuple[str, str, float, bool, bool], ...] = tuple(
    (attribute, name, scale, attribute in _INTEGER, attribute in _SPARSE)
    for attribute, name, _combine, scale in _FIELDS
)


def _number(stats: Any, name: str) -> float | None:
    value = getattr(stats, name, None)
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return value
    return None


def window_attributes(windows: Mapping[str, Any]) -> dict[str, Any]:
    """Span attributes for per-GPU window statistics (``{uuid: WindowStats}``).

    Cost: a few microseconds for one GPU (the common case: one rank, one GPU).
    """
    stats = [(uuid, w) for uuid, w in windows.items() if w is not None]
    if not stats:
        return {}
    out: dict[str, Any] = {}
    if len(stats) == 1:
        uuid, w = stats[0]
        out["hw.id"] = uuid
        for attribute, name, scale, integer, sparse in _SINGLE:
            # WindowStats fields are numbers or None (sampler contract): no type checks here.
            v = getattr(w, name, None)
            if v is None or (sparse and not v):
                continue
            out[attribute] = int(v) if integer else v * scale
    else:
        out["otelgpu.gpu.ids"] = [uuid for uuid, _ in stats]
        for attribute, name, combine, scale in _FIELDS:
            values = [v for _, w in stats if (v := _number(w, name)) is not None]
            if not values:
                continue
            if combine == "mean":
                value = sum(values) / len(values)
            elif combine == "sum":
                value = sum(values)
            else:
                value = max(values)
            if not value and attribute in _SPARSE:
                continue
            out[attribute] = int(value) if attribute in _INTEGER else value * scale
    sources = {getattr(w, "energy_source", None) for _, w in stats} - {None}
    if sources and "otelgpu.gpu.energy" in out:
        out["otelgpu.gpu.energy.source"] = "power" if "power" in sources else "counter"
    reasons: set[str] = set()
    xids: set[int] = set()
    lost = False
    for _, w in stats:
        names = getattr(w, "throttle_reason_names", None)
        if names:
            reasons.update(_strings(names))
        codes = getattr(w, "xids", None)
        if codes:
            xids.update(int(x) for x in codes)
        lost = lost or bool(getattr(w, "lost", False))
    if reasons:
        out["otelgpu.gpu.throttle_reasons"] = sorted(reasons)
    if xids:
        out["otelgpu.gpu.xids"] = sorted(xids)
    if lost:
        out["otelgpu.gpu.lost"] = True
    return out


def _strings(value: Any) -> Iterable[str]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, int):  # a bit mask without names
        return (f"0x{value:x}",) if value else ()
    return (str(v) for v in value)


def event_kind(event: Any) -> str:
    """The kind of a ``GpuEvent`` (``xid``, ``ecc_uncorrected``, ``device_lost``, ``throttle``…)."""
    kind = getattr(event, "kind", None)
    return str(getattr(kind, "value", kind) or "gpu_event")


def event_attributes(event: Any) -> dict[str, Any]:
    """Attributes of one GPU health event as a span event / log record."""
    out: dict[str, Any] = {"otelgpu.gpu.event": event_kind(event)}
    uuid = getattr(event, "uuid", None)
    if uuid:
        out["hw.id"] = str(uuid)
    if out["otelgpu.gpu.event"] == "xid" and isinstance(getattr(event, "code", None), int):
        out["otelgpu.gpu.xid"] = event.code
    for name in ("code", "detail"):
        value = getattr(event, name, None)
        if isinstance(value, bool | int | float | str) and value != "":
            out[f"otelgpu.gpu.event.{name}"] = value
    return out


def event_time_ns(event: Any) -> int | None:
    for name in ("time_ns", "timestamp_ns", "t_ns"):
        value = getattr(event, name, None)
        if isinstance(value, int):
            return value
    return None
