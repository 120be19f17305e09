"""The ``otelgpu`` command line.

Each sub-command lives in its own module ``otelgpu.commands.<name>`` exposing
``add_parser(subparsers) -> argparse.ArgumentParser`` which sets ``func`` (a callable
taking the parsed namespace and returning an exit code) as a default.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from otelgpu.version import __version__

#: Sub-command modules, in help order.
COMMANDS = ("demo", "run", "top", "sim", "doctor", "report", "baseline", "dashboards")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="otelgpu", description="GPU observability for training and inference."
    )
    parser.add_argument("--version", action="version", version=f"otelgpu {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"otelgpu.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"otelgpu.commands.{name}":
                raise
            continue
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    return int(func(args))
