"""Constant-size GPU context of a window: the same few attributes for 1 or 8 GPUs.

A span used to carry the per-GPU detail of every GPU of the process (a list of UUIDs, and
a ``WindowStats`` object built per GPU per span): 8 GPUs cost 5x one GPU on the hot path
and in the encoder. The per-GPU series are in the ``hw.*`` metrics anyway; a span needs
the aggregate, which GPU was the worst, and health flags. :class:`GpuSummarizer` asks the
sampler for one ``RawSummary`` of the window over all GPUs (``GpuSampler.summary``: one
call into the native core, which aggregates in C; the pure core follows the same rules)
and returns:

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

from collections.abc import Callable, Sequence
from typing import Any

from otelgpu import _impl
from otelgpu.otel.gpu_context import _FIELDS as _CONTEXT_FIELDS
from otelgpu.sampler import _fields as F
from otelgpu.sampler._records import RawSummary
from otelgpu.sampler._types import GPM_WINDOW_FIELDS

_UTIL = F.F_UTIL
_MEMORY = F.F_MEMORY
_ENERGY = F.F_ENERGY
_TEMP = F.F_TEMP
#: (GPM slot in the summary, span attribute): the GPM fields gpu_context names.
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
        self._reason_names: dict[int, tuple[str, ...]] = {}

    def summary(
        self, start_ns: int, end_ns: int, devices: Sequence[str] | None = None
    ) -> RawSummary | None:
        """The sampler's ``RawSummary`` of ``[start_ns, end_ns]`` (all GPUs or ``devices``)."""
        return self._sampler.summary(start_ns, end_ns, devices)  # type: ignore[no-any-return]

    def attributes(
        self, start_ns: int, end_ns: int, devices: Sequence[str] | None = None
    ) -> dict[str, Any]:
        """Span attributes of ``[start_ns, end_ns]`` over all GPUs or ``devices`` (UUIDs)."""
        raw = self._sampler.summary(start_ns, end_ns, devices)
        return {} if raw is None else self.summary_attributes(raw, devices is not None)

    def attributes_and_events(
        self, start_ns: int, end_ns: int, devices: Sequence[str] | None = None
    ) -> tuple[dict[str, Any], list[Any]]:
        """:meth:`attributes` and the window's events (all GPUs: the caller filters), read
        with one sampler call (``summary_and_events``) where the sampler has it."""
        combined = getattr(self._sampler, "summary_and_events", None)
        if combined is None:  # a stand-in sampler with summary() and events() only
            return self.attributes(start_ns, end_ns, devices), list(
                self._sampler.events(start_ns, end_ns)
            )
        raw, events = combined(start_ns, end_ns, devices)
        if raw is None:
            return {}, events
        listed = devices is not None
        return summary_attributes(raw, self._uuids, listed, _GPM_ATTRIBUTES, self._names), events

    def summary_attributes(self, raw: RawSummary, listed: bool) -> dict[str, Any]:
        """Span attributes of a ``RawSummary``; ``listed``: the caller chose the GPUs
        (their UUIDs are then listed in ``otelgpu.gpu.ids``)."""
        return summary_attributes(raw, self._uuids, listed, _GPM_ATTRIBUTES, self._names)

    def _names(self, bits: int) -> tuple[str, ...]:
        names = self._reason_names.get(bits)
        if names is None:
            names = tuple(sorted(F.reason_names(bits)))
            if len(self._reason_names) < 1024:
                self._reason_names[bits] = names
        return names


def py_summary_attributes(
    raw: RawSummary,
    uuids: Sequence[str],
    listed: bool,
    gpm_attributes: Sequence[tuple[int, str]],
    names: Callable[[int], Sequence[str]],
) -> dict[str, Any]:
    """Span attributes of ``raw`` (module docstring): ``uuids`` by sampler device index,
    ``listed`` when the caller chose the GPUs, ``gpm_attributes`` the (GPM slot, attribute)
    pairs, ``names(bits)`` the throttle reason names. The pure-Python twin of
    ``otelgpu.sampler._sampler_c.summary_attributes``."""
    n = raw.n_devices
    out: dict[str, Any] = {"otelgpu.gpu.count": n}
    valid = raw.valid
    if valid & _UTIL:
        out["otelgpu.gpu.utilization.mean"] = raw.gpu_util_mean * 0.01
        out["otelgpu.gpu.utilization.max"] = raw.gpu_util_max * 0.01
        out["otelgpu.gpu.memory.utilization.mean"] = raw.mem_util_mean * 0.01
        if n > 1:
            out["otelgpu.gpu.utilization.min"] = raw.gpu_util_min * 0.01
    if valid & _MEMORY:
        out["otelgpu.gpu.memory.peak"] = int(raw.mem_used_peak)
    if valid & _ENERGY:
        out["otelgpu.gpu.energy"] = raw.energy_j
        out["otelgpu.gpu.energy.source"] = "counter" if raw.energy_from_counter else "power"
    if valid & _TEMP:
        out["otelgpu.gpu.temperature.max"] = float(raw.temp_max)
    out["otelgpu.gpu.samples"] = int(raw.samples)
    gpm_valid = raw.gpm_valid
    if gpm_valid:
        gpm = raw.gpm
        for slot, attribute in gpm_attributes:
            if gpm_valid >> slot & 1:
                out[attribute] = gpm[slot] * 0.01
    if n == 1:
        out["hw.id"] = uuids[raw.worst]
    else:
        out["otelgpu.gpu.worst.id"] = uuids[raw.worst]
        if listed:
            out["otelgpu.gpu.ids"] = [uuids[i] for i in raw.devices]
    # ---- health flags: only when something happened
    if raw.throttled_fraction > 0:
        out["otelgpu.gpu.throttled_fraction"] = raw.throttled_fraction
        if n > 1:
            out["otelgpu.gpu.throttled.ids"] = [uuids[i] for i in raw.throttled]
    if raw.reasons:
        out["otelgpu.gpu.throttle_reasons"] = list(names(raw.reasons))
    if raw.ecc_uncorr_delta:
        out["otelgpu.gpu.ecc.uncorrected"] = int(raw.ecc_uncorr_delta)
    if raw.lost:
        out["otelgpu.gpu.lost"] = True
        if n > 1:
            out["otelgpu.gpu.lost.ids"] = [uuids[i] for i in raw.lost]
    if raw.xids:
        out["otelgpu.gpu.xids"] = list(raw.xids)
    return out


_native = _impl.native_module("otelgpu.sampler._sampler_c")
#: :func:`py_summary_attributes`, native when the core loaded (same result).
summary_attributes: Callable[..., dict[str, Any]] = (
    _native.summary_attributes if _native is not None else py_summary_attributes
)


def summarizer_for(sampler: Any) -> GpuSummarizer | None:
    """A summarizer for ``sampler``, or ``None`` when it lacks ``summary`` or has no
    devices yet (a stand-in sampler, or one still starting: the caller then builds the
    per-GPU context from ``windows()``)."""
    if callable(getattr(sampler, "summary", None)) and getattr(sampler, "devices", None):
        return GpuSummarizer(sampler)
    return None
