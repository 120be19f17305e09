"""``otelgpu run [--sim SCENARIO] -- COMMAND …``: run a program with otelgpu turned on.

The program needs no change: a ``sitecustomize`` directory
(``otelgpu/instrumentation/gpu/bootstrap``) is put first on ``PYTHONPATH``, so every
Python process the command starts calls ``otelgpu.instrument()`` before its own code
(settings from ``OTELGPU_*`` / ``OTEL_*``; an existing ``sitecustomize`` still runs).
``--sim`` runs it on the simulated GPU. The command replaces this process (``exec``), so
its exit status and signals are the program's own.

``--live`` instead runs the program as a child with the live view on (``OTELGPU_LIVE``,
sockets in a fresh private directory) and shows the ``otelgpu top`` view of it while it
runs, the program's output scrolling above the view; the exit status is the program's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import otelgpu.instrumentation.gpu as gpu_instrumentation
from otelgpu.commands import command_parser


def bootstrap_dir() -> Path:
    """The directory holding otelgpu's ``sitecustomize``."""
    return Path(gpu_instrumentation.__file__).resolve().parent / "bootstrap"


SUMMARY = "run a program with otelgpu enabled: otelgpu run -- python train.py"
"""The line of ``otelgpu --help`` for this command."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = command_parser(subparsers, "run", SUMMARY, __doc__)
    parser.add_argument("--sim", metavar="SCENARIO", help="use the simulated GPU (scenario)")
    parser.add_argument(
        "-e",
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set an environment variable for the program (repeatable), e.g. -e OTELGPU_GPU=false",
    )
    parser.add_argument(
        "--live", action="store_true", help="show the live view (otelgpu top) while it runs"
    )
    parser.add_argument(
        "--interval", type=float, default=1.0, help="--live: refresh period in seconds"
    )
    parser.add_argument(
        "--plain", action="store_true", help="--live: plain lines even on a terminal"
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
    if getattr(args, "live", False):
        return run_live(command, env, args.interval, plain=True if args.plain else None)
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"otelgpu run: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - exec does not return


def run_live(
    command: list[str], env: dict[str, str], interval_s: float, plain: bool | None = None
) -> int:
    """Run ``command`` as a child with the live view on and show it; the child's exit status."""
    import queue
    import shutil
    import subprocess
    import tempfile
    import threading

    from otelgpu.commands.top import snapshots
    from otelgpu.report.live import protocol
    from otelgpu.report.live.view import View

    try:
        base = protocol.ensure_private_dir(protocol.default_dir())
    except PermissionError as exc:
        print(f"otelgpu run --live: {exc}", file=sys.stderr)
        return 1
    directory = Path(tempfile.mkdtemp(prefix="run-", dir=base))  # mode 0700
    env = dict(env, OTELGPU_LIVE="true", OTELGPU_LIVE_DIR=str(directory))
    try:
        proc = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
        )
    except OSError as exc:
        shutil.rmtree(directory, ignore_errors=True)
        print(f"otelgpu run: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))

    reader = threading.Thread(target=pump, name="otelgpu-run-output", daemon=True)
    reader.start()
    view = View(
        lambda: snapshots(directory),
        out=sys.stdout,
        interval_s=interval_s,
        plain=plain,
        title=f"otelgpu run --live · {' '.join([Path(command[0]).name, *command[1:]])[:70]}",
    )

    def drain() -> None:
        while not lines.empty():  # one reader (this thread): empty() then get() is safe
            view.echo(lines.get_nowait())

    try:
        with view:
            while proc.poll() is None:
                drain()
                view.tick()
                deadline = time.monotonic() + interval_s
                while time.monotonic() < deadline and proc.poll() is None:
                    drain()
                    time.sleep(0.05)
            reader.join(timeout=5)
            drain()
            view.tick()
    except KeyboardInterrupt:
        proc.wait()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    code = proc.returncode
    return code if code >= 0 else 128 - code
