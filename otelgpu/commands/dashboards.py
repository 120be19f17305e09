"""``otelgpu dashboards --out DIR [--path pull|otlp]``: write the Grafana dashboards.

Training, inference and the overview (training | inference, GPU health below) for each
data path: ``pull`` (otelgpu's Prometheus endpoint scraped by Prometheus) and ``otlp``
(OTLP into VictoriaMetrics with Prometheus naming). Built with grafana-foundation-sdk
when it is installed; otherwise the copies shipped in the package are written.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from otelgpu.commands._parsers import command_parser


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = command_parser(
        subparsers,
        "dashboards",
        "write Grafana dashboards (JSON) for training and inference",
        __doc__,
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="directory to write")
    parser.add_argument(
        "--path", choices=("pull", "otlp"), action="append", help="data path (default: both)"
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from otelgpu.baseline import dashboards

    paths = tuple(args.path or ("pull", "otlp"))
    try:
        written = dashboards.write(args.out, paths)
    except ModuleNotFoundError as exc:
        if exc.name is None or not exc.name.startswith("grafana_foundation_sdk"):
            raise
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for src in sorted(dashboards.SHIPPED.glob("*.json")):
            if any(src.name.endswith(f"-{p}.json") for p in paths):
                written.append(Path(shutil.copy(src, out / src.name)))
    for path in written:
        print(path)
    return 0
