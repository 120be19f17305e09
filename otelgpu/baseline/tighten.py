"""Tighter thresholds from newer history, and what they would have cost on it.

For each figure and key in both baselines, the newer history's threshold is proposed
when it is tighter (lower for ``upper`` figures, higher for ``lower`` ones). The expected
extra alert rate is measured on the newer history itself: the share of its samples
beyond the proposed threshold minus the share beyond the current one (a condition that
holds for that share of the time would hold in production too).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from otelgpu.baseline.model import BaselineFile, Entry

__all__ = ["Change", "Proposal", "propose", "render"]


@dataclass
class Change:
    figure: str
    labels: dict[str, str]
    unit: str
    old: float
    new: float
    old_rate: float  # share of the newer history's samples beyond the old threshold
    new_rate: float  # ... beyond the proposed one


@dataclass
class Proposal:
    baseline: BaselineFile
    changes: list[Change] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


def _beyond(values: list[float], threshold: float, direction: str) -> float:
    if not values:
        return 0.0
    hits = sum(1 for v in values if (v > threshold if direction == "upper" else v < threshold))
    return hits / len(values)


def _key(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def propose(
    old: BaselineFile,
    newer: BaselineFile,
    values: dict[tuple[str, str], list[tuple[float, float]]],
) -> Proposal:
    """Compare ``old`` with ``newer`` (learned with ``keep_values=values``)."""
    result = copy.deepcopy(old)
    proposal = Proposal(result)
    for e in result.entries:
        n = newer.entry(e.figure, e.labels)
        if n is None:
            proposal.kept.append(f"{e.figure} {{{_key(e.labels)}}}: not in the newer history")
            continue
        tighter = (
            n.threshold < e.threshold if e.direction == "upper" else (n.threshold > e.threshold)
        )
        if not tighter:
            proposal.kept.append(f"{e.figure} {{{_key(e.labels)}}}: newer history is not tighter")
            continue
        samples = [v for _, v in values.get((e.figure, _key(e.labels)), [])]
        proposal.changes.append(
            Change(
                e.figure,
                e.labels,
                e.unit,
                e.threshold,
                n.threshold,
                _beyond(samples, e.threshold, e.direction),
                _beyond(samples, n.threshold, e.direction),
            )
        )
        _replace(e, n)
    result.source = {**newer.source, "tightened_from": old.source}
    result.created = newer.created
    return proposal


def _replace(e: Entry, n: Entry) -> None:
    for name in ("samples", "coverage", "median", "p1", "p99", "reference", "threshold"):
        setattr(e, name, getattr(n, name))


def render(p: Proposal) -> str:
    """The diff as text: old -> new threshold and the extra alert rate on the history."""
    lines = [f"otelgpu baseline tighten: {len(p.changes)} thresholds tighter"]
    for c in p.changes:
        key = ",".join(f"{k}={v}" for k, v in sorted(c.labels.items()) if v) or "-"
        extra = c.new_rate - c.old_rate
        lines.append(
            f"- {c.figure} {{{key}}}: {c.old:.6g} -> {c.new:.6g} {c.unit}; "
            f"on the newer history the condition holds {c.new_rate:.2%} of the time "
            f"(was {c.old_rate:.2%}): +{extra:.2%} expected extra alert time"
        )
    lines.extend(f"  kept: {k}" for k in p.kept)
    return "\n".join(lines)
