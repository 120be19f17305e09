"""Tail-keeping sampling of step spans: bound the export work per second, keep what matters.

A training loop at thousands of steps per second would otherwise export thousands of
spans per second. :class:`StepSpanSampler` decides, when a step span ends (the whole
step is known then), whether the span is exported:

* always kept: steps that failed (status ERROR), carry a GPU health event (a span event)
  or a health flag (``otelgpu.gpu.lost``, ``…xids``, ``…ecc.uncorrected``,
  ``…throttled_fraction``), and **slow** steps -- longer than twice the running mean
  step time (an exponentially weighted mean over about 100 steps);
* the rest: at most ``per_second`` spans per second (a token bucket of one second's
  worth; the steps always kept do not take from it), so below that rate every step is
  exported and above it 1 in N, evenly spaced, with N = rate / ``per_second``. The
  bucket fills on the steps' own clock (their end times), not when they are decided:
  steps decided in a batch -- the torch instrumentation's background thread takes half
  a second of steps at a time -- are thinned as evenly as steps decided one by one, not
  "the first N of each batch".

Only spans named ``otelgpu.train.step`` are sampled (requests and everything else pass).
Metrics are recorded before any of this and stay exact. A step never exported is counted
once in ``otelgpu.internal.dropped`` with reason ``tail_sampled`` (by the step recorder for
the steps it decided -- after holding them a short while for a GPU health event published
late, ``runtime.held_steps`` -- by the processor for the others). Thread-safe (one short
lock); ``per_second = 0`` keeps every span.

One sampler serves a pipeline (all its span processors): the step recorder decides
*before* it builds a step span's attributes (:meth:`StepSpanSampler.decide`; a step
recorded after the fact is then not even created), and hands the decision to the
processors (:meth:`StepSpanSampler.decided`), which decide themselves only for step
spans nobody decided upstream (:meth:`StepSpanSampler.keep`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry.trace import StatusCode

from otelgpu.metrics.catalog import STEP_SPAN

HEALTH_FLAGS = frozenset(("otelgpu.gpu.lost", "otelgpu.gpu.xids", "otelgpu.gpu.ecc.uncorrected",
                          "otelgpu.gpu.throttled_fraction"))  # fmt: skip
"""The span attributes that flag a GPU health problem (:func:`flagged`)."""
_HEALTH = HEALTH_FLAGS
_SLOW_FACTOR = 2.0
_ALPHA = 0.01  # EWMA weight: about the last 100 steps


_DECIDED_LIMIT = 4096  # upstream decisions waiting for their span's end (bounded)


def flagged(attributes: Mapping[str, Any] | None) -> bool:
    """Whether span ``attributes`` carry a GPU health flag (such a step is always kept)."""
    return bool(attributes) and not _HEALTH.isdisjoint(attributes)  # type: ignore[arg-type]


class StepSpanSampler:
    """Decides which finished step spans are exported (see the module docstring)."""

    def __init__(self, per_second: float) -> None:
        self.per_second = float(per_second)
        self._tokens = self.per_second
        self._last_ns: int | None = None  # the newest end time the bucket was filled to
        self._mean_ns = 0.0
        self._lock = threading.Lock()
        #: span id -> the upstream decision, until the span ends (``decided``/``keep``).
        self._decided: dict[int, bool] = {}

    @property
    def active(self) -> bool:
        """Whether it samples at all (``per_second > 0``)."""
        return self.per_second > 0

    def decide(self, duration_ns: int, important: bool, end_ns: int | None = None) -> bool:
        """Whether to keep a step of ``duration_ns`` that ended at ``end_ns`` (span time,
        ns since the epoch; None: now): a slow step, an ``important`` one (failed, with GPU
        health events or flags), or an ordinary one within the budget. Updates the running
        mean and the budget: call it once per step, in step order. Slow and important
        steps are kept outside the budget (it is the ordinary steps' share). The budget
        fills by the time between the newest end time seen and ``end_ns`` (an end time
        older than that adds nothing: a step of another thread decided late).
        Thread-safe."""
        if self.per_second <= 0:
            return True
        if end_ns is None:
            end_ns = time.time_ns()
        with self._lock:
            mean = self._mean_ns
            self._mean_ns = duration_ns if not mean else mean + _ALPHA * (duration_ns - mean)
            last = self._last_ns
            if last is None or end_ns > last:  # the first step finds the bucket full
                if last is not None:
                    self._tokens = min(
                        self.per_second, self._tokens + (end_ns - last) * self.per_second / 1e9
                    )
                self._last_ns = end_ns
            if important or (mean and duration_ns > _SLOW_FACTOR * mean):
                return True
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False

    def decided(self, span_id: int, keep: bool) -> None:
        """Record the upstream decision on a live step span just before it ends: every
        processor follows it instead of deciding again. :meth:`forget` it once the span
        ended (the processors see a span during its ``end()``). Bounded: past
        ``_DECIDED_LIMIT`` decisions never forgotten, all are."""
        decisions = self._decided
        if len(decisions) >= _DECIDED_LIMIT:
            decisions.clear()
        decisions[span_id] = keep

    def forget(self, span_id: int) -> None:
        """Drop the upstream decision on a span that has ended."""
        self._decided.pop(span_id, None)

    def decided_upstream(self, span: Any) -> bool:
        """Whether the step recorder decided ``span`` (it counts the steps it samples out;
        a processor counts only those it decided itself). Never raises."""
        try:
            return span.context.span_id in self._decided
        except Exception:  # noqa: BLE001
            return False

    def keep(self, span: Any) -> bool:
        """Whether to export ``span`` (an SDK ``ReadableSpan``). Never raises."""
        if self.per_second <= 0 or span.name != STEP_SPAN:
            return True
        try:
            upstream = self._decided.get(span.context.span_id)
            if upstream is not None:
                return upstream
            important = (
                bool(span.events)
                or span.status.status_code is StatusCode.ERROR
                or flagged(span.attributes)
            )
            end = span.end_time
            return self.decide((end or 0) - (span.start_time or 0), important, end)
        except Exception:  # noqa: BLE001 - when in doubt, export
            return True
