#!/usr/bin/env python
"""otelgpu's QuantileSketch against the real alternatives, in one run.

    .venv/bin/python benchmarks/bench_sketch.py            # ~1-2 minutes
    .venv/bin/python benchmarks/bench_sketch.py --quick    # smaller sizes, a smoke test

Compared: ddsketch (DDSketch, 1 %), Apache DataSketches KLL (k=200), fastdigest
(t-digest), HdrHistogram (2 significant digits, integer microseconds), the OpenTelemetry
SDK ``Histogram.record`` with two attributes (explicit buckets = the semconv duration
boundaries, and the exponential aggregation with its defaults), and prometheus_client
(``Histogram`` with its default buckets, two labels). Measured: one ``add`` per Python
call (float, int and numpy.float64 arguments), batch ingest, one quantile query, a
merge, the serialized size of 1M lognormal values, relative error at p50/p95/p99/p99.9
on four data sets, and what thread safety costs. Per-call times are the minimum over many
short (5k-call) timed windows, which is robust on a shared machine, and include the
Python ``for`` loop that drives the calls (reported as "empty loop").
Prints markdown and writes it to ``benchmarks/results/sketch.md``.
"""

from __future__ import annotations

import argparse
import gc
import math
import platform
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "sketch"))

import sketch_datasets as ds  # noqa: E402

from otelgpu.sketch import _sketch_py  # noqa: E402

try:
    from otelgpu.sketch import _sketch_c
except ImportError:  # pragma: no cover - the table then says so
    _sketch_c = None  # type: ignore[assignment]

ATTRS = {"http.route": "/v1/generate", "gen_ai.request.model": "llama-3-8b"}
SEMCONV_DURATION_BOUNDS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1,
    2.5,
    5,
    7.5,
    10,
)


def best_ns_per_item(run: Callable[[], Any], n_items: int, repeat: int) -> float:
    """Best wall time of ``run()`` over ``repeat`` runs, in ns per item (GC off)."""
    best = math.inf
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeat):
            t0 = time.perf_counter_ns()
            run()
            best = min(best, time.perf_counter_ns() - t0)
    finally:
        gc.enable()
    return best / n_items


def chunked_best_ns(
    make_run: Callable[[list[Any]], Callable[[], None]],
    data: list[Any],
    repeat: int,
    chunk: int = 5_000,
) -> float:
    """Min over many short timed chunks, ns per item: robust on a shared, loaded machine
    (one quiet 5k-call window is enough, where one long run rarely is quiet)."""
    chunks = [data[i : i + chunk] for i in range(0, len(data), chunk)] or [data]
    runs = [(make_run(c), len(c)) for c in chunks]
    best = math.inf
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeat):
            for run, n in runs:
                t0 = time.perf_counter_ns()
                run()
                best = min(best, (time.perf_counter_ns() - t0) / n)
    finally:
        gc.enable()
    return best


def loop1(f: Callable[[Any], Any], data: list[Any]) -> Callable[[], None]:
    def run() -> None:
        for v in data:
            f(v)

    return run


def loop_attrs(f: Callable[..., Any], data: list[Any]) -> Callable[[], None]:
    attrs = ATTRS

    def run() -> None:
        for v in data:
            f(v, attrs)

    return run


def hist_quantile(bounds: list[float], counts: list[int], q: float) -> float:
    """Prometheus ``histogram_quantile``: linear interpolation inside the bucket."""
    total = sum(counts)
    rank = q * total
    seen = 0
    for i, c in enumerate(counts):
        if seen + c >= rank and c:
            lo = 0.0 if i == 0 else bounds[i - 1]
            if i >= len(bounds):  # +Inf bucket: Prometheus returns the last bound
                return bounds[-1]
            return lo + (bounds[i] - lo) * (rank - seen) / c
        seen += c
    return bounds[-1]


# -- adapters: one per implementation ---------------------------------------------------


