"""``OTELGPU_GC_FREEZE``: after its start-up collection ``instrument()`` freezes the objects
that exist, so a later full collection -- run in whichever thread triggers it, often the
host's loop -- scans only the objects made since. Each case runs in a fresh interpreter:
the freeze is process-wide."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

from fixtures.otel import PYTHON, python_env


def _run(tmp_path: Path, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    code = f"""
        import atexit, gc, json, otelgpu
        # atexit runs last-in first-out: this runs after otelgpu's exit handler
        atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count()))
        before = gc.get_freeze_count()
        tracked_before = len(gc.get_objects())
        otelgpu.instrument(exporters="recording", recording_dir={str(tmp_path)!r}, gpu=False,
                           frameworks="none")
        for _ in range(200):
            with otelgpu.step():
                pass
        frozen = gc.get_freeze_count()
        scanned = len(gc.get_objects())  # what a full collection walks now
        otelgpu.shutdown()
        print(json.dumps({{"before": before, "tracked_before": tracked_before,
                          "frozen": frozen, "scanned": scanned}}))
    """
    env = python_env()
    env.update(extra_env or {})
    proc = subprocess.run(
        [PYTHON, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    out: dict[str, Any] = json.loads(lines[-2])
    out["at_exit"] = int(lines[-1].removeprefix("frozen at exit:"))
    return out


def test_instrument_freezes_what_start_up_made(tmp_path: Path) -> None:
    got = _run(tmp_path)
    assert got["before"] == 0
    # everything alive at instrument() (the host's imports and otelgpu's SDK, exporters)
    assert got["frozen"] > got["tracked_before"] > 1000
    # 200 steps later a full collection walks a small fraction of the process's objects
    assert got["scanned"] * 5 < got["frozen"]
    # given back at exit: the interpreter's last collections see everything again (frozen,
    # extension types such as triton's nanobind ones would be reported as leaked)
    assert got["at_exit"] == 0


def test_gc_freeze_false_leaves_the_collector_alone(tmp_path: Path) -> None:
    got = _run(tmp_path, {"OTELGPU_GC_FREEZE": "false"})
    assert got["frozen"] == 0
    assert got["scanned"] > got["tracked_before"]
