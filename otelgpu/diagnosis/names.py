"""Names of what the diagnosis package exports (one table; ``docs/diagnosis.md`` documents it).

Phases, findings, the rank-skew gauge and the end-of-run verdict span. Metric kinds follow
``otelgpu.otel.names`` (``sketch`` = OTLP exponential histogram plus quantile gauges).
"""

from __future__ import annotations

from typing import NamedTuple


class DiagnosisMetric(NamedTuple):
    name: str
    kind: str  # "sketch" | "counter" | "gauge"
    unit: str
    description: str
    attributes: tuple[str, ...] = ()


#: Phases of a training step, in the order they are reported. They partition the step:
#: their durations sum to the step's wall time.
PHASES = ("data", "forward", "backward", "optimizer", "comm", "checkpoint", "other")

#: Causes a straggler (or the run's bottleneck) is classified into.
CAUSES = ("input", "compute", "communication", "checkpoint", "host")

#: Phase -> the cause it stands for when it is where a rank's extra time went.
PHASE_CAUSE = {
    "data": "input",
    "forward": "compute",
    "backward": "compute",
    "optimizer": "compute",
    "comm": "communication",
    "checkpoint": "checkpoint",
    "other": "host",
}

ATTR_PHASE = "otelgpu.train.phase"
ATTR_RANK = "otelgpu.dist.rank"
ATTR_KIND = "otelgpu.diagnosis.kind"
ATTR_CAUSE = "otelgpu.diagnosis.cause"

#: Span attribute of one phase's duration (s) on the step span: ``otelgpu.train.phase.<p>``.
SPAN_PHASE_PREFIX = "otelgpu.train.phase."

PHASE_DURATION = DiagnosisMetric(
    "otelgpu.train.phase.duration",
    "sketch",
    "s",
    "Time one training step spent in one phase (the phases sum to the step time).",
    (ATTR_PHASE,),
)
RANK_SKEW = DiagnosisMetric(
    "otelgpu.train.rank.skew",
    "gauge",
    "1",
    "This rank's own work per step (step time minus communication wait) above the median "
    "rank's, as a fraction of the median step time (latest exchange window).",
    (ATTR_RANK,),
)
FINDINGS = DiagnosisMetric(
    "otelgpu.diagnosis.findings",
    "counter",
    "{finding}",
    "Findings reported by the diagnosis detectors (stragglers, drift, dips, memory creep).",
    (ATTR_KIND, ATTR_CAUSE),
)

ALL = (PHASE_DURATION, RANK_SKEW, FINDINGS)

#: Finding kinds (span event ``otelgpu.diagnosis.<kind>``).
KINDS = ("straggler", "step_drift", "utilization_dips", "memory_creep", "latency_drift")
EVENT_PREFIX = "otelgpu.diagnosis."

#: The end-of-run verdict: one span (start = first step, end = the verdict's time) whose
#: attribute ``otelgpu.verdict.json`` holds the verdict as JSON (``Verdict.to_dict``).
VERDICT_SPAN = "otelgpu.run.verdict"
VERDICT_JSON = "otelgpu.verdict.json"
VERDICT_BOTTLENECK = "otelgpu.verdict.bottleneck"