@dataclass
class Impl:
    """How to drive one implementation. ``None`` means "has no such operation"."""

    name: str
    make: Callable[[], Any]
    add: Callable[[Any], Callable[[list[Any]], Callable[[], None]]]
    add_many: Callable[[Any, np.ndarray], None] | None
    quantile: Callable[[Any, float], float] | None
    merge: Callable[[Any, Any], None] | None
    serialize: Callable[[Any], bytes]
    int_ok: bool = True
    notes: list[str] = field(default_factory=list)
    slow: bool = False  # time fewer calls (the per-call figure does not depend on n)
    sampled_size: bool = False  # fill with n / 10 values for the size columns
    native_heap: bool = False  # allocates outside Python's allocators: tracemalloc is blind


def otelgpu_impl(cls: Any, name: str, slow: bool = False) -> Impl:
    return Impl(
        name=name,
        make=cls,
        add=lambda s: lambda data: loop1(s.add, data),
        add_many=lambda s, arr: s.add_many(arr),
        quantile=lambda s, q: s.quantile(q),
        merge=lambda a, b: a.merge(b),
        serialize=lambda s: s.to_bytes(),
        slow=slow,
    )


def ddsketch_impl() -> Impl:
    from ddsketch import DDSketch
    from ddsketch.pb.proto import DDSketchProto

    def many(s: Any, arr: np.ndarray) -> None:
        add = s.add
        for v in arr.tolist():
            add(v)

    return Impl(
        name="ddsketch 3 (DDSketch 1 %)",
        make=lambda: DDSketch(relative_accuracy=0.01),
        add=lambda s: lambda data: loop1(s.add, data),
        add_many=many,
        quantile=lambda s, q: s.get_quantile_value(q),
        merge=lambda a, b: a.merge(b),
        serialize=lambda s: DDSketchProto.to_proto(s).SerializeToString(),
        notes=["no batch API: add_many is a loop over add"],
    )


def kll_impl() -> Impl:
    from datasketches import kll_doubles_sketch

    return Impl(
        name="DataSketches KLL (k=200)",
        make=lambda: kll_doubles_sketch(200),
        add=lambda s: lambda data: loop1(s.update, data),
        add_many=lambda s, arr: s.update(arr),
        quantile=lambda s, q: s.get_quantile(q),
        merge=lambda a, b: a.merge(b),
        serialize=lambda s: s.serialize(),
        native_heap=True,
        notes=["randomized compaction (unseeded): its errors change from run to run"],
    )


def fastdigest_impl() -> Impl:
    from fastdigest import TDigest

    return Impl(
        name="fastdigest (t-digest)",
        make=TDigest,
        add=lambda s: lambda data: loop1(s.update, data),
        add_many=lambda s, arr: s.batch_update(arr),
        quantile=lambda s, q: s.quantile(q),
        merge=lambda a, b: a.merge_inplace(b),
        serialize=lambda s: s.to_bytes(),
        native_heap=True,
    )


def hdr_impl() -> Impl:
    from hdrh.histogram import HdrHistogram

    def add_seconds(h: Any) -> Callable[[list[Any]], Callable[[], None]]:
        record = h.record_value

        def make_run(data: list[Any]) -> Callable[[], None]:
            if data and type(data[0]) is int:
                return loop1(record, data)  # already integer microseconds

            def run() -> None:
                for v in data:
                    record(int(v * 1e6))

            return run

        return make_run

    def many(h: Any, arr: np.ndarray) -> None:
        record = h.record_value
        for v in (arr * 1e6).astype(np.int64).tolist():
            record(v)

    return Impl(
        name="HdrHistogram (2 digits, us)",
        make=lambda: HdrHistogram(1, 3_600_000_000, 2),
        add=add_seconds,
        add_many=many,
        quantile=lambda h, q: h.get_value_at_percentile(q * 100.0) / 1e6,
        merge=lambda a, b: a.add(b),
        serialize=lambda h: h.encode(),
        notes=["integers only: float seconds are converted (int(v * 1e6)) in the loop"],
    )


