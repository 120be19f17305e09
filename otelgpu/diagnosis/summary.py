"""The end-of-run verdict: one screen saying what held the run back (pure).

:class:`RunSummary` accumulates per-step phases and every finding (thread-safe); its
:meth:`RunSummary.verdict` builds a :class:`Verdict`: the bottleneck class with the phase
shares, step-time quantiles, stragglers, drift, memory creep and GPU health. The same
verdict is written into the recording as the ``otelgpu.run.verdict`` span (attribute
``otelgpu.verdict.json`` = :meth:`Verdict.to_dict` as JSON; shape in ``docs/diagnosis.md``).

Bottleneck rule (shares of the summed step time, checked in this order): data wait >= 20 %
-> ``input``; communication wait >= 25 % -> ``communication``; checkpoint >= 15 % ->
``checkpoint``; unmeasured host time >= 30 % -> ``host``; else ``compute`` (the GPU work
is the limit, which is where a training run should be).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from itertools import repeat
from operator import truediv
from typing import Any

from otelgpu.diagnosis.findings import Finding
from otelgpu.diagnosis.names import PHASES
from otelgpu.diagnosis.stragglers import StragglerReport
from otelgpu.sketch import QuantileSketch

__all__ = ["RunSummary", "Verdict", "bottleneck"]

VERSION = 1

_RULES = (
    ("input", "data", 0.20),
    ("communication", "comm", 0.25),
    ("checkpoint", "checkpoint", 0.15),
)


def bottleneck(shares: Mapping[str, float]) -> str:
    """The bottleneck class of phase shares (see the module docstring)."""
    if not shares or sum(shares.values()) <= 0:
        return "unknown"
    for cls, phase, limit in _RULES:
        if shares.get(phase, 0.0) >= limit:
            return cls
    if shares.get("other", 0.0) >= 0.30:
        return "host"
    return "compute"


@dataclass
class Verdict:
    """What the run was limited by (all times in seconds)."""

    steps: int
    step_time_s: float
    step_p50_s: float | None
    step_p95_s: float | None
    bottleneck: str
    phase_shares: dict[str, float]
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    findings: dict[str, int] = field(default_factory=dict)
    drift: list[str] = field(default_factory=list)
    creep: list[str] = field(default_factory=list)
    dips: list[str] = field(default_factory=list)
    gpu: dict[str, Any] = field(default_factory=dict)
    version: int = VERSION

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the recording's ``otelgpu.verdict.json``)."""
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Verdict:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})

    def headline(self) -> str:
        """One sentence: the bottleneck with its phase share, and the stragglers."""
        cls = self.bottleneck
        if cls == "unknown":
            return "not enough steps to tell"
        phase = {
            "input": "data",
            "communication": "comm",
            "checkpoint": "checkpoint",
            "host": "other",
        }.get(cls)
        if phase is None:
            share = sum(self.phase_shares.get(p, 0.0) for p in ("forward", "backward", "optimizer"))
            what = "forward, backward and optimizer"
        else:
            share, what = self.phase_shares.get(phase, 0.0), f"{phase} phase"
        text = f"{cls}-bound: {what} took {share:.0%} of step time"
        if self.stragglers:
            names = ", ".join(f"rank {s['rank']} ({s['cause']})" for s in self.stragglers[-3:])
            text += f"; stragglers: {names}"
        return text

    def text(self) -> str:
        """The one-screen summary."""

        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v * 1e3:.1f} ms"

        lines = [
            f"otelgpu verdict: {self.bottleneck}-bound"
            if self.bottleneck not in ("unknown",)
            else "otelgpu verdict: not enough steps to tell",
            f"  steps {self.steps}, step time p50 {ms(self.step_p50_s)}, "
            f"p95 {ms(self.step_p95_s)}, total {self.step_time_s:.1f} s",
            "  phases: "
            + "  ".join(
                f"{p} {self.phase_shares.get(p, 0.0):.0%}" for p in PHASES if p in self.phase_shares
            ),
        ]
        if self.stragglers:
            for s in self.stragglers[-4:]:
                ev = f" ({'; '.join(s.get('evidence', []))})" if s.get("evidence") else ""
                lines.append(
                    f"  straggler: rank {s['rank']} on {s.get('host') or '?'}"
                    f" GPU {s.get('gpu_uuid') or 'none'}: {s['cause']}{ev}"
                )
        else:
            lines.append("  stragglers: none")
        for label, items in (("drift", self.drift), ("memory", self.creep), ("dips", self.dips)):
            lines.extend(f"  {label}: {msg.removeprefix('otelgpu: ')}" for msg in items[-2:])
        if not (self.drift or self.creep or self.dips):
            lines.append("  drift / memory creep / utilization dips: none")
        if self.gpu:
            g = self.gpu
            parts = []
            if "temperature_max_c" in g:
                parts.append(f"max {g['temperature_max_c']} °C")
            if g.get("throttled_fraction"):
                parts.append(f"throttled {g['throttled_fraction']:.0%}")
            if g.get("throttle_reasons"):
                parts.append("reasons " + ", ".join(g["throttle_reasons"]))
            if g.get("xids"):
                parts.append("XID " + ", ".join(str(x) for x in g["xids"]))
            if g.get("health_events"):
                parts.append(
                    "events "
                    + ", ".join(f"{k} x{v}" for k, v in sorted(g["health_events"].items()))
                )
            lines.append("  GPU: " + ("; ".join(parts) if parts else "healthy"))
        return "\n".join(lines)


