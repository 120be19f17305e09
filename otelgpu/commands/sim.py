"""``otelgpu sim``: the simulated GPU from the command line.

* ``otelgpu sim list`` -- the built-in scenarios;
* ``otelgpu sim show NAME|FILE`` -- a scenario resolved (devices, processes, events);
  ``--config`` prints the normalized form the C library reads;
* ``otelgpu sim validate FILE...`` -- check scenario files (exit 1 on the first error);
* ``otelgpu sim run SCENARIO -- COMMAND...`` -- run any program against the simulated
  GPUs (``LD_LIBRARY_PATH`` + ``OTELGPU_SIM_CONFIG``); exits with the program's status;
* ``otelgpu sim env SCENARIO`` -- print the ``export`` lines for a shell.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from otelgpu.sim import ENV_CONFIG, env_for, list_scenarios, load_scenario
from otelgpu.sim.scenario import Scenario, ScenarioError, resolve_path


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "sim",
        help="simulated GPUs: list, show and run scenarios",
        description="Simulated NVML GPUs driven by TOML scenarios (docs/simulator.md).",
    )
    sub = parser.add_subparsers(dest="sim_command", metavar="SUBCOMMAND")

    p_list = sub.add_parser("list", help="list the built-in scenarios")
    p_list.set_defaults(func=_cmd_list)

    p_show = sub.add_parser("show", help="show a scenario (built-in name or .toml path)")
    p_show.add_argument("scenario")
    p_show.add_argument("--config", action="store_true", help="print the normalized form")
    p_show.add_argument("--source", action="store_true", help="print the TOML source")
    p_show.set_defaults(func=_cmd_show)

    p_val = sub.add_parser("validate", help="validate scenario files")
    p_val.add_argument("scenarios", nargs="+")
    p_val.set_defaults(func=_cmd_validate)

    p_run = sub.add_parser(
        "run",
        help="run a command against the simulated GPUs",
        usage="otelgpu sim run [--clock {wall,virtual}] SCENARIO -- COMMAND [ARGS...]",
    )
    p_run.add_argument("--clock", choices=("wall", "virtual"), default="wall")
    p_run.add_argument("scenario")
    p_run.add_argument("command", nargs=argparse.REMAINDER)
    p_run.set_defaults(func=_cmd_run)

    p_env = sub.add_parser("env", help="print shell export lines for a scenario")
    p_env.add_argument("--clock", choices=("wall", "virtual"), default="wall")
    p_env.add_argument("scenario")
    p_env.set_defaults(func=_cmd_env)

    parser.set_defaults(func=lambda _args: _help(parser))
    return parser


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _error(exc: Exception) -> int:
    print(f"otelgpu sim: {exc}", file=sys.stderr)
    return 2


def _cmd_list(_args: argparse.Namespace) -> int:
    for name in list_scenarios():
        try:
            sc = load_scenario(name)
        except ScenarioError as exc:  # a broken built-in is a bug: show it, keep listing
            print(f"{name:<22} INVALID: {exc}")
            continue
        print(f"{name:<22} {sc.gpu_count:>2} GPU  {sc.description}")
    return 0


def describe(sc: Scenario) -> str:
    """Human-readable summary of a resolved scenario."""
    lines = [f"{sc.name}: {sc.description}".rstrip(": "), f"  source: {sc.source}"]
    drv = sc.driver
    cuda = f"{drv['cuda_version'] // 1000}.{drv['cuda_version'] % 1000 // 10}"
    lines.append(
        f"  driver {drv['version']}, CUDA {cuda}"
        + (f", nvmlInit fails: {drv['init_error']}" if drv["init_error"] else "")
        + (f", latency {drv['latency_ms']} ms/call" if drv["latency_ms"] else "")
    )
    for i, d in enumerate(sc.devices):
        util = d["utilization"]
        lines.append(
            f"  gpu {i}: {d['name']} {d['uuid']} bus {d['pci_bus_id']} {d['memory_gib']:.1f} GiB "
            f"limit {d['power_limit_w']:g} W util {util.kind} {dict(util.params)}"
            + (f" unsupported {d['unsupported']}" if d["unsupported"] else "")
        )
    for p in sc.processes:
        end = "" if p.end_s is None else f"-{p.end_s:g}s"
        lines.append(
            f"  process gpu {p.gpu} pid {p.pid} {p.memory_gib:g} GiB {p.start_s:g}s{end} {p.name}"
        )
    for e in sc.events:
        where = "all GPUs" if e.gpu is None else f"gpu {e.gpu}"
        lines.append(f"  event t={e.at_s:g}s {where}: {e.kind} {dict(e.params)}")
    return "\n".join(lines)


def _cmd_show(args: argparse.Namespace) -> int:
    try:
        sc = load_scenario(args.scenario)
        if args.source:
            print(resolve_path(args.scenario).read_text(encoding="utf-8"), end="")
        elif args.config:
            print(sc.to_config("virtual", 0), end="")
        else:
            print(describe(sc))
    except ScenarioError as exc:
        return _error(exc)
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    for name in args.scenarios:
        try:
            sc = load_scenario(name)
        except ScenarioError as exc:
            print(f"otelgpu sim: {exc}", file=sys.stderr)
            return 1
        print(f"{name}: ok ({sc.gpu_count} GPU, {len(sc.events)} events)")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print(
            "otelgpu sim run: missing COMMAND (usage: otelgpu sim run SCENARIO -- COMMAND...)",
            file=sys.stderr,
        )
        return 2
    try:
        env = env_for(args.scenario, clock=args.clock)
    except ScenarioError as exc:
        return _error(exc)
    try:
        return subprocess.call(command, env=env)
    except OSError as exc:
        print(f"otelgpu sim run: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    finally:  # the normalized scenario file belongs to this run only
        Path(env[ENV_CONFIG]).unlink(missing_ok=True)


def _cmd_env(args: argparse.Namespace) -> int:
    try:
        env = env_for(args.scenario, clock=args.clock, base={})
    except ScenarioError as exc:
        return _error(exc)
    for key, value in env.items():
        if key == "LD_LIBRARY_PATH":  # keep what the shell already has
            print(f"export {key}={shlex.quote(value)}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}")
        else:
            print(f"export {key}={shlex.quote(value)}")
    return 0
