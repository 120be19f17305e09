"""A short simulated serving run on otelgpu's pull endpoint, healthy or with faults.

The real runtime (``exporters=prometheus``) on the simulated GPUs of scenario
``healthy-8xh100`` (wall clock), recording inference requests of model ``tiny-gpt``
(2 % failing) for ``SECONDS`` wall seconds; Prometheus scrapes ``127.0.0.1:PORT``.

* ``healthy``: request latency lognormal around 110 ms, TTFT around 30 ms.
* ``faulty``: the same load with the request latency tripled (TTFT unchanged: the
  regression is in decode), and, through the simulator's fault injection, every GPU
  thermally throttled (``hw_thermal``) for the whole run and an XID 119 (GSP timeout,
  critical, GPU stays on the bus) on GPU 0 a second in.

    python sim_serve.py PORT SECONDS healthy|faulty
"""

from __future__ import annotations

import random
import sys
import time

import otelgpu
from otelgpu import _runtime, sim
from otelgpu.runtime.records import RequestRecord

port, seconds, mode = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
assert mode in ("healthy", "faulty"), mode
# 10 s into the scenario's minute: the checkpoint dip (56-60 s) is outside a short run.
gpus = sim.activate("healthy-8xh100", clock="wall", epoch_ns=time.time_ns() - 10_000_000_000)
handle = otelgpu.instrument(
    service_name="sim-serve",
    exporters="prometheus",
    prometheus_port=port,
    prometheus_rank_offset=False,
    frameworks="none",
    traces_sampler="always_off",
    metric_export_interval_ms=500,
)
rt = _runtime.current()
assert rt is not None
if mode == "faulty":
    gpus.inject("throttle", gpu="all", reason="hw_thermal", duration_s=seconds + 60)
slow = 3.0 if mode == "faulty" else 1.0
rng = random.Random(5)
start = time.monotonic()
xid_sent = False
served = 0
print("ready", flush=True)
while time.monotonic() - start < seconds:
    if mode == "faulty" and not xid_sent and time.monotonic() - start > 1.0:
        gpus.inject("xid", gpu=0, code=119)
        xid_sent = True
    now = time.time_ns()
    for _ in range(6):  # about 100 requests a second: light enough for a busy CI box
        served += 1
        failed = served % 50 == 0
        latency = rng.lognormvariate(-2.2, 0.15) * slow
        ttft = rng.lognormvariate(-3.5, 0.15)  # always well below the latency
        rt.record_request(
            RequestRecord(
                now - int(latency * 1e9),
                now,
                model="tiny-gpt",
                first_token_ns=None if failed else now - int((latency - ttft) * 1e9),
                output_tokens=0 if failed else 16,
                outcome="error" if failed else "ok",
            )
        )
    time.sleep(0.05)
handle.shutdown()
