"""GPU-side collective and step timing from CUDA events, on a CPU-only machine.

The queue / resolution / bounding / drop logic runs against :class:`FakeGpu`, an event
double with CUDA's semantics: an event is stamped with the stream position at ``record``
and reports done (``query``) only once the virtual GPU has executed up to it;
``elapsed_time`` raises for undone or non-timing events, as CUDA does. The end-to-end
tests run the real instrumentor, real optimizer hooks and a real Runtime, with
``torch.cuda.Event`` replaced by the double and a fake "collective" that enqueues GPU
work on the virtual stream, and prove that nothing calls ``synchronize`` unless opted in.
The same path on a real GPU: ``tests/gpu/test_gpu_torch.py``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch  # the test command installs it: a missing torch must fail, not skip
import torch.distributed as dist
from fixtures.otel import attributes_of
from fixtures.torch_runtime import Recorder, RuntimeHarness
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed import distributed_c10d as c10d

import otelgpu.instrumentation.torch as torch_inst
from otelgpu.instrumentation.torch import TorchInstrumentor, _step_queue, flush
from otelgpu.instrumentation.torch import _names as N
from otelgpu.instrumentation.torch._config import resolve
from otelgpu.instrumentation.torch._cuda_events import CudaEventTimer, find_cuda_tensor
from otelgpu.instrumentation.torch._patch_io import collective
from otelgpu.instrumentation.torch._steps import StepTracker
from otelgpu.metrics import catalog as C

# ------------------------------------------------------------------ the event double


class FakeGpu:
    """One virtual CUDA stream: work is enqueued in ms, executed when the test advances."""

    def __init__(self) -> None:
        self.tail_ms = 0.0  # end of the work enqueued so far
        self.done_ms = 0.0  # the GPU has executed everything up to here
        self.created = 0
        self.records = 0
        self.syncs = 0

    def enqueue(self, ms: float) -> None:
        self.tail_ms += ms

    def advance(self, ms: float | None = None) -> None:
        """Executes ``ms`` more of the queue (None: all of it)."""
        self.done_ms = self.tail_ms if ms is None else min(self.tail_ms, self.done_ms + ms)

    def Event(self, enable_timing: bool = False, **_: Any) -> FakeEvent:
        self.created += 1
        return FakeEvent(self, enable_timing)


class FakeEvent:
    def __init__(self, gpu: FakeGpu, timing: bool) -> None:
        self.gpu = gpu
        self.timing = timing
        self.at_ms: float | None = None

    def record(self, stream: object = None) -> None:
        self.gpu.records += 1
        self.at_ms = self.gpu.tail_ms

    def query(self) -> bool:
        # CUDA: an event never recorded counts as done.
        return self.at_ms is None or self.gpu.done_ms >= self.at_ms

    def elapsed_time(self, end: FakeEvent) -> float:
        if not (self.timing and end.timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'")
        if self.at_ms is None or end.at_ms is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time")
        if not (self.query() and end.query()):
            raise RuntimeError("CUDA error: device not ready")
        return end.at_ms - self.at_ms

    def synchronize(self) -> None:
        self.gpu.syncs += 1
        if self.at_ms is not None:
            self.gpu.done_ms = max(self.gpu.done_ms, self.at_ms)


class CudaTensor:
    """What the timer looks at on a CUDA tensor: ``is_cuda``."""

    is_cuda = True


class FakeWork:
    """The ``Work`` an ``async_op=True`` collective returns (stands in for ``c10d.Work``).

    ``wait()`` makes the current stream wait for the collective: its GPU time is
    enqueued on the virtual stream then.
    """

    def __init__(self, gpu: FakeGpu | None = None, ms: float = 0.0) -> None:
        self.gpu = gpu
        self.ms = ms

    def wait(self) -> bool:
        if self.gpu is not None:
            self.gpu.enqueue(self.ms)
        return True


def timer(gpu: FakeGpu, **kwargs: Any) -> CudaEventTimer:
    return CudaEventTimer(lambda: gpu.Event(enable_timing=True), **kwargs)


def timed(t: CudaEventTimer, gpu: FakeGpu, op: str, ms: float, host_ns: int = 0) -> None:
    """One collective on a CUDA tensor whose GPU work takes ``ms``."""
    mark = t.begin(op, host_ns, (CudaTensor(),), {})
    assert mark is not None
    gpu.enqueue(ms)
    t.end(mark, None)


# ------------------------------------------------------------------ timer unit tests


def test_cpu_tensors_record_nothing() -> None:
    gpu = FakeGpu()
    t = timer(gpu)
    cpu = torch.ones(3)
    assert t.begin("all_reduce", 0, (cpu,), {}) is None
    assert t.begin("all_gather", 0, ([cpu, cpu], cpu), {}) is None
    assert t.begin("broadcast", 0, (), {"tensor": cpu}) is None
    assert t.begin("barrier", 0, (), {}) is None
    assert t.begin("wait", 0, (FakeWork(),), {}) is None  # not from a CUDA collective
    assert gpu.created == 0
    assert t.poll().ops == []


def test_cuda_tensor_detection() -> None:
    cuda, cpu = CudaTensor(), torch.ones(1)
    assert find_cuda_tensor((cuda,), {})
    assert find_cuda_tensor(([cuda], cpu), {})  # all_gather(tensor_list, tensor)
    assert find_cuda_tensor((cpu, cuda), {})  # all_gather_into_tensor(out, in)
    assert find_cuda_tensor((), {"output_tensor": cuda})
    assert not find_cuda_tensor(([], None), {"group": cuda})


def test_not_ready_then_ready_in_order() -> None:
    gpu = FakeGpu()
    t = timer(gpu)
    gpu.enqueue(5.0)  # compute before the first collective
    timed(t, gpu, "all_reduce", 2.0, host_ns=10)
    timed(t, gpu, "broadcast", 3.0, host_ns=20)
    assert gpu.created == 4 and gpu.records == 4
    assert t.poll().ops == []  # nothing executed yet: no wait, no result
    assert t.oldest_pending_ns() == 10
    gpu.advance(6.0)  # inside the all-reduce
    assert t.poll().ops == []
    gpu.advance(1.0)  # all-reduce done, broadcast not
    got = t.poll().ops
    assert [(r.op, r.host_start_ns, r.gpu_s) for r in got] == [("all_reduce", 10, 0.002)]
    assert t.oldest_pending_ns() == 20
    gpu.advance()
    got = t.poll().ops
    assert [(r.op, r.gpu_s) for r in got] == [("broadcast", 0.003)]
    assert t.oldest_pending_ns() is None
    assert t.resolved == 2 and t.take_dropped() == 0
    assert gpu.syncs == 0


def test_bounded_queue_drops_and_counts() -> None:
    gpu = FakeGpu()
    t = timer(gpu, limit=3)
    for i in range(5):
        timed(t, gpu, "all_reduce", 1.0 + i)
    assert t.take_dropped() == 2
    assert t.take_dropped() == 0
    gpu.advance()
    assert [r.gpu_s for r in t.poll().ops] == [0.001, 0.002, 0.003]  # the first three kept
    timed(t, gpu, "all_reduce", 4.0)  # room again
    gpu.advance()
    assert [r.gpu_s for r in t.poll().ops] == [0.004]


def test_async_op_times_the_wait_not_the_launch() -> None:
    gpu = FakeGpu()
    t = timer(gpu)
    work = FakeWork()
    mark = t.begin("all_reduce", 1, (CudaTensor(),), {"async_op": True})
    assert mark is not None
    t.end(mark, work)  # returned a Work: only the launch happened
    assert t.oldest_pending_ns() is None
    wait = t.begin("wait", 2, (work,), {})
    assert wait is not None
    gpu.enqueue(7.0)  # the current stream waits for the collective
    t.end(wait, True)
    assert t.begin("wait", 3, (work,), {}) is None  # a second wait() is not timed again
    gpu.advance()
    assert [(r.op, r.gpu_s) for r in t.poll().ops] == [("wait", 0.007)]


def test_failed_collective_is_discarded() -> None:
    gpu = FakeGpu()
    t = timer(gpu)
    mark = t.begin("all_reduce", 1, (CudaTensor(),), {})
    assert mark is not None
    t.end(mark, None, ok=False)
    assert t.oldest_pending_ns() is None and gpu.created == 1


def test_sync_only_when_opted_in() -> None:
    gpu = FakeGpu()
    t = timer(gpu, sync=True)
    timed(t, gpu, "all_reduce", 4.0, host_ns=5)
    assert gpu.syncs == 1  # the host waited for the end event
    assert [(r.op, r.host_start_ns, r.gpu_s) for r in t.poll().ops] == [("all_reduce", 5, 0.004)]


def test_step_boundaries_pair_consecutive_steps_only() -> None:
    gpu = FakeGpu()
    ready = [False]
    t = timer(gpu, steps=True, cuda_ready=lambda: ready[0])
    t.boundary(1)  # CUDA not initialised yet: nothing recorded
    assert gpu.created == 0
    ready[0] = True
    for step, ms in ((2, 10.0), (3, 12.0), (4, 9.0)):
        gpu.enqueue(ms)
        t.boundary(step)
    gpu.advance(22.0)  # boundaries 2 and 3 done, 4 not
    assert t.poll().steps == {3: 0.012}  # step 2 has no recorded start
    gpu.advance()
    assert t.poll().steps == {4: 0.009}
    t.boundary(6)  # step 5's end was never recorded (a gap): 6 pairs with nothing
    gpu.enqueue(3.0)
    t.boundary(7)
    gpu.advance()
    assert t.poll().steps == {7: 0.003}
    assert gpu.syncs == 0


def test_nothing_recorded_during_cuda_graph_capture() -> None:
    gpu = FakeGpu()
    capturing = [True]
    t = timer(gpu, steps=True, cuda_ready=lambda: True, capturing=lambda: capturing[0])
    assert t.begin("all_reduce", 0, (CudaTensor(),), {}) is None
    t.boundary(1)
    assert gpu.created == 0
    capturing[0] = False
    assert t.begin("all_reduce", 0, (CudaTensor(),), {}) is not None
    assert t.begin("all_reduce", 0, (torch.ones(1),), {}) is None


def test_comm_off_keeps_step_timing() -> None:
    gpu = FakeGpu()
    t = timer(gpu, comm=False, steps=True, cuda_ready=lambda: True)
    assert t.begin("all_reduce", 0, (CudaTensor(),), {}) is None
    t.boundary(1)
    assert gpu.created == 1


@settings(max_examples=60, deadline=None)
@given(
    script=st.lists(
        st.one_of(
            st.tuples(st.just("op"), st.integers(1, 9)),
            st.tuples(st.just("advance"), st.integers(0, 20)),
        ),
        max_size=40,
    ),
    limit=st.integers(1, 6),
)
def test_every_pair_resolves_exactly_once_or_is_dropped(
    script: list[tuple[str, int]], limit: int
) -> None:
    gpu = FakeGpu()
    t = timer(gpu, limit=limit)
    enqueued: list[float] = []
    got: list[float] = []
    dropped = 0
    for i, (kind, value) in enumerate(script):
        if kind == "op":
            before = t.dropped
            timed(t, gpu, "all_reduce", float(value), host_ns=i)
            if t.dropped == before:
                enqueued.append(value / 1e3)
            dropped += t.dropped - before
        else:
            gpu.advance(float(value))
        got += [r.gpu_s for r in t.poll().ops]
        assert len(got) <= len(enqueued)
    gpu.advance()
    got += [r.gpu_s for r in t.poll().ops]
    assert got == pytest.approx(enqueued)  # each kept pair once, in order, exact
    assert dropped + len(enqueued) == sum(1 for k, _ in script if k == "op")
    assert gpu.syncs == 0


# ------------------------------------------------------------------ through the wrappers


def test_wrapper_never_raises_into_the_loop() -> None:
    class Broken:
        def begin(self, *a: Any) -> None:
            raise RuntimeError("event creation failed")

    recorder = Recorder()
    tracker = StepTracker(recorder.on_step)
    fn = collective("all_reduce", tracker, recorder, Broken())(lambda t: "done")  # type: ignore[arg-type]
    from otelgpu.instrumentation.torch._gate import GATE

    was = GATE.on
    GATE.enable()
    try:
        assert fn(CudaTensor()) == "done"
    finally:
        GATE.on = was
    assert [w for w, _ in recorder.errors] == ["torch.cuda_events.all_reduce"]
    assert [op for op, _ in recorder.comms] == ["all_reduce"]  # host timing unaffected


def test_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from otelgpu.errors import ConfigurationError

    s = resolve({}, {})
    assert (s.cuda_events, s.gpu_step_time, s.cuda_sync) == (True, False, False)
    s = resolve({}, {"OTELGPU_TORCH_CUDA_SYNC": "true", "OTELGPU_TORCH_GPU_STEP_TIME": "1"})
    assert (s.cuda_events, s.gpu_step_time, s.cuda_sync) == (True, True, True)
    assert resolve({"cuda_events": False}, {"OTELGPU_TORCH_CUDA_EVENTS": "on"}).cuda_events is False
    with pytest.raises(ConfigurationError, match="OTELGPU_TORCH_CUDA_SYNC"):
        resolve({}, {"OTELGPU_TORCH_CUDA_SYNC": "always"})


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGpu]:
    """``torch.cuda.Event`` is the double; a fake NCCL-like all_reduce on the stream.

    ``torch.cuda.synchronize`` raises: nothing may call it.
    """
    gpu = FakeGpu()
    monkeypatch.setattr(torch.cuda, "Event", gpu.Event)

    def no_sync(*a: Any, **k: Any) -> None:
        raise AssertionError("torch.cuda.synchronize called")

    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    monkeypatch.setattr(torch_inst, "torch_cuda_ready", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    # Spans are made on flush() only: no background drain racing the virtual GPU.
    monkeypatch.setattr(_step_queue, "WORKER_INTERVAL_S", 3600.0)
    comm_ms: list[float] = []

    def all_reduce(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
        if async_op:  # runs on its own stream; wait() makes the current stream wait
            return FakeWork(gpu, comm_ms.pop(0))
        gpu.enqueue(comm_ms.pop(0))  # the current stream waits for the collective
        return None

    monkeypatch.setattr(c10d, "Work", FakeWork)  # its wait() gets the Work.wait wrapper
    monkeypatch.setattr(c10d, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    gpu.comm_ms = comm_ms  # type: ignore[attr-defined]
    yield gpu


def _loop(
    gpu: FakeGpu, compute_ms: list[float], comm_ms: list[float], *, asynchronous: bool
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gpu.comm_ms += comm_ms  # type: ignore[attr-defined]
    grad = CudaTensor()
    for c in compute_ms:
        model(torch.randn(2, 4)).sum().backward()
        gpu.enqueue(c)  # forward/backward kernels
        if asynchronous:
            work = dist.all_reduce(grad, async_op=True)
            work.wait()
        else:
            dist.all_reduce(grad)
        opt.step()
        opt.zero_grad()


def test_end_to_end_step_spans_get_gpu_comm_and_step_time(
    fake_cuda: FakeGpu, harness: RuntimeHarness
) -> None:
    compute = [10.0, 20.0, 30.0, 40.0]
    comm = [2.0, 3.0, 5.0, 8.0]
    harness.instrument(gpu_step_time=True)
    _loop(fake_cuda, compute, comm, asynchronous=False)
    fake_cuda.advance()  # the GPU caught up; nobody waited for it
    flush()
    spans = harness.step_spans()
    assert len(spans) == 4
    attrs = [attributes_of(s) for s in spans]
    assert [a[N.SPAN_COMM_GPU] for a in attrs] == pytest.approx([c / 1e3 for c in comm])
    # GPU step k = work enqueued between the ends of steps k-1 and k; step 1 has no start.
    assert N.SPAN_STEP_GPU not in attrs[0]
    expected = [(c + m) / 1e3 for c, m in zip(compute[1:], comm[1:], strict=True)]
    assert [a[N.SPAN_STEP_GPU] for a in attrs[1:]] == pytest.approx(expected)
    series = harness.sketch(C.COMM_GPU.name).series()
    assert [(dict(a), s.count) for a, s in series] == [({N.ATTR_COMM_OP: "all_reduce"}, 4)]
    assert series[0][1].sum == pytest.approx(sum(comm) / 1e3)
    step_gpu = harness.sketch(C.STEP_GPU.name).series()
    assert step_gpu[0][1].count == 3
    assert fake_cuda.syncs == 0
    # Only timing events were made: 2 per collective, 1 per step end, and 1 at the first
    # backward's end (a candidate step end while no optimizer had stepped yet).
    assert fake_cuda.created == 2 * 4 + 4 + 1
    assert harness.runtime.stats.errors() == {}


def test_full_queue_drops_are_counted(fake_cuda: FakeGpu, harness: RuntimeHarness) -> None:
    inst = harness.instrument()
    assert inst.telemetry is not None and inst.telemetry.gpu_timer is not None
    timer = inst.telemetry.gpu_timer
    timer.limit = 3
    # Two collectives per step; the GPU never catches up during the loop.
    fake_cuda.comm_ms += [1.0] * 6  # type: ignore[attr-defined]
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        dist.all_reduce(CudaTensor())
        dist.all_reduce(CudaTensor())
        opt.step()
    fake_cuda.advance()  # now it has: 3 pairs resolve, the rest were dropped
    flush()
    assert harness.runtime.stats.dropped()[("torch_cuda_events", "queue_full")] == 3
    attrs = [attributes_of(s) for s in harness.step_spans()]
    assert attrs[0][N.SPAN_COMM_GPU] == pytest.approx(0.002)
    # Step 2 has one pair resolved and one dropped: incomplete, so left out.
    assert [N.SPAN_COMM_GPU in a for a in attrs] == [True, False, False]
    assert harness.sketch(C.COMM_GPU.name).series()[0][1].count == 3
    assert fake_cuda.syncs == 0
    assert harness.runtime.stats.errors() == {}


def test_unresolved_step_gets_no_attribute_but_the_metric_gets_it_later(
    fake_cuda: FakeGpu, harness: RuntimeHarness
) -> None:
    harness.instrument()
    _loop(fake_cuda, [10.0, 10.0, 10.0], [1.0, 2.0, 4.0], asynchronous=True)
    fake_cuda.advance(10.0 + 1.0 + 10.0 + 2.0)  # steps 1-2 done on the GPU, step 3 not
    flush()
    attrs = [attributes_of(s) for s in harness.step_spans()]
    assert [a.get(N.SPAN_COMM_GPU) for a in attrs] == pytest.approx([0.001, 0.002, None])
    assert harness.sketch(C.COMM_GPU.name).series()[0][1].count == 2
    fake_cuda.advance()
    TorchInstrumentor().uninstrument()  # the last drain resolves without waiting
    series = harness.sketch(C.COMM_GPU.name).series()
    assert [(dict(a), s.count) for a, s in series] == [({N.ATTR_COMM_OP: "wait"}, 3)]
    assert series[0][1].max == pytest.approx(0.004)
    assert fake_cuda.syncs == 0
    assert harness.runtime.stats.errors() == {}


def test_cuda_sync_opt_in_resolves_every_step(
    fake_cuda: FakeGpu, harness: RuntimeHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTELGPU_TORCH_CUDA_SYNC", "true")
    harness.instrument()
    _loop(fake_cuda, [10.0, 10.0], [3.0, 6.0], asynchronous=False)
    flush()  # the GPU never advanced: only the opted-in synchronize completed the events
    attrs = [attributes_of(s) for s in harness.step_spans()]
    assert [a[N.SPAN_COMM_GPU] for a in attrs] == pytest.approx([0.003, 0.006])
    assert fake_cuda.syncs == 2


def test_cuda_events_off(fake_cuda: FakeGpu, harness: RuntimeHarness) -> None:
    harness.instrument(cuda_events=False)
    _loop(fake_cuda, [10.0, 10.0], [3.0, 6.0], asynchronous=False)
    fake_cuda.advance()
    flush()
    assert len(harness.step_spans()) == 2
    assert all(N.SPAN_COMM_GPU not in attributes_of(s) for s in harness.step_spans())
    assert fake_cuda.created == 0  # and GPU step time is off by default: no boundary events


def test_gloo_cpu_collectives_touch_no_cuda_api(
    harness: RuntimeHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real 1-process gloo group: CPU all_reduce/all_gather/barrier make no CUDA event."""
    created = itertools.count()

    def no_event(*a: Any, **k: Any) -> None:
        next(created)
        raise AssertionError("a CUDA event was made for a CPU collective")

    monkeypatch.setattr(torch.cuda, "Event", no_event)
    harness.instrument(gpu_step_time=True)
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            t = torch.ones(4)
            dist.all_reduce(t)
            dist.all_reduce(t, async_op=True).wait()
            dist.all_gather([torch.zeros(4)], t)
            dist.barrier()
            opt.step()
            opt.zero_grad()
        flush()
    finally:
        dist.destroy_process_group()
    spans = harness.step_spans()
    assert len(spans) == 3
    assert all(attributes_of(s)[N.SPAN_COMM_WAIT] > 0 for s in spans)  # host timing still on
    assert all(N.SPAN_COMM_GPU not in attributes_of(s) for s in spans)
    assert all(N.SPAN_STEP_GPU not in attributes_of(s) for s in spans)  # CUDA never initialised
    assert next(created) == 0
    assert harness.sketch(C.COMM_GPU.name).series() == []


def test_settings_documented() -> None:
    from otelgpu.instrumentation.torch import environment_variables as ev

    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics-torch.md").read_text()
    names = [v for k, v in vars(ev).items() if k.startswith("OTELGPU_TORCH_")]
    assert {"OTELGPU_TORCH_CUDA_EVENTS", "OTELGPU_TORCH_CUDA_SYNC"} <= set(names)
    for name in names:
        assert f"`{name}`" in doc, name
