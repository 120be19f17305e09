"""Full garbage collections (tens of ms with the GIL held, in whichever thread allocates)
are not triggered by otelgpu: instrument() leaves none pending, and a busy step loop with
export running for seconds promotes too little to start one. Run in a fresh process, as an
application starts (the modules otelgpu imports are what a full collection would scan)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fixtures.otlp_receiver import OtlpReceiver

_CHILD = """
import gc, json, sys, threading, time
import otelgpu
from otelgpu import sim
sim.activate("healthy-8xh100", clock="wall")
full = []
def on_gc(phase, info):
    if phase == "start" and info["generation"] == 2:
        full.append(threading.current_thread().name)
settings = json.loads(sys.argv[1])
requests = sys.argv[3] == "request"
handle = otelgpu.instrument(gpu=True, devices=None if requests else "0", frameworks="none",
                            span_schedule_delay_ms=500, metric_export_interval_ms=1000,
                            step_spans_per_second=200, **settings)
gc.callbacks.append(on_gc)
steps = 0
if requests:  # a number of requests, not a time: promotions follow allocations
    for _ in range(int(sys.argv[2])):
        with otelgpu.request(model="m"):
            steps += 1
else:
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        with otelgpu.step(samples=32, tokens=4096):
            steps += 1
gc.callbacks.remove(on_gc)
handle.shutdown()
print(json.dumps({"steps": steps, "full": full}))
"""


@pytest.mark.parametrize(
    ("exporter", "kind"), [("otlp", "step"), ("recording", "step"), ("otlp", "request")]
)
def test_no_full_collection_during_a_busy_loop(exporter: str, kind: str, tmp_path: Path) -> None:
    """Steps (1 GPU) for 12 s, or 20,000 requests (8 GPUs, every request a span, thousands
    per second: spans are encoded as they end, ``otelgpu.otel.processor``).
    In this bare process a full collection falls due after ~14,000 promotions; waiting
    spans promoted ~0.9 objects per request before (a full collection every ~15,000
    requests), ~0.2 now."""
    limit = "20000" if kind == "request" else "12"
    receiver = OtlpReceiver().start()
    settings: dict[str, Any] = (
        {"otlp_endpoint": receiver.grpc_endpoint, "otlp_protocol": "grpc"}
        if exporter == "otlp"
        else {"exporters": "recording", "recording_dir": str(tmp_path)}
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, json.dumps(settings), limit, kind],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "OTEL_SDK_DISABLED": "false"},
            check=True,
        )
    finally:
        receiver.stop()
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["steps"] > 1000
    assert got["full"] == [], f"full collections in {got['full']} during {got['steps']} steps"
