"""``otelgpu report FILE``: summarise a local recording (OTLP JSON lines).

For every sketch metric (exponential histogram) the newest cumulative point of each
series is turned back into a sketch -- losslessly, the buckets are the sketch's -- and
its count and p50/p95/p99 printed; counters show their newest value; spans are counted
by name, and GPU health events found on spans are listed.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any, TextIO

from otelgpu.errors import CorruptDataError

QUANTILES = (0.5, 0.95, 0.99)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "report",
        help="summarise a local recording (OTLP JSON lines)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("files", nargs="+", help="recording files (*.otlp.jsonl)")
    parser.set_defaults(func=run)
    return parser


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def _label(attrs: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(attrs.items())) or "-"


def summarise(paths: list[str], out: TextIO) -> int:
    """Print the summary of the recordings ``paths``; returns the number of messages read."""
    from otelgpu.otel.recording_reader import ReadStats, read_recording
    from otelgpu.sketch import QuantileSketch

    stats = ReadStats()

    histograms: dict[tuple[str, str], tuple[str, Any]] = {}  # (metric, series) -> (unit, point)
    sums: dict[tuple[str, str], tuple[str, float]] = {}
    spans: Counter[str] = Counter()
    events: Counter[str] = Counter()
    resources: set[tuple[tuple[str, Any], ...]] = set()
    messages = 0
    for path in paths:
        for message in read_recording(path, stats=stats):
            messages += 1
            for rs in getattr(message, "resource_spans", ()):
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        spans[span.name] += 1
                        for event in span.events:
                            if event.name.startswith("otelgpu.gpu."):
                                events[event.name.removeprefix("otelgpu.gpu.")] += 1
            for rm in getattr(message, "resource_metrics", ()):
                res = _attrs(rm.resource.attributes)
                resources.add(
                    tuple(
                        (k, str(res[k]))
                        for k in ("service.name", "host.name", "process.pid")
                        if k in res
                    )
                )
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        kind = metric.WhichOneof("data")
                        if kind == "exponential_histogram":
                            for dp in metric.exponential_histogram.data_points:
                                key = (metric.name, _label(_attrs(dp.attributes)))
                                histograms[key] = (metric.unit, dp)
                        elif kind == "sum":
                            for dp in metric.sum.data_points:
                                value = dp.as_int if dp.HasField("as_int") else dp.as_double
                                key = (metric.name, _label(_attrs(dp.attributes)))
                                sums[key] = (metric.unit, value)
    print(f"{messages} export requests from {len(resources)} process(es)", file=out)
    if stats.skipped_lines:
        print(f"({stats.skipped_lines} unreadable line(s) skipped)", file=out)
    for reason in stats.abandoned or ():
        print(f"otelgpu report: {reason}", file=sys.stderr)
    print("\n== distributions (from the exported sketches) ==", file=out)
    for (name, series), (unit, dp) in sorted(histograms.items()):
        try:
            sketch = QuantileSketch.from_data_point(dp)
        except (ValueError, CorruptDataError) as exc:
            print(f"  {name} {series}: unreadable ({exc})", file=out)
            continue
        qs = sketch.quantiles(list(QUANTILES))
        scale, suffix = (1000.0, "ms") if unit == "s" else (1.0, unit)
        text = "  ".join(
            f"p{int(q * 100)} {v * scale:.2f}" for q, v in zip(QUANTILES, qs, strict=True)
        )
        print(f"  {name} [{series}] n={sketch.count}  {text} {suffix}", file=out)
    print("\n== counters (newest cumulative value) ==", file=out)
    for (name, series), (unit, value) in sorted(sums.items()):
        print(f"  {name} [{series}] {value:g} {unit}", file=out)
    print("\n== spans ==", file=out)
    for name, n in spans.most_common():
        print(f"  {name}: {n}", file=out)
    if events:
        print("\n== GPU health events on spans ==", file=out)
        for name, n in events.most_common():
            print(f"  {name}: {n}", file=out)
    return messages


def run(args: argparse.Namespace) -> int:
    try:
        messages = summarise(list(args.files), sys.stdout)
    except (OSError, CorruptDataError) as exc:
        print(f"otelgpu report: {exc}", file=sys.stderr)
        return 1
    if not messages:
        print(
            "otelgpu report: no readable OTLP export request in "
            + ", ".join(args.files)
            + " (not an otelgpu recording, or damaged throughout)",
            file=sys.stderr,
        )
        return 1
    return 0
