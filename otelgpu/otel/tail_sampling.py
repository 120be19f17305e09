"""Tail-keeping sampling of step spans: bound the export work per second, keep what matters.

A training loop at thousands of steps per second would otherwise export thousands of
spans per second. :class:`StepSpanSampler` decides, when a step span ends (the whole
step is known then), whether the span is exported:

* always kept: steps that failed (status ERROR), carry a GPU health event (a span event)
  or a health flag (``otelgpu.gpu.lost``, ``…xids``, ``…ecc.uncorrected``,
  ``…throttled_fraction``), and **slow** steps -- longer than twice the running mean
  step time (an exponentially weighted mean over about 100 steps);
* the rest: at most ``per_second`` spans per second (a token bucket of one second's
  worth), so below that rate every step is exported and above it 1 in N, evenly spaced,
  with N = rate / ``per_second``.

Only spans named ``otelgpu.train.step`` are sampled (requests and everything else pass).
Metrics are recorded before any of this and stay exact. A sampled-out span is counted in
``otelgpu.internal.dropped`` with reason ``tail_sampled``. Thread-safe (one short lock);
``per_second = 0`` keeps every span.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from opentelemetry.trace import StatusCode

from otelgpu.metrics.catalog import STEP_SPAN

_HEALTH = ("otelgpu.gpu.lost", "otelgpu.gpu.xids", "otelgpu.gpu.ecc.uncorrected",
           "otelgpu.gpu.throttled_fraction")  # fmt: skip
_SLOW_FACTOR = 2.0
_ALPHA = 0.01  # EWMA weight: about the last 100 steps


class StepSpanSampler:
    """Decides which finished step spans are exported (see the module docstring)."""

    def __init__(self, per_second: float) -> None:
        self.per_second = float(per_second)
        self._tokens = self.per_second
        self._last = time.monotonic()
        self._mean_ns = 0.0
        self._lock = threading.Lock()

    def keep(self, span: Any) -> bool:
        """Whether to export ``span`` (an SDK ``ReadableSpan``). Never raises."""
        if self.per_second <= 0 or span.name != STEP_SPAN:
            return True
        try:
            duration = (span.end_time or 0) - (span.start_time or 0)
            with self._lock:
                mean = self._mean_ns
                self._mean_ns = duration if not mean else mean + _ALPHA * (duration - mean)
                now = time.monotonic()
                self._tokens = min(
                    self.per_second, self._tokens + (now - self._last) * self.per_second
                )
                self._last = now
                if self._tokens >= 1.0:
                    self._tokens -= 1.0
                    return True
            if mean and duration > _SLOW_FACTOR * mean:
                return True
            if span.events or span.status.status_code is StatusCode.ERROR:
                return True
            attributes = span.attributes
            return any(key in attributes for key in _HEALTH)
        except Exception:  # noqa: BLE001 - when in doubt, export
            return True
