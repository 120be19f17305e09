"""The text report of one run: verdict card first, then training, inference, GPUs, details.

Counters whose every series is zero are left out (64 zero throttle counters are noise);
GPU gauges are summarised per GPU (utilization, temperature, power, memory watermark).
"""

from __future__ import annotations

import math
from typing import TextIO

from otelgpu.report import analysis as A
from otelgpu.report.model import Run

BAR_WIDTH = 24


def _ms(v: float) -> str:
    return f"{v * 1e3:.1f} ms" if math.isfinite(v) else "n/a"


def _bar(share: float, width: int = BAR_WIDTH) -> str:
    n = max(0, min(width, round(share * width)))
    return "█" * n + "·" * (width - n)


def _gib(v: float | None) -> str:
    return "n/a" if v is None else f"{v / 2**30:.1f} GiB"


def _opt(v: float | None, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


def verdict_card(run: Run, out: TextIO) -> None:
    verdicts = A.verdicts(run)
    if not verdicts:
        return
    lines = []
    for v in verdicts:
        lines.append(v.line())
        if v.evidence:
            lines.append("    " + "; ".join(v.evidence))
    width = min(100, max(len(x) for x in lines) + 4)
    print("┌─ verdict " + "─" * (width - 11), file=out)
    for line in lines:
        print(f"│ {line}", file=out)
    print("└" + "─" * (width - 1), file=out)


def write(run: Run, out: TextIO) -> None:
    """Print the report of ``run``."""
    gpus = A.gpus(run)
    print(
        f"otelgpu report: {run.messages} export requests from {len(run.processes)} process(es), "
        f"{len(gpus)} GPU(s), {run.end_s:.1f} s recorded",
        file=out,
    )
    if run.skipped_lines:
        print(f"({run.skipped_lines} unreadable line(s) skipped)", file=out)
    for reason in run.abandoned:
        print(f"(gave up reading: {reason})", file=out)
    verdict_card(run, out)
    t = A.training(run)
    if t is not None:
        print("\n== training ==", file=out)
        print(f"  steps        {t.steps} ({t.recorded_steps} step spans recorded)", file=out)
        if t.step_quantiles:
            print(f"  step time    {A.fmt_quantiles(t.step_quantiles, 's')}", file=out)
        if t.samples_per_s or t.tokens_per_s:
            parts = []
            if t.samples_per_s:
                parts.append(f"{t.samples_per_s:,.0f} samples/s")
            if t.tokens_per_s:
                parts.append(f"{t.tokens_per_s:,.0f} tokens/s")
            print(f"  throughput   {', '.join(parts)}", file=out)
        for phase, seconds, share in t.phases:
            print(f"  {phase:<12} {_bar(share)} {share * 100:5.1f} %  ({seconds:.2f} s)", file=out)
        if t.mfu is not None:
            print(f"  MFU          {t.mfu * 100:.1f} %", file=out)
        if t.joules_per_step is not None:
            line = f"  energy       {t.joules_per_step:.1f} J/step"
            if t.joules_per_token:
                line += f", {t.joules_per_token * 1e3:.3f} mJ/token"
                line += f" ({1 / t.joules_per_token:,.0f} tokens/J)"
            print(line, file=out)
    i = A.inference(run)
    if i is not None:
        print("\n== inference ==", file=out)
        outcomes = ", ".join(f"{n} {k}" for k, n in sorted(i.outcomes.items()))
        print(
            f"  requests     {i.requests} ({outcomes}; error rate {i.error_rate * 100:.1f} %)",
            file=out,
        )
        if i.requests_per_s:
            print(
                f"  rate         {i.requests_per_s:.1f} req/s"
                + (f", {i.tokens_per_s:,.0f} output tokens/s" if i.tokens_per_s else ""),
                file=out,
            )
        for label, values in (
            ("latency", i.latency),
            ("TTFT", i.ttft),
            ("per token", i.tpot),
            ("queue", i.queue),
        ):
            if values:
                print(f"  {label:<12} {A.fmt_quantiles(values, 's')}", file=out)
        if i.joules_per_output_token is not None:
            print(
                f"  energy       {i.joules_per_output_token:.2f} J per output token "
                f"({1 / i.joules_per_output_token:.2f} tokens/J)",
                file=out,
            )
    if gpus:
        print("\n== GPUs (from the sampled gauges) ==", file=out)
        print(
            f"  {'GPU':<17} {'util mean/max':>13} {'tensor':>6} {'mem peak':>9}"
            f" {'power mean/max':>15}"
            f" {'temp max':>8} {'throttled':>9}  events",
            file=out,
        )
        for n, g in enumerate(gpus):
            util = (
                f"{g.utilization_mean * 100:.0f}/{g.utilization_max * 100:.0f} %"
                if g.utilization_mean is not None and g.utilization_max is not None
                else "n/a"
            )
            tensor = (
                "n/a" if g.tensor_activity_mean is None else f"{g.tensor_activity_mean * 100:.0f} %"
            )
            power = (
                f"{g.power_mean_w:.0f}/{g.power_max_w:.0f} W"
                if g.power_mean_w is not None and g.power_max_w is not None
                else "n/a"
            )
            temp = (
                _opt(g.temperature_max_c, ".0f") + " °C"
                if g.temperature_max_c is not None
                else "n/a"
            )
            thr = "n/a" if g.throttle_share is None else f"{g.throttle_share * 100:.0f} %"
            events = ", ".join(f"{k} x{n}" for k, n in sorted(g.events.items()))
            if g.xids:
                events += (", " if events else "") + "XID " + ",".join(sorted(g.xids))
            print(
                f"  {n:>2} {g.uuid[:14]:<14} {util:>13} {tensor:>6} {_gib(g.memory_peak_bytes):>9}"
                f" {power:>15} {temp:>8} {thr:>9}  {events or '-'}",
                file=out,
            )
    if run.gpu_events:
        print("\n== GPU health events ==", file=out)
        for e in run.gpu_events[:50]:
            print(f"  {e.time_s:8.2f} s  {e.kind:<16} {e.uuid}  {e.detail}", file=out)
        if len(run.gpu_events) > 50:
            print(f"  … and {len(run.gpu_events) - 50} more", file=out)
    stragglers = A.stragglers(run)
    findings = A.other_findings(run)
    if stragglers or findings:
        print("\n== diagnosis findings ==", file=out)
        for f in (stragglers + findings)[:50]:
            detail = ", ".join(f"{k}={v}" for k, v in sorted(f.attributes.items())[:8])
            print(f"  {f.time_s:8.2f} s  {f.name}  {f.body or detail}", file=out)
    print("\n== distributions (from the exported sketches) ==", file=out)
    for s in sorted(run.sketches.values(), key=lambda s: (s.name, s.label)):
        sk = s.sketch
        if not sk.count:
            continue
        qs = sk.quantiles(list(A.QUANTILES))
        print(f"  {s.name} [{s.label}] n={sk.count}  {A.fmt_quantiles(qs, s.unit)}", file=out)
    for problem in run.unreadable:
        print(f"  unreadable: {problem}", file=out)
    print("\n== counters (newest cumulative value; all-zero counters left out) ==", file=out)
    by_name: dict[str, list[str]] = {}
    for series in sorted(run.counters.values(), key=lambda s: (s.name, s.label)):
        if "hw.id" in series.attributes or not series.points or series.last == 0:
            continue  # per-GPU counters are in the GPU table
        by_name.setdefault(series.name, []).append(
            f"  {series.name} [{series.label}] {series.last:g} {series.unit}"
        )
    for lines in by_name.values():
        for line in lines:
            print(line, file=out)
    print("\n== spans ==", file=out)
    for name, n in sorted(run.span_counts.items(), key=lambda kv: -kv[1]):
        print(f"  {name}: {n}", file=out)
    if run.thinned:
        print(f"\n(step/request records thinned {run.thinned}x to bound memory)", file=out)
