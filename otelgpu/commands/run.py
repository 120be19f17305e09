"""``otelgpu run [--sim SCENARIO] -- COMMAND …``: run a program with otelgpu turned on.

The program needs no change: a ``sitecustomize`` directory
(``otelgpu/instrumentation/gpu/bootstrap``) is put first on ``PYTHONPATH``, so every
Python process the command starts calls ``otelgpu.instrument()`` before its own code
(settings from ``OTELGPU_*`` / ``OTEL_*``; an existing ``sitecustomize`` still runs).
``--sim`` runs it on the simulated GPU. The command replaces this process (``exec``), so
its exit status and signals are the program's own.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import otelgpu.instrumentation.gpu as gpu_instrumentation


def bootstrap_dir() -> Path:
    """The directory holding otelgpu's ``sitecustomize``."""
    return Path(gpu_instrumentation.__file__).resolve().parent / "bootstrap"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "run",
        help="run a program with otelgpu enabled: otelgpu run -- python train.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sim", metavar="SCENARIO", help="use the simulated GPU (scenario)")
    parser.add_argument(
        "-e",
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set an environment variable for the program (repeatable), e.g. -e OTELGPU_GPU=false",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments")
    parser.set_defaults(func=run)
    return parser


def build_env(args: argparse.Namespace, base: dict[str, str] | None = None) -> dict[str, str]:
    """The program's environment (``PYTHONPATH`` with the bootstrap dir first)."""
    env = dict(os.environ if base is None else base)
    path = [str(bootstrap_dir())]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(path)
    if args.sim:
        from otelgpu import sim

        env = sim.env_for(args.sim, clock="wall", base=env)
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"otelgpu run: -e expects KEY=VALUE, got {item!r}")
        env[key] = value
    return env


def run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("otelgpu run: no command given (otelgpu run -- python train.py)", file=sys.stderr)
        return 2
    env = build_env(args)
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"otelgpu run: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - exec does not return
