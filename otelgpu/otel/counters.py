"""Cheap monotonic counters for hot paths, published as OpenTelemetry observable counters.

``Counter.add`` in the SDK costs several microseconds per call (attribute hashing, view
matching, aggregation under locks). Steps and requests add to a few counters each, so
otelgpu keeps the running totals itself -- a dict update under one short lock -- and
reports them through an observable counter callback at collection time. The exported
data is identical (a cumulative monotonic Sum per attribute set); only the cost moves
from the hot path to the export.

Cardinality is bounded like the sketches: at most ``max_series`` attribute sets, then
one ``otel.metric.overflow=true`` series.
"""

from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otelgpu.otel import slicing
from otelgpu.otel.sketches import OVERFLOW_ATTRIBUTES, _freeze
from otelgpu.otel.stats import InternalStats

_OVERFLOW_KEY = _freeze(OVERFLOW_ATTRIBUTES)
_EMPTY_KEY: frozenset[Any] = frozenset()
_PLAIN = (int, float)  # the fast path of the type check
_INF = math.inf
_MAX_AMOUNT = 2**53  # larger ones would overflow OTLP's int64 points (and poison export)


class LocalCounter:
    """A monotonic counter accumulated in-process (thread-safe, never raises on ``add``)."""

    def __init__(
        self,
        meter: Meter,
        name: str,
        unit: str,
        description: str,
        *,
        max_series: int = 1000,
        stats: InternalStats | None = None,
    ) -> None:
        self.name = name
        self._max_series = max_series
        self._stats = stats
        self._lock = threading.Lock()
        self._values: dict[Any, list[Any]] = {}  # key -> [attributes, total]
        meter.create_observable_counter(
            name, callbacks=[self._observe], unit=unit, description=description
        )

    def add(self, amount: float, attributes: Mapping[str, Any] | None = None) -> None:
        """Add ``amount`` for ``attributes``. Never raises.

        As the SDK's ``Counter.add`` does, an amount that would break monotonicity (negative,
        NaN, infinite, not a number) or unhashable attribute values are dropped -- counted in
        ``otelgpu.internal.errors`` when the counter has ``stats`` -- never raised.
        """
        try:
            if type(amount) not in _PLAIN and (
                isinstance(amount, bool) or not isinstance(amount, numbers.Real)
            ):
                raise TypeError(f"{self.name}: amount must be a number, got {amount!r}")
            if not 0 <= amount <= _MAX_AMOUNT:
                raise ValueError(f"{self.name}: amount must be in [0, 2**53], got {amount!r}")
            key = _freeze(attributes) if attributes else _EMPTY_KEY
        except Exception as exc:  # noqa: BLE001 - hot path: count, never raise
            self._dropped(exc)
            return
        self._accumulate(amount, key, attributes)

    def add_frozen(self, amount: int, key: Any, attributes: Mapping[str, Any]) -> None:
        """:meth:`add` of a plain non-negative ``int`` with the attribute set's key known.

        ``key`` must equal ``otelgpu.otel.sketches.freeze(attributes)`` (for callers that
        add to the same attribute set many times and keep its key). Never raises; any
        other amount takes :meth:`add` and its checks.
        """
        if type(amount) is not int or not 0 <= amount <= _MAX_AMOUNT:
            self.add(amount, attributes)
            return
        self._accumulate(amount, key, attributes)

    def _accumulate(self, amount: float, key: Any, attributes: Mapping[str, Any] | None) -> None:
        """Add a checked ``amount`` to the attribute set ``key``. Never raises."""
        try:
            with self._lock:
                entry = self._values.get(key)
                if entry is None:
                    entry = self._new_entry(key, attributes)
                entry[1] += amount
        except Exception as exc:  # noqa: BLE001 - hot path: count, never raise
            self._dropped(exc)

    def _dropped(self, exc: Exception) -> None:
        if self._stats is not None:
            self._stats.report_error(f"counter {self.name}", exc)

    def _new_entry(self, key: Any, attributes: Mapping[str, Any] | None) -> list[Any]:
        """The entry of a new attribute set, or the overflow one (caller holds the lock)."""
        if len(self._values) >= self._max_series:
            key, attributes = _OVERFLOW_KEY, OVERFLOW_ATTRIBUTES
            entry = self._values.get(key)
            if entry is not None:
                return entry
        entry = self._values[key] = [dict(attributes or {}), 0]
        return entry

    def value(self, attributes: Mapping[str, Any] | None = None) -> float:
        """The total for exactly ``attributes`` (0 if never added)."""
        key = _freeze(attributes) if attributes else _EMPTY_KEY
        with self._lock:
            entry = self._values.get(key)
            return float(entry[1]) if entry is not None else 0.0

    def total(self) -> float:
        """The sum over every attribute set."""
        with self._lock:
            return float(sum(e[1] for e in self._values.values()))

    def reset(self) -> None:
        with self._lock:
            self._values = {}

    def _observe(self, _options: CallbackOptions) -> Iterator[Observation]:
        # A snapshot under the lock, then one observation at a time: the SDK aggregates
        # each as it comes, and the GIL is handed back between them once a slice is used
        # (a counter may have up to ``max_series`` attribute sets; otelgpu.otel.slicing).
        with self._lock:
            entries = [(a, v) for a, v in self._values.values()]
        for attributes, value in entries:
            slicing.tick()
            yield Observation(value, dict(attributes))
