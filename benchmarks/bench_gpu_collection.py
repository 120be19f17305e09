"""Cost of one GPU metric collection with its export: direct data points against SDK observables.

One otelgpu pipeline (``otelgpu.instrument()``, metrics over OTLP gRPC to a live receiver
in another process, otelgpu's encoder and sender) collects the GPU metrics of 1 and 8
simulated GPUs two ways, in the same process run:

* **direct**: what ``instrument()`` does where it owns the meter provider -- the points
  become the SDK's data model in ``otelgpu.metrics.direct``;
* **SDK observables**: the same point generators as OpenTelemetry observable instruments
  (what otelgpu does attached to an application's meter provider), through the SDK's
  per-observation path (``Measurement``, attribute cleaning and hashing, an aggregation
  object per series).

Each figure is the collecting thread's CPU time for ``reader.collect()`` (callbacks,
the SDK's storage step, otelgpu's sketches and internal metrics, encoding, the gRPC
send), best and median of ``--repeat`` collections after warm-up; the collection's GIL
slices are kept (their sleeps are not CPU time). Thread CPU, not wall time: other
processes on a shared machine barely move it. Writes ``results/gpu-collection.md``.

Run: ``.venv/bin/python benchmarks/bench_gpu_collection.py`` (about 30 s).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench_export import start_receiver

RESULTS = Path(__file__).parent / "results" / "gpu-collection.md"
MODES = ("direct", "sdk")


def child(gpus: int, mode: str, grpc_port: int, repeat: int) -> dict[str, float]:
    """One configuration in this (fresh) process: thread CPU µs per collection."""
    import otelgpu
    from otelgpu import sim
    from otelgpu.metrics.gpu import register_gpu_metrics
    from otelgpu.otel.metric_reader import ForkAwareMetricReader
    from otelgpu.sampler._startup import gpu_inventory

    sim.activate("healthy-8xh100", clock="wall")
    handle = otelgpu.instrument(
        gpu=True,
        devices="0" if gpus == 1 else None,
        frameworks="none",
        exporters="otlp",
        otlp_protocol="grpc",
        otlp_endpoint=f"http://127.0.0.1:{grpc_port}",
        otlp_insecure=True,
        metric_export_interval_ms=3_600_000,
        gpu_startup_wait_ms=10_000,
    )
    runtime = handle.runtime
    assert runtime is not None and runtime.pipeline is not None
    sampler = runtime.sampler
    time.sleep(0.5)  # GPU metrics registered (discovery thread), samples in the ring buffers
    if mode == "sdk":
        # The runtime registered its GPU metrics as direct ones: silence those, then
        # register the same generators as SDK observables on the same pipeline.
        direct = runtime.pipeline.direct_metrics
        assert direct is not None
        for source in list(direct.sources()):
            direct.remove_source(source)
        assert not direct.sources()
        register_gpu_metrics(runtime, sampler, gpu_inventory(sampler).devices or None)
    for _ in range(50):  # the runtime's own metrics have series too
        with otelgpu.step(samples=32):
            pass
        with otelgpu.request(model="m") as r:
            r.first_token()
            r.tokens(8)
    (reader,) = [o for o in gc.get_objects() if isinstance(o, ForkAwareMetricReader)]
    for _ in range(3):
        reader.collect()
    times = []
    for _ in range(repeat):
        time.sleep(0.05)  # new samples between collections, as between real exports
        t0 = time.thread_time_ns()
        reader.collect()
        times.append((time.thread_time_ns() - t0) / 1e3)
    handle.shutdown()
    return {"best": min(times), "median": statistics.median(times)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="timed collections per run")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per config")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        gpus, mode, port, repeat = args.child
        print(json.dumps(child(int(gpus), mode, int(port), int(repeat))))
        return 0
    receiver, grpc_port, _http = start_receiver(Path(tempfile.mkdtemp(prefix="bench-gpu-coll-")))
    results: dict[tuple[int, str], list[dict[str, float]]] = {}
    try:
        for _ in range(args.rounds):  # interleaved: machine noise hits both modes alike
            for gpus in (1, 8):
                for mode in MODES:
                    out = subprocess.run(
                        [
                            sys.executable,
                            __file__,
                            "--child",
                            str(gpus),
                            mode,
                            str(grpc_port),
                            str(args.repeat),
                        ],
                        capture_output=True,
                        text=True,
                        check=True,
                        timeout=300,
                    )
                    results.setdefault((gpus, mode), []).append(
                        json.loads(out.stdout.strip().splitlines()[-1])
                    )
    finally:
        receiver.kill()
        receiver.wait()
    lines = [
        "# One GPU metric collection with its OTLP export: direct data points vs SDK observables",
        "",
        "`benchmarks/bench_gpu_collection.py`: the collecting thread's CPU time for one "
        "`reader.collect()` of an `otelgpu.instrument()` pipeline (GPU metrics of simulated "
        "H100s, otelgpu's step/request sketches and internal metrics, encoding, OTLP gRPC send "
        f"to a live receiver); best and median of {args.repeat} collections per process, the "
        f"best process of {args.rounds} (interleaved). 'SDK observables': the same generators "
        "as OpenTelemetry observable instruments on the same pipeline (otelgpu's path when "
        "attached to an application's meter provider).",
        "",
        "| GPUs | direct: best / median | SDK observables: best / median | SDK / direct |",
        "|---:|---:|---:|---:|",
    ]
    for gpus in (1, 8):
        best = {mode: min(results[(gpus, mode)], key=lambda r: r["median"]) for mode in MODES}
        d, s = best["direct"], best["sdk"]
        lines.append(
            f"| {gpus} | {d['best'] / 1e3:.2f} / {d['median'] / 1e3:.2f} ms "
            f"| {s['best'] / 1e3:.2f} / {s['median'] / 1e3:.2f} ms "
            f"| {s['median'] / d['median']:.2f}x |"
        )
    lines += [
        "",
        f"Load average (1 min) at the end: {os.getloadavg()[0]:.1f}. {platform.machine()}, "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
