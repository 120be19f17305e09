"""What every ``otelgpu`` subcommand's parser shares.

:func:`command_parser` adds one subcommand with its one-line help and the command
module's docstring as the description, laid out as written (the docstrings are short
manuals with lists and examples).
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["command_parser"]


def command_parser(subparsers: Any, name: str, help_text: str, doc: str | None) -> Any:
    """The ``argparse`` parser of subcommand ``name`` under ``subparsers``."""
    return subparsers.add_parser(
        name,
        help=help_text,
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
