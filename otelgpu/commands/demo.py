"""``otelgpu demo``: a short training + inference workload under ``otelgpu.instrument()``.

With no real GPU the simulated one is activated (a built-in scenario, wall clock) and a
few faults are injected (a thermal throttle during training, an XID during inference) so
every part of the pipeline shows up. The workload (~15 s by default):

1. a training loop: steps of ~10-30 ms of "compute" with an occasional data-loader
   stall, each in ``otelgpu.step(samples=…, tokens=…)``;
2. a burst of inference requests on a thread pool, each in ``otelgpu.request(model=…)``
   with TTFT, streamed tokens, and a few errors and timeouts.

Then it prints a summary (step-time and latency quantiles from the sketches, the GPU
context of each phase, errors, health events, where the telemetry went) and the speed
of the native vs pure-Python sketch. Telemetry goes wherever the settings say (by
default the local recording; ``OTEL_EXPORTER_OTLP_ENDPOINT`` sends it to a collector).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import random
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TextIO

from otelgpu import environment_variables as ev

DEFAULT_SCENARIO = "healthy-8xh100"
MODEL = "llama-3.1-8b-instruct"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="run a short instrumented training + inference workload and summarise it",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--scenario",
        default=None,
        help=f"simulated-GPU scenario when there is no GPU (default {DEFAULT_SCENARIO})",
    )
    parser.add_argument(
        "--sim", action="store_true", help="use the simulated GPU even if a real one is present"
    )
    parser.add_argument(
        "--seconds", type=float, default=15.0, help="approximate run time (default 15)"
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed of the workload")
    parser.set_defaults(func=run)
    return parser


def real_nvml_present() -> bool:
    """True when a real NVIDIA driver library loads (without initialising it)."""
    if os.environ.get(ev.OTELGPU_SIM):
        return False
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def activate_sim(scenario: str, out: TextIO) -> Any:
    """Activate the simulated GPU in this process (wall clock); None if unavailable."""
    try:
        from otelgpu import sim

        handle = sim.activate(scenario, clock="wall")
    except Exception as exc:  # noqa: BLE001 - the demo still runs without GPU context
        print(f"  simulated GPU unavailable ({exc}); running without GPU context", file=out)
        return None
    os.environ.setdefault("LOCAL_RANK", "0")  # sample one GPU, as one rank of a job would
    print(f"  no GPU here: using the simulated GPU, scenario {scenario!r} (wall clock)", file=out)
    return handle


def _inject(sim_gpu: Any, out: TextIO, kind: str, **params: Any) -> None:
    if sim_gpu is None:
        return
    try:
        sim_gpu.inject(kind, **params)
        print(f"  injected fault: {kind} {params}", file=out)
    except Exception as exc:  # noqa: BLE001
        print(f"  could not inject {kind}: {exc}", file=out)


def training(seconds: float, rng: random.Random, on_half: Callable[[], None]) -> int:
    """Steps of simulated compute; every 10th step waits on the data loader."""
    import otelgpu

    deadline = time.monotonic() + seconds
    n = 0
    halfway = time.monotonic() + seconds / 2
    fired = False
    while time.monotonic() < deadline:
        with otelgpu.step(samples=32, tokens=32 * 512):
            compute = rng.uniform(0.010, 0.020)
            if n % 10 == 9:
                compute += rng.uniform(0.020, 0.060)  # data-loader stall
            time.sleep(compute)
        n += 1
        if not fired and time.monotonic() > halfway:
            on_half()
            fired = True
    return n


def one_request(i: int, rng: random.Random) -> str:
    import otelgpu

    with otelgpu.request(model=MODEL) as r:
        r.input_tokens(rng.randint(50, 800))
        time.sleep(rng.uniform(0.0, 0.02))  # queue
        r.scheduled()
        time.sleep(rng.uniform(0.02, 0.08))  # prefill
        roll = rng.random()
        if roll < 0.04:
            r.error("timeout")
            return "timeout"
        if roll < 0.08:
            r.error("kv_cache_exhausted")
            return "error"
        r.first_token()
        for _ in range(rng.randint(8, 48)):
            time.sleep(rng.uniform(0.001, 0.004))
            r.tokens(1)
    return "ok"


def inference(seconds: float, rng: random.Random, on_half: Callable[[], None]) -> dict[str, int]:
    """Bursts of concurrent requests on a thread pool."""
    outcomes: dict[str, int] = {}
    deadline = time.monotonic() + seconds
    halfway = time.monotonic() + seconds / 2
    fired = False
    i = 0
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="demo-request") as pool:
        while time.monotonic() < deadline:
            burst = rng.randint(4, 16)
            seeds = [rng.random() for _ in range(burst)]
            futures = [
                pool.submit(one_request, i + k, random.Random(s)) for k, s in enumerate(seeds)
            ]
            i += burst
            if not fired and time.monotonic() > halfway:
                on_half()  # while the burst is in flight: its spans carry the event
                fired = True
            for f in futures:
                outcome = f.result()
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
            time.sleep(rng.uniform(0.05, 0.3))
    return outcomes


def sketch_speed(n: int = 100_000) -> tuple[float, float | None]:
    """ns per ``add`` for the pure-Python sketch and the native one (None if not built)."""
    from otelgpu import _impl
    from otelgpu.sketch import PyQuantileSketch

    values = [random.Random(3).lognormvariate(-4, 1) for _ in range(n)]

    def per_add(cls: Any) -> float:
        sketch = cls(relative_accuracy=0.01)
        add = sketch.add
        t0 = time.perf_counter_ns()
        for v in values:
            add(v)
        return (time.perf_counter_ns() - t0) / n

    pure = per_add(PyQuantileSketch)
    native_mod = None if _impl.NO_EXTENSIONS else _impl.native_module("otelgpu.sketch._sketch_c")
    native = per_add(native_mod.QuantileSketch) if native_mod is not None else None
    return pure, native


def _ms(v: float) -> str:
    return "n/a" if v != v else f"{v * 1000:8.1f} ms"


def _gpu_line(attrs: dict[str, Any]) -> str:
    if not attrs:
        return "no GPU context (no sampler)"
    parts = []
    if "otelgpu.gpu.utilization.mean" in attrs:
        parts.append(
            f"util mean {attrs['otelgpu.gpu.utilization.mean']:.0%}"
            f" max {attrs.get('otelgpu.gpu.utilization.max', 0):.0%}"
        )
    if "otelgpu.gpu.memory.peak" in attrs:
        parts.append(f"memory peak {attrs['otelgpu.gpu.memory.peak'] / 2**30:.1f} GiB")
    if "otelgpu.gpu.energy" in attrs:
        parts.append(f"energy {attrs['otelgpu.gpu.energy']:.0f} J")
    if attrs.get("otelgpu.gpu.throttle_reasons"):
        parts.append("throttled: " + ",".join(attrs["otelgpu.gpu.throttle_reasons"]))
    if attrs.get("otelgpu.gpu.xids"):
        parts.append("XIDs " + ",".join(str(x) for x in attrs["otelgpu.gpu.xids"]))
    return "; ".join(parts) or "no readings"


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    import otelgpu
    from otelgpu import _runtime

    out = out or sys.stdout
    rng = random.Random(args.seed)
    print("otelgpu demo", file=out)
    sim_gpu = None
    if args.sim or not real_nvml_present():
        sim_gpu = activate_sim(args.scenario or DEFAULT_SCENARIO, out)
    else:
        print("  real NVIDIA driver found: sampling the real GPU", file=out)

    handle = otelgpu.instrument(
        service_name=os.environ.get("OTEL_SERVICE_NAME") or "otelgpu-demo",
        metric_export_interval_ms=5000,
    )
    runtime = _runtime.current()
    if runtime is None:
        print("  otelgpu is disabled (OTEL_SDK_DISABLED / OTELGPU_DISABLED)", file=out)
        return 0
    sampler = runtime.sampler
    devices = getattr(sampler, "devices", ()) if sampler is not None else ()
    print(
        f"  sampling {len(devices)} GPU(s): "
        + (", ".join(f"{d.name} {d.uuid[:12]}…" for d in devices) or "none"),
        file=out,
    )
    time.sleep(0.3)  # let the sampler take its first samples

    train_s = args.seconds * 0.55
    infer_s = args.seconds * 0.45
    print(f"  training for {train_s:.0f} s …", file=out)
    t0 = time.time_ns()
    steps = training(
        train_s,
        rng,
        lambda: _inject(sim_gpu, out, "throttle", gpu=0, reason="hw_thermal", duration_s=2),
    )
    t1 = time.time_ns()
    print(f"  serving request bursts for {infer_s:.0f} s …", file=out)
    outcomes = inference(infer_s, rng, lambda: _inject(sim_gpu, out, "xid", gpu=0, code=13))
    t2 = time.time_ns()
    time.sleep(0.3)  # the XID waiter and the sampler deliver late events

    train_gpu = runtime.gpu_attributes(t0, t1)
    infer_gpu = runtime.gpu_attributes(t1, t2)
    health = runtime.health_counts()
    step_q = runtime.step_duration.merged().quantiles([0.5, 0.95, 0.99])
    lat = runtime.request_duration.merged()
    lat_q = lat.quantiles([0.5, 0.95, 0.99])
    ttft_q = runtime.ttft.merged().quantiles([0.5, 0.95, 0.99])
    tpot_q = runtime.tpot.merged().quantiles([0.5, 0.99])
    recording = handle.recording_path
    handle.force_flush()

    total = sum(outcomes.values())
    errors = total - outcomes.get("ok", 0)
    print("\n== training ==", file=out)
    print(f"  steps             {steps}", file=out)
    print(
        f"  step time         p50 {_ms(step_q[0])}  p95 {_ms(step_q[1])}  p99 {_ms(step_q[2])}",
        file=out,
    )
    print(f"  GPU               {_gpu_line(train_gpu)}", file=out)
    print("\n== inference ==", file=out)
    print(
        f"  requests          {total} ({outcomes.get('ok', 0)} ok, "
        f"{outcomes.get('error', 0)} errors, {outcomes.get('timeout', 0)} timeouts; "
        f"error rate {errors / total if total else 0:.1%})",
        file=out,
    )
    print(
        f"  latency           p50 {_ms(lat_q[0])}  p95 {_ms(lat_q[1])}  p99 {_ms(lat_q[2])}",
        file=out,
    )
    print(
        f"  time to 1st token p50 {_ms(ttft_q[0])}  p95 {_ms(ttft_q[1])}  p99 {_ms(ttft_q[2])}",
        file=out,
    )
    print(f"  time per token    p50 {_ms(tpot_q[0])}  p99 {_ms(tpot_q[1])}", file=out)
    print(f"  GPU               {_gpu_line(infer_gpu)}", file=out)
    print("\n== GPU health events ==", file=out)
    if health:
        for (kind, uuid), n in sorted(health.items()):
            print(f"  {kind:<16} x{n}  {uuid}", file=out)
    else:
        print("  none", file=out)
    print("\n== telemetry ==", file=out)
    print(f"  exporters         {', '.join(handle.settings.exporters) or 'none'}", file=out)
    if recording is not None:
        print(f"  recording         {recording}", file=out)
        print(f"  read it with      otelgpu report {recording}", file=out)
    pipeline = runtime.pipeline
    if pipeline is not None and pipeline.prometheus_address is not None:
        host, port = pipeline.prometheus_address
        print(f"  prometheus        http://{host}:{port}/metrics", file=out)
    dropped = runtime.stats.dropped_total()
    errors_internal = sum(runtime.stats.errors().values())
    print(f"  dropped           {dropped} (internal errors: {errors_internal})", file=out)
    handle.shutdown()

    pure, native = sketch_speed()
    if native is not None:
        print(
            f"\nsketch add(): native {native:.0f} ns, pure Python {pure:.0f} ns "
            f"({pure / native:.0f}x faster native)",
            file=out,
        )
    else:
        print(f"\nsketch add(): pure Python {pure:.0f} ns (native core not built)", file=out)
    if sim_gpu is not None:
        with contextlib.suppress(Exception):
            sim_gpu.deactivate()
    return 0
