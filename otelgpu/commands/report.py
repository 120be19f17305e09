"""``otelgpu report FILE… [--html out.html]`` / ``otelgpu report A B [--fail-on-regression PCT]``.

One run (one file, or several with ``--merge`` / three or more: ranks, rotated files):
a verdict card (what held the run back, e.g. "INPUT-BOUND — input wait took 26 % of step
time"), training and inference figures, a per-GPU summary of the sampled gauges, GPU
health events, diagnosis findings, every exported sketch's p50/p95/p99 (read back from
the recording losslessly), non-zero counters and span counts. ``--html`` also writes a
self-contained page with plots.

Two files: a comparison of run B against baseline A: per sketch metric the shift of
p50/p95/p99, called a regression or an improvement only beyond the sketch's error bound
and the quantile's sampling uncertainty, plus the GPU context of both runs.
``--fail-on-regression PCT`` exits 3 when any metric regressed by at least PCT percent
(a CI gate).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

from otelgpu.commands import command_parser
from otelgpu.errors import CorruptDataError

EXIT_REGRESSION = 3


SUMMARY = "summarise a recording (text, --html), or compare two runs (A B)"
"""The line of ``otelgpu --help`` for this command."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = command_parser(subparsers, "report", SUMMARY, __doc__)
    parser.add_argument("files", nargs="+", help="recording files (*.otlp.jsonl)")
    parser.add_argument("--html", metavar="OUT.html", help="also write the report as HTML")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="treat two files as one run (e.g. two ranks) instead of comparing them",
    )
    parser.add_argument(
        "--fail-on-regression",
        type=float,
        metavar="PCT",
        help="comparison: exit 3 if a metric regressed by at least PCT %%",
    )
    parser.add_argument(
        "--min-change",
        type=float,
        default=5.0,
        metavar="PCT",
        help="comparison: smallest shift called a regression/improvement (default 5 %%)",
    )
    parser.set_defaults(func=run)
    return parser


def summarise(paths: list[str], out: TextIO) -> int:
    """Print the text report of the recordings ``paths`` (one run); returns messages read."""
    from otelgpu.report import model, text

    loaded = model.load(paths)
    text.write(loaded, out)
    return loaded.messages


def write_html(path: str, content: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(content, encoding="utf-8")


def _compare(args: argparse.Namespace, out: TextIO) -> int:
    from otelgpu.report import compare, model

    path_a, path_b = args.files
    run_a, run_b = model.load([path_a]), model.load([path_b])
    if not run_a.messages or not run_b.messages:
        print("otelgpu report: a recording holds no telemetry", file=sys.stderr)
        return 1
    result = compare.compare(run_a, run_b, min_change=args.min_change / 100)
    compare.write_text(result, out, path_a, path_b)
    if args.html:
        from otelgpu.report import html

        write_html(args.html, html.render_comparison(run_a, run_b, result))
        print(f"\nHTML comparison: {args.html}", file=out)
    if args.fail_on_regression is not None:
        failed = result.regressions(args.fail_on_regression / 100)
        if failed:
            print(
                f"\nFAIL: {len(failed)} metric(s) regressed by >= {args.fail_on_regression:g} %: "
                + ", ".join(f"{m.name} ({m.worst_regression * 100:+.1f} %)" for m in failed),
                file=out,
            )
            return EXIT_REGRESSION
    return 0


def run(args: argparse.Namespace) -> int:
    out = sys.stdout
    try:
        if len(args.files) == 2 and not args.merge:
            return _compare(args, out)
        if args.fail_on_regression is not None:
            print("otelgpu report: --fail-on-regression needs two runs (A B)", file=sys.stderr)
            return 2
        from otelgpu.report import model, text

        loaded = model.load(list(args.files))
        text.write(loaded, out)
        if args.html:
            from otelgpu.report import html

            write_html(args.html, html.render(loaded))
            print(f"\nHTML report: {args.html}", file=out)
    except (OSError, CorruptDataError) as exc:
        print(f"otelgpu report: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:  # plotly missing for --html
        print(f"otelgpu report: {exc}", file=sys.stderr)
        return 1
    if not loaded.messages:
        print(
            "otelgpu report: no readable OTLP export request in "
            + ", ".join(args.files)
            + " (not an otelgpu recording, or damaged throughout)",
            file=sys.stderr,
        )
        return 1
    return 0
