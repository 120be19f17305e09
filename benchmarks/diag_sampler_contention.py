"""What a busy host costs the pure-Python sampler core's rounds, and why.

One thread runs sampling rounds of the pure core (``PyCore._tick``, no hand-backs) over 8
simulated GPUs while the main thread (the host) does one of:

* ``idle``: sleeps (the GIL is free);
* ``spin``: runs Python without pause (it holds the GIL; the round gets it only when the
  interpreter's switch interval forces the host to drop it);
* ``alt``: 1 ms of Python, 1 ms asleep (the pause rows' 500 requests/s rhythm).

Per round: the sampling thread's CPU and wall time, its voluntary context switches (each
one a wait for the GIL: a race for it lost to the host during an NVML call, then up to a
switch interval), and the host's (each one a wake-up: every NVML call drops the GIL and
wakes a host waiting for it). Native twin: its rounds run without the GIL, nothing to show.

Run: ``.venv/bin/python benchmarks/diag_sampler_contention.py [--rounds N]``. Diagnostic
only: not part of the benchmark tables or of CI.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's otelgpu

MODES = ("idle", "spin", "alt")


def _switches(tid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of thread ``tid`` so far (Linux)."""
    counts = {}
    with open(f"/proc/self/task/{tid}/status") as status:
        for line in status:
            if "ctxt_switches" in line:
                key, value = line.split(":")
                counts[key.strip()] = int(value)
    return counts["voluntary_ctxt_switches"], counts["nonvoluntary_ctxt_switches"]


def _host(mode: str, worker: threading.Thread) -> None:
    clock = time.perf_counter
    while worker.is_alive():
        if mode == "idle":
            time.sleep(0.001)
            continue
        end = clock() + 0.001
        while clock() < end:
            pass
        if mode == "alt":
            time.sleep(0.001)


def measure(core: Any, mode: str, rounds: int) -> dict[str, float]:
    """Per-round figures of ``rounds`` rounds with the host in ``mode``."""
    out: dict[str, float] = {}

    def run() -> None:
        tid = threading.get_native_id()
        vol, _ = _switches(tid)
        cpu, wall = time.thread_time(), time.perf_counter()
        for _ in range(rounds):
            core._tick(0, False)
        out["cpu_us"] = (time.thread_time() - cpu) / rounds * 1e6
        out["wall_us"] = (time.perf_counter() - wall) / rounds * 1e6
        out["waits"] = (_switches(tid)[0] - vol) / rounds

    host = threading.get_native_id()
    host_vol, _ = _switches(host)
    worker = threading.Thread(target=run, name="sampling-rounds")
    worker.start()
    _host(mode, worker)
    worker.join()
    out["host_wakeups"] = (_switches(host)[0] - host_vol) / rounds
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()
    from otelgpu import sim
    from otelgpu.sampler import PyGpuSampler

    sim.activate("healthy-8xh100", clock="wall")
    sampler = PyGpuSampler(devices=list(range(args.gpus)), interval_s=0.01)
    try:
        sampler.sample_once()  # opens NVML, switches unsupported fields off
        core: Any = sampler._core
        for _ in range(20):
            core._tick(0, False)
        print(f"pure sampler core, {args.gpus} simulated GPUs, {args.rounds} rounds per mode")
        print("| host | round CPU µs | round wall µs | GIL waits / round | host wake-ups / round |")
        print("|---|---:|---:|---:|---:|")
        for mode in MODES:
            r = measure(core, mode, args.rounds)
            print(
                f"| {mode} | {r['cpu_us']:.0f} | {r['wall_us']:.0f} | {r['waits']:.1f} "
                f"| {r['host_wakeups']:.1f} |"
            )
    finally:
        sampler.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
