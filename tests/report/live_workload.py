"""A simulated training + serving workload for the live-view tests (no otelgpu code needed
for instrumentation: ``otelgpu run`` turns it on; ``otelgpu.step``/``request`` mark the work).

Usage: python live_workload.py SECONDS [STEP_MS]. Steps of exactly STEP_MS (default 20) ms
with 32 samples; a request every 50 ms; a thermal throttle injected on GPU 1 after 1 s.
Prints "workload step N" every 25 steps and "workload done" at the end.
"""

from __future__ import annotations

import sys
import threading
import time

import otelgpu
from otelgpu import sim

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
step_s = float(sys.argv[2]) / 1000 if len(sys.argv) > 2 else 0.020
stop = time.monotonic() + seconds


def serve() -> None:
    while time.monotonic() < stop:
        with otelgpu.request(model="tiny-gpt") as r:
            r.input_tokens(64)
            time.sleep(0.005)
            r.scheduled()
            time.sleep(0.010)
            r.first_token()
            for _ in range(8):
                time.sleep(0.001)
                r.tokens(1)
        time.sleep(0.035)


threading.Thread(target=serve, daemon=True).start()
injected = False
n = 0
start = time.monotonic()
while time.monotonic() < stop:
    with otelgpu.step(samples=32, tokens=32 * 128):
        time.sleep(step_s)
    n += 1
    if n % 25 == 0:
        print(f"workload step {n}", flush=True)
    if not injected and time.monotonic() - start > 1.0:
        gpu = sim.active()
        if gpu is not None:
            gpu.inject("throttle", gpu=1, reason="hw_thermal", duration_s=600)
        injected = True
print("workload done", flush=True)
