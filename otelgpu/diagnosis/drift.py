"""Drift and creep detectors (pure; fed one value per step or request).

* :class:`QuantileDrift` -- the current window's sketch against a baseline sketch: a p50 or
  p95 (p99 for latencies) shift is reported only when it is *significant*: the window's
  quantile, taken at the low end of its order-statistic confidence band and lowered by
  the sketch's relative error bound, still exceeds the baseline's quantile taken at the
  high end of its band and raised by the bound, by at least ``min_shift``. So a shift the
  sketch could not resolve, or that a few hundred samples could produce by chance, is
  never reported. :class:`StepDrift` and :class:`LatencyDrift` are its two uses.
* :class:`RunStartBaseline` -- the baseline is the run's own start (after a warm-up). It is
  one implementation of :class:`Baseline`; a recorded baseline file can stand in for it.
* :class:`UtilizationDips` -- periodic dips of a per-step utilization series (the data
  loader pattern: every k-th step the GPU idles while the loader catches up).
* :class:`MemoryCreep` -- least-squares growth of allocated memory per step, projected to
  the device limit ("OOM in ~N steps").

Each detector rate-limits itself (at most one finding per ``cooldown`` ticks) and is
silent on a healthy series. Not thread-safe: one thread feeds each detector.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from otelgpu.diagnosis.findings import Finding, RateLimiter
from otelgpu.sketch import QuantileSketch

__all__ = [
    "Baseline",
    "LatencyDrift",
    "MemoryCreep",
    "QuantileDrift",
    "RunStartBaseline",
    "StepDrift",
    "UtilizationDips",
    "relative_error_bound",
]

_Z = 3.0  # confidence band half-width in standard deviations (~99.7 %)


def relative_error_bound(sketch: QuantileSketch) -> float:
    """Worst-case relative error of any quantile of ``sketch`` (from its scale)."""
    base: float = 2.0 ** (2.0 ** -float(sketch.scale))
    return (base - 1.0) / (base + 1.0)


def _seconds_pair(before: float, after: float) -> str:
    """``"1.20 -> 1.51 ms"``: two durations (seconds) in the unit that suits the smaller
    (µs, ms or s), three significant digits at least."""
    smaller = min(abs(before), abs(after))
    scale, unit = (1.0, "s") if smaller >= 1.0 else (1e3, "ms") if smaller >= 1e-3 else (1e6, "µs")

    def number(x: float) -> str:
        return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"

    return f"{number(before * scale)} -> {number(after * scale)} {unit}"


def _band(sketch: QuantileSketch, q: float) -> tuple[float, float]:
    """(low, high) value of quantile ``q``: order-statistic band widened by the error bound."""
    n = max(1, sketch.count)
    d = _Z * math.sqrt(q * (1.0 - q) / n)
    a = relative_error_bound(sketch)
    lo = sketch.quantile(max(0.0, q - d)) * (1.0 - a)
    hi = sketch.quantile(min(1.0, q + d)) * (1.0 + a)
    return lo, hi


class Baseline(Protocol):
    """Where "normal" comes from: the run's own start, or (later) a recorded file."""

    def sketch(self) -> QuantileSketch | None:
        """The baseline distribution, or None while it is not known yet."""

    def add(self, value: float) -> None:
        """Offers one value of the run (a file baseline ignores it).

        A baseline may also have a ``final`` attribute: True once its sketch will not
        change any more and ``add`` has no effect (the detector then stops offering).
        """


class RunStartBaseline:
    """The run's early distribution: values ``warmup .. warmup + size`` (then frozen)."""

    def __init__(self, *, warmup: int = 20, size: int = 200) -> None:
        self.warmup = warmup
        self.size = size
        self._seen = 0
        self._sketch = QuantileSketch()

    def add(self, value: float) -> None:
        self._seen += 1
        if self.warmup < self._seen <= self.warmup + self.size:
            self._sketch.add(value)

    def sketch(self) -> QuantileSketch | None:
        return self._sketch if self._sketch.count >= self.size else None

    @property
    def final(self) -> bool:
        """True once the baseline is complete (frozen from then on)."""
        return bool(self._sketch.count >= self.size)


