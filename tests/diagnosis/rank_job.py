"""A 4-rank gloo training job on the simulated node, four straggler scenarios in a row.

Usage: ``python rank_job.py PORT OUTDIR SIM_TOML``. The job runs ``SEGMENT`` steps per
scenario (4 exchange windows each), in this order:

0. ``healthy``: every rank alike;
1. ``input``: rank 2's data loader is slow;
2. ``comm``: rank 3's all_reduce returns late (it sleeps inside the collective: a slow
   transport on its side);
3. ``compute``: rank 1 injects a hardware thermal slowdown (clocks x0.5) into its simulated
   GPU and its forward is slowed by the clock ratio its sampler reads.

Each rank writes ``rank<r>.json`` with what its diagnosis concluded. Workers are forked
(torch is imported once); each instruments itself with a real GpuSampler on the simulated
NVML (LOCAL_RANK picks its GPU).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4
SCENARIOS = ("healthy", "input", "comm", "compute")
SEGMENT = 40
STEPS = SEGMENT * len(SCENARIOS)
EVERY = 10
DATA_ITEM_S = 0.00025  # 8 items per batch: 2 ms of data loading per step
SLOW_DATA_ITEM_S = 0.0015  # rank 2 in "input": 12 ms
FORWARD_S = 0.010
COMM_SLEEP_S = 0.010


SEGMENT_NOW = [0]  # the scenario the loop is in (index into SCENARIOS)


class Items(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, slow: bool) -> None:
        self.slow = slow

    def __len__(self) -> int:
        return 8 * (STEPS + 2)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        slow = self.slow and SCENARIOS[SEGMENT_NOW[0]] == "input"
        time.sleep(SLOW_DATA_ITEM_S if slow else DATA_ITEM_S)
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g), torch.randn(1, generator=g)


class Work(torch.nn.Module):
    """A layer whose forward takes FORWARD_S x slowdown (the GPU's clock ratio)."""

    def __init__(self, slowdown: list[float]) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)
        self.slowdown = slowdown

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(FORWARD_S * self.slowdown[0])
        return torch.relu(self.lin(x))


