"""Metric names on the two data paths, derived from the metric catalog.

* ``pull``: otelgpu's Prometheus endpoint (``exporters=prometheus``) as the OpenTelemetry
  Prometheus exporter writes it: dots become underscores, the unit becomes a suffix
  (``s`` -> ``_seconds``, ``By`` -> ``_bytes``; ``1`` and ``{...}`` add nothing), counters
  end in ``_total``; a sketch metric is served as its ``<name>.quantile`` gauge and as a
  classic histogram (``<name>_<unit>_bucket{le}``, see :func:`histogram_name`).
* ``otlp``: OTLP into a Prometheus-compatible store with Prometheus naming (VictoriaMetrics
  ``-opentelemetry.usePrometheusNaming``, Mimir, Prometheus >= 3): the same rules, except
  that unit ``1`` becomes ``_ratio`` on a gauge (never doubled) and a sketch is an
  exponential histogram (``<name>_<unit>_bucket``, merged with ``histogram_quantile`` over
  ``vmrange``).
"""

from __future__ import annotations

import re

from otelgpu.metrics import catalog
from otelgpu.metrics.spec import Kind, MetricSpec

__all__ = ["PATHS", "histogram_name", "metric_name", "spec"]

PATHS = ("pull", "otlp")

_UNITS = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "W": "watts", "J": "joules"}
_UNITS.update({"Cel": "celsius", "Hz": "hertz", "MHz": "megahertz", "%": "percent"})
_COUNTERS = (Kind.COUNTER, Kind.OBSERVABLE_COUNTER)


def spec(name: str) -> MetricSpec:
    """The catalog entry of OpenTelemetry metric ``name`` (KeyError when unknown)."""
    for entry in catalog.ALL:
        if entry.name == name:
            return entry
    raise KeyError(f"{name} is not in otelgpu's metric catalog")


def _unit_suffix(unit: str, path: str, kind: Kind) -> str:
    if unit == "1":
        # OTLP -> Prometheus naming adds "_ratio" to gauges only (not to sums).
        return "_ratio" if path == "otlp" and kind is Kind.OBSERVABLE_GAUGE else ""
    if unit.startswith("{"):
        return ""
    word = _UNITS.get(unit)
    return f"_{word}" if word else ""


def metric_name(name: str, path: str = "pull") -> str:
    """The series name of catalog metric ``name`` on ``path`` (``pull`` or ``otlp``).

    For a sketch: the quantile gauge on ``pull``, the histogram's ``_bucket`` series on
    ``otlp``.
    """
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, not {path!r}")
    entry = spec(name)
    base = re.sub(r"[^a-zA-Z0-9_:]", "_", name)
    unit = _unit_suffix(entry.unit, path, entry.kind)
    if unit and base.endswith(unit):  # no doubled suffix (otelgpu.train.data.wait.ratio)
        unit = ""
    if entry.kind is Kind.SKETCH:
        return f"{base}_quantile{unit}" if path == "pull" else f"{base}{unit}_bucket"
    if entry.kind in _COUNTERS:
        return f"{base}{unit}_total"
    return base + unit


def histogram_name(name: str) -> str:
    """The histogram family of sketch metric ``name`` in a store, on either path: the pull
    endpoint's classic histogram and the OTLP exponential histogram (Prometheus naming)
    share it; the series are ``<family>_bucket`` (``le`` or ``vmrange``) and
    ``<family>_count``."""
    entry = spec(name)
    if entry.kind is not Kind.SKETCH:
        raise ValueError(f"{name} is not a sketch metric (no histogram)")
    return metric_name(name, "otlp").removesuffix("_bucket")
