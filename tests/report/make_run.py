"""Write a synthetic but real recording: the real runtime, the simulated GPU, the recording
exporter; step and request durations drawn from fixed-seed distributions.

    python make_run.py OUT_DIR --seed N [--slow-steps F] [--slow-ttft F] [--steps N] [--requests N]

Steps: lognormal around 20 ms; 25 % of each step is data wait (``otelgpu.train.data.wait``),
5 % checkpoint, the rest compute. Requests: latency ~120 ms, TTFT ~40 ms, time per token
~3 ms, queue ~8 ms; 2 % fail. ``--slow-steps 1.3`` multiplies step durations by 1.3 (and
nothing else); ``--slow-ttft 1.5`` multiplies TTFT only.
"""

from __future__ import annotations

import argparse
import random
import time

import otelgpu
from otelgpu import _runtime, sim
from otelgpu.runtime.records import RequestRecord, StepRecord

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--seed", type=int, default=1)
parser.add_argument("--slow-steps", type=float, default=1.0)
parser.add_argument("--slow-ttft", type=float, default=1.0)
parser.add_argument("--steps", type=int, default=1000)
parser.add_argument("--requests", type=int, default=1000)
args = parser.parse_args()

sim.activate("healthy-8xh100", clock="wall")
handle = otelgpu.instrument(
    service_name="make-run",
    exporters="recording",
    recording_dir=args.out,
    frameworks="none",
    metric_export_interval_ms=60_000,
    step_spans_per_second=0,  # every step span: the report tests count them
)
rt = _runtime.current()
assert rt is not None
rng = random.Random(args.seed)
now = time.time_ns()
t = now - 120_000_000_000
for _ in range(args.steps):
    d = rng.lognormvariate(-3.9, 0.25) * args.slow_steps
    t_end = t + int(d * 1e9)
    rt.record_step(
        StepRecord(
            t,
            t_end,
            samples=32,
            tokens=4096,
            span_attributes={
                "otelgpu.train.data.wait": d * 0.25,
                "otelgpu.train.checkpoint": d * 0.05,
                "otelgpu.train.compute": d * 0.70,
            },
        )
    )
    t = t_end
for i in range(args.requests):
    ttft = rng.lognormvariate(-3.2, 0.3) * args.slow_ttft
    queue = rng.lognormvariate(-4.8, 0.3)
    tpot = rng.lognormvariate(-5.8, 0.2)
    duration = rng.lognormvariate(-2.1, 0.2)
    start = now - 60_000_000_000 + i * 10_000_000
    failed = rng.random() < 0.02
    rt.record_request(
        RequestRecord(
            start,
            start + int(duration * 1e9),
            model="tiny-gpt",
            first_token_ns=None if failed else start + int(ttft * 1e9),
            # one output token: record_request derives no TPOT from TTFT and the end, so the
            # TPOT distribution below stays independent of a TTFT regression
            output_tokens=0 if failed else 1,
            queue_time_s=queue,
            outcome="error" if failed else "ok",
            error_type="kv_cache_exhausted" if failed else None,
        )
    )
    if not failed:
        rt.tpot.record(
            tpot,
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "_OTHER",
                "gen_ai.request.model": "tiny-gpt",
            },
        )
handle.shutdown()
print(handle.recording_path)
