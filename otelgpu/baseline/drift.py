"""A baseline file as the diagnosis drift detectors' baseline (``OTELGPU_BASELINE``).

:class:`FileBaseline` implements :class:`otelgpu.diagnosis.drift.Baseline`: the step-time
distribution learned by ``otelgpu baseline learn --recording`` (the exact merge of the
recorded histograms) stands in for the run's own start, so a run that is slow from its
first step is still compared with what the job normally does. Immutable; thread-safe.
"""

from __future__ import annotations

import os

from otelgpu.baseline.model import load
from otelgpu.sketch import QuantileSketch

__all__ = ["STEP_FIGURE", "FileBaseline"]

STEP_FIGURE = "train_step_p95"


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
