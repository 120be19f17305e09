"""``otelgpu baseline learn|rules|tighten``: the operating loop (see ``docs/baseline.md``).

* ``learn --url URL [--header K=V] [--window 7d] --out baseline.json`` (or ``--recording
  FILE…``): learn per job / model / GPU model from history; too little history exits 3
  naming what is missing, an unreachable store exits 4.
* ``rules baseline.json --out rules.yml [--tests rules.test.yml]``: Prometheus alerting
  rules (and their promtool unit tests).
* ``tighten baseline.json --url URL [--window 7d] [--out new.json]``: thresholds learned
  from newer history that are tighter, with the extra alert rate they would have caused
  on that history.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from otelgpu.commands._parsers import command_parser

EXIT_INSUFFICIENT = 3
EXIT_STORE = 4


def _headers(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            key, sep, value = item.partition(":")
        if not sep or not key.strip():
            raise SystemExit(f"otelgpu baseline: --header wants NAME=VALUE, not {item!r}")
        out[key.strip()] = value.strip()
    return out


def _add_source(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="Prometheus-compatible query API root (http://host:9090)")
    p.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="HTTP header for the store (auth, tenant); repeatable",
    )
    p.add_argument("--window", default="7d", help="history window (default 7d)")
    p.add_argument("--step", help="query resolution (default window/2000, >= 15s)")
    p.add_argument(
        "--path",
        choices=("pull", "otlp"),
        default="pull",
        help="how the store got the metrics: scraped from otelgpu's pull endpoint "
        "(default) or OTLP with Prometheus naming (VictoriaMetrics, Mimir)",
    )
    p.add_argument("--end", type=float, help="window end, unix seconds (default now)")
    p.add_argument(
        "--min-coverage",
        type=float,
        default=0.8,
        help="share of the window a figure's history must cover (default 0.8)",
    )
    p.add_argument(
        "--min-samples", type=int, default=100, help="samples a figure needs (default 100)"
    )


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = command_parser(
        subparsers, "baseline", "learn a baseline, derive alert rules, tighten them", __doc__
    )
    sub = parser.add_subparsers(dest="baseline_command", metavar="ACTION", required=True)
    learn = sub.add_parser("learn", help="learn a baseline from history")
    _add_source(learn)
    learn.add_argument(
        "--recording",
        nargs="+",
        metavar="FILE",
        help="learn from otelgpu recordings instead of a store",
    )
    learn.add_argument("--out", required=True, help="baseline file to write")
    learn.set_defaults(func=run_learn)
    rules = sub.add_parser("rules", help="Prometheus alerting rules from a baseline")
    rules.add_argument("baseline")
    rules.add_argument("--out", required=True, help="rules file to write")
    rules.add_argument("--tests", metavar="FILE", help="also write promtool unit tests")
    rules.add_argument(
        "--for",
        dest="for_override",
        metavar="DURATION",
        help="use this for: on every rule (short-lived test setups)",
    )
    rules.add_argument(
        "--rate-window",
        default="5m",
        metavar="DURATION",
        help="range of the rules' rate() (default 5m; shorter for test setups)",
    )
    rules.set_defaults(func=run_rules)
    tighten = sub.add_parser("tighten", help="propose tighter thresholds from newer history")
    tighten.add_argument("baseline")
    _add_source(tighten)
    tighten.add_argument("--out", help="write the tightened baseline here")
    tighten.set_defaults(func=run_tighten)
    return parser


def _requirements(args: argparse.Namespace) -> Any:
    from otelgpu.baseline.learn import Requirements

    return Requirements(min_coverage=args.min_coverage, min_samples=args.min_samples)


def _learn_store(args: argparse.Namespace, keep: Any = None) -> Any:
    from otelgpu.baseline.history import PromHistory, parse_duration
    from otelgpu.baseline.learn import learn_prometheus

    return learn_prometheus(
        PromHistory(args.url, _headers(args.header)),
        window_s=parse_duration(args.window),
        end=args.end,
        step_s=parse_duration(args.step) if args.step else None,
        requirements=_requirements(args),
        keep_values=keep,
        path=args.path,
    )


def _guarded(action: Any) -> int:
    from otelgpu.baseline.history import StoreError
    from otelgpu.baseline.learn import InsufficientHistory

    try:
        return int(action())
    except InsufficientHistory as exc:
        print("otelgpu baseline: refusing to learn, too little history:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        print(
            "  No thresholds were written. Record more history (a week is the aim), or "
            "pass a shorter --window / lower --min-coverage knowingly.",
            file=sys.stderr,
        )
        return EXIT_INSUFFICIENT
    except StoreError as exc:
        print(f"otelgpu baseline: the store did not answer: {exc}", file=sys.stderr)
        return EXIT_STORE
    except ValueError as exc:
        print(f"otelgpu baseline: {exc}", file=sys.stderr)
        return 2


def run_learn(args: argparse.Namespace) -> int:
    def action() -> int:
        if args.recording:
            from otelgpu.baseline.history import parse_duration
            from otelgpu.baseline.learn import learn_recordings

            baseline = learn_recordings(
                args.recording,
                window_s=parse_duration(args.window),
                requirements=_requirements(args),
            )
        elif args.url:
            baseline = _learn_store(args)
        else:
            raise ValueError("learn needs --url URL or --recording FILE…")
        baseline.save(args.out)
        print(f"otelgpu baseline: {len(baseline.entries)} figures learned -> {args.out}")
        for e in baseline.entries:
            key = ",".join(f"{k}={v}" for k, v in sorted(e.labels.items()) if v) or "-"
            merged = ""
            if e.resolution is not None:
                merged = f", merged buckets, resolution {e.resolution:.1%}"
            print(
                f"  {e.figure:24} {key:40} median {e.median:.4g}  threshold {e.threshold:.4g}"
                f"  ({e.samples} samples, {e.coverage:.0%} coverage{merged})"
            )
        absent = baseline.source.get("absent") or []
        if absent:
            print(f"  not in the history (no rule): {', '.join(absent)}")
        if baseline.source.get("note"):
            print(f"  note: {baseline.source['note']}")
        return 0

    return _guarded(action)


def run_rules(args: argparse.Namespace) -> int:
    def action() -> int:
        import os

        from otelgpu.baseline.model import load
        from otelgpu.baseline.rules import rules_document, rules_yaml, tests_yaml

        baseline = load(args.baseline)
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(rules_yaml(baseline, args.for_override, args.rate_window))
        count = sum(len(g["rules"]) for g in rules_document(baseline)["groups"])
        print(f"otelgpu baseline: {count} rules -> {args.out}")
        if args.tests:
            rel = os.path.relpath(args.out, os.path.dirname(os.path.abspath(args.tests)))
            with open(args.tests, "w", encoding="utf-8") as f:
                f.write(tests_yaml(baseline, rel, args.for_override))
            print(f"otelgpu baseline: promtool unit tests -> {args.tests}")
        return 0

    return _guarded(action)


def run_tighten(args: argparse.Namespace) -> int:
    def action() -> int:
        from otelgpu.baseline.model import load
        from otelgpu.baseline.tighten import propose, render

        if not args.url:
            raise ValueError("tighten needs --url URL (the newer history)")
        old = load(args.baseline)
        values: dict[Any, Any] = {}
        newer = _learn_store(args, keep=values)
        proposal = propose(old, newer, values)
        print(render(proposal))
        if args.out:
            proposal.baseline.save(args.out)
            print(f"otelgpu baseline: tightened baseline -> {args.out}")
        return 0

    return _guarded(action)
