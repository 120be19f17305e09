"""Which background thread lengthened the host's slowest blocks, and where its slices land.

Runs one pause scenario of ``bench_export.py`` in this process (``infer500``: 1 ms requests
1 ms apart on 8 simulated GPUs; ``train50``: 20 ms steps on 1 GPU; a live OTLP gRPC
receiver), and records per block its wall time and the CPU time each otelgpu thread used
meanwhile (``pthread_getcpuclockid``: what really ran, whatever the machine's load). Every
GIL hand-back of a background thread (``otelgpu.otel.slicing``'s sleep) is logged too, so
each stretch a thread ran between two hand-backs is placed in the host's cycle: entering a
block, its busy part (in quarters), leaving it, or the gap before the next block.

Prints: the wall p50/p99; the blocks slower than p50 + ``--over-us`` with each thread's CPU
during them; the host thread's own CPU time entering and leaving a block
(``time.thread_time``), the slow blocks' against the median ones', next to the other threads'
CPU -- whether the slow blocks waited for otelgpu's threads or the host's own entry and exit
ran slower (a machine whose other CPU is busy, caches others filled); per thread, where its
stretches began. Stretches that begin at random land
mostly inside a block's busy part (which is time-based: nothing lengthens); stretches that
pile up in the last quarter, in the exit or in the entry lengthen blocks -- the signature
of a background thread phase-locked to the host (what ``slicing.JITTER_S`` breaks; see it
with ``--jitter-ms 0``). A thread that blocks between two hand-backs (the span exporter
waiting for its receiver) has long "stretches" that are mostly time without the GIL.

Run: ``.venv/bin/python benchmarks/diag_slow_blocks.py [--scenario train50] [--blocks N]``
(``OTELGPU_NO_EXTENSIONS=1`` for the pure-Python twin). Diagnostic only: not part of the
benchmark tables or of CI.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import itertools
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's otelgpu

import bench_export

SCENARIOS = {  # busy s, idle s, GPUs, block kind
    "infer500": (1e-3, 1e-3, 8, "request"),
    "train50": (20e-3, 0.0, 1, "step"),
}


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def measure(scenario: str, blocks: int, jitter_s: float | None = None) -> dict[str, Any]:
    """Blocks ``(t0, entered, busy done, t_end, {thread: cpu µs}, host entry CPU µs, host
    exit CPU µs)`` and hand-backs;
    ``jitter_s`` replaces ``slicing.JITTER_S`` (0: the fixed hand-back of before)."""
    import otelgpu
    from otelgpu.otel import slicing

    if jitter_s is not None:
        slicing.JITTER_S = jitter_s

    busy, idle, gpus, kind = SCENARIOS[scenario]
    clock = time.perf_counter
    handbacks: list[tuple[float, float, str]] = []  # sleep start, sleep end, thread
    sleep = slicing._sleep

    def logged(seconds: float) -> None:
        t0 = clock()
        sleep(seconds)
        handbacks.append((t0, clock(), threading.current_thread().name))

    slicing._sleep = logged
    tmp = tempfile.mkdtemp(prefix="otelgpu-slow-")
    receiver, grpc_port, http_port = bench_export.start_receiver(Path(tmp))
    try:
        handle = bench_export.instrument_as_pause_rows(
            gpus, "otlp-grpc", (grpc_port, http_port), tmp
        )
        _spin(0.3)
        threads = [
            (t.name, time.pthread_getcpuclockid(t.ident or 0))
            for t in threading.enumerate()
            if t is not threading.main_thread() and t.ident
        ]
        cpu_ns = time.clock_gettime_ns
        own = time.thread_time_ns
        rows = []
        for _ in range(blocks):
            before = [cpu_ns(c) for _, c in threads]
            c0 = own()
            t0 = clock()
            block: Any = otelgpu.step(samples=32) if kind == "step" else otelgpu.request(model="m")
            block.__enter__()
            if kind == "request":
                block.first_token()
            t1 = clock()
            c1 = own()
            _spin(busy)
            c2 = own()
            t2 = clock()
            if kind == "request":
                block.tokens(8)
            block.__exit__(None, None, None)
            t3 = clock()
            c3 = own()
            after = [cpu_ns(c) for _, c in threads]
            used = {n: (b - a) / 1e3 for (n, _), a, b in zip(threads, before, after, strict=True)}
            rows.append((t0, t1, t2, t3, used, (c1 - c0) / 1e3, (c3 - c2) / 1e3))
            if idle:
                _spin(idle)
        handle.shutdown()
    finally:
        slicing._sleep = sleep
        receiver.kill()
        receiver.wait()
    return {"rows": rows, "handbacks": handbacks, "busy": busy}


def _phase(rows: list[Any], starts: list[float], at: float, busy: float) -> str | None:
    """Where ``at`` falls in the host's cycle."""
    k = bisect.bisect_right(starts, at) - 1
    if k < 0:
        return None
    _t0, t1, t2, t3 = rows[k][:4]
    if at < t1:
        return "enter"
    if at < t2:
        return f"busy q{min(3, int(4 * (at - t1) / busy)) + 1}"
    if at < t3:
        return "exit"
    return "between"


