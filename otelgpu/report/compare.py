"""Compare two runs: per sketch metric, the shift of p50/p95/p99 and a verdict.

A shift counts only when it is larger than what the two estimates can be off by:

* the **sketch's relative-error bound** ``alpha`` (from the exported histogram's scale:
  every bucket's value is within ``alpha`` of the truth), and
* the **sampling uncertainty of a quantile**: with ``n`` values the rank of the q-quantile
  is known to ``± z·sqrt(n·q·(1-q))`` (normal approximation of the order statistic,
  ``z`` = 2.58, 99 %), read off the sketch itself at the neighbouring ranks.

A quantile is judged only when each run has at least :data:`MIN_TAIL` values beyond it
(``n·(1-q) >= 5``: p99 needs 500 values, p95 100, p50 10); the normal approximation
of the order statistic is meaningless below that and the shift is reported as "no change
(too few values)". Each run's quantile thus becomes an interval
``[Q(q-d)·(1-alpha), Q(q+d)·(1+alpha)]``.
Candidate B *regressed* at q when its whole interval lies above A's and the relative
change ``B/A - 1`` is at least ``min_change`` (default 5 %: smaller shifts are real but
rarely actionable); *improved* symmetrically; otherwise *no change*. All metrics compared
are durations, sizes or energies: lower is better.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from otelgpu.report import analysis as A
from otelgpu.report.model import Run

Z = 2.58
MIN_TAIL = 5
DEFAULT_MIN_CHANGE = 0.05
REGRESSION = "regression"
IMPROVEMENT = "improvement"
NO_CHANGE = "no change"


def sketch_alpha(sketch: Any) -> float:
    """The relative-error bound of a sketch at its current scale."""
    from otelgpu.sketch._mapping import accuracy_for_scale

    return float(accuracy_for_scale(int(sketch.scale)))


def interval(sketch: Any, q: float) -> tuple[float, float, float]:
    """(low, estimate, high) of the q-quantile: rank uncertainty and the sketch's error."""
    n = max(int(sketch.count), 1)
    d = Z * math.sqrt(q * (1 - q) / n)
    alpha = sketch_alpha(sketch)
    lo_q, hi_q = max(q - d, 0.0), min(q + d, 1.0)
    lo = sketch.quantile(lo_q) if lo_q > 0 else sketch.min
    hi = sketch.quantile(hi_q) if hi_q < 1 else sketch.max
    return lo * (1 - alpha), sketch.quantile(q), hi * (1 + alpha)


@dataclass
class Shift:
    quantile: float
    a: float
    b: float
    change: float  # b / a - 1
    verdict: str
    too_few: bool = False  # too few values beyond the quantile to judge it


@dataclass
class MetricShift:
    name: str
    label: str
    unit: str
    count_a: int
    count_b: int
    shifts: list[Shift] = field(default_factory=list)
    only_in: str = ""  # "A" or "B" when the series exists in one run only

    @property
    def verdict(self) -> str:
        kinds = {s.verdict for s in self.shifts}
        if REGRESSION in kinds:
            return REGRESSION
        if IMPROVEMENT in kinds:
            return IMPROVEMENT
        return NO_CHANGE

    @property
    def worst_regression(self) -> float:
        return max((s.change for s in self.shifts if s.verdict == REGRESSION), default=0.0)


def compare_sketches(a: Any, b: Any, min_change: float = DEFAULT_MIN_CHANGE) -> list[Shift]:
    out = []
    for q in A.QUANTILES:
        a_lo, a_v, a_hi = interval(a, q)
        b_lo, b_v, b_hi = interval(b, q)
        change = b_v / a_v - 1 if a_v > 0 else (math.inf if b_v > 0 else 0.0)
        verdict = NO_CHANGE
        too_few = min(a.count, b.count) * (1 - q) < MIN_TAIL
        if too_few:
            pass
        elif b_lo > a_hi and change >= min_change:
            verdict = REGRESSION
        elif b_hi < a_lo and -change >= min_change:
            verdict = IMPROVEMENT
        out.append(Shift(q, a_v, b_v, change, verdict, too_few))
    return out


@dataclass
class Comparison:
    metrics: list[MetricShift]
    context: list[tuple[str, str, str, str]]  # (what, A, B, difference)

    def regressions(self, threshold: float = 0.0) -> list[MetricShift]:
        """Metrics that regressed by at least ``threshold`` (relative, e.g. 0.1 = 10 %)."""
        return [
            m for m in self.metrics if m.verdict == REGRESSION and m.worst_regression >= threshold
        ]


