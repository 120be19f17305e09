"""Sampler overhead: what GPU sampling costs a Python-heavy application thread.

One run, on the simulated NVML (8 GPUs, every NVML call delayed by --latency-us,
default 50 µs, the realistic 20-100 µs range): a pure-Python arithmetic loop holding
the GIL runs for --seconds while each sampler samples the 8 GPUs at 100 ms and 10 ms:

* no sampler (baseline, measured before and after the others);
* otelgpu's native sampler (C loop, GIL released for its whole life);
* otelgpu's pure-Python twin (pynvml on a Python thread);
* a plain pynvml polling thread (8 GPUs x 6 fields), the way most tools poll.

The simulated GPUs are H100s, so both otelgpu samplers also take GPM samples (SM /
tensor / DRAM activity: one nvmlGpmSampleGet + one nvmlGpmMetricsGet per GPU every
>= 100 ms); at 10/s the same run repeats both samplers on H100s whose GPM is switched
off ("GPM off"), which isolates GPM's cost.

Reported per row (--repeat runs, each paired with a baseline run; best-of for throughput):
loop throughput relative to the baseline, the sampling rate achieved while the main
thread was busy, and the CPU the process spent outside the main thread. Also the
cost of ``window()`` for a 10 s window (101 samples). Prints a markdown table and
writes benchmarks/results/sampler.md.

    python benchmarks/bench_sampler.py [--seconds 1.5] [--latency-us 50] [--repeat 3]

``--real`` runs the same rows against the machine's real NVIDIA driver instead (every
GPU it has; GPM where the GPU supports it), adds the measured latency of each NVML call
the samplers make, and writes benchmarks/results/sampler-real.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

GPUS = 8
RESULTS = Path(__file__).resolve().parent / "results" / "sampler.md"
RESULTS_REAL = RESULTS.with_name("sampler-real.md")
#: What the pynvml polling thread reads per GPU and round: the fields most tools poll.
POLLED_CALLS = (
    ("nvmlDeviceGetUtilizationRates", ()),
    ("nvmlDeviceGetMemoryInfo", ()),
    ("nvmlDeviceGetPowerUsage", ()),
    ("nvmlDeviceGetTemperature", (0,)),
    ("nvmlDeviceGetClockInfo", (1,)),
    ("nvmlDeviceGetTotalEnergyConsumption", ()),
)


def busy_loop(seconds: float) -> float:
    """Pure-Python arithmetic for ``seconds``; returns iterations per second."""
    acc, n = 1, 0
    end = time.perf_counter() + seconds
    start = time.perf_counter()
    while True:
        for _ in range(2000):
            acc = (acc * 1103515245 + 12345) & 0xFFFFFFFF
        n += 2000
        if time.perf_counter() >= end:
            break
    return n / (time.perf_counter() - start)


class PynvmlPoller:
    """A plain pynvml polling thread: 8 GPUs x 6 fields every ``interval_s``."""

    def __init__(self, interval_s: float, gpus: int = GPUS) -> None:
        import pynvml

        self.nv = pynvml
        pynvml.nvmlInit()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(gpus)]
        self.interval_s = interval_s
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        nv = self.nv
        next_t = time.monotonic()
        while not self._stop.is_set():
            for h in self.handles:
                for name, extra in POLLED_CALLS:
                    getattr(nv, name)(h, *extra)
            self.polls += 1
            next_t += self.interval_s
            delay = next_t - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            else:
                next_t = time.monotonic()

    def start(self) -> None:
        self._thread.start()

    def rounds(self) -> int:
        return self.polls

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.nv.nvmlShutdown()


class Row:
    """Medians over the repetitions of one configuration."""

    def __init__(self, name: str, asked_hz: float) -> None:
        self.name, self.asked_hz = name, asked_hz
        self.bases: list[float] = []
        self.loops: list[float] = []
        self.rates: list[float] = []
        self.cpus: list[float] = []


def measure(
    row: Row, make: Callable[[], tuple[Callable[[], int], Callable[[], object]]], secs: float
) -> None:
    """One repetition: a baseline run, then a run with the sampler made by ``make``.

    ``make()`` starts a sampler and returns (rounds taken so far, stop). Pairing each
    sampler run with a baseline run keeps slow drift of a loaded machine out of the ratio.
    """
    base = busy_loop(secs)
    rounds, stop = make()
    time.sleep(0.3)  # warm up: NVML opened, first rounds taken
    r0, t0, p0, m0 = rounds(), time.monotonic(), time.process_time(), time.thread_time()
    rate = busy_loop(secs)
    r1, t1, p1, m1 = rounds(), time.monotonic(), time.process_time(), time.thread_time()
    stop()
    row.bases.append(base)
    row.loops.append(rate)
    row.rates.append((r1 - r0) / (t1 - t0))
    # CPU the process used outside the main thread: the sampler's own cost.
    row.cpus.append(((p1 - p0) - (m1 - m0)) / (t1 - t0))


def window_cost_us(sampler_cls: type, t0: int) -> float:
    """Median µs of window() over a 10 s window holding 101 samples stamped from ``t0``."""
    sampler = sampler_cls(interval_s=0.1)
    for k in range(101):
        sampler.sample_once(timestamp_ns=t0 + k * 100_000_000)
    uuid = sampler.devices[0].uuid
    end = t0 + 10_000_000_000
    stats = sampler.window(uuid, t0, end)
    assert stats.samples == 101
    # the GPM scenario's windows carry GPM means; the other's none
    gpm = "gpm" in sampler.supported_fields(uuid)
    assert (stats.sm_activity_pct is not None) == gpm
    runs = []
    for _ in range(7):
        n = 2000
        began = time.perf_counter()
        for _ in range(n):
            sampler.window(uuid, t0, end)
        runs.append((time.perf_counter() - began) / n * 1e6)
    sampler.close()
    return statistics.median(runs)


Maker = Callable[[], tuple[Callable[[], int], Callable[[], object]]]


def sampler_makers(interval: float, tag: str, gpus: int, poller: bool) -> list[tuple[str, Maker]]:
    """(row name, maker) for both otelgpu twins and, with ``poller``, a pynvml thread."""
    from otelgpu.sampler import NativeGpuSampler, PyGpuSampler

    makers: list[tuple[str, Maker]] = []
    for name, cls in (
        (f"native sampler, {tag}", NativeGpuSampler),
        (f"pure-Python twin, {tag}", PyGpuSampler),
    ):
        if cls is not None:

            def make(
                cls: type = cls, interval: float = interval
            ) -> tuple[Callable[[], int], Callable[[], object]]:
                sampler = cls(interval_s=interval)
                sampler.start()
                return (lambda: sampler.stats().ticks), sampler.close

            makers.append((name, make))

    def make_poller() -> tuple[Callable[[], int], Callable[[], object]]:
        polling = PynvmlPoller(interval, gpus)
        polling.start()
        return polling.rounds, polling.stop

    if poller:
        makers.append(("pynvml polling thread (no GPM)", make_poller))
    return makers


def run_rows(
    makers: list[tuple[str, Maker]], interval: float, args: argparse.Namespace
) -> list[Row]:
    rows = []
    for name, make in makers:
        row = Row(name, 1 / interval)
        for _ in range(args.repeat):
            measure(row, make, args.seconds)
        rows.append(row)
    return rows


def row_lines(rows: list[Row]) -> list[str]:
    lines = [
        "| sampler | asked rate | loop throughput vs none | cost | achieved rate (busy main) "
        "| sampler CPU |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        # Best of the repetitions on both sides: other processes only ever slow a run down.
        ratio = max(row.loops) / max(row.bases)
        achieved = statistics.median(row.rates)
        cpu = statistics.median(row.cpus)
        lines.append(
            f"| {row.name} | {row.asked_hz:g}/s | {ratio:.3f} | {100 * (1 - ratio):.1f} % | "
            f"{achieved:.1f}/s ({100 * achieved / row.asked_hz:.0f} %) | {100 * cpu:.1f} % |"
        )
    return lines


def method_lines(args: argparse.Namespace, load_before: float) -> list[str]:
    return [
        f"{args.repeat} repetitions, each paired with a baseline run; throughput is the "
        "best run with the sampler over the best baseline run, rates and CPU are medians. "
        f"Load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after: on a "
        "machine busier than its CPU count the throughput ratios carry that noise (a "
        "ratio above 1 is noise); *sampler CPU* (process CPU time outside the main "
        "thread, per second of wall time) is the robust measure of a sampler's own cost.",
        "",
    ]


def write(path: Path, lines: list[str]) -> None:
    text = "\n".join(lines) + "\n"
    print(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def nvml_call_latency_lines() -> list[str]:
    """Median and p99 µs of each NVML call the samplers make, on GPU 0 of the real driver."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        calls = [
            *POLLED_CALLS,
            ("nvmlDeviceGetCurrentClocksEventReasons", ()),
            ("nvmlDeviceGetComputeRunningProcesses", ()),
            ("nvmlDeviceGetPcieThroughput", (0,)),
        ]
        lines = [
            "| NVML call (pynvml, GPU 0) | median µs | p99 µs |",
            "|---|---|---|",
        ]
        for name, extra in calls:
            fn = getattr(pynvml, name, None)
            if fn is None:
                continue
            took = []
            try:
                for _ in range(200):
                    began = time.perf_counter_ns()
                    fn(handle, *extra)
                    took.append((time.perf_counter_ns() - began) / 1000)
            except pynvml.NVMLError as exc:
                lines.append(f"| {name} | {exc} | |")
                continue
            took.sort()
            lines.append(
                f"| {name} | {statistics.median(took):.1f} | {took[int(0.99 * len(took))]:.1f} |"
            )
        return lines
    finally:
        pynvml.nvmlShutdown()