class RunSummary:
    """Accumulates the run (thread-safe; memory bounded).

    Steps come in batches (:meth:`add_batch`: the training diagnosis buffers a few dozen
    steps and adds them under one lock, the step sketch with one ``add_many``); what is
    read is the same as if they had come one by one.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phase_ns = dict.fromkeys(PHASES, 0)
        self._steps = 0
        self._step_ns = 0
        self._sketch = QuantileSketch()
        self._counts: dict[str, int] = {}
        self._messages: dict[str, list[str]] = {}
        self._stragglers: list[dict[str, Any]] = []
        self.first_ns: int | None = None
        self.last_ns: int | None = None

    def add_step(self, start_ns: int, end_ns: int, phases: Mapping[str, int]) -> None:
        """One step (ns on one clock)."""
        self.add_batch(start_ns, end_ns, (end_ns - start_ns,), phases)

    def add_batch(
        self,
        first_start_ns: int,
        last_end_ns: int,
        durations_ns: Sequence[int],
        phase_ns: Mapping[str, int],
    ) -> None:
        """Consecutive steps at once: the first one's start, the last one's end, every
        step's duration and the steps' summed phases (all ns on one clock)."""
        if not durations_ns:
            return
        seconds = list(map(truediv, durations_ns, repeat(1e9)))
        with self._lock:
            self._steps += len(durations_ns)
            self._step_ns += sum(durations_ns)
            self._sketch.add_many(seconds)
            totals = self._phase_ns
            for p, v in phase_ns.items():
                totals[p] = totals.get(p, 0) + v
            if self.first_ns is None:
                self.first_ns = first_start_ns
            self.last_ns = last_end_ns

    def add_finding(self, finding: Finding) -> None:
        with self._lock:
            self._counts[finding.kind] = self._counts.get(finding.kind, 0) + 1
            msgs = self._messages.setdefault(finding.kind, [])
            msgs.append(finding.message)
            del msgs[:-8]

    def add_straggler(self, report: StragglerReport) -> None:
        with self._lock:
            self._counts["straggler"] = self._counts.get("straggler", 0) + 1
            self._stragglers.append(
                {
                    "rank": report.rank,
                    "cause": report.cause,
                    "host": report.host,
                    "gpu_uuid": report.gpu_uuid,
                    "excess_share": report.excess_share,
                    "evidence": list(report.evidence),
                    "first_step": report.first_step,
                    "last_step": report.last_step,
                }
            )
            del self._stragglers[:-16]

    @property
    def steps(self) -> int:
        return self._steps

    def verdict(self, gpu: Mapping[str, Any] | None = None) -> Verdict:
        """The verdict so far (``gpu``: health over the run, see :class:`Verdict`)."""
        with self._lock:
            total = sum(self._phase_ns.values())
            shares = {p: v / total for p, v in self._phase_ns.items()} if total > 0 else {}
            n = self._sketch.count
            return Verdict(
                steps=self._steps,
                step_time_s=self._step_ns / 1e9,
                step_p50_s=self._sketch.quantile(0.5) if n else None,
                step_p95_s=self._sketch.quantile(0.95) if n else None,
                bottleneck=bottleneck(shares) if self._steps >= 3 else "unknown",
                phase_shares=shares,
                stragglers=list(self._stragglers),
                findings=dict(self._counts),
                drift=list(self._messages.get("step_drift", []))
                + list(self._messages.get("latency_drift", [])),
                creep=list(self._messages.get("memory_creep", [])),
                dips=list(self._messages.get("utilization_dips", [])),
                gpu=dict(gpu or {}),
            )