def compare(run_a: Run, run_b: Run, min_change: float = DEFAULT_MIN_CHANGE) -> Comparison:
    keys = sorted(set(run_a.sketches) | set(run_b.sketches))
    metrics = []
    for key in keys:
        sa, sb = run_a.sketches.get(key), run_b.sketches.get(key)
        ref = sa or sb
        assert ref is not None
        m = MetricShift(
            ref.name,
            ref.label,
            ref.unit,
            sa.sketch.count if sa else 0,
            sb.sketch.count if sb else 0,
        )
        if sa is None or not sa.sketch.count:
            m.only_in = "B"
        elif sb is None or not sb.sketch.count:
            m.only_in = "A"
        else:
            m.shifts = compare_sketches(sa.sketch, sb.sketch, min_change)
        if m.count_a or m.count_b:
            metrics.append(m)
    return Comparison(metrics, gpu_context(run_a, run_b))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _context(run: Run) -> dict[str, float | None]:
    gpus = A.gpus(run)
    inf = A.inference(run)
    counts: dict[str, float | None] = {
        "GPU utilization (mean)": _mean(
            [g.utilization_mean for g in gpus if g.utilization_mean is not None]
        ),
        "tensor activity (mean)": _mean(
            [g.tensor_activity_mean for g in gpus if g.tensor_activity_mean is not None]
        ),
        "temperature max (°C)": max(
            (g.temperature_max_c for g in gpus if g.temperature_max_c is not None), default=None
        ),
        "power mean (W)": _mean([g.power_mean_w for g in gpus if g.power_mean_w is not None]),
        "throttled share (mean)": _mean(
            [g.throttle_share for g in gpus if g.throttle_share is not None]
        ),
        "GPU health events": float(len(run.gpu_events)),
        "XID errors": float(sum(sum(g.xids.values()) for g in gpus)),
        "request error rate": inf.error_rate if inf is not None else None,
    }
    t = A.training(run)
    if t is not None:
        counts["steps throttled (share)"] = t.throttled_step_share
        for phase, _s, share in t.phases:
            counts[f"phase share: {phase}"] = share
    return counts


def _fmt(what: str, v: float | None) -> str:
    if v is None:
        return "n/a"
    if "share" in what or "utilization" in what or "activity" in what or "rate" in what:
        return f"{v * 100:.1f} %"
    return f"{v:g}" if float(v).is_integer() else f"{v:.1f}"


def gpu_context(run_a: Run, run_b: Run) -> list[tuple[str, str, str, str]]:
    a, b = _context(run_a), _context(run_b)
    rows = []
    for what in dict.fromkeys([*a, *b]):
        va, vb = a.get(what), b.get(what)
        if va is None and vb is None:
            continue
        if va is not None and vb is not None:
            d = vb - va
            pct = "share" in what or "utilization" in what or "activity" in what or "rate" in what
            diff = (
                f"{d * 100:+.1f} pt" if pct else f"{d:+g}" if float(d).is_integer() else f"{d:+.1f}"
            )
        else:
            diff = "—"
        rows.append((what, _fmt(what, va), _fmt(what, vb), diff))
    return rows


def write_text(c: Comparison, out: Any, name_a: str = "A", name_b: str = "B") -> None:
    print(
        f"otelgpu report: comparison  A = {name_a}\n                            B = {name_b}",
        file=out,
    )
    counts = {REGRESSION: 0, IMPROVEMENT: 0, NO_CHANGE: 0}
    for m in c.metrics:
        if not m.only_in:
            counts[m.verdict] += 1
    print(
        f"  {counts[REGRESSION]} regression(s), {counts[IMPROVEMENT]} improvement(s), "
        f"{counts[NO_CHANGE]} unchanged (shift beyond sketch error and quantile uncertainty)",
        file=out,
    )
    print("\n== distributions: B against A ==", file=out)
    for m in c.metrics:
        verdict = m.verdict.upper() if not m.only_in else "ONLY IN " + m.only_in
        head = f"  {verdict:<12} {m.name} [{m.label}]"
        print(f"{head}  n={m.count_a}→{m.count_b}", file=out)
        scale, unit = (1e3, "ms") if m.unit == "s" else (1.0, m.unit)
        for s in m.shifts:
            mark = {REGRESSION: "▲", IMPROVEMENT: "▼", NO_CHANGE: " "}[s.verdict]
            print(
                f"      p{round(s.quantile * 100):<3} "
                f"{s.a * scale:10.2f} → {s.b * scale:10.2f} {unit:<4}"
                f" {s.change * 100:+7.1f} % {mark} {s.verdict}"
                + (" (too few values)" if s.too_few else ""),
                file=out,
            )
    if c.context:
        print("\n== GPU context ==", file=out)
        print(f"  {'':<28} {'A':>10} {'B':>10} {'B - A':>10}", file=out)
        for what, va, vb, diff in c.context:
            print(f"  {what:<28} {va:>10} {vb:>10} {diff:>10}", file=out)