class _OtelHist:
    """An SDK MeterProvider + in-memory reader + one histogram instrument."""

    def __init__(self, exponential: bool) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.metrics.view import (
            ExplicitBucketHistogramAggregation,
            ExponentialBucketHistogramAggregation,
            View,
        )

        aggregation = (
            ExponentialBucketHistogramAggregation()
            if exponential
            else ExplicitBucketHistogramAggregation(boundaries=SEMCONV_DURATION_BOUNDS)
        )
        self.exponential = exponential
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(
            metric_readers=[self.reader], views=[View(instrument_name="*", aggregation=aggregation)]
        )
        self.hist = self.provider.get_meter("bench").create_histogram("latency", unit="s")

    def point(self) -> Any:
        data = self.reader.get_metrics_data()
        return data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points[0]

    def otlp_bytes(self) -> bytes:
        from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

        return encode_metrics(self.reader.get_metrics_data()).SerializeToString()

    def quantile(self, q: float) -> float:
        dp = self.point()
        if self.exponential:
            from otelgpu.sketch import QuantileSketch

            return QuantileSketch.from_data_point(dp).quantile(q)
        return hist_quantile(list(dp.explicit_bounds), list(dp.bucket_counts), q)


def otel_impl(exponential: bool) -> Impl:
    def many(h: _OtelHist, arr: np.ndarray) -> None:
        record = h.hist.record
        for v in arr.tolist():
            record(v, ATTRS)

    kind = "exponential, defaults" if exponential else "explicit, semconv bounds"
    return Impl(
        name=f"OTel SDK Histogram.record ({kind}), 2 attrs",
        make=lambda: _OtelHist(exponential),
        add=lambda h: lambda data: loop_attrs(h.hist.record, data),
        add_many=many,
        quantile=None,
        merge=None,
        serialize=lambda h: h.otlp_bytes(),
        slow=True,
        sampled_size=True,
        notes=[
            "no quantile/merge API; accuracy from the exported point "
            + ("(our estimator on its buckets)" if exponential else "(histogram_quantile)")
        ],
    )


class _Prom:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Histogram

        self.registry = CollectorRegistry()
        self.hist = Histogram(
            "latency_seconds", "latency", ["route", "model"], registry=self.registry
        )

    def observe(self, v: float) -> None:  # not used in timing loops
        self.hist.labels("/v1/generate", "llama-3-8b").observe(v)

    def quantile(self, q: float) -> float:
        bounds: list[float] = []
        counts: list[int] = []
        prev = 0.0
        for metric in self.registry.collect():
            for sample in metric.samples:
                if sample.name.endswith("_bucket"):
                    le = float(sample.labels["le"])
                    bounds.append(le)
                    counts.append(int(sample.value - prev))
                    prev = sample.value
        return hist_quantile(bounds[:-1], counts, q)


def prometheus_impl() -> Impl:
    from prometheus_client import generate_latest

    def add(p: _Prom) -> Callable[[list[Any]], Callable[[], None]]:
        labels = p.hist.labels

        def make_run(data: list[Any]) -> Callable[[], None]:
            def run() -> None:
                for v in data:
                    labels("/v1/generate", "llama-3-8b").observe(v)

            return run

        return make_run

    def many(p: _Prom, arr: np.ndarray) -> None:
        child = p.hist.labels("/v1/generate", "llama-3-8b")
        for v in arr.tolist():
            child.observe(v)

    return Impl(
        name="prometheus_client Histogram, 2 labels",
        make=_Prom,
        add=add,
        add_many=many,
        quantile=None,
        merge=None,
        serialize=lambda p: generate_latest(p.registry),
        slow=True,
        sampled_size=True,
        notes=["default buckets; accuracy by histogram_quantile; text exposition size"],
    )


# -- measurements -----------------------------------------------------------------------


def fmt_ns(ns: float | None) -> str:
    if ns is None:
        return "n/a"
    if ns >= 10_000:
        return f"{ns / 1000:,.1f} us"
    return f"{ns:,.1f} ns" if ns < 100 else f"{ns:,.0f} ns"


def fmt_ratio(x: float | None, ref: float | None) -> str:
    if x is None or ref is None or ref <= 0:
        return "n/a"
    return f"{x / ref:,.1f}x"


