"""GPM (SM / tensor / DRAM activity) against a real Hopper-or-newer GPU, both twins.

Deselected by default (marker ``gpu``); ``make test-gpu`` runs it. Skipped without a
CUDA build of torch and a GPU, and -- with NVML's reason -- on GPUs without GPM
(pre-Hopper, or a MIG instance without GPM access). What it proves:

* a loop of large half-precision matmuls keeps the tensor pipes busy: the sampler's
  ``tensor_activity_pct`` over the loop is > 50 %;
* a loop of large device-to-device copies saturates DRAM: ``dram_activity_pct`` > 50 %
  while ``tensor_activity_pct`` < 5 % -- the case ``hw.gpu.utilization`` cannot tell
  apart from the matmul loop (both read ~100 % there).

NVML's GPM metrics are averages between two GPM samples taken >= 100 ms apart, so each
loop runs ~2 s and the window leaves out the first and last 300 ms.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch  # a test dependency: missing must fail, not skip

from otelgpu import _impl
from otelgpu.sampler import BaseGpuSampler, NativeGpuSampler, PyGpuSampler

pytestmark = pytest.mark.gpu

TWINS: list[Any] = [pytest.param(PyGpuSampler, id="py")]
if not _impl.NO_EXTENSIONS:
    TWINS.append(pytest.param(NativeGpuSampler, id="native"))

LOOP_S = 2.0
MARGIN_NS = 300_000_000


def _device_uuid() -> str:
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} sees no CUDA GPU")
    return "GPU-" + str(torch.cuda.get_device_properties(0).uuid)


@pytest.fixture(params=TWINS)
def sampler(request: pytest.FixtureRequest) -> Iterator[BaseGpuSampler]:
    uuid = _device_uuid()
    cls = request.param
    assert cls is not None, "native sampler did not load although extensions are enabled"
    s = cls([uuid], interval_s=0.1)
    s.start()
    time.sleep(0.3)  # the first GPM sample is only the baseline of the next ones
    if "gpm" not in s.supported_fields(s.devices[0].uuid):
        reason = s.unsupported_fields(s.devices[0].uuid).get("gpm", "unknown")
        s.close()
        pytest.skip(f"no GPM on this GPU: {reason}")
    yield s
    s.close()


def _run(sampler: BaseGpuSampler, body: Callable[[], None]) -> Any:
    """Run ``body`` repeatedly for LOOP_S seconds; the window over its middle."""
    torch.cuda.synchronize()
    start = sampler.now_ns()
    deadline = time.monotonic() + LOOP_S
    while time.monotonic() < deadline:
        body()
        torch.cuda.synchronize()  # keep the queue short: the loop ends when it says
    end = sampler.now_ns()
    time.sleep(0.25)  # the GPM interval that ends after `end` is not needed, but let
    #                    the sampler take the one that covers the last loop iterations
    stats = sampler.window(sampler.devices[0].uuid, start + MARGIN_NS, end - MARGIN_NS)
    assert stats is not None
    print(
        f"{sampler.implementation}: util {stats.gpu_util_mean_pct} sm {stats.sm_activity_pct} "
        f"tensor {stats.tensor_activity_pct} dram {stats.dram_activity_pct}"
    )
    return stats


def test_matmul_loop_keeps_tensor_pipes_busy(sampler: BaseGpuSampler) -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)

    def body() -> None:
        for _ in range(8):
            torch.mm(a, b)

    stats = _run(sampler, body)
    assert stats.tensor_activity_pct is not None and stats.tensor_activity_pct > 50.0
    assert stats.sm_activity_pct is not None and stats.sm_activity_pct > 50.0


def test_memcpy_loop_saturates_dram_not_tensor_pipes(sampler: BaseGpuSampler) -> None:
    src = torch.empty(1 << 30, device="cuda", dtype=torch.uint8)  # 1 GiB, L2 is ~50 MB
    dst = torch.empty_like(src)

    def body() -> None:
        for _ in range(8):
            dst.copy_(src)

    stats = _run(sampler, body)
    assert stats.dram_activity_pct is not None and stats.dram_activity_pct > 50.0
    assert stats.tensor_activity_pct is not None and stats.tensor_activity_pct < 5.0
