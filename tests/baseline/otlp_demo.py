"""A demo-like run pushing OTLP/HTTP metrics to a store: the real runtime, the simulated
GPUs of scenario ``xid79-gpu-lost`` started 88 s into its timeline (so GPU 3 falls off the
bus with XID 79 two seconds in), steps and requests recorded for ``SECONDS`` wall seconds.

    python otlp_demo.py ENDPOINT SECONDS   # ENDPOINT: http://HOST:PORT/opentelemetry
"""

from __future__ import annotations

import random
import sys
import time

import otelgpu
from otelgpu import _runtime, sim
from otelgpu.runtime.records import RequestRecord, StepRecord

endpoint, seconds = sys.argv[1], float(sys.argv[2])
sim.activate("xid79-gpu-lost", clock="wall", epoch_ns=time.time_ns() - 88_000_000_000)
handle = otelgpu.instrument(
    service_name="otlp-demo",
    exporters="otlp",
    otlp_protocol="http/protobuf",
    otlp_endpoint=endpoint,
    frameworks="none",
    metric_export_interval_ms=500,
)
rt = _runtime.current()
assert rt is not None
rng = random.Random(1)
end = time.monotonic() + seconds
while time.monotonic() < end:
    now = time.time_ns()
    for _ in range(20):
        d = rng.lognormvariate(-3.9, 0.25)
        rt.record_step(
            StepRecord(
                now - int(d * 1e9),
                now,
                samples=32,
                tokens=4096,
                span_attributes={"otelgpu.train.data.wait": d * 0.2},
            )
        )
        failed = rng.random() < 0.05
        ttft = rng.lognormvariate(-3.2, 0.3)
        rt.record_request(
            RequestRecord(
                now - int(0.12e9),
                now,
                model="tiny-gpt",
                first_token_ns=None if failed else now - int(0.12e9) + int(ttft * 1e9),
                output_tokens=0 if failed else 8,
                queue_time_s=0.004,
                outcome="error" if failed else "ok",
            )
        )
    time.sleep(0.1)
handle.shutdown()
