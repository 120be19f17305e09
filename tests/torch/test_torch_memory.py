"""CUDA allocator statistics and OOM reporting.

This CPU-only torch build has no CUDA allocator, so the allocator's two entry points
(``torch._C._cuda_memoryStats``, ``torch._C._cuda_attach_out_of_memory_observer``) are
played by :class:`FakeAllocator`, returning the nested dict layout of torch 2.13
(``torch/cuda/memory.py`` flattens exactly this). Everything else is real: torch
training loop, hooks, Runtime, OpenTelemetry SDK.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch  # the test command installs it: a missing torch must fail, not skip
from fixtures.otel import attributes_of
from fixtures.torch_runtime import RuntimeHarness

from otelgpu.instrumentation.torch import TorchInstrumentor, flush
from otelgpu.instrumentation.torch import _names as N
from otelgpu.instrumentation.torch._memory import CudaMemory, parse_stats
from otelgpu.metrics import catalog as C

MiB = 1 << 20


def _stats(allocated: int, reserved: int, peak: int, ooms: int, retries: int = 0) -> dict[str, Any]:
    return {
        "allocated_bytes": {
            "all": {"current": allocated, "peak": peak, "allocated": 0, "freed": 0}
        },
        "reserved_bytes": {"all": {"current": reserved, "peak": reserved}},
        "inactive_split_bytes": {"all": {"current": 3 * MiB}},
        "num_ooms": ooms,
        "num_alloc_retries": retries,
    }


class FakeAllocator:
    """Stands in for the CUDA caching allocator of a CUDA build of torch."""

    def __init__(self) -> None:
        self.initialized = False
        self.stats = _stats(0, 0, 0, 0)
        self.observers: list[Callable[..., None]] = []
        self.reads = 0
        self.torch = SimpleNamespace(
            cuda=SimpleNamespace(is_initialized=lambda: self.initialized, current_device=lambda: 0),
            _C=SimpleNamespace(
                _cuda_memoryStats=self._memory_stats,
                _cuda_attach_out_of_memory_observer=self.observers.append,
            ),
        )

    def _memory_stats(self, device: int) -> dict[str, Any]:
        self.reads += 1
        return self.stats

    def oom(self, allocated: int) -> None:
        """What the allocator does on OOM: observers first, then it counts and raises."""
        for observer in self.observers:
            observer(0, allocated, 80 << 30, 1 * MiB)
        self.stats = {**self.stats, "num_ooms": self.stats["num_ooms"] + 1}


def test_parse_nested_and_flat_stats() -> None:
    nested = parse_stats(1, _stats(10, 20, 15, 2, 5))
    flat = parse_stats(
        1,
        {
            "allocated_bytes.all.current": 10,
            "allocated_bytes.all.peak": 15,
            "reserved_bytes.all.current": 20,
            "reserved_bytes.all.peak": 20,
            "inactive_split_bytes.all.current": 3 * MiB,
            "num_ooms": 2,
            "num_alloc_retries": 5,
        },
    )
    assert nested == flat
    assert (nested.allocated_bytes, nested.reserved_bytes, nested.peak_allocated_bytes) == (
        10,
        20,
        15,
    )
    assert (nested.num_ooms, nested.num_alloc_retries) == (2, 5)


def test_real_cpu_torch_reports_nothing() -> None:
    reader = CudaMemory(torch, lambda attrs: None)
    assert reader.read() is None  # CUDA never initialised here (and never by us)


def test_reader_deltas_and_no_read_before_cuda_init() -> None:
    fake = FakeAllocator()
    reader = CudaMemory(fake.torch, lambda attrs: None)
    assert reader.read() is None and fake.reads == 0
    fake.initialized = True
    fake.stats = _stats(5 * MiB, 8 * MiB, 6 * MiB, ooms=0, retries=1)
    snap, ooms, retries = reader.read()  # type: ignore[misc]
    assert (snap.allocated_bytes, ooms, retries) == (5 * MiB, 0, 0)
    fake.stats = _stats(5 * MiB, 8 * MiB, 6 * MiB, ooms=2, retries=4)
    _, ooms, retries = reader.read()  # type: ignore[misc]
    assert (ooms, retries) == (2, 3)
    assert len(fake.observers) == 1  # attached once, when CUDA was first seen


def test_oom_becomes_span_event_and_counter(harness: RuntimeHarness) -> None:
    fake = FakeAllocator()
    inst = harness.instrument()
    telemetry, session = inst.telemetry, inst.session
    assert telemetry is not None and session is not None
    telemetry.memory = CudaMemory(fake.torch, telemetry.oom)
    fake.initialized = True
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(4):
        fake.stats = _stats((10 + i) * MiB, 64 * MiB, (12 + i) * MiB, fake.stats["num_ooms"])
        if i == 2:
            fake.oom(allocated=63 * MiB)  # e.g. caught by a batch-size finder's retry loop
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    flush()
    spans = harness.step_spans()
    assert len(spans) == 4
    attrs = attributes_of(spans[1])
    assert attrs[N.SPAN_MEM_ALLOCATED] == 11 * MiB
    assert attrs[N.SPAN_MEM_RESERVED] == 64 * MiB
    assert attrs[N.SPAN_MEM_PEAK] == 13 * MiB
    events = {i: [e for e in s.events if e.name == N.EVENT_OOM] for i, s in enumerate(spans)}
    assert [len(v) for v in events.values()] == [0, 0, 1, 0]
    (oom,) = events[2]
    assert attributes_of(oom)["allocated_bytes"] == 63 * MiB
    assert attributes_of(oom)["device_free_bytes"] == 1 * MiB
    assert attributes_of(oom)[N.SPAN_MEM_ALLOCATED] == 12 * MiB  # allocator state at that step
    metrics = harness.metrics()
    assert metrics[C.OOMS.name] == [({N.ATTR_DEVICE: 0}, 1)]
    assert metrics[C.MEMORY_ALLOCATED.name] == [({N.ATTR_DEVICE: 0}, 13 * MiB)]
    assert metrics[C.MEMORY_PEAK.name] == [({N.ATTR_DEVICE: 0}, 15 * MiB)]
    TorchInstrumentor().uninstrument()
    fake.oom(allocated=1)  # the observer cannot be detached: it is inert now
    assert session.tracker._acc.events == []


def test_oom_without_observer_still_counted(harness: RuntimeHarness) -> None:
    fake = FakeAllocator()
    del fake.torch._C._cuda_attach_out_of_memory_observer  # older builds
    inst = harness.instrument()
    telemetry = inst.telemetry
    assert telemetry is not None
    telemetry.memory = CudaMemory(fake.torch, telemetry.oom)
    fake.initialized = True
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(3):
        if i == 1:
            fake.oom(allocated=0)
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    flush()
    spans = harness.step_spans()
    counts = [len([e for e in s.events if e.name == N.EVENT_OOM]) for s in spans]
    assert counts == [0, 1, 0]
    assert harness.metrics()[C.OOMS.name] == [({N.ATTR_DEVICE: 0}, 1)]


def test_cpu_build_stops_probing_after_the_first_step(harness: RuntimeHarness) -> None:
    """This CPU build has no allocator statistics: the first step's probe finds that out
    and the tracker calls no probe from then on (a call per step saved); the steps are
    recorded as before, without memory attributes."""
    inst = harness.instrument()
    telemetry, session = inst.telemetry, inst.session
    assert telemetry is not None and session is not None
    assert session.tracker.probe is not None
    calls = []
    probe = session.tracker.probe

    def counted() -> Any:
        calls.append(1)
        return probe()

    session.tracker.probe = counted
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    flush()
    assert len(calls) == 1 and session.tracker.probe is None
    spans = harness.step_spans()
    assert len(spans) == 5
    assert all(N.SPAN_MEM_ALLOCATED not in attributes_of(s) for s in spans)


def test_a_build_with_allocator_statistics_keeps_probing(harness: RuntimeHarness) -> None:
    """Where the allocator can report (CUDA not initialised yet), the probe stays: the
    first steps carry nothing, the ones after CUDA's first use carry the statistics."""
    fake = FakeAllocator()
    inst = harness.instrument()
    telemetry, session = inst.telemetry, inst.session
    assert telemetry is not None and session is not None
    telemetry._memory_factory = lambda on_oom: CudaMemory(fake.torch, on_oom)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(4):
        fake.initialized = i >= 2
        fake.stats = _stats((10 + i) * MiB, 64 * MiB, (12 + i) * MiB, 0)
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    flush()
    assert session.tracker.probe is not None
    spans = harness.step_spans()
    assert [attributes_of(s).get(N.SPAN_MEM_ALLOCATED) for s in spans] == [
        None,
        None,
        12 * MiB,
        13 * MiB,
    ]
