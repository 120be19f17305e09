"""CUDA-event timing of the torch instrumentation on a real GPU (single GPU, no NCCL peers).

Deselected by default (marker ``gpu``); ``make test-gpu`` runs it. Without a CUDA build
of torch and a GPU every test is skipped with the reason. What it proves:

* CUDA timing events around a matmul and around a real collective on a CUDA tensor
  (a 1-process NCCL group, gloo where NCCL is missing) resolve, without any
  synchronisation by otelgpu, to plausible durations;
* an instrumented training loop under ``torch.cuda.set_sync_debug_mode("error")``
  (torch raises on any synchronising CUDA call) gets ``otelgpu.train.comm.gpu`` and
  ``otelgpu.train.step.gpu`` on its step spans;
* the per-collective cost of the two event records (printed, bounded loosely).

The CPU-only twin of this logic, with an event double: ``tests/torch/test_torch_cuda_events.py``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch  # a test dependency: missing must fail, not skip
from fixtures.otel import attributes_of
from fixtures.torch_runtime import RuntimeHarness

pytestmark = pytest.mark.gpu


def _skip_without_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} sees no CUDA GPU")


@pytest.fixture
def runtime() -> Iterator[RuntimeHarness]:
    """An otelgpu Runtime on in-memory providers (spans and metrics readable)."""
    _skip_without_cuda()
    harness = RuntimeHarness()
    yield harness
    harness.close()


@pytest.fixture
def group(tmp_path: Path) -> Iterator[str]:
    """A 1-process process group: NCCL where available, else gloo."""
    _skip_without_cuda()
    import torch.distributed as dist

    backend = "nccl" if dist.is_nccl_available() else "gloo"
    torch.cuda.set_device(0)
    dist.init_process_group(
        backend, init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        warm = torch.ones(1024, device="cuda")
        dist.all_reduce(warm)  # communicator set-up happens here, outside the checks
        torch.cuda.synchronize()
        yield backend
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _no_sync_allowed(backend: str) -> Iterator[None]:
    """torch raises on any synchronising CUDA call inside (NCCL only: gloo's CUDA path
    copies through the host and synchronises by design)."""
    if backend != "nccl":
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _resolve_all(timer: Any, deadline_s: float = 10.0) -> list[Any]:
    """Polls (non-blocking) until nothing is pending, sleeping on the host meanwhile."""
    out: list[Any] = []
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        out += timer.poll().ops
        if timer.oldest_pending_ns() is None:
            return out
        time.sleep(0.001)
    raise AssertionError("CUDA events did not resolve within the deadline")


def test_events_around_matmul_and_collective_resolve(group: str) -> None:
    import torch.distributed as dist

    from otelgpu.instrumentation.torch._cuda_events import CudaEventTimer, torch_event_factory

    timer = CudaEventTimer(torch_event_factory(torch))
    a = torch.randn(4096, 4096, device="cuda")
    a @ a  # cuBLAS and kernel loading before anything is timed
    torch.cuda.synchronize()
    # Reference: the same matmul timed with events and an explicit synchronize.
    ref_start = torch.cuda.Event(enable_timing=True)
    ref_end = torch.cuda.Event(enable_timing=True)
    ref_start.record()
    for _ in range(5):
        a @ a
    ref_end.record()
    ref_end.synchronize()
    ref_s = ref_start.elapsed_time(ref_end) / 1e3

    with _no_sync_allowed(group):
        mark = timer.begin("matmul", 0, (a,), {})
        assert mark is not None
        for _ in range(5):
            a @ a
        timer.end(mark, None)
        grad = torch.ones(1 << 20, device="cuda")
        mark = timer.begin("all_reduce", 1, (grad,), {})
        assert mark is not None
        timer.end(mark, dist.all_reduce(grad))
        work = dist.all_reduce(grad, async_op=True)
        launch = timer.begin("all_reduce", 2, (grad,), {})
        assert launch is not None
        timer.end(launch, work)  # async: the launch is not timed, its wait() is
        wait = timer.begin("wait", 3, (work,), {})
        assert wait is not None
        timer.end(wait, work.wait())
    got = _resolve_all(timer)
    by_start = {r.host_start_ns: r for r in got}
    print(f"backend={group} reference matmul x5: {ref_s * 1e3:.3f} ms; resolved: {got}")
    assert sorted(by_start) == [0, 1, 3]
    assert by_start[0].gpu_s == pytest.approx(ref_s, rel=0.5)
    # One rank: NCCL may have nothing to move, so the pair can be ~0 (never negative).
    assert 0 <= by_start[1].gpu_s < 0.5
    assert 0 <= by_start[3].gpu_s < 0.5
    assert timer.take_dropped() == 0


def _train_step(model: Any, opt: Any, x: Any) -> None:
    import torch.distributed as dist

    model(x).square().mean().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)  # the "gradient all-reduce", on the CUDA stream
    opt.step()
    opt.zero_grad(set_to_none=False)


def test_instrumented_loop_gets_gpu_comm_and_step_time(
    runtime: RuntimeHarness, group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from otelgpu.instrumentation.torch import _names as N
    from otelgpu.instrumentation.torch import _step_queue, flush

    # Spans are made at flush(): a background drain during the loop would find the
    # GPU behind and (correctly) leave the attribute out, which is tested on CPU.
    monkeypatch.setattr(_step_queue, "WORKER_INTERVAL_S", 3600.0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048)
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(512, 2048, device="cuda")
    _train_step(model, opt, x)  # cuBLAS/NCCL set-up before the no-sync window
    torch.cuda.synchronize()
    runtime.instrument(gpu_step_time=True)
    steps = 8
    began = torch.cuda.Event(enable_timing=True)
    ended = torch.cuda.Event(enable_timing=True)
    host_start = time.perf_counter()
    with _no_sync_allowed(group):
        began.record()
        for _ in range(steps):
            _train_step(model, opt, x)
        ended.record()
    host_loop_s = time.perf_counter() - host_start
    ended.synchronize()  # the test waits for the GPU; otelgpu never did
    loop_gpu_s = began.elapsed_time(ended) / 1e3
    flush()
    spans = runtime.step_spans()
    assert len(spans) == steps
    attrs = [attributes_of(s) for s in spans]
    for a in attrs:
        print({k: v for k, v in a.items() if ".gpu" in k or ".wait" in k})
    comm = [a[N.SPAN_COMM_GPU] for a in attrs]
    assert all(0 <= c < loop_gpu_s for c in comm)
    step_gpu = [a.get(N.SPAN_STEP_GPU) for a in attrs]
    assert step_gpu[0] is None  # the first step has no recorded start
    assert all(s is not None and 0 < s <= loop_gpu_s for s in step_gpu[1:])
    assert sum(step_gpu[1:]) <= loop_gpu_s * 1.01  # type: ignore[arg-type]
    # Each step's collectives ran inside that step on the same stream.
    for c, s in zip(comm[1:], step_gpu[1:], strict=True):
        assert c <= s  # type: ignore[operator]
    print(
        f"backend={group}: loop GPU {loop_gpu_s * 1e3:.2f} ms, host {host_loop_s * 1e3:.2f} ms, "
        f"step GPU {[round(s * 1e3, 3) for s in step_gpu[1:]]} ms"  # type: ignore[operator]
    )


def test_event_pair_cost(group: str) -> None:
    from otelgpu.instrumentation.torch._cuda_events import CudaEventTimer, torch_event_factory

    timer = CudaEventTimer(torch_event_factory(torch), limit=100_000)
    t = torch.ones(16, device="cuda")
    n = 2000
    began = time.perf_counter()
    for i in range(n):
        mark = timer.begin("all_reduce", i, (t,), {})
        assert mark is not None
        timer.end(mark, None)
    per_pair_us = (time.perf_counter() - began) / n * 1e6
    began = time.perf_counter()
    resolved = _resolve_all(timer)
    poll_us = (time.perf_counter() - began) / n * 1e6
    cpu = torch.ones(16)
    began = time.perf_counter()
    for i in range(n):
        assert timer.begin("all_reduce", i, (cpu,), {}) is None
    cpu_us = (time.perf_counter() - began) / n * 1e6
    print(
        f"event pair: {per_pair_us:.2f} µs record, {poll_us:.2f} µs to resolve; "
        f"CPU-tensor check {cpu_us:.3f} µs"
    )
    assert len(resolved) == n
    assert per_pair_us < 200 and cpu_us < 20


def test_step_spans_attributed_to_the_device_in_use() -> None:
    """``step_devices=auto`` on a real GPU: the step spans carry the context of the device
    holding the model (torch's ordinal mapped to the sampled GPU), not of every GPU."""
    _skip_without_cuda()
    from otelgpu.instrumentation.torch import flush
    from otelgpu.sampler import GpuSampler

    ordinal = torch.cuda.device_count() - 1
    sampler = GpuSampler(interval_s=0.01)
    sampler.start()
    harness = RuntimeHarness(sampler=sampler)
    try:
        harness.instrument()
        model = torch.nn.Linear(256, 256).to(f"cuda:{ordinal}")
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(4):
            model(torch.randn(64, 256, device=f"cuda:{ordinal}")).sum().backward()
            opt.step()
            time.sleep(0.05)
        flush()
    finally:
        harness.close()
        sampler.stop()
    expected = next(d.uuid for d in sampler.devices if d.cuda_index == ordinal)
    steps = [attributes_of(s) for s in harness.step_spans()]
    assert len(steps) == 4
    assert {a.get("hw.id") for a in steps} == {expected}
