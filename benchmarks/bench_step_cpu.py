"""Who pays for ``otelgpu.step()`` / ``otelgpu.request()``: the host thread's CPU to enter
and leave a block, and each otelgpu thread's CPU per block, at a realistic rate.

The main thread spins ``--busy-ms`` inside each block (20 ms: the 50 steps/s training
loop of ``bench_export.py``'s pause rows; ``--kind request --gpus 8 --busy-ms 1``: its 500
requests/s), over 1 (or 8) simulated GPUs and a live OTLP gRPC receiver, as
``bench_export.py`` sets otelgpu up. Thread CPU time (``time.thread_time_ns`` around
``__enter__``/``__exit__``; each background thread's CPU clock over the run) does not count
waiting for a CPU or for the GIL, so it is steadier on a shared machine than wall times,
and it is what a step left on cold caches really costs: leaving a 20 ms step costs several
times what the same exit costs in a tight loop.

Each run is a fresh process; ``--rounds`` runs, medians reported. Diagnostic: not part
of CI (CI runs correctness tests, not timings).

Run: ``.venv/bin/python benchmarks/bench_step_cpu.py``
(``OTELGPU_NO_EXTENSIONS=1`` for the pure-Python twin).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT))  # this checkout's otelgpu


def measure(kind: str, gpus: int, busy_s: float, blocks: int) -> dict[str, Any]:
    """One run in this process: per-block CPU figures (µs)."""
    import bench_export

    tmp = tempfile.mkdtemp(prefix="otelgpu-stepcpu-")
    receiver, grpc_port, http_port = bench_export.start_receiver(Path(tmp))
    try:
        import otelgpu

        handle = bench_export.instrument_as_pause_rows(
            gpus, "otlp-grpc", (grpc_port, http_port), tmp
        )
        cpu, clock = time.thread_time_ns, time.perf_counter
        enter: list[int] = []
        leave: list[int] = []
        warm = blocks // 5
        before = _thread_cpu()
        for i in range(blocks + warm):
            if i == warm:
                before = _thread_cpu()
            block: Any = otelgpu.step(samples=32) if kind == "step" else otelgpu.request(model="m")
            a = cpu()
            block.__enter__()
            b = cpu()
            if kind == "request":
                block.first_token()
            end = clock() + busy_s
            while clock() < end:
                pass
            if kind == "request":
                block.tokens(8)
            c = cpu()
            block.__exit__(None, None, None)
            d = cpu()
            if i >= warm:
                enter.append(b - a)
                leave.append(d - c)
        after = _thread_cpu()
        handle.force_flush()
        handle.shutdown()
    finally:
        receiver.kill()
        receiver.wait()
    threads = {
        name: (after[name] - before.get(name, 0)) / blocks / 1e3
        for name in after
        if after[name] - before.get(name, 0) > 0
    }
    return {
        "enter_p50": statistics.median(enter) / 1e3,
        "leave_p50": statistics.median(leave) / 1e3,
        "leave_p90": sorted(leave)[int(0.9 * len(leave))] / 1e3,
        "threads": threads,
        "native": otelgpu.NATIVE,
    }


def _thread_cpu() -> dict[str, int]:
    """CPU time (ns) of each thread but the main one, by name."""
    out = {}
    for t in threading.enumerate():
        if t is threading.main_thread() or t.ident is None:
            continue
        try:
            out[t.name] = time.clock_gettime_ns(time.pthread_getcpuclockid(t.ident))
        except OSError:
            continue
    return out


def _row(label: str, data: dict[str, Any]) -> str:
    threads = ", ".join(f"{k} {v:.1f}" for k, v in sorted(data["threads"].items()))
    return (
        f"| {label} | {data['enter_p50']:.1f} | {data['leave_p50']:.1f} | "
        f"{data['leave_p90']:.1f} | {threads} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kind", choices=["step", "request"], default="step")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--busy-ms", type=float, default=20.0)
    parser.add_argument("--blocks", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3, help="runs (fresh processes)")
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.kind, args.gpus, args.busy_ms / 1e3, args.blocks)))
        return 0
    modes = ["this checkout"]
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for mode in modes:
            out = subprocess.run(
                [sys.executable, __file__, *sys.argv[1:], "--child"],
                capture_output=True,
                text=True,
                timeout=600,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            if out.returncode:
                print(out.stderr[-3000:], file=sys.stderr)
                return 1
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    native = runs[modes[0]][0]["native"]
    print(
        f"{args.kind}, {args.gpus} GPU(s), {args.busy_ms:g} ms blocks, {args.blocks} blocks "
        f"per run, {args.rounds} runs, native: {native}; CPU µs per block "
        "(medians of the runs' medians; threads: the run's CPU / blocks, median run)"
    )
    print("| code | enter p50 | leave p50 | leave p90 | otelgpu threads per block |")
    print("|---|---:|---:|---:|---|")
    for mode, done in runs.items():
        middle = sorted(done, key=lambda d: d["leave_p50"])[len(done) // 2]
        merged = {
            "enter_p50": statistics.median(d["enter_p50"] for d in done),
            "leave_p50": statistics.median(d["leave_p50"] for d in done),
            "leave_p90": statistics.median(d["leave_p90"] for d in done),
            "threads": middle["threads"],
        }
        print(_row(mode, merged))
    return 0


if __name__ == "__main__":
    sys.exit(main())
