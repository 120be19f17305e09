"""The demo's plain-PyTorch training (zero code) with simulated serving beside it, for the
live-view screenshot::

    otelgpu run --live --sim healthy-8xh100 -- python live_torch_workload.py 14
"""

from __future__ import annotations

import functools
import sys
import tempfile
import threading
import time

from live_serving import serve, throttle

from otelgpu.commands.demo import train

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
stop = time.monotonic() + seconds


serving = functools.partial(serve, stop, model="tiny-gpt2", decode_s=0.02, tokens=16, gap_s=0.03)
threading.Thread(target=serving, daemon=True).start()
threading.Timer(4.0, throttle, (2,)).start()
with tempfile.TemporaryDirectory() as ckpt:
    steps = train(seconds, 1, ckpt, lambda: None)
print(f"trained {steps} steps", flush=True)
