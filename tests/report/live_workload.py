"""A simulated training + serving workload for the live-view tests (no otelgpu code needed
for instrumentation: ``otelgpu run`` turns it on; ``otelgpu.step``/``request`` mark the work).

Usage: python live_workload.py SECONDS [STEP_MS]. Steps of exactly STEP_MS (default 20) ms
with 32 samples; a request every 50 ms; a thermal throttle injected on GPU 1 after 1 s, at
the start of one longer step (300 ms): the 10 Hz sampler sees the event while that step
runs, so the event is on its span however late a loaded machine runs the sampler (injected
between two short steps, it could fall after the step that held it had ended: counted, on
no span).
Prints "workload step N" every 25 steps and "workload done" at the end.
"""

from __future__ import annotations

import functools
import sys
import threading
import time

from live_serving import serve, throttle

import otelgpu

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
step_s = float(sys.argv[2]) / 1000 if len(sys.argv) > 2 else 0.020
stop = time.monotonic() + seconds


serving = functools.partial(serve, stop, model="tiny-gpt", decode_s=0.01, tokens=8, gap_s=0.035)
threading.Thread(target=serving, daemon=True).start()
injected = False
n = 0
start = time.monotonic()
while time.monotonic() < stop:
    inject = not injected and time.monotonic() - start > 1.0
    with otelgpu.step(samples=32, tokens=32 * 128):
        if inject:
            throttle(1)
            injected = True
        time.sleep(0.3 if inject else step_s)
    n += 1
    if n % 25 == 0:
        print(f"workload step {n}", flush=True)
print("workload done", flush=True)
