"""What a recorded run means: phases, throughput, GPU summary, energy and the verdict.

Pure functions over :class:`otelgpu.report.model.Run`; the text report, the HTML report
and the comparison all read these, so they never disagree. Whatever the run did not record
(no phases, no GPU, no inference) comes back empty or ``None`` -- never zero-filled.

Phases are read from the step spans' attributes: the diagnosis phases
(``otelgpu.train.phase.<name>``, seconds) when present, else the torch instrumentation's
``otelgpu.train.data.wait`` / ``comm.wait`` / ``checkpoint`` / ``compute``. Shares are
totals over the recorded steps divided by their total duration; what no phase explains
is ``other``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from otelgpu.report.model import Record, Run

QUANTILES = (0.5, 0.95, 0.99)

#: phase -> span attributes that carry it (seconds), first found wins.
PHASE_ATTRIBUTES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("data", ("otelgpu.train.phase.data", "otelgpu.train.data.wait")),
    ("forward", ("otelgpu.train.phase.forward",)),
    ("backward", ("otelgpu.train.phase.backward",)),
    ("optimizer", ("otelgpu.train.phase.optimizer",)),
    (
        "communication",
        (
            "otelgpu.train.phase.communication",
            "otelgpu.train.phase.comm",
            "otelgpu.train.comm.wait",
        ),
    ),
    ("checkpoint", ("otelgpu.train.phase.checkpoint", "otelgpu.train.checkpoint")),
    ("compute", ("otelgpu.train.compute",)),  # only when forward/backward are not split
)
PHASE_PREFIX = "otelgpu.train.phase."

ERROR_RATE_ALERT = 0.05

GPU_GAUGES = {
    "utilization": "hw.gpu.utilization",
    "memory": "otelgpu.gpu.memory.watermark",
    "power": "hw.power",
    "temperature": "hw.temperature",
    "throttle": "otelgpu.gpu.throttle.fraction",
}


def is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# ---------------------------------------------------------------------- phases
def phase_totals(run: Run) -> dict[str, float]:
    """Seconds per phase summed over the recorded step spans (``other`` = unexplained)."""
    return phase_totals_of(run.steps)


def phase_totals_of(steps: Sequence[Record]) -> dict[str, float]:
    """:func:`phase_totals` of a list of step records; ``_duration`` = their total time."""
    totals: dict[str, float] = {}
    duration = 0.0
    split = any(
        k.startswith(PHASE_PREFIX) and k.split(".")[-1] in ("forward", "backward")
        for r in steps[:50]
        for k in r.attributes
    )
    for record in steps:
        attrs = record.attributes
        seen: set[str] = set()
        explained = 0.0
        for phase, keys in PHASE_ATTRIBUTES:
            if phase == "compute" and split:
                continue
            for key in keys:
                value = attrs.get(key)
                if is_number(value):
                    totals[phase] = totals.get(phase, 0.0) + float(value)
                    explained += float(value)
                    seen.update(keys)
                    break
        for key, value in attrs.items():
            if key.startswith(PHASE_PREFIX) and key not in seen and is_number(value):
                name = key.removeprefix(PHASE_PREFIX)
                if name in ("share", "shares") or "." in name:
                    continue
                totals[name] = totals.get(name, 0.0) + float(value)
                explained += float(value)
        if explained > 0:
            duration += record.duration_s
            totals["other"] = totals.get("other", 0.0) + max(0.0, record.duration_s - explained)
    if not totals or duration <= 0:
        return {}
    totals["_duration"] = duration
    return totals


def phase_shares(run: Run | Sequence[Record]) -> list[tuple[str, float, float]]:
    """``(phase, total seconds, share of step time)``, largest first; empty without phases."""
    totals = phase_totals_of(run.steps if isinstance(run, Run) else run)
    duration = totals.pop("_duration", 0.0)
    if not duration:
        return []
    rows = [(p, s, s / duration) for p, s in totals.items() if s > 0 or p != "other"]
    return sorted(rows, key=lambda r: -r[1])


# ---------------------------------------------------------------------- training
@dataclass
class Training:
    steps: int
    recorded_steps: int
    step_quantiles: tuple[float, ...]
    samples_per_s: float | None
    tokens_per_s: float | None
    phases: list[tuple[str, float, float]]
    mfu: float | None
    throttled_step_share: float | None
    throttle_reasons: list[str]
    joules_per_token: float | None
    joules_per_step: float | None


def training(run: Run) -> Training | None:
    sketch = run.merged_sketch("otelgpu.train.step.duration")
    if sketch is None and not run.steps:
        return None
    steps = int(run.counter_total("otelgpu.train.steps")) or (sketch.count if sketch else 0)
    quantiles = tuple(sketch.quantiles(list(QUANTILES))) if sketch else ()
    total_s = sum(r.duration_s for r in run.steps)
    samples = sum(float(r.attributes.get("otelgpu.train.samples", 0) or 0) for r in run.steps)
    tokens = sum(float(r.attributes.get("otelgpu.train.tokens", 0) or 0) for r in run.steps)
    mfus = [float(v) for r in run.steps if is_number(v := r.attributes.get("otelgpu.train.mfu"))]
    throttled = [
        r for r in run.steps if (r.attributes.get("otelgpu.gpu.throttled_fraction") or 0) > 0
    ]
    reasons = sorted(
        {
            str(x)
            for r in throttled
            for x in (r.attributes.get("otelgpu.gpu.throttle_reasons") or ())
        }
    )
    energies = [
        float(v) for r in run.steps if is_number(v := r.attributes.get("otelgpu.gpu.energy"))
    ]
    energy_tokens = sum(
        float(r.attributes.get("otelgpu.train.tokens", 0) or 0)
        for r in run.steps
        if is_number(r.attributes.get("otelgpu.gpu.energy"))
    )
    return Training(
        steps=steps,
        recorded_steps=len(run.steps),
        step_quantiles=quantiles,
        samples_per_s=samples / total_s if samples and total_s else None,
        tokens_per_s=tokens / total_s if tokens and total_s else None,
        phases=phase_shares(run),
        mfu=sum(mfus) / len(mfus) if mfus else None,
        throttled_step_share=len(throttled) / len(run.steps) if run.steps else None,
        throttle_reasons=reasons,
        joules_per_token=sum(energies) / energy_tokens if energies and energy_tokens else None,
        joules_per_step=sum(energies) / len(energies) if energies else None,
    )


# ---------------------------------------------------------------------- inference
@dataclass
class Inference:
    requests: int
    outcomes: dict[str, int]
    error_types: dict[str, int]
    latency: tuple[float, ...]
    ttft: tuple[float, ...]
    tpot: tuple[float, ...]
    queue: tuple[float, ...]
    output_tokens: float
    requests_per_s: float | None
    tokens_per_s: float | None
    joules_per_output_token: float | None

    @property
    def error_rate(self) -> float:
        bad = sum(n for k, n in self.outcomes.items() if k != "ok")
        return bad / self.requests if self.requests else 0.0


def _quantiles(run: Run, name: str) -> tuple[float, ...]:
    sketch = run.merged_sketch(name)
    return tuple(sketch.quantiles(list(QUANTILES))) if sketch is not None and sketch.count else ()


def inference(run: Run) -> Inference | None:
    latency = run.merged_sketch("gen_ai.server.request.duration")
    if latency is None and not run.requests:
        return None
    outcomes: dict[str, int] = {}
    for s in run.counter_series("otelgpu.inference.requests"):
        outcome = str(s.attributes.get("otelgpu.request.outcome", "ok"))
        outcomes[outcome] = outcomes.get(outcome, 0) + int(s.last)
    if not outcomes:
        for r in run.requests:
            o = str(r.attributes.get("otelgpu.request.outcome", "ok"))
            outcomes[o] = outcomes.get(o, 0) + 1
    error_types: dict[str, int] = {}
    for r in run.requests:
        if "error.type" in r.attributes:
            e = str(r.attributes["error.type"])
            error_types[e] = error_types.get(e, 0) + 1
    total = sum(outcomes.values()) or (latency.count if latency is not None else 0)
    output_tokens = run.counter_total("otelgpu.inference.tokens", {"gen_ai.token.type": "output"})
    if not output_tokens:
        output_tokens = sum(
            float(r.attributes.get("gen_ai.usage.output_tokens", 0) or 0) for r in run.requests
        )
    span_s = (
        max(r.end_s for r in run.requests) - min(r.end_s - r.duration_s for r in run.requests)
        if run.requests
        else 0.0
    )
    return Inference(
        requests=total,
        outcomes=outcomes,
        error_types=error_types,
        latency=_quantiles(run, "gen_ai.server.request.duration"),
        ttft=_quantiles(run, "gen_ai.server.time_to_first_token"),
        tpot=_quantiles(run, "gen_ai.server.time_per_output_token"),
        queue=_quantiles(run, "otelgpu.inference.queue.duration"),
        output_tokens=output_tokens,
        requests_per_s=len(run.requests) / span_s if span_s > 0 else None,
        tokens_per_s=output_tokens / span_s if span_s > 0 and output_tokens else None,
        joules_per_output_token=_inference_energy(run, output_tokens),
    )


def _inference_energy(run: Run, output_tokens: float) -> float | None:
    """GPU energy over the serving period (hw.energy counter deltas) per output token."""
    if not run.requests or not output_tokens:
        return None
    start = min(r.end_s - r.duration_s for r in run.requests)
    end = max(r.end_s for r in run.requests)
    total = 0.0
    found = False
    for s in run.counter_series("hw.energy"):
        before = [v for t, v in s.points if t <= start]
        after = [v for t, v in s.points if t >= end]
        if before and after and after[0] >= before[-1]:
            # the export points around the period: scale the delta to the period's length
            t_before = max(t for t, _ in s.points if t <= start)
            t_after = min(t for t, _ in s.points if t >= end)
            if t_after > t_before:
                total += (after[0] - before[-1]) * (end - start) / (t_after - t_before)
                found = True
    return total / output_tokens if found else None


# ---------------------------------------------------------------------- GPUs
@dataclass
class GpuSummary:
    uuid: str
    name: str
    utilization_mean: float | None = None
    utilization_max: float | None = None
    tensor_activity_mean: float | None = None
    memory_peak_bytes: float | None = None
    memory_limit_bytes: float | None = None
    power_mean_w: float | None = None
    power_max_w: float | None = None
    temperature_max_c: float | None = None
    throttle_share: float | None = None
    energy_j: float | None = None
    xids: dict[str, int] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)


def _points(run: Run, name: str, uuid: str, where: Mapping[str, Any] | None = None) -> list[float]:
    values: list[float] = []
    for s in run.gauge_series(name):
        if str(s.attributes.get("hw.id")) != uuid:
            continue
        if where and any(s.attributes.get(k) != v for k, v in where.items()):
            continue
        values.extend(v for _, v in s.points if math.isfinite(v))
    return values


def tensor_gauges(run: Run) -> list[str]:
    """Names of per-GPU gauges that report tensor-core activity (GPM, when sampled)."""
    return sorted(
        {s.name for s in run.gauges.values() if "tensor" in s.name and "hw.id" in s.attributes}
    )


def gpus(run: Run) -> list[GpuSummary]:
    names = run.gpu_names()
    out = []
    tensor = tensor_gauges(run)
    for uuid in run.gpus():
        g = GpuSummary(uuid, names.get(uuid, ""))
        util = _points(run, "hw.gpu.utilization", uuid, {"hw.gpu.task": "general"}) or _points(
            run, "hw.gpu.utilization", uuid
        )
        if util:
            g.utilization_mean, g.utilization_max = sum(util) / len(util), max(util)
        if tensor:
            # the "any pipe" series when the GPM feed splits tensor activity by pipe
            t = _points(run, tensor[0], uuid, {"otelgpu.gpu.tensor.pipe": "any"}) or _points(
                run, tensor[0], uuid
            )
            g.tensor_activity_mean = sum(t) / len(t) if t else None
        mem = _points(run, "otelgpu.gpu.memory.watermark", uuid)
        g.memory_peak_bytes = max(mem) if mem else None
        for s in run.counter_series("hw.gpu.memory.limit"):
            if str(s.attributes.get("hw.id")) == uuid and s.points:
                g.memory_limit_bytes = s.last
        power = _points(run, "hw.power", uuid)
        if power:
            g.power_mean_w, g.power_max_w = sum(power) / len(power), max(power)
        temp = _points(run, "hw.temperature", uuid)
        g.temperature_max_c = max(temp) if temp else None
        thr = _points(
            run, "otelgpu.gpu.throttle.fraction", uuid, {"otelgpu.gpu.throttle.reason": "any"}
        )
        g.throttle_share = sum(thr) / len(thr) if thr else None
        for s in run.counter_series("hw.energy"):
            if str(s.attributes.get("hw.id")) == uuid and len(s.points) > 1:
                g.energy_j = s.points[-1][1] - s.points[0][1]
        for s in run.counter_series("otelgpu.gpu.xid"):
            if str(s.attributes.get("hw.id")) == uuid and s.last:
                g.xids[str(s.attributes.get("otelgpu.gpu.xid.code", "?"))] = int(s.last)
        for e in run.gpu_events:
            if e.uuid == uuid:
                g.events[e.kind] = g.events.get(e.kind, 0) + 1
        out.append(g)
    return out


# ---------------------------------------------------------------------- verdict
@dataclass
class Verdict:
    """One line that answers "what held this run back", with its evidence and advice."""

    label: str  # e.g. "INPUT-BOUND"
    headline: str  # "input wait took 26 % of step time"
    advice: str
    evidence: list[str] = field(default_factory=list)
    source: str = "derived"  # "recorded" (diagnosis wrote it) | "derived" (from this report)

    def line(self) -> str:
        text = f"{self.label} — {self.headline}"
        return f"{text} — {self.advice}" if self.advice else text


_VERDICT_KEYS = ("verdict", "bottleneck", "class")
_TEXT_KEYS = ("summary", "text", "message", "headline", "line")


VERDICT_JSON = "otelgpu.verdict.json"

_CLASS_TEXT = {
    # bottleneck -> (label, headline template over the phase shares, advice)
    "input": ("INPUT-BOUND", "input wait took {data} of step time",
              "increase DataLoader workers, prefetch or storage throughput"),
    "communication": ("COMMUNICATION-BOUND", "collectives blocked {comm} of step time",
                      "overlap communication with compute, check the interconnect and slow ranks"),
    "checkpoint": ("CHECKPOINT-BOUND", "checkpoint writes took {checkpoint} of step time",
                   "checkpoint less often or asynchronously, or to faster storage"),
    "host": ("HOST-BOUND", "host time outside the measured phases took {other} of step time",
             "profile the Python side: transforms, logging, synchronisation"),
    "compute": ("COMPUTE-BOUND", "forward, backward and optimizer took {compute} of step time",
                "speed up the model (mixed precision, fused kernels, larger batches)"),
}  # fmt: skip


def _diagnosis_verdict(attrs: dict[str, Any]) -> Verdict | None:
    """The diagnosis' verdict span (``otelgpu.verdict.json``, version 1) as a card."""
    import json

    try:
        d = json.loads(str(attrs[VERDICT_JSON]))
        shares = {str(k): float(v) for k, v in (d.get("phase_shares") or {}).items()}
        cls = str(d.get("bottleneck", "unknown"))
    except (ValueError, TypeError, AttributeError):
        return None
    values = {p: _pct(s) for p, s in shares.items()}
    values["compute"] = _pct(sum(shares.get(p, 0.0) for p in ("forward", "backward", "optimizer")))
    for p in ("data", "comm", "checkpoint", "other"):
        values.setdefault(p, "0 %")
    label, headline, advice = _CLASS_TEXT.get(
        cls, ("STEPS", f"{d.get('steps', 0)} steps: not enough to tell", "")
    )
    evidence = [
        f"{p} {_pct(s)}" for p, s in sorted(shares.items(), key=lambda kv: -kv[1]) if s >= 0.005
    ]
    evidence.extend(
        f"straggler: rank {s.get('rank')} on {s.get('host') or '?'}: {s.get('cause')}"
        + (f" ({'; '.join(s.get('evidence') or [])})" if s.get("evidence") else "")
        for s in (d.get("stragglers") or [])[-4:]
    )
    evidence.extend(
        str(m).removeprefix("otelgpu: ")
        for key in ("drift", "creep", "dips")
        for m in (d.get(key) or [])[-2:]
    )
    gpu = d.get("gpu") or {}
    if gpu.get("throttled_fraction"):
        evidence.append(f"GPU clocks throttled {_pct(float(gpu['throttled_fraction']))}")
    if gpu.get("xids"):
        evidence.append("XID " + ", ".join(str(x) for x in gpu["xids"]))
    return Verdict(label, headline.format(**values), advice, evidence, source="recorded")


