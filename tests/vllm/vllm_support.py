"""Helpers shared by the vLLM tests (a uniquely named module: never import conftest)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from fixtures.otlp_receiver import OtlpReceiver, attributes


@dataclass
class Instrumented:
    """A running otelgpu exporting to ``receiver``."""

    receiver: OtlpReceiver
    handle: Any
    runtime: Any

    def runtime_errors(self) -> dict[str, int]:
        """Errors otelgpu swallowed (``otelgpu.internal.errors``), by place."""
        return dict(self.runtime.stats.errors())

    def finish(self) -> None:
        """Shut otelgpu down: flush all spans and one last metric collection."""
        self.handle.shutdown()

    def spans(self, name: str | None = None) -> list[Any]:
        return [s for _, _, s in self.receiver.spans() if name is None or s.name == name]

    def metrics(self) -> dict[str, Any]:
        """The last exported ``Metric`` message per name."""
        out: dict[str, Any] = {}
        for _, _, metric in self.receiver.metrics():
            out[metric.name] = metric
        return out

    def points(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        """(attributes, data point) of the last export of metric ``name``."""
        metric = self.metrics()[name]
        data = getattr(metric, metric.WhichOneof("data"))
        return [(attributes(p.attributes), p) for p in data.data_points]


def wait_for_samples(runtime: Any, seconds: float = 0.3) -> None:
    """Let the sampler cover the last ``seconds`` of wall time."""
    assert runtime.sampler is not None, "the GPU sampler did not start on the simulated GPU"
    time.sleep(seconds)
