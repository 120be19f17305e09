"""Instructions per operation, export included: the load-independent twin of the cost table
of ``bench_export.py``.

Wall-clock CPU per operation moves by tens of percent between runs on a shared VM;
instruction counts do not. Each row runs in a fresh process under ``valgrind
--tool=callgrind`` with counting off, warms up, then counts ``n`` operations plus the final
flush over every thread of the process (the caller, the span export thread, the metric
reader, the gRPC channel). The GPU sampler's thread is stopped before counting (its rounds
run on their own clock, which valgrind slows; its last samples stay, and every window is
still answered from them), so the figure is the operation and its export alone. A row of
no-op operations measures what switching the counting on and off costs; it is subtracted.

Rows: a plain OpenTelemetry SDK span with two attributes (BatchSpanProcessor, the SDK's
OTLP gRPC exporter: the reference), ``otelgpu.request()`` with 0, 1 and 8 simulated GPUs,
and ``otelgpu.step()`` with every step span exported, 1 and 8 GPUs; all over OTLP gRPC to
a live receiver in another process (not counted). The plain span's queue holds every span:
under valgrind the SDK's export thread falls behind, and its default queue (2,048) dropped a
third of them -- exports never counted, a plain row too cheap (before 2026-12-04 16:40 UTC).
A row that loses a span fails.

Writes ``benchmarks/results/instructions.md``. Run: ``python benchmarks/bench_instructions.py
[-n 3000]`` (needs valgrind; about a minute per row).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_export  # noqa: E402 - the receiver and the plain span live there

RESULTS = HERE / "results" / "instructions.md"
#: (row, kind, GPUs): kind "plain", "noop", "request" or "step-all".
ROWS = (
    ("no-op (counting on/off, subtracted)", "noop", 0),
    ("plain OTel span, 2 attributes", "plain", 0),
    ("`otelgpu.request()`, no GPU", "request", 0),
    ("`otelgpu.request()`, 1 GPU", "request", 1),
    ("`otelgpu.request()`, 8 GPUs", "request", 8),
    ("`otelgpu.step()`, every span, 1 GPU", "step-all", 1),
    ("`otelgpu.step()`, every span, 8 GPUs", "step-all", 8),
)
WARMUP = 300


def _callgrind(state: str) -> None:
    subprocess.run(
        ["callgrind_control", "-i", state, str(os.getpid())],
        check=True,
        capture_output=True,
        timeout=300,
    )


def child(kind: str, gpus: int, n: int, port: int) -> None:
    """Runs under callgrind with counting off; counts ``n`` operations and the flush."""
    ports = (port, 0)
    flush: Callable[[], Any]
    exported = [0]  # spans the plain row's exporter was given
    if kind == "noop":

        def op() -> None:
            return None

        def flush() -> None:
            return None

    elif kind == "plain":
        # A queue for every span: under valgrind the SDK's export thread falls behind and
        # its default queue (2048) would drop spans -- uncounted exports, a cheaper plain row.
        op, tp = bench_export._plain_span("otlp-grpc", ports, "", max_queue_size=2 * (n + WARMUP))
        processor = tp._active_span_processor._span_processors[0]
        exporter = getattr(getattr(processor, "_batch_processor", None), "_exporter", None)
        exporter = exporter or processor.span_exporter
        export = exporter.export

        def counting_export(spans: Any) -> Any:
            exported[0] += len(spans)
            return export(spans)

        exporter.export = counting_export

        def flush() -> None:
            tp.force_flush()
    else:
        import otelgpu
        from otelgpu import _runtime

        handle = bench_export.instrumented(
            kind, "otlp-grpc", gpus, ports, "", metric_interval_ms=600_000
        )
        flush = handle.force_flush
        if kind == "request":

            def op() -> None:
                with otelgpu.request(model="m") as r:
                    r.first_token()
                    r.tokens(8)
        else:

            def op() -> None:
                with otelgpu.step(samples=32, tokens=4096):
                    pass

        time.sleep(1.0)  # a few samples per GPU
        for _ in range(WARMUP):
            op()
        runtime = _runtime.current()
        sampler = None if runtime is None else runtime.sampler
        if sampler is not None:
            sampler.stop()
    for _ in range(WARMUP):
        op()
    flush()
    _callgrind("on")
    for _ in range(n):
        op()
    flush()
    _callgrind("off")
    lost = _lost(kind, n, exported[0])
    if lost:
        print(f"{kind}: {lost}", file=sys.stderr)
        os._exit(3)
    os._exit(0)


def _lost(kind: str, n: int, exported: int) -> str:
    """What a row lost (a row that drops spans would count less than it should)."""
    if kind == "plain":
        expected = n + WARMUP
        return "" if exported == expected else f"{exported} of {expected} spans exported"
    from otelgpu import _runtime

    runtime = _runtime.current()
    if runtime is None:
        return ""
    dropped = {k: v for k, v in runtime.stats.dropped().items() if k[1] != "tail_sampled" and v}
    return f"dropped {dropped}" if dropped else ""


def count(kind: str, gpus: int, n: int, port: int, tmp: str) -> float:
    """Instructions of ``n`` operations (all threads), from one callgrind child."""
    out = f"{tmp}/{kind}-{gpus}.out"
    cmd = [
        "valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
        f"--callgrind-out-file={out}",
        sys.executable, __file__, "--child", kind, str(gpus), str(n), str(port),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    totals = []
    for path in Path(tmp).glob(f"{kind}-{gpus}.out-*"):
        found = re.search(r"^totals: (\d+)", path.read_text(errors="replace"), re.M)
        totals.append(int(found.group(1)) if found else 0)
    if proc.returncode != 0 or not totals:
        raise RuntimeError(f"{kind} {gpus}: rc={proc.returncode} {proc.stderr[-500:]}")
    return float(sum(totals))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=3000, help="operations counted per row")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, gpus, n, port = args.child
        child(kind, int(gpus), int(n), int(port))
        return
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind (callgrind) is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        receiver, grpc_port, _http = bench_export.start_receiver(Path(tmp))
        try:
            counts = {}
            for name, kind, gpus in ROWS:
                counts[name] = count(kind, gpus, args.n, grpc_port, tmp)
                print(f"{name}: {counts[name] / args.n:,.0f} instructions per op", flush=True)
        finally:
            receiver.kill()
    noop = counts[ROWS[0][0]]
    per_op = {name: (total - noop) / args.n for name, total in counts.items() if total != noop}
    plain = per_op[ROWS[1][0]]
    lines = [
        "# Instructions per operation, export included",
        "",
        f"Python {platform.python_version()}, {platform.machine()}, native core: "
        f"{'no' if os.environ.get('OTELGPU_NO_EXTENSIONS') else 'yes'}. callgrind, "
        f"{args.n} operations per row and the final flush, every thread of the process "
        "(GPU sampler thread stopped before counting), OTLP gRPC to a live receiver in "
        "another process. Written by `benchmarks/bench_instructions.py`.",
        "",
        "| operation | instructions per op | vs plain OTel span |",
        "|---|---:|---:|",
    ]
    for name, _kind, _gpus in ROWS[1:]:
        lines.append(f"| {name} | {per_op[name]:,.0f} | {per_op[name] / plain:.2f}x |")
    lines += ["", "Target (bench_export): ≤ 1.3x the plain OTel span with 1 or 8 GPUs."]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
