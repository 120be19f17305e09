"""Which background work makes the host's loop wait: attribute every long gap to its cause.

The main thread spins inside ``otelgpu.step()`` (100 µs busy steps, 1 simulated GPU) or
``otelgpu.request()`` (8 GPUs) and records every gap longer than ``--gap-ms`` between two
of its clock reads. Meanwhile the candidate functions of otelgpu's background threads are
wrapped to record their wall interval, their thread's CPU time (``time.thread_time``: what
they really ran, whatever the machine's load) and their thread; ``gc.callbacks`` record
every collection (generation, duration, thread). Each gap is then attributed to the
innermost wrapped call (or collection) overlapping it; a gap that overlaps nothing is
"unattributed" (the OS ran something else: machine load, or unwrapped work).

Run: ``python benchmarks/diag_gil_holds.py --exporter otlp-grpc --seconds 10``
(``OTELGPU_NO_EXTENSIONS=1`` for the pure-Python twin; ``--kind request --gpus 8`` for
the inference case). Prints the background threads' CPU time within one step (max, p99,
p99.9: the load-robust pause estimate); for every step in which they used more than
0.5 ms, each thread's CPU charged to the innermost wrapped call overlapping the step;
per cause of a gap, the number of gaps and the CPU; each wrapped call's longest wall and
thread-CPU time. The otelgpu imported is this checkout's (not an installed one).
Diagnostic only: it monkeypatches SDK internals and is not part of the benchmark table.
"""

from __future__ import annotations

import argparse
import array
import gc
import importlib
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's otelgpu

import bench_export

INTERVALS: list[tuple[float, float, float, str, str]] = []  # start, end, cpu, label, thread


def wrap(owner: Any, attr: str, label: str) -> None:
    """Record every call of ``owner.attr`` (module function or class method)."""
    original = getattr(owner, attr, None)
    if original is None:
        print(f"(no {label})", file=sys.stderr)
        return
    clock, cpu = time.perf_counter, time.thread_time

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        c0, t0 = cpu(), clock()
        try:
            return original(*args, **kwargs)
        finally:
            INTERVALS.append((t0, clock(), cpu() - c0, label, threading.current_thread().name))

    setattr(owner, attr, wrapper)


def _gc_callback() -> Any:
    started: dict[int, tuple[float, float]] = {}

    def callback(phase: str, info: dict[str, Any]) -> None:
        tid = threading.get_ident()
        if phase == "start":
            started[tid] = (time.perf_counter(), time.thread_time())
        elif tid in started:
            t0, c0 = started.pop(tid)
            INTERVALS.append(
                (
                    t0,
                    time.perf_counter(),
                    time.thread_time() - c0,
                    f"gc gen{info['generation']}",
                    threading.current_thread().name,
                )
            )

    return callback