def recorded_verdict(run: Run) -> Verdict | None:
    """The end-of-run verdict the diagnosis wrote into the recording, if any."""
    for finding in reversed(run.findings):
        if VERDICT_JSON in finding.attributes:
            parsed = _diagnosis_verdict(finding.attributes)
            if parsed is not None:
                return parsed
        if "verdict" not in finding.name and not any("verdict" in k for k in finding.attributes):
            continue
        attrs = finding.attributes
        label = next(
            (
                str(v)
                for k, v in attrs.items()
                if isinstance(v, str) and k.split(".")[-1] in _VERDICT_KEYS
            ),
            "VERDICT",
        )
        text = next(
            (
                str(v)
                for k, v in attrs.items()
                if isinstance(v, str) and k.split(".")[-1] in _TEXT_KEYS
            ),
            finding.body or "",
        )
        evidence = [
            f"{k.split('.')[-1]} {v:.0%}" if is_number(v) and 0 <= v <= 1 else f"{k}: {v}"
            for k, v in attrs.items()
            if "share" in k
        ]
        return Verdict(label.upper().replace("_", "-"), text, "", evidence, source="recorded")
    return None


def _pct(x: float) -> str:
    return f"{x * 100:.0f} %"


#: The phases that make a run "bound" by them, checked in this order: (phase, share of
#: step time above which the run is called bound by it, label, what it did, advice).
_PHASE_BOUND = (
    (
        "data",
        0.15,
        "INPUT-BOUND",
        "input wait took",
        "increase DataLoader workers, prefetch or storage throughput",
    ),
    (
        "communication",
        0.15,
        "COMMUNICATION-BOUND",
        "collectives blocked",
        "overlap communication with compute, check the interconnect and slow ranks",
    ),
    (
        "checkpoint",
        0.10,
        "CHECKPOINT-BOUND",
        "checkpoint writes took",
        "checkpoint less often or asynchronously, or to faster storage",
    ),
)


