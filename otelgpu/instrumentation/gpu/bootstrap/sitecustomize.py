"""Turns otelgpu on at interpreter start-up (used by ``otelgpu run``).

``otelgpu run`` puts this directory first on ``PYTHONPATH``; Python imports this
``sitecustomize`` before the program runs. It calls ``otelgpu.instrument()`` (settings
from ``OTELGPU_*``/``OTEL_*``), then imports the next ``sitecustomize`` on the path, if
any, so an existing one (e.g. ``opentelemetry-instrument``'s) still runs. Helper
processes of ``multiprocessing`` (resource tracker, spawn/forkserver children) are left
alone: they are not the training or serving process. Never raises.
"""

from __future__ import annotations

import importlib
import os
import sys


def _is_multiprocessing_helper() -> bool:
    argv = " ".join(getattr(sys, "orig_argv", sys.argv))
    return "multiprocessing" in argv and (
        "spawn_main" in argv
        or "resource_tracker" in argv
        or "forkserver" in argv
        or "--multiprocessing-fork" in argv
    )


def _instrument() -> None:
    if _is_multiprocessing_helper():
        return
    try:
        import otelgpu

        otelgpu.instrument()
    except Exception as exc:  # noqa: BLE001 - never stop the program from starting
        print(f"otelgpu: not instrumenting this process: {exc}", file=sys.stderr)


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    mine = sys.modules.pop("sitecustomize", None)
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved
        if mine is not None:
            sys.modules["sitecustomize"] = mine


_instrument()
_chain()