def install_wrappers() -> None:
    from opentelemetry.sdk.metrics._internal import measurement_consumer, metric_reader_storage
    from opentelemetry.sdk.metrics._internal.export import MetricReader

    from otelgpu.otel import exporters, processor, recording, sketches, span_encoding, span_json

    wrap(MetricReader, "collect", "sdk MetricReader.collect (all, with callbacks)")
    wrap(
        measurement_consumer.SynchronousMeasurementConsumer,
        "collect",
        "sdk measurement consumer collect (callbacks + storage)",
    )
    wrap(
        metric_reader_storage.MetricReaderStorage,
        "collect",
        "sdk MetricReaderStorage.collect (aggregations -> MetricsData)",
    )
    from opentelemetry.sdk.metrics._internal._view_instrument_match import _ViewInstrumentMatch

    wrap(_ViewInstrumentMatch, "collect", "sdk one instrument's aggregations -> points")
    wrap(sketches.SketchRegistry, "metrics", "sketch -> exponential histograms")
    wrap(sketches.SketchHistogram, "to_metric", "one sketch histogram -> metric")
    wrap(exporters.GuardedMetricExporter, "export", "GuardedMetricExporter.export (all)")
    for mod_name in (
        "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
        "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    ):
        mod = importlib.import_module(mod_name)
        wrap(mod, "encode_metrics", f"OTLP encode_metrics ({mod_name.split('.')[4]})")
    from opentelemetry.exporter.otlp.proto.grpc import exporter as grpc_exporter

    wrap(grpc_exporter.OTLPExporterMixin, "_export", "OTLP gRPC _export (serialize + send)")
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    wrap(OTLPMetricExporter, "_export", "OTLP HTTP metric _export (send)")
    wrap(recording, "metrics_json_line", "recording metrics_json_line (all)")
    wrap(recording.RecordingFile, "write_line", "recording write_line")
    wrap(processor.BoundedBatchSpanProcessor, "_encode_sliced", "span batch encode (sliced)")
    wrap(processor.BoundedBatchSpanProcessor, "_encode_queue", "span early encode (sliced)")
    wrap(processor.BoundedBatchSpanProcessor, "_send_ready", "span send encoded (all)")
    wrap(span_encoding, "assemble", "span assemble (protobuf)")
    wrap(span_json, "request_line", "span assemble (json)")
    from otelgpu.otel import fast_export

    wrap(fast_export.EncodedSpanExporter, "export_encoded", "span export_encoded (send)")
    from otelgpu.otel import deferred
    from otelgpu.runtime import steps

    wrap(deferred.DeferredWork, "_run", "deferred work (all queued)")
    wrap(steps.StepRecorder, "finish", "step finish (span, GPU context, metrics)")
    from otelgpu.sampler import _core_py

    # The pure-Python sampler's round (the native core runs without the GIL).
    wrap(_core_py.PyCore, "_sample_device", "pure sampler: one device's NVML reads")
    wrap(_core_py.PyCore, "_prewarm", "pure sampler: pre-warmed summaries")
    wrap(_core_py.PyCore, "_drain_xids", "pure sampler: XID drain")
    from otelgpu.metrics import gpu as gpu_metrics

    for name in dir(gpu_metrics):
        if name.startswith("_observe") or name.startswith("_collect"):
            wrap(gpu_metrics, name, f"gpu {name}")
    gc.callbacks.append(_gc_callback())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--exporter", default="otlp-grpc", choices=bench_export.EXPORTERS)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--gap-ms", type=float, default=0.5)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--kind", choices=["step", "request"], default="step")
    parser.add_argument(
        "--busy-ms", type=float, default=0.1, help="each step's spin (20: the train50 scenario)"
    )
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="otelgpu-diag-")
    receiver, grpc_port, http_port = bench_export.start_receiver(Path(tmp))
    try:
        import otelgpu
        from otelgpu import sim

        sim.activate("healthy-8xh100", clock="wall")
        install_wrappers()
        handle = otelgpu.instrument(
            gpu=True,
            devices="0" if args.gpus == 1 else None,
            frameworks="none",
            metric_export_interval_ms=1000,
            span_schedule_delay_ms=500,
            **bench_export._exporter_settings(args.exporter, (grpc_port, http_port), tmp),
        )
        time.sleep(0.3)
        print(f"measuring from {time.perf_counter():.3f}")
        clock = time.perf_counter
        gaps: list[tuple[float, float, dict[str, float]]] = []
        load0 = os.getloadavg()[0]
        end = clock() + args.seconds
        limit = args.gap_ms / 1e3
        steps = 0
        busy_s = args.busy_ms / 1e3
        main_ident = threading.get_ident()
        clocks: dict[str, int] = {}
        # Per-step figures kept without allocating tracked objects (the diagnostic must not
        # itself promote objects and trigger full collections).
        bg_per_step = array.array("d")
        worst_bg: list[tuple[float, dict[str, float], float, float]] = []

        def bg_cpu() -> dict[str, float]:
            out = {}
            for t in threading.enumerate():
                if t.ident is None or t.ident == main_ident:
                    continue
                try:
                    clk = clocks.get(t.name) or time.pthread_getcpuclockid(t.ident)
                    clocks[t.name] = clk
                    out[t.name] = time.clock_gettime(clk)
                except OSError:
                    continue
            return out

        while clock() < end:
            before = bg_cpu()
            s0 = clock()
            step_gaps = []
            cm = otelgpu.step(samples=32) if args.kind == "step" else otelgpu.request(model="m")
            with cm:
                last = t0 = clock()
                while True:
                    now = clock()
                    if now - last > limit:
                        step_gaps.append((last, now))
                    last = now
                    if now - t0 > busy_s:
                        break
            after = bg_cpu()
            used = {k: after[k] - before.get(k, after[k]) for k in after}
            used = {k: v for k, v in used.items() if v > 0}
            total = sum(used.values())
            bg_per_step.append(total)
            if total > 0.0005:
                worst_bg.append((total, used, s0, clock()))
            for g0, g1 in step_gaps:
                gaps.append((g0, g1, used))
            steps += 1
        handle.shutdown()
    finally:
        receiver.kill()
    by_cause: dict[str, list[float]] = defaultdict(list)
    machine = 0
    for g0, g1, used in gaps:
        # Load-robust: a gap in which no otelgpu thread used CPU is the machine's (the OS
        # ran another process); otherwise the thread that used the most CPU caused it.
        if sum(used.values()) < 0.3 * (g1 - g0):
            machine += 1
            continue
        thread = max(used, key=lambda k: used[k])
        hits = [iv for iv in INTERVALS if iv[0] < g1 and iv[1] > g0 and iv[4] == thread]
        label = min(hits, key=lambda iv: iv[1] - iv[0])[3] if hits else "(unwrapped work)"
        by_cause[f"{label} [{thread}]"].append(used[thread])
    print(
        f"exporter {args.exporter}, {args.kind}, {args.gpus} GPU(s), {steps} steps, "
        f"{len(gaps)} gaps > {args.gap_ms} ms ({machine} with no otelgpu CPU: the machine); "
        f"load average {load0:.2f} -> {os.getloadavg()[0]:.2f}; native: {otelgpu.NATIVE}"
    )
    worst_bg.sort(key=lambda x: -x[0])
    per_step = sorted(bg_per_step, reverse=True)
    print(
        f"background-thread CPU within one {args.busy_ms:g} ms step (load-robust pause "
        "estimate): "
        f"max {per_step[0] * 1e3:.2f} ms, p99 {per_step[len(per_step) // 100] * 1e3:.3f} ms,"
        f" p99.9 {per_step[len(per_step) // 1000] * 1e3:.3f} ms; worst steps: "
        + "; ".join(
            ", ".join(f"{k} {v * 1e3:.2f}" for k, v in used.items())
            for _, used, _s0, _s1 in worst_bg[:3]
        )
    )
    # The steps in which otelgpu's threads ran longest, charged per thread to the innermost
    # wrapped call overlapping the step (what held the GIL while the host waited).
    by_step_cause: dict[str, list[float]] = defaultdict(list)
    for _total, used, s0, s1 in worst_bg:
        for thread, cpu_used in used.items():
            if cpu_used < 0.0002:
                continue
            hits = [iv for iv in INTERVALS if iv[0] < s1 and iv[1] > s0 and iv[4] == thread]
            label = min(hits, key=lambda iv: iv[1] - iv[0])[3] if hits else "(unwrapped work)"
            by_step_cause[f"{label} [{thread}]"].append(cpu_used)
    title = "steps with > 0.5 ms otelgpu CPU, by innermost call"
    print(f"\n{title:70} {'steps':>5} {'max cpu ms':>10}")
    for cause, values in sorted(by_step_cause.items(), key=lambda kv: -max(kv[1])):
        print(f"{cause:70} {len(values):5d} {max(values) * 1e3:10.2f}")
    print()
    print(f"{'cause of gap (by CPU of the thread that ran)':70} {'gaps':>5} {'max cpu ms':>10}")
    for cause, values in sorted(by_cause.items(), key=lambda kv: -max(kv[1])):
        print(f"{cause:70} {len(values):5d} {max(values) * 1e3:10.2f}")
    for t0, _t1, cpu, label, thread in INTERVALS:
        if label == "gc gen2":
            print(f"full collection: {cpu * 1e3:.1f} ms CPU in thread {thread} at {t0:.3f}")
    calls: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for t0, t1, cpu, label, _thread in INTERVALS:
        calls[label].append((t1 - t0, cpu))
    print(f"\n{'wrapped call':70} {'calls':>6} {'max wall ms':>11} {'max cpu ms':>10}")
    for label, values in sorted(calls.items(), key=lambda kv: -max(c for _, c in kv[1])):
        print(
            f"{label:70} {len(values):6d} {max(w for w, _ in values) * 1e3:11.2f}"
            f" {max(c for _, c in values) * 1e3:10.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
