"""Constant-size GPU context of a window: the same few attributes for 1 or 8 GPUs.

A span used to carry the per-GPU detail of every GPU of the process (a list of UUIDs, and
a ``WindowStats`` object built per GPU per span): 8 GPUs cost 5x one GPU on the hot path
and in the encoder. The per-GPU series are in the ``hw.*`` metrics anyway; a span needs
the aggregate, which GPU was the worst, and health flags. :class:`GpuSummarizer` reads the
sampler's raw window tuples (one C query per GPU, no objects built) and the window's
events once for all GPUs, and returns:

====================================== ======== =============================================
attribute                              unit     meaning (over the window)
====================================== ======== =============================================
``otelgpu.gpu.count``                  {gpu}    GPUs with data in the window (always)
``otelgpu.gpu.utilization.mean``       1        mean utilization, mean over GPUs
``otelgpu.gpu.utilization.min``        1        lowest per-GPU mean utilization (several GPUs)
``otelgpu.gpu.utilization.max``        1        highest sample of any GPU
``otelgpu.gpu.memory.utilization.mean`` 1       mean memory-controller utilization
``otelgpu.gpu.memory.peak``            By       highest memory used on any GPU
``otelgpu.gpu.energy``                 J        energy, sum over GPUs
``otelgpu.gpu.energy.source``          --       ``counter`` (NVML energy counter) or ``power``
                                                (integrated power, where any GPU lacks it)
``otelgpu.gpu.temperature.max``        Cel      hottest sample of any GPU
``otelgpu.gpu.samples``                1        samples behind the figures (sum over GPUs)
``hw.id``                              string   the GPU (one GPU)
``otelgpu.gpu.worst.id``               string   the worst GPU (several): lost, else XID or
                                                uncorrected ECC, else most throttled, else
                                                lowest utilization
``otelgpu.gpu.ids``                    string[] the GPUs, only when the caller restricted the
                                                window to some GPUs (e.g. one vLLM engine)
====================================== ======== =============================================

Health flags, only when something happened: ``otelgpu.gpu.throttled_fraction`` (max),
``otelgpu.gpu.throttle_reasons``, ``otelgpu.gpu.xids``, ``otelgpu.gpu.ecc.uncorrected``
(sum), ``otelgpu.gpu.lost`` and, per GPU where it happened, ``otelgpu.gpu.lost.ids`` and
``otelgpu.gpu.throttled.ids``. Missing readings are omitted, never zero-filled.
Thread-safe (no state but the device table); never raises into the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from otelgpu.otel.gpu_context import _FIELDS as _CONTEXT_FIELDS
from otelgpu.sampler import _fields as F
from otelgpu.sampler._types import GPM_WINDOW_FIELDS

_UTIL = F.F_UTIL
_MEMORY = F.F_MEMORY
_ENERGY = F.F_ENERGY
_TEMP = F.F_TEMP
_REASONS = F.F_REASONS
_ECC_UNCORR = F.F_ECC_UNCORR
_XID = "xid"
_GPM = F.F_GPM
#: (GPM slot in the raw window, span attribute): the GPM fields gpu_context names.
_GPM_ATTRIBUTES: tuple[tuple[int, str], ...] = tuple(
    (GPM_WINDOW_FIELDS.index(field), attribute)
    for attribute, field, _combine, _scale in _CONTEXT_FIELDS
    if field in GPM_WINDOW_FIELDS
)


class GpuSummarizer:
    """GPU context of windows of one sampler (see the module docstring)."""

    def __init__(self, sampler: Any) -> None:
        self._sampler = sampler
        self._uuids: tuple[str, ...] = tuple(d.uuid for d in sampler.devices)
        self._index = {u: i for i, u in enumerate(self._uuids)}
        self._reason_names: dict[int, tuple[str, ...]] = {}

    def attributes(
        self, start_ns: int, end_ns: int, devices: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """Span attributes of ``[start_ns, end_ns]`` over all GPUs or ``devices`` (UUIDs)."""
        raws = self._sampler.raw_windows(start_ns, end_ns)
        uuids = self._uuids
        if devices is None:
            picked = [(uuids[i], r) for i, r in enumerate(raws) if r is not None]
        else:
            index = self._index
            picked = [
                (u, raws[i])
                for u in devices
                if (i := index.get(u)) is not None and raws[i] is not None
            ]
        if not picked:
            return {}
        events = self._sampler.events(start_ns, end_ns) if _has_events(self._sampler) else ()
        return self._summarise(picked, events, devices is not None)

    def _summarise(
        self, picked: list[tuple[str, Any]], events: Any, listed: bool
    ) -> dict[str, Any]:
        n = len(picked)
        out: dict[str, Any] = {"otelgpu.gpu.count": n}
        util_sum = 0.0
        util_n = 0
        util_min = None
        util_max = None
        mem_util_sum = 0.0
        peak = None
        energy = None
        energy_power = False
        temp = None
        samples = 0
        tfrac_max = 0.0
        reasons = 0
        eccu = 0
        lost_ids: list[str] = []
        throttled_ids: list[str] = []
        worst: tuple[Any, ...] | None = None
        worst_id = picked[0][0]
        gpm_sums: dict[int, float] = {}
        gpm_counts: dict[int, int] = {}
        for uuid, raw in picked:
            valid = raw[2]
            if valid & _GPM and len(raw) > 29:  # GPM (Hopper and newer): mean over GPUs
                gpm_valid, gpm = raw[28], raw[29]
                for slot, _attribute in _GPM_ATTRIBUTES:
                    if gpm_valid >> slot & 1:
                        gpm_sums[slot] = gpm_sums.get(slot, 0.0) + gpm[slot]
                        gpm_counts[slot] = gpm_counts.get(slot, 0) + 1
            samples += raw[0]
            gmean = None
            if valid & _UTIL:
                gmean = raw[3]
                util_sum += gmean
                mem_util_sum += raw[6]
                util_n += 1
                if util_min is None or gmean < util_min:
                    util_min = gmean
                if util_max is None or raw[5] > util_max:
                    util_max = raw[5]
            if valid & _MEMORY and (peak is None or raw[7] > peak):
                peak = raw[7]
            if valid & _ENERGY:
                energy = raw[11] if energy is None else energy + raw[11]
                energy_power = energy_power or not raw[12]  # integrated power, no counter
            if valid & _TEMP and (temp is None or raw[13] > temp):
                temp = raw[13]
            tfrac = 0.0
            if valid & _REASONS:
                tfrac = raw[16]
                reasons |= raw[15]
                if tfrac > 0:
                    throttled_ids.append(uuid)
                    if tfrac > tfrac_max:
                        tfrac_max = tfrac
            bad_ecc = raw[18] if valid & _ECC_UNCORR else 0
            eccu += bad_ecc
            if raw[1]:
                lost_ids.append(uuid)
            if n > 1:
                score = (bool(raw[1]), bad_ecc > 0, tfrac, -(gmean if gmean is not None else 0.0))
                if worst is None or score > worst:
                    worst, worst_id = score, uuid
        if util_n:
            out["otelgpu.gpu.utilization.mean"] = util_sum / util_n * 0.01
            out["otelgpu.gpu.utilization.max"] = util_max * 0.01  # type: ignore[operator]
            out["otelgpu.gpu.memory.utilization.mean"] = mem_util_sum / util_n * 0.01
            if n > 1:
                out["otelgpu.gpu.utilization.min"] = util_min * 0.01  # type: ignore[operator]
        if peak is not None:
            out["otelgpu.gpu.memory.peak"] = int(peak)
        if energy is not None:
            out["otelgpu.gpu.energy"] = energy
            out["otelgpu.gpu.energy.source"] = "power" if energy_power else "counter"
        if temp is not None:
            out["otelgpu.gpu.temperature.max"] = float(temp)
        out["otelgpu.gpu.samples"] = int(samples)
        for slot, attribute in _GPM_ATTRIBUTES:
            if slot in gpm_counts:
                out[attribute] = gpm_sums[slot] / gpm_counts[slot] * 0.01
        if n == 1:
            out["hw.id"] = worst_id
        else:
            out["otelgpu.gpu.worst.id"] = worst_id
            if listed:
                out["otelgpu.gpu.ids"] = [u for u, _ in picked]
        # ---- health flags: only when something happened
        if tfrac_max > 0:
            out["otelgpu.gpu.throttled_fraction"] = tfrac_max
            if n > 1:
                out["otelgpu.gpu.throttled.ids"] = throttled_ids
        if reasons:
            out["otelgpu.gpu.throttle_reasons"] = list(self._names(reasons))
        if eccu:
            out["otelgpu.gpu.ecc.uncorrected"] = int(eccu)
        if lost_ids:
            out["otelgpu.gpu.lost"] = True
            if n > 1:
                out["otelgpu.gpu.lost.ids"] = lost_ids
        if events:
            wanted = {u for u, _ in picked}
            xids = sorted(
                {
                    int(e.code)
                    for e in events
                    if _kind(e) == _XID and e.uuid in wanted and isinstance(e.code, int)
                }
            )
            if xids:
                out["otelgpu.gpu.xids"] = xids
        return out

    def _names(self, bits: int) -> tuple[str, ...]:
        names = self._reason_names.get(bits)
        if names is None:
            names = tuple(sorted(F.reason_names(bits)))
            if len(self._reason_names) < 1024:
                self._reason_names[bits] = names
        return names


def _kind(event: Any) -> str:
    kind = getattr(event, "kind", None)
    return str(getattr(kind, "value", kind))


def _has_events(sampler: Any) -> bool:
    return callable(getattr(sampler, "events", None))


def summarizer_for(sampler: Any) -> GpuSummarizer | None:
    """A summarizer for ``sampler``, or ``None`` when it lacks ``raw_windows`` (a stand-in
    sampler: the caller then builds the per-GPU context from ``windows()``)."""
    if callable(getattr(sampler, "raw_windows", None)) and getattr(sampler, "devices", None):
        return GpuSummarizer(sampler)
    return None
