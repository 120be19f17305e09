"""The control for the pause rows' maxima: how often a fixed piece of plain Python, with no
otelgpu and no other thread in the process, runs many times slower than usual.

The host of the pause rows alternates a spin to a deadline with a fixed piece of work (a
sum over a list, ``--piece-us`` long on a quiet machine), like the bench loop with
``otelgpu.step()``'s entry and exit in place of the piece. A spin to a deadline absorbs a
stall of the machine (it ends at its deadline all the same); a piece of work does not: it
takes as long as the CPU lets it. For each piece
it records the wall time, the thread's CPU time and its context switches; a piece over
``--slow-ms`` with no switch at all ran the whole time on its CPU and was slow anyway (a
vCPU the hypervisor ran slowly or not at all while charging the guest thread, a core shared
with a noisy neighbour), which no code of the process could have caused. The steal time
of ``/proc/stat`` over the run is printed alongside.

Seen here (2026-12-07, 2 vCPUs, KVM): 2 of 100,000 pieces of 43 µs took 1.3 and 1.6 ms,
three pieces apart, CPU time equal to wall time, no context switch -- the signature of the
multi-millisecond entries and exits of ``otelgpu.step()`` that stop 49 left unexplained
(``JOURNAL.md``), so a busy-loop maximum just over 2 ms says as much about the machine as
about otelgpu.

Run: ``.venv/bin/python benchmarks/diag_machine_stalls.py [--pieces N]``. Diagnostic only:
not part of the benchmark tables or of CI.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time


def _steal_ticks() -> int | None:
    """All CPUs' steal time so far (clock ticks; ``None`` where /proc/stat has none)."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    return int(fields[8]) if len(fields) > 8 else None


def _calibrated(piece_us: float) -> list[int]:
    """A list whose :func:`_work` takes about ``piece_us`` on this machine, warm."""
    data = list(range(1000))
    best = min(_timed(data) for _ in range(50))
    size = max(1, int(1000 * piece_us * 1e3 / best))
    return list(range(size))


def _work(data: list[int]) -> int:
    total = 0
    for x in data:
        total += x * x
    return total


def _timed(data: list[int]) -> int:
    t0 = time.perf_counter_ns()
    _work(data)
    return time.perf_counter_ns() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pieces", type=int, default=100_000)
    parser.add_argument("--piece-us", type=float, default=40.0, help="each piece, warm")
    parser.add_argument("--spin-us", type=float, default=100.0, help="spin between pieces")
    parser.add_argument("--slow-ms", type=float, default=1.0)
    args = parser.parse_args()
    data = _calibrated(args.piece_us)
    clock, own = time.perf_counter_ns, time.thread_time_ns
    spin_ns, slow_ns = int(args.spin_us * 1e3), int(args.slow_ms * 1e6)
    usage = resource.getrusage
    who = resource.RUSAGE_THREAD
    walls: list[int] = []
    slow = []
    steal0 = _steal_ticks()
    for i in range(args.pieces):
        end = clock() + spin_ns
        while clock() < end:
            pass
        r0, c0, t0 = usage(who), own(), clock()
        _work(data)
        t1, c1, r1 = clock(), own(), usage(who)
        walls.append(t1 - t0)
        if t1 - t0 > slow_ns:
            switches = (r1.ru_nvcsw - r0.ru_nvcsw) + (r1.ru_nivcsw - r0.ru_nivcsw)
            slow.append((i, (t1 - t0) / 1e3, (c1 - c0) / 1e3, switches))
    steal1 = _steal_ticks()
    walls.sort()
    n = len(walls)
    print(
        f"{n} pieces: wall p50 {walls[n // 2] / 1e3:.0f} µs, p99 {walls[int(0.99 * n)] / 1e3:.0f},"
        f" p99.9 {walls[int(0.999 * n)] / 1e3:.0f}, max {walls[-1] / 1e3:.0f} µs;"
        f" {len(slow)} over {args.slow_ms:g} ms"
        f" ({sum(1 for s in slow if not s[3])} of them without a context switch)"
    )
    if steal0 is not None and steal1 is not None:
        print(f"steal time over the run, all CPUs: {steal1 - steal0} clock ticks")
    for i, wall, cpu, switches in slow[:20]:
        print(f"  piece {i}: wall {wall:.0f} µs, CPU {cpu:.0f} µs, context switches {switches}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