class Handler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def worker(rank: int, port: int, out: str, sim_toml: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD),
    )
    torch.set_num_threads(1)  # 4 ranks share 2 cores: no intra-op thread pools fighting
    from otelgpu import sim

    gpu = sim.activate(sim_toml, clock="wall")
    from otelgpu.sampler import GpuSampler

    sampler = GpuSampler(interval_s=0.05)
    sampler.start()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from fixtures.otel import attributes_of, span_seconds
    from fixtures.torch_runtime import RuntimeHarness

    import otelgpu.diagnosis as D
    from otelgpu.diagnosis import names as N
    from otelgpu.diagnosis.stragglers import RankSummary, StragglerReport
    from otelgpu.instrumentation.torch import flush

    if rank == 3:
        # A slow transport on rank 3: its gradient all_reduce returns late (installed
        # before otelgpu wraps the collectives, so the sleep is inside the measured call).
        # Only that collective: if a rank were slow by the same amount in *every*
        # collective, every rank's waits would be alike and no host timing could tell.
        c10d = dist.distributed_c10d
        fast = c10d.all_reduce

        def slow_all_reduce(*args: Any, **kwargs: Any) -> Any:
            result = fast(*args, **kwargs)
            tensor = args[0] if args else kwargs.get("tensor")
            if SCENARIOS[SEGMENT_NOW[0]] == "comm" and getattr(tensor, "numel", int)() > 1:
                time.sleep(COMM_SLEEP_S)
            return result

        c10d.all_reduce = slow_all_reduce
        dist.all_reduce = slow_all_reduce
    handler = Handler()
    logging.getLogger("otelgpu.diagnosis").addHandler(handler)
    h = RuntimeHarness(sampler=sampler)
    h.instrument(exchange_every=EVERY)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    diagnosis = D.active()
    assert diagnosis is not None
    assessed: list[dict[str, object]] = []
    feed = diagnosis.stragglers.feed

    def feed_and_keep(rows: Sequence[RankSummary]) -> list[StragglerReport]:
        got = feed(rows)
        latest = diagnosis.stragglers.latest
        if latest is not None:
            assessed.append(
                {
                    str(r): [
                        round(a.excess_share, 3),
                        a.cause,
                        round(a.skew, 3),
                        {k: round(v * 1e3, 2) for k, v in a.by_cause.items()},
                    ]
                    for r, a in latest.ranks.items()
                }
            )
        return got

    diagnosis.stragglers.feed = feed_and_keep  # type: ignore[method-assign]
    torch.manual_seed(0)
    slowdown = [1.0]
    model = torch.nn.Sequential(Work(slowdown), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Items(rank == 2), batch_size=8)
    uuid = sampler.devices[0].uuid
    for step, (x, y) in enumerate(loader):
        if step >= STEPS:
            break
        SEGMENT_NOW[0] = step // SEGMENT
        scenario = SCENARIOS[SEGMENT_NOW[0]]
        if scenario == "compute" and rank == 1 and step % SEGMENT == 0:
            gpu.inject("throttle", gpu=1, reason="hw_thermal", duration_s=600, clock_factor=0.5)
            # A real throttle outlasts many sampling rounds; here the segment is 40 short
            # steps, and a pure-Python sampler starved by 4 ranks on 2 cores may not run a
            # round in time: sample once now, so the segment starts throttled.
            sampler.sample_once()
        latest = sampler.latest(uuid)
        if scenario == "compute" and latest is not None and latest.sm_clock_mhz:
            # compute slows in proportion to the clock the GPU runs at (throttled: 0.5x)
            slowdown[0] = NOMINAL_CLOCK_MHZ / latest.sm_clock_mhz
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        grads = torch.cat([_grad(p).flatten() for p in model.parameters()])
        dist.all_reduce(grads)
        opt.step()
        opt.zero_grad()
        dist.all_reduce(loss.detach().clone())
    flush()
    # wait for the last window's exchange to complete on this rank's thread
    deadline = time.time() + 20
    while diagnosis.exchange is not None and diagnosis.exchange.completed < STEPS // EVERY:
        if time.time() > deadline:
            break
        time.sleep(0.02)
    spans = h.step_spans()
    sums = []
    for s in spans:
        a = attributes_of(s)
        total = sum(a[N.SPAN_PHASE_PREFIX + p] for p in N.PHASES)
        sums.append(total / span_seconds(s))
    events = [
        attributes_of(e) for s in spans for e in s.events if e.name == "otelgpu.diagnosis.straggler"
    ]
    latest_window = diagnosis.stragglers.latest
    findings = {tuple(sorted(a.items())): v for a, v in h.metrics().get(N.FINDINGS.name, [])}
    skew = [v for a, v in h.metrics().get(N.RANK_SKEW.name, [])]
    result = {
        "rank": rank,
        "uuid": uuid,
        "steps": len(spans),
        "phase_sum_ratios": sums,
        "reports": [
            {
                "rank": r.rank,
                "cause": r.cause,
                "gpu_uuid": r.gpu_uuid,
                "host": r.host,
                "evidence": list(r.evidence),
                "excess_share": r.excess_share,
                "scenario": SCENARIOS[(r.last_step - 1) // SEGMENT],
            }
            for r in diagnosis.stragglers.reported
        ],
        "events": [
            {k: (list(v) if isinstance(v, tuple) else v) for k, v in e.items()} for e in events
        ],
        "logs": [line for line in handler.lines if "straggler" in line],
        "findings": [[dict(k), v] for k, v in findings.items()],
        "skew": skew,
        "worst": None
        if latest_window is None or latest_window.worst is None
        else latest_window.worst.rank,
        "windows": diagnosis.stragglers.windows,
        "assessed": assessed,
        "exchange_timeouts": diagnosis.exchange.timeouts if diagnosis.exchange else None,
        "errors": h.runtime.stats.errors(),
    }
    h.close()
    verdict = D.verdict()
    result["verdict"] = None if verdict is None else verdict.to_dict()
    result["verdict_text"] = None if verdict is None else verdict.text()
    sampler.stop()
    dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def _grad(p: torch.Tensor) -> torch.Tensor:
    assert p.grad is not None, "backward() ran: every parameter has a gradient"
    return p.grad


NOMINAL_CLOCK_MHZ = 1980  # H100-SXM boost clock in the simulator's model

if __name__ == "__main__":
    port, out, sim_toml = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    mp.start_processes(  # type: ignore[attr-defined]  # re-exported by torch without __all__
        worker, args=(port, out, sim_toml), nprocs=WORLD, join=True, start_method="fork"
    )