def main_real(args: argparse.Namespace) -> None:
    """The rows against the real driver: every GPU of this machine, GPM where supported."""
    import pynvml

    from otelgpu.nvml import inventory
    from otelgpu.sampler import NativeGpuSampler, PyGpuSampler

    devices = inventory()
    pynvml.nvmlInit()
    driver = pynvml.nvmlSystemGetDriverVersion()
    pynvml.nvmlShutdown()
    load_before = os.getloadavg()[0]
    rows: list[Row] = []
    for interval in (0.1, 0.01):
        makers = sampler_makers(interval, "real driver", len(devices), poller=True)
        rows += run_rows(makers, interval, args)
    lines = [
        "# Sampler overhead on a real GPU",
        "",
        f"Real NVIDIA driver {driver}: {len(devices)} x {devices[0].name}; a pure-Python loop "
        f"holding the GIL for {args.seconds:g} s per row. Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, switch interval {sys.getswitchinterval() * 1000:g} ms.",
        *method_lines(args, load_before),
        *row_lines(rows),
        "",
        *nvml_call_latency_lines(),
        "",
        "| window() for a 10 s window (101 samples at 100 ms) | µs per call |",
        "|---|---|",
    ]
    for name, cls in (("native sampler", NativeGpuSampler), ("pure-Python twin", PyGpuSampler)):
        if cls is not None:
            lines.append(f"| {name} | {window_cost_us(cls, time.monotonic_ns()):.2f} |")
    write(Path(args.output) if args.output else RESULTS_REAL, lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="busy-loop time per run")
    parser.add_argument(
        "--latency-us", type=float, default=50.0, help="simulated NVML call latency"
    )
    parser.add_argument("--repeat", type=int, default=3, help="repetitions per row")
    parser.add_argument("--real", action="store_true", help="the real NVIDIA driver, no simulator")
    parser.add_argument("--output", help="where the markdown goes (default benchmarks/results/)")
    args = parser.parse_args()
    if args.real:
        main_real(args)
        return

    from otelgpu import sim
    from otelgpu.sampler import NativeGpuSampler, PyGpuSampler

    def scenario(gpm: bool) -> dict[str, object]:
        gpus: dict[str, object] = {"count": GPUS, "model": "H100-SXM", "utilization": 90}
        if not gpm:
            gpus["unsupported"] = ["gpm"]
        return {
            "version": 1,
            "name": "bench-8gpu" + ("" if gpm else "-nogpm"),
            "driver": {"latency_ms": args.latency_us / 1000.0},
            "gpus": gpus,
        }

    load_before = os.getloadavg()[0]
    rows: list[Row] = []
    for interval, gpm in ((0.1, True), (0.1, False), (0.01, True)):
        sim.activate(scenario(gpm), clock="wall")
        makers = sampler_makers(interval, "GPM on" if gpm else "GPM off", GPUS, poller=gpm)
        rows += run_rows(makers, interval, args)

    window_us: dict[tuple[str, bool], float] = {}
    for gpm in (True, False):
        gpu = sim.activate(scenario(gpm), clock="wall")
        for name, cls in (("native sampler", NativeGpuSampler), ("pure-Python twin", PyGpuSampler)):
            if cls is not None:
                window_us[(name, gpm)] = window_cost_us(cls, gpu.time_ns())

    lines = [
        "# Sampler overhead",
        "",
        f"Simulated NVML: {GPUS} GPUs, {args.latency_us:g} µs per NVML call; a pure-Python "
        f"loop holding the GIL for {args.seconds:g} s per row. Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, switch interval {sys.getswitchinterval() * 1000:g} ms.",
        *method_lines(args, load_before),
        *row_lines(rows),
        "",
        "| window() for a 10 s window (101 samples at 100 ms) | GPM on: µs per call "
        "| GPM off: µs per call |",
        "|---|---|---|",
    ]
    for name in ("native sampler", "pure-Python twin"):
        if (name, True) in window_us:
            lines.append(
                f"| {name} | {window_us[(name, True)]:.2f} | {window_us[(name, False)]:.2f} |"
            )
    write(Path(args.output) if args.output else RESULTS, lines)


if __name__ == "__main__":
    main()