def training_verdict(t: Training) -> Verdict:
    shares = {p: share for p, _s, share in t.phases}
    evidence = [f"{p} {_pct(share)}" for p, _s, share in t.phases if share >= 0.005]
    gpu_note = []
    if t.throttled_step_share:
        gpu_note.append(
            f"GPU clocks throttled during {_pct(t.throttled_step_share)} of steps"
            + (f" ({', '.join(t.throttle_reasons)})" if t.throttle_reasons else "")
        )
    bound = next((b for b in _PHASE_BOUND if shares.get(b[0], 0) >= b[1]), None)
    if bound is not None:
        phase, _share, label, what, advice = bound
        v = Verdict(label, f"{what} {_pct(shares[phase])} of step time", advice, evidence)
    elif shares:
        compute = sum(shares.get(p, 0) for p in ("compute", "forward", "backward", "optimizer"))
        v = Verdict(
            "COMPUTE-BOUND",
            f"compute took {_pct(compute)} of step time",
            "speed up the model (mixed precision, fused kernels, larger batches)"
            if not gpu_note
            else "check cooling and power capping: the GPU slowed itself down",
            evidence,
        )
    else:
        q = t.step_quantiles
        v = Verdict(
            "STEPS",
            f"{t.steps} steps, p50 {q[0] * 1e3:.1f} ms, p99 {q[2] * 1e3:.1f} ms"
            if q
            else f"{t.steps} steps",
            "no phase breakdown was recorded (zero-code torch instrumentation records it)",
            [],
        )
    v.evidence.extend(gpu_note)
    return v


