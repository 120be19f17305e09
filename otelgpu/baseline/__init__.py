"""The operating loop: learn a baseline from history, derive alert thresholds, tighten later.

* :mod:`otelgpu.baseline.names` -- metric names on each data path, from the catalog.
* :mod:`otelgpu.baseline.figures` -- what a baseline holds (one :class:`Figure` per signal).
* :mod:`otelgpu.baseline.history` -- history from a Prometheus-compatible query API.
* :mod:`otelgpu.baseline.learn` -- figures from that history or from local recordings;
  too little history raises :class:`InsufficientHistory` (never a guessed threshold).
* :mod:`otelgpu.baseline.model` -- the versioned baseline file (``docs/baseline.md``).
* :mod:`otelgpu.baseline.rules` -- Prometheus alerting rules (and their promtool tests).
* :mod:`otelgpu.baseline.tighten` -- tighter thresholds from newer history, with the
  extra alert rate they would have caused on it.
* :mod:`otelgpu.baseline.dashboards` -- Grafana dashboards as code.
* :mod:`otelgpu.baseline.drift` -- a baseline file as the diagnosis drift detectors' baseline.
"""
