"""Rank stragglers: which rank holds the others back, and why (pure; no torch).

Every exchange window each rank contributes a :class:`RankSummary` (per-step medians of its
phases, of the time it spent in the k-th collective of a step, and its GPU's state);
:func:`assess` compares the ranks and :class:`StragglerDetector` reports a rank that stays
slow.

Why not compare step times: in synchronous training every rank's step takes as long as
the slowest one's. A straggler shows up instead in the collectives: the others wait for
it. :func:`assess` measures, per rank:

* **lateness**: over the collective slots of a step (the k-th collective), how much
  longer *every other* rank waited than this one (``min over the others - own``, summed
  over slots). Only the rank the others wait for gets a lateness: a victim is compared
  with the straggler too, which waited least. Its share of the median step is what the
  threshold applies to (and what the report calls "the others waited X% of a step").
  Jobs whose collectives are not seen per call (DDP's gradient all-reduce runs inside
  backward, in C++, so the others' wait hides in their backward) fall back to the rank's
  total excess below: a victim's longer backward is not excess, since the lower median
  over ranks is a victim's.
* **excess**, to name the cause: the rank's time above a baseline rank (the lower median
  over ranks) in each phase and in each collective slot. The cause is where most of it
  went: data -> ``input``; forward, backward, optimizer -> ``compute``; checkpoint ->
  ``checkpoint``; time *inside* a collective longer than its peers spent in the same
  collective (it came out late: a slow transport on its side) -> ``communication``;
  unmeasured host time -> ``host``. A rank slow by the same amount in *every* collective
  leaves every rank's waits alike: no host timing can single it out.

``skew`` (exported as ``otelgpu.train.rank.skew``) is the rank's own work per step
(step minus communication wait) above the median rank's, as a fraction of the median
step time. The lower median makes two-rank jobs work (baseline = the faster rank).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from otelgpu.diagnosis.names import PHASE_CAUSE, PHASES

__all__ = [
    "COMM_SLOTS",
    "RankAssessment",
    "RankSummary",
    "StragglerDetector",
    "StragglerReport",
    "WindowAssessment",
    "assess",
    "gpu_evidence",
]

COMM_SLOTS = 8
"""Collectives of a step tracked one by one; later ones add to the last slot."""


@dataclass(frozen=True)
class RankSummary:
    """One rank's exchange-window summary. Times are per-step medians in seconds.

    ``gpu`` holds the rank's GPU state over the window (keys, all optional):
    ``throttled_fraction``, ``throttle_reasons`` (list of names), ``sm_clock_mhz``,
    ``temperature_max_c``, ``xids`` (list), ``utilization`` (fraction).
    """

    rank: int
    steps: int
    step_s: float
    phases: Mapping[str, float]
    comm_slots: Sequence[float] = ()
    host: str = ""
    gpu_uuid: str = ""
    gpu: Mapping[str, Any] = field(default_factory=dict)
    first_step: int = 0
    last_step: int = 0

    def to_bytes(self) -> bytes:
        """Compact JSON (what travels in the exchange)."""
        return json.dumps(
            {
                "r": self.rank,
                "n": self.steps,
                "s": round(self.step_s, 9),
                "p": {k: round(v, 9) for k, v in self.phases.items()},
                "c": [round(v, 9) for v in self.comm_slots],
                "h": self.host,
                "u": self.gpu_uuid,
                "g": dict(self.gpu),
                "a": self.first_step,
                "b": self.last_step,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> RankSummary:
        d = json.loads(raw)
        return cls(
            rank=int(d["r"]),
            steps=int(d["n"]),
            step_s=float(d["s"]),
            phases={str(k): float(v) for k, v in d["p"].items()},
            comm_slots=tuple(float(v) for v in d["c"]),
            host=str(d.get("h", "")),
            gpu_uuid=str(d.get("u", "")),
            gpu=dict(d.get("g", {})),
            first_step=int(d.get("a", 0)),
            last_step=int(d.get("b", 0)),
        )

    @property
    def own_s(self) -> float:
        """Step time minus communication wait (the rank's own work)."""
        return self.step_s - self.phases.get("comm", 0.0)


@dataclass(frozen=True)
class RankAssessment:
    """How one rank compares with the others in one window."""

    rank: int
    skew: float
    excess_s: float  # lateness: how much longer every other rank waited for it, per step
    excess_share: float  # lateness / median step time
    cause: str
    by_cause: Mapping[str, float]  # seconds of its own excess time per cause
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class WindowAssessment:
    """All ranks of one window: medians, the worst rank, every rank's assessment."""

    median_step_s: float
    median_own_s: float
    ranks: Mapping[int, RankAssessment]
    summaries: Mapping[int, RankSummary]

    @property
    def worst(self) -> RankAssessment | None:
        """The rank the others waited for longest."""
        if not self.ranks:
            return None
        return max(self.ranks.values(), key=lambda a: (a.excess_s, -a.rank))


def _baseline(values: Sequence[float]) -> float:
    return float(statistics.median_low(values)) if values else 0.0


def gpu_evidence(row: RankSummary, others: Sequence[RankSummary]) -> tuple[str, ...]:
    """What the rank's GPU says about slow compute (throttling, clocks, heat, XIDs)."""
    g = row.gpu
    out: list[str] = []
    frac = g.get("throttled_fraction")
    reasons = [str(r) for r in g.get("throttle_reasons", ()) if r != "gpu_idle"]
    if isinstance(frac, int | float) and frac > 0:
        why = f" ({', '.join(reasons)})" if reasons else ""
        out.append(f"throttled {frac:.0%} of the window{why}")
    elif reasons:
        out.append("throttle reasons " + ", ".join(reasons))
    clock = g.get("sm_clock_mhz")
    peer_clocks = [
        float(o.gpu["sm_clock_mhz"])
        for o in others
        if isinstance(o.gpu.get("sm_clock_mhz"), int | float)
    ]
    if isinstance(clock, int | float) and peer_clocks:
        peer = statistics.median(peer_clocks)
        if peer > 0 and clock < 0.9 * peer:
            out.append(f"SM clock {clock:.0f} MHz vs {peer:.0f} MHz on the other ranks")
    temp = g.get("temperature_max_c")
    peer_temps = [
        float(o.gpu["temperature_max_c"])
        for o in others
        if isinstance(o.gpu.get("temperature_max_c"), int | float)
    ]
    if isinstance(temp, int | float) and peer_temps and temp > max(peer_temps) + 5:
        out.append(f"temperature {temp:.0f} °C (others at most {max(peer_temps):.0f} °C)")
    xids = g.get("xids") or ()
    if xids:
        out.append("XID " + ", ".join(str(x) for x in xids))
    return tuple(out)


def assess(rows: Sequence[RankSummary]) -> WindowAssessment:
    """Compares the ranks of one window (see the module docstring)."""
    rows = [r for r in rows if r.steps > 0]
    if not rows:
        return WindowAssessment(0.0, 0.0, {}, {})
    median_step = float(statistics.median(r.step_s for r in rows))
    median_own = float(statistics.median(r.own_s for r in rows))
    base = {p: _baseline([r.phases.get(p, 0.0) for r in rows]) for p in PHASES if p != "comm"}
    slots = max((len(r.comm_slots) for r in rows), default=0)
    slot_base = [
        _baseline([r.comm_slots[j] if j < len(r.comm_slots) else 0.0 for r in rows])
        for j in range(slots)
    ]

    def slot(row: RankSummary, j: int) -> float:
        return row.comm_slots[j] if j < len(row.comm_slots) else 0.0

    out: dict[int, RankAssessment] = {}
    for row in rows:
        by_cause: dict[str, float] = {}
        for p, b in base.items():
            extra = row.phases.get(p, 0.0) - b
            if extra > 0:
                cause = PHASE_CAUSE[p]
                by_cause[cause] = by_cause.get(cause, 0.0) + extra
        comm_extra = sum(max(0.0, slot(row, j) - slot_base[j]) for j in range(slots))
        if comm_extra > 0:
            by_cause["communication"] = comm_extra
        others = [o for o in rows if o.rank != row.rank]
        skew = (row.own_s - median_own) / median_step if median_step > 0 else 0.0
        if slots and others:
            lateness = sum(
                max(0.0, min(slot(o, j) for o in others) - slot(row, j)) for j in range(slots)
            )
        else:  # no collective seen per call: the rank's own excess time
            lateness = sum(by_cause.values())
        cause = max(by_cause, key=lambda c: by_cause[c]) if by_cause else "host"
        evidence: tuple[str, ...] = ()
        if cause == "compute":
            evidence = gpu_evidence(row, others)
        out[row.rank] = RankAssessment(
            rank=row.rank,
            skew=skew,
            excess_s=lateness,
            excess_share=lateness / median_step if median_step > 0 else 0.0,
            cause=cause,
            by_cause=by_cause,
            evidence=evidence,
        )
    return WindowAssessment(median_step, median_own, out, {r.rank: r for r in rows})


@dataclass(frozen=True)
class StragglerReport:
    """A rank found persistently slow: what a log line, span event and counter carry."""

    rank: int
    cause: str
    excess_share: float
    skew: float
    windows: int
    host: str
    gpu_uuid: str
    evidence: tuple[str, ...]
    median_step_s: float
    first_step: int
    last_step: int

    def message(self) -> str:
        """The one log line."""
        where = f"host {self.host or '?'}, GPU {self.gpu_uuid or 'none'}"
        ev = f"; evidence: {'; '.join(self.evidence)}" if self.evidence else ""
        return (
            f"otelgpu: straggler rank {self.rank} ({where}): cause {self.cause}; the other "
            f"ranks waited {self.excess_share:.0%} of the median step "
            f"({self.median_step_s * 1e3:.1f} ms) for it, {self.windows} windows in a row "
            f"(steps {self.first_step}-{self.last_step}){ev}"
        )

    def attributes(self) -> dict[str, Any]:
        """Span-event / log attributes."""
        attrs: dict[str, Any] = {
            "otelgpu.dist.rank": self.rank,
            "otelgpu.diagnosis.cause": self.cause,
            "otelgpu.diagnosis.excess_share": self.excess_share,
            "otelgpu.train.rank.skew": self.skew,
            "otelgpu.diagnosis.windows": self.windows,
            "host.name": self.host,
        }
        if self.gpu_uuid:
            attrs["hw.id"] = self.gpu_uuid
        if self.evidence:
            attrs["otelgpu.diagnosis.evidence"] = list(self.evidence)
        return attrs


class StragglerDetector:
    """Reports a rank whose lateness stays above ``threshold`` for ``persist`` windows.

    Args:
        threshold: lateness as a fraction of the median step time (default 0.10).
        min_excess_s: absolute floor on the lateness per step (default 1 ms): jitter of
            very short steps is not a straggler.
        persist: consecutive windows a rank must be flagged in before it is reported.
        repeat_every: while it stays slow, report it again every this many windows.

    Not thread-safe (one exchange thread feeds it).
    """

    def __init__(
        self,
        *,
        threshold: float = 0.10,
        min_excess_s: float = 0.001,
        persist: int = 2,
        repeat_every: int = 20,
    ) -> None:
        self.threshold = threshold
        self.min_excess_s = min_excess_s
        self.persist = persist
        self.repeat_every = repeat_every
        self._streak: dict[int, int] = {}
        self.latest: WindowAssessment | None = None
        self.reported: list[StragglerReport] = []
        self.windows = 0

    def flagged(self, a: RankAssessment) -> bool:
        """Whether one window's assessment counts towards a straggler."""
        return a.excess_share >= self.threshold and a.excess_s >= self.min_excess_s

    def feed(self, rows: Sequence[RankSummary]) -> list[StragglerReport]:
        """One window's summaries -> the reports due now (usually none)."""
        got = assess(rows)
        self.latest = got
        self.windows += 1
        reports = []
        for rank, a in got.ranks.items():
            if not self.flagged(a):
                self._streak.pop(rank, None)
                continue
            streak = self._streak.get(rank, 0) + 1
            self._streak[rank] = streak
            due = streak == self.persist or (
                streak > self.persist and (streak - self.persist) % self.repeat_every == 0
            )
            if not due:
                continue
            row = got.summaries[rank]
            report = StragglerReport(
                rank=rank,
                cause=a.cause,
                excess_share=a.excess_share,
                skew=a.skew,
                windows=streak,
                host=row.host,
                gpu_uuid=row.gpu_uuid,
                evidence=a.evidence,
                median_step_s=got.median_step_s,
                first_step=min(r.first_step for r in got.summaries.values()),
                last_step=max(r.last_step for r in got.summaries.values()),
            )
            reports.append(report)
            self.reported.append(report)
            del self.reported[:-64]  # bounded
        return reports
