"""A baseline file as the diagnosis drift detectors' baseline (``OTELGPU_BASELINE``).

:class:`FileBaseline` implements :class:`otelgpu.diagnosis.drift.Baseline`: a distribution
learned by ``otelgpu baseline learn --recording`` (the exact merge of the recorded
histograms: step time, request duration, TTFT) stands in for the run's own start, so a
run that is slow from its first step is still compared with what the job normally does.
Immutable; thread-safe.
"""

from __future__ import annotations

import os

from otelgpu.baseline.model import load
from otelgpu.sketch import QuantileSketch

__all__ = ["DISTRIBUTION_FIGURES", "STEP_FIGURE", "FileBaseline", "check_file", "file_baseline"]

STEP_FIGURE = "train_step_p95"
DISTRIBUTION_FIGURES = (STEP_FIGURE, "inference_request_p99", "inference_ttft_p99")
"""Figures whose recorded distribution a drift detector can use."""


class FileBaseline:
    """The recorded distribution of ``figure`` from a baseline file.

    Raises ``ValueError`` (naming the file) when the file cannot be read or holds no
    distribution for ``figure`` (a baseline learned from a store holds only figures).
    """

    def __init__(self, path: str | os.PathLike[str], figure: str = STEP_FIGURE) -> None:
        baseline = load(path)
        sketch = baseline.sketch(figure)
        if sketch is None or sketch.count == 0:
            raise ValueError(
                f"{path}: no {figure} distribution (learn it from recordings: "
                "otelgpu baseline learn --recording FILE…)"
            )
        self.path = os.fspath(path)
        self._sketch: QuantileSketch = sketch

    def add(self, value: float) -> None:
        """The run's values are not the baseline: ignored."""

    def sketch(self) -> QuantileSketch | None:
        return self._sketch


def file_baseline(path: str | None, figure: str) -> FileBaseline | None:
    """``FileBaseline(path, figure)``, or None when no file is set or it lacks ``figure``
    (that detector then keeps the run's own start)."""
    if path is None:
        return None
    try:
        return FileBaseline(path, figure)
    except ValueError:
        return None


def check_file(path: str) -> str:
    """``path`` if it is a baseline file holding at least one distribution, else ValueError."""
    baseline = load(path)
    if not any(baseline.sketch(f) is not None for f in DISTRIBUTION_FIGURES):
        raise ValueError(f"{path}: no recorded distribution ({', '.join(DISTRIBUTION_FIGURES)})")
    return os.fspath(path)
