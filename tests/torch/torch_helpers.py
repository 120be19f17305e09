"""Helpers shared by the torch instrumentation tests (imported as ``torch_helpers``)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from otelgpu.instrumentation.torch._steps import StepRecord
from otelgpu.metrics import catalog


@dataclass
class Recorder:
    """Collects what the hooks report (steps, collectives, checkpoints, errors)."""

    steps: list[StepRecord] = field(default_factory=list)
    comms: list[tuple[str, int]] = field(default_factory=list)
    checkpoints: list[tuple[str, int, int | None]] = field(default_factory=list)
    startups: list[int] = field(default_factory=list)
    errors: list[tuple[str, BaseException]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_step(self, record: StepRecord) -> None:
        self.steps.append(record)

    def comm(self, op: str, start_ns: int, end_ns: int) -> None:
        with self.lock:
            self.comms.append((op, end_ns - start_ns))

    def checkpoint(self, kind: str, start_ns: int, end_ns: int, size_bytes: int | None) -> None:
        with self.lock:
            self.checkpoints.append((kind, end_ns - start_ns, size_bytes))

    def loader_startup(self, start_ns: int, end_ns: int) -> None:
        self.startups.append(end_ns - start_ns)

    def error(self, where: str, exc: BaseException) -> None:
        self.errors.append((where, exc))


class RuntimeHarness:
    """An otelgpu Runtime over in-memory span/metric readers, plus readers for tests."""

    def __init__(self, sampler: object | None = None, **settings: object) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from otelgpu._runtime import Runtime
        from otelgpu._settings import Settings

        self.spans_exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans_exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.runtime = Runtime(
            Settings(gpu=False, **settings),  # type: ignore[arg-type]
            tracer_provider=self.tracer_provider,
            meter_provider=self.meter_provider,
            sampler=sampler,
        )

    def instrument(self, **kwargs: object) -> object:
        from otelgpu.instrumentation.torch import TorchInstrumentor

        inst = TorchInstrumentor()
        inst.instrument(runtime=self.runtime, **kwargs)
        return inst

    def close(self) -> None:
        from otelgpu.instrumentation.torch import TorchInstrumentor

        TorchInstrumentor().uninstrument()

    def step_spans(self) -> list[object]:
        return [
            s for s in self.spans_exporter.get_finished_spans() if s.name == "otelgpu.train.step"
        ]

    def metrics(self) -> dict[str, list[tuple[dict[str, object], object]]]:
        """name -> [(attributes, value-or-point)] of one collection."""
        out: dict[str, list[tuple[dict[str, object], object]]] = {}
        data = self.reader.get_metrics_data()
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    rows = out.setdefault(metric.name, [])
                    for p in metric.data.data_points:
                        rows.append((dict(p.attributes or {}), getattr(p, "value", p)))
        return out

    def sketch(self, name: str) -> object:
        """The runtime's sketch histogram ``name`` (its ``series()`` hold the sketches)."""
        return self.runtime.instrument(catalog.BY_NAME[name])


@contextlib.contextmanager
def sampler_over(sim_scenario: Callable[..., Any], node: dict[str, Any]) -> Iterator[Any]:
    """The real GPU sampler (10 ms) over the simulated ``node`` on the wall clock."""
    from otelgpu.sampler import GpuSampler

    sim_scenario(node, clock="wall")
    sampler = GpuSampler(interval_s=0.01)
    sampler.start()
    time.sleep(0.05)
    try:
        yield sampler
    finally:
        sampler.stop()