def inference_verdict(i: Inference) -> Verdict:
    lat = i.latency
    evidence = []
    if lat:
        evidence.append(f"latency p50 {lat[0] * 1e3:.0f} ms, p99 {lat[2] * 1e3:.0f} ms")
    if i.ttft:
        evidence.append(f"TTFT p99 {i.ttft[2] * 1e3:.0f} ms")
    if i.error_rate >= ERROR_RATE_ALERT:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(i.error_types.items())) or "errors"
        return Verdict(
            "REQUESTS FAILING",
            f"{i.error_rate * 100:.1f} % of {i.requests} requests failed ({kinds})",
            "check timeouts and KV-cache capacity; look at the GPU events below",
            evidence,
        )
    if i.queue and lat and lat[2] > 0 and i.queue[2] / lat[2] > 0.3:
        return Verdict(
            "QUEUE-BOUND",
            f"queueing is {_pct(i.queue[2] / lat[2])} of p99 latency",
            "add capacity or batch more: requests wait before they run",
            evidence,
        )
    return Verdict(
        "SERVING OK",
        f"{i.requests} requests, error rate {i.error_rate * 100:.1f} %",
        "",
        evidence,
    )


def verdicts(run: Run) -> list[Verdict]:
    """The recorded verdict (if the diagnosis wrote one) and the derived ones."""
    out: list[Verdict] = []
    recorded = recorded_verdict(run)
    if recorded is not None:
        out.append(recorded)
    t = training(run)
    if t is not None and (recorded is None or not t.phases):
        out.append(training_verdict(t))
    i = inference(run)
    if i is not None:
        out.append(inference_verdict(i))
    if run.gpu_events:
        counts: dict[str, int] = {}
        for e in run.gpu_events:
            counts[e.kind] = counts.get(e.kind, 0) + 1
        out.append(
            Verdict(
                "GPU HEALTH",
                ", ".join(f"{n} {k}" for k, n in sorted(counts.items())),
                "see the per-GPU timelines and events",
                [
                    f"{e.time_s:.1f}s {e.kind} {e.detail} on {e.uuid[:12]}"
                    for e in run.gpu_events[:5]
                ],
            )
        )
    return out


def stragglers(run: Run) -> list[Any]:
    """Straggler findings (from the diagnosis), newest last."""
    return [f for f in run.findings if "straggler" in f.name]


def other_findings(run: Run) -> list[Any]:
    return [f for f in run.findings if "straggler" not in f.name and "verdict" not in f.name]


def fmt_quantiles(values: Sequence[float], unit: str) -> str:
    if not values:
        return "n/a"
    scale, suffix = (1e3, "ms") if unit == "s" else (1.0, unit)
    return (
        "  ".join(
            f"p{round(q * 100)} {v * scale:.2f}" for q, v in zip(QUANTILES, values, strict=False)
        )
        + f" {suffix}"
    )
