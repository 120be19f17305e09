"""Fixtures of the report tests: real recordings made once per session in subprocesses.

* ``synthetic_runs``: three runs of ``make_run.py`` (real runtime, simulated 8xH100,
  recording exporter) -- ``healthy_a``/``healthy_b`` (seeds 1 and 2, same distributions)
  and ``regressed`` (step time x1.3 and TTFT x1.5, nothing else);
* ``workload_run``: ``live_workload.py`` under ``otelgpu run --sim healthy-8xh100`` for
  4 s (real wall-clock steps and requests, a thermal throttle injected on GPU 1, gauges
  exported every 0.5 s).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.otel import make_run, python_env
from report_support import HERE


@pytest.fixture(scope="session")
def synthetic_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("runs")
    return {
        "healthy_a": make_run(base / "a", "--seed", "1"),
        "healthy_b": make_run(base / "b", "--seed", "2"),
        "regressed": make_run(
            base / "c", "--seed", "3", "--slow-steps", "1.3", "--slow-ttft", "1.5"
        ),
    }


@pytest.fixture(scope="session")
def workload_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("workload")
    proc = subprocess.run(
        [
            sys.executable, "-m", "otelgpu", "run", "--sim", "healthy-8xh100",
            "-e", f"OTELGPU_RECORDING_DIR={out}",
            "-e", "OTELGPU_METRIC_EXPORT_INTERVAL_MS=500",
            "-e", "OTEL_SERVICE_NAME=live-workload",
            "--", sys.executable, str(HERE / "live_workload.py"), "4",
        ],
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "workload done" in proc.stdout
    (path,) = out.glob("*.otlp.jsonl")
    return path
