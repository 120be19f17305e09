"""Simulated serving and a thermal throttle, shared by the live-view workloads
(``live_workload.py``, ``live_torch_workload.py``); imported from the script's folder."""

from __future__ import annotations

import time

import otelgpu
from otelgpu import sim


def serve(stop: float, *, model: str, decode_s: float, tokens: int, gap_s: float) -> None:
    """Requests until ``time.monotonic()`` passes ``stop``: 64 input tokens, 5 ms queued,
    ``decode_s`` to the first token, then ``tokens`` tokens ``decode_s / 10`` apart, and
    ``gap_s`` between requests."""
    while time.monotonic() < stop:
        with otelgpu.request(model=model) as r:
            r.input_tokens(64)
            time.sleep(0.005)
            r.scheduled()
            time.sleep(decode_s)
            r.first_token()
            for _ in range(tokens):
                time.sleep(decode_s / 10)
                r.tokens(1)
        time.sleep(gap_s)


def throttle(gpu: int) -> None:
    """A thermal throttle on simulated GPU ``gpu`` (for 10 minutes), when a simulator runs."""
    active = sim.active()
    if active is not None:
        active.inject("throttle", gpu=gpu, reason="hw_thermal", duration_s=600)