def _band(label: str, band: list[Any]) -> str:
    """One line of means over ``band``'s blocks: wall, the host's entry and exit (wall and
    its own CPU), each otelgpu thread's CPU."""

    def mean(values: Any) -> float:
        return statistics.fmean(values)

    names = sorted({n for r in band for n in r[4]})
    threads = ", ".join(f"{n} {mean(r[4].get(n, 0.0) for r in band):.0f}" for n in names)
    return (
        f"{label} ({len(band)}): wall {mean((r[3] - r[0]) * 1e6 for r in band):.0f}; "
        f"entry wall {mean((r[1] - r[0]) * 1e6 for r in band):.0f} host CPU "
        f"{mean(r[5] for r in band):.0f}; exit wall {mean((r[3] - r[2]) * 1e6 for r in band):.0f}"
        f" host CPU {mean(r[6] for r in band):.0f}; threads {threads}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="infer500")
    parser.add_argument("--blocks", type=int, default=3000)
    parser.add_argument("--over-us", type=float, default=250.0)
    parser.add_argument("--show", type=int, default=30, help="slow blocks listed")
    parser.add_argument(
        "--jitter-ms", type=float, default=None, help="override slicing.JITTER_S (0: none)"
    )
    args = parser.parse_args()
    jitter = None if args.jitter_ms is None else args.jitter_ms / 1e3
    data = measure(args.scenario, args.blocks, jitter)
    rows, busy = data["rows"], data["busy"]
    walls = sorted((r[3] - r[0]) * 1e6 for r in rows)
    p50 = statistics.median(walls)
    p99 = walls[int(0.99 * len(walls))]
    print(f"{args.scenario}: {len(rows)} blocks, wall p50 {p50:.0f} µs, p99 {p99:.0f} µs")
    slow = [r for r in rows if (r[3] - r[0]) * 1e6 > p50 + args.over_us]
    print(f"\n{len(slow)} blocks over p50 + {args.over_us:.0f} µs; otelgpu threads' CPU (µs):")
    origin = rows[0][0]
    for t0, _t1, _t2, t3, used, *_own in slow[: args.show]:
        ran = ", ".join(f"{n} {v:.0f}" for n, v in sorted(used.items()) if v >= 20)
        print(f"  t={t0 - origin:7.3f} s  wall {(t3 - t0) * 1e6:6.0f}  {ran or '(none)'}")
    by_wall = sorted(rows, key=lambda r: r[3] - r[0])
    middle = by_wall[int(0.45 * len(rows)) : int(0.55 * len(rows)) + 1]
    print("\nmean per block (µs): the median ones (p45-p55) against the slow ones")
    for label, band in (("median", middle), ("slow", slow)):
        if band:
            print("  " + _band(label, band))
    starts = [r[0] for r in rows]
    by_thread: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for begin, end, name in data["handbacks"]:
        by_thread[name].append((begin, end))
    print("\nwhere each thread's stretches (between two hand-backs) began:")
    for name, sleeps in sorted(by_thread.items()):
        phases: collections.Counter[str] = collections.Counter()
        lengths = []
        for (_, woke), (next_sleep, _) in itertools.pairwise(sleeps):
            if next_sleep - woke > 0.05:  # idle between two pieces of work
                continue
            lengths.append((next_sleep - woke) * 1e6)
            where = _phase(rows, starts, woke, busy)
            if where:
                phases[where] += 1
        if not lengths:
            continue
        order = ["enter", "busy q1", "busy q2", "busy q3", "busy q4", "exit", "between"]
        spread = ", ".join(f"{p} {phases[p]}" for p in order if phases[p])
        print(
            f"  {name}: {len(lengths)} stretches, median {statistics.median(lengths):.0f} µs;"
            f" {spread}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
