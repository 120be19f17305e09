"""The sub-commands of ``otelgpu``, one module each (``otelgpu.cli`` lists them)."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["command_parser"]


def command_parser(
    subparsers: Any, name: str, summary: str, doc: str | None
) -> argparse.ArgumentParser:
    """The parser of sub-command ``name``: ``summary`` in ``otelgpu --help``, the module
    docstring ``doc`` as its own help, laid out as written."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help=summary,
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser
