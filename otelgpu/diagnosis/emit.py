"""The one place findings become telemetry: span events, counters, log lines, the verdict span.

Per runtime, created once (OpenTelemetry instruments cannot be removed, so a re-instrumented
process reuses them): the phase sketch ``otelgpu.train.phase.duration``, the counter
``otelgpu.diagnosis.findings`` and the observable gauge ``otelgpu.train.rank.skew``.
Log lines go to the ``otelgpu.diagnosis`` logger (WARNING for findings, INFO for the
verdict), each with the finding's attributes in ``extra={"otelgpu_finding": ...}``.
Thread-safe; nothing here raises into the caller (errors go to ``Runtime.report_error``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from otelgpu.diagnosis import names as N
from otelgpu.diagnosis.findings import Finding
from otelgpu.diagnosis.stragglers import StragglerReport
from otelgpu.diagnosis.summary import Verdict

__all__ = ["Emitter", "logger"]

logger = logging.getLogger("otelgpu.diagnosis")

Event = tuple[str, int, dict[str, object]]


class _Instruments:
    def __init__(self, rt: Any) -> None:
        self.phase = rt.instrument(N.PHASE_DURATION)
        self.findings = rt.instrument(N.FINDINGS)
        self.skew: dict[int, float] = {}
        self.lock = threading.Lock()
        rt.instrument(N.RANK_SKEW, self.observe_skew)
        from otelgpu.otel.sketches import freeze

        self.phase_attrs = {p: {N.ATTR_PHASE: p} for p in N.PHASES}
        # series keys frozen once: a step's seven records skip the per-call freeze
        self.phase_keys = {p: freeze(a) for p, a in self.phase_attrs.items()}
        self.span_keys = {p: N.SPAN_PHASE_PREFIX + p for p in N.PHASES}
        # per phase everything a step needs, found with one lookup
        self.phase_slots = {
            p: (self.phase_keys[p], self.phase_attrs[p], self.span_keys[p]) for p in N.PHASES
        }

    def observe_skew(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self.lock:
            items = list(self.skew.items())
        return [Observation(v, {N.ATTR_RANK: r}) for r, v in items]


_BY_RUNTIME: weakref.WeakKeyDictionary[Any, _Instruments] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _instruments(rt: Any) -> _Instruments:
    with _LOCK:
        inst = _BY_RUNTIME.get(rt)
        if inst is None:
            inst = _Instruments(rt)
            with contextlib.suppress(TypeError):
                _BY_RUNTIME[rt] = inst
        return inst


class Emitter:
    """Findings of one instrumented process -> telemetry of its runtime.

    ``pending_events`` holds span events waiting for the next step span (findings that
    arrive off the step path, e.g. from the rank exchange); :meth:`take_events` empties it.
    """

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self._inst = _instruments(runtime)
        self._pending: list[Event] = []
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ phases
    def phases(self, phases: Mapping[str, int], fields: dict[str, Any] | None = None) -> None:
        """Records one step's phases (ns) into the phase sketch (seconds); with ``fields``,
        also sets the step span's phase attributes (seconds) there."""
        inst = self._inst
        record, slots = inst.phase.record_frozen, inst.phase_slots
        if fields is None:
            for p, ns in phases.items():
                key, attrs, _ = slots[p]
                record(ns / 1e9, key, attrs)
            return
        for p, ns in phases.items():
            key, attrs, span_key = slots[p]
            s = ns / 1e9
            record(s, key, attrs)
            fields[span_key] = s

    def phase_fields(self, phases: Mapping[str, int], fields: dict[str, Any]) -> list[float]:
        """Sets one step's phase attributes (seconds) in its span ``fields`` and returns the
        seconds in the order of ``phases`` (per step; the phase sketch gets them later, in
        a batch: :meth:`record_phase_columns`). An unknown phase raises ``KeyError``."""
        span_keys = self._inst.span_keys
        seconds: list[float] = []
        append = seconds.append
        for p, ns in phases.items():
            s = ns / 1e9
            fields[span_keys[p]] = s
            append(s)
        return seconds

    def record_phase_columns(self, columns: Mapping[str, Sequence[float]]) -> None:
        """Records a batch of steps into the phase sketch: per phase, its seconds on every
        step of the batch (in step order), as :meth:`phases` would one step at a time."""
        record_many, attrs = self._inst.phase.record_many, self._inst.phase_attrs
        for p, seconds in columns.items():
            record_many(seconds, attrs[p])

    def set_skew(self, rank: int, skew: float) -> None:
        """This rank's latest skew (exported by ``otelgpu.train.rank.skew``)."""
        with self._inst.lock:
            self._inst.skew[rank] = skew

    # ------------------------------------------------------------------ findings
    def finding(self, finding: Finding, time_ns: int) -> Event:
        """Counts and logs a finding; returns its span event."""
        attrs: dict[str, object] = {N.ATTR_KIND: finding.kind, **finding.attributes}
        if finding.cause:
            attrs[N.ATTR_CAUSE] = finding.cause
        if finding.step is not None:
            attrs.setdefault("otelgpu.train.step", finding.step)
        self._inst.findings.add(
            1, {N.ATTR_KIND: finding.kind, N.ATTR_CAUSE: finding.cause or "none"}
        )
        logger.warning(finding.message, extra={"otelgpu_finding": attrs})
        return (N.EVENT_PREFIX + finding.kind, time_ns, attrs)

    def straggler(self, report: StragglerReport, time_ns: int) -> Event:
        """Counts and logs a straggler report; its span event goes to ``pending``."""
        attrs: dict[str, object] = {N.ATTR_KIND: "straggler", **report.attributes()}
        self._inst.findings.add(1, {N.ATTR_KIND: "straggler", N.ATTR_CAUSE: report.cause})
        logger.warning(report.message(), extra={"otelgpu_finding": attrs})
        event = (N.EVENT_PREFIX + "straggler", time_ns, attrs)
        self.defer(event)
        return event

    def defer(self, event: Event) -> None:
        with self._lock:
            self._pending.append(event)
            del self._pending[:-16]  # bounded

    def has_events(self) -> bool:
        """Whether events are pending (a lock-free peek: one that arrives meanwhile is
        taken with the next step)."""
        return bool(self._pending)

    def take_events(self) -> list[Event]:
        with self._lock:
            got, self._pending = self._pending, []
        return got

    # ------------------------------------------------------------------ verdict
    def verdict(self, verdict: Verdict, start_ns: int, end_ns: int, *, log: bool) -> None:
        """Writes the verdict span (and logs the one-screen text when ``log``)."""
        rt = self.runtime
        attrs: dict[str, Any] = {
            N.VERDICT_JSON: verdict.to_json(),
            N.VERDICT_BOTTLENECK: verdict.bottleneck,
            "otelgpu.verdict.steps": verdict.steps,
            "otelgpu.verdict.stragglers": len(verdict.stragglers),
            "otelgpu.verdict.summary": verdict.headline(),
        }
        for p, share in verdict.phase_shares.items():
            attrs[f"otelgpu.verdict.share.{p}"] = share
        span = rt.tracer.start_span(N.VERDICT_SPAN, start_time=start_ns, attributes=attrs)
        span.end(end_time=max(end_ns, start_ns))
        if log:
            logger.info(verdict.text(), extra={"otelgpu_verdict": json.loads(verdict.to_json())})
