"""The demo's plain-PyTorch training (zero code) with simulated serving beside it, for the
live-view screenshot::

    otelgpu run --live --sim healthy-8xh100 -- python live_torch_workload.py 14
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time

import otelgpu
from otelgpu import sim
from otelgpu.commands.demo import train

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
stop = time.monotonic() + seconds


def serve() -> None:
    while time.monotonic() < stop:
        with otelgpu.request(model="tiny-gpt2") as r:
            r.input_tokens(64)
            time.sleep(0.005)
            r.scheduled()
            time.sleep(0.02)
            r.first_token()
            for _ in range(16):
                time.sleep(0.002)
                r.tokens(1)
        time.sleep(0.03)


def throttle() -> None:
    gpu = sim.active()
    if gpu is not None:
        gpu.inject("throttle", gpu=2, reason="hw_thermal", duration_s=600)


threading.Thread(target=serve, daemon=True).start()
threading.Timer(4.0, throttle).start()
with tempfile.TemporaryDirectory() as ckpt:
    steps = train(seconds, 1, ckpt, lambda: None)
print(f"trained {steps} steps", flush=True)