def measure_add(impls: list[Impl], n: int, repeat: int) -> dict[str, dict[str, float | None]]:
    rng = np.random.default_rng(42)
    values = rng.lognormal(np.log(0.05), 1.0, n)
    floats = values.tolist()
    ints = [int(v * 1e6) + 1 for v in floats]  # microseconds
    np_floats = list(values)  # numpy.float64 scalars
    out: dict[str, dict[str, float | None]] = {}
    empty = chunked_best_ns(lambda d: loop1(lambda v: None, d), floats, repeat)
    out["empty loop (calls a no-op lambda)"] = {"float": empty, "int": empty, "np": empty}
    for impl in impls:
        k = max(n // 10, 1000) if impl.slow else n
        row: dict[str, float | None] = {}
        for key, data in (("float", floats[:k]), ("int", ints[:k]), ("np", np_floats[:k])):
            s = impl.make()
            row[key] = chunked_best_ns(impl.add(s), data, repeat)
        out[impl.name] = row
        print(f"  add: {impl.name}: {row}", file=sys.stderr)
    return out


def measure_batch(impls: list[Impl], n: int, repeat: int) -> dict[str, float | None]:
    """ns per value of batch ingest: min over many 20k-value batches (load-robust)."""
    arr = ds.lognormal(n)
    out: dict[str, float | None] = {}
    for impl in impls:
        many = impl.add_many
        if many is None:
            out[impl.name] = None
            continue
        k = max(n // 10, 1000) if impl.slow else n
        batch = 20_000
        parts = [arr[i : i + batch] for i in range(0, k, batch)]
        best = math.inf
        gc.collect()
        gc.disable()
        try:
            for _ in range(repeat):
                s = impl.make()
                for part in parts:
                    t0 = time.perf_counter_ns()
                    many(s, part)
                    best = min(best, (time.perf_counter_ns() - t0) / len(part))
        finally:
            gc.enable()
        out[impl.name] = best
    return out


def measure_query_merge_size(
    impls: list[Impl], n: int
) -> dict[str, tuple[float | None, float | None, int, int | None]]:
    big = ds.lognormal(n)
    half_a, half_b = ds.lognormal(100_000, seed=10), ds.lognormal(100_000, seed=11)
    out: dict[str, tuple[float | None, float | None, int, int | None]] = {}
    for impl in impls:
        # slow recorders: their size depends on their fixed buckets, not on n
        part = big[: n // 10] if impl.sampled_size else big
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        s = impl.make()
        impl.add_many(s, part)  # type: ignore[misc]
        gc.collect()
        memory = None if impl.native_heap else tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        size = len(impl.serialize(s))
        q_ns = None
        if impl.quantile is not None:
            quantile = impl.quantile
            q_ns = best_ns_per_item(
                lambda quantile=quantile, s=s: [quantile(s, 0.99) for _ in range(200)], 200, 5
            )
        m_ns = None
        if impl.merge is not None and impl.add_many is not None:
            a, b = impl.make(), impl.make()
            impl.add_many(a, half_a)
            impl.add_many(b, half_b)
            merge = impl.merge
            m_ns = best_ns_per_item(
                lambda merge=merge, a=a, b=b: [merge(a, b) for _ in range(20)], 20, 5
            )
        out[impl.name] = (q_ns, m_ns, size, memory)
        print(f"  query/merge/size: {impl.name}: {out[impl.name]}", file=sys.stderr)
    return out


def measure_accuracy(impls: list[Impl], n: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    sets = {name: make(n) for name, make in ds.DATASETS.items()}
    sorted_sets = {name: np.sort(v) for name, v in sets.items()}
    for impl in impls:
        row: dict[str, float] = {}
        for name, values in sets.items():
            k = n // 4 if impl.slow else n
            part = values[:k]
            ordered = sorted_sets[name] if k == n else np.sort(part)
            s = impl.make()
            impl.add_many(s, part)  # type: ignore[misc]
            worst = 0.0
            for q in ds.QUANTILES:
                exact = ds.exact_quantile(ordered, q)
                est = impl.quantile(s, q) if impl.quantile is not None else s.quantile(q)
                worst = max(worst, abs(est - exact) / exact)
            row[name] = worst
        out[impl.name] = row
        print(f"  accuracy: {impl.name}: {row}", file=sys.stderr)
    return out


def measure_thread_safety(n_per_thread: int, repeat: int) -> list[tuple[str, float, float]]:
    """(variant, ns per add with 1 thread, ns per add with 8 threads sharing one sketch)."""
    rows: list[tuple[str, float, float]] = []
    values = ds.lognormal(n_per_thread).tolist()
    variants: list[tuple[str, Callable[[], Any]]] = []
    if _sketch_c is not None:
        variants.append(
            ("native, GIL build: no lock (the GIL serialises)", _sketch_c.QuantileSketch)
        )

        def locked() -> Any:
            s = _sketch_c.QuantileSketch()
            s._set_locking(True)
            return s

        variants.append(("native, spin lock forced (what free-threading uses)", locked))
    variants.append(("pure-Python twin (threading.Lock)", _sketch_py.QuantileSketch))
    for label, make in variants:
        k = n_per_thread if "native" in label else n_per_thread // 10
        data = values[:k]
        single = make()
        one = chunked_best_ns(lambda d, single=single: loop1(single.add, d), data, repeat)
        best8 = math.inf
        for _ in range(max(repeat // 2, 1)):
            s = make()
            barrier = threading.Barrier(9)

            def worker(
                s: Any = s, barrier: threading.Barrier = barrier, data: list[Any] = data
            ) -> None:
                add = s.add
                barrier.wait()
                for v in data:
                    add(v)

            threads = [threading.Thread(target=worker) for _ in range(8)]
            for t in threads:
                t.start()
            barrier.wait()
            t0 = time.perf_counter_ns()
            for t in threads:
                t.join()
            best8 = min(best8, (time.perf_counter_ns() - t0) / (8 * k))
            assert s.count == 8 * k, "lost adds"
        rows.append((label, one, best8))
        print(f"  threads: {label}: {one:.1f} / {best8:.1f}", file=sys.stderr)
    return rows


# -- report -------------------------------------------------------------------------------


def render(
    ours: str,
    adds: dict[str, dict[str, float | None]],
    batch: dict[str, float | None],
    qms: dict[str, tuple[float | None, float | None, int, int | None]],
    acc: dict[str, dict[str, float]],
    threads: list[tuple[str, float, float]],
    impls: list[Impl],
    args: argparse.Namespace,
) -> str:
    lines: list[str] = []
    w = lines.append
    w("# QuantileSketch benchmark")
    w("")
    w(
        f"`benchmarks/bench_sketch.py{' --quick' if args.quick else ''}` on "
        f"{platform.machine()}, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. "
        "Ratios are *other / otelgpu native* (higher = otelgpu is faster or smaller). "
        "Per-call times are the minimum over many 5k-call windows (robust on a shared "
        "machine) and include the Python loop that drives the calls."
    )
    w("")
    w("## Ingest: ns per Python call to `add` (and per value for batch ingest)")
    w("")
    w("| implementation | float | int | numpy.float64 | float x | batch ns/value | batch x |")
    w("|---|---:|---:|---:|---:|---:|---:|")
    ref = adds[ours]
    for name, row in adds.items():
        b = batch.get(name)
        w(
            f"| {name} | {fmt_ns(row['float'])} | {fmt_ns(row['int'])} | {fmt_ns(row['np'])} | "
            f"{fmt_ratio(row['float'], ref['float']) if name in batch else ''} | "
            f"{fmt_ns(b) if name in batch else ''} | "
            f"{fmt_ratio(b, batch[ours]) if name in batch else ''} |"
        )
    w("")
    w("## Query, merge, size (1M lognormal values; 100k + 100k for merge)")
    w("")
    w(
        "| implementation | quantile(0.99) | x | merge | x | serialized bytes | x "
        "| memory bytes | x |"
    )
    w("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rq, rm, rs, rmem = qms[ours]
    for name, (q, m, size, mem) in qms.items():
        mem_s = "n/a" if mem is None else f"{mem:,}"
        w(
            f"| {name} | {fmt_ns(q)} | {fmt_ratio(q, rq)} | {fmt_ns(m)} | {fmt_ratio(m, rm)} | "
            f"{size:,} | {fmt_ratio(size, rs)} | {mem_s} | "
            f"{fmt_ratio(mem, rmem) if mem is not None else 'n/a'} |"
        )
    w("")
    w(
        f"## Accuracy: worst relative error over p50/p95/p99/p99.9 ({args.accuracy_n:,} values; "
        "OTel/Prometheus rows use a quarter)"
    )
    w("")
    names = list(ds.DATASETS)
    w("| implementation | " + " | ".join(names) + " |")
    w("|---|" + "---:|" * len(names))
    for name, row in acc.items():
        w(f"| {name} | " + " | ".join(f"{100 * row[d]:.2f} %" for d in names) + " |")
    w("")
    w("## Cost of thread safety (ns per `add`, lognormal floats)")
    w("")
    w("| variant | 1 thread | 8 threads, one shared sketch | x vs native default |")
    w("|---|---:|---:|---:|")
    base = threads[0][1] if threads else None
    for label, one, eight in threads:
        w(f"| {label} | {fmt_ns(one)} | {fmt_ns(eight)} | {fmt_ratio(one, base)} |")
    w("")
    w("Notes:")
    w("")
    w(
        "- memory: bytes still allocated through Python's allocators after filling the "
        "sketch (tracemalloc, which also sees the native twin's PyMem_Raw buckets); n/a for "
        "libraries that allocate on their own native heap (C++/Rust). OTel and Prometheus "
        "rows are filled with 100k values (their size depends on their fixed buckets)."
    )
    for impl in impls:
        for note in impl.notes:
            w(f"- {impl.name}: {note}.")
    w(
        "- 8 threads: with the GIL only one thread runs Python at a time, so the 8-thread "
        "figure is throughput under contention (switching included), not parallel speed-up; "
        "every run asserts that no add was lost."
    )
    w(
        "- otelgpu default: scale 6 (0.54 % guaranteed relative error), at most 2048 buckets "
        "per sign; the pure-Python twin has identical buckets (tested), so its accuracy is "
        "the native row's."
    )
    w("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "sketch.md")
    args = parser.parse_args(argv)
    n_add = 20_000 if args.quick else 200_000
    n_big = 100_000 if args.quick else 1_000_000
    args.accuracy_n = 20_000 if args.quick else 200_000
    repeat = 3 if args.quick else 5

    impls: list[Impl] = []
    if _sketch_c is not None:
        impls.append(otelgpu_impl(_sketch_c.QuantileSketch, "otelgpu QuantileSketch (native)"))
    impls.append(
        otelgpu_impl(_sketch_py.QuantileSketch, "otelgpu QuantileSketch (pure Python)", True)
    )
    for factory in (
        ddsketch_impl,
        kll_impl,
        fastdigest_impl,
        hdr_impl,
        lambda: otel_impl(False),
        lambda: otel_impl(True),
        prometheus_impl,
    ):
        try:
            impls.append(factory())
        except ImportError as exc:
            print(f"skipping an implementation: {exc} (pip install '.[bench]')", file=sys.stderr)
    ours = impls[0].name

    print("measuring add ...", file=sys.stderr)
    adds = measure_add(impls, n_add, repeat)
    print("measuring batch ingest ...", file=sys.stderr)
    batch = measure_batch(impls, n_big, repeat)
    print("measuring query / merge / size ...", file=sys.stderr)
    qms = measure_query_merge_size(impls, n_big)
    print("measuring accuracy ...", file=sys.stderr)
    acc = measure_accuracy([i for i in impls if "pure Python" not in i.name], args.accuracy_n)
    print("measuring thread safety ...", file=sys.stderr)
    threads = measure_thread_safety(n_add // 2, repeat)

    report = render(ours, adds, batch, qms, acc, threads, impls, args)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report + "\n", encoding="utf-8")
    print(f"written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
