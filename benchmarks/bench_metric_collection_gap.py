"""Longest gap a spinning host thread sees while another thread collects 8 simulated GPUs.

Run: ``python benchmarks/bench_metric_collection_gap.py sliced|unsliced`` ("unsliced" turns
the GIL hand-off between instruments off, for comparison). Timings: wall clock, ms.
"""

from __future__ import annotations

import sys
import threading
import time

from otelgpu import sim

sim.activate("healthy-8xh100", clock="virtual")  # before NVML initialises

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402

from otelgpu.metrics import gpu as gpu_metrics  # noqa: E402
from otelgpu.sampler import PyGpuSampler  # noqa: E402


def main(mode: str) -> None:
    if mode == "unsliced":
        gpu_metrics._yield_gil = lambda: None
    sampler = PyGpuSampler(interval_s=0.1)
    sampler.sample_once()
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    gpu_metrics.register_gpu_metrics(provider.get_meter("bench"), sampler)
    reader.get_metrics_data()
    stop = threading.Event()
    gaps: list[float] = []
    collections: list[float] = []

    def spin() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            now = time.perf_counter()
            if now - last > 0.001:
                gaps.append(now - last)
            last = now

    def collect() -> None:
        for _ in range(20):
            start = time.perf_counter()
            reader.get_metrics_data()
            collections.append(time.perf_counter() - start)
            time.sleep(0.02)

    spinner = threading.Thread(target=spin)
    spinner.start()
    collector = threading.Thread(target=collect)
    collector.start()
    collector.join()
    stop.set()
    spinner.join()
    collections.sort()
    print(
        f"{mode}: collection p50 {collections[10] * 1e3:.2f} ms max {collections[-1] * 1e3:.2f} ms;"
        f" spinner max gap {max(gaps, default=0) * 1e3:.2f} ms,"
        f" gaps > 3 ms: {sum(1 for g in gaps if g > 0.003)}"
    )
    provider.shutdown()
    sampler.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sliced")
