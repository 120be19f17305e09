"""``otelgpu top``: a live terminal view of the instrumented processes of this user.

Attaches to every process that runs with the ``live`` setting on (``OTELGPU_LIVE=true``,
or started by ``otelgpu run --live``) through its read-only, owner-only Unix socket
(``otelgpu.live/1``, see ``docs/live-view.md``), and shows step time and its phases,
throughput, MFU and tensor activity when recorded, per-GPU utilization, memory, power,
temperature and clock throttling, GPU health events as they happen, and for inference
p50/p99 latency, TTFT, queue time and error rate. On a terminal the view redraws in
place (works over SSH and in tmux); otherwise (a pipe, a log) it prints plain lines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from otelgpu.commands import command_parser

SUMMARY = "live view of instrumented processes (OTELGPU_LIVE=true / otelgpu run --live)"
"""The line of ``otelgpu --help`` for this command."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = command_parser(subparsers, "top", SUMMARY, __doc__)
    parser.add_argument("--dir", help="directory of the live sockets (default: the user's)")
    parser.add_argument("--pid", type=int, action="append", help="only this process (repeatable)")
    parser.add_argument("--interval", type=float, default=1.0, help="refresh period in seconds")
    parser.add_argument("--plain", action="store_true", help="plain lines even on a terminal")
    parser.add_argument("--count", type=int, help="stop after this many refreshes")
    parser.set_defaults(func=run)
    return parser


def snapshots(directory: Path, pids: list[int] | None = None) -> list[dict[str, Any]]:
    """One snapshot from every live socket in ``directory`` (unreachable ones skipped)."""
    from otelgpu.report.live import protocol

    docs = []
    for path in protocol.discover(directory):
        if pids and int(path.name.split(".")[0]) not in pids:
            continue
        try:
            docs.append(protocol.fetch(path))
        except (OSError, ValueError):
            continue  # the process ended (stale socket) or is busy: next refresh
    return docs


def run(args: argparse.Namespace) -> int:
    from otelgpu.report.live import protocol
    from otelgpu.report.live.view import View

    directory = Path(args.dir) if args.dir else protocol.default_dir()
    try:
        protocol.ensure_private_dir(directory)
    except PermissionError as exc:
        print(f"otelgpu top: {exc}", file=sys.stderr)
        return 1
    view = View(
        lambda: snapshots(directory, args.pid),
        out=sys.stdout,
        interval_s=args.interval,
        plain=True if args.plain else None,
        title=f"otelgpu top · {directory}",
    )
    try:
        with view:
            view.loop(lambda: False, max_ticks=args.count)
    except KeyboardInterrupt:
        pass
    return 0
