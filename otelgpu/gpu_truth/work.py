"""MFU and energy per unit of work: what the step and request recorders add to a span.

Per training step (``otelgpu.step()``, the torch instrumentor):

=========================================== ====== ==========================================
span attribute / sketch metric               unit   meaning
=========================================== ====== ==========================================
``otelgpu.train.flops`` (span)               FLOP   model FLOPs of the step (given or counted)
``otelgpu.train.mfu`` / same sketch          1      flops / (duration x peak FLOP/s of its GPUs)
``otelgpu.train.step.energy`` (sketch)       J      the step's energy (span: ``otelgpu.gpu.energy``)
``otelgpu.train.energy.per_sample`` / same   J      energy / samples
``otelgpu.train.energy.per_token`` / same    J      energy / tokens
=========================================== ====== ==========================================

Per inference request: ``otelgpu.inference.request.energy`` (sketch, J),
``otelgpu.request.energy.per_output_token`` (span) / ``otelgpu.inference.energy.per_output_token``
(sketch).

Everything is read from the span's GPU context (``GpuContext.attributes``: constant size
for 1 or 8 GPUs): energy is ``otelgpu.gpu.energy``, the sampler's window summed over the
step's or request's GPUs -- the difference of NVML's energy counter where the GPU has one,
integrated power only where it does not, as ``otelgpu.gpu.energy.source`` says. A
request's window is the GPUs' energy while it ran, shared with the requests batched
alongside it.

**MFU / tensor-activity disagreement.** Where GPM tensor activity ``a`` (fraction, mean
over the GPUs) and MFU ``m`` are both known, a step is flagged (span event
``otelgpu.train.mfu.mismatch``, counter ``otelgpu.train.mfu.mismatches``) when

* ``m > a + 0.15`` (``reason=mfu_above_tensor_activity``): more model FLOPs than the
  tensor pipes could have executed -- the FLOP count or the peak is wrong; or
* ``a >= 0.4`` and ``m < a / 4`` (``reason=tensor_activity_without_model_flops``): busy
  tensor pipes doing little model work -- recomputation, padding, a slow dtype.

Never raises into the caller's thread: the recorders wrap it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.trace import Span

from otelgpu.gpu_truth import peaks
from otelgpu.metrics import catalog
from otelgpu.metrics.spec import MetricSpec

#: The disagreement rule's thresholds (see the module docstring).
MFU_ABOVE_MARGIN = 0.15
BUSY_TENSOR = 0.4
BUSY_RATIO = 4.0


def mismatch_reason(mfu: float, tensor_activity: float) -> str | None:
    """The disagreement rule (module docstring): a reason, or ``None`` when they agree."""
    if mfu > tensor_activity + MFU_ABOVE_MARGIN:
        return "mfu_above_tensor_activity"
    if tensor_activity >= BUSY_TENSOR and mfu < tensor_activity / BUSY_RATIO:
        return "tensor_activity_without_model_flops"
    return None


class WorkAccounting:
    """Per-step and per-request MFU and energy figures (attributes + sketches).

    Args:
        instrument: ``Runtime.instrument`` (creates the catalog's instruments).
        device_names: ``{uuid: NVML product name}`` of the sampled GPUs (peak lookup).
        peak_flops: the ``peak_flops`` setting (FLOP/s per GPU; wins over the table).
        dtype: the ``mfu_dtype`` setting (column of the peak table).

    Thread-safe (read-only state; the instruments are thread-safe).
    """

    def __init__(
        self,
        instrument: Callable[[MetricSpec], Any],
        device_names: Callable[[], Mapping[str, str]],
        *,
        peak_flops: float | None = None,
        dtype: str = "bf16",
    ) -> None:
        self._device_names = device_names
        self._names: Mapping[str, str] | None = None
        self.peak_override = peak_flops
        self.dtype = dtype
        self._mfu = instrument(catalog.TRAIN_MFU)
        self._mismatches = instrument(catalog.TRAIN_MFU_MISMATCHES)
        self._step_energy = instrument(catalog.TRAIN_STEP_ENERGY)
        self._per_sample = instrument(catalog.TRAIN_ENERGY_PER_SAMPLE)
        self._per_token = instrument(catalog.TRAIN_ENERGY_PER_TOKEN)
        self._request_energy = instrument(catalog.REQUEST_ENERGY)
        self._per_output_token = instrument(catalog.ENERGY_PER_OUTPUT_TOKEN)

    def peak(self, context: Mapping[str, Any]) -> float | None:
        """Peak FLOP/s of the context's GPUs together (one GPU without a GPU context)."""
        count = int(context.get("otelgpu.gpu.count") or 1)
        if self.peak_override is not None:
            return self.peak_override * count
        if "otelgpu.gpu.count" not in context:
            return None
        if self._names is None:
            self._names = dict(self._device_names())
        names = self._names
        one = context.get("hw.id")
        listed = context.get("otelgpu.gpu.ids")
        if one is not None:
            models = [names.get(str(one), "")]
        elif listed:
            models = [names.get(str(u), "") for u in listed]
        elif len(set(names.values())) == 1:  # all sampled GPUs, one model: the usual node
            models = [next(iter(names.values()))] * count
        else:
            return None
        total = 0.0
        for name in models:
            peak = peaks.peak_flops(name, self.dtype)
            if peak is None:
                return None
            total += peak
        return total

    def step(
        self,
        span: Span | None,
        context: Mapping[str, Any],
        duration_s: float,
        samples: float | None,
        tokens: float | None,
        flops: float | None,
        metric_attrs: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        """Span attributes of one step; records the sketches; adds the mismatch event."""
        out: dict[str, Any] = {}
        joules = context.get("otelgpu.gpu.energy")
        if joules is not None:
            self._step_energy.record(joules, metric_attrs)
            if samples:
                out["otelgpu.train.energy.per_sample"] = per = joules / samples
                self._per_sample.record(per, metric_attrs)
            if tokens:
                out["otelgpu.train.energy.per_token"] = per = joules / tokens
                self._per_token.record(per, metric_attrs)
        if flops and duration_s > 0:
            out["otelgpu.train.flops"] = flops
            peak = self.peak(context)
            if peak:
                mfu = flops / (duration_s * peak)
                out["otelgpu.train.mfu"] = mfu
                self._mfu.record(mfu, metric_attrs)
                activity = context.get("otelgpu.gpu.tensor.activity")
                if activity is not None:
                    self._check(span, mfu, float(activity), metric_attrs)
        return out

    def _check(
        self,
        span: Span | None,
        mfu: float,
        activity: float,
        metric_attrs: Mapping[str, Any] | None,
    ) -> None:
        reason = mismatch_reason(mfu, activity)
        if reason is None:
            return
        labels = {**(metric_attrs or {}), "otelgpu.train.mfu.mismatch.reason": reason}
        self._mismatches.add(1, labels)
        if span is not None and span.is_recording():
            span.add_event(
                "otelgpu.train.mfu.mismatch",
                {
                    "otelgpu.train.mfu": mfu,
                    "otelgpu.gpu.tensor.activity": activity,
                    "otelgpu.train.mfu.mismatch.reason": reason,
                },
            )

    def request(
        self,
        context: Mapping[str, Any],
        output_tokens: int,
        metric_attrs: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        """Span attributes of one request; records the energy sketches."""
        joules = context.get("otelgpu.gpu.energy")
        if joules is None:
            return {}
        out: dict[str, Any] = {}
        self._request_energy.record(joules, metric_attrs)
        if output_tokens:
            out["otelgpu.request.energy.per_output_token"] = per = joules / output_tokens
            self._per_output_token.record(per, metric_attrs)
        return out


__all__ = ["WorkAccounting", "mismatch_reason"]
