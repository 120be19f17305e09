"""One-off cost of zero-code FLOP counting: the counted step against ordinary steps.

A small transformer-like CPU model (embedding, four 256-wide Linear layers with GELU,
two micro-batches of 16 x 64 tokens per optimizer step) trains under
``TorchInstrumentor`` with FLOP counting on. Each step's **thread CPU time**
(``time.thread_time``: load-independent on a shared machine) is recorded together with
the counter's phase at the step's start, and the counted step, the discovery step (global
module hooks on) and the median ordinary step (shape-signature hook on) are compared.
Also reported: the CPU time of one call of the shape-signature hook.

Run: ``.venv/bin/python benchmarks/bench_torch_flops.py`` (about 10 s).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import torch

STEPS = 60


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(1000, 256)
        self.layers = torch.nn.Sequential(
            *(m for _ in range(4) for m in (torch.nn.Linear(256, 256), torch.nn.GELU()))
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.layers(self.embed(ids))


def main() -> None:
    from otelgpu.instrumentation.torch import TorchInstrumentor, flush
    from otelgpu.instrumentation.torch._flops import FlopsCounter

    torch.set_num_threads(1)
    TorchInstrumentor().instrument()
    session = TorchInstrumentor().session
    assert session is not None
    (counter,) = [e for e in session.extensions if isinstance(e, FlopsCounter)]
    model = Model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    by_phase: dict[str, list[float]] = {}
    for _ in range(STEPS):
        phase = counter.phase
        t0 = time.thread_time()
        for _ in range(2):
            model(torch.randint(0, 1000, (16, 64))).square().mean().backward()
        opt.step()
        opt.zero_grad()
        by_phase.setdefault(phase, []).append(time.thread_time() - t0)
    flush()
    _hook_cost(counter)  # while the hooks are on
    TorchInstrumentor().uninstrument()
    watch = statistics.median(by_phase["watch"])
    analytic = 6 * sum(p.numel() for p in model.layers.parameters() if p.dim() == 2) * 2048
    print(
        f"load average {os.getloadavg()[0]:.2f}; counted FLOPs per step "
        f"{list(counter.by_signature.values())} (6 x Linear weights x tokens = {analytic})"
    )
    for phase in ("start", "discover", "count", "watch"):
        times = by_phase.get(phase, [])
        if times:
            t = statistics.median(times[1:] or times)  # warm-up: without the very first step
            print(
                f"{phase:9s} steps {len(times):3d}  thread CPU {t * 1e3:7.2f} ms"
                f"  ({t / watch:.2f}x the median ordinary step)"
            )


def _hook_cost(counter: Any) -> None:
    ids = torch.randint(0, 1000, (16, 64))
    n = 20000
    t0 = time.thread_time()
    for _ in range(n):
        counter._root_pre(None, (ids,), {})
        counter._calls.clear()
    print(f"shape-signature hook: {(time.thread_time() - t0) / n * 1e6:.2f} µs per call")


if __name__ == "__main__":
    main()
