"""``otelgpu doctor``: what otelgpu would do here, and why.

Prints the native-core status, the NVML in use (real driver, simulator, none) and its
devices with what each supports (GPM activity, energy counter, memory v2, remapped
rows… and NVML's reason when not), the resolved settings (a bad value is reported with
the setting's name), the framework instrumentors that can load, and whether the OTLP
endpoint accepts TCP connections. Exit status 1 when the configuration is invalid, else 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import sys
from typing import Any, TextIO
from urllib.parse import urlparse

from otelgpu import environment_variables as ev
from otelgpu.commands import command_parser

SUMMARY = "check the native core, NVML/simulator, devices and settings"
"""The line of ``otelgpu --help`` for this command."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = command_parser(subparsers, "doctor", SUMMARY, __doc__)
    parser.set_defaults(func=run)
    return parser


def _reachable(endpoint: str, timeout: float = 0.5) -> bool:
    parsed = urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
    host = parsed.hostname or "localhost"
    port = parsed.port or (443 if parsed.scheme == "https" else 4317)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def report(out: TextIO) -> int:
    """Write the diagnosis to ``out``; returns the exit status."""
    from otelgpu import _impl, _settings
    from otelgpu.errors import ConfigurationError
    from otelgpu.otel.resource import job_attributes, nvml_inventory
    from otelgpu.version import __version__

    status = 0
    print(f"otelgpu {__version__} (Python {sys.version.split()[0]})", file=out)
    print("\n== native core ==", file=out)
    for name, state in _impl.native_status().items():
        print(f"  {name}: {state}", file=out)

    print("\n== NVML ==", file=out)
    if os.environ.get(ev.OTELGPU_SIM):
        try:
            from otelgpu import sim

            sim.activate_from_env()
            print(f"  simulated GPU: scenario {os.environ['OTELGPU_SIM']!r}", file=out)
        except Exception as exc:  # noqa: BLE001 - diagnose, don't crash
            print(f"  simulated GPU requested but failed: {exc}", file=out)
    inventory = nvml_inventory()
    if inventory.uuids:
        print(
            f"  driver {inventory.driver_version}, CUDA {inventory.cuda_version}, "
            f"{len(inventory.uuids)} GPU(s)",
            file=out,
        )
        for i, (uuid, name) in enumerate(zip(inventory.uuids, inventory.names, strict=True)):
            print(f"    {i}: {name}  {uuid}", file=out)
        for what in inventory.unreadable:
            print(f"    NOT READABLE (lost or faulted): {what}", file=out)
            status = 1
    else:
        print(
            "  no NVML device (no driver, or no GPU); `otelgpu demo` uses the simulator", file=out
        )
    if inventory.uuids:
        from otelgpu.commands._capabilities import report_capabilities

        report_capabilities(out)
    job = job_attributes()
    if job:
        print("  job: " + ", ".join(f"{k}={v}" for k, v in job.items()), file=out)

    print("\n== settings (keyword > OTELGPU_* > OTEL_* > default) ==", file=out)
    try:
        settings = _settings.resolve()
    except ConfigurationError as exc:
        print(f"  INVALID: {exc}", file=out)
        return 1
    for name, value, env in _settings.describe(settings):
        print(f"  {name:<26} {value:<40} {env}", file=out)

    print("\n== instrumentors ==", file=out)
    for framework in ("torch", "vllm"):
        found = importlib.util.find_spec(framework) is not None
        print(f"  {framework:<8} {'installed' if found else 'not installed (skipped)'}", file=out)
    prom = importlib.util.find_spec("opentelemetry.exporter.prometheus") is not None
    print(f"  prometheus exporter {'installed' if prom else 'not installed'}", file=out)

    print("\n== export ==", file=out)
    print(f"  exporters: {', '.join(settings.exporters) or 'none'}", file=out)
    if "otlp" in settings.exporters:
        endpoint = settings.otlp_endpoint or os.environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4317"
        )
        ok = _reachable(endpoint)
        if settings.otlp_headers:
            names = ", ".join(sorted(settings.otlp_headers))
            print(f"  OTLP headers: {names} (values hidden)", file=out)
        print(
            f"  OTLP {settings.otlp_protocol} {_settings.redact_url(endpoint)}: "
            + ("accepts connections" if ok else "NOT reachable (telemetry will be dropped)"),
            file=out,
        )
    if "recording" in settings.exporters:
        print(f"  recording directory: {os.path.abspath(settings.recording_dir)}", file=out)
    return status


def run(args: argparse.Namespace) -> int:
    return report(sys.stdout)