class QuantileDrift:
    """Window sketch vs baseline sketch at ``quantiles`` (see the module docstring).

    Args:
        kind: finding kind (``step_drift``, ``latency_drift``).
        what: what the values are, for the message (``step time``, ``TTFT``).
        baseline: the :class:`Baseline` (default: :class:`RunStartBaseline`).
        window: values per comparison window (tumbling).
        quantiles: quantiles compared.
        min_shift: smallest relative shift reported (0.10 = 10 %).
        cooldown: windows between two findings.
    """

    def __init__(
        self,
        kind: str,
        what: str,
        *,
        baseline: Baseline | None = None,
        window: int = 200,
        quantiles: Sequence[float] = (0.5, 0.95),
        min_shift: float = 0.10,
        cooldown: int = 5,
    ) -> None:
        self.kind = kind
        self.what = what
        self.baseline: Baseline = baseline if baseline is not None else RunStartBaseline()
        self.window = window
        self.quantiles = tuple(quantiles)
        self.min_shift = min_shift
        self._current = QuantileSketch()
        self._windows = 0
        self._ticks = 0
        self._limit = RateLimiter(cooldown)
        self._final: QuantileSketch | None = None  # the baseline's sketch, once final

    def add(self, value: float) -> Finding | None:
        """One value (seconds); a finding when a window closes with a significant shift."""
        self._ticks += 1
        base = self._final
        if base is None:  # the baseline may still take values: offer this one
            baseline = self.baseline
            baseline.add(value)
            base = baseline.sketch()
            if base is None:
                return None
            if getattr(baseline, "final", False) is True:
                self._final = base
        current = self._current
        current.add(value)
        if current.count < self.window:
            return None
        current, self._current = self._current, QuantileSketch()
        self._windows += 1
        return self.compare(base, current)

    def compare(self, base: QuantileSketch, current: QuantileSketch) -> Finding | None:
        """A finding when ``current`` is significantly above or below ``base``."""
        shifts = {}
        for q in self.quantiles:
            b_lo, b_hi = _band(base, q)
            c_lo, c_hi = _band(current, q)
            b, c = base.quantile(q), current.quantile(q)
            if b <= 0:
                continue
            if c_lo > b_hi * (1.0 + self.min_shift) or c_hi < b_lo * (1.0 - self.min_shift):
                shifts[q] = (b, c, c / b - 1.0)
        if not shifts or not self._limit.allow("drift", self._windows):
            return None
        worst = max(shifts, key=lambda q: abs(shifts[q][2]))
        b, c, shift = shifts[worst]
        direction = "slower" if shift > 0 else "faster"
        parts = ", ".join(
            f"p{q * 100:g} {_seconds_pair(v[0], v[1])} ({v[2]:+.0%})"
            for q, v in sorted(shifts.items())
        )
        attrs: dict[str, object] = {"otelgpu.diagnosis.what": self.what}
        for q, (bq, cq, s) in shifts.items():
            tag = f"p{q * 100:g}"
            attrs[f"otelgpu.diagnosis.baseline.{tag}"] = bq
            attrs[f"otelgpu.diagnosis.current.{tag}"] = cq
            attrs[f"otelgpu.diagnosis.shift.{tag}"] = s
        return Finding(
            kind=self.kind,
            message=f"otelgpu: {self.what} drifted {direction} than the baseline: {parts}",
            step=self._ticks,
            attributes=attrs,
        )


