"""Names of what the diagnosis package exports: phases, causes, span attributes and events,
the verdict span. The metrics themselves are specs of :mod:`otelgpu.metrics.catalog`
(``PHASE_DURATION``, ``RANK_SKEW``, ``FINDINGS``, re-exported here); ``docs/diagnosis.md``
documents all of it.
"""

from __future__ import annotations

from otelgpu.metrics.catalog import FINDINGS, PHASE_DURATION, RANK_SKEW

__all__ = [
    "ALL",
    "ATTR_CAUSE",
    "ATTR_KIND",
    "ATTR_PHASE",
    "ATTR_RANK",
    "CAUSES",
    "EVENT_PREFIX",
    "FINDINGS",
    "KINDS",
    "PHASES",
    "PHASE_CAUSE",
    "PHASE_DURATION",
    "RANK_SKEW",
    "SPAN_PHASE_PREFIX",
    "VERDICT_BOTTLENECK",
    "VERDICT_JSON",
    "VERDICT_SPAN",
]


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

ALL = (PHASE_DURATION, RANK_SKEW, FINDINGS)

#: Finding kinds (span event ``otelgpu.diagnosis.<kind>``).
KINDS = ("straggler", "step_drift", "utilization_dips", "memory_creep", "latency_drift")
EVENT_PREFIX = "otelgpu.diagnosis."

#: The end-of-run verdict: one span (start = first step, end = the verdict's time) whose
#: attribute ``otelgpu.verdict.json`` holds the verdict as JSON (``Verdict.to_dict``).
VERDICT_SPAN = "otelgpu.run.verdict"
VERDICT_JSON = "otelgpu.verdict.json"
VERDICT_BOTTLENECK = "otelgpu.verdict.bottleneck"