class StepDrift(QuantileDrift):
    """Training step time (p50 and p95) against the baseline."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__("step_drift", "step time", **kwargs)  # type: ignore[arg-type]


class LatencyDrift(QuantileDrift):
    """Inference latency (p99 by default: request duration or TTFT) against the baseline."""

    def __init__(self, what: str = "TTFT", **kwargs: object) -> None:
        kwargs.setdefault("quantiles", (0.5, 0.99))
        super().__init__("latency_drift", what, **kwargs)  # type: ignore[arg-type]


class UtilizationDips:
    """Periodic dips in a per-step utilization series (fractions 0..1).

    A dip is a step below ``dip_ratio`` x the window's median. Reported when a window of
    ``window`` steps holds at least ``min_dips`` dips spaced regularly (coefficient of
    variation of the spacing <= ``max_cv``): the data-loader pattern. Random dips, or
    none, stay silent. ``data_share`` per step (optional) is averaged over dip steps and
    other steps to say whether the loader is to blame.
    """

    def __init__(
        self,
        *,
        window: int = 200,
        dip_ratio: float = 0.6,
        min_dips: int = 4,
        max_cv: float = 0.25,
        cooldown: int = 5,
    ) -> None:
        self.window = window
        self.dip_ratio = dip_ratio
        self.min_dips = min_dips
        self.max_cv = max_cv
        self._values: list[tuple[float, float]] = []
        self._ticks = 0
        self._windows = 0
        self._limit = RateLimiter(cooldown)

    def add(self, utilization: float, data_share: float = 0.0) -> Finding | None:
        self._ticks += 1
        self._values.append((utilization, data_share))
        if len(self._values) < self.window:
            return None
        values, self._values = self._values, []
        self._windows += 1
        return self._check(values)

    def _check(self, values: list[tuple[float, float]]) -> Finding | None:
        med = statistics.median(v for v, _ in values)
        if med <= 0:
            return None
        dips = [i for i, (v, _) in enumerate(values) if v < self.dip_ratio * med]
        if len(dips) < self.min_dips or len(dips) > len(values) // 2:
            return None
        gaps = [b - a for a, b in itertools.pairwise(dips)]
        mean_gap = statistics.fmean(gaps)
        cv = statistics.pstdev(gaps) / mean_gap if mean_gap > 0 else math.inf
        if cv > self.max_cv or not self._limit.allow("dips", self._windows):
            return None
        dip_set = set(dips)
        dip_data = statistics.fmean(values[i][1] for i in dips)
        other = [d for i, (_, d) in enumerate(values) if i not in dip_set]
        other_data = statistics.fmean(other) if other else 0.0
        loader = dip_data > max(0.2, 2 * other_data)
        dip_util = statistics.fmean(values[i][0] for i in dips)
        cause = "input" if loader else ""
        why = (
            f"; data wait is {dip_data:.0%} of those steps (vs {other_data:.0%}): the data loader"
            if loader
            else ""
        )
        return Finding(
            kind="utilization_dips",
            cause=cause,
            message=(
                f"otelgpu: utilization dips every ~{mean_gap:.0f} steps "
                f"({dip_util:.0%} vs median {med:.0%}, {len(dips)} of {len(values)} steps){why}"
            ),
            step=self._ticks,
            attributes={
                "otelgpu.diagnosis.period_steps": mean_gap,
                "otelgpu.diagnosis.dips": len(dips),
                "otelgpu.diagnosis.dip_utilization": dip_util,
                "otelgpu.diagnosis.median_utilization": med,
                "otelgpu.diagnosis.dip_data_share": dip_data,
            },
        )


class MemoryCreep:
    """Allocated-memory growth per step, projected to the device limit.

    Over the last ``window`` steps (sampled every step), a least-squares slope with
    R² >= ``min_r2`` whose growth over the window is at least ``min_growth_bytes`` and
    ``min_growth_ratio`` of the current value is creep; the finding projects
    ``(limit - current) / slope`` steps to an out-of-memory error.
    """

    def __init__(
        self,
        *,
        window: int = 200,
        min_r2: float = 0.8,
        min_growth_bytes: int = 8 << 20,
        min_growth_ratio: float = 0.02,
        cooldown: int = 500,
    ) -> None:
        self.window = window
        self.min_r2 = min_r2
        self.min_growth_bytes = min_growth_bytes
        self.min_growth_ratio = min_growth_ratio
        self._values: deque[float] = deque(maxlen=window)
        self._ticks = 0
        self._limit = RateLimiter(cooldown)

    def add(self, allocated_bytes: float, limit_bytes: float | None) -> Finding | None:
        self._ticks += 1
        self._values.append(float(allocated_bytes))
        if len(self._values) < self.window or self._ticks % max(1, self.window // 4):
            return None
        ys = list(self._values)
        n = len(ys)
        mx = (n - 1) / 2.0
        my = statistics.fmean(ys)
        sxx = sum((i - mx) ** 2 for i in range(n))
        sxy = sum((i - mx) * (y - my) for i, y in enumerate(ys))
        syy = sum((y - my) ** 2 for y in ys)
        if sxx <= 0 or syy <= 0:
            return None
        slope = sxy / sxx
        r2 = (sxy * sxy) / (sxx * syy)
        growth = slope * (n - 1)
        current = ys[-1]
        if (
            slope <= 0
            or r2 < self.min_r2
            or growth < self.min_growth_bytes
            or growth < self.min_growth_ratio * current
        ):
            return None
        if not self._limit.allow("creep", self._ticks):
            return None
        attrs: dict[str, object] = {
            "otelgpu.diagnosis.slope_bytes_per_step": slope,
            "otelgpu.diagnosis.r2": r2,
            "otelgpu.diagnosis.allocated_bytes": int(current),
        }
        projection = ""
        if limit_bytes:
            steps_left = max(0.0, (limit_bytes - current) / slope)
            attrs["otelgpu.diagnosis.limit_bytes"] = int(limit_bytes)
            attrs["otelgpu.diagnosis.steps_to_oom"] = int(steps_left)
            projection = f"; OOM in ~{steps_left:,.0f} steps at this rate"
        return Finding(
            kind="memory_creep",
            message=(
                f"otelgpu: CUDA memory creeping +{slope / (1 << 20):.2f} MiB/step "
                f"(now {current / (1 << 30):.2f} GiB, R² {r2:.2f}){projection}"
            ),
            step=self._ticks,
            attributes=attrs,
        )
